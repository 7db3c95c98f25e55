"""Mamba-2 eager step (the tuned baseline): S <- exp(dt A) S + dt x B^T; y = S C + D x (* silu z).
Reads and writes the state once per step. Grid (row tiles of P, H, batch rows): axis 0 the
fastest in launch order, so one sequence's programs run close together."""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.jit import softplus
from ..common.launch import last_contig, out_like
from .host import interpreting, np2, record
from .jit import finish_y, load_state, slot_of, store_state
from .options import Mamba2Options, resolve
from .table import tile_params


@triton.jit
def _eager_kernel(
    st_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr, idx_ptr, n_slots,
    P, N, HPG,
    s_st_s, s_st_h, s_st_p,
    s_x_b, s_x_h, s_dt_b, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_y_b, s_y_h,
    BLOCK_P: tl.constexpr, ROW_CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, EXACT: tl.constexpr, EVICT: tl.constexpr,
):
    """One eager step for rows [pid_p*ROW_CHUNKS*BLOCK_P, ...) of head h of batch row b.
    Reads the [rows, N] state tile once and writes it once."""
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // HPG
    slot, live = slot_of(idx_ptr, b, n_slots, HAS_IDX)
    A = tl.load(A_ptr + h).to(tl.float32)
    Dh = tl.load(D_ptr + h).to(tl.float32)
    dt_v = softplus(tl.load(dt_ptr + b * s_dt_b + h).to(tl.float32) + tl.load(dtb_ptr + h).to(tl.float32))
    a = tl.exp(dt_v * A)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = (offs_n < N) & live
    Bv = tl.load(B_ptr + b * s_B_b + g * s_B_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    st_base = slot * s_st_s + h * s_st_h
    for c in tl.static_range(ROW_CHUNKS):
        offs_p = (pid_p * ROW_CHUNKS + c) * BLOCK_P + tl.arange(0, BLOCK_P)
        in_p = offs_p < P
        mask_p = in_p & live
        mask = mask_p[:, None] & mask_n[None, :]
        xv = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_p, mask=mask_p, other=0.0).to(tl.float32)
        S = load_state(st_ptr, st_ptr, st_base, 0, offs_p, offs_n, s_st_p, mask, mask_p, False, EVICT)
        S = a * S + (dt_v * xv)[:, None] * Bv[None, :]
        store_state(st_ptr, st_ptr, st_base, 0, offs_p, offs_n, s_st_p, mask, mask_p, S, False, EXACT, EVICT)
        finish_y(tl.sum(S * Cv[None, :], axis=1), xv, Dh, z_ptr + b * s_z_b + h * s_z_h,
                  y_ptr + b * s_y_b + h * s_y_h, offs_p, mask_p, in_p, HAS_Z, EXACT)


def plan_eager(state, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, out=None,
               options: Mamba2Options | None = None):
    """([launches], y) of the eager step; see replayssm.mamba2.eager_step."""
    options = resolve(options)
    if state.stride(-1) != 1:
        raise ValueError("state needs a unit stride in its last dim")
    x, dt, B, C, z, A, D, dt_bias = (last_contig(t) for t in (x, dt, B, C, z, A, D, dt_bias))
    bsz, H, P = x.shape
    N, G = B.shape[-1], B.shape[1]
    y = out_like(out, x)
    if bsz == 0:
        return [], y
    block_p, chunks, warps, row = tile_params("eager", head_dim=P, state_bytes=state.element_size(), batch=bsz,
                                              heads=H, options=options)
    grid = (triton.cdiv(P, block_p * chunks), H, bsz)
    zz = z if z is not None else x
    idx = state_indices if state_indices is not None else x
    launch = record(_eager_kernel, grid, row)(
        state, x, dt, A, B, C, D, dt_bias, zz, y, idx, state.shape[0],
        P, N, H // G,
        state.stride(0), state.stride(1), state.stride(2),
        x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        zz.stride(0), zz.stride(1), y.stride(0), y.stride(1),
        BLOCK_P=block_p, ROW_CHUNKS=chunks, BLOCK_N=np2(N),
        HAS_Z=z is not None, HAS_IDX=state_indices is not None, EXACT=interpreting(),
        EVICT=options.overrides_for("eager").get("evict", ""), num_warps=warps)
    return [launch], y
