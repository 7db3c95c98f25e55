"""Test-only runners (put this directory on PYTHONPATH; scenario runner = "rb_fake_runner:FakeRunner").

Environment knobs (read at each call so one process can be steered by a test):
  RB_FAKE_LOG    file to which "<pid> <case_id>" is appended (fsync'ed) each time a case runs
  RB_FAKE_SLEEP  seconds to sleep per case (default 0)
"""

from __future__ import annotations

import os
import time
import zlib


def fake_metrics(case) -> dict:
    """Deterministic, plausible metrics: replay-family faster at large batch."""
    h = zlib.crc32(case.case_id.encode()) % 1000 / 1000.0
    base = 10.0 + 2.0 * case.batch
    factor = {"eager": 1.0, "replay": 0.7, "replay-dual": 0.6, "replay-shared-low": 0.55}.get(case.method, 0.8)
    if case.buffer_len:
        factor *= 1.0 + 0.01 * case.buffer_len - 0.005 * case.flush_period
    median = base * factor * (1.0 + 0.02 * h)
    nbytes = 4096.0 * case.batch * (2.0 if case.method == "eager" else 1.2)
    return {"median_us": median, "iqr_us": 0.01 * median, "samples": 10, "discarded": 0,
            "bytes_model": nbytes, "check_rel_err": 1e-7, "flops_model": 100.0 * case.batch}


class FakeRunner:
    def run(self, case, ctx):
        log = os.environ.get("RB_FAKE_LOG")
        if log:
            fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, f"{os.getpid()} {case.case_id}\n".encode())
                os.fsync(fd)
            finally:
                os.close(fd)
        delay = float(os.environ.get("RB_FAKE_SLEEP", "0") or 0)
        if delay:
            time.sleep(delay)
        if case.batch == 3:
            raise RuntimeError("fake failure for batch 3\nsecond line")
        return fake_metrics(case)


class SkippingRunner:
    def run(self, case, ctx):
        from replaybench.runners import SkipCase
        raise SkipCase("not available here")
