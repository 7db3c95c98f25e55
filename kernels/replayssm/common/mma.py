"""tl.dot helpers shared by the verify and fold kernels (mamba2, gdn): matrix
products that are exact per product where the stored operands allow, and their host-side
precision choice.

Precisions ("PREC"): "bf16": both operands hold bf16 values (fp8 e4m3 values are exact in
bf16) -> bf16 MMAs, fp32 accumulation, exact products; otherwise tl.dot's input_precision on
fp32 operands ("tf32": exact for bf16 / fp16 values; "tf32x3" ~2^-22 and "bf16x3" ~2^-16 per
product for fp32 values; "ieee": FMA). Triton's "tf32x3" rounds both operands to tf32 with
cvt.rna, which sm_90 runs as a compare/select sequence per element, and does three passes even
when one operand is exact. Two cheaper splits, by truncation (hi = the top 19 bits of the fp32
word, lo = a - hi exactly; the tensor core ignores the 13 low bits of lo): "tf32x2t" for a times
b with b exact in tf32 (bf16 / fp16 / fp8 values: the drafts' keys and queries, C): a split,
two passes, ~2^-20 per product; "tf32x3t" when both are fp32: hi*hi + hi*lo + lo*hi, ~2^-20.
Triton's "bf16x3" likewise makes its third pass (a_hi * b_lo) even when b is bf16; "bf16x2"
drops it: a = hi + lo, both rounded to bf16 (hi = bf16(a), lo = bf16(a - hi)), two bf16 MMAs
against b exact in bf16 (bf16 / fp8 values), ~2^-16 per product (the rounding of lo); a bf16
MMA runs at twice the tf32 rate, so it costs half of "tf32x2t"'s two passes. "bf16x3e": b
exact in bf16 and a = hi + mid + lo, three bf16 roundings (each term the bf16 nearest what
the terms before it left; |a - hi - mid - lo| <= 2^-24 |a|, as fp32's own rounding), three
bf16 MMAs, ~2^-23 per product with the fp32 accumulation: tighter than "tf32x2t" for fewer MMA
instructions (bf16 takes 16 of K per instruction, tf32 8), and b stays a bf16 operand (half
the registers of fp32 b). "bf16x6": both operands fp32, each as three such terms, the six
products whose terms' orders sum to at most 2^-16 (a1 b1; a1 b2, a2 b1; a1 b3, a2 b2, a3 b1),
~2^-23 per product: for small fp32 x fp32 products, six bf16 MMAs against "tf32x3"'s six tf32
ones, without its cvt.rna selects. Triton's CPU interpreter truncates to bf16 (2^-21 in all there).
"bf16x3e_cvt": "bf16x3e" with the split by Triton's conversions (bf16_split3).
Under Triton's CPU interpreter (EXACT), which mis-evaluates bf16 dots and knows only some
precisions, every tl.dot product runs in fp32 ("ieee"); the truncation splits run as written
there (their tf32 dots in fp32), so the CPU tests check their algebra, the GPU tests their error.
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


def split_precision(a: torch.dtype, b: torch.dtype) -> str:
    """Like mma_precision, with the truncation splits for fp32 operands: "tf32x2t" when a is
    fp32 and b's values are exact in tf32 (bf16 / fp16 / fp8), "tf32x3t" when neither side
    is exact (both ~2^-20 per product; measured faster than "tf32x3" on the H200)."""
    p = mma_precision(a, b, "tf32x3t")
    if p == "tf32x3t" and b in _BF16_EXACT + (torch.float16,):
        return "tf32x2t"
    return p


def exact_b_holds(prec: str, b: torch.dtype) -> bool:
    """Whether PREC's premise on its second operand holds for values stored as dtype b: "bf16x3e"
    and "bf16x2" need b exact in bf16 (bf16, fp8 e4m3), "tf32x2t" exact in tf32 (also fp16);
    the other precisions assume nothing."""
    if prec in ("bf16x3e", "bf16x3e_cvt", "bf16x2"):
        return b in _BF16_EXACT
    if prec == "tf32x2t":
        return b in _BF16_EXACT + (torch.float16,)
    return True


@triton.jit
def tf32_split(a):
    """(hi, lo) with a = hi + lo exactly: hi = fp32 a truncated to tf32, lo = a - hi (< 2^-10 |a|)."""
    hi = (a.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
    return hi, a - hi


@triton.jit
def bf16_split(a):
    """(hi, lo) bf16 with a ~= hi + lo: hi = bf16(a), lo = bf16(a - hi); |a - hi - lo| <= 2^-16 |a|."""
    hi = a.to(tl.bfloat16)
    return hi, (a - hi.to(tl.float32)).to(tl.bfloat16)


@triton.jit
def bf16_split3(a, EXACT: tl.constexpr, PREC: tl.constexpr):
    """(hi, mid, lo) bf16 with a ~= hi + mid + lo: hi = bf16(a), mid = bf16(a - hi), lo = bf16(a - hi - mid);
    |a - hi - mid - lo| <= 2^-24 |a| (each rounding leaves at most 2^-8 of what it rounds).
    The same roundings, bit for bit, either way: on the GPU in inline PTX ("bf16x3e",
    _bf16_split3_pairs), or by Triton's conversions ("bf16x3e_cvt": Mamba-2's folds, where the
    PTX form was not timed; and under the CPU interpreter (EXACT), which cannot run inline PTX)."""
    if EXACT or (PREC == "bf16x3e_cvt"):
        hi = a.to(tl.bfloat16, fp_downcast_rounding="rtne")
        r = a - hi.to(tl.float32)
        mid = r.to(tl.bfloat16, fp_downcast_rounding="rtne")
        lo = (r - mid.to(tl.float32)).to(tl.bfloat16, fp_downcast_rounding="rtne")
    else:
        hi, mid, lo = _bf16_split3_pairs(a)
    return hi, mid, lo


@triton.jit
def _bf16_split3_pairs(a):
    """bf16_split3 of fp32 a in inline PTX, a pair of elements per instruction: each term one
    cvt.rn.bf16x2.f32 (round to nearest even, as Triton's conversion) straight into the packed
    register an MMA operand takes, the residual from the packed word (a bf16 is the top half of
    its fp32: a shift or a mask), 11 instructions a pair. Triton's conversions take one F2F per
    element, a byte permute to pack each pair and a multiply-add to widen each term back (~15 a
    pair: a third of the GDN dual flush step's chunk loop).
    Pure, so Triton places it: in the dual flush step it splits after converting the fp32 chunk
    into the MMA operand's layout (each of the two warps then splits all of it: 829 SASS
    instructions a chunk on sm_90, 208 registers). Marked impure it stays where `a` is, each
    warp splitting its half and the three terms converted (688 instructions, but 249 registers
    and 47 KiB of shared memory): 1-2 % slower on the H200."""
    return tl.inline_asm_elementwise(
        """{
        .reg .b32 w0, w1;
        .reg .f32 r0, r1;
        cvt.rn.bf16x2.f32 $0, $4, $3;
        shl.b32 w0, $0, 16;
        and.b32 w1, $0, 0xffff0000;
        sub.f32 r0, $3, w0;
        sub.f32 r1, $4, w1;
        cvt.rn.bf16x2.f32 $1, r1, r0;
        shl.b32 w0, $1, 16;
        and.b32 w1, $1, 0xffff0000;
        sub.f32 r0, r0, w0;
        sub.f32 r1, r1, w1;
        cvt.rn.bf16x2.f32 $2, r1, r0;
        }""",
        "=r,=r,=r,r,r", [a], dtype=(tl.bfloat16, tl.bfloat16, tl.bfloat16), is_pure=True, pack=2)


@triton.jit
def mma_acc(a, b, acc, PREC: tl.constexpr, EXACT: tl.constexpr):
    """acc + a @ b (float32 accumulator) at precision PREC (module doc)."""
    if (PREC == "bf16x3e") or (PREC == "bf16x3e_cvt"):   # b exact in bf16
        hi, mid, lo = bf16_split3(a.to(tl.float32), EXACT, PREC)     # (smallest term first)
        if EXACT:   # the CPU interpreter mis-evaluates bf16 dots: the same products in fp32
            b32 = b.to(tl.float32)
            r = tl.dot(lo.to(tl.float32), b32, acc, input_precision="ieee")
            r = tl.dot(hi.to(tl.float32), b32, tl.dot(mid.to(tl.float32), b32, r, input_precision="ieee"),
                       input_precision="ieee")
        else:
            b16 = b.to(tl.bfloat16)
            r = tl.dot(hi, b16, tl.dot(mid, b16, tl.dot(lo, b16, acc)))
    elif PREC == "bf16x2":      # b exact in bf16; small term first
        hi, lo = bf16_split(a.to(tl.float32))
        if EXACT:   # the CPU interpreter mis-evaluates bf16 dots: the same products in fp32
            b32 = b.to(tl.float32)
            r = tl.dot(hi.to(tl.float32), b32, tl.dot(lo.to(tl.float32), b32, acc, input_precision="ieee"),
                       input_precision="ieee")
        else:
            b16 = b.to(tl.bfloat16)
            r = tl.dot(hi, b16, tl.dot(lo, b16, acc))
    elif PREC == "bf16x6":      # both fp32: three bf16 terms each, the six products above 2^-24
        a1, a2, a3 = bf16_split3(a.to(tl.float32), EXACT, "bf16x3e")
        b1, b2, b3 = bf16_split3(b.to(tl.float32), EXACT, "bf16x3e")
        if EXACT:   # the CPU interpreter mis-evaluates bf16 dots: the same products in fp32
            a1, a2, a3 = a1.to(tl.float32), a2.to(tl.float32), a3.to(tl.float32)
            b1, b2, b3 = b1.to(tl.float32), b2.to(tl.float32), b3.to(tl.float32)
            r = tl.dot(a3, b1, tl.dot(a2, b2, tl.dot(a1, b3, acc, input_precision="ieee"), input_precision="ieee"),
                       input_precision="ieee")
            r = tl.dot(a1, b1, tl.dot(a2, b1, tl.dot(a1, b2, r, input_precision="ieee"), input_precision="ieee"),
                       input_precision="ieee")
        else:
            r = tl.dot(a3, b1, tl.dot(a2, b2, tl.dot(a1, b3, acc)))
            r = tl.dot(a1, b1, tl.dot(a2, b1, tl.dot(a1, b2, r)))
    elif PREC == "tf32x2t":     # b exact in tf32; small term first
        b32 = b.to(tl.float32)
        hi, lo = tf32_split(a.to(tl.float32))
        r = tl.dot(hi, b32, tl.dot(lo, b32, acc, input_precision="tf32"), input_precision="tf32")
    elif PREC == "tf32x3t":
        ah, al = tf32_split(a.to(tl.float32))
        bh, bl = tf32_split(b.to(tl.float32))
        r = tl.dot(al, bh, acc, input_precision="tf32")
        r = tl.dot(ah, bh, tl.dot(ah, bl, r, input_precision="tf32"), input_precision="tf32")
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
    if (PREC == "tf32x2t") or (PREC == "tf32x3t") or (PREC == "bf16x2") or (PREC == "bf16x3e") \
            or (PREC == "bf16x3e_cvt") or (PREC == "bf16x6"):
        r = mma_acc(a, b, tl.zeros([a.shape[0], b.shape[1]], tl.float32), PREC, EXACT)
    elif EXACT:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    elif PREC == "bf16":
        r = tl.dot(a.to(tl.bfloat16), b.to(tl.bfloat16))
    else:
        r = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PREC)
    return r
