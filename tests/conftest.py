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
