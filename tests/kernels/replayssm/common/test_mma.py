"""The verify kernels' matrix-product helpers (replayssm.common.mma) against fp64 products:
the truncation splits "tf32x2t" (one fp32 operand, the other exact in tf32) and "tf32x3t"
(both fp32), the bf16 splits "bf16x2" and "bf16x3e" (the other operand exact in bf16), beside
Triton's "tf32x3". Under the CPU interpreter their dots run in fp32, so this checks the split
algebra; on a GPU it checks the error bound of the tensor cores."""
from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl

from replayssm.common.mma import bf16_split3, mm, mma_acc, split_precision, tf32_split

from kernel_checks import CUDA, DEV, gen


@triton.jit
def _mm_kernel(a_ptr, b_ptr, acc_ptr, o_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr,
               PREC: tl.constexpr, ACC: tl.constexpr, EXACT: tl.constexpr):
    m = tl.arange(0, M)
    k = tl.arange(0, K)
    n = tl.arange(0, N)
    a = tl.load(a_ptr + m[:, None] * K + k[None, :])
    b = tl.load(b_ptr + k[:, None] * N + n[None, :])
    if ACC:
        r = mma_acc(a, b, tl.load(acc_ptr + m[:, None] * N + n[None, :]), PREC, EXACT)
    else:
        r = mm(a, b, PREC, EXACT)
    tl.store(o_ptr + m[:, None] * N + n[None, :], r)


@triton.jit
def _split_kernel(a_ptr, hi_ptr, lo_ptr, M: tl.constexpr):
    i = tl.arange(0, M)
    hi, lo = tf32_split(tl.load(a_ptr + i))
    tl.store(hi_ptr + i, hi)
    tl.store(lo_ptr + i, lo)


def _run(a, b, prec, acc=None):
    M, K = a.shape
    N = b.shape[1]
    o = torch.empty(M, N, dtype=torch.float32, device=DEV)
    _mm_kernel[(1,)](a, b, o if acc is None else acc, o, M=M, K=K, N=N, PREC=prec, ACC=acc is not None,
                     EXACT=not CUDA)
    return o


# the bound per product relative to sum |a_ik b_kj|: 2^-20 for the truncation splits
# (one lost tf32 rounding of the low part), Triton's tf32x3 ~2^-22; bf16x2 2^-16 (the bf16
# rounding of the low part; Triton's bf16x3 is the same against an operand exact in bf16);
# bf16x3e ~2^-24 (what three bf16 terms leave, as fp32 rounding, and the fp32 accumulation)
# ("bf16x3e_cvt": the same terms, split by Triton's conversions)
BOUND = {"tf32x2t": 2.0 ** -19, "tf32x3t": 2.0 ** -19, "tf32x3": 2.0 ** -19, "bf16x2": 2.0 ** -15,
         "bf16x3e": 2.0 ** -21, "bf16x3e_cvt": 2.0 ** -21,
         "bf16x6": 2.0 ** -20}   # six products dropped below 2^-24 plus the fp32 accumulation of acc


@pytest.mark.parametrize("prec,b_dtype", [("tf32x2t", torch.bfloat16), ("tf32x3t", torch.float32),
                                          ("tf32x3", torch.float32), ("bf16x2", torch.bfloat16),
                                          ("bf16x3e", torch.bfloat16), ("bf16x3e", torch.float8_e4m3fn),
                                          ("bf16x3e_cvt", torch.bfloat16), ("bf16x6", torch.float32)])
@pytest.mark.parametrize("with_acc", [False, True])
def test_products_within_bound(prec, b_dtype, with_acc):
    g = gen(11)
    # wide exponent range: the split must hold for small and large magnitudes
    a = (torch.randn(32, 64, generator=g) * torch.exp2(torch.randint(-20, 20, (32, 64), generator=g))).to(DEV)
    b = torch.randn(64, 16, generator=g).to(b_dtype).to(torch.float32 if b_dtype.itemsize == 1 else b_dtype).to(DEV)
    acc = torch.randn(32, 16, generator=g).to(DEV) if with_acc else None
    o = _run(a, b, prec, acc)
    ref = a.double() @ b.double() + (acc.double() if with_acc else 0)
    scale = a.double().abs() @ b.double().abs() + (acc.double().abs() if with_acc else 0)
    err = ((o.double() - ref).abs() / scale).max().item()
    assert err <= BOUND[prec], f"{prec}: {err:.3g}"


