"""Triton kernels for Gated DeltaNet (GDN) decode: eager, ReplaySSM replay (fused flush),
fold (standalone flush and speculative commit) and speculative verify.

Layouts (all contiguous except the activations, which may be strided views):
    state / checkpoint  [S, Hv, dv, dk]   o = S q: rows = dv, cols = dk (contiguous)
    fp8 row scales      [S, Hv, dv]       float32
    buffer u            [S, L, Hv, dv]    float32 (float64 in exact runs)
    buffer k            [S, L, Hk, dk]    raw keys, activation dtype
    buffer g, beta      [S, L, Hv]        float32
    buffer v            [S, L, Hv, dv]    raw values (dual mode only)
    cursor              [S]               int32
    q, k [b, Hk, dk]; v, o [b, Hv, dv]; g, beta [b, Hv]   (verify: an extra draft dim T after b)

Grid, every kernel: (cdiv(dv, BLOCK_V), Hv, batch). Each row of S evolves independently
given the keys (u is per row), so a program owns a [BLOCK_V, dk] tile of one value head of
one sequence and never needs another program's data. dv-tiles vary fastest so that the
programs sharing a head's q/k and buffered keys run together (L2 reuse).

Cursor protocol ("ticket cursor"): ops that move the cursor (replay, fold) must let every
program of a sequence see the OLD cursor while one of them writes the new one, with no host
sync and a fixed grid (CUDA graphs). Each program takes the cursor with one relaxed
atomic_add(cursor[slot], 1 << 16): the low 16 bits are the cursor, the high bits count the
programs that have read it. The program that draws ticket nprog - 1 knows every other program
of the sequence has already read the cursor (all reads are the atomics themselves, totally
ordered on one address), so it stores the new cursor, clearing the ticket bits. Between
launches the cursor is a plain int. Costs one L2 atomic per program, no extra launch; needs
L < 65536 and Hv * cdiv(dv, BLOCK_V) < 32768. Verify reads the cursor with a plain load
(it never moves it).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..reference import L2_EPS
from ..state import FP8_MAX, GDNReplayState

_TICKET = tl.constexpr(1 << 16)
_CUR_MASK = tl.constexpr((1 << 16) - 1)
_FP8_MAX = tl.constexpr(FP8_MAX)

# ----------------------------------------------------------------------------- launch table
# Per op: rows (max_batch, BLOCK_V, num_warps); the first row with batch <= max_batch wins
# (None = any batch). BLOCK_V is clamped to next_pow2(dv). Chosen for dk = dv = 128 on H200:
# small batches use narrow dv tiles so that >= ~4 programs per SM are in flight; large
# batches use wider tiles so that the per-program work that does not scale with the tile
# (q/k normalisation, buffered-key dot products, L2 reads of the buffered keys) is amortised.
# Per-program fp32 register tile = BLOCK_V * next_pow2(dk) (<= 8K elements).
# BLOCK_L (buffer chunk of the output-only route) = min(next_pow2(L), MAX_BLOCK_L).
CONFIGS: dict[str, list[tuple[int | None, int, int]]] = {
    "eager":  [(4, 8, 1), (64, 16, 2), (None, 32, 4)],
    "replay": [(4, 16, 4), (64, 32, 4), (None, 64, 8)],
    "fold":   [(None, 32, 4)],
    "verify": [(4, 8, 4), (64, 16, 4), (None, 32, 4)],
}
MAX_BLOCK_L = 16


def pick_config(op: str, batch: int, dv: int, dk: int, L: int = 1, override: dict | None = None) -> dict:
    """Launch config {BLOCK_V, BLOCK_K, BLOCK_L, num_warps} for `op` at this shape."""
    for max_b, bv, nw in CONFIGS[op]:
        if max_b is None or batch <= max_b:
            break
    cfg = {"BLOCK_V": bv, "num_warps": nw, "BLOCK_L": min(triton.next_power_of_2(L), MAX_BLOCK_L)}
    if override:
        cfg.update(override)
    cfg["BLOCK_V"] = min(cfg["BLOCK_V"], triton.next_power_of_2(dv))
    cfg["BLOCK_K"] = triton.next_power_of_2(dk)
    return cfg


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ----------------------------------------------------------------------------- jit helpers
@triton.jit
def _rne_bf16(x):
    """fp32 -> fp32 holding round-to-nearest-even bf16 (interpreter only: its casts truncate)."""
    b = x.to(tl.uint32, bitcast=True)
    b = b + 0x7FFF + ((b >> 16) & 1)
    b = (b >> 16) << 16
    return b.to(tl.float32, bitcast=True)


@triton.jit
def _rne_e4m3(x):
    """fp32 (|x| <= 448) -> fp32 on the e4m3 grid, round-to-nearest-even (interpreter only)."""
    b = x.to(tl.uint32, bitcast=True)
    e = ((b >> 23) & 0xFF).to(tl.int32) - 127
    e = tl.maximum(e, -6)                      # subnormals share the quantum 2^-9
    qexp = (e - 3 + 127).to(tl.uint32) << 23   # 2^(e-3): 3 mantissa bits
    qv = qexp.to(tl.float32, bitcast=True)
    y = x / qv                                 # exact (power of two)
    r = (y + 12582912.0) - 12582912.0          # 1.5 * 2^23: RTNE to an integer
    return r * qv


@triton.jit
def _cast(x, DST: tl.constexpr, INTERP: tl.constexpr):
    """x.to(DST) with round-to-nearest-even also under the interpreter."""
    if INTERP:
        if DST == tl.bfloat16:
            x = _rne_bf16(x)
        elif DST == tl.float8e4nv:
            x = _rne_e4m3(x)
    return x.to(DST)


@triton.jit
def _ckpt_load(ptr, sc_ptr, tile_off, row_off, mask, rmask, FP8: tl.constexpr):
    """Dequantised [BLOCK_V, BLOCK_K] fp32 tile (masked elements 0). Streamed once: evict first."""
    s = tl.load(ptr + tile_off, mask=mask, other=0.0, eviction_policy="evict_first").to(tl.float32)
    if FP8:
        s = s * tl.load(sc_ptr + row_off, mask=rmask, other=1.0)[:, None]
    return s


@triton.jit
def _ckpt_store(ptr, sc_ptr, tile_off, row_off, s, mask, rmask, FP8: tl.constexpr, INTERP: tl.constexpr):
    """Store a fp32 tile, quantising; fp8: per-row scale amax/448 (1 for a zero row).
    Whole rows live in one program (we tile dv only), so the row amax is local."""
    if FP8:
        amax = tl.max(tl.abs(s), 1)            # masked columns hold 0
        sc = tl.where(amax > 0, tl.math.div_rn(amax, _FP8_MAX), 1.0)
        tl.store(sc_ptr + row_off, sc, mask=rmask)
        s = tl.math.div_rn(s, sc[:, None])
    tl.store(ptr + tile_off, _cast(s, ptr.dtype.element_ty, INTERP), mask=mask, eviction_policy="evict_first")


@triton.jit
def _fold(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
          HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
          DUAL: tl.constexpr, EPS: tl.constexpr):
    """Fold buffer entries 0..n-1 into the fp32 tile S [BLOCK_V, BLOCK_K], in order.

    Non-dual: S = alpha_i S + u_i k_i^T with the stored u_i.
    Dual: u_i is recomputed against the (high-precision) S being folded,
    u_i = beta_i (v_i - alpha_i S k_i), so no u computed from the low copy enters the state.
    A loop over <= L entries at 1/K of the steps; the loads do not depend on S, so they pipeline.
    """
    for i in range(L):
        if i < n:
            e = slot64 * L + i
            gi = tl.load(gb_ptr + e * HV + h).to(tl.float32)
            ai = tl.exp(gi)
            ki = tl.load(kb_ptr + (e * HK + kh) * DK + cols, mask=cmask, other=0.0).to(tl.float32)
            ki = ki * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)
            if DUAL:
                vi = tl.load(vb_ptr + (e * HV + h) * DV + rows, mask=rmask, other=0.0).to(tl.float32)
                bi = tl.load(bb_ptr + e * HV + h).to(tl.float32)
                ui = bi * (vi - ai * tl.sum(S * ki[None, :], 1))
            else:
                ui = tl.load(ub_ptr + (e * HV + h) * DV + rows, mask=rmask, other=0.0).to(tl.float32)
            S = ai * S + ui[:, None] * ki[None, :]
    return S


@triton.jit
def _buffer_terms(slot64, h, kh, n, kn, qn, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr,
                  HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
                  BLOCK_V: tl.constexpr, BLOCK_L: tl.constexpr, EPS: tl.constexpr):
    """Buffer part of the output-only route for one key vector kn and one query qn.

    With c_i = sum_{j<=i} g_j over entries 0..n-1 and C = c_{n-1}:
        acc_k = sum_{i<n} exp(C - c_i) (k_i . kn) u_i      [BLOCK_V]
        acc_q = sum_{i<n} exp(C - c_i) (k_i . qn) u_i      [BLOCK_V]
    returns (acc_k, acc_q, C). Chunks of BLOCK_L entries are walked from the newest, carrying
    r = sum of g after the chunk, so every exponent is <= 0 (no overflow, no pre-pass over g).
    """
    NCH: tl.constexpr = (L + BLOCK_L - 1) // BLOCK_L
    acc_k = tl.zeros([BLOCK_V], tl.float32)
    acc_q = tl.zeros([BLOCK_V], tl.float32)
    r = 0.0
    for cc in range(NCH):
        c0 = (NCH - 1 - cc) * BLOCK_L
        if c0 < n:
            ei = c0 + tl.arange(0, BLOCK_L)
            em = ei < n
            e = slot64 * L + ei
            gch = tl.load(gb_ptr + e * HV + h, mask=em, other=0.0).to(tl.float32)
            tot = tl.sum(gch, 0)
            w = tl.where(em, tl.exp(r + tot - tl.cumsum(gch, 0)), 0.0)
            kb = tl.load(kb_ptr + (e * HK + kh)[:, None] * DK + cols[None, :],
                         mask=em[:, None] & cmask[None, :], other=0.0).to(tl.float32)
            kb = kb * tl.rsqrt(tl.sum(kb * kb, 1) + EPS)[:, None]
            wkk = w * tl.sum(kb * kn[None, :], 1)
            wkq = w * tl.sum(kb * qn[None, :], 1)
            U = tl.load(ub_ptr + (e * HV + h)[:, None] * DV + rows[None, :],
                        mask=em[:, None] & rmask[None, :], other=0.0).to(tl.float32)
            acc_k += tl.sum(wkk[:, None] * U, 0)
            acc_q += tl.sum(wkq[:, None] * U, 0)
            r += tot
    return acc_k, acc_q, r


# ----------------------------------------------------------------------------- eager
@triton.jit
def _gdn_eager_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, s_ptr,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
):
    """Eager step on one [BLOCK_V, dk] tile: read S once, write S once.
    sk = S k, sq = S q (one pass), u = beta (v - alpha sk), S' = alpha S + u k^T,
    o = S' q = alpha sq + u (k . q)."""
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kh = h // (HV // HK)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    o_ptrs = o_ptr + b * sob + h * soh + rows
    slot = tl.load(idx_ptr + b)
    if slot < 0:
        tl.store(o_ptrs, _cast(tl.zeros([BLOCK_V], tl.float32), o_ptr.dtype.element_ty, INTERP), mask=rmask)
    else:
        slot64 = slot.to(tl.int64)
        row_off = (slot64 * HV + h) * DV + rows
        tile = row_off[:, None] * DK + cols[None, :]
        mask2 = rmask[:, None] & cmask[None, :]
        S = tl.load(s_ptr + tile, mask=mask2, other=0.0, eviction_policy="evict_first").to(tl.float32)
        kn = tl.load(k_ptr + b * skb + kh * skh + cols, mask=cmask, other=0.0).to(tl.float32)
        kn = kn * tl.rsqrt(tl.sum(kn * kn, 0) + EPS)
        qn = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cmask, other=0.0).to(tl.float32)
        qn = qn * (tl.rsqrt(tl.sum(qn * qn, 0) + EPS) * scale)
        vv = tl.load(v_ptr + b * svb + h * svh + rows, mask=rmask, other=0.0).to(tl.float32)
        alpha = tl.exp(tl.load(g_ptr + b * sgb + h * sgh).to(tl.float32))
        bt = tl.load(beta_ptr + b * sbb + h * sbh).to(tl.float32)
        sk = tl.sum(S * kn[None, :], 1)
        sq = tl.sum(S * qn[None, :], 1)
        u = bt * (vv - alpha * sk)
        S = alpha * S + u[:, None] * kn[None, :]
        tl.store(s_ptr + tile, _cast(S, s_ptr.dtype.element_ty, INTERP), mask=mask2, eviction_policy="evict_first")
        o = alpha * sq + u * tl.sum(kn * qn, 0)
        tl.store(o_ptrs, _cast(o, o_ptr.dtype.element_ty, INTERP), mask=rmask)


