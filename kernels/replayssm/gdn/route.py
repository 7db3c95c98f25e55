"""The replay step's small-batch route: eager's traffic on the high checkpoint (a flush every
step, gdn_route_kernel) or every ROUTE_K-th step (gdn_route_defer_kernel). Grid (cdiv(dv,
BLOCK_V), Hv, batch)."""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.jit import cast, route_next_word, route_ticket, route_word
from .jit import (TICKET, CUR_MASK, STALE_BIT, EVICT_FIRST, ckpt_load, ckpt_store, fold_entries, tile_at,
                  folded_tile, eager_inputs, eager_update)


@triton.jit
def gdn_route_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, n_slots, hi_ptr, cur_ptr,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale, nprog,
    # from here on what the steady state (n = 0) never reads (fp8 scales, the buffer): the
    # eager kernel's arguments first, so the launch costs what eager's does. No low copy: the
    # route never writes it (dual: STALE_BIT).
    hi_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    HI_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
    PENDING_CALL: tl.constexpr = False, LOAD_EV: tl.constexpr = EVICT_FIRST, STORE_EV: tl.constexpr = EVICT_FIRST,
):
    """The replay step's eager route (EAGER_ROUTE, a small-batch route): a flush at every step,
    with eager's traffic and latency. One [BLOCK_V, dk] tile of the HIGH checkpoint per program.

    n = cursor, read with a plain load beside the state's. The eager step on the tile, written
    to the high copy, o = S' q. Dual: the low copy is not written; the cursor word says it is
    stale (LO_STALE, stored once by each program that finds the bit clear: the same value, and
    concurrent readers see n = 0 either way), and the next buffered step flushes, refreshing it.
    n > 0 (entries a buffered-route step left): the step is taken from the tile with them
    folded in first, as a flush folds them (fold_entries; dual: u recomputed against the high state),
    then the program counts itself in with a ticket (cursor high bits); the last program resets
    the cursor to 0 (dual: LO_STALE). Every program has read n before that (it reads before its
    own ticket), so all agree on n. The steady state (n = 0) is computed ahead of the branch on
    n and the rare path redoes it from a second read of the tile (see the comment in the body);
    PENDING_CALL: the rare path is a call (_route_pending), which holds fewer registers.
    Nothing is appended and, at n = 0, no atomic happens: the state stays consistent for steps
    of either route. LOAD_EV / STORE_EV: as the eager kernel's, for the high copy's tile."""
    pid_v, h, b, kh, rows, rmask, cols, cmask, o_ptrs = _route_coords(o_ptr, sob, soh, HV, HK, DK, DV, BLOCK_V,
                                                                       BLOCK_K)
    slot = tl.load(idx_ptr + b)
    slot = tl.where(slot < n_slots, slot, -1)      # past the pool: a no-op row, as padding
    if slot < 0:
        tl.store(o_ptrs, cast(tl.zeros([BLOCK_V], tl.float32), o_ptr.dtype.element_ty, INTERP), mask=rmask)
    else:
        slot64 = slot.to(tl.int64)
        row_off, tile, mask2 = tile_at(slot64, h, rows, rmask, cols, cmask, HV, DV, DK)
        S = ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8, LOAD_EV)
        word = tl.load(cur_ptr + slot64)
        n = word & CUR_MASK
        kn, qn, vv, alpha, bt = eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols,
                                              cmask, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
        # The steady state (n = 0) runs the eager kernel's step as it is, and only then branches
        # on n. With the step after the branch, ptxas issued the tile's loads after the inputs'
        # round trip (their norms): one DRAM latency more per launch than the eager kernel.
        # Each branch stores its own results: a phi of the two would be stored through a layout
        # conversion in shared memory, behind a barrier, that the eager kernel does not have.
        S, o = eager_update(S, kn, qn, vv, alpha, bt)
        if n > 0:
            # pending entries (rare: after a route switch): the step again, from the tile as
            # stored (nothing is written before this branch) with the entries folded in first
            if PENDING_CALL:
                _route_pending(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, hi_ptr, hi_sc_ptr, cur_ptr,
                               ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb,
                               sbh, sob, soh, scale, nprog, pid_v, h, b, slot64, n,
                               HV, HK, DK, DV, L, BLOCK_V, BLOCK_K, HI_FP8, DUAL, INTERP, EPS, LOAD_EV, STORE_EV)
            else:   # inline, the steady path's inputs reused (fp32 tiles: spill-free under 56 registers)
                S = ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8, LOAD_EV)
                S = fold_entries(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
                          HV, HK, DK, DV, L, DUAL, EPS)
                S, o = eager_update(S, kn, qn, vv, alpha, bt)
                _route_store(hi_ptr, hi_sc_ptr, o_ptrs, tile, row_off, S, o, mask2, rmask, HI_FP8, INTERP, STORE_EV)
                _route_ticket(cur_ptr, slot64, nprog, DUAL)
        else:
            _route_store(hi_ptr, hi_sc_ptr, o_ptrs, tile, row_off, S, o, mask2, rmask, HI_FP8, INTERP, STORE_EV)
            if DUAL:
                if word == 0:
                    tl.store(cur_ptr + slot64, STALE_BIT)


