"""Triton helpers the GDN kernels share: state tiles (load, store, fp8 scales), the rank-1
fold of buffer entries, the eager update, and the flush step's entry / rank bookkeeping.

The cursor word (state.CURSOR_MASK): bits 0-7 the count, 8-14 the deferred route's epoch, bit 15
STALE_BIT (a dual state's low copy is stale); ops that move the cursor in one launch add
TICKET per program, and the last program of a sequence stores the new word (see replay.py)."""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.jit import cast, prefetch_hint
from ..common.mma import mm
from ..state import CURSOR_MASK, FP8_MAX, LO_STALE

TICKET = tl.constexpr(1 << 16)
CUR_MASK = tl.constexpr(CURSOR_MASK)
STALE_BIT = tl.constexpr(LO_STALE)
_FP8_MAX = tl.constexpr(FP8_MAX)
EVICT_FIRST = tl.constexpr("evict_first")   # the helpers' default L2 policy (a plain str default does not compile)


@triton.jit
def ckpt_load(ptr, sc_ptr, tile_off, row_off, mask, rmask, FP8: tl.constexpr, EV: tl.constexpr = EVICT_FIRST):
    """Dequantised [BLOCK_V, BLOCK_K] fp32 tile (masked elements 0). Streamed once: evict first
    by default; EV: the L2 eviction policy ("" for none: see LOAD_EV of the eager kernels)."""
    s = tl.load(ptr + tile_off, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
    if FP8:
        s = s * tl.load(sc_ptr + row_off, mask=rmask, other=1.0)[:, None]
    return s


@triton.jit
def ckpt_store(ptr, sc_ptr, tile_off, row_off, s, mask, rmask, FP8: tl.constexpr, INTERP: tl.constexpr,
                EV: tl.constexpr = EVICT_FIRST):
    """Store a fp32 tile, quantising; fp8: per-row scale amax/448 (1 for a zero row).
    Whole rows live in one program (we tile dv only), so the row amax is local."""
    if FP8:
        amax = tl.max(tl.abs(s), 1)            # masked columns hold 0
        sc = tl.where(amax > 0, tl.math.div_rn(amax, _FP8_MAX), 1.0)
        tl.store(sc_ptr + row_off, sc, mask=rmask)
        s = tl.math.div_rn(s, sc[:, None])
    tl.store(ptr + tile_off, cast(s, ptr.dtype.element_ty, INTERP), mask=mask, eviction_policy=EV)


@triton.jit
def fold_entries(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
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
def tile_at(slot64, h, rows, rmask, cols, cmask, HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr):
    """Where a [BLOCK_V, BLOCK_K] tile of (slot, value head h), rows `rows`, lies in a
    [slots, Hv, dv, dk] state: (its row offsets [BLOCK_V], element offsets, mask)."""
    row_off = (slot64 * HV + h) * DV + rows
    return row_off, row_off[:, None] * DK + cols[None, :], rmask[:, None] & cmask[None, :]


@triton.jit
def folded_tile(hi_ptr, hi_sc_ptr, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, slot64, h, kh, n, rows, rmask, cols, cmask,
                 HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
                 HI_FP8: tl.constexpr, DUAL: tl.constexpr, EPS: tl.constexpr, EV: tl.constexpr = EVICT_FIRST):
    """The high checkpoint's [BLOCK_V, dk] tile of (slot, value head h), rows `rows`, with buffer
    entries 0..n-1 folded in (fold_entries): (S, its element offsets, its row offsets, its mask)."""
    row_off, tile, mask2 = tile_at(slot64, h, rows, rmask, cols, cmask, HV, DV, DK)
    S = ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8, EV)
    S = fold_entries(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
              HV, HK, DK, DV, L, DUAL, EPS)
    return S, tile, row_off, mask2


@triton.jit
def eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols, cmask,
                  sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS: tl.constexpr):
    """The step's inputs for one tile: normalised k [BLOCK_K], q [BLOCK_K] (times scale),
    v [BLOCK_V], alpha = exp(g) and beta (scalars), all fp32."""
    kn = tl.load(k_ptr + b * skb + kh * skh + cols, mask=cmask, other=0.0).to(tl.float32)
    kn = kn * tl.rsqrt(tl.sum(kn * kn, 0) + EPS)
    qn = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cmask, other=0.0).to(tl.float32)
    qn = qn * (tl.rsqrt(tl.sum(qn * qn, 0) + EPS) * scale)
    vv = tl.load(v_ptr + b * svb + h * svh + rows, mask=rmask, other=0.0).to(tl.float32)
    alpha = tl.exp(tl.load(g_ptr + b * sgb + h * sgh).to(tl.float32))
    bt = tl.load(beta_ptr + b * sbb + h * sbh).to(tl.float32)
    return kn, qn, vv, alpha, bt


@triton.jit
def eager_update(S, kn, qn, vv, alpha, bt):
    """(S', o) of one eager step of the tile S from its inputs (see eager_tile)."""
    sk = tl.sum(S * kn[None, :], 1)
    sq = tl.sum(S * qn[None, :], 1)
    u = bt * (vv - alpha * sk)
    return alpha * S + u[:, None] * kn[None, :], alpha * sq + u * tl.sum(kn * qn, 0)


