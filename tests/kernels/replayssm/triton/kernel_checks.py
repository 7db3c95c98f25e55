"""What the Triton kernel tests share (test_mamba2.py, test_gdn.py): the device, tolerances and
the comparison against the reference. Tests run on CUDA when present, else under Triton's CPU
interpreter (tests/conftest.py sets TRITON_INTERPRET)."""
from __future__ import annotations

import torch

from replayssm.state import EPOCH_SHIFT

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
TOL_F32 = 1e-4        # fp32 outputs / state (the output-only route reorders sums)
TOL_BF16_OUT = 8e-3   # bf16 outputs: one bf16 rounding (2^-8) relative to the largest element


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| (norm-wise relative error, fp64 on a's device); a non-finite
    kernel value (an unwritten element of a NaN-poisoned output) fails."""
    a, b = a.double(), b.double().to(a.device)
    assert torch.isfinite(a).all(), "non-finite values in the kernel result (unwritten element?)"
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def out_tol(act) -> float:
    """Tolerance of an output in activation dtype `act`."""
    return TOL_F32 if act in (torch.float32, torch.float64) else TOL_BF16_OUT


def poisoned(like: torch.Tensor) -> torch.Tensor:
    """An output buffer full of NaN: any element a kernel does not write fails rel_err."""
    return torch.full_like(like, float("nan"))


def random_rows(slots: int, batch: int, g, pad_p: float = 0.25) -> torch.Tensor:
    """state_indices: distinct slots, some rows padded (-1)."""
    idx = torch.randperm(slots, generator=g)[:batch].to(torch.int32)
    idx[torch.rand(batch, generator=g) < pad_p] = -1
    return idx.to(DEV)


def epoch_of(c: torch.Tensor) -> torch.Tensor:
    """The deferred small-batch route's epoch in cursor words c (state.py)."""
    return (c >> EPOCH_SHIFT) & 127
