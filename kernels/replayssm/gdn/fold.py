"""Fold kernels: the standalone flush / commit fold (gdn_fold_kernel, ticket cursor), the
commit's cursor launch, the balanced commit fold, the dual two-pass fold and the refresh of
stale low copies."""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.jit import cast, clear_lo_stale_kernel, commit_counts, gdc_release, gdc_wait_prior, list_commit_rows
from ..common.mma import mm, mma_acc
from .jit import (TICKET, CUR_MASK, STALE_BIT, ckpt_load, ckpt_store, folded_tile, hint_chunk, u_tile, fold_keys,
                  fold_decays, scan_flushing, ranked_key, unit_tri_inv_minus_eye)


@triton.jit
def gdn_commit_cursor_kernel(idx_ptr, n_slots, add_ptr, cur_ptr, nxt_ptr, batch, flush_period, max_add,
                              BLOCK_B: tl.constexpr,
                              COMPACT: tl.constexpr, GDC: tl.constexpr = False):
    """First launch of a speculative commit, one program: with m = cursor + accepted[b],
    COMPACT: moves the cursors (0 where m >= K: the row flushes; else m) and lists the flushing
      rows for the flush step, nxt[r] = (b << 16) | (m - 1) at their ranks r, and their count
      at nxt[batch] (common.list_commit_rows);
    else: nxt[b] = m - 1, the last entry the commit keeps (-1 for a padded row, or a row with
      nothing committed: the flush step then leaves it alone), and the flush step moves the
      cursors.
    A launch of its own because the flush step's programs must all see the cursors before
    any of them moves (in the flush step, one worker block writes them).
    GDC (a programmatic dependent launch): waits for the kernel ahead of it (the verify), then
    lets the fold behind it launch, whose programs wait in turn."""
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    if COMPACT:
        list_commit_rows(idx_ptr, n_slots, add_ptr, cur_ptr, nxt_ptr, batch, flush_period, max_add, BLOCK_B, True)
    else:
        bb, _, live, m = commit_counts(idx_ptr, n_slots, add_ptr, cur_ptr, batch, max_add, BLOCK_B)
        tl.store(nxt_ptr + bb, tl.where(live, m - 1, -1), mask=bb < batch)


@triton.jit
def _balanced_chunk(hi_desc, hi_ptr, ub_ptr, slot64, h, c, ent, lm, ar, cols, cmask, eC, wl, kf,
                    HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr, BLOCK_R: tl.constexpr,
                    FOLD_PREC: tl.constexpr, TMA: tl.constexpr, ST_TMA: tl.constexpr, INTERP: tl.constexpr):
    """gdn_commit_balanced_kernel's fold of chunk c of value head h: S = eC S_c + (U * w) Kb,
    the chunk loaded through hi_desc (TMA) or pointers and stored through it (ST_TMA) or pointers."""
    rr = c * BLOCK_R + ar
    rm = rr < DV
    row = (slot64 * HV + h) * DV + rr
    tile = row[:, None] * DK + cols[None, :]
    m2 = rm[:, None] & cmask[None, :]
    trow = ((slot64 * HV + h) * DV + c * BLOCK_R).to(tl.int32)
    if TMA:
        S = hi_desc.load([trow, 0]).to(tl.float32)
    else:
        S = ckpt_load(hi_ptr, hi_ptr, tile, row, m2, rm, False)
    U = u_tile(ub_ptr, ent, h, rr, lm, HV, DV)
    S = eC * S + mm(U * wl[None, :], kf, FOLD_PREC, INTERP)
    if ST_TMA:
        hi_desc.store([trow, 0], cast(S, hi_desc.dtype, INTERP))
    else:
        ckpt_store(hi_ptr, hi_ptr, tile, row, S, m2, rm, False, INTERP)