@triton.jit
def hint_chunk(ptr, slot64, h0, r0, c, ar, HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr,
                NR: tl.constexpr, BLOCK_R: tl.constexpr, LPR: tl.constexpr, LS: tl.constexpr, PF: tl.constexpr,
                INTERP: tl.constexpr):
    """Prefetch hint (PF) for chunk c of a program's state copy: value head h0 + c // NR, rows
    r0 + (c % NR) * BLOCK_R + ar (clamped to the head) of sequence slot64, DK elements a row."""
    if not INTERP:
        prefetch_hint(ptr, ((slot64 * HV + h0 + c // NR) * DV + tl.minimum(r0 + (c % NR) * BLOCK_R + ar, DV - 1)) * DK,
                      LPR, LS, PF, INTERP)


@triton.jit
def u_tile(ub_ptr, ent, h, rr, lm, HV: tl.constexpr, DV: tl.constexpr):
    """Stored u [rows rr, entries ent] (masked by lm, rows < DV) of value head h, fp32."""
    return tl.load(ub_ptr + (ent[None, :] * HV + h) * DV + rr[:, None], mask=(rr < DV)[:, None] & lm[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def fold_keys(kb_ptr, ent, lm, kh, cols, cmask, HK: tl.constexpr, DK: tl.constexpr, EPS: tl.constexpr):
    """A folding row's raw keys kb [BL, BK] of key head kh (entries not in lm: 0), as fp32 kf,
    and rk = 1 / |k_i|: (kb, kf, rk)."""
    kb = tl.load(kb_ptr + (ent * HK + kh)[:, None] * DK + cols[None, :], mask=lm[:, None] & cmask[None, :],
                 other=0.0)
    kf = kb.to(tl.float32)
    return kb, kf, tl.rsqrt(tl.sum(kf * kf, 1) + EPS)


@triton.jit
def fold_decays(gb_ptr, el, lm, rk):
    """A value head's decays over the folding entries (el = entry * HV + head; lm: entries
    0..n): (c [BL] the running sums of g, C_n their total, w_i = e^{C_n - c_i} / |k_i|, 0 past n)."""
    gl = tl.load(gb_ptr + el, mask=lm, other=0.0).to(tl.float32)
    cl = tl.cumsum(gl, 0)
    Cn = tl.sum(gl, 0)
    return cl, Cn, tl.where(lm, tl.exp(Cn - cl) * rk, 0.0)                     # exponents <= 0


@triton.jit
def scan_flushing(nxt_ptr, idx_ptr, cur_ptr, batch, flush_period, w, writer, NW: tl.constexpr,
                   BLOCK_B: tl.constexpr, STALE: tl.constexpr):
    """The flushing rows of a SPLIT replay step, from nxt[b] = the cursor word row b had (-1:
    padded; this step's entry is at n = its count): rows with n + 1 >= K or a stale low copy
    (LO_STALE) flush, ranked in batch order. The programs with `writer` set (one per worker)
    write the cursors of rows b % NW == w: 0 after a flush, else n + 1. Returns (bb, nb, fl,
    rank, sl) over the BLOCK_B rows (nb: the counts, -1 padded; sl: their slots, loaded with
    the words so that a worker's row costs no further round trip) and this worker's count of
    ranks w, w + NW, ... STALE: a dual state (other states' words carry no LO_STALE bit)."""
    bb = tl.arange(0, BLOCK_B)
    word = tl.load(nxt_ptr + bb, mask=bb < batch, other=-1)
    sl = tl.load(idx_ptr + bb, mask=bb < batch, other=0)
    if STALE:
        nb = tl.where(word >= 0, word & CUR_MASK, -1)
        fl = (nb >= 0) & ((nb + 1 >= flush_period) | ((word & STALE_BIT) != 0))
    else:
        nb = word
        fl = (nb >= 0) & (nb + 1 >= flush_period)
    rank = tl.cumsum(fl.to(tl.int32), 0) - 1
    if writer:
        mine = (nb >= 0) & (bb % NW == w)
        tl.store(cur_ptr + sl, tl.where(fl, 0, nb + 1), mask=mine)
    return bb, nb, fl, rank, sl, tl.sum((fl & (rank % NW == w)).to(tl.int32), 0)


@triton.jit
def ranked_key(bb, nb, fl, rank, r):
    """(b << 16) | n of the flushing row of rank r (-1: none), from scan_flushing (n < 2^16, b < 2^15)."""
    return tl.max(tl.where(fl & (rank == r), (bb << 16) | nb, -1), 0)


@triton.jit
def ranked_slot(sl, fl, rank, r):
    """The state slot of the flushing row of rank r (-1: none), from scan_flushing, as int32
    whatever the index dtype (int64 state indices too: the callers' loop-carried value is int32)."""
    return tl.max(tl.where(fl & (rank == r), sl, -1), 0).to(tl.int32)


@triton.jit
def unit_tri_inv_minus_eye(M, ORDER: tl.constexpr, PREC: tl.constexpr, INTERP: tl.constexpr):
    """X = (I + M)^-1 - I for M strictly upper triangular with M^ORDER = 0 (nonzero only in its
    leading ORDER x ORDER block): (I + M)^-1 = sum_{k < ORDER} (-M)^k = (I - M)(I + M^2)(I + M^4)
    ..., the rounds while 2^e < ORDER (log2(ORDER) rounds of products instead of ORDER dependent
    substitution steps; T = 4 drafts: one round). Kept as X, one round being X' = X + P + X P
    (P the next power): each product's rounding error is relative to X P, not to the identity
    (what (I + X)(I + P) would carry), and R (I + M)^-1 = R + R X likewise. ORDER <= 64."""
    X = -M
    P = M
    for e in tl.static_range(1, 6):
        if (1 << e) < ORDER:                        # P = M^(2^e)
            P = mm(P, P, PREC, INTERP)
            X = X + P + mm(X, P, PREC, INTERP)
    return X