@triton.jit
def _route_coords(o_ptr, sob, soh, HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                  BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """A small-batch route program's place, grid (cdiv(dv, BLOCK_V), Hv, batch): (pid_v, value
    head h, batch row b, key head kh, rows [BLOCK_V] and their mask, cols [BLOCK_K] and their
    mask, the output row pointers)."""
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    cols = tl.arange(0, BLOCK_K)
    return pid_v, h, b, h // (HV // HK), rows, rows < DV, cols, cols < DK, o_ptr + b * sob + h * soh + rows


@triton.jit(noinline=True)
def _route_pending(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, hi_ptr, hi_sc_ptr, cur_ptr,
                   ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh,
                   sob, soh, scale, nprog, pid_v, h, b, slot64, n,
                   HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
                   BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, HI_FP8: tl.constexpr, DUAL: tl.constexpr,
                   INTERP: tl.constexpr, EPS: tl.constexpr, LOAD_EV: tl.constexpr, STORE_EV: tl.constexpr):
    """The eager route's rare path (n > 0 pending entries) as a call (PENDING_CALL): the tile
    re-read, the entries folded (fold_entries), the inputs re-read, the step, the writes and the
    cursor ticket. Scalar arguments only (noinline): no tile of the steady path is live across
    it. sm_90, bf16 state, 8 rows x 1 warp: 95 registers instead of the inline form's 127."""
    kh = h // (HV // HK)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    S, tile, row_off, mask2 = folded_tile(hi_ptr, hi_sc_ptr, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, slot64, h, kh, n,
                                           rows, rmask, cols, cmask, HV, HK, DK, DV, L, HI_FP8, DUAL, EPS, LOAD_EV)
    kn, qn, vv, alpha, bt = eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols,
                                          cmask, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
    S, o = eager_update(S, kn, qn, vv, alpha, bt)
    _route_store(hi_ptr, hi_sc_ptr, o_ptr + b * sob + h * soh + rows, tile, row_off, S, o, mask2, rmask, HI_FP8,
                 INTERP, STORE_EV)
    _route_ticket(cur_ptr, slot64, nprog, DUAL)


@triton.jit
def _route_ticket(cur_ptr, slot64, nprog, DUAL: tl.constexpr):
    """The rare path's cursor move: a ticket each; the last program stores 0 (dual: LO_STALE)."""
    old = tl.atomic_add(cur_ptr + slot64, TICKET, sem="relaxed")
    if (old >> 16) == nprog - 1:
        tl.atomic_xchg(cur_ptr + slot64, STALE_BIT if DUAL else 0, sem="relaxed")


@triton.jit
def _route_store(hi_ptr, hi_sc_ptr, o_ptrs, tile, row_off, S, o, mask2, rmask,
                 HI_FP8: tl.constexpr, INTERP: tl.constexpr, EV: tl.constexpr = EVICT_FIRST):
    """The eager route's writes: the tile S to the high copy (eviction policy EV), o [BLOCK_V]."""
    ckpt_store(hi_ptr, hi_sc_ptr, tile, row_off, S, mask2, rmask, HI_FP8, INTERP, EV)
    tl.store(o_ptrs, cast(o, o_ptrs.dtype.element_ty, INTERP), mask=rmask)