# ----------------------------------------------------------------------------- replay
@triton.jit
def _gdn_replay_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr,
    hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, cur_ptr,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale, flush_period, nprog,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr,
    HI_FP8: tl.constexpr, LO_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
):
    """One ReplaySSM step for one [BLOCK_V, dk] tile; the flush decision is per sequence, here.

    n = cursor. Output-only route (n + 1 < K): one pass over the read checkpoint tile gives
    S_c k and S_c q; with the buffer terms (see _buffer_terms), C = c_{n-1}:
        S_{t-1} k = e^C S_c k + acc_k,   u = beta (v - alpha S_{t-1} k)
        o = alpha (e^C S_c q + acc_q) + u (k . q)
    writes u (and k once per key head, g once per head; dual: v, beta), no state.
    Flush step (n + 1 >= K): fold entries 0..n-1 into the HIGH checkpoint tile (_fold), apply
    this step eagerly, write the high checkpoint (dual: refresh the low copy), cursor -> 0.
    """
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    GROUP: tl.constexpr = HV // HK
    kh = h // GROUP
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    o_ptrs = o_ptr + b * sob + h * soh + rows
    slot = tl.load(idx_ptr + b)
    if slot < 0:
        tl.store(o_ptrs, _cast(tl.zeros([BLOCK_V], tl.float32), o_ptr.dtype.element_ty, INTERP), mask=rmask)
    else:
        slot64 = slot.to(tl.int64)
        row_off = (slot64 * HV + h) * DV + rows
        tile = row_off[:, None] * DK + cols[None, :]
        mask2 = rmask[:, None] & cmask[None, :]
        # The read-checkpoint tile does not depend on the cursor: issue it first (the relaxed
        # ticket atomic does not order it). Dual flush steps reload the high copy below.
        if DUAL:
            S = _ckpt_load(lo_ptr, lo_sc_ptr, tile, row_off, mask2, rmask, LO_FP8)
        else:
            S = _ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8)
        # ticket read of the cursor (module docstring): low bits cursor, high bits programs so far
        old = tl.atomic_add(cur_ptr + slot64, _TICKET, sem="relaxed")
        n = old & _CUR_MASK
        last = (old >> 16) == nprog - 1
        do_flush = n + 1 >= flush_period
        if last:
            tl.atomic_xchg(cur_ptr + slot64, tl.where(do_flush, 0, n + 1), sem="relaxed")

        k_in = k_ptr + b * skb + kh * skh + cols
        k_raw = tl.load(k_in, mask=cmask, other=0.0)
        kn = k_raw.to(tl.float32)
        kn = kn * tl.rsqrt(tl.sum(kn * kn, 0) + EPS)
        qn = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cmask, other=0.0).to(tl.float32)
        qn = qn * (tl.rsqrt(tl.sum(qn * qn, 0) + EPS) * scale)
        v_raw = tl.load(v_ptr + b * svb + h * svh + rows, mask=rmask, other=0.0)
        vv = v_raw.to(tl.float32)
        gt = tl.load(g_ptr + b * sgb + h * sgh).to(tl.float32)
        bt = tl.load(beta_ptr + b * sbb + h * sbh).to(tl.float32)
        alpha = tl.exp(gt)
        kq = tl.sum(kn * qn, 0)

        # append entry n (position n is read by no program of this launch)
        ent = slot64 * L + n
        ok = n < L
        if pid_v == 0:
            tl.store(gb_ptr + ent * HV + h, gt, mask=ok)
            if DUAL:
                tl.store(bb_ptr + ent * HV + h, bt, mask=ok)
            if h % GROUP == 0:
                tl.store(kb_ptr + (ent * HK + kh) * DK + cols, _cast(k_raw.to(tl.float32), kb_ptr.dtype.element_ty, INTERP),
                         mask=cmask & ok)
        if DUAL:
            tl.store(vb_ptr + (ent * HV + h) * DV + rows, _cast(vv, vb_ptr.dtype.element_ty, INTERP), mask=rmask & ok)
        u_ptrs = ub_ptr + (ent * HV + h) * DV + rows

        if do_flush:
            if DUAL:
                S = _ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8)
            S = _fold(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
                      HV, HK, DK, DV, L, DUAL, EPS)
            u = bt * (vv - alpha * tl.sum(S * kn[None, :], 1))
            o = alpha * tl.sum(S * qn[None, :], 1) + u * kq
            S = alpha * S + u[:, None] * kn[None, :]
            if not DUAL:
                tl.store(u_ptrs, u, mask=rmask & ok)
            _ckpt_store(hi_ptr, hi_sc_ptr, tile, row_off, S, mask2, rmask, HI_FP8, INTERP)
            if DUAL:
                _ckpt_store(lo_ptr, lo_sc_ptr, tile, row_off, S, mask2, rmask, LO_FP8, INTERP)
        else:
            acc_k, acc_q, c = _buffer_terms(slot64, h, kh, n, kn, qn, rows, rmask, cols, cmask, ub_ptr, kb_ptr,
                                            gb_ptr, HV, HK, DK, DV, L, BLOCK_V, BLOCK_L, EPS)
            ec = tl.exp(c)
            u = bt * (vv - alpha * (ec * tl.sum(S * kn[None, :], 1) + acc_k))
            o = alpha * (ec * tl.sum(S * qn[None, :], 1) + acc_q) + u * kq
            tl.store(u_ptrs, u, mask=rmask & ok)
        tl.store(o_ptrs, _cast(o, o_ptr.dtype.element_ty, INTERP), mask=rmask)


