"""Tests run kernels on CUDA when available, else under Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton decorates any kernel; the replayssm ops import
their kernel modules lazily; setting it here, before any test module is collected, covers the whole suite.
"""
import os

import pytest

try:
    import torch
    _HAS_CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover - torch missing is a setup error elsewhere
    _HAS_CUDA = False

if not _HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_runtest_logreport(report):
    """With REPLAYBENCH_FAILLOG=path set (GPU runs: tools/gpu_tests.sh), append every failing
    test's id and traceback to that file as it happens (each xdist worker appends), so the
    failure text survives a run that is cut off by a wall-clock limit."""
    path = os.environ.get("REPLAYBENCH_FAILLOG")
    if path and report.failed:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"=== FAILED {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


@pytest.fixture(autouse=True)
def _buffered_route_in_kernel_tests(request, monkeypatch):
    """Kernel tests (tests/kernels/) compare the kernels' state (checkpoints, buffers, cursors)
    with the reference's, which buffers every step. The launch tables send small batches down
    the eager route (a flush at every step: the same outputs, another state layout), so those
    tests pin the buffered route unless marked `shipped_routes` (tests of the routing itself)."""
    if "tests/kernels/" not in str(request.node.path).replace(os.sep, "/") or \
            request.node.get_closest_marker("shipped_routes"):
        yield
        return
    from replayssm.triton import mamba2    # GDN tests pass GDNOptions(small_batch_route=False) explicitly
    monkeypatch.setattr(mamba2, "SMALL_BATCH_ROUTE", False)
    yield
