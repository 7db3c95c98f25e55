"""Tests run kernels on CUDA when available, else under Triton's CPU interpreter.

TRITON_INTERPRET must be set before triton decorates any kernel; the replayssm ops import
their kernel modules lazily; setting it here, before any test module is collected, covers the whole suite.
"""
import os


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