# ----------------------------------------------------------------------------- fold
@triton.jit
def _gdn_fold_kernel(
    idx_ptr, add_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, cur_ptr,
    threshold, nprog,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_ADD: tl.constexpr, HI_FP8: tl.constexpr, LO_FP8: tl.constexpr, DUAL: tl.constexpr,
    INTERP: tl.constexpr, EPS: tl.constexpr,
):
    """Cursor move + conditional fold, per sequence, on the device.

    n = cursor (+ add[b] when HAS_ADD: commit of accepted drafts). If n >= threshold
    (flush: 1, commit: K) fold entries 0..n-1 into the high checkpoint, write it (dual:
    refresh the low copy) and set the cursor to 0; else the cursor becomes n.
    """
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kh = h // (HV // HK)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    slot = tl.load(idx_ptr + b)
    if slot >= 0:
        slot64 = slot.to(tl.int64)
        # ticket read of the cursor (module docstring): low bits cursor, high bits programs so far
        old = tl.atomic_add(cur_ptr + slot64, _TICKET, sem="relaxed")
        n = old & _CUR_MASK
        last = (old >> 16) == nprog - 1
        if HAS_ADD:
            n = n + tl.load(add_ptr + b).to(tl.int32)
        do_fold = n >= threshold
        if last:
            tl.atomic_xchg(cur_ptr + slot64, tl.where(do_fold, 0, n), sem="relaxed")
        if do_fold:
            row_off = (slot64 * HV + h) * DV + rows
            tile = row_off[:, None] * DK + cols[None, :]
            mask2 = rmask[:, None] & cmask[None, :]
            S = _ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8)
            S = _fold(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
                      HV, HK, DK, DV, L, DUAL, EPS)
            _ckpt_store(hi_ptr, hi_sc_ptr, tile, row_off, S, mask2, rmask, HI_FP8, INTERP)
            if DUAL:
                _ckpt_store(lo_ptr, lo_sc_ptr, tile, row_off, S, mask2, rmask, LO_FP8, INTERP)


