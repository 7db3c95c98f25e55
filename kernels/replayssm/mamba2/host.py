"""Host-side pieces the Mamba-2 planners share: checkpoint and buffer arguments, the fold's
buffer tile and precision, and recording launches."""
from __future__ import annotations

import os

import torch
import triton

from ..common.launch import Launch


def interpreting() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1): kernels take their EXACT path."""
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # older triton without knobs
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def np2(v: int) -> int:
    return triton.next_power_of_2(max(int(v), 1))


def fold_precision(rs, options) -> str:
    """The fold's tl.dot precision: a bf16 buffer folds exactly ("bf16x3": three bf16 MMAs of the
    split fp32 weights against exact bf16 B), other buffers in options.fold_dot_precision."""
    return "bf16x3" if rs.x.dtype == torch.bfloat16 and rs.B.dtype == torch.bfloat16 else options.fold_dot_precision


def block_l(L: int, block_p: int, block_n: int) -> tuple[int, bool]:
    """(buffer tile height, use tl.dot): >= 16 where the fold can use tl.dot (all dims >= 16)."""
    bl = np2(L)
    if block_p >= 16 and block_n >= 16:
        bl = max(bl, 16)
    return bl, (block_p >= 16 and block_n >= 16 and bl >= 16)


def ckpt_args(ck, like):
    """(data, scale, has_scale) of a checkpoint; `like` stands in for a missing pointer."""
    if ck is None:
        return like, like, False
    if ck.scale is None:
        return ck.data, ck.data, False
    return ck.data, ck.scale, True


def check_ckpts(*cks) -> None:
    ref = cks[0].data
    for ck in cks:
        if ck is None:
            continue
        if not ck.data.is_contiguous() or ck.data.shape != ref.shape:
            raise ValueError("checkpoints must be contiguous [S, H, P, N] tensors of one shape")
        if ck.scale is not None and not ck.scale.is_contiguous():
            raise ValueError("fp8 scales must be contiguous [S, H, P]")


def buffer_strides(rs) -> tuple:
    for t in (rs.x, rs.B):
        if t.stride(-1) != 1:
            raise ValueError("buffer tensors need a unit stride in their last dim")
    return (rs.x.stride(0), rs.x.stride(1), rs.x.stride(2), rs.B.stride(0), rs.B.stride(1), rs.B.stride(2),
            rs.dt.stride(0), rs.dt.stride(1))


def ckpt_strides(rs) -> tuple:
    d = rs.hi.data
    # scale strides: any fp8 copy has the contiguous [S, H, P] layout
    return (d.stride(0), d.stride(1), d.stride(2), d.shape[1] * d.shape[2], d.shape[2])


def state_bytes(ck) -> int:
    return ck.data.element_size()


def record(kernel, grid, row: str = ""):
    """kernel[grid](*args, **meta) recorded as a Launch (chosen by table row `row`)."""
    return lambda *args, **meta: Launch(kernel, grid, args, meta, row)


def run(launches) -> None:
    for launch in launches:
        launch()
