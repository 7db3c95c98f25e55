"""Mamba-2 ReplaySSM step, the buffered path: outputs from the checkpoint and the buffered
entries (no state write), the new entry appended; a sequence whose cursor reaches K (or whose
low copy is stale) flushes inside the step (fold, write the checkpoints, cursor back to 0).

Grid (row tiles of P, H, batch rows). A program owns one [rows, N] tile, loaded with one 2-D
load before anything that depends on the cursor. At large batches the per-group and per-head
terms that do not depend on the rows (B_i . C, decay weights) come from a pre-pass launch
(_buffer_bc_kernel) instead of from every program.

The cursor. Every program of a sequence reads cursor[slot]; programs are not ordered, so none
may simply write it. Either the step takes it with an atomic ticket (the program drawing the
last ticket stores the new cursor: one launch), or the cursor pass (fold.py) writes it right
after on the same stream. The cursor word's LO_STALE bit (replayssm.state) says a dual
state's low copy is stale: the small-batch route (route.py) leaves it so and the next buffered
step flushes that sequence. In a model whose layers share one cursor tensor the move can run
once per step for all layers (replayssm.mamba2.replay_step(..., advance_cursor=False), then
advance_cursors)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.jit import cast, gdc_release, gdc_wait_prior, prefetch_hint, softplus
from ..common.launch import cache_lines, last_contig, out_like, pdl_meta, state_scratch
from ..state import CURSOR_MASK
from .fold import plan_cursor
from .host import block_l, buffer_strides, check_ckpts, ckpt_args, ckpt_strides, fold_precision, interpreting, np2, \
    record, state_bytes
from .jit import CUR_MASK, LO_STALE_BIT, buffer_weights, finish_y, load_buffer_B, load_state, outer_sum, slot_of, \
    store_ckpts
from .options import Mamba2Options, resolve
from .route import plan_route
from .table import replay_params


@triton.jit
def _take_cursor(cur_ptr, slot, live, K, NPROG, TICKET: tl.constexpr, STALE: tl.constexpr):
    """This program's view of cursor[slot]: (n, stale), (0, False) for a padded row; stale:
    the LO_STALE bit (a dual state's low copy is stale, so the step flushes). STALE: a dual
    state, whose word may carry the bit. Any state's word may carry the deferred route's epoch
    (bits 8-14, state.py), so the count is always masked out of it.

    TICKET: every program of the sequence reads the cursor with one relaxed
    atomic_add(cursor, 1 << 16) (low 16 bits: the cursor word; high bits: programs that have
    read it); the one that draws ticket NPROG - 1 knows all others have read it (the reads are
    the atomics themselves, totally ordered on one address) and stores the advanced cursor
    (n + 1 >= K or stale ? 0 : n + 1), clearing the ticket bits. Otherwise a plain load (a
    _cursor_kernel launch, or the caller's advance_cursors, moves it later)."""
    if TICKET:
        t = tl.atomic_add(cur_ptr + slot, 65536, mask=live, sem="relaxed")
        n = tl.where(live, t & CUR_MASK, 0)
        last = live & ((t >> 16) == NPROG - 1)
    else:
        t = tl.load(cur_ptr + slot, mask=live, other=0)
        n = t & CUR_MASK
    if STALE:
        stale = live & ((t & LO_STALE_BIT) != 0)
        new = tl.where((n + 1 >= K) | stale, 0, n + 1)
    else:
        stale = n < 0       # (always False; non-dual callers do not use it)
        new = tl.where(n + 1 >= K, 0, n + 1)
    if TICKET:
        tl.atomic_xchg(cur_ptr + slot, new, mask=last, sem="relaxed")
    return n, stale


@triton.jit
def _step_scalars(A_ptr, dt_ptr, dtb_ptr, B_ptr, b, h, g, offs_n, mask_n, s_dt_b, s_B_b, s_B_g):
    """The step's per-head raw inputs: (A[h], dt[b, h], dt_bias[h], B[b, g] [BLOCK_N]); h may
    be a vector of heads (then A, dt, dt_bias are vectors)."""
    A = tl.load(A_ptr + h)
    dt_raw = tl.load(dt_ptr + b * s_dt_b + h)
    dtb = tl.load(dtb_ptr + h)
    Bn_raw = tl.load(B_ptr + b * s_B_b + g * s_B_g + offs_n, mask=mask_n, other=0.0)
    return A, dt_raw, dtb, Bn_raw


@triton.jit
def _step_terms(A, dt_raw, dtb, Bn_raw, dt_i, mask_l, bdt_ptr, bB_ptr, EXACT: tl.constexpr):
    """(A, dt_n, w, total, Bn_buf) from _step_scalars' raw A, dt, dt_bias, B and the buffered
    dt_i [BL] (or [BL, heads], with mask_l and A, dt, dt_bias alike per head), fp32 but Bn_buf:
    dt_n = softplus(dt + dt_bias) as the buffer stores it, w and total as buffer_weights (the
    decay up to and including the new entry), Bn_buf = B in the buffer's dtype (the appended row)."""
    A = A.to(tl.float32)
    dt_n = softplus(dt_raw.to(tl.float32) + dtb.to(tl.float32))
    dt_n = dt_n.to(bdt_ptr.dtype.element_ty).to(tl.float32)   # as stored in the buffer
    dt_i = dt_i.to(tl.float32)
    w, total = buffer_weights(dt_i * A, dt_i, mask_l, dt_n * A)
    return A, dt_n, w, total, cast(Bn_raw.to(tl.float32), bB_ptr.dtype.element_ty, EXACT)


@triton.jit
def _buffer_bc_kernel(C_ptr, bB_ptr, bc_ptr, idx_ptr, n_slots, A_ptr, dt_ptr, dtb_ptr, B_ptr, cur_ptr, bdt_ptr,
                      N, NL, HPG,
                      s_C_b, s_C_g, s_bB_s, s_bB_l, s_bB_g, s_dt_b, s_B_b, s_B_g, s_bdt_s, s_bdt_l,
                      BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, HAS_IDX: tl.constexpr, GDC: tl.constexpr = False,
                      COEF: tl.constexpr = False, EXACT: tl.constexpr = False, BLOCK_H: tl.constexpr = 1):
    """bc[b, g, i] = B_i . C for buffer rows i < NL (min(K, L)) of batch row b's slot and group g:
    the output path's per-group products, once per group instead of once per program of the
    step (_replay_step_kernel's PRE_BC). Grid (G, b); bc [b, G, BLOCK_L] float32. Rows past
    the cursor are computed from whatever they hold: the step masks them. A padded row's
    slot is clamped to 0 (its outputs are never used).
    COEF (the step's PRE_COEF): instead, every per-head term of the output path for the group's
    HPG heads h, into bc [b, H, 2 BLOCK_L] float32: [0, BLOCK_L) w_i (B_i . C) for the n =
    cursor buffered rows (0 past them), BLOCK_L the checkpoint's decay `total`, BLOCK_L + 1
    dt_n (B . C) (as _replay_step_kernel computes them); and the step's appends of dt_n (each
    head) and B (the group) at row n, which the step then leaves out. The cursor must not move
    while this runs (no ticket: the cursor pass follows the step). Row n is past the cursor for
    every reader of the step (a flushing sequence's row n is junk after its flush, as rows past
    any cursor are).
    GDC: the step behind it is a programmatic dependent launch, let go at once: its programs
    run their cursor and state loads beside this kernel and wait for it (gdc_wait_prior)
    only before reading bc. This launch itself is an ordinary one, so everything ahead of it
    in the stream (the writes the step reads) has finished before either starts; the step's
    own appends may land in rows this kernel reads, rows past the cursor that it masks."""
    gdc_release(GDC)
    g = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot, live = slot_of(idx_ptr, b, n_slots, HAS_IDX)
    offs_n = tl.arange(0, BLOCK_N)
    offs_l = tl.arange(0, BLOCK_L)
    in_n = offs_n < N
    if COEF:    # every load ahead of what depends on the cursor (the buffered dt: all NL rows, masked after)
        word = tl.load(cur_ptr + slot)
        offs_h = tl.arange(0, BLOCK_H)
        in_h = offs_h < HPG
        hh = g * HPG + tl.minimum(offs_h, HPG - 1)      # (padding lanes repeat the last head, unstored)
        dt_all = tl.load(bdt_ptr + slot * s_bdt_s + offs_l[:, None] * s_bdt_l + hh[None, :],
                         mask=(offs_l < NL)[:, None], other=0.0)
        A, dt_raw, dtb, Bn_raw = _step_scalars(A_ptr, dt_ptr, dtb_ptr, B_ptr, b, hh, g, offs_n, in_n, s_dt_b,
                                               s_B_b, s_B_g)
    Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=in_n, other=0.0).to(tl.float32)
    Bb = tl.load(bB_ptr + slot * s_bB_s + g * s_bB_g + offs_l[:, None] * s_bB_l + offs_n[None, :],
                 mask=(offs_l < NL)[:, None] & in_n[None, :], other=0.0).to(tl.float32)
    bc = tl.sum(Bb * Cv[None, :], axis=1)
    if COEF:
        n = word & CUR_MASK
        mask_l = (offs_l < n) & live
        m2 = mask_l[:, None] & in_h[None, :]
        dt_i = tl.where(m2, dt_all, 0.0)    # rows past the cursor may hold anything (even NaN)
        A, dt_n, w, total, Bn_buf = _step_terms(A, dt_raw, dtb, Bn_raw, dt_i, m2, bdt_ptr, bB_ptr, EXACT)
        cf = bc_ptr + (b * tl.num_programs(0) * HPG + hh) * (2 * BLOCK_L)     # [BLOCK_H] head rows
        tl.store(cf[None, :] + offs_l[:, None], tl.where(m2, w * bc[:, None], 0.0), mask=in_h[None, :])
        tl.store(cf + BLOCK_L, total, mask=in_h)
        tl.store(cf + BLOCK_L + 1, dt_n * tl.sum(Bn_buf.to(tl.float32) * Cv, axis=0), mask=in_h)
        tl.store(bdt_ptr + slot * s_bdt_s + n * s_bdt_l + hh, dt_n, mask=in_h & live)
        tl.store(bB_ptr + slot * s_bB_s + g * s_bB_g + n * s_bB_l + offs_n, Bn_buf, mask=in_n & live)
    else:
        tl.store(bc_ptr + (b * tl.num_programs(0) + g) * BLOCK_L + offs_l, bc)


@triton.jit
def _replay_step_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr, idx_ptr, n_slots,
    cur_ptr, bx_ptr, bB_ptr, bdt_ptr, bc_ptr,
    rd_ptr, rd_sc_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    K, P, N, HPG, NPROG,
    s_x_b, s_x_h, s_dt_b, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_y_b, s_y_h,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, RD_SCALE: tl.constexpr, HI_SCALE: tl.constexpr,
    HAS_LO: tl.constexpr, LO_SCALE: tl.constexpr, USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr,
    EXACT: tl.constexpr, FUSED: tl.constexpr, TICKET: tl.constexpr, EARLY: tl.constexpr, EVICT: tl.constexpr,
    FOLD_ROWS: tl.constexpr, PRELOAD: tl.constexpr, FOLD_COLS: tl.constexpr,
    PF: tl.constexpr = 0, RD_LPR: tl.constexpr = 1, RD_LS: tl.constexpr = 32, PRE_BC: tl.constexpr = False,
    GDC: tl.constexpr = False, PRE_COEF: tl.constexpr = False, FOLD_WAIT: tl.constexpr = True,
):
    """One ReplaySSM step for BLOCK_P rows of head h of batch row b (see module docstring).

    n = cursor[slot] entries are buffered; the new entry (x, B, dt) is entry n.
    Output-only route: y = exp(c) (S_rd C) + sum_i w_i (B_i.C) x_i + dt (B.C) x from the read
    checkpoint tile and buffer rows 0..n-1; append the entry at row n (x: every program its
    rows; dt: row tile 0; B: row tile 0 of the group's first head).
    FUSED and n + 1 >= K (flush route): fold entries 0..n into the high tile, y = S_new C,
    write the high tile (and the low copy in dual mode); nothing is appended. Dual states
    also flush where the cursor word says the low copy is stale (LO_STALE; then n = 0).
    Not FUSED: every sequence takes the output-only route (flushing ones append row n too)
    and _replay_flush_kernel, launched next, folds and overwrites their y.
    PRE_BC: the output-only route reads B_i . C from bc_ptr [b, G, BLOCK_L] (float32, written
    by _buffer_bc_kernel just before) instead of computing it from the group's buffered B tile
    in every program (as many products as the state tile's own; the flush route still loads it);
    GDC: launched as that kernel's programmatic dependent (see _buffer_bc_kernel).
    PRE_COEF: the output-only route reads all its per-head terms (w_i (B_i . C), the decay
    `total`, dt_n (B . C)) from bc_ptr [b, H, 2 BLOCK_L] (_buffer_bc_kernel's COEF), which also
    made the dt and B appends; only the flush route loads A, dt, dt_bias, B and the buffered dt
    (a program's own work is then its tile, the cursor, x and its appended x row).
    FOLD_WAIT (with PRE_BC and GDC): the flush route waits for that kernel too, at its end, so
    every program of the step waits for it and the step cannot finish before it, even when
    every sequence flushes (then no program takes the output route).
    Rows 0..n-1 are only read and row n only written, so programs of one sequence never race.
    """
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // HPG
    slot, live = slot_of(idx_ptr, b, n_slots, HAS_IDX)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    in_p = offs_p < P
    mask_p = in_p & live
    offs_n = tl.arange(0, BLOCK_N)
    in_n = offs_n < N
    mask_n = in_n & live
    mask = mask_p[:, None] & mask_n[None, :]
    ck_base = slot * s_ck_s + h * s_ck_h
    sc_base = slot * s_sc_s + h * s_sc_h
    bx_base = slot * s_bx_s + h * s_bx_h
    bB_base = slot * s_bB_s + g * s_bB_g
    z_row = z_ptr + b * s_z_b + h * s_z_h
    y_row = y_ptr + b * s_y_b + h * s_y_h
    offs_l = tl.arange(0, BLOCK_L)
    # Loads first, grouped by what their addresses depend on, compute after (a warp stalls
    # at the first use of a pending load, not at the load): 1. what does not depend on the
    # cursor, the read-checkpoint tile above all (EARLY: it streams while the cursor and the
    # buffer tiles are fetched; the relaxed ticket does not order it); 2. the cursor; 3. the
    # buffer tiles it masks (PRELOAD; else inside the branch that uses them).
    if EARLY:
        S = load_state(rd_ptr, rd_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, RD_SCALE, EVICT)
    elif PF > 0:    # the tile's lines on their way (RD_LPR lines of RD_LS elements per row), no registers
        prefetch_hint(rd_ptr, ck_base + tl.minimum(offs_p, P - 1) * s_ck_p, RD_LPR, RD_LS, PF, EXACT)
    Dh = tl.load(D_ptr + h)
    if not PRE_COEF:
        A, dt_raw, dtb, Bn_raw = _step_scalars(A_ptr, dt_ptr, dtb_ptr, B_ptr, b, h, g, offs_n, mask_n, s_dt_b,
                                               s_B_b, s_B_g)
    Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=mask_n, other=0.0)
    x_raw = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_p, mask=mask_p, other=0.0)
    n, stale = _take_cursor(cur_ptr, slot, live, K, NPROG, TICKET, HAS_LO)
    mask_l = (offs_l < n) & live
    if not PRE_COEF:
        dt_i = tl.load(bdt_ptr + slot * s_bdt_s + offs_l * s_bdt_l + h, mask=mask_l, other=0.0)
    if PRELOAD:
        if not PRE_COEF:
            Bb = tl.load(bB_ptr + bB_base + offs_l[:, None] * s_bB_l + offs_n[None, :],
                         mask=mask_l[:, None] & in_n[None, :], other=0.0)
        Xb = tl.load(bx_ptr + bx_base + offs_l[:, None] * s_bx_l + offs_p[None, :],
                     mask=mask_l[:, None] & mask_p[None, :], other=0.0)
    Dh = Dh.to(tl.float32)
    if not PRE_COEF:    # buffered entries 0..n-1: per-head decay weights (shared by all rows)
        A, dt_n, w, total, Bn_buf = _step_terms(A, dt_raw, dtb, Bn_raw, dt_i, mask_l, bdt_ptr, bB_ptr, EXACT)
        Bn = Bn_buf.to(tl.float32)   # as stored in the buffer
    Cv = Cv.to(tl.float32)
    x_buf = cast(x_raw.to(tl.float32), bx_ptr.dtype.element_ty, EXACT)   # entry n as stored
    if FUSED:
        do_fold = n + 1 >= K
        if HAS_LO:  # a stale low copy (LO_STALE) is not read: the step flushes, refreshing it
            do_fold = do_fold | stale
    else:
        do_fold = False
    # One branch per program (the decision is per sequence). Without PRELOAD each branch
    # loads the buffer tiles itself (fewer registers live across the cursor wait).
    if do_fold:
        if PRE_COEF:    # the per-head terms the output path takes from the pre-pass
            A, dt_raw, dtb, Bn_raw = _step_scalars(A_ptr, dt_ptr, dtb_ptr, B_ptr, b, h, g, offs_n, mask_n, s_dt_b,
                                                   s_B_b, s_B_g)
            dt_i = tl.load(bdt_ptr + slot * s_bdt_s + offs_l * s_bdt_l + h, mask=mask_l, other=0.0)
            A, dt_n, w, total, Bn_buf = _step_terms(A, dt_raw, dtb, Bn_raw, dt_i, mask_l, bdt_ptr, bB_ptr, EXACT)
            Bn = Bn_buf.to(tl.float32)
        if FOLD_ROWS == BLOCK_P and FOLD_COLS == BLOCK_N:    # the whole tile in one fold
            if PRELOAD and not PRE_COEF:
                Bbf = Bb.to(tl.float32)
                Xbf = Xb.to(tl.float32)
            else:
                Bbf = load_buffer_B(bB_ptr, bB_base, s_bB_l, offs_l, offs_n, mask_l, in_n)
                Xbf = tl.load(bx_ptr + bx_base + offs_l[:, None] * s_bx_l + offs_p[None, :],
                              mask=mask_l[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
            if HAS_LO:      # the read tile is the low copy: fold the high one
                Sh = load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE,
                                 EVICT)
            elif EARLY:     # the read tile is the high checkpoint itself
                Sh = S
            else:
                Sh = load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE,
                                 EVICT)
            Sh = total * Sh + outer_sum(Xbf * w[:, None], Bbf, USE_DOT, DOT_PREC, EXACT) \
                + (dt_n * x_buf.to(tl.float32))[:, None] * Bn[None, :]
            store_ckpts(hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, ck_base, sc_base, s_ck_p, offs_p, offs_n, mask, mask_p,
                         Sh, HI_SCALE, HAS_LO, LO_SCALE, EXACT, EVICT)
            finish_y(tl.sum(Sh * Cv[None, :], axis=1), x_raw.to(tl.float32), Dh, z_row, y_row, offs_p, mask_p, in_p,
                      HAS_Z, EXACT)
        else:
            # [FOLD_ROWS, FOLD_COLS] chunks, each re-reading its high rows (an L2 hit when they
            # are the tile just read; the read tile S is dead here): the fold's MMA operands and
            # accumulator cost a chunk's registers, not the program's tile's, so the flush path
            # (1 program in K) does not lower the occupancy of the output path. Row-scaled
            # copies come with FOLD_COLS == BLOCK_N (the planner): a scale needs the whole row.
            if FOLD_COLS == BLOCK_N:    # whole rows: the buffered B tile once, for every chunk
                if PRELOAD and not PRE_COEF:
                    Bbf = Bb.to(tl.float32)
                else:
                    Bbf = load_buffer_B(bB_ptr, bB_base, s_bB_l, offs_l, offs_n, mask_l, in_n)
            for c in tl.range(0, BLOCK_P // FOLD_ROWS, num_stages=1, loop_unroll_factor=1):
                offs_q = pid_p * BLOCK_P + c * FOLD_ROWS + tl.arange(0, FOLD_ROWS)
                in_q = offs_q < P
                mask_q = in_q & live
                xw = tl.load(bx_ptr + bx_base + offs_l[:, None] * s_bx_l + offs_q[None, :],
                             mask=mask_l[:, None] & mask_q[None, :], other=0.0).to(tl.float32) * w[:, None]
                xq = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_q, mask=mask_q, other=0.0).to(tl.float32)
                xqn = dt_n * cast(xq, bx_ptr.dtype.element_ty, EXACT).to(tl.float32)
                yq = tl.zeros([FOLD_ROWS], tl.float32)
                for j in tl.range(0, BLOCK_N // FOLD_COLS, num_stages=1, loop_unroll_factor=1):
                    offs_m = j * FOLD_COLS + tl.arange(0, FOLD_COLS)
                    in_m = offs_m < N
                    mask2 = mask_q[:, None] & (in_m & live)[None, :]
                    Sq = load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_q, offs_m, s_ck_p, mask2, mask_q,
                                     HI_SCALE, "")
                    if FOLD_COLS == BLOCK_N:
                        Bc, Bm, Cm = Bbf, Bn, Cv
                    else:
                        Bc = load_buffer_B(bB_ptr, bB_base, s_bB_l, offs_l, offs_m, mask_l, in_m)
                        Bm = tl.load(B_ptr + b * s_B_b + g * s_B_g + offs_m, mask=in_m & live, other=0.0)
                        Bm = cast(Bm.to(tl.float32), bB_ptr.dtype.element_ty, EXACT).to(tl.float32)   # as buffered
                        Cm = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_m, mask=in_m & live, other=0.0)
                        Cm = Cm.to(tl.float32)
                    Sq = total * Sq + outer_sum(xw, Bc, USE_DOT, DOT_PREC, EXACT) + xqn[:, None] * Bm[None, :]
                    store_ckpts(hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, ck_base, sc_base, s_ck_p, offs_q, offs_m, mask2,
                                 mask_q, Sq, HI_SCALE, HAS_LO, LO_SCALE, EXACT, EVICT)
                    yq += tl.sum(Sq * Cm[None, :], axis=1)
                finish_y(yq, xq, Dh, z_row, y_row, offs_q, mask_q, in_q, HAS_Z, EXACT)
        if PRE_BC and FOLD_WAIT:
            # The flush route reads nothing the pre-pass writes, but without this wait a step
            # whose sequences all flush (lockstep cursors, every K-th step) would have no program
            # waiting for the pre-pass, and only the stream's order around a programmatic pair
            # would keep the launches after this one (the cursor pass, the next step's pre-pass
            # into the same scratch) from overlapping it. Here it is done long before.
            gdc_wait_prior(GDC)
    else:
        if PRE_COEF:    # zero past the cursor (the pre-pass masked them)
            gdc_wait_prior(GDC)     # _buffer_bc_kernel's terms written and visible
            cf = bc_ptr + (b * tl.num_programs(1) + h) * (2 * BLOCK_L)
            coef = tl.load(cf + offs_l)                     # [BL] w_i (B_i . C)
            total = tl.load(cf + BLOCK_L)
            coef_n = tl.load(cf + BLOCK_L + 1)
        elif PRE_BC:  # rows past the cursor may hold anything (even NaN): masked below, not weighted
            gdc_wait_prior(GDC)     # _buffer_bc_kernel's products written and visible
            bc = tl.load(bc_ptr + (b * (tl.num_programs(1) // HPG) + g) * BLOCK_L + offs_l, mask=mask_l, other=0.0)
        elif PRELOAD:
            Bbf = Bb.to(tl.float32)
        else:
            Bbf = load_buffer_B(bB_ptr, bB_base, s_bB_l, offs_l, offs_n, mask_l, in_n)
        if PRELOAD:
            Xbf = Xb.to(tl.float32)
        else:
            Xbf = tl.load(bx_ptr + bx_base + offs_l[:, None] * s_bx_l + offs_p[None, :],
                          mask=mask_l[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
        if not PRE_COEF:    # (else loaded above)
            if PRE_BC:
                coef = tl.where(mask_l, w * bc, 0.0)                # [BL] w_i (B_i . C)
            else:
                coef = w * tl.sum(Bbf * Cv[None, :], axis=1)       # [BL] w_i (B_i . C)
            coef_n = dt_n * tl.sum(Bn * Cv, axis=0)
        if not EARLY:
            S = load_state(rd_ptr, rd_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, RD_SCALE,
                            EVICT)
        yv = total * tl.sum(S * Cv[None, :], axis=1) + tl.sum(Xbf * coef[:, None], axis=0) \
            + coef_n * x_buf.to(tl.float32)
        tl.store(bx_ptr + bx_base + n * s_bx_l + offs_p, x_buf, mask=mask_p)
        finish_y(yv, x_raw.to(tl.float32), Dh, z_row, y_row, offs_p, mask_p, in_p, HAS_Z, EXACT)
        if not PRE_COEF:    # (else the pre-pass appended them)
            append = live & (pid_p == 0)
            tl.store(bdt_ptr + slot * s_bdt_s + n * s_bdt_l + h, dt_n, mask=append)
            tl.store(bB_ptr + bB_base + n * s_bB_l + offs_n, Bn_buf, mask=mask_n & append
                     & tl.where(h % HPG == 0, True, False))   # i1 scalar (common/jit.py)


@triton.jit
def _replay_flush_kernel(
    x_ptr, A_ptr, C_ptr, D_ptr, z_ptr, y_ptr, idx_ptr, n_slots, cur_ptr, bx_ptr, bB_ptr, bdt_ptr,
    hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    K, P, N, HPG,
    s_x_b, s_x_h, s_C_b, s_C_g, s_z_b, s_z_h, s_y_b, s_y_h,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr,
    LO_SCALE: tl.constexpr, USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr, EXACT: tl.constexpr,
    ADVANCED: tl.constexpr, EVICT: tl.constexpr, FOLD_ROWS: tl.constexpr,
):
    """Second launch of the split route, after _replay_step_kernel (FUSED False), same grid.
    A program whose sequence flushes this step folds the buffered entries 0..K-1 (the step
    kernel appended entry K-1) into its rows of the high checkpoint, writes them (and the low
    copy), and overwrites y with S_new C (+ D x, * silu z), as the fused route computes it.
    Every other program returns after one cursor load. ADVANCED: the step kernel already
    moved the cursor (ticket), so a flushing sequence is one whose cursor is now 0 (not for
    dual states, plan_replay); otherwise (cursor moved later) one with cursor + 1 >= K
    or a stale low copy (LO_STALE)."""
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    slot, live = slot_of(idx_ptr, b, n_slots, HAS_IDX)
    word = tl.load(cur_ptr + slot, mask=live, other=1)
    n = word & CUR_MASK     # (LO_STALE, the deferred route's epoch)
    if ADVANCED:
        do = live & (n == 0)
        nf = K
    elif HAS_LO:
        do = live & ((n + 1 >= K) | ((word & LO_STALE_BIT) != 0))
        nf = n + 1
    else:
        do = live & (n + 1 >= K)
        nf = n + 1
    if do:
        g = h // HPG
        A = tl.load(A_ptr + h).to(tl.float32)
        offs_l = tl.arange(0, BLOCK_L)
        mask_l = offs_l < nf
        dt_i = tl.load(bdt_ptr + slot * s_bdt_s + offs_l * s_bdt_l + h, mask=mask_l, other=0.0).to(tl.float32)
        w, total = buffer_weights(dt_i * A, dt_i, mask_l, 0.0)
        offs_n = tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        Bb = load_buffer_B(bB_ptr, slot * s_bB_s + g * s_bB_g, s_bB_l, offs_l, offs_n, mask_l, mask_n)
        Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        Dh = tl.load(D_ptr + h).to(tl.float32)
        ck_base = slot * s_ck_s + h * s_ck_h
        sc_base = slot * s_sc_s + h * s_sc_h
        for c in tl.range(0, BLOCK_P // FOLD_ROWS, num_stages=1, loop_unroll_factor=1):
            offs_p = pid_p * BLOCK_P + c * FOLD_ROWS + tl.arange(0, FOLD_ROWS)
            mask_p = offs_p < P
            mask = mask_p[:, None] & mask_n[None, :]
            Xb = tl.load(bx_ptr + slot * s_bx_s + h * s_bx_h + offs_l[:, None] * s_bx_l + offs_p[None, :],
                         mask=mask_l[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
            S = load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE,
                            EVICT)
            S = total * S + outer_sum(Xb * w[:, None], Bb, USE_DOT, DOT_PREC, EXACT)
            store_ckpts(hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, ck_base, sc_base, s_ck_p, offs_p, offs_n, mask,
                         mask_p, S, HI_SCALE, HAS_LO, LO_SCALE, EXACT, EVICT)
            xv = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_p, mask=mask_p, other=0.0).to(tl.float32)
            finish_y(tl.sum(S * Cv[None, :], axis=1), xv, Dh, z_ptr + b * s_z_b + h * s_z_h,
                      y_ptr + b * s_y_b + h * s_y_h, offs_p, mask_p, mask_p, HAS_Z, EXACT)


def step_params(rs, x, options: Mamba2Options | None = None) -> dict:
    """The table's launch choice (table.replay_params) for a step of `rs` with inputs x [b, H, P]."""
    return replay_params(head_dim=x.shape[2], read_bytes=state_bytes(rs.read_ckpt), batch=x.shape[0],
                         heads=x.shape[1], dual=rs.mode == "dual", hi_bytes=state_bytes(rs.hi),
                         options=resolve(options))


def plan_replay(rs, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, advance=True, out=None,
                options: Mamba2Options | None = None):
    """([launches], y) of one ReplaySSM step. Route "eager" (an advancing step): the
    small-batch route (route.plan_route). Fused: the step kernel (advancing the cursor by ticket
    when `advance`); split: the output-only step kernel + the flush kernel. With the ticket off
    the cursor pass follows when `advance`."""
    options = resolve(options)
    x, dt, B, C, z, A, D, dt_bias = (last_contig(t) for t in (x, dt, B, C, z, A, D, dt_bias))
    bsz, H, P = x.shape
    N, G = B.shape[-1], B.shape[1]
    L = rs.capacity
    y = out_like(out, x)
    if bsz == 0:
        return [], y
    check_ckpts(rs.hi, rs.lo)
    rd = rs.read_ckpt
    v = step_params(rs, x, options)
    if v["route"] == "eager" and advance:
        return [plan_route(rs, x, dt, A, B, C, D, dt_bias, z, state_indices, y, v)], y
    block_p, warps, fused = v["block_p"], v["warps"], v["route"] == "fused"
    if fold_precision(rs, options) != "bf16x3" and "warps" not in options.overrides_for("replay"):
        warps = max(warps, 2)   # fp32 buffers: the tf32x3 fold's operands spill at 1 warp (untuned path)
    ticket = advance and v["ticket"]
    block_n = np2(N)
    # fold column chunk: whole rows unless fold_cols is set and no copy carries row scales
    fold_cols = block_n
    if v["fold_cols"] and not any(ck is not None and ck.scale is not None for ck in (rs.hi, rs.lo)):
        fold_cols = min(v["fold_cols"], block_n)
    bl, use_dot = block_l(min(rs.flush_period, L), v["fold_rows"], fold_cols)   # a step sees n <= K - 1
    grid = (triton.cdiv(P, block_p), H, bsz)
    nprog = grid[0] * H
    if ticket and (nprog >= 1 << 15 or L > CURSOR_MASK):
        raise ValueError(f"ticket cursor needs < 32768 programs per sequence ({nprog}) and L < 32768 ({L})")
    if ticket and not fused and rs.mode == "dual":
        raise ValueError("replay route 'split' with the ticket cannot serve a dual state (its flush launch could "
                         "not tell a stale low copy's flush from a full buffer's); allowed: route 'fused', or ticket "
                         "False")
    rd_d, rd_s, rd_has = ckpt_args(rd, rs.hi.data)
    rd_lpr, rd_ls = cache_lines(rd_d, N)      # the read tile's rows, for the pf hint
    hi_d, hi_s, hi_has = ckpt_args(rs.hi, rs.hi.data)
    lo_d, lo_s, lo_has = ckpt_args(rs.lo, rs.hi.data)
    zz = z if z is not None else x
    idx = state_indices if state_indices is not None else x
    launches = []
    bc, pdl = x, {}     # (bc unread without the pre-pass)
    coef = v["coef"] and not ticket     # (the pre-pass reads the cursor: a ticket step moves it beside it)
    if v["bc"] or coef:     # B_i . C once per group (the step's PRE_BC; coef: every per-head term, PRE_COEF)
        numel = bsz * (H * 2 if coef else G) * bl
        bc = state_scratch(rs, "_bc_scratch", numel, x.device).view(torch.float32)
        pdl = pdl_meta(x.device, v["pdl"])
        launches.append(record(_buffer_bc_kernel, (G, bsz), v["row"])(
            C, rs.B, bc, idx, rs.cursor.shape[0], A, dt, dt_bias, B, rs.cursor, rs.dt, N, min(rs.flush_period, L),
            H // G,
            C.stride(0), C.stride(1), rs.B.stride(0), rs.B.stride(1), rs.B.stride(2),
            dt.stride(0), B.stride(0), B.stride(1), rs.dt.stride(0), rs.dt.stride(1),
            BLOCK_N=block_n, BLOCK_L=bl, HAS_IDX=state_indices is not None, GDC=pdl["GDC"], COEF=coef,
            EXACT=interpreting(), BLOCK_H=np2(H // G), num_warps=1))
    common = dict(BLOCK_P=block_p, BLOCK_N=block_n, BLOCK_L=bl, HAS_Z=z is not None,
                  HAS_IDX=state_indices is not None, HI_SCALE=hi_has, HAS_LO=rs.lo is not None, LO_SCALE=lo_has,
                  USE_DOT=use_dot, DOT_PREC=fold_precision(rs, options), EXACT=interpreting(), EVICT=v["evict"],
                  FOLD_ROWS=v["fold_rows"], num_warps=warps)
    if v["maxnreg"]:
        common["maxnreg"] = v["maxnreg"]
    launches.append(record(_replay_step_kernel, grid, v["row"])(
        x, dt, A, B, C, D, dt_bias, zz, y, idx, rs.cursor.shape[0],
        rs.cursor, rs.x, rs.B, rs.dt, bc,
        rd_d, rd_s, hi_d, hi_s, lo_d, lo_s,
        rs.flush_period, P, N, H // G, nprog,
        x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        zz.stride(0), zz.stride(1), y.stride(0), y.stride(1),
        *buffer_strides(rs), *ckpt_strides(rs),
        RD_SCALE=rd_has, FUSED=fused, TICKET=ticket, EARLY=v["early"], PRELOAD=v["preload"], FOLD_COLS=fold_cols,
        PF=v["pf"], RD_LPR=rd_lpr, RD_LS=rd_ls, PRE_BC=v["bc"] or coef, PRE_COEF=coef, FOLD_WAIT=v["fold_wait"],
        **pdl, **common))
    if not fused:
        launches.append(record(_replay_flush_kernel, grid, v["row"])(
            x, A, C, D, zz, y, idx, rs.cursor.shape[0], rs.cursor, rs.x, rs.B, rs.dt,
            hi_d, hi_s, lo_d, lo_s,
            rs.flush_period, P, N, H // G,
            x.stride(0), x.stride(1), C.stride(0), C.stride(1), zz.stride(0), zz.stride(1), y.stride(0), y.stride(1),
            *buffer_strides(rs), *ckpt_strides(rs),
            ADVANCED=ticket, **common))
    if advance and not ticket:
        launches += plan_cursor(rs, state_indices, bsz, 0, options=options)
    return launches, y