@triton.jit
def _split3_kernel(a_ptr, hi_ptr, mid_ptr, lo_ptr, M: tl.constexpr, EXACT: tl.constexpr,
                   PREC: tl.constexpr):
    i = tl.arange(0, M)
    hi, mid, lo = bf16_split3(tl.load(a_ptr + i), EXACT, PREC)
    tl.store(hi_ptr + i, hi)
    tl.store(mid_ptr + i, mid)
    tl.store(lo_ptr + i, lo)


def test_bf16_split3_leaves_at_most_fp32_rounding():
    # nearest rounding (the GPU) leaves 2^-8 per term, 2^-24 in all; Triton's CPU interpreter
    # truncates to bf16 (a full step, 2^-7 per term), 2^-21 in all
    g = gen(13)
    a = (torch.randn(256, generator=g) * torch.exp2(torch.randint(-60, 60, (256,), generator=g))).to(DEV)
    hi, mid, lo = (torch.empty(256, dtype=torch.bfloat16, device=DEV) for _ in range(3))
    _split3_kernel[(1,)](a, hi, mid, lo, M=256, EXACT=not CUDA, PREC="bf16x3e")
    step = 2.0 ** (-8 if CUDA else -7)
    a64 = a.double().abs()
    assert (mid.double().abs() <= a64 * step).all() and (lo.double().abs() <= a64 * step ** 2 * 1.01).all()
    left = a.double() - hi.double() - mid.double() - lo.double()
    assert (left.abs() <= a64 * step ** 3).all()


@pytest.mark.skipif(not CUDA, reason="inline PTX: the interpreter runs Triton's conversions in every case")
@pytest.mark.parametrize("prec", ["bf16x3e", "bf16x3e_cvt"])
def test_bf16_split3_terms_are_torchs_nearest_roundings(prec):
    """The split in inline PTX (bf16x3e) and by Triton's conversions (_cvt) gives, bit for
    bit, the terms torch's round-to-nearest-even casts give: hi = bf16(a), mid = bf16(a - hi),
    lo = bf16(a - hi - mid) -- including ties, subnormals, zeros, infinities and NaN."""
    g = gen(14)
    a = torch.randn(4096, generator=g) * torch.exp2(torch.randint(-140, 127, (4096,), generator=g).float())
    ties = (torch.randint(-2 ** 15, 2 ** 15, (512,), generator=g).to(torch.int32) << 16) | 0x8000  # halfway
    a[:512] = ties.view(torch.float32)
    a[512:520] = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), 1e-40, -1e-45, 3.0e38, 1.0])
    a = a.to(DEV)
    hi, mid, lo = (torch.empty(4096, dtype=torch.bfloat16, device=DEV) for _ in range(3))
    _split3_kernel[(1,)](a, hi, mid, lo, M=4096, EXACT=False, PREC=prec)
    want_hi = a.to(torch.bfloat16)
    r = a - want_hi.float()
    want_mid = r.to(torch.bfloat16)
    want_lo = (r - want_mid.float()).to(torch.bfloat16)
    for got, want, name in ((hi, want_hi, "hi"), (mid, want_mid, "mid"), (lo, want_lo, "lo")):
        same = got.view(torch.int16) == want.view(torch.int16)
        both_nan = got.isnan() & want.isnan()
        assert (same | both_nan).all(), f"{prec} {name}: {(~(same | both_nan)).sum().item()} differ"


def test_tf32_split_is_exact_and_truncates():
    g = gen(12)
    a = (torch.randn(256, generator=g) * torch.exp2(torch.randint(-60, 60, (256,), generator=g))).to(DEV)
    hi, lo = torch.empty_like(a), torch.empty_like(a)
    _split_kernel[(1,)](a, hi, lo, M=256)
    assert torch.equal(hi + lo, a)                                          # exact split
    assert (hi.view(torch.int32) & 0x1FFF == 0).all()                       # hi fits tf32
    assert (lo.abs() <= a.abs() * 2.0 ** -10).all()                         # lo below hi's last bit


def test_split_precision_takes_two_passes_only_when_b_is_exact_in_tf32():
    f32, bf16, f16, fp8 = torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn
    assert split_precision(f32, bf16) == "tf32x2t" and split_precision(f32, f16) == "tf32x2t"
    assert split_precision(f32, fp8) == "tf32x2t"
    assert split_precision(f32, f32) == "tf32x3t" and split_precision(bf16, f32) == "tf32x3t"
    assert split_precision(bf16, bf16) == "bf16" and split_precision(f16, bf16) == "tf32"
