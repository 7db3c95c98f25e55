"""Host-side pieces the kernel modules' launchers share: a recorded launch (run it, inspect it,
or compile it offline without a GPU), the argument normalisation before a launch, and the
per-state scratch tensors that a step's or commit's launches share."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton


@dataclass
class Launch:
    """One kernel launch, recorded: kernel[grid](*args, **meta). Plans return these so a
    launch can be run, inspected, or compiled offline (compile_offline) without a GPU."""

    kernel: object
    grid: tuple
    args: tuple
    meta: dict

    def __call__(self) -> None:
        self.kernel[self.grid](*self.args, **self.meta)


def last_contig(t: torch.Tensor | None) -> torch.Tensor | None:
    """t with a unit stride in its last dim (a copy otherwise; activations and params only)."""
    if t is not None and t.stride(-1) != 1:
        t = t.contiguous()
    return t


def out_like(out: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """The output tensor: `out` (shape of x, unit last stride) or a new one."""
    if out is None:
        return torch.empty_like(x)
    if out.shape != x.shape or out.stride(-1) != 1:
        raise ValueError(f"out must have shape {tuple(x.shape)} and a unit last stride")
    return out


def cache_lines(t: torch.Tensor, row_elems: int) -> tuple[int, int]:
    """(128-byte lines per row as a power of 2, elements per line) of rows of `row_elems`
    elements of t's dtype: the shape of a prefetch hint over those rows (common.prefetch_hint)."""
    es = t.element_size()
    return triton.next_power_of_2(triton.cdiv(row_elems * es, 128)), max(1, 128 // es)


def state_scratch(rs, name: str, numel: int, device) -> torch.Tensor:
    """An int32 scratch tensor [>= numel] kept on the state object rs under attribute `name`:
    one allocation serves every call and a captured CUDA graph (reallocated only when a call
    needs more, or another device)."""
    t = getattr(rs, name, None)
    if t is None or t.numel() < numel or t.device != torch.device(device):
        t = torch.empty(numel, dtype=torch.int32, device=device)
        setattr(rs, name, t)
    return t
