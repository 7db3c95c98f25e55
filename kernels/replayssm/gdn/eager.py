"""GDN eager decode step (the baseline): one [BLOCK_V, dk] state tile per program, read, updated
and written back; o = S' q. Grid (cdiv(dv, BLOCK_V * TILES), Hv, batch)."""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.jit import cast
from .jit import EVICT_FIRST, tile_at, eager_inputs, eager_update


@triton.jit
def gdn_eager_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, n_slots, s_ptr,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
    LOAD_EV: tl.constexpr = EVICT_FIRST, STORE_EV: tl.constexpr = EVICT_FIRST, TILES: tl.constexpr = 1,
):
    """Eager step on one [BLOCK_V, dk] tile: read S once, write S once.
    sk = S k, sq = S q (one pass), u = beta (v - alpha sk), S' = alpha S + u k^T,
    o = S' q = alpha sq + u (k . q). LOAD_EV / STORE_EV: the L2 eviction policies of the
    state's load and store (the table's; see CONFIGS["eager"]).
    TILES 2: the program takes two consecutive [BLOCK_V, dk] tiles, both loads issued before
    either is used (twice the bytes in flight per program at the registers of one fp32 tile
    plus one raw tile), the step's inputs loaded and normalised once for both."""
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kh = h // (HV // HK)
    rows = pid_v * (BLOCK_V * TILES) + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    o_ptrs = o_ptr + b * sob + h * soh + rows
    slot = tl.load(idx_ptr + b)
    slot = tl.where(slot < n_slots, slot, -1)      # past the pool: a no-op row, as padding
    if slot < 0:
        for t in tl.static_range(TILES):
            tl.store(o_ptrs + t * BLOCK_V, cast(tl.zeros([BLOCK_V], tl.float32), o_ptr.dtype.element_ty, INTERP),
                     mask=rmask & (rows + t * BLOCK_V < DV))
    else:
        slot64 = slot.to(tl.int64)
        row_off, tile, mask2 = tile_at(slot64, h, rows, rmask, cols, cmask, HV, DV, DK)
        if TILES == 1:
            S = tl.load(s_ptr + tile, mask=mask2, other=0.0, eviction_policy=LOAD_EV).to(tl.float32)
            S, o = eager_tile(S, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols, cmask,
                               sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
            tl.store(s_ptr + tile, cast(S, s_ptr.dtype.element_ty, INTERP), mask=mask2, eviction_policy=STORE_EV)
            tl.store(o_ptrs, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rmask)
        else:
            tl.static_assert(TILES == 2, "TILES: 1 or 2")
            rows1 = rows + BLOCK_V
            rmask1 = rows1 < DV
            mask21 = rmask1[:, None] & cmask[None, :]
            tile1 = tile + BLOCK_V * DK
            raw0 = tl.load(s_ptr + tile, mask=mask2, other=0.0, eviction_policy=LOAD_EV)
            raw1 = tl.load(s_ptr + tile1, mask=mask21, other=0.0, eviction_policy=LOAD_EV)
            kn, qn, vv, alpha, bt = eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols,
                                                  cmask, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
            S, o = eager_update(raw0.to(tl.float32), kn, qn, vv, alpha, bt)
            tl.store(s_ptr + tile, cast(S, s_ptr.dtype.element_ty, INTERP), mask=mask2, eviction_policy=STORE_EV)
            tl.store(o_ptrs, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rmask)
            vv1 = tl.load(v_ptr + b * svb + h * svh + rows1, mask=rmask1, other=0.0).to(tl.float32)
            S, o = eager_update(raw1.to(tl.float32), kn, qn, vv1, alpha, bt)
            tl.store(s_ptr + tile1, cast(S, s_ptr.dtype.element_ty, INTERP), mask=mask21, eviction_policy=STORE_EV)
            tl.store(o_ptrs + BLOCK_V, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rmask1)


@triton.jit
def eager_tile(S, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols, cmask,
                sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS: tl.constexpr):
    """One eager step of the fp32 tile S [BLOCK_V, BLOCK_K] (rows `rows` of value head h, batch
    row b): returns (S', o [BLOCK_V]) with sk = S k, sq = S q (one pass), u = beta (v - alpha sk),
    S' = alpha S + u k^T, o = S' q = alpha sq + u (k . q)."""
    kn, qn, vv, alpha, bt = eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols, cmask,
                                          sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
    return eager_update(S, kn, qn, vv, alpha, bt)