@triton.jit
def gdn_route_defer_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, n_slots, hi_ptr, cur_ptr, ep_ptr,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale, nprog,
    hi_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    HI_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr, RK: tl.constexpr,
    EP_ROWS: tl.constexpr, LOAD_EV: tl.constexpr = EVICT_FIRST, STORE_EV: tl.constexpr = EVICT_FIRST,
):
    """The small-batch route with period RK >= 2 (ROUTE_K): the state is written at every
    RK-th step only. One [BLOCK_V, dk] tile of the HIGH checkpoint per program, as the eager
    route; at cursor n < RK the tile gets entries 0..n-1 folded in (stored u; dual: u
    recomputed against it), then this step: o = S' q; n + 1 = RK: S' written, cursor 0; else
    the entry appended at n (u, k, g; dual: v, beta), cursor n + 1. So the route moves the
    state's read and 1/RK of its write a step, against eager's read and write.

    The cursor moves without a ticket (state.py, "the route's epoch"): program (0, 0) of the
    sequence stores (e' << 8) | n' (dual: | LO_STALE), e' = ep % 127 + 1, where ep is the epoch
    the program's rows last saw (route_epoch, ep_ptr: one byte per 4 rows); every program
    stores e' there. A program reading epoch ep sees the word from before the launch; epoch
    e' is a sibling's store, whose count n' came from n by n -> (n + 1) mod RK. Any other word
    (epoch 0: another op moved the cursor; or n >= RK) takes the rare path: entries 0..n-1
    folded, this step, S' written, and a ticket each; the last program stores epoch 1, count 0.
    Every program has read the word before its own ticket, so all agree on the path and on n.
    The steady step is computed ahead of the branch on the path (see gdn_route_kernel)."""
    tl.static_assert(BLOCK_V % EP_ROWS == 0, "BLOCK_V: a multiple of EP_ROWS (state.EPOCH_ROWS)")
    NE: tl.constexpr = (DV + EP_ROWS - 1) // EP_ROWS
    EW: tl.constexpr = BLOCK_V // EP_ROWS
    pid_v, h, b, kh, rows, rmask, cols, cmask, o_ptrs = _route_coords(o_ptr, sob, soh, HV, HK, DK, DV, BLOCK_V,
                                                                       BLOCK_K)
    slot = tl.load(idx_ptr + b)
    slot = tl.where(slot < n_slots, slot, -1)      # past the pool: a no-op row, as padding
    if slot < 0:
        tl.store(o_ptrs, cast(tl.zeros([BLOCK_V], tl.float32), o_ptr.dtype.element_ty, INTERP), mask=rmask)
    else:
        slot64 = slot.to(tl.int64)
        row_off, tile, mask2 = tile_at(slot64, h, rows, rmask, cols, cmask, HV, DV, DK)
        S0 = ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8, LOAD_EV)
        word = tl.load(cur_ptr + slot64)
        ep_at = ep_ptr + (slot64 * HV + h) * NE + pid_v * EW
        ep = tl.load(ep_at).to(tl.int32)
        kn, qn, vv, alpha, bt = eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols,
                                              cmask, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
        fast, n, nw, e_next = route_word(word, ep, RK)
        # the steady step, whatever the path (its loads issue first: see the eager route)
        S = _fold_few(S0, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
                      HV, HK, DK, DV, L, DUAL, EPS, RK - 1)
        u = bt * (vv - alpha * tl.sum(S * kn[None, :], 1))
        S = alpha * S + u[:, None] * kn[None, :]
        o = tl.sum(S * qn[None, :], 1)
        ep_new = e_next
        if fast:
            _route_finish(S, u, o, n, o_ptrs, hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, rows, cols, cmask,
                          ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, k_ptr, g_ptr, b, h, kh, slot64, vv, bt,
                          skb, skh, sgb, sgh, HV, HK, DK, DV, L, HI_FP8, DUAL, INTERP, RK, STORE_EV)
            if (pid_v == 0) & (h == 0):
                tl.store(cur_ptr + slot64, route_next_word(n, e_next, RK, DUAL))
        else:
            # the rare path: the step again from the tile with every entry the word counts folded
            # in; the cursor by ticket, the last program storing epoch 1
            S = fold_entries(S0, slot64, h, kh, nw, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
                      HV, HK, DK, DV, L, DUAL, EPS)
            u = bt * (vv - alpha * tl.sum(S * kn[None, :], 1))
            S = alpha * S + u[:, None] * kn[None, :]
            o = tl.sum(S * qn[None, :], 1)
            _route_finish(S, u, o, nw, o_ptrs, hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, rows, cols, cmask,
                          ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, k_ptr, g_ptr, b, h, kh, slot64, vv, bt,
                          skb, skh, sgb, sgh, HV, HK, DK, DV, L, HI_FP8, DUAL, INTERP, RK, STORE_EV)
            ep_new = 1
            route_ticket(cur_ptr + slot64, nprog, nw, RK, DUAL)
        ew = tl.arange(0, EW)
        tl.store(ep_at + ew, tl.full([EW], 0, tl.int8) + ep_new.to(tl.int8),
                 mask=pid_v * BLOCK_V + ew * EP_ROWS < DV)


