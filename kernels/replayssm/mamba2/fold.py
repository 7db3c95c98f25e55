"""Mamba-2 fold (flush and commit), the cursor pass, and the low copy's refresh.

A fold writes a sequence's committed buffer entries into its checkpoint: S <- total S +
sum_i w_i x_i B_i^T (decay weights from the buffered dt), then the low copy (dual states).
Flush folds every sequence with entries (threshold 1); a commit moves the cursors by the
accepted drafts and folds the sequences that reach K. The cursor pass moves cursors when the
kernels before it did not (see replay.py)."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..common.jit import clear_lo_stale_kernel, gdc_release, gdc_wait_prior, list_commit_rows
from ..common.launch import Launch, last_contig, pdl_meta, state_scratch
from .host import block_l, buffer_strides, check_ckpts, ckpt_args, ckpt_strides, fold_precision, interpreting, np2, \
    record, state_bytes
from .jit import CUR_MASK, LO_STALE_BIT, buffer_weights, fold_chunk, load_buffer_B, load_state, slot_of, \
    store_ckpts, store_state
from .options import Mamba2Options, resolve
from .table import tile_params


@triton.jit
def _fold_kernel(
    idx_ptr, n_slots, acc_ptr, cur_ptr, bx_ptr, bB_ptr, bdt_ptr, A_ptr,
    hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    THRESH, P, N, L, HPG,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    BLOCK_P: tl.constexpr, ROW_CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    HAS_ACC: tl.constexpr, HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr, LO_SCALE: tl.constexpr,
    USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr, EXACT: tl.constexpr,
    LIST: tl.constexpr = False, ROWS=0, NW=1, NT: tl.constexpr = 1, GDC: tl.constexpr = False,
):
    """Fold buffer entries 0..n-1 into the high checkpoint tile and write it (and the low
    copy in dual mode), where n = cursor[slot] (+ accepted[row] for a commit) and only if
    n >= THRESH (flush: 1, commit: K), or, for a flush of a dual state, where the low copy is
    stale (LO_STALE, n = 0: no entries folded, both copies written; a commit follows a verify,
    which has refreshed it). Row r of the grid addresses slot idx[r] (< 0: skip).
    LIST (a commit after _commit_list_kernel, which has moved the cursors): grid dim 2 is NW
    workers; acc_ptr holds the folding rows as (r << 16) | n at ranks 0.., their count at
    [ROWS]; worker w folds the ranks w, w + NW, ... < the count (NT = cdiv(ROWS, NW) slots;
    no program per batch row that only finds nothing to do). GDC: launched as a programmatic
    dependent (of the list launch), it waits for the kernel ahead of it before any load, then
    lets a programmatic dependent behind it start early (the next layer's commit, in a model)."""
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    if LIST:
        w = tl.program_id(2)
        mine = (tl.load(acc_ptr + ROWS) - w + NW - 1) // NW
        for t in range(NT):       # (a loop bound loaded from memory: not under the interpreter)
            if t < mine:
                key = tl.load(acc_ptr + w + t * NW)
                slot = tl.load(idx_ptr + (key >> 16)).to(tl.int64)
                _fold_head(slot, key & 0xFFFF, pid_p, h, bx_ptr, bB_ptr, bdt_ptr, A_ptr, hi_ptr, hi_sc_ptr, lo_ptr,
                           lo_sc_ptr, P, N, L, HPG, s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
                           s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h, BLOCK_P, ROW_CHUNKS, BLOCK_N, BLOCK_L, HI_SCALE,
                           HAS_LO, LO_SCALE, USE_DOT, DOT_PREC, EXACT)
    else:
        r = tl.program_id(2).to(tl.int64)
        slot = tl.load(idx_ptr + r).to(tl.int64)
        live = (slot >= 0) & (slot < n_slots)     # else a no-op row (padding, or past the pool)
        slot = tl.where(live, slot, 0)
        word = tl.load(cur_ptr + slot, mask=live, other=0)
        n = word & CUR_MASK     # (LO_STALE, the deferred route's epoch)
        if HAS_ACC:
            n = n + tl.minimum(tl.maximum(tl.load(acc_ptr + r, mask=live, other=0).to(tl.int32), 0), L - THRESH)
            do = n >= THRESH
        elif HAS_LO:
            do = (n >= THRESH) | ((word & LO_STALE_BIT) != 0)
        else:
            do = n >= THRESH
        if live & do:
            _fold_head(slot, n, pid_p, h, bx_ptr, bB_ptr, bdt_ptr, A_ptr, hi_ptr, hi_sc_ptr, lo_ptr,
                       lo_sc_ptr, P, N, L, HPG, s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
                       s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h, BLOCK_P, ROW_CHUNKS, BLOCK_N, BLOCK_L, HI_SCALE,
                       HAS_LO, LO_SCALE, USE_DOT, DOT_PREC, EXACT)


# noinline: inlined into the LIST rank loop, ptxas took 255 registers and spilled 64-96 bytes
# (Nano dims, sm_90); as a call 152-170 and none, as in the per-row kernel
@triton.jit(noinline=True)
def _fold_head(slot, n, pid_p, h, bx_ptr, bB_ptr, bdt_ptr, A_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
               P, N, L, HPG, s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
               s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
               BLOCK_P: tl.constexpr, ROW_CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
               HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr, LO_SCALE: tl.constexpr, USE_DOT: tl.constexpr,
               DOT_PREC: tl.constexpr, EXACT: tl.constexpr):
    """_fold_kernel's fold of entries 0..n-1 of slot's head h, rows of program pid_p."""
    g = h // HPG
    A = tl.load(A_ptr + h).to(tl.float32)
    offs_l = tl.arange(0, BLOCK_L)
    mask_l = (offs_l < n) & (offs_l < L)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    dt_i = tl.load(bdt_ptr + slot * s_bdt_s + offs_l * s_bdt_l + h, mask=mask_l, other=0.0).to(tl.float32)
    w, total = buffer_weights(dt_i * A, dt_i, mask_l, 0.0)
    Bb = load_buffer_B(bB_ptr, slot * s_bB_s + g * s_bB_g, s_bB_l, offs_l, offs_n, mask_l, mask_n)
    ck_base = slot * s_ck_s + h * s_ck_h
    sc_base = slot * s_sc_s + h * s_sc_h
    bx_base = slot * s_bx_s + h * s_bx_h
    for c in tl.static_range(ROW_CHUNKS):
        offs_p = (pid_p * ROW_CHUNKS + c) * BLOCK_P + tl.arange(0, BLOCK_P)
        mask_p = offs_p < P
        mask = mask_p[:, None] & mask_n[None, :]
        S = fold_chunk(hi_ptr, hi_sc_ptr, ck_base, sc_base, s_ck_p, bx_ptr + bx_base, s_bx_l, offs_l, mask_l,
                        w, total, Bb, offs_p, offs_n, mask_p, mask, HI_SCALE, USE_DOT, DOT_PREC, EXACT)
        store_ckpts(hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, ck_base, sc_base, s_ck_p, offs_p, offs_n, mask, mask_p,
                     S, HI_SCALE, HAS_LO, LO_SCALE, EXACT, "")


@triton.jit
def _commit_list_kernel(idx_ptr, n_slots, acc_ptr, cur_ptr, lst_ptr, rows, K, max_add, BLOCK_B: tl.constexpr,
                        GDC: tl.constexpr = False):
    """First launch of a LIST commit, one program: m = cursor + accepted[r] per live row; the
    cursor becomes 0 where m >= K (the row folds entries 0..m-1) else m; the folding rows are
    listed as lst[rank] = (r << 16) | m (m <= L < 2^16, r < 2^15), their count at lst[rows]
    (common.list_commit_rows).
    GDC (a programmatic dependent launch): waits for the kernel ahead of it, then lets the
    fold behind it launch."""
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    list_commit_rows(idx_ptr, n_slots, acc_ptr, cur_ptr, lst_ptr, rows, K, max_add, BLOCK_B, False)


@triton.jit
def _refresh_lo_kernel(idx_ptr, n_slots, cur_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, P, N,
                       s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
                       BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_IDX: tl.constexpr,
                       HI_SCALE: tl.constexpr, LO_SCALE: tl.constexpr, EXACT: tl.constexpr):
    """Before a verify of a dual state that has taken the eager route: where the cursor word
    says the low copy is stale (LO_STALE), copy BLOCK_P rows of head h of the high checkpoint
    into it (quantising). Grid (cdiv(P, BLOCK_P), H, batch). The bit is cleared by the launch
    after (common.clear_lo_stale_kernel; no program here may, as another may not have read it
    yet), so the verify reads plain counts."""
    h = tl.program_id(1)
    slot, live = slot_of(idx_ptr, tl.program_id(2).to(tl.int64), n_slots, HAS_IDX)
    stale = live & ((tl.load(cur_ptr + slot, mask=live, other=0) & LO_STALE_BIT) != 0)
    if stale:
        offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        offs_n = tl.arange(0, BLOCK_N)
        mask_p = offs_p < P
        mask = mask_p[:, None] & (offs_n < N)[None, :]
        ck_base = slot * s_ck_s + h * s_ck_h
        sc_base = slot * s_sc_s + h * s_sc_h
        S = load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE, "")
        store_state(lo_ptr, lo_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, S, LO_SCALE, EXACT, "")