@triton.jit
def gdn_commit_balanced_kernel(
    lst_ptr, idx_ptr, hi_ptr, ub_ptr, kb_ptr, gb_ptr, hi_desc, batch,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, NSEG: tl.constexpr,
    PF: tl.constexpr, PF_DIST: tl.constexpr, HI_LPR: tl.constexpr, HI_LS: tl.constexpr,
    FOLD_PREC: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr, GDC: tl.constexpr = False,
    TMA: tl.constexpr = False, ST_TMA: tl.constexpr = False,
):
    """Fold of a speculative commit (non-dual states, a 16- or 32-bit high copy), balanced over
    a fixed grid: the second launch after gdn_commit_cursor_kernel (COMPACT), which listed the
    flushing rows, lst[r] = (b << 16) | n for ranks r < lst[batch].

    The work is count x Hv x NC items, item (r, h, c) = chunk c (BLOCK_R rows, NC per head)
    of value head h of the row of rank r, in that order; program p of NP folds the contiguous
    items [p * total // NP, (p + 1) * total // NP), so every program gets the same number of
    chunks to within one, whatever the count. (One program per (worker, head block) leaves a
    partial last wave when the folding programs do not fill whole waves: at batch 128 and
    Qwen3.5-4B dims, 1024 half-head programs on 6 x 132 slots.) A program walks its range
    as segments of one (row, head): per segment it loads the row's keys and the head's decays
    once (w_i = e^{c_n - c_i} / |k_i|, 0 past n), then per chunk
        S = e^{c_n} S_c + (U * w) Kb      (U [rows, BLOCK_L] the stored u, Kb the raw keys)
    as gdn_flush_step_kernel's FOLD_MMA path, the next chunks hinted (PF) PF_DIST ahead.
    Loops have constexpr trip counts (NSEG segments of at most NC chunks, guarded; the TMA
    path's chunk loop runs between bounds computed on the device), as the grid and shapes do:
    CUDA-graph safe. GDC: launched as a programmatic dependent of the
    cursor launch, it waits for it before any load, then lets a programmatic dependent behind
    it start early (the next layer's commit, in a model).
    TMA: the chunks come through hi_desc (the high copy as [rows, DK], block
    [BLOCK_R, BLOCK_K]) in a loop over the segment's own chunks, which Triton's pipeliner can
    run ahead (num_stages); ST_TMA (heads of whole chunks): the folded chunks go out through it."""
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    NC: tl.constexpr = (DV + BLOCK_R - 1) // BLOCK_R
    GROUP: tl.constexpr = HV // HK
    p = tl.program_id(0).to(tl.int64)
    np_ = tl.num_programs(0)
    total = tl.load(lst_ptr + batch).to(tl.int64) * (HV * NC)
    i0 = p * total // np_
    i1 = (p + 1) * total // np_
    ar = tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    ll = tl.arange(0, BLOCK_L)
    for sg in range(NSEG):
        sid = i0 // NC + sg                          # segment = (rank, value head)
        c_lo = tl.maximum(i0 - sid * NC, 0)
        c_hi = tl.minimum(i1 - sid * NC, NC)
        if c_lo < c_hi:
            h = (sid % HV).to(tl.int32)
            kh = h // GROUP
            key = tl.load(lst_ptr + sid // HV)
            n = key & 0xFFFF                             # entries 0..n fold
            slot64 = tl.load(idx_ptr + (key >> 16)).to(tl.int64)
            for c in tl.static_range(PF_DIST):
                if c_lo + c < c_hi:
                    hint_chunk(hi_ptr, slot64, h, 0, c_lo + c, ar, HV, DV, DK, NC, BLOCK_R, HI_LPR, HI_LS, PF,
                                INTERP)
            lm = ll <= n
            ent = slot64 * L + ll
            _, kf, rk = fold_keys(kb_ptr, ent, lm, kh, cols, cmask, HK, DK, EPS)
            _, Cn, wl = fold_decays(gb_ptr, ent * HV + h, lm, rk)
            eC = tl.exp(Cn)
            if TMA and not INTERP:   # the segment's own chunks (bounds from the device: pipelinable)
                for c in range(c_lo.to(tl.int32), c_hi.to(tl.int32)):
                    _balanced_chunk(hi_desc, hi_ptr, ub_ptr, slot64, h, c, ent, lm, ar, cols, cmask, eC, wl, kf,
                                    HV, DV, DK, BLOCK_R, FOLD_PREC, TMA, ST_TMA, INTERP)
            else:   # (the interpreter takes no tensor loop bounds; its hints are no-ops)
                for c in range(NC):
                    if (c >= c_lo) & (c < c_hi):
                        if c + PF_DIST < c_hi:
                            hint_chunk(hi_ptr, slot64, h, 0, c + PF_DIST, ar, HV, DV, DK, NC, BLOCK_R, HI_LPR, HI_LS,
                                        PF, INTERP)
                        _balanced_chunk(hi_desc, hi_ptr, ub_ptr, slot64, h, c, ent, lm, ar, cols, cmask, eC, wl, kf,
                                        HV, DV, DK, BLOCK_R, FOLD_PREC, TMA, ST_TMA, INTERP)


@triton.jit
def gdn_refresh_lo_kernel(idx_ptr, n_slots, cur_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
                           HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr,
                           BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                           HI_FP8: tl.constexpr, LO_FP8: tl.constexpr, INTERP: tl.constexpr):
    """Before a verify of a dual state that has taken the eager route: where the cursor word
    says the low copy is stale (LO_STALE), copy the [BLOCK_V, dk] tile of the high checkpoint
    into it (quantising). Grid (cdiv(dv, BLOCK_V), Hv, batch). The bit is cleared by the launch
    after (common.clear_lo_stale_kernel; no program here may, as another may not have read it
    yet), so the verify reads plain counts."""
    b = tl.program_id(2)
    slot = tl.load(idx_ptr + b)
    slot = tl.where(slot < n_slots, slot, -1)      # past the pool: a no-op row, as padding
    if slot >= 0:
        slot64 = slot.to(tl.int64)
        if (tl.load(cur_ptr + slot64) & STALE_BIT) != 0:
            rows = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
            rmask = rows < DV
            cols = tl.arange(0, BLOCK_K)
            row_off = (slot64 * HV + tl.program_id(1)) * DV + rows
            tile = row_off[:, None] * DK + cols[None, :]
            mask2 = rmask[:, None] & (cols < DK)[None, :]
            S = ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8)
            ckpt_store(lo_ptr, lo_sc_ptr, tile, row_off, S, mask2, rmask, LO_FP8, INTERP)


