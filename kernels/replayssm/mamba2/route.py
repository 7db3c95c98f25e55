"""Mamba-2 small-batch route of the replay step: at the batches the table's "route" rows
cover, a step costs the eager step's time (latency-bound) while the buffered step costs more,
so the step folds its pending entries and writes the high checkpoint at every step
(_replay_eager_kernel, route_k 1), or every route_k-th step (_replay_defer_kernel: the steps
between append their entry and the next folds it). A dual state's low copy is not written
here but marked stale (LO_STALE); the next buffered step or verify refreshes it."""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.jit import cast, route_next_word, route_ticket, route_word, softplus
from ..state import EPOCH_ROWS
from .host import buffer_strides, ckpt_args, ckpt_strides, interpreting, np2, record
from .jit import CUR_MASK, LO_STALE_BIT, finish_y, load_state, slot_of, store_state
from .options import Mamba2Options, resolve
from .table import replay_params


@triton.jit
def _replay_eager_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr, idx_ptr, n_slots,
    cur_ptr, bx_ptr, bB_ptr, bdt_ptr, hi_ptr, hi_sc_ptr,
    P, N, HPG, NPROG,
    s_x_b, s_x_h, s_dt_b, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_y_b, s_y_h,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, CAP: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr,
    EXACT: tl.constexpr, EVICT: tl.constexpr,
):
    """The replay step's eager route (route "eager", a small-batch route): a flush at every
    step with eager's traffic, on BLOCK_P rows of the HIGH checkpoint of head h of batch row b.

    n = cursor, a plain load beside the state's. n > 0 (entries a buffered-route step left):
    fold entries 0..n-1 first (as a flush; CAP, the buffer capacity, bounds the loop), then
    take a ticket (cursor high bits); the program drawing NPROG - 1 resets the cursor to 0
    (dual: LO_STALE; every program read n before its own ticket, so all agree on n). Then the
    eager step with the new entry as the buffer would store it (x, B, dt rounded to the buffer
    dtypes, as the reference's flush folds it): S' = exp(dt A) S + dt x B^T, written to the
    high copy, and y = S' C (+ D x, * silu z). Dual (HAS_LO): the low copy is not written; the
    cursor word says it is stale (LO_STALE, stored by each program that finds the bit clear:
    the same value, and concurrent readers see n = 0 either way) and the next buffered step
    flushes, refreshing it. Nothing is appended; in the steady state (n = 0) there is no
    atomic, so steps may switch routes."""
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
    S = load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE, EVICT)
    word = tl.load(cur_ptr + slot, mask=live, other=0)
    n = word & CUR_MASK
    A = tl.load(A_ptr + h).to(tl.float32)
    Dh = tl.load(D_ptr + h).to(tl.float32)
    dt_n = softplus(tl.load(dt_ptr + b * s_dt_b + h).to(tl.float32) + tl.load(dtb_ptr + h).to(tl.float32))
    dt_n = dt_n.to(bdt_ptr.dtype.element_ty).to(tl.float32)   # as the buffer would store it
    Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    Bn = tl.load(B_ptr + b * s_B_b + g * s_B_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    Bn = cast(Bn, bB_ptr.dtype.element_ty, EXACT).to(tl.float32)
    x_in = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_p, mask=mask_p, other=0.0).to(tl.float32)
    x_buf = cast(x_in, bx_ptr.dtype.element_ty, EXACT).to(tl.float32)
    a_n = tl.exp(dt_n * A)      # the new entry's terms, computed while the state tile streams in
    dx_n = dt_n * x_buf
    if n > 0:
        # Pending entries folded one by one (rank-1 FMA updates, in order). This path is rare
        # (a route switch); a tl.dot fold here put the whole tile in an MMA-friendly layout and
        # slowed the steady state (H200, batch 1, Super: 5.44 us vs eager's 4.48 at 32 x 8).
        for i in range(CAP):
            if i < n:
                dt_i = tl.load(bdt_ptr + slot * s_bdt_s + i * s_bdt_l + h).to(tl.float32)
                x_i = tl.load(bx_ptr + slot * s_bx_s + h * s_bx_h + i * s_bx_l + offs_p, mask=mask_p,
                              other=0.0).to(tl.float32)
                B_i = tl.load(bB_ptr + slot * s_bB_s + g * s_bB_g + i * s_bB_l + offs_n, mask=in_n,
                              other=0.0).to(tl.float32)
                S = tl.exp(dt_i * A) * S + (dt_i * x_i)[:, None] * B_i[None, :]
        t = tl.atomic_add(cur_ptr + slot, 65536, mask=live, sem="relaxed")
        tl.atomic_xchg(cur_ptr + slot, LO_STALE_BIT if HAS_LO else 0, mask=live & ((t >> 16) == NPROG - 1),
                       sem="relaxed")
    elif HAS_LO:
        tl.store(cur_ptr + slot, LO_STALE_BIT, mask=live & (word == 0))
    S = a_n * S + dx_n[:, None] * Bn[None, :]
    store_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, S, HI_SCALE, EXACT, EVICT)
    finish_y(tl.sum(S * Cv[None, :], axis=1), x_in, Dh, z_ptr + b * s_z_b + h * s_z_h, y_ptr + b * s_y_b + h * s_y_h,
              offs_p, mask_p, in_p, HAS_Z, EXACT)


