"""tl.dot helpers shared by the verify kernels (triton/mamba2.py, triton/gdn.py): matrix
products that are exact per product where the stored operands allow, and their host-side
precision choice.

Precisions ("PREC"): "bf16": both operands hold bf16 values (fp8 e4m3 values are exact in
bf16) -> bf16 MMAs, fp32 accumulation, exact products; otherwise tl.dot's input_precision on
fp32 operands ("tf32": exact for bf16 / fp16 values; "tf32x3" ~2^-22 and "bf16x3" ~2^-16 per
product for fp32 values; "ieee": FMA). "fma": no tl.dot at all, a broadcast multiply and a
sum over the inner dim in fp32 (exact per product, like "ieee"): no 16-row/column minimum and
no operand layout shuffles, for the small matrices of a few drafts (tl.dot pads every dim to
16). Under Triton's CPU interpreter (EXACT), which mis-evaluates bf16 dots and knows only some
precisions, every tl.dot product runs in fp32 ("ieee").
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

_BF16_EXACT = (torch.bfloat16, torch.float8_e4m3fn)


def mma_precision(a: torch.dtype, b: torch.dtype, f32: str) -> str:
    """PREC of an MMA whose operands are stored as dtypes a and b: "bf16" when both are bf16
    or fp8 e4m3, "tf32" when both fit tf32 (bf16 / fp16 mixes), else `f32` (fp32 values)."""
    if a in _BF16_EXACT and b in _BF16_EXACT:
        return "bf16"
    tf32 = _BF16_EXACT + (torch.float16,)
    if a in tf32 and b in tf32:
        return "tf32"
    return f32


@triton.jit
def mma_acc(a, b, acc, PREC: tl.constexpr, EXACT: tl.constexpr):
    """acc + a @ b (float32 accumulator) at precision PREC (module doc)."""
    if PREC == "fma":
        r = acc + tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], 1)
    elif EXACT:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif PREC == "bf16":
        r = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16), acc)
    else:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision=PREC)
    return r


@triton.jit
def mm(a, b, PREC: tl.constexpr, EXACT: tl.constexpr):
    """a @ b -> float32 at precision PREC (module doc)."""
    if PREC == "fma":
        r = tl.sum(a.to(tl.float32)[:, :, None] * b.to(tl.float32)[None, :, :], 1)
    elif EXACT:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif PREC == "bf16":
        r = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)
    return r