@triton.jit
def gdn_fold_kernel(
    idx_ptr, n_slots, add_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
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
    refresh the low copy) and set the cursor to 0; else the cursor becomes n. A flush (no
    add) also folds where the low copy is stale (LO_STALE, n = 0): the fold of no entries
    rewrites both copies. (A commit follows a verify, which has refreshed it.)
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
    slot = tl.where(slot < n_slots, slot, -1)      # past the pool: a no-op row, as padding
    if slot >= 0:
        slot64 = slot.to(tl.int64)
        # ticket read of the cursor (module docstring): low bits cursor, high bits programs so far
        old = tl.atomic_add(cur_ptr + slot64, TICKET, sem="relaxed")
        n = old & CUR_MASK
        last = (old >> 16) == nprog - 1
        if HAS_ADD:
            n = n + tl.minimum(tl.maximum(tl.load(add_ptr + b).to(tl.int32), 0), L - threshold)
            do_fold = n >= threshold
        elif DUAL:
            do_fold = (n >= threshold) | ((old & STALE_BIT) != 0)
        else:
            do_fold = n >= threshold
        if last:
            tl.atomic_xchg(cur_ptr + slot64, tl.where(do_fold, 0, n), sem="relaxed")
        if do_fold:
            S, tile, row_off, mask2 = folded_tile(hi_ptr, hi_sc_ptr, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, slot64, h,
                                                   kh, n, rows, rmask, cols, cmask, HV, HK, DK, DV, L, HI_FP8, DUAL,
                                                   EPS)
            ckpt_store(hi_ptr, hi_sc_ptr, tile, row_off, S, mask2, rmask, HI_FP8, INTERP)
            if DUAL:
                ckpt_store(lo_ptr, lo_sc_ptr, tile, row_off, S, mask2, rmask, LO_FP8, INTERP)


