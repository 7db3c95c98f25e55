"""Measured DRAM traffic per decode step through Nsight Compute (`--ncu`).

`measure_dram(case)` runs this module as a child process under
    ncu --clock-control none --profile-from-start off --metrics dram__bytes_read.sum,dram__bytes_write.sum --csv
The child builds one layer for the case (kernels compiled and warmed up outside the
profiled range), then profiles exactly `steps` = one flush period of decode steps with
staggered cursors (the same workload as the kernel runner). ncu replays each kernel with
its caches flushed, so the counters give the DRAM bytes one launch really moves. Their sum
divided by `steps` is the measured traffic of one step of one layer, stored beside the
modelled bytes.
"""
from __future__ import annotations

import csv
import io
import json
import os
import shutil
import subprocess
import sys
from dataclasses import asdict

METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


def ncu_path() -> str | None:
    """The ncu executable, or None."""
    found = shutil.which("ncu")
    if found:
        return found
    for root in ("/usr/local/cuda/bin", "/opt/nvidia/nsight-compute"):
        if os.path.isdir(root):
            for dirpath, _, files in os.walk(root):
                if "ncu" in files:
                    return os.path.join(dirpath, "ncu")
    return None


def parse_ncu_csv(text: str) -> dict[str, float]:
    """Sum each metric over all profiled kernels from `ncu --csv` output (base units: bytes)."""
    start = text.find('"ID"')
    if start < 0:
        raise RuntimeError("ncu produced no metric table:\n" + text[-2000:])
    totals: dict[str, float] = {m: 0.0 for m in METRICS}
    kernels = set()
    for row in csv.DictReader(io.StringIO(text[start:])):
        name = row.get("Metric Name")
        if name in totals:
            value = float(str(row.get("Metric Value", "0")).replace(",", ""))
            unit = (row.get("Metric Unit") or "byte").lower()
            totals[name] += value * _UNIT.get(unit, 1.0)
            kernels.add(row.get("ID"))
    totals["kernels"] = float(len(kernels))
    return totals


_UNIT = {"byte": 1.0, "kbyte": 1e3, "mbyte": 1e6, "gbyte": 1e9, "kibyte": 1024.0, "mibyte": 1024.0 ** 2,
         "gibyte": 1024.0 ** 3}


def measure_dram(case, timeout_s: int = 300) -> dict:
    """DRAM bytes read/written per step (one layer, whole batch) measured by ncu for `case`."""
    exe = ncu_path()
    if exe is None:
        raise RuntimeError("Nsight Compute (ncu) not found on PATH")
    cmd = [exe, "--clock-control", "none", "--profile-from-start", "off", "--csv", "--print-units", "base",
           "--metrics", ",".join(METRICS), sys.executable, "-m", "replaybench.ncu", json.dumps(asdict(case))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"ncu failed ({proc.returncode}): {proc.stderr[-1500:] or proc.stdout[-1500:]}")
    totals = parse_ncu_csv(proc.stdout)
    steps = _steps(case)
    return {"dram_read_bytes": totals["dram__bytes_read.sum"] / steps,
            "dram_write_bytes": totals["dram__bytes_write.sum"] / steps,
            "dram_bytes": (totals["dram__bytes_read.sum"] + totals["dram__bytes_write.sum"]) / steps,
            "ncu_kernels_per_step": totals["kernels"] / steps}


def _steps(case) -> int:
    """Steps (speculative: verify + commit rounds) profiled per case."""
    return max(case.flush_period, 1)


def _child(case_json: str) -> None:
    """Run inside ncu: warm up, then profile one flush period of steps of one layer."""
    import torch

    from .methods import METHODS
    from .models import get_model
    from .runners.common import step_inputs
    from .runners.kernel import make_layer
    from .scenario import Case

    case = Case(**json.loads(case_json))
    model = get_model(case.model)
    device = case.device or "cuda"
    if METHODS[case.method].runner == "spec":     # verify + commit rounds: runners/spec.py
        from .runners import spec
        return spec.profile_rounds(case, device, _steps(case))
    gen = torch.Generator().manual_seed(case.seed)
    layer = make_layer(model.op, model.ssm, case.method, case.backend, case.batch, case.buffer_len, case.flush_period,
                  case.state_dtype, case.lo_dtype, device, gen)
    inp, params = step_inputs(model.op, model.ssm, case.batch, device, gen)
    idx = torch.arange(case.batch, dtype=torch.int32, device=device)
    for _ in range(2 * _steps(case)):          # compile + warm up, unprofiled
        layer.step(inp, params, idx)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for _ in range(_steps(case)):
        layer.step(inp, params, idx)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    _child(sys.argv[1])