@triton.jit
def _route_finish(S, u, o, n, o_ptrs, hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, rows, cols, cmask,
                  ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, k_ptr, g_ptr, b, h, kh, slot64, vv, bt,
                  skb, skh, sgb, sgh, HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                  L: tl.constexpr, HI_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, RK: tl.constexpr,
                  STORE_EV: tl.constexpr):
    """The deferred route's writes of a step taken at count n: n + 1 >= RK: the tile S to the
    high copy; else entry n of the buffer (u rows; dual: v rows; program 0 of the head: g (dual:
    beta); of the key head's first value head: k). Then o [BLOCK_V]."""
    if n + 1 >= RK:
        ckpt_store(hi_ptr, hi_sc_ptr, tile, row_off, S, mask2, rmask, HI_FP8, INTERP, STORE_EV)
    else:
        ent = slot64 * L + n
        tl.store(ub_ptr + (ent * HV + h) * DV + rows, u, mask=rmask)
        if DUAL:
            tl.store(vb_ptr + (ent * HV + h) * DV + rows, cast(vv, vb_ptr.dtype.element_ty, INTERP), mask=rmask)
        if tl.program_id(0) == 0:
            tl.store(gb_ptr + ent * HV + h, tl.load(g_ptr + b * sgb + h * sgh).to(tl.float32))
            if DUAL:
                tl.store(bb_ptr + ent * HV + h, bt)
            if h % (HV // HK) == 0:
                k_raw = tl.load(k_ptr + b * skb + kh * skh + cols, mask=cmask, other=0.0)
                tl.store(kb_ptr + (ent * HK + kh) * DK + cols, cast(k_raw.to(tl.float32), kb_ptr.dtype.element_ty,
                                                                    INTERP), mask=cmask)
    tl.store(o_ptrs, cast(o, o_ptrs.dtype.element_ty, INTERP), mask=rmask)


@triton.jit
def _fold_few(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
              HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
              DUAL: tl.constexpr, EPS: tl.constexpr, NMAX: tl.constexpr):
    """fold_entries of entries 0..n-1, n <= NMAX, unrolled and without branches. Every entry < NMAX is
    loaded whatever n is (its addresses do not depend on the cursor, so the loads issue with the
    tile's instead of a round trip after the cursor's, which cost a DRAM latency per launch at
    batch 1); an entry i >= n
    (whatever its rows hold) is then replaced by decay 1 and u 0, so it leaves S as it is."""
    for i in tl.static_range(NMAX):
        ok = tl.where(i < n, True, False)  # i1 scalar (common/jit.py)
        e = slot64 * L + i
        gi = tl.load(gb_ptr + e * HV + h).to(tl.float32)
        ki = tl.load(kb_ptr + (e * HK + kh) * DK + cols, mask=cmask, other=0.0).to(tl.float32)
        if DUAL:
            vi = tl.load(vb_ptr + (e * HV + h) * DV + rows, mask=rmask, other=0.0).to(tl.float32)
            bi = tl.load(bb_ptr + e * HV + h).to(tl.float32)
        else:
            ui = tl.load(ub_ptr + (e * HV + h) * DV + rows, mask=rmask, other=0.0).to(tl.float32)
        ai = tl.where(ok, tl.exp(tl.where(ok, gi, 0.0)), 1.0)
        ki = tl.where(ok, ki, 0.0)
        ki = ki * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)
        if DUAL:
            ui = tl.where(ok, bi, 0.0) * (tl.where(ok, vi, 0.0) - ai * tl.sum(S * ki[None, :], 1))
        else:
            ui = tl.where(ok, ui, 0.0)
        S = ai * S + ui[:, None] * ki[None, :]
    return S