# ----------------------------------------------------------------------------- verify
@triton.jit
def _gdn_verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, rd_ptr, rd_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, cur_ptr,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sgb, sgt, sgh, sbb, sbt, sbh, sob, sot, soh,
    scale,
    T: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr,
    RD_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
):
    """All T draft outputs for one [BLOCK_V, dk] tile from the read checkpoint and the buffer.

    n = cursor (plain read, not moved). Committed part, per draft j (C = c_{n-1}):
        A_k[j] = e^C S_c k_j + sum_{i<n} e^{C-c_i} (k_i.k_j) u_i   (A_q likewise with q_j)
    Drafts, D_j = g_0 + .. + g_j (D_{-1} = 0), forward substitution over j:
        S_{n+j-1} k_j = e^{D_{j-1}} A_k[j] + sum_{m<j} e^{D_{j-1}-D_m} (k_m.k_j) u_m
        u_j = beta_j (v_j - alpha_j S_{n+j-1} k_j)
        o_j = e^{D_j} A_q[j] + sum_{m<=j} e^{D_j-D_m} (k_m.q_j) u_m
    The checkpoint tile is read once for all drafts; no per-draft state. Drafts are written
    to the buffer at n..n+T-1 (u; k, g once; dual: v, beta).
    """
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    GROUP: tl.constexpr = HV // HK
    kh = h // GROUP
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    tt = tl.arange(0, BLOCK_T)
    tmask = tt < T
    omask = tmask[:, None] & rmask[None, :]
    o_ptrs = o_ptr + b * sob + tt[:, None] * sot + h * soh + rows[None, :]
    slot = tl.load(idx_ptr + b)
    if slot < 0:
        tl.store(o_ptrs, _cast(tl.zeros([BLOCK_T, BLOCK_V], tl.float32), o_ptr.dtype.element_ty, INTERP), mask=omask)
    else:
        slot64 = slot.to(tl.int64)
        row_off = (slot64 * HV + h) * DV + rows
        tile = row_off[:, None] * DK + cols[None, :]
        S = _ckpt_load(rd_ptr, rd_sc_ptr, tile, row_off, rmask[:, None] & cmask[None, :], rmask, RD_FP8)
        n = tl.load(cur_ptr + slot64)

        tkmask = tmask[:, None] & cmask[None, :]
        k_in = k_ptr + b * skb + tt[:, None] * skt + kh * skh + cols[None, :]
        k_raw = tl.load(k_in, mask=tkmask, other=0.0)
        Kd = k_raw.to(tl.float32)
        Kd = Kd * tl.rsqrt(tl.sum(Kd * Kd, 1) + EPS)[:, None]
        Qd = tl.load(q_ptr + b * sqb + tt[:, None] * sqt + kh * sqh + cols[None, :], mask=tkmask,
                     other=0.0).to(tl.float32)
        Qd = Qd * (tl.rsqrt(tl.sum(Qd * Qd, 1) + EPS) * scale)[:, None]
        Vd = tl.load(v_ptr + b * svb + tt[:, None] * svt + h * svh + rows[None, :], mask=omask, other=0.0).to(tl.float32)
        gd = tl.load(g_ptr + b * sgb + tt * sgt + h * sgh, mask=tmask, other=0.0).to(tl.float32)
        bd = tl.load(beta_ptr + b * sbb + tt * sbt + h * sbh, mask=tmask, other=0.0).to(tl.float32)

        # Checkpoint and draft-draft terms first, so that the big tiles die early (registers):
        # SK[j] = S_c k_j, SQ[j] = S_c q_j; Gram matrices KK[m, j] = k_m . k_j, KQ[m, j] = k_m . q_j.
        tc = tl.arange(0, BLOCK_T)[None, :]
        SK = tl.zeros([BLOCK_T, BLOCK_V], tl.float32)
        SQ = tl.zeros([BLOCK_T, BLOCK_V], tl.float32)
        KK = tl.zeros([BLOCK_T, BLOCK_T], tl.float32)
        KQ = tl.zeros([BLOCK_T, BLOCK_T], tl.float32)
        for j in range(T):
            sel = (tt == j)[:, None]
            kj = tl.sum(tl.where(sel, Kd, 0.0), 0)
            qj = tl.sum(tl.where(sel, Qd, 0.0), 0)
            SK += tl.where(sel, tl.sum(S * kj[None, :], 1)[None, :], 0.0)
            SQ += tl.where(sel, tl.sum(S * qj[None, :], 1)[None, :], 0.0)
            KK += tl.where(tc == j, tl.sum(Kd * kj[None, :], 1)[:, None], 0.0)
            KQ += tl.where(tc == j, tl.sum(Kd * qj[None, :], 1)[:, None], 0.0)

        # committed buffer entries, newest chunk first (exponents <= 0):
        # AK[j] = sum_{i<n} e^{C-c_i} (k_i . k_j) u_i, AQ[j] likewise with q_j
        NCH: tl.constexpr = (L + BLOCK_L - 1) // BLOCK_L
        AK = tl.zeros([BLOCK_T, BLOCK_V], tl.float32)
        AQ = tl.zeros([BLOCK_T, BLOCK_V], tl.float32)
        r = 0.0
        for cc in range(NCH):
            c0 = (NCH - 1 - cc) * BLOCK_L
            if c0 < n:
                ei = c0 + tl.arange(0, BLOCK_L)
                em = ei < n
                e = slot64 * L + ei
                gch = tl.load(gb_ptr + e * HV + h, mask=em, other=0.0).to(tl.float32)
                tot = tl.sum(gch, 0)
                w = tl.where(em, tl.exp(r + tot - tl.cumsum(gch, 0)), 0.0)
                kb = tl.load(kb_ptr + (e * HK + kh)[:, None] * DK + cols[None, :],
                             mask=em[:, None] & cmask[None, :], other=0.0).to(tl.float32)
                kb = kb * tl.rsqrt(tl.sum(kb * kb, 1) + EPS)[:, None]
                U = tl.load(ub_ptr + (e * HV + h)[:, None] * DV + rows[None, :],
                            mask=em[:, None] & rmask[None, :], other=0.0).to(tl.float32)
                for j in range(T):
                    sel = (tt == j)[:, None]
                    kj = tl.sum(tl.where(sel, Kd, 0.0), 0)
                    qj = tl.sum(tl.where(sel, Qd, 0.0), 0)
                    ak = tl.sum((w * tl.sum(kb * kj[None, :], 1))[:, None] * U, 0)
                    aq = tl.sum((w * tl.sum(kb * qj[None, :], 1))[:, None] * U, 0)
                    AK += tl.where(sel, ak[None, :], 0.0)
                    AQ += tl.where(sel, aq[None, :], 0.0)
                r += tot
        ec = tl.exp(r)
        AK = ec * SK + AK       # = S_{n-1} k_j
        AQ = ec * SQ + AQ       # = S_{n-1} q_j

        # drafts: forward substitution (draft j needs the u of drafts < j)
        Dc = tl.cumsum(gd, 0)
        UD = tl.zeros([BLOCK_T, BLOCK_V], tl.float32)
        O = tl.zeros([BLOCK_T, BLOCK_V], tl.float32)
        for j in range(T):
            sel1 = tt == j
            sel = sel1[:, None]
            gj = tl.sum(tl.where(sel1, gd, 0.0), 0)
            bj = tl.sum(tl.where(sel1, bd, 0.0), 0)
            dj = tl.sum(tl.where(sel1, Dc, 0.0), 0)
            dprev = dj - gj
            vj = tl.sum(tl.where(sel, Vd, 0.0), 0)
            ak = tl.sum(tl.where(sel, AK, 0.0), 0)
            aq = tl.sum(tl.where(sel, AQ, 0.0), 0)
            wk = tl.where(tt < j, tl.exp(tl.minimum(dprev - Dc, 0.0)), 0.0) * tl.sum(tl.where(tc == j, KK, 0.0), 1)
            sk = tl.exp(dprev) * ak + tl.sum(wk[:, None] * UD, 0)
            uj = bj * (vj - tl.exp(gj) * sk)
            UD = tl.where(sel, uj[None, :], UD)
            wq = tl.where(tt <= j, tl.exp(tl.minimum(dj - Dc, 0.0)), 0.0) * tl.sum(tl.where(tc == j, KQ, 0.0), 1)
            oj = tl.exp(dj) * aq + tl.sum(wq[:, None] * UD, 0)
            O = tl.where(sel, oj[None, :], O)
        tl.store(o_ptrs, _cast(O, o_ptr.dtype.element_ty, INTERP), mask=omask)

        # write the drafts to the buffer at n..n+T-1 (cursor unchanged)
        pos = n + tt
        pm = tmask & (pos < L)
        ent = slot64 * L + pos
        tl.store(ub_ptr + (ent * HV + h)[:, None] * DV + rows[None, :], UD, mask=pm[:, None] & rmask[None, :])
        if DUAL:
            tl.store(vb_ptr + (ent * HV + h)[:, None] * DV + rows[None, :], _cast(Vd, vb_ptr.dtype.element_ty, INTERP),
                     mask=pm[:, None] & rmask[None, :])
        if pid_v == 0:
            tl.store(gb_ptr + ent * HV + h, gd, mask=pm)
            if DUAL:
                tl.store(bb_ptr + ent * HV + h, bd, mask=pm)
            if h % GROUP == 0:
                tl.store(kb_ptr + (ent * HK + kh)[:, None] * DK + cols[None, :],
                         _cast(k_raw.to(tl.float32), kb_ptr.dtype.element_ty, INTERP),
                         mask=pm[:, None] & cmask[None, :])