@triton.jit
def gdn_dual_2pass_kernel(
    lst_ptr, idx_ptr, cur_ptr, hi_ptr, lo_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, q_ptr, o_ptr,
    sqb, sqh, sob, soh, scale, flush_period, batch,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_B: tl.constexpr,
    NW: tl.constexpr, NT: tl.constexpr, COMPACT: tl.constexpr, WRITE_O: tl.constexpr,
    P_PREC: tl.constexpr, GRAM_PREC: tl.constexpr, SMALL_PREC: tl.constexpr, FOLD_PREC: tl.constexpr,
    INTERP: tl.constexpr, EPS: tl.constexpr, GDC: tl.constexpr = False,
):
    """Fold of dual-mode states (fp32 high copy, 16-bit low copy) for the rows that flush; one
    program per (worker, value head, BLOCK_V rows), worker w taking the flushing rows of rank
    w, w + NW, ... The rows:
      COMPACT (the speculative commit): listed by gdn_commit_cursor_kernel, lst[r] =
        (b << 16) | n, their count at lst[batch]; the cursors already moved;
      else (a SPLIT replay step's second launch): lst[b] = the cursor row b had (-1: padded)
        from the output-only launch, which appended this step's entry at n; rows with
        n + 1 >= K flush, and the programs of the first row tile of head 0 write the cursors
        (0 after a flush, else n + 1), as gdn_flush_step_kernel does.
    The u of entries 0..n are recomputed against the high state S_0 in closed form (the
    algebra of gdn_flush_step_kernel's dual FOLD_MMA path):
        U = R (I + M)^-1 = R + R X,  R[:, i] = beta_i (v_i - e^{c_i} S_0 k_i / |k_i|),
        M[m, j] = [m < j <= n] beta_j e^{c_j - c_m} (k_m . k_j) / (|k_m| |k_j|),
        S_n = e^{c_n} S_0 + (U * w) Kb,  w_i = e^{c_n - c_i} / |k_i|   (Kb the raw keys)
    in two passes over dk in BLOCK_K-column steps, as the verify kernel streams its tile:
      1. S_0 Kb^T [BV, BL] (P_PREC), the keys' Gram matrix and norms (GRAM_PREC), accumulated
         per step, so no [BV, dk] tile is ever whole in registers;
      2. the state steps again (L2 hits: the program read them just before), each
         updated by one product with its key columns (FOLD_PREC), stored to both copies;
         WRITE_O: o = S_n q (q l2-normalised, scaled) replaces the output-only launch's.
    The per-head work (M, X = (I + M)^-1 - I: unit_tri_inv_minus_eye, SMALL_PREC) is done
    once per program. GDC: launched as a programmatic dependent (of the commit's cursor
    launch, or the step's output-only launch), it waits for the kernel ahead of it before any
    load, then lets a programmatic dependent behind it start early."""
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    w = tl.program_id(0)
    pid1 = tl.program_id(1)
    NRT: tl.constexpr = (DV + BLOCK_V - 1) // BLOCK_V
    h = pid1 // NRT
    kh = h // (HV // HK)
    rows = (pid1 % NRT) * BLOCK_V + tl.arange(0, BLOCK_V)
    rm = rows < DV
    ll = tl.arange(0, BLOCK_L)
    if COMPACT:
        n_mine = (tl.load(lst_ptr + batch) - w + NW - 1) // NW
    else:
        bb, nb, fl, rank, _, n_mine = scan_flushing(lst_ptr, idx_ptr, cur_ptr, batch, flush_period, w, pid1 == 0,
                                                     NW, BLOCK_B, True)
    for t in range(NT):
        if t < n_mine:
            if COMPACT:
                key = tl.load(lst_ptr + w + t * NW)
            else:
                key = ranked_key(bb, nb, fl, rank, w + t * NW)
            b = (key >> 16).to(tl.int64)
            n = key & 0xFFFF
            slot64 = tl.load(idx_ptr + b).to(tl.int64)
            lm = ll <= n
            ent = slot64 * L + ll
            el = ent * HV + h
            row = (slot64 * HV + h) * DV + rows
            P = tl.zeros([BLOCK_V, BLOCK_L], tl.float32)
            KK = tl.zeros([BLOCK_L, BLOCK_L], tl.float32)
            nk = tl.zeros([BLOCK_L], tl.float32)
            nq = 0.0
            for c0 in tl.range(0, DK, BLOCK_K):
                cols = c0 + tl.arange(0, BLOCK_K)
                cm = cols < DK
                S = tl.load(hi_ptr + row[:, None] * DK + cols[None, :], mask=rm[:, None] & cm[None, :], other=0.0)
                kb = tl.load(kb_ptr + (ent * HK + kh)[:, None] * DK + cols[None, :], mask=lm[:, None] & cm[None, :],
                             other=0.0)
                kbT = tl.trans(kb)
                P = mma_acc(S, kbT, P, P_PREC, INTERP)
                KK = mma_acc(kb, kbT, KK, GRAM_PREC, INTERP)
                kf = kb.to(tl.float32)
                nk += tl.sum(kf * kf, 1)
                if WRITE_O:
                    qc = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cm, other=0.0).to(tl.float32)
                    nq += tl.sum(qc * qc, 0)
            rk = tl.rsqrt(nk + EPS)
            gl = tl.load(gb_ptr + el, mask=lm, other=0.0).to(tl.float32)
            bl = tl.load(bb_ptr + el, mask=lm, other=0.0).to(tl.float32)
            cl = tl.cumsum(gl, 0)
            Cn = tl.sum(gl, 0)
            ups = (ll[:, None] < ll[None, :]) & lm[None, :]                          # m < j <= n
            M = tl.where(ups, bl[None, :] * tl.exp(tl.where(ups, cl[None, :] - cl[:, None], 0.0))
                         * KK * rk[:, None] * rk[None, :], 0.0)                       # exponents <= 0
            X = unit_tri_inv_minus_eye(M, BLOCK_L, SMALL_PREC, INTERP)
            V = tl.load(vb_ptr + el[None, :] * DV + rows[:, None], mask=rm[:, None] & lm[None, :],
                        other=0.0).to(tl.float32)                                  # [BV, BL] raw v
            R = bl[None, :] * (V - (tl.exp(cl) * rk)[None, :] * P)
            W = (R + mm(R, X, SMALL_PREC, INTERP)) * tl.where(lm, tl.exp(Cn - cl) * rk, 0.0)[None, :]
            eC = tl.exp(Cn)
            o = tl.zeros([BLOCK_V], tl.float32)
            for c0 in tl.range(0, DK, BLOCK_K):
                cols = c0 + tl.arange(0, BLOCK_K)
                cm = cols < DK
                tile = row[:, None] * DK + cols[None, :]
                m2 = rm[:, None] & cm[None, :]
                kb = tl.load(kb_ptr + (ent * HK + kh)[:, None] * DK + cols[None, :], mask=lm[:, None] & cm[None, :],
                             other=0.0)
                S = eC * tl.load(hi_ptr + tile, mask=m2, other=0.0, eviction_policy="evict_first") \
                    + mm(W, kb, FOLD_PREC, INTERP)
                tl.store(hi_ptr + tile, S, mask=m2)
                tl.store(lo_ptr + tile, cast(S, lo_ptr.dtype.element_ty, INTERP), mask=m2)
                if WRITE_O:
                    qc = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cm, other=0.0).to(tl.float32)
                    o += tl.sum(S * qc[None, :], 1)
            if WRITE_O:
                o = o * (tl.rsqrt(nq + EPS) * scale)
                tl.store(o_ptr + b * sob + h * soh + rows, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rm)