@triton.jit
def _replay_defer_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr, idx_ptr, n_slots,
    cur_ptr, ep_ptr, bx_ptr, bB_ptr, bdt_ptr, hi_ptr, hi_sc_ptr,
    P, N, HPG, NPROG,
    s_x_b, s_x_h, s_dt_b, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_y_b, s_y_h,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, CAP: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr,
    EXACT: tl.constexpr, EVICT: tl.constexpr, RK: tl.constexpr, EP_ROWS: tl.constexpr,
):
    """The small-batch route with period RK >= 2 ("route_k"): the state written at every RK-th
    step only. One [BLOCK_P, N] tile of the HIGH checkpoint per program, as the eager route
    (_replay_eager_kernel); at count n < RK the tile gets buffer entries 0..n-1 folded in
    (S <- exp(dt_i A) S + dt_i x_i B_i^T, the inputs as buffered), then this step's entry
    (rounded as the buffer stores it): y = S' C (+ D x, * silu z); n + 1 = RK: S' written,
    count 0; else the entry appended at row n (as the buffered step appends it), count n + 1.
    So the route moves the state's read and 1/RK of its write a step, against eager's read and
    write; its entries are plain buffer entries, which every other op folds as its own.

    The cursor moves without a ticket (state.py, "the route's epoch"; common.route_word):
    program (0, 0) of the sequence stores the next word (common.route_next_word), every program
    its epoch (ep_ptr: route_epoch [S, H, ceil(P / EP_ROWS)], one byte per EP_ROWS rows). Any
    other word takes the rare path: the tile re-read, entries 0..nw-1 folded, this step, S'
    written or the entry appended at nw, and a ticket each (common.route_ticket). The steady step
    is computed ahead of the branch on the path. Dual (HAS_LO): the high copy alone; the words
    carry LO_STALE (the next buffered step flushes, a verify refreshes the low copy first)."""
    tl.static_assert(BLOCK_P % EP_ROWS == 0, "BLOCK_P: a multiple of EP_ROWS (state.EPOCH_ROWS)")
    EW: tl.constexpr = BLOCK_P // EP_ROWS
    pid_p, h, b, g, slot, live, offs_p, in_p, offs_n, in_n = _program_tile(idx_ptr, n_slots, P, N, HPG, BLOCK_P,
                                                                           BLOCK_N, HAS_IDX)
    z_row = z_ptr + b * s_z_b + h * s_z_h
    y_row = y_ptr + b * s_y_b + h * s_y_h
    if live:
        mask = in_p[:, None] & in_n[None, :]
        ck_base = slot * s_ck_s + h * s_ck_h
        sc_base = slot * s_sc_s + h * s_sc_h
        S0 = load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, in_p, HI_SCALE, EVICT)
        word = tl.load(cur_ptr + slot)
        ep_at = ep_ptr + (slot * tl.num_programs(1) + h) * ((P + EP_ROWS - 1) // EP_ROWS) + pid_p * EW
        ep = tl.load(ep_at).to(tl.int32)
        A = tl.load(A_ptr + h).to(tl.float32)
        Dh = tl.load(D_ptr + h).to(tl.float32)
        dt_n = softplus(tl.load(dt_ptr + b * s_dt_b + h).to(tl.float32) + tl.load(dtb_ptr + h).to(tl.float32))
        dt_n = dt_n.to(bdt_ptr.dtype.element_ty).to(tl.float32)   # as the buffer stores it
        Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=in_n, other=0.0).to(tl.float32)
        Bn_buf = cast(tl.load(B_ptr + b * s_B_b + g * s_B_g + offs_n, mask=in_n, other=0.0).to(tl.float32),
                      bB_ptr.dtype.element_ty, EXACT)
        x_in = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_p, mask=in_p, other=0.0).to(tl.float32)
        x_buf = cast(x_in, bx_ptr.dtype.element_ty, EXACT)
        bx_base = slot * s_bx_s + h * s_bx_h
        bB_base = slot * s_bB_s + g * s_bB_g
        fast, n, nw, e_next = route_word(word, ep, RK)
        # the steady step, whatever the path: entries 0..n-1 (n <= RK - 1) loaded whatever n is
        # (rows at or past the count may hold anything: selected away, never multiplied in)
        S = S0
        for i in tl.static_range(RK - 1):
            S = tl.where(i < n, _with_entry(S, i, A, bx_ptr, bB_ptr, bdt_ptr, bx_base, bB_base, slot, h, s_bx_l, s_bB_l,
                                            s_bdt_s, s_bdt_l, offs_p, in_p, offs_n, in_n), S)
        S = tl.exp(dt_n * A) * S + (dt_n * x_buf.to(tl.float32))[:, None] * Bn_buf.to(tl.float32)[None, :]
        ep_new = e_next
        if fast:
            _defer_finish(S, n, x_in, x_buf, Bn_buf, dt_n, Cv, Dh, z_row, y_row, bx_ptr, bB_ptr, bdt_ptr, hi_ptr,
                          hi_sc_ptr, ck_base, sc_base, bx_base, bB_base, slot, s_bx_l, s_bB_l, s_bdt_s, s_bdt_l,
                          s_ck_p, h, HPG, offs_p, in_p, offs_n, in_n, mask, HAS_Z, HI_SCALE, EXACT, EVICT, RK)
            if (pid_p == 0) & (h == 0):
                tl.store(cur_ptr + slot, route_next_word(n, e_next, RK, HAS_LO))
        else:
            # the rare path: the step again from the tile as stored (nothing is written before
            # this branch) with every entry the word counts folded in, in order
            S = load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, in_p, HI_SCALE, EVICT)
            for j in range(CAP):
                if j < nw:
                    S = _with_entry(S, j, A, bx_ptr, bB_ptr, bdt_ptr, bx_base, bB_base, slot, h, s_bx_l, s_bB_l,
                                    s_bdt_s, s_bdt_l, offs_p, in_p, offs_n, in_n)
            S = tl.exp(dt_n * A) * S + (dt_n * x_buf.to(tl.float32))[:, None] * Bn_buf.to(tl.float32)[None, :]
            _defer_finish(S, nw, x_in, x_buf, Bn_buf, dt_n, Cv, Dh, z_row, y_row, bx_ptr, bB_ptr, bdt_ptr, hi_ptr,
                          hi_sc_ptr, ck_base, sc_base, bx_base, bB_base, slot, s_bx_l, s_bB_l, s_bdt_s, s_bdt_l,
                          s_ck_p, h, HPG, offs_p, in_p, offs_n, in_n, mask, HAS_Z, HI_SCALE, EXACT, EVICT, RK)
            route_ticket(cur_ptr + slot, NPROG, nw, RK, HAS_LO)
            ep_new = 1
        ew = tl.arange(0, EW)
        tl.store(ep_at + ew, tl.full([EW], 0, tl.int8) + ep_new.to(tl.int8), mask=pid_p * BLOCK_P + ew * EP_ROWS < P)
    else:
        tl.store(y_row + offs_p, cast(tl.zeros([BLOCK_P], tl.float32), y_ptr.dtype.element_ty, EXACT), mask=in_p)


