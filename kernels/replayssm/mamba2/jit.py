"""@triton.jit helpers shared by the Mamba-2 kernels (eager, replay, route, fold, verify):
checkpoint tile loads and stores (fp8 row scales), the buffered entries' decay weights, the
fold's outer-product sum, the output's D x and gate, and a batch row's slot."""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.jit import cast, silu
from ..common.mma import bf16_split3
from ..state import CURSOR_MASK, LO_STALE

CUR_MASK = tl.constexpr(CURSOR_MASK)
LO_STALE_BIT = tl.constexpr(LO_STALE)


@triton.jit
def load_state(ptr, sc_ptr, base, sbase, offs_p, offs_n, stride_p, mask, mask_p, HAS_SCALE: tl.constexpr,
                EV: tl.constexpr):
    """[BP, BN] float32 tile of a checkpoint (rows offs_p), dequantised with fp8 row scales.
    EV: cache eviction hint of the (streamed) tile ("" or "evict_first")."""
    s = tl.load(ptr + base + offs_p[:, None] * stride_p + offs_n[None, :], mask=mask, other=0.0,
                eviction_policy=EV).to(tl.float32)
    if HAS_SCALE:
        sc = tl.load(sc_ptr + sbase + offs_p, mask=mask_p, other=1.0)
        s = s * sc[:, None]
    return s


@triton.jit
def store_state(ptr, sc_ptr, base, sbase, offs_p, offs_n, stride_p, mask, mask_p, s, HAS_SCALE: tl.constexpr,
                 EXACT: tl.constexpr, EV: tl.constexpr):
    """Store a float32 tile, rounding to the checkpoint dtype. fp8: per-row scale
    amax/448 (1 for a zero row), data = s / scale (as state.Checkpoint.write). Columns
    past N must hold 0 (they do: every operand is loaded with other=0)."""
    if HAS_SCALE:
        amax = tl.max(tl.abs(s), axis=1)
        sc = tl.where(amax > 0.0, amax / 448.0, 1.0)
        tl.store(sc_ptr + sbase + offs_p, sc, mask=mask_p)
        s = s / sc[:, None]
    tl.store(ptr + base + offs_p[:, None] * stride_p + offs_n[None, :], cast(s, ptr.dtype.element_ty, EXACT),
             mask=mask, eviction_policy=EV)


@triton.jit
def buffer_weights(la, dt, mask_l, la_after):
    """Weights of buffered entries for a target after them.

    la [BL] log-decays dt_i * A (0 where masked), dt [BL], la_after: summed log-decay of
    what follows the buffer up to the target (the new entry; 0 for a plain fold).
    Returns w [BL] = dt_i * exp(sum_{j>i} la_j + la_after) and total = exp(sum la + la_after),
    the decay applied to the checkpoint. Suffix sums (not differences of prefix sums) keep
    the recent, heavy weights accurate when the cumulative decay is large."""
    suffix = tl.cumsum(la, 0, reverse=True) - la + la_after
    w = tl.where(mask_l, dt * tl.exp(suffix), 0.0)
    total = tl.exp(tl.sum(la, 0) + la_after)
    return w, total


