"""Per-draft launch planning: the launch (common.launch.Launch, naming its table row) of each
family's per-draft verification, and the runners the public ops call."""
from __future__ import annotations

import os

import triton

from ..common.launch import Launch, last_contig, out_like
from ..common.offline import compile_launch
from ..reference import L2_EPS
from .kernels import gdn_perdraft_kernel, mamba2_perdraft_kernel
from .options import PerdraftOptions
from .table import TABLE


def pick(family: str, batch: int, rows: int, options: PerdraftOptions | None = None) -> dict:
    """{BLOCK_R, num_warps, "row"} of a family's row at this batch (options' override on top);
    BLOCK_R clamped to next_pow2(rows)."""
    opt = options or PerdraftOptions()
    row = TABLE.pick(family, batch=batch)
    cfg = {**row.params, **opt.overrides_for(family), "row": row.name}
    cfg["BLOCK_R"] = min(cfg["BLOCK_R"], triton.next_power_of_2(rows))
    return cfg


def interpreting() -> bool:
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # older triton without knobs
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _check(states, slot_table, start, batch, T):
    if states.stride(-1) != 1:
        raise ValueError("states need a unit stride in their last dim")
    if slot_table.shape != (batch, T + 1) or slot_table.stride(1) != 1:
        raise ValueError(f"slot_table must be [batch, 1 + T] = [{batch}, {T + 1}] with a unit last stride, "
                         f"got {tuple(slot_table.shape)}")
    if start.shape != (batch,) or not start.is_contiguous():
        raise ValueError(f"start must be a contiguous [{batch}] tensor")


def plan_mamba2(states, slot_table, start, x, dt, A, B, C, D, dt_bias, z=None, out=None, options=None):
    """([launch], y) of mamba2 per-draft verification (see verify_mamba2)."""
    x, dt, B, C, z, A, D, dt_bias = (last_contig(t) for t in (x, dt, B, C, z, A, D, dt_bias))
    bsz, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    _check(states, slot_table, start, bsz, T)
    y = out_like(out, x)
    if bsz == 0 or T == 0:
        return [], y
    cfg = pick("mamba2", bsz, P, options)
    zz = z if z is not None else x
    grid = (triton.cdiv(P, cfg["BLOCK_R"]), H, bsz)
    launch = Launch(mamba2_perdraft_kernel, grid, (
        states, slot_table, states.shape[0], start, x, dt, A, B, C, D, dt_bias, zz, y,
        P, N, H // G,
        states.stride(0), states.stride(1), states.stride(2), slot_table.stride(0),
        x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1),
        B.stride(0), B.stride(1), B.stride(2), C.stride(0), C.stride(1), C.stride(2),
        zz.stride(0), zz.stride(1), zz.stride(2), y.stride(0), y.stride(1), y.stride(2)),
        dict(T=T, BLOCK_P=cfg["BLOCK_R"], BLOCK_N=triton.next_power_of_2(N), HAS_Z=z is not None,
             EXACT=interpreting(), num_warps=cfg["num_warps"]), cfg["row"])
    return [launch], y


def verify_mamba2(states, slot_table, start, x, dt, A, B, C, D, dt_bias, z=None, out=None, options=None):
    """Launch mamba2 per-draft verification; returns y [b, T, H, P] (padded rows: 0)."""
    launches, y = plan_mamba2(states, slot_table, start, x, dt, A, B, C, D, dt_bias, z, out, options)
    for launch in launches:
        launch()
    return y


def plan_gdn(states, slot_table, start, q, k, v, g, beta, scale=None, out=None, options=None):
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
    cfg = pick("gdn", bsz, dv, options)
    grid = (triton.cdiv(dv, cfg["BLOCK_R"]), Hv, bsz)
    launch = Launch(gdn_perdraft_kernel, grid, (
        states, slot_table, states.shape[0], start, q, k, v, g, beta, o,
        states.stride(0), states.stride(1), states.stride(2), slot_table.stride(0),
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2), g.stride(0), g.stride(1), beta.stride(0), beta.stride(1),
        o.stride(0), o.stride(1), o.stride(2), scale),
        dict(HV=Hv, HK=Hk, DK=dk, DV=dv, T=T, BLOCK_V=cfg["BLOCK_R"], BLOCK_K=triton.next_power_of_2(dk),
             EXACT=interpreting(), EPS=L2_EPS, num_warps=cfg["num_warps"]), cfg["row"])
    return [launch], o


def verify_gdn(states, slot_table, start, q, k, v, g, beta, scale=None, out=None, options=None):
    """Launch GDN per-draft verification; returns o [b, T, Hv, dv] (padded rows: 0)."""
    launches, o = plan_gdn(states, slot_table, start, q, k, v, g, beta, scale, out, options)
    for launch in launches:
        launch()
    return o


def compile_offline(launch: Launch, arch: int = 90, asm: bool = False) -> dict:
    """A recorded launch compiled for CUDA sm_<arch> without a GPU: offline.compile_launch's
    resource use ('regs', 'spill_stores', 'spill_loads', 'stack', ...; 'asm' with asm=True; EXACT compiled
    as False). Plans may be built from tensors on the 'meta' device."""
    return compile_launch(launch.kernel, launch.args, launch.meta, arch, asm)