@triton.jit
def _program_tile(idx_ptr, n_slots, P, N, HPG, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_IDX: tl.constexpr):
    """A [BLOCK_P, N] tile program's place, grid (cdiv(P, BLOCK_P), H, batch): (pid_p, head h,
    batch row b, group g, slot, live, rows offs_p [BLOCK_P] and in_p, columns offs_n [BLOCK_N]
    and in_n)."""
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    slot, live = slot_of(idx_ptr, b, n_slots, HAS_IDX)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    return pid_p, h, b, h // HPG, slot, live, offs_p, offs_p < P, offs_n, offs_n < N


@triton.jit
def _with_entry(S, i, A, bx_ptr, bB_ptr, bdt_ptr, bx_base, bB_base, slot, h, s_bx_l, s_bB_l, s_bdt_s, s_bdt_l,
                offs_p, in_p, offs_n, in_n):
    """The tile S [BLOCK_P, BLOCK_N] with buffer entry i folded in, as stored: exp(dt_i A) S +
    dt_i x_i B_i^T."""
    dt_i = tl.load(bdt_ptr + slot * s_bdt_s + i * s_bdt_l + h).to(tl.float32)
    x_i = tl.load(bx_ptr + bx_base + i * s_bx_l + offs_p, mask=in_p, other=0.0).to(tl.float32)
    B_i = tl.load(bB_ptr + bB_base + i * s_bB_l + offs_n, mask=in_n, other=0.0).to(tl.float32)
    return tl.exp(dt_i * A) * S + (dt_i * x_i)[:, None] * B_i[None, :]


