"""Triton kernels for the per-draft speculative baseline (vLLM's speculative path).

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

import os

import triton
import triton.language as tl

from ..reference import L2_EPS
from ..common.jit import cast, silu, softplus
from ..common.launch import Launch, last_contig, out_like
from ..common.offline import compile_launch

# Launch table: rows (max_batch, rows per program, num_warps); the first row with batch <=
# max_batch wins (None: any). Rows per program is clamped to next_pow2(P or dv). A program's
# fp32 tile is rows x next_pow2(cols) (16 x 128 = 8 KiB: 16 registers per thread at 4 warps);
# the eager kernels' tiles, since per token the work is the eager step's.
CONFIGS: dict[str, list[tuple[int | None, int, int]]] = {
    "mamba2": [(None, 16, 4)],
    "gdn": [(4, 8, 1), (64, 16, 2), (None, 32, 4)],
}


def pick_config(family: str, batch: int, rows: int, override: dict | None = None) -> dict:
    """{BLOCK_R, num_warps} for a family at this batch (override: tuning)."""
    for max_b, br, nw in CONFIGS[family]:
        if max_b is None or batch <= max_b:
            break
    cfg = {"BLOCK_R": br, "num_warps": nw}
    if override:
        cfg.update(override)
    cfg["BLOCK_R"] = min(cfg["BLOCK_R"], triton.next_power_of_2(rows))
    return cfg


def interpreting() -> bool:
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # older triton without knobs
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ----------------------------------------------------------------------------- Mamba-2
@triton.jit
def _mamba2_perdraft_kernel(
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
    live = src >= 0
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
                 mask=mask & (dst >= 0))
        y = tl.sum(S * Cv[None, :], axis=1) + Dh * xv
        if HAS_Z:
            zv = tl.load(z_ptr + b * s_z_b + t * s_z_t + h * s_z_h + offs_p, mask=mask_p, other=0.0).to(tl.float32)
            y = y * silu(zv)
        tl.store(y_ptr + b * s_y_b + t * s_y_t + h * s_y_h + offs_p, cast(y, y_ptr.dtype.element_ty, EXACT), mask=in_p)


# ----------------------------------------------------------------------------- GDN
@triton.jit
def _gdn_perdraft_kernel(
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
    live = src >= 0
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
                 mask=mask & (dst >= 0))
        o = alpha * sq + u * tl.sum(kn * qn, 0)
        tl.store(o_ptr + b * s_o_b + t * s_o_t + h * s_o_h + rows, cast(o, o_ptr.dtype.element_ty, EXACT), mask=in_v)


# ----------------------------------------------------------------------------- launchers
def _check(states, slot_table, start, batch, T):
    if states.stride(-1) != 1:
        raise ValueError("states need a unit stride in their last dim")
    if slot_table.shape != (batch, T + 1) or slot_table.stride(1) != 1:
        raise ValueError(f"slot_table must be [batch, 1 + T] = [{batch}, {T + 1}] with a unit last stride, "
                         f"got {tuple(slot_table.shape)}")
    if start.shape != (batch,) or not start.is_contiguous():
        raise ValueError(f"start must be a contiguous [{batch}] tensor")


def plan_mamba2(states, slot_table, start, x, dt, A, B, C, D, dt_bias, z=None, out=None, config=None):
    """([launch], y) of mamba2 per-draft verification (see verify_mamba2)."""
    x, dt, B, C, z, A, D, dt_bias = (last_contig(t) for t in (x, dt, B, C, z, A, D, dt_bias))
    bsz, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    _check(states, slot_table, start, bsz, T)
    y = out_like(out, x)
    if bsz == 0 or T == 0:
        return [], y
    cfg = pick_config("mamba2", bsz, P, config)
    zz = z if z is not None else x
    grid = (triton.cdiv(P, cfg["BLOCK_R"]), H, bsz)
    launch = Launch(_mamba2_perdraft_kernel, grid, (
        states, slot_table, start, x, dt, A, B, C, D, dt_bias, zz, y,
        P, N, H // G,
        states.stride(0), states.stride(1), states.stride(2), slot_table.stride(0),
        x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1),
        B.stride(0), B.stride(1), B.stride(2), C.stride(0), C.stride(1), C.stride(2),
        zz.stride(0), zz.stride(1), zz.stride(2), y.stride(0), y.stride(1), y.stride(2)),
        dict(T=T, BLOCK_P=cfg["BLOCK_R"], BLOCK_N=triton.next_power_of_2(N), HAS_Z=z is not None,
             EXACT=interpreting(), num_warps=cfg["num_warps"]))
    return [launch], y


def verify_mamba2(states, slot_table, start, x, dt, A, B, C, D, dt_bias, z=None, out=None, config=None):
    """Launch mamba2 per-draft verification; returns y [b, T, H, P] (padded rows: 0)."""
    launches, y = plan_mamba2(states, slot_table, start, x, dt, A, B, C, D, dt_bias, z, out, config)
    for launch in launches:
        launch()
    return y


def plan_gdn(states, slot_table, start, q, k, v, g, beta, scale=None, out=None, config=None):
    """([launch], o) of GDN per-draft verification (see verify_gdn)."""
    q, k, v, g, beta = (last_contig(t) for t in (q, k, v, g, beta))
    bsz, T, Hv, dv = v.shape
    Hk, dk = q.shape[2], q.shape[3]
    if Hv % Hk:
        raise ValueError(f"value heads ({Hv}) must be a multiple of key heads ({Hk})")
    _check(states, slot_table, start, bsz, T)
    o = out_like(out, v)
    if bsz == 0 or T == 0:
        return [], o
    scale = dk ** -0.5 if scale is None else float(scale)
    cfg = pick_config("gdn", bsz, dv, config)
    grid = (triton.cdiv(dv, cfg["BLOCK_R"]), Hv, bsz)
    launch = Launch(_gdn_perdraft_kernel, grid, (
        states, slot_table, start, q, k, v, g, beta, o,
        states.stride(0), states.stride(1), states.stride(2), slot_table.stride(0),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        o.stride(0), o.stride(1), o.stride(2), scale),
        dict(HV=Hv, HK=Hk, DK=dk, DV=dv, T=T, BLOCK_V=cfg["BLOCK_R"], BLOCK_K=triton.next_power_of_2(dk),
             EXACT=interpreting(), EPS=L2_EPS, num_warps=cfg["num_warps"]))
    return [launch], o


def verify_gdn(states, slot_table, start, q, k, v, g, beta, scale=None, out=None, config=None):
    """Launch GDN per-draft verification; returns o [b, T, Hv, dv] (padded rows: 0)."""
    launches, o = plan_gdn(states, slot_table, start, q, k, v, g, beta, scale, out, config)
    for launch in launches:
        launch()
    return o


def compile_offline(launch: Launch, arch: int = 90, asm: bool = False) -> dict:
    """A recorded launch compiled for CUDA sm_<arch> without a GPU: offline.compile_launch's
    resource use ('regs', 'spill_stores', 'spill_loads', 'stack', ...; 'asm' with asm=True; EXACT compiled
    as False). Plans may be built from tensors on the 'meta' device."""
    return compile_launch(launch.kernel, launch.args, launch.meta, arch, asm)
