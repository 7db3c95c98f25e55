"""The flush step: folds the buffered entries of the rows whose cursor reached the flush
period into the high checkpoint (and the low copy); the SPLIT replay step's second launch and
the speculative commit's fold."""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.jit import cast, gdc_release, gdc_wait_prior
from ..common.mma import mm
from .jit import (EVICT_FIRST, ckpt_load, ckpt_store, hint_chunk, u_tile, fold_keys, fold_decays, scan_flushing,
                  ranked_key, ranked_slot, unit_tri_inv_minus_eye)


@triton.jit
def _stored_entry(F, wrun, i, n, slot64, h, kh, rr, rm, cols, cmask, ub_ptr, kb_ptr, gb_ptr,
                  HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
                  EPS: tl.constexpr):
    """F += w_i u_i k_i^T (k_i normalised) for entry i <= n, w_i = wrun; returns (F, wrun * alpha_i)."""
    i_ok = tl.where(i <= n, True, False)  # i1 scalar (common/jit.py)
    ei_ = (slot64 * L + i) * HV + h
    ki = tl.load(kb_ptr + ((slot64 * L + i) * HK + kh) * DK + cols, mask=cmask & i_ok, other=0.0).to(tl.float32)
    ui = tl.load(ub_ptr + ei_ * DV + rr, mask=rm & i_ok, other=0.0).to(tl.float32)
    F += ((wrun * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)) * ui)[:, None] * ki[None, :]
    wrun = tl.where(i_ok, wrun * tl.exp(tl.load(gb_ptr + ei_, mask=i_ok, other=0.0).to(tl.float32)), wrun)
    return F, wrun