@triton.jit
def _defer_finish(S, n, x_in, x_buf, Bn_buf, dt_n, Cv, Dh, z_row, y_row, bx_ptr, bB_ptr, bdt_ptr, hi_ptr, hi_sc_ptr,
                  ck_base, sc_base, bx_base, bB_base, slot, s_bx_l, s_bB_l, s_bdt_s, s_bdt_l, s_ck_p, h, HPG,
                  offs_p, in_p, offs_n, in_n, mask, HAS_Z: tl.constexpr, HI_SCALE: tl.constexpr,
                  EXACT: tl.constexpr, EVICT: tl.constexpr, RK: tl.constexpr):
    """The deferred route's writes of a step taken at count n: n + 1 >= RK: the tile S to the
    high copy; else entry n of the buffer (x: this program's rows; dt: row tile 0; B: row tile 0
    of the group's first head). Then y [BLOCK_P]."""
    if n + 1 >= RK:
        store_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, in_p, S, HI_SCALE, EXACT,
                     EVICT)
    else:
        tl.store(bx_ptr + bx_base + n * s_bx_l + offs_p, x_buf, mask=in_p)
        if tl.program_id(0) == 0:
            tl.store(bdt_ptr + slot * s_bdt_s + n * s_bdt_l + h, dt_n)
            if h % HPG == 0:
                tl.store(bB_ptr + bB_base + n * s_bB_l + offs_n, Bn_buf, mask=in_n)
    finish_y(tl.sum(S * Cv[None, :], axis=1), x_in, Dh, z_row, y_row, offs_p, in_p, in_p, HAS_Z, EXACT)


def route_period(*, batch: int, heads: int, head_dim: int, read_bytes: int, flush_period: int, dual: bool = False,
                 hi_bytes: int = 4, options: Mamba2Options | None = None) -> int:
    """The small-batch route's period k at this case (0: the step buffers, not routed): the
    route row's route_k (1: a flush at every step), at most the flush period. read_bytes: bytes
    per element of the copy the step reads (a dual state's low copy); hi_bytes: a dual state's
    high copy's. For traffic models and byte counts (reference.mamba2_replay_step's `route`)."""
    v = replay_params(head_dim=head_dim, read_bytes=read_bytes, batch=batch, heads=heads, dual=dual,
                      hi_bytes=hi_bytes, options=resolve(options))
    return min(v["route_k"], flush_period) if v["route"] == "eager" else 0


def plan_route(rs, x, dt, A, B, C, D, dt_bias, z, state_indices, y, v: dict):
    """Launch of the small-batch route (v: table.replay_params), grid (cdiv(P, block_p), H, b):
    route_k 1, _replay_eager_kernel (a flush at every step); k >= 2 (at most the flush period),
    _replay_defer_kernel (the state written every k-th step)."""
    bsz, H, P = x.shape
    N, G = B.shape[-1], B.shape[1]
    grid = (triton.cdiv(P, v["block_p"]), H, bsz)
    nprog = grid[0] * H
    if nprog >= 1 << 15:
        raise ValueError(f"the eager route's ticket needs < 32768 programs per sequence ({nprog})")
    hi_d, hi_s, hi_has = ckpt_args(rs.hi, rs.hi.data)
    zz = z if z is not None else x
    idx = state_indices if state_indices is not None else x
    rs.routed = rs.routed or rs.lo is not None     # its low copies may go stale: verify refreshes them first
    rk = min(v["route_k"], rs.flush_period)
    rs.deferred = rs.deferred or rk > 1     # its cursor words carry epochs: verify clears them first
    strides = (x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
               zz.stride(0), zz.stride(1), y.stride(0), y.stride(1), *buffer_strides(rs), *ckpt_strides(rs))
    meta = dict(BLOCK_P=v["block_p"], BLOCK_N=np2(N), CAP=rs.capacity, HAS_Z=z is not None,
                HAS_IDX=state_indices is not None, HI_SCALE=hi_has, HAS_LO=rs.lo is not None,
                EXACT=interpreting(), EVICT=v["evict"], num_warps=v["warps"])
    if v["maxnreg"]:
        meta["maxnreg"] = v["maxnreg"]
    if rk > 1:
        return record(_replay_defer_kernel, grid, v["row"])(
            x, dt, A, B, C, D, dt_bias, zz, y, idx, rs.cursor.shape[0], rs.cursor, rs.route_epoch, rs.x, rs.B, rs.dt,
            hi_d, hi_s,
            P, N, H // G, nprog, *strides, RK=rk, EP_ROWS=EPOCH_ROWS, **meta)
    return record(_replay_eager_kernel, grid, v["row"])(
        x, dt, A, B, C, D, dt_bias, zz, y, idx, rs.cursor.shape[0], rs.cursor, rs.x, rs.B, rs.dt, hi_d, hi_s,
        P, N, H // G, nprog, *strides, **meta)