@triton.jit
def _cursor_kernel(cur_ptr, idx_ptr, n_slots, acc_ptr, rows, K, max_add,
                   MODE: tl.constexpr, HAS_IDX: tl.constexpr, BLOCK: tl.constexpr, STALE: tl.constexpr = True):
    """New cursors after a launch of the kernels above (which only read them).
    MODE 0 (step):   n + 1 >= K or stale ? 0 : n + 1   (stale: LO_STALE, the step flushed)
    MODE 1 (commit): n + accepted >= K ? 0 : n + accepted
    MODE 2 (flush):  0
    STALE: the state is dual (its words may carry LO_STALE). Counts are masked out of the
    words (the deferred route's epoch)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < rows
    if HAS_IDX:
        slot = tl.load(idx_ptr + offs, mask=m, other=-1).to(tl.int64)
    else:
        slot = offs.to(tl.int64)
    live = m & (slot >= 0) & (slot < n_slots)
    slot = tl.where(live, slot, 0)
    word = tl.load(cur_ptr + slot, mask=live, other=0)
    n = word & CUR_MASK
    if MODE == 0:
        n = n + 1
        if STALE:
            new = tl.where((n >= K) | ((word & LO_STALE_BIT) != 0), 0, n)
        else:
            new = tl.where(n >= K, 0, n)
    elif MODE == 1:
        n = n + tl.minimum(tl.maximum(tl.load(acc_ptr + offs, mask=live, other=0).to(tl.int32), 0), max_add)
        new = tl.where(n >= K, 0, n)
    else:
        new = tl.zeros_like(n)
    tl.store(cur_ptr + slot, new, mask=live)


def plan_cursor(rs, state_indices, rows: int, mode: int, accepted=None, options: Mamba2Options | None = None):
    """[launch] of the cursor pass (_cursor_kernel): mode 0 step, 1 commit (with accepted), 2
    flush, over `rows` batch rows (or slots)."""
    options = resolve(options)
    if rows == 0:
        return []
    idx = state_indices if state_indices is not None else rs.cursor
    acc = accepted if accepted is not None else rs.cursor
    blk = options.cursor_block
    return [record(_cursor_kernel, (triton.cdiv(rows, blk),))(
        rs.cursor, idx, rs.cursor.shape[0], acc, rows, rs.flush_period, rs.capacity - rs.flush_period,
        MODE=mode, HAS_IDX=state_indices is not None, BLOCK=blk, STALE=rs.lo is not None, num_warps=4)]


def plan_fold(rs, A, idx, thresh: int, accepted=None, listed=None, options: Mamba2Options | None = None):
    """[launch] of the fold over rows idx [r] (slots; negative = skip): entries 0..n-1 with
    n = cursor (+ accepted[r]) are folded into the checkpoint where n >= thresh.
    The cursor is not touched (the caller runs the cursor pass). listed = (lst, workers): the
    rows _commit_list_kernel listed in lst, folded by that many workers per head tile instead."""
    options = resolve(options)
    rows = idx.shape[0]
    if rows == 0:
        return []
    A = last_contig(A)
    check_ckpts(rs.hi, rs.lo)
    H, P, N = rs.hi.data.shape[1:]
    G = rs.B.shape[2]
    L = rs.capacity
    block_p, chunks, warps, row = tile_params("fold", head_dim=P, state_bytes=state_bytes(rs.hi), batch=rows,
                                              heads=H, options=options)
    block_n = np2(N)
    bl, use_dot = block_l(L, block_p, block_n)
    hi_d, hi_s, hi_has = ckpt_args(rs.hi, rs.hi.data)
    lo_d, lo_s, lo_has = ckpt_args(rs.lo, rs.hi.data)
    acc = accepted if accepted is not None else idx
    grid = (triton.cdiv(P, block_p * chunks), H, rows)
    extra = {}
    if listed is not None:
        acc, nw = listed
        grid = grid[:2] + (nw,)
        extra = dict(LIST=True, ROWS=rows, NW=nw, NT=triton.cdiv(rows, nw))
    return [record(_fold_kernel, grid, row)(
        idx, rs.cursor.shape[0], acc, rs.cursor, rs.x, rs.B, rs.dt, A,
        hi_d, hi_s, lo_d, lo_s,
        thresh, P, N, L, H // G,
        *buffer_strides(rs), *ckpt_strides(rs),
        BLOCK_P=block_p, ROW_CHUNKS=chunks, BLOCK_N=block_n, BLOCK_L=bl,
        HAS_ACC=accepted is not None, HI_SCALE=hi_has, HAS_LO=rs.lo is not None, LO_SCALE=lo_has,
        USE_DOT=use_dot, DOT_PREC=fold_precision(rs, options), EXACT=interpreting(), num_warps=warps, **extra)]


def plan_flush(rs, A, slots=None, options: Mamba2Options | None = None):
    """[launches] of flush: the fold (threshold 1) and the cursor pass (mode 2)."""
    if slots is None:
        slots = torch.arange(rs.cursor.shape[0], device=rs.cursor.device, dtype=torch.int32)
    return plan_fold(rs, A, slots, 1, options=options) + plan_cursor(rs, slots, slots.shape[0], 2, options=options)


def plan_commit(rs, A, accepted, state_indices=None, options: Mamba2Options | None = None):
    """[launches] of commit (n = cursor + accepted, folded where n >= K). options.commit_list
    (up to commit_list_max rows): _commit_list_kernel moves the cursors and lists the folding
    rows, then NW = cdiv(rows * T, K) workers per head tile fold them (T = capacity - K, the most
    a commit adds: a staggered batch's folds in one pass each), the fold a programmatic
    dependent launch of the list launch and that one of the verify (pdl); else the fold with
    one program per (row, head tile), then the cursor pass."""
    options = resolve(options)
    ov = options.overrides_for("fold")
    bsz = accepted.shape[0]
    idx = state_indices if state_indices is not None else torch.arange(
        bsz, device=accepted.device, dtype=torch.int32)
    if bsz == 0 or not ov.get("list", options.commit_list) or bsz > options.commit_list_max:
        return (plan_fold(rs, A, idx, rs.flush_period, accepted, options=options)
                + plan_cursor(rs, idx, bsz, 1, accepted, options=options))
    lst = state_scratch(rs, "_m2_commit_rows", bsz + 1, accepted.device)   # listed rows, then their count
    nw = max(1, min(bsz, triton.cdiv(bsz * max(1, rs.capacity - rs.flush_period), rs.flush_period)))
    bb = triton.next_power_of_2(bsz)
    pdl = pdl_meta(accepted.device, bool(ov.get("pdl", options.pdl)))
    fold = plan_fold(rs, A, idx, rs.flush_period, accepted, listed=(lst, nw), options=options)
    fold[0].meta.update(pdl)
    return ([record(_commit_list_kernel, (1,))(idx, rs.cursor.shape[0], accepted, rs.cursor, lst, bsz, rs.flush_period,
                                               rs.capacity - rs.flush_period, BLOCK_B=bb,
                                               num_warps=4 if bb >= 256 else 1, **pdl)] + fold)


def plan_refresh_lo(rs, state_indices, rows: int):
    """[launches] of the stale low copies' refresh over `rows` batch rows: _refresh_lo_kernel
    (16-row tiles, 1 warp: a rare path), then the LO_STALE bits cleared."""
    _, H, P, N = rs.hi.data.shape
    block_p = min(16, np2(P))
    hi_d, hi_s, hi_has = ckpt_args(rs.hi, rs.hi.data)
    lo_d, lo_s, lo_has = ckpt_args(rs.lo, rs.hi.data)
    idx = state_indices if state_indices is not None else rs.cursor
    return [record(_refresh_lo_kernel, (triton.cdiv(P, block_p), H, rows))(
        idx, rs.cursor.shape[0], rs.cursor, hi_d, hi_s, lo_d, lo_s, P, N, *ckpt_strides(rs),
        BLOCK_P=block_p, BLOCK_N=np2(N), HAS_IDX=state_indices is not None, HI_SCALE=hi_has, LO_SCALE=lo_has,
        EXACT=interpreting(), num_warps=1),
        plan_clear_bits(rs, state_indices, rows)]


def plan_clear_bits(rs, state_indices, rows: int) -> Launch:
    """Launch of common.jit.clear_lo_stale_kernel over `rows` batch rows: their cursor words
    reduced to the count (the LO_STALE bit and the deferred route's epoch cleared)."""
    idx = state_indices if state_indices is not None else rs.cursor
    return record(clear_lo_stale_kernel, (1,))(idx, rs.cursor.shape[0], rs.cursor, rows,
                                                HAS_IDX=state_indices is not None,
                                                BLOCK_B=np2(rows), num_warps=4)