@triton.jit
def gdn_flush_step_kernel(
    q_ptr, o_ptr, idx_ptr, nxt_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, cur_ptr, hi_desc, lo_desc,
    sqb, sqh, sob, soh, scale, flush_period, batch,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, NR: tl.constexpr, HP: tl.constexpr,
    NW: tl.constexpr, BLOCK_B: tl.constexpr, PF: tl.constexpr, PF_DIST: tl.constexpr,
    HI_LPR: tl.constexpr, HI_LS: tl.constexpr,
    HI_FP8: tl.constexpr, LO_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
    FOLD_MMA: tl.constexpr = False, BLOCK_L: tl.constexpr = 16, FOLD_PREC: tl.constexpr = "tf32x3",
    P_PREC: tl.constexpr = "tf32x3", SMALL_PREC: tl.constexpr = "tf32x3", GRAM_PREC: tl.constexpr = "tf32x3",
    WRITE_O: tl.constexpr = True, COMPACT: tl.constexpr = False, GDC: tl.constexpr = False,
    TMA: tl.constexpr = False, ST_TMA: tl.constexpr = False,
    LOAD_EV: tl.constexpr = EVICT_FIRST, STORE_EV: tl.constexpr = EVICT_FIRST,
):
    """Second launch of a SPLIT replay step: the flushes and the cursor moves. Also the
    speculative commit's fold (WRITE_O False: no output; nxt from gdn_commit_cursor_kernel).

    nxt[b] = the cursor each batch row had (-1: padded), stored by the output-only launch,
    which also appended this step's entry at n. Rows with n + 1 >= K flush: NW workers per
    (head block, row block) share them out by rank (worker w takes the flushing rows of rank
    w, w + NW, ...; NW = cdiv(batch, K) covers a staggered batch in one round), and each folds
    entries 0..n (this step's included) into its HIGH chunks and writes them back:
      non-dual: S = e^{c_n} S_c + sum_{i<=n} e^{c_n - c_i} u_i k_i^T (stored u);
      dual: u_i recomputed in order against the high state, the low copy refreshed, and the
        output o = S q replaces the one the first launch computed from the low copy.
    The cursor of every live row is written once (worker block (0, 0)): 0 after a flush, else
    n + 1. Nothing is read that a program of this launch writes. Programs with nothing to
    fold exit after one load.
    FOLD_MMA (the default for high copies of 16 and 32 bits; faster than the rank-1 fold on
    the H200): a worker visits only its own ranks (w, w + NW, ... <
    the number of flushing rows; one reduction each, not up to three for each of NT rank
    slots), and the fold is one matrix product per chunk, F = (U * w) Kb with U [rows, L] the
    u rows, w_i = e^{c_n - c_i} / |k_i| (0 past n) and Kb [L, dk] the raw keys (FOLD_PREC:
    the table's "bf16x3e" where the keys are bf16 / fp8, three bf16 terms of
    U * w against the keys as the bf16 operand, ~2^-23; else "tf32x3" ~2^-22
    for the replay step's flush, where the truncation split "tf32x2t" spilled at 32 rows x 4
    warps on sm_90, and for the commit rows' FOLD_SPLIT mma.split_precision:
    "tf32x2t" ~2^-20 for keys exact in tf32, the fp32 side split, two passes), instead of L
    rank-1 updates that each reduce their key's norm across the program. Non-dual, U is the
    stored u. Dual, U is recomputed against the high chunk S_0 in closed form instead of entry
    by entry: with A_i = e^{c_i},
        u_j + sum_{m<j} M_mj u_m = beta_j (v_j - A_j S_0 k_j),  M_mj = beta_j e^{c_j - c_m} (k_m . k_j),
    so U = R (I + M)^-1 = R + R X with R [rows, L] from one product S_0 Kb^T (P_PREC) and
    X = (I + M)^-1 - I from the keys' Gram matrix (GRAM_PREC) once per head
    (unit_tri_inv_minus_eye, SMALL_PREC) -- the algebra of the sequential recurrence, no
    low-copy value involved. Its rounding differs from the rank-1 fold's (about 1e-5 against
    the fp32 reference after a few steps at Qwen3.5 dims, 4.5e-7 rank-1), far inside the fp32
    state tolerance. Per-head coefficients (decays, dual: M and X) are computed once per
    head and shared by its NR chunks.
    COMPACT (the commit): the cursor launch has already moved the cursors and listed the
    flushing rows, nxt[r] = (b << 16) | n for ranks r < nxt[batch] (their count); a worker
    reads only its own ranks' entries, no batch-wide scan (gdn_commit_cursor_kernel).
    GDC: launched as a programmatic dependent (of the commit's cursor launch, or the step's
    output-only launch), it waits for the kernel ahead of it before any load, then lets a
    programmatic dependent behind it start early (the next layer's commit, in a model).
    TMA (16/32-bit high copies): the high chunks come through hi_desc, a TMA descriptor over
    the high copy as [rows, DK], block [BLOCK_R, BLOCK_K].
    ST_TMA (with TMA, the matrix-product fold, chunks inside the head): the folded chunk goes
    out through hi_desc too and, dual with a 16-bit low copy, the low copy's through lo_desc
    (its descriptor, same block): a shared-memory write and one bulk copy per chunk instead
    of a layout conversion and a [rows, dk] tile of addresses per store.
    """
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    GROUP: tl.constexpr = HV // HK
    RP: tl.constexpr = BLOCK_R * NR
    NRS: tl.constexpr = (DV + RP - 1) // RP
    NJ: tl.constexpr = HP * NR
    NT: tl.constexpr = (BLOCK_B + NW - 1) // NW
    pid0 = tl.program_id(0)
    kh = tl.program_id(1)
    w = tl.program_id(2)
    hs = pid0 // NRS
    r0 = (pid0 % NRS) * RP
    h0 = kh * GROUP + hs * HP
    ar = tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    if COMPACT:
        n_mine = (tl.load(nxt_ptr + batch) - w + NW - 1) // NW       # this worker's ranks w, w + NW, ...
    else:   # (the rank-1 path below does not use n_mine)
        bb, nb, fl, rank, sl, n_mine = scan_flushing(nxt_ptr, idx_ptr, cur_ptr, batch, flush_period, w,
                                                      (pid0 == 0) & (kh == 0), NW, BLOCK_B, DUAL)
    for t in range(NT):
        if COMPACT:
            key = n_mine * 0 - 1
            if t < n_mine:
                key = tl.load(nxt_ptr + w + t * NW)
            hit = key >= 0
        elif FOLD_MMA:   # past its own ranks a worker skips the reduction; one finds the row and its cursor
            key = n_mine * 0 - 1
            sk = key
            if t < n_mine:
                key = ranked_key(bb, nb, fl, rank, w + t * NW)
                if not DUAL:    # (dual: the slots kept live cost the solve's tile a spill)
                    sk = ranked_slot(sl, fl, rank, w + t * NW)
            hit = key >= 0
        else:
            pick = fl & (rank == w + t * NW)
            hit = tl.sum(pick.to(tl.int32), 0) > 0
        if hit:
            if FOLD_MMA or COMPACT:
                b = (key >> 16).to(tl.int64)
                n = key & 0xFFFF
            else:
                b = tl.sum(tl.where(pick, bb, 0), 0).to(tl.int64)
                n = tl.sum(tl.where(pick, nb, 0), 0)          # entries 0..n are folded
            if COMPACT or (DUAL and FOLD_MMA):
                slot64 = tl.load(idx_ptr + b).to(tl.int64)
            elif FOLD_MMA:
                slot64 = sk.to(tl.int64)
            else:
                slot64 = tl.sum(tl.where(pick, sl, 0), 0).to(tl.int64)
            if FOLD_MMA:   # per-sequence keys, shared by the chunks
                ll = tl.arange(0, BLOCK_L)
                lm = ll <= n
                ent = slot64 * L + ll
                kb, _, rk = fold_keys(kb_ptr, ent, lm, kh, cols, cmask, HK, DK, EPS)   # mm converts kb
            if DUAL:
                if WRITE_O:
                    qn = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cmask, other=0.0).to(tl.float32)
                    qn = qn * (tl.rsqrt(tl.sum(qn * qn, 0) + EPS) * scale)
                if FOLD_MMA:   # k_m . k_j of the normalised keys [BL, BL] (rows / columns past n: 0)
                    KK = mm(kb, tl.trans(kb), GRAM_PREC, INTERP) * rk[:, None] * rk[None, :]
                    ups = (ll[:, None] < ll[None, :]) & lm[None, :]                      # m < j <= n
            for c in tl.static_range(PF_DIST):
                if c < NJ:
                    hint_chunk(hi_ptr, slot64, h0, r0, c, ar, HV, DV, DK, NR, BLOCK_R, HI_LPR, HI_LS, PF,
                                INTERP)
            for hh in range(HP):
                h = h0 + hh
                if FOLD_MMA:   # per-head coefficients, shared by the head's NR chunks
                    el = ent * HV + h
                    cl, Cn, wl = fold_decays(gb_ptr, el, lm, rk)
                    if DUAL:
                        bl = tl.load(bb_ptr + el, mask=lm, other=0.0).to(tl.float32)
                        M = tl.where(ups, bl[None, :] * tl.exp(tl.where(ups, cl[None, :] - cl[:, None], 0.0)) * KK,
                                     0.0)
                        X = unit_tri_inv_minus_eye(M, BLOCK_L, SMALL_PREC, INTERP)   # (I + M)^-1 - I
                        rc = tl.exp(cl) * rk
                for jr in range(NR):
                    j = hh * NR + jr
                    rr = r0 + jr * BLOCK_R + ar
                    rm = rr < DV
                    row = (slot64 * HV + h) * DV + rr
                    cn = j + PF_DIST
                    if cn < NJ:
                        hint_chunk(hi_ptr, slot64, h0, r0, cn, ar, HV, DV, DK, NR, BLOCK_R, HI_LPR, HI_LS, PF,
                                    INTERP)
                    tile = row[:, None] * DK + cols[None, :]
                    m2 = rm[:, None] & cmask[None, :]
                    trow = ((slot64 * HV + h) * DV + r0 + jr * BLOCK_R).to(tl.int32)   # TMA: the chunk's row
                    if TMA:
                        S = hi_desc.load([trow, 0]).to(tl.float32)
                    else:
                        S = ckpt_load(hi_ptr, hi_sc_ptr, tile, row, m2, rm, HI_FP8, LOAD_EV)
                    if DUAL and FOLD_MMA:
                        V = tl.load(vb_ptr + el[None, :] * DV + rr[:, None], mask=rm[:, None] & lm[None, :],
                                    other=0.0).to(tl.float32)                      # [rows, BL] raw v
                        P = mm(S, tl.trans(kb), P_PREC, INTERP)                       # S_0 k_i (raw keys)
                        R_ = bl[None, :] * (V - rc[None, :] * P)
                        U = R_ + mm(R_, X, SMALL_PREC, INTERP)                     # R (I + M)^-1
                        S = tl.exp(Cn) * S + mm(U * wl[None, :], kb, FOLD_PREC, INTERP)
                        if WRITE_O:
                            o = tl.sum(S * qn[None, :], 1)
                            tl.store(o_ptr + b * sob + h * soh + rr, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rm)
                        if ST_TMA and not LO_FP8:
                            lo_desc.store([trow, 0], cast(S, lo_desc.dtype, INTERP))
                        else:
                            ckpt_store(lo_ptr, lo_sc_ptr, tile, row, S, m2, rm, LO_FP8, INTERP)
                    elif DUAL:
                        for i in tl.static_range(L):    # unrolled: every entry's loads issue up front
                            i_ok = tl.where(i <= n, True, False)  # i1 scalar (common/jit.py)
                            ei_ = (slot64 * L + i) * HV + h
                            ki = tl.load(kb_ptr + ((slot64 * L + i) * HK + kh) * DK + cols, mask=cmask & i_ok,
                                         other=0.0).to(tl.float32)
                            ki = ki * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)
                            vi = tl.load(vb_ptr + ei_ * DV + rr, mask=rm & i_ok, other=0.0).to(tl.float32)
                            ai = tl.where(i_ok, tl.exp(tl.load(gb_ptr + ei_).to(tl.float32)), 1.0)
                            bi = tl.where(i_ok, tl.load(bb_ptr + ei_).to(tl.float32), 0.0)
                            ui = bi * (vi - ai * tl.sum(S * ki[None, :], 1))
                            S = ai * S + ui[:, None] * ki[None, :]
                        if WRITE_O:
                            o = tl.sum(S * qn[None, :], 1)
                            tl.store(o_ptr + b * sob + h * soh + rr, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rm)
                        ckpt_store(lo_ptr, lo_sc_ptr, tile, row, S, m2, rm, LO_FP8, INTERP)
                    elif FOLD_MMA:
                        U = u_tile(ub_ptr, ent, h, rr, lm, HV, DV)                    # [rows, BL] stored u
                        S = tl.exp(Cn) * S + mm(U * wl[None, :], kb, FOLD_PREC, INTERP)
                    else:
                        wrun = 1.0    # w_i = prod_{i < j <= n} alpha_j, from the newest entry down
                        F = tl.zeros([BLOCK_R, BLOCK_K], tl.float32)
                        if HI_FP8 or hi_ptr.dtype.element_ty.primitive_bitwidth < 32:   # (quantising stores need
                            # the registers: a rolled loop)
                            for ii in range(L):
                                F, wrun = _stored_entry(F, wrun, L - 1 - ii, n, slot64, h, kh, rr, rm, cols, cmask,
                                                        ub_ptr, kb_ptr, gb_ptr, HV, HK, DK, DV, L, EPS)
                        else:         # unrolled: every entry's loads issue up front
                            for ii in tl.static_range(L):
                                i = L - 1 - ii
                                i_ok = tl.where(i <= n, True, False)  # i1 scalar (common/jit.py)
                                ei_ = (slot64 * L + i) * HV + h
                                ki = tl.load(kb_ptr + ((slot64 * L + i) * HK + kh) * DK + cols, mask=cmask & i_ok,
                                             other=0.0).to(tl.float32)
                                ui = tl.load(ub_ptr + ei_ * DV + rr, mask=rm & i_ok, other=0.0).to(tl.float32)
                                F += ((wrun * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)) * ui)[:, None] * ki[None, :]
                                wrun = tl.where(i_ok, wrun * tl.exp(tl.load(gb_ptr + ei_, mask=i_ok, other=0.0)
                                                                    .to(tl.float32)), wrun)
                        S = wrun * S + F
                    if ST_TMA:
                        hi_desc.store([trow, 0], cast(S, hi_desc.dtype, INTERP))
                    else:
                        ckpt_store(hi_ptr, hi_sc_ptr, tile, row, S, m2, rm, HI_FP8, INTERP, STORE_EV)