@triton.jit
def outer_sum(xw, bm, USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr, EXACT: tl.constexpr):
    """sum_i xw[i, :, None] * bm[i, None, :]: xw [BL, BP], bm [BL, BN] -> [BP, BN] float32.

    tl.dot when every dim >= 16, else a broadcast sum (tiny tiles only). DOT_PREC:
    "bf16x3": bm holds bf16 values (a bf16 buffer), so it is exact in bf16; xw (fp32) is
        split into three bf16 parts hi + mid + lo (24 significant bits) and three bf16 MMAs
        accumulate in fp32: every product is exact, the result is fp32-accurate, and the
        operands are half the registers of fp32 ones.
    "tf32x3" / "ieee" / "tf32": tl.dot's input_precision on fp32 operands (other buffers)."""
    if USE_DOT:
        if DOT_PREC == "bf16x3":
            b16 = bm.to(tl.bfloat16)
            hi, mid, lo = bf16_split3(xw, EXACT, "bf16x3e_cvt")     # (Triton's conversions, as timed)
            if EXACT:   # the CPU interpreter mis-evaluates bf16 dots: same products in fp32
                b32 = b16.to(tl.float32)
                acc = tl.dot(tl.trans(hi.to(tl.float32)), b32, input_precision="ieee")
                acc = tl.dot(tl.trans(mid.to(tl.float32)), b32, acc, input_precision="ieee")
                acc = tl.dot(tl.trans(lo.to(tl.float32)), b32, acc, input_precision="ieee")
            else:
                acc = tl.dot(tl.trans(hi), b16)
                acc = tl.dot(tl.trans(mid), b16, acc)
                acc = tl.dot(tl.trans(lo), b16, acc)
        else:
            acc = tl.dot(tl.trans(xw), bm, input_precision=DOT_PREC)
    else:
        acc = tl.sum(xw[:, :, None] * bm[:, None, :], axis=0)
    return acc


@triton.jit
def load_buffer_B(bB_ptr, base, s_bB_l, offs_l, offs_n, mask_l, mask_n):
    """The group's buffered B rows [BL, BN] (float32; 0 past the cursor)."""
    return tl.load(bB_ptr + base + offs_l[:, None] * s_bB_l + offs_n[None, :],
                   mask=mask_l[:, None] & mask_n[None, :], other=0.0).to(tl.float32)


@triton.jit
def fold_chunk(hi_ptr, hi_sc_ptr, ck_base, sc_base, s_ck_p, bxh_ptr, s_bx_l, offs_l, mask_l, w, total, Bb,
                offs_p, offs_n, mask_p, mask,
                HI_SCALE: tl.constexpr, USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr, EXACT: tl.constexpr):
    """High-checkpoint rows offs_p with the buffered entries folded in:
    total * S + sum_i w_i x_i B_i^T  ->  [BP, BN] float32 (not stored)."""
    Xb = tl.load(bxh_ptr + offs_l[:, None] * s_bx_l + offs_p[None, :],
                 mask=mask_l[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
    S = load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE, "")
    return total * S + outer_sum(Xb * w[:, None], Bb, USE_DOT, DOT_PREC, EXACT)


@triton.jit
def store_ckpts(hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, ck_base, sc_base, s_ck_p, offs_p, offs_n, mask, mask_p, S,
                 HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr, LO_SCALE: tl.constexpr, EXACT: tl.constexpr,
                 EV: tl.constexpr):
    """Write folded rows to the high checkpoint and, in dual mode, the low copy."""
    store_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, S, HI_SCALE, EXACT, EV)
    if HAS_LO:
        store_state(lo_ptr, lo_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, S, LO_SCALE, EXACT,
                     EV)


@triton.jit
def finish_y(yv, xv, Dh, z_row, y_row, offs_p, mask_p, in_p, HAS_Z: tl.constexpr, EXACT: tl.constexpr):
    """y = (yv + D x) * silu(z), stored for rows offs_p (padded rows: every operand is 0)."""
    yv = yv + Dh * xv
    if HAS_Z:
        yv = yv * silu(tl.load(z_row + offs_p, mask=mask_p, other=0.0).to(tl.float32))
    tl.store(y_row + offs_p, cast(yv, y_row.dtype.element_ty, EXACT), mask=in_p)


@triton.jit
def slot_of(idx_ptr, row, n_slots, HAS_IDX: tl.constexpr):
    """(slot as int64 clamped to >= 0, live) for batch row `row`; an index outside
    0 <= idx < n_slots (the state's slots; negative = padding) is a no-op row."""
    if HAS_IDX:
        slot = tl.load(idx_ptr + row).to(tl.int64)
    else:
        slot = row.to(tl.int64)
    live = tl.where((slot >= 0) & (slot < n_slots), True, False)   # i1 scalar (common/jit.py)
    return tl.where(live, slot, 0), live
