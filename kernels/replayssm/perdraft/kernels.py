"""Triton kernels of the per-draft speculative baseline (vLLM's speculative path).

Semantics: replayssm.reference.mamba2_verify_perdraft / gdn_verify_perdraft. A request owns
1 + T state slots (one row of a slot table [b, 1 + T], int32); start[b] (a device tensor,
0..T) is the column of the state to start from; the state after token t is written to column
(start + 1 + t) mod (1 + T), so the start slot survives the round and any accepted count
0..T is a move of `start` (replayssm.perdraft.advance), never a copy.

One program per (row tile, head, batch row), the grid of the eager kernels: it reads its
start-state tile once, then loops over the T tokens with the tile in registers (fp32),
storing the tile after every token into that token's slot and the token's output. Per
request and round: one state read, T state writes (vLLM's traffic). Fixed grid, the start
column and slot table read on the device, no host sync: CUDA-graph capturable.

Layouts: Mamba-2 states [S, H, P, N] (rows P, cols N contiguous), x/z/y [b, T, H, P],
dt [b, T, H], B/C [b, T, G, N]; GDN states [S, Hv, dv, dk] (o = S q), q/k [b, T, Hk, dk],
v/o [b, T, Hv, dv], g/beta [b, T, Hv]. Activations may be strided views with a unit last
stride (else copied); states need a unit last stride and are addressed through their strides.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ..common.jit import cast, silu, softplus


# ----------------------------------------------------------------------------- Mamba-2
@triton.jit
def mamba2_perdraft_kernel(
    st_ptr, tbl_ptr, start_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr,
    P, N, HPG,
    s_st_s, s_st_h, s_st_p, s_tbl_b,
    s_x_b, s_x_t, s_x_h, s_dt_b, s_dt_t, s_B_b, s_B_t, s_B_g, s_C_b, s_C_t, s_C_g,
    s_z_b, s_z_t, s_z_h, s_y_b, s_y_t, s_y_h,
    T: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_Z: tl.constexpr, EXACT: tl.constexpr,
):
    """Rows [pid_p*BLOCK_P, +BLOCK_P) of head h of batch row b, over the T tokens:
    S = a_t S + dt_t x_t B_t^T; store S to the token's slot; y_t = S C_t + D x_t (* silu z_t)."""
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // HPG
    # nested @jit calls cost ~1 ms each under the interpreter: small helpers are inlined
    c0 = tl.load(start_ptr + b).to(tl.int32)
    src = tl.load(tbl_ptr + b * s_tbl_b + c0).to(tl.int64)
    live = tl.where(src >= 0, True, False)  # i1 scalar (common/jit.py)
    src = tl.maximum(src, 0)
    A = tl.load(A_ptr + h).to(tl.float32)
    Dh = tl.load(D_ptr + h).to(tl.float32)
    dtb = tl.load(dtb_ptr + h).to(tl.float32)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = (offs_n < N) & live
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    in_p = offs_p < P
    mask_p = in_p & live
    mask = mask_p[:, None] & mask_n[None, :]
    tile = h * s_st_h + offs_p[:, None] * s_st_p + offs_n[None, :]
    S = tl.load(st_ptr + src * s_st_s + tile, mask=mask, other=0.0).to(tl.float32)
    for t in tl.static_range(T):
        xv = tl.load(x_ptr + b * s_x_b + t * s_x_t + h * s_x_h + offs_p, mask=mask_p, other=0.0).to(tl.float32)
        Bv = tl.load(B_ptr + b * s_B_b + t * s_B_t + g * s_B_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        Cv = tl.load(C_ptr + b * s_C_b + t * s_C_t + g * s_C_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        dtv = softplus(tl.load(dt_ptr + b * s_dt_b + t * s_dt_t + h).to(tl.float32) + dtb)
        S = tl.exp(dtv * A) * S + (dtv * xv)[:, None] * Bv[None, :]
        dst = tl.load(tbl_ptr + b * s_tbl_b + (c0 + 1 + t) % (T + 1)).to(tl.int64)
        tl.store(st_ptr + tl.maximum(dst, 0) * s_st_s + tile, cast(S, st_ptr.dtype.element_ty, EXACT),
                 mask=mask & tl.where(dst >= 0, True, False))   # i1 scalar (common/jit.py)
        y = tl.sum(S * Cv[None, :], axis=1) + Dh * xv
        if HAS_Z:
            zv = tl.load(z_ptr + b * s_z_b + t * s_z_t + h * s_z_h + offs_p, mask=mask_p, other=0.0).to(tl.float32)
            y = y * silu(zv)
        tl.store(y_ptr + b * s_y_b + t * s_y_t + h * s_y_h + offs_p, cast(y, y_ptr.dtype.element_ty, EXACT), mask=in_p)


# ----------------------------------------------------------------------------- GDN
@triton.jit
def gdn_perdraft_kernel(
    st_ptr, tbl_ptr, start_ptr, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr,
    s_st_s, s_st_h, s_st_v, s_tbl_b,
    s_q_b, s_q_t, s_q_h, s_k_b, s_k_t, s_k_h, s_v_b, s_v_t, s_v_h,
    s_g_b, s_g_t, s_be_b, s_be_t, s_o_b, s_o_t, s_o_h,
    scale,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, T: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, EXACT: tl.constexpr, EPS: tl.constexpr,
):
    """A [BLOCK_V, dk] tile of value head h of batch row b over the T tokens:
    sk = S k, sq = S q (one pass), u = beta (v - alpha sk), S = alpha S + u k^T (stored to the
    token's slot), o = S q = alpha sq + u (k . q)."""
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kh = h // (HV // HK)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    in_v = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    c0 = tl.load(start_ptr + b).to(tl.int32)
    src = tl.load(tbl_ptr + b * s_tbl_b + c0).to(tl.int64)
    live = tl.where(src >= 0, True, False)  # i1 scalar (common/jit.py)
    src = tl.maximum(src, 0)
    rmask = in_v & live
    mask = rmask[:, None] & (cmask[None, :] & live)
    tile = h * s_st_h + rows[:, None] * s_st_v + cols[None, :]
    S = tl.load(st_ptr + src * s_st_s + tile, mask=mask, other=0.0).to(tl.float32)
    for t in tl.static_range(T):
        kn = tl.load(k_ptr + b * s_k_b + t * s_k_t + kh * s_k_h + cols, mask=cmask & live, other=0.0).to(tl.float32)
        kn = kn * tl.rsqrt(tl.sum(kn * kn, 0) + EPS)
        qn = tl.load(q_ptr + b * s_q_b + t * s_q_t + kh * s_q_h + cols, mask=cmask & live, other=0.0).to(tl.float32)
        qn = qn * (tl.rsqrt(tl.sum(qn * qn, 0) + EPS) * scale)
        vv = tl.load(v_ptr + b * s_v_b + t * s_v_t + h * s_v_h + rows, mask=rmask, other=0.0).to(tl.float32)
        alpha = tl.exp(tl.load(g_ptr + b * s_g_b + t * s_g_t + h).to(tl.float32))
        bt = tl.load(beta_ptr + b * s_be_b + t * s_be_t + h).to(tl.float32)
        sk = tl.sum(S * kn[None, :], 1)
        sq = tl.sum(S * qn[None, :], 1)
        u = bt * (vv - alpha * sk)
        S = alpha * S + u[:, None] * kn[None, :]
        dst = tl.load(tbl_ptr + b * s_tbl_b + (c0 + 1 + t) % (T + 1)).to(tl.int64)
        tl.store(st_ptr + tl.maximum(dst, 0) * s_st_s + tile, cast(S, st_ptr.dtype.element_ty, EXACT),
                 mask=mask & tl.where(dst >= 0, True, False))   # i1 scalar (common/jit.py)
        o = alpha * sq + u * tl.sum(kn * qn, 0)
        tl.store(o_ptr + b * s_o_b + t * s_o_t + h * s_o_h + rows, cast(o, o_ptr.dtype.element_ty, EXACT), mask=in_v)
