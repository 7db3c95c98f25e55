"""What the public ops (mamba2, gdn, perdraft, layers) share about backends: the
names a caller may pass, the check of that argument, and writing a reference result into a
caller's `out` tensor."""
from __future__ import annotations

import torch

BACKENDS = ("triton", "reference")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}")


def into(out: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    """y, or y copied into `out` when one was given (the Triton ops write `out` in place)."""
    if out is None:
        return y
    out.copy_(y)
    return out