# ----------------------------------------------------------------------------- host side
# Each op is planned as (kernel, grid, args, meta) and then launched; the same plan feeds
# compile_offline(), which builds the kernel for a GPU arch without a GPU (resource check).
def _rows_index(state_indices: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    if state_indices is None:
        return torch.arange(batch, dtype=torch.int32, device=device)
    return state_indices


def _last_contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _ckpt_args(ck):
    """(data, scale-or-dummy, is_fp8) of a state.Checkpoint."""
    if ck.scale is not None:
        return ck.data, ck.scale, True
    return ck.data, ck.data, False


def _hi_lo_args(rs: GDNReplayState):
    hi, hi_sc, hi_fp8 = _ckpt_args(rs.hi)
    lo, lo_sc, lo_fp8 = _ckpt_args(rs.lo) if rs.lo is not None else (hi, hi_sc, False)
    return [hi, hi_sc, lo, lo_sc], dict(HI_FP8=hi_fp8, LO_FP8=lo_fp8)


def _buffer_args(rs: GDNReplayState):
    """[u, k, g, v, beta] (v/beta: dummies outside dual mode), dual flag."""
    dual = rs.mode == "dual"
    return [rs.u, rs.k, rs.g, rs.v if dual else rs.u, rs.beta if dual else rs.g], dual


def _check_rs(rs: GDNReplayState, nprog: int) -> None:
    L = rs.capacity
    if L >= 1 << 16:
        raise ValueError(f"buffer_len {L} too large for the ticket cursor (< 65536)")
    if nprog >= 1 << 15:
        raise ValueError(f"{nprog} programs per sequence: too many for the ticket cursor; raise BLOCK_V")
    for t in [rs.hi.data, rs.cursor, *rs.buffers()] + ([rs.lo.data] if rs.lo is not None else []):
        if not t.is_contiguous():
            raise ValueError("ReplaySSM state tensors must be contiguous")


def _strides(*ts, dims: int):
    return [st for t in ts for st in t.stride()[:dims]]


def _common_meta(cfg: dict, **kw) -> dict:
    return dict(BLOCK_V=cfg["BLOCK_V"], BLOCK_K=cfg["BLOCK_K"], INTERP=interpreting(), EPS=L2_EPS,
                num_warps=cfg["num_warps"], **kw)


def plan_eager(state, q, k, v, g, beta, state_indices, scale, o, config=None):
    batch, Hv, dv = v.shape
    Hk, dk = k.shape[1], k.shape[2]
    assert state.is_contiguous() and tuple(state.shape[1:]) == (Hv, dv, dk), state.shape
    cfg = pick_config("eager", batch, dv, dk, 1, config)
    grid = (triton.cdiv(dv, cfg["BLOCK_V"]), Hv, batch)
    args = [q, k, v, g, beta, o, _rows_index(state_indices, batch, v.device), state,
            *_strides(q, k, v, g, beta, o, dims=2), scale]
    return _gdn_eager_kernel, grid, args, _common_meta(cfg, HV=Hv, HK=Hk, DK=dk, DV=dv)


def plan_replay(rs: GDNReplayState, q, k, v, g, beta, state_indices, scale, o, config=None):
    batch, Hv, dv = v.shape
    Hk, dk = k.shape[1], k.shape[2]
    L = rs.capacity
    cfg = pick_config("replay", batch, dv, dk, L, config)
    nt = triton.cdiv(dv, cfg["BLOCK_V"])
    _check_rs(rs, nt * Hv)
    ck, ck_meta = _hi_lo_args(rs)
    buf, dual = _buffer_args(rs)
    args = [q, k, v, g, beta, o, _rows_index(state_indices, batch, v.device), *ck, *buf, rs.cursor,
            *_strides(q, k, v, g, beta, o, dims=2), scale, rs.flush_period, nt * Hv]
    meta = _common_meta(cfg, HV=Hv, HK=Hk, DK=dk, DV=dv, L=L, BLOCK_L=cfg["BLOCK_L"], DUAL=dual, **ck_meta)
    return _gdn_replay_kernel, (nt, Hv, batch), args, meta


def plan_fold(rs: GDNReplayState, idx, add, threshold: int, config=None):
    rows = idx.shape[0]
    _, Hv, dv, dk = rs.hi.data.shape
    L = rs.capacity
    cfg = pick_config("fold", rows, dv, dk, L, config)
    nt = triton.cdiv(dv, cfg["BLOCK_V"])
    _check_rs(rs, nt * Hv)
    ck, ck_meta = _hi_lo_args(rs)
    buf, dual = _buffer_args(rs)
    args = [idx, idx if add is None else add, *ck, *buf, rs.cursor, threshold, nt * Hv]
    meta = _common_meta(cfg, HV=Hv, HK=rs.k.shape[2], DK=dk, DV=dv, L=L, HAS_ADD=add is not None, DUAL=dual,
                        **ck_meta)
    return _gdn_fold_kernel, (nt, Hv, rows), args, meta


def plan_verify(rs: GDNReplayState, q, k, v, g, beta, state_indices, scale, o, config=None):
    batch, T, Hv, dv = v.shape
    Hk, dk = k.shape[2], k.shape[3]
    L = rs.capacity
    if T > L:
        raise ValueError(f"draft window {T} exceeds buffer_len {L}")
    cfg = pick_config("verify", batch, dv, dk, L, config)
    nt = triton.cdiv(dv, cfg["BLOCK_V"])
    _check_rs(rs, nt * Hv)
    rd, rd_sc, rd_fp8 = _ckpt_args(rs.read_ckpt)
    buf, dual = _buffer_args(rs)
    args = [q, k, v, g, beta, o, _rows_index(state_indices, batch, v.device), rd, rd_sc, *buf, rs.cursor,
            *_strides(q, k, v, g, beta, o, dims=3), scale]
    meta = _common_meta(cfg, T=T, HV=Hv, HK=Hk, DK=dk, DV=dv, L=L, BLOCK_L=cfg["BLOCK_L"],
                        BLOCK_T=triton.next_power_of_2(T), RD_FP8=rd_fp8, DUAL=dual)
    return _gdn_verify_kernel, (nt, Hv, batch), args, meta


def _launch(plan) -> None:
    kernel, grid, args, meta = plan
    kernel[grid](*args, **meta)


def _scale(scale, dk: int) -> float:
    return dk ** -0.5 if scale is None else float(scale)


def eager_step(state, q, k, v, g, beta, state_indices=None, scale=None, out=None, config=None):
    """Eager GDN step: state [S, Hv, dv, dk] updated in place; returns o [b, Hv, dv] (v's dtype)."""
    q, k, v = _last_contig(q), _last_contig(k), _last_contig(v)
    o = torch.empty_like(v) if out is None else out
    if v.shape[0]:
        _launch(plan_eager(state, q, k, v, g, beta, state_indices, _scale(scale, k.shape[-1]), o, config))
    return o


def replay_step(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, scale=None, out=None, config=None):
    """ReplaySSM GDN step (fused flush on the device); returns o [b, Hv, dv] (v's dtype)."""
    q, k, v = _last_contig(q), _last_contig(k), _last_contig(v)
    o = torch.empty_like(v) if out is None else out
    if v.shape[0]:
        _launch(plan_replay(rs, q, k, v, g, beta, state_indices, _scale(scale, k.shape[-1]), o, config))
    return o


def fold(rs: GDNReplayState, idx: torch.Tensor, add: torch.Tensor | None, threshold: int, config=None) -> None:
    """Per row b of idx (slot; negative = skip): n = cursor (+ add[b]); if n >= threshold fold
    entries 0..n-1 into the checkpoint and reset the cursor, else store n. Flush: add None,
    threshold 1. Commit: add = accepted, threshold K."""
    if idx.shape[0]:
        _launch(plan_fold(rs, idx, add, threshold, config))


def flush(rs: GDNReplayState, slots: torch.Tensor | None = None, config=None) -> None:
    """Fold every committed entry of `slots` (default all) whose cursor > 0; decided on the device."""
    if slots is None:
        slots = torch.arange(rs.cursor.shape[0], dtype=torch.int32, device=rs.cursor.device)
    fold(rs, slots, None, 1, config)


def commit(rs: GDNReplayState, accepted: torch.Tensor, state_indices=None, config=None) -> None:
    """cursor += accepted[b]; fold where the cursor reached K (on the device)."""
    fold(rs, _rows_index(state_indices, accepted.shape[0], accepted.device), accepted, rs.flush_period, config)


def verify(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, scale=None, out=None, config=None):
    """Outputs of T drafts (q/k [b,T,Hk,dk], v [b,T,Hv,dv], g/beta [b,T,Hv]) -> o [b,T,Hv,dv]."""
    q, k, v = _last_contig(q), _last_contig(k), _last_contig(v)
    o = torch.empty_like(v) if out is None else out
    if v.shape[0]:
        _launch(plan_verify(rs, q, k, v, g, beta, state_indices, _scale(scale, k.shape[-1]), o, config))
    return o


# ----------------------------------------------------------------------------- offline compile
_TL_NAMES = {torch.float32: "fp32", torch.float64: "fp64", torch.bfloat16: "bf16", torch.float16: "fp16",
             torch.float8_e4m3fn: "fp8e4nv", torch.int32: "i32", torch.int64: "i64"}


def compile_offline(plan, arch: int = 90) -> dict:
    """Compile a plan's kernel for CUDA sm_<arch> without a GPU (Triton's bundled LLVM and
    ptxas) and return {'regs', 'stack', 'local', 'shared'} per thread/CTA from the cubin.

    Specialises like the JIT does at launch (tensors 16-byte aligned, ints divisible by 16
    marked so, ints equal to 1 as constants). Needs TRITON_INTERPRET unset. Plans may be
    built from tensors on the 'meta' device (only dtypes and strides are used).
    """
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    kernel, _, args, meta = plan
    if not isinstance(kernel, triton.runtime.JITFunction):
        raise RuntimeError("compile_offline needs TRITON_INTERPRET unset (kernels are interpreted)")
    meta = dict(meta)
    num_warps = meta.pop("num_warps")
    names = kernel.arg_names
    sig, consts, attrs = {}, dict(meta), {}
    for i, (name, a) in enumerate(zip(names, args)):
        if isinstance(a, torch.Tensor):
            sig[name] = "*" + _TL_NAMES[a.dtype]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, bool):
            sig[name], consts[name] = "constexpr", a
        elif isinstance(a, int):
            if a == 1:
                sig[name], consts[name] = "constexpr", 1
                continue
            sig[name] = "i32" if -2 ** 31 <= a < 2 ** 31 else "i64"
            if a % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
        elif isinstance(a, float):
            sig[name] = "fp32"
        else:
            raise TypeError(f"argument {name}: {type(a)}")
    for name in meta:
        sig[name] = "constexpr"
    src = ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs)
    ck = triton.compile(src, target=GPUTarget("cuda", arch, 32), options={"num_warps": num_warps})
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(ck.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    use = dict(re.findall(r"(REG|STACK|LOCAL|SHARED):(\d+)", out.split("Function", 1)[1]))
    return {"regs": int(use["REG"]), "stack": int(use["STACK"]), "local": int(use["LOCAL"]),
            "shared": int(use["SHARED"])}
