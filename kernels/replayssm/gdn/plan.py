"""GDN launch planning: which kernels an op launches, on which grid, with which table row.

`plan(op, ...)` returns the op's launches (common.launch.Launch, each naming its table row), in
order; the ops in __init__.py run them. The same launches compile offline for sm_90 without a
GPU (common.offline). Per-sequence decisions (flush or not, cursor moves) are made on the
device, so every plan has a fixed grid (CUDA-graph capturable).
"""
from __future__ import annotations

import os

import torch
import triton

from ..common.jit import clear_lo_stale_kernel
from ..common.launch import Launch, cache_lines, last_contig, pdl_meta, state_scratch, tma_rows
from ..common.mma import exact_b_holds, mma_precision, split_precision
from ..common.offline import compile_launch
from ..reference import L2_EPS
from ..state import CURSOR_MASK, EPOCH_ROWS, GDNReplayState
from .eager import gdn_eager_kernel
from .flush_step import gdn_flush_step_kernel
from .fold import (gdn_commit_balanced_kernel, gdn_commit_cursor_kernel, gdn_dual_2pass_kernel, gdn_fold_kernel,
                   gdn_refresh_lo_kernel)
from .options import GDNOptions
from .replay import gdn_replay_kernel
from .route import gdn_route_defer_kernel, gdn_route_kernel
from .table import TABLE
from .verify_kernel import gdn_verify_kernel

OPS = ("eager", "replay", "flush", "commit", "verify")
EVICT_POLICIES = ("evict_first", "evict_last", "")    # a state load's / store's L2 policy ("": none)
MAX_BLOCK_L = 16        # buffer entries per chunk (fold); the replay step reads the buffer as one chunk
VERIFY_CHUNK_K = 32     # dk columns per MMA step of the verify kernel's loop over the state tile


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def pick(op: str, opt: GDNOptions, *, batch: int, heads: int, dv: int, dk: int, L: int = 1,
         override: dict | None = None, state_bytes: int = 4, dual: bool = False) -> dict:
    """The launch config {BLOCK_V, BLOCK_K, BLOCK_L, num_warps, ..., "row": name} of `op`'s table
    row for this case, with `override` on top (an override that sets the tile, BLOCK_V or
    num_warps, without a maxnreg drops the row's register budget)."""
    row = (opt.table or TABLE).pick(op, batch=batch, heads=heads, state_bytes=state_bytes, dual=dual,
                     route=opt.small_batch_route, dual_route_heads=opt.dual_route_heads)
    cfg = {"BLOCK_L": min(triton.next_power_of_2(L), MAX_BLOCK_L), **row.params}
    if override:
        if ("BLOCK_V" in override or "num_warps" in override) and "maxnreg" not in override:
            cfg.pop("maxnreg", None)
        cfg.update(override)
    cfg["BLOCK_V"] = min(cfg["BLOCK_V"], triton.next_power_of_2(dv))
    cfg["BLOCK_K"] = triton.next_power_of_2(dk)
    cfg["row"] = row.name
    return cfg


def _rows_index(state_indices: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    if state_indices is None:
        return torch.arange(batch, dtype=torch.int32, device=device)
    return state_indices


def _ckpt_args(ck):
    """(data, scale-or-dummy, is_fp8) of a state.Checkpoint."""
    if ck.scale is not None:
        return ck.data, ck.scale, True
    return ck.data, ck.data, False


def _hi_lo_args(rs: GDNReplayState):
    hi, hi_sc, hi_fp8 = _ckpt_args(rs.hi)
    lo, lo_sc, lo_fp8 = _ckpt_args(rs.lo) if rs.lo is not None else (hi, hi_sc, False)
    return [hi, hi_sc, lo, lo_sc], dict(HI_FP8=hi_fp8, LO_FP8=lo_fp8)


def _buffer_args(rs: GDNReplayState):
    """[u, k, g, v, beta] (v/beta: dummies outside dual mode), dual flag."""
    dual = rs.mode == "dual"
    return [rs.u, rs.k, rs.g, rs.v if dual else rs.u, rs.beta if dual else rs.g], dual


def _check_rs(rs: GDNReplayState, nprog: int) -> None:
    L = rs.capacity
    if L > CURSOR_MASK:
        raise ValueError(f"buffer_len {L} too large for the cursor word (<= {CURSOR_MASK})")
    if nprog >= 1 << 15:
        raise ValueError(f"{nprog} programs per sequence: too many for the ticket cursor; raise BLOCK_V")
    for t in [rs.hi.data, rs.cursor, *rs.buffers()] + ([rs.lo.data] if rs.lo is not None else []):
        if not t.is_contiguous():
            raise ValueError("ReplaySSM state tensors must be contiguous")


def _strides(*ts, dims: int):
    return [st for t in ts for st in t.stride()[:dims]]


def _common_meta(cfg: dict, **kw) -> dict:
    return dict(BLOCK_V=cfg["BLOCK_V"], BLOCK_K=cfg["BLOCK_K"], INTERP=interpreting(), EPS=L2_EPS,
                num_warps=cfg["num_warps"], **kw)


def plan_eager(state, q, k, v, g, beta, state_indices, scale, o, opt: GDNOptions) -> Launch:
    batch, Hv, dv = v.shape
    Hk, dk = k.shape[1], k.shape[2]
    assert state.is_contiguous() and tuple(state.shape[1:]) == (Hv, dv, dk), state.shape
    cfg = pick("eager", opt, batch=batch, heads=Hv, dv=dv, dk=dk, override=opt.overrides_for("eager"),
               state_bytes=state.element_size())
    tiles = int(cfg.get("TILES", 1))
    if tiles not in (1, 2):
        raise ValueError(f"config TILES={tiles}: allowed 1, 2")
    grid = (triton.cdiv(dv, cfg["BLOCK_V"] * tiles), Hv, batch)
    args = [q, k, v, g, beta, o, _rows_index(state_indices, batch, v.device), state.shape[0], state,
            *_strides(q, k, v, g, beta, o, dims=2), scale]
    meta = _common_meta(cfg, HV=Hv, HK=Hk, DK=dk, DV=dv, TILES=tiles)
    _launch_options(meta, cfg)
    _evict_options(meta, cfg)
    return Launch(gdn_eager_kernel, grid, args, meta, cfg["row"])


def replay_meta(cfg: dict, L: int, dv: int, group: int, K: int | None = None) -> dict:
    """Resolve the replay kernel's shape options (see gdn_replay_kernel).

    BLOCK_V = rows per chunk (BLOCK_R); NR chunks of rows per program (clamped to the head);
    HP value heads per program (the largest power of two <= HP dividing Hv/Hk); PF prefetch
    hints (0 none, 1 L2, 2 L1) PF_DIST chunks ahead; PREFETCH: cursor-independent buffer reads.
    The buffer is read as one chunk of BLOCK_L = next_pow2(min(K, L)) entries: a step sees
    n <= K - 1 committed entries (every step or commit that reaches K flushes), so with
    K < L the rows a PREFETCH read issues stay those the traffic model counts (a BLOCK_L in
    cfg is for other kernels)."""
    br = cfg["BLOCK_V"]
    nr = max(1, min(int(cfg.get("NR", 1)), triton.cdiv(dv, br)))
    hp = 1
    while hp * 2 <= int(cfg.get("HP", 1)) and group % (hp * 2) == 0:
        hp *= 2
    return dict(BLOCK_R=br, NR=nr, HP=hp, BLOCK_L=triton.next_power_of_2(min(K or L, L)),
                PREFETCH=bool(cfg.get("PREFETCH", False)),
                PF=int(cfg.get("PF", 0)), PF_DIST=max(1, int(cfg.get("PF_DIST", 1))),
                LOOP_STAGES=cfg.get("LOOP_STAGES"))


def _nxt(rs: GDNReplayState, batch: int, device) -> torch.Tensor:
    """Per-row scratch [>= batch + 1] int32 that a SPLIT replay step's two launches share, and
    a commit's (the flushing rows and their count). Kept on the state object, so one
    allocation serves every step and a captured graph: both callers ask for batch + 1, so a
    replay step and a commit at one batch size never reallocate it under each other's graphs."""
    return state_scratch(rs, "_gdn_nxt", batch + 1, device)


def plan_replay(rs: GDNReplayState, q, k, v, g, beta, state_indices, scale, o, opt: GDNOptions) -> list[Launch]:
    """Launch plan(s) of one replay step: [replay] (fused flush, ticket cursor) or, when the
    config says SPLIT, [output-only replay, flush step] (the second a programmatic dependent
    launch of the first where the GPU has them: options.pdl); or, when it says
    EAGER_ROUTE, [the eager route] (gdn_route_kernel: a flush at every step, for small
    batches)."""
    batch, Hv, dv = v.shape
    Hk, dk = k.shape[1], k.shape[2]
    L = rs.capacity
    config = opt.overrides_for("replay")
    cfg = pick("replay", opt, batch=batch, heads=Hv, dv=dv, dk=dk, L=L, override=config,
               state_bytes=rs.read_ckpt.data.element_size(), dual=rs.mode == "dual")
    if cfg.get("EAGER_ROUTE"):
        return [_plan_replay_eager(rs, q, k, v, g, beta, state_indices, scale, o, cfg)]
    rm = replay_meta(cfg, L, dv, Hv // Hk, rs.flush_period)
    split = bool(cfg.get("SPLIT", False))
    nrs = triton.cdiv(dv, rm["BLOCK_R"] * rm["NR"])
    grid = ((Hv // Hk) // rm["HP"] * nrs, Hk, batch)
    nprog = grid[0] * Hk
    _check_rs(rs, nprog)
    ck, ck_meta = _hi_lo_args(rs)
    buf, dual = _buffer_args(rs)
    idx = _rows_index(state_indices, batch, v.device)
    nxt = _nxt(rs, batch, v.device) if split else rs.cursor
    rd = rs.read_ckpt.data
    kind = {torch.bfloat16: 1, torch.float16: 2, torch.float8_e4m3fn: 3}.get(rd.dtype, 0)
    pk = 4 // rd.element_size() if kind and cfg.get("PACK", True) else 1
    if dk % pk:
        pk = 1
    # TMA: the output route's state chunks through a descriptor, over the fp32 copy or the
    # 16/8-bit copy's int32 words (as _rd_dots reads them); a table row's where the state and the
    # GPU allow it, a config's TMA True raises where they do not
    # RD_MMA: a 16-bit read copy's dots as one tensor-core product per chunk (_rd_dots_mma), its
    # descriptor over the 16-bit elements; tl.dot needs every tile dim >= 16
    rd_mma = bool(cfg.get("RD_MMA")) and kind in (1, 2) and min(rm["BLOCK_R"], cfg["BLOCK_K"]) >= 16
    descs = None
    if cfg.get("TMA") and (pk > 1 or rd.dtype == torch.float32):
        asked = True if (config or {}).get("TMA") else None
        if rd_mma:
            descs = tma_rows(rd, dk, [(rm["BLOCK_R"], cfg["BLOCK_K"])], "TMA", asked)
        else:
            words = rd.view(torch.int32) if pk > 1 else rd
            descs = tma_rows(words, dk // pk, [(rm["BLOCK_R"], cfg["BLOCK_K"] // pk)], "TMA", asked)
    args = [q, k, v, g, beta, o, idx, rs.cursor.shape[0], *ck, *buf, rs.cursor, nxt, descs[0] if descs else rd,
            *_strides(q, k, v, g, beta, o, dims=2), scale, rs.flush_period, nprog]
    (rd_lpr, rd_ls), (hi_lpr, hi_ls) = cache_lines(rd, dk), cache_lines(rs.hi.data, dk)
    u_lpr = triton.next_power_of_2(triton.cdiv(rm["BLOCK_R"] * rs.u.element_size(), 128))
    meta = dict(BLOCK_K=cfg["BLOCK_K"], INTERP=interpreting(), EPS=L2_EPS, num_warps=cfg["num_warps"],
                HV=Hv, HK=Hk, DK=dk, DV=dv, L=L, DUAL=dual, SPLIT=split, PK=pk, RD_KIND=kind, RD_LPR=rd_lpr,
                RD_LS=rd_ls, HI_LPR=hi_lpr, HI_LS=hi_ls, U_LPR=u_lpr, TMA=descs is not None, RD_MMA=rd_mma, **rm,
                **ck_meta)
    _launch_options(meta, cfg)
    plans = [Launch(gdn_replay_kernel, grid, args, meta, cfg["row"])]
    if split:
        fc = _flush_step_row(rs, batch, "flush_step", config, opt)
        if fc.get("TWO_PASS") and _dual_2pass_fits(rs):     # opt-in (F_TWO_PASS; see CONFIGS)
            plans.append(_plan_dual_2pass(rs, q, o, idx, nxt, batch, scale, fc, 1, write_o=True, compact=False))
        else:
            plans.append(_plan_flush_step(rs, q, o, idx, nxt, batch, dk, scale, fc, rows_per=1))
        pdl = pdl_meta(v.device, bool(cfg.get("PDL", opt.pdl)))     # the flush step behind the output launch
        meta["GDC"] = pdl["GDC"]
        plans[1].meta.update(pdl)
    return plans


def _flush_step_row(rs: GDNReplayState, batch: int, op: str, config, opt: GDNOptions) -> dict:
    """The flush step's launch config: table op "flush_step" or "commit" (the high copy's
    bytes), with the override's "F_<KEY>" entries over its keys."""
    _, hv, dv, dk = rs.hi.data.shape
    fc = pick(op, opt, batch=batch, heads=hv, dv=dv, dk=dk, L=rs.capacity, state_bytes=rs.hi.data.element_size(),
              dual=rs.mode == "dual")
    fc.update({kk[2:]: vv for kk, vv in (config or {}).items() if kk.startswith("F_")})
    fc["BLOCK_V"] = min(fc["BLOCK_V"], triton.next_power_of_2(dv))
    return fc


def _plan_flush_step(rs: GDNReplayState, q, o, idx, nxt, batch: int, dk: int, scale, fc: dict, rows_per: int,
                     write_o: bool = True, compact: bool = False):
    """Plan of gdn_flush_step_kernel over `batch` rows whose last kept entry is nxt[b] (the
    SPLIT replay step's second launch; the commit's fold with write_o False, compact: nxt
    lists the flushing rows). fc: its launch row (_flush_step_row). rows_per: the most entries
    a row gains per call (step 1, commit T), which sizes the workers per head block,
    NW = cdiv(batch * rows_per, K): a staggered batch's flushing rows in one round."""
    _, Hv, dv, _ = rs.hi.data.shape
    Hk, L, K = rs.k.shape[2], rs.capacity, max(rs.flush_period, 1)
    dual = rs.mode == "dual"
    fm = replay_meta(fc, L, dv, Hv // Hk, K)
    nw = max(1, min(batch, triton.cdiv(batch * rows_per, K) * int(fc.get("NW_MUL", 1))))
    grid = ((Hv // Hk) // fm["HP"] * triton.cdiv(dv, fm["BLOCK_R"] * fm["NR"]), Hk, nw)
    ck, ck_meta = _hi_lo_args(rs)
    buf, _ = _buffer_args(rs)
    hi_lpr, hi_ls = cache_lines(rs.hi.data, dk)
    # TMA (a row's or config's F_TMA; the matrix-product fold of 16/32-bit high copies, as timed;
    # the rank-1 fold took 202 registers with it): the high chunks through a descriptor where the
    # state and GPU allow it
    descs = lo_desc = None
    if fc.get("TMA") and _fold_mma_fits(rs, fc, fm["BLOCK_R"]):
        descs = tma_rows(rs.hi.data, dk, [(fm["BLOCK_R"], fc["BLOCK_K"])], "F_TMA", None)
    # ST_TMA: the stores too, where every chunk lies inside its head (a bulk store writes the
    # whole box: no row mask) and the low copy, if any, is a 16-bit one (fp8 stores scales too)
    st_tma = bool(fc.get("ST_TMA") and descs and dv % (fm["BLOCK_R"] * fm["NR"]) == 0)
    if st_tma and dual and rs.lo.scale is None:      # the 16-bit low copy through its own descriptor
        lo_desc = tma_rows(rs.lo.data, dk, [(fm["BLOCK_R"], fc["BLOCK_K"])], "F_ST_TMA", None)
        st_tma = lo_desc is not None
    args = [q, o, idx, nxt, *ck, *buf, rs.cursor, descs[0] if descs else rs.hi.data,
            lo_desc[0] if lo_desc else ck[2], *_strides(q, o, dims=2), scale, rs.flush_period, batch]
    meta = dict(BLOCK_K=fc["BLOCK_K"], INTERP=interpreting(), EPS=L2_EPS, num_warps=fc["num_warps"], TMA=bool(descs),
                ST_TMA=st_tma,
                HV=Hv, HK=Hk, DK=dk, DV=dv, L=L, DUAL=dual, BLOCK_R=fm["BLOCK_R"], NR=fm["NR"], HP=fm["HP"],
                NW=nw, BLOCK_B=triton.next_power_of_2(batch), PF=fm["PF"], PF_DIST=fm["PF_DIST"],
                HI_LPR=hi_lpr, HI_LS=hi_ls, WRITE_O=write_o, COMPACT=compact, **ck_meta)
    _launch_options(meta, fc)
    _evict_options(meta, fc)
    if _fold_mma_fits(rs, fc, fm["BLOCK_R"]):
        meta.update(FOLD_MMA=True, BLOCK_L=max(16, triton.next_power_of_2(L)),
                    FOLD_PREC=_fold_precision(rs, fc),
                    P_PREC=_keys_precision(rs, fc, "P_PREC"),
                    SMALL_PREC=fc.get("SMALL_PREC") or split_precision(torch.float32, torch.float32),
                    GRAM_PREC=fc.get("GRAM_PREC") or mma_precision(rs.k.dtype, rs.k.dtype, "tf32x3t"))
    return Launch(gdn_flush_step_kernel, grid, args, meta, fc["row"])


def _fold_mma_fits(rs: GDNReplayState, fc: dict, block_r: int) -> bool:
    """The row's FOLD_MMA applies (the flush step's matrix-product fold, see the kernel): a 16-
    or 32-bit high copy (fp8 keeps its rank-1 fold), tiles tl.dot takes (>= 16), at most 64
    entries (unit_tri_inv_minus_eye)."""
    return (bool(fc.get("FOLD_MMA")) and rs.hi.data.dtype != torch.float8_e4m3fn
            and min(block_r, fc["BLOCK_K"]) >= 16 and rs.capacity <= 64)


def _keys_precision(rs: GDNReplayState, fc: dict, key: str, fallback: str | None = None) -> str:
    """The precision of a product of an fp32 side with the raw keys: the row's `key` where its
    premise holds for the buffer's key dtype (mma.exact_b_holds: "bf16x3e" needs bf16 or fp8
    keys), else `fallback`, by default the truncation split (mma.split_precision)."""
    prec = fc.get(key)
    if prec and exact_b_holds(prec, rs.k.dtype):
        return prec
    return fallback or split_precision(torch.float32, rs.k.dtype)


def _fold_precision(rs: GDNReplayState, fc: dict) -> str:
    """The matrix-product fold's precision (fp32 u x the raw keys): the row's FOLD_PREC where
    the keys allow it (_keys_precision), else the truncation split where it says FOLD_SPLIT,
    else mma_precision's ("tf32x3" for fp32 keys)."""
    return _keys_precision(rs, fc, "FOLD_PREC",
                           None if fc.get("FOLD_SPLIT") else mma_precision(torch.float32, rs.k.dtype, "tf32x3"))


def route_period(*, batch: int, heads: int, head_dim: int, read_bytes: int, flush_period: int,
                 dual: bool = False, key_dim: int, buffer_len: int, options: GDNOptions | None = None) -> int:
    """The small-batch route's period k at this shape (0: the step buffers): its row's ROUTE_K
    (default 1, a flush every step), at most the flush period. heads, head_dim: value heads and
    dv; key_dim: dk; read_bytes: bytes per element of the copy the buffered step reads (dual:
    the low copy). For traffic models and byte counts (reference.gdn_replay_step's `route`)."""
    opt = options or GDNOptions()
    cfg = pick("replay", opt, batch=batch, heads=heads, dv=head_dim, dk=key_dim, L=buffer_len,
               override=opt.overrides_for("replay"), state_bytes=read_bytes, dual=dual)
    return _route_k(cfg, flush_period) if cfg.get("EAGER_ROUTE") else 0


def _route_k(cfg: dict, flush_period: int) -> int:
    k = cfg.get("ROUTE_K", 1)
    if type(k) is not int or not 1 <= k <= 127:     # (not a bool: True is an int)
        raise ValueError(f"config ROUTE_K={k!r}: allowed an int 1..127")
    return min(k, flush_period)


def state_route_period(rs: GDNReplayState, k, v, options: GDNOptions | None = None) -> int:
    """route_period for a step of `rs` with inputs k [b, Hk, dk], v [b, Hv, dv]."""
    return route_period(batch=v.shape[0], heads=v.shape[1], head_dim=v.shape[2], key_dim=k.shape[2],
                        buffer_len=rs.capacity, read_bytes=rs.read_ckpt.data.element_size(),
                        flush_period=rs.flush_period, dual=rs.mode == "dual", options=options)


def _plan_replay_eager(rs: GDNReplayState, q, k, v, g, beta, state_indices, scale, o, cfg: dict):
    """Plan of the small-batch route: one [BLOCK_V, dk] tile of the high checkpoint per program,
    grid (cdiv(dv, BLOCK_V), Hv, batch). ROUTE_K 1 (default): gdn_route_kernel, a flush
    at every step; k >= 2 (at most the flush period): gdn_route_defer_kernel, the state written
    every k-th step."""
    batch, Hv, dv = v.shape
    Hk, dk = k.shape[1], k.shape[2]
    rk = _route_k(cfg, rs.flush_period)
    grid = (triton.cdiv(dv, cfg["BLOCK_V"]), Hv, batch)
    _check_rs(rs, grid[0] * Hv)
    ck, ck_meta = _hi_lo_args(rs)
    buf, dual = _buffer_args(rs)
    rs.routed = rs.routed or dual     # its low copies may go stale: verify refreshes them first
    rs.deferred = rs.deferred or rk > 1     # its cursor words carry epochs: verify clears them first
    idx = _rows_index(state_indices, batch, v.device)
    head = [q, k, v, g, beta, o, idx, rs.cursor.shape[0], ck[0], rs.cursor] + ([rs.route_epoch] if rk > 1 else [])
    args = [*head, *_strides(q, k, v, g, beta, o, dims=2), scale, grid[0] * Hv, ck[1], *buf]
    meta = _common_meta(cfg, HV=Hv, HK=Hk, DK=dk, DV=dv, L=rs.capacity, DUAL=dual, HI_FP8=ck_meta["HI_FP8"])
    _launch_options(meta, cfg)
    _evict_options(meta, cfg)
    if rk > 1:
        if cfg["BLOCK_V"] % EPOCH_ROWS:
            raise ValueError(f"config BLOCK_V={cfg['BLOCK_V']} with ROUTE_K={rk}: allowed multiples of "
                             f"{EPOCH_ROWS} (state.EPOCH_ROWS)")
        return Launch(gdn_route_defer_kernel, grid, args, dict(meta, RK=rk, EP_ROWS=EPOCH_ROWS), cfg["row"])
    return Launch(gdn_route_kernel, grid, args, dict(meta, PENDING_CALL=bool(cfg.get("PENDING_CALL", False))),
                  cfg["row"])


def plan_fold(rs: GDNReplayState, idx, add, threshold: int, opt: GDNOptions, config=None) -> Launch:
    """gdn_fold_kernel over rows idx: fold where cursor (+ add) >= threshold (flush: add None,
    threshold 1). config: the override (default: options' "fold")."""
    rows = idx.shape[0]
    _, Hv, dv, dk = rs.hi.data.shape
    L = rs.capacity
    cfg = pick("fold", opt, batch=rows, heads=Hv, dv=dv, dk=dk, L=L,
               override=opt.overrides_for("fold") if config is None else config)
    nt = triton.cdiv(dv, cfg["BLOCK_V"])
    _check_rs(rs, nt * Hv)
    ck, ck_meta = _hi_lo_args(rs)
    buf, dual = _buffer_args(rs)
    args = [idx, rs.cursor.shape[0], idx if add is None else add, *ck, *buf, rs.cursor, threshold, nt * Hv]
    meta = _common_meta(cfg, HV=Hv, HK=rs.k.shape[2], DK=dk, DV=dv, L=L, HAS_ADD=add is not None, DUAL=dual,
                        **ck_meta)
    return Launch(gdn_fold_kernel, (nt, Hv, rows), args, meta, cfg["row"])


def _f32_precision(a: torch.dtype, b: torch.dtype, opt: GDNOptions) -> str:
    """Verify MMA precision of operands stored as a (the fp32 side when one is) and b, per
    options.verify_f32_precision."""
    if opt.verify_f32_precision == "split":
        return split_precision(a, b)
    return mma_precision(a, b, opt.verify_f32_precision)


def plan_verify(rs: GDNReplayState, q, k, v, g, beta, state_indices, scale, o, opt: GDNOptions) -> Launch:
    """The verify launch (gdn_verify_kernel)."""
    batch, T, Hv, dv = v.shape
    Hk, dk = k.shape[2], k.shape[3]
    L = rs.capacity
    if T > L:
        raise ValueError(f"draft window {T} exceeds buffer_len {L}")
    if T > 16:
        raise ValueError(f"draft window {T} > 16 is not supported by the verify kernel")
    ov = opt.overrides_for("verify")
    cfg = pick("verify", opt, batch=batch, heads=Hv, dv=dv, dk=dk, L=L, override=ov,
               state_bytes=rs.read_ckpt.data.element_size())
    block_p = max(16, triton.next_power_of_2(2 * T))
    if block_p > 16 and "WIDE_BLOCK_V" in cfg and "BLOCK_V" not in ov:
        cfg["BLOCK_V"] = min(cfg["BLOCK_V"], cfg["WIDE_BLOCK_V"])
    if T in cfg.get("MAXNREG_T", {}):
        cfg.setdefault("maxnreg", cfg["MAXNREG_T"][T])
    cfg["BLOCK_V"] = max(16, cfg["BLOCK_V"])                    # tl.dot needs every dim >= 16
    cfg["BLOCK_K"] = max(16, min(cfg.get("CHUNK_K", VERIFY_CHUNK_K), cfg["BLOCK_K"]))   # dk per MMA step
    _check_rs(rs, triton.cdiv(dv, cfg["BLOCK_V"]) * Hv)
    rd, rd_sc, rd_fp8 = _ckpt_args(rs.read_ckpt)
    buf, dual = _buffer_args(rs)
    idx = _rows_index(state_indices, batch, v.device)
    # the read copy as [rows, dk] through TMA: where the config says, else at the row's TMA_T
    asked = bool(cfg["TMA"]) if "TMA" in cfg else (None if T in cfg.get("TMA_T", ()) else False)
    descs = tma_rows(rd, dk, [(cfg["BLOCK_V"], cfg["BLOCK_K"])], "TMA", asked)
    tma = descs is not None
    args = [q, k, v, g, beta, o, idx, rs.cursor.shape[0], rd, rd_sc, descs[0] if tma else rd, *buf, rs.cursor,
            *_strides(q, k, v, g, beta, o, dims=3), scale]
    meta = _common_meta(cfg, T=T, HV=Hv, HK=Hk, DK=dk, DV=dv, L=L,
                        BLOCK_L=max(16, triton.next_power_of_2(min(rs.flush_period, L))),
                        BLOCK_P=block_p, RD_FP8=rd_fp8, DUAL=dual,
                        S_PREC=cfg.get("S_PREC") or _f32_precision(rs.read_ckpt.data.dtype, k.dtype, opt),
                        K_PREC=_f32_precision(rs.k.dtype, k.dtype, opt), EARLY_BUF=bool(cfg.get("EARLY_BUF", True)),
                        SMALL_PREC=cfg.get("SMALL_PREC", _f32_precision(torch.float32, torch.float32, opt)),
                        TMA=tma, GDC=pdl_meta(v.device, bool(cfg.get("PDL", opt.pdl)))["GDC"])
    _launch_options(meta, cfg)
    return Launch(gdn_verify_kernel, (triton.cdiv(dv, cfg["BLOCK_V"]), Hv, batch), args, meta, cfg["row"])


def _launch_options(meta: dict, cfg: dict) -> None:
    """meta's num_stages (loop pipelining depth) and maxnreg (register budget) where the row or
    config sets them (else, or None, Triton's / ptxas's choice)."""
    for opt in ("num_stages", "maxnreg"):
        if cfg.get(opt) is not None:
            meta[opt] = int(cfg[opt])


def _evict_options(meta: dict, cfg: dict) -> None:
    """meta's LOAD_EV / STORE_EV (the state's L2 eviction policies: "evict_first", "evict_last"
    or "" for none): the row's or config's, else "evict_first". Always set, so that an offline
    compile (compile_offline) sees every constexpr of the launch."""
    for opt in ("LOAD_EV", "STORE_EV"):
        ev = cfg.get(opt, "evict_first")
        if ev not in EVICT_POLICIES:
            raise ValueError(f"config {opt}={ev!r}: allowed {', '.join(map(repr, EVICT_POLICIES))}")
        meta[opt] = ev


def plan_commit(rs: GDNReplayState, accepted: torch.Tensor, state_indices, opt: GDNOptions) -> list[Launch]:
    """Launch plans of a speculative commit: [the cursor launch (gdn_commit_cursor_kernel: the
    cursors moved, the flushing rows listed), then the fold]: fp32 states the flush step's
    FOLD_MMA fold (no output), or where the row's BALANCED applies (at most its max_hv value
    heads, T <= its max_t) the balanced fold (gdn_commit_balanced_kernel); dual states with a
    16-bit low copy (TWO_PASS) the two-pass kernel (gdn_dual_2pass_kernel). The fold is a
    programmatic dependent launch of the cursor launch, and that one of the verify, where the
    GPU has them (options.pdl; launch.pdl_meta). Where the row (or the
    override) says COMMIT_FOLD, or TWO_PASS cannot take the state (fp8 low copy): [the rank-1
    fold kernel, ticket cursor]."""
    batch = accepted.shape[0]
    if batch >= 1 << 15:
        raise ValueError(f"commit: batch {batch} > 32767 (the flush step packs the row index in 15 bits)")
    idx = _rows_index(state_indices, batch, accepted.device)
    config = opt.overrides_for("commit")
    fc = _flush_step_row(rs, batch, "commit", config, opt)
    two_pass = bool(fc.get("TWO_PASS")) and _dual_2pass_fits(rs)
    if config.get("COMMIT_FOLD", fc.get("COMMIT_FOLD")) or (fc.get("TWO_PASS") and not two_pass):
        return [plan_fold(rs, idx, accepted, rs.flush_period, opt, config)]
    compact = two_pass or bool(fc.get("COMPACT", False))
    nxt = _nxt(rs, batch, accepted.device)            # compact: the flushing rows, then their count
    bb = triton.next_power_of_2(batch)
    pdl = pdl_meta(accepted.device, bool(config.get("PDL", opt.pdl)))     # the fold behind the cursor launch
    cur = (opt.table or TABLE).pick("cursor", batch=batch)
    snap = Launch(gdn_commit_cursor_kernel, (1,), [idx, rs.cursor.shape[0], accepted, rs.cursor, nxt, batch,
                                                 rs.flush_period, rs.capacity - rs.flush_period],
                  dict(BLOCK_B=bb, COMPACT=compact, num_warps=cur.params["num_warps"], **pdl), cur.name)
    T = max(1, rs.capacity - rs.flush_period)          # the most a commit adds (capacity >= K + T)
    # no output: the buffers stand in for q and o (unread)
    if two_pass:
        fold = _plan_dual_2pass(rs, rs.k, rs.u, idx, nxt, batch, 1.0, fc, T, write_o=False, compact=True)
    elif compact and _balanced_fits(rs, fc):
        fold = _plan_commit_balanced(rs, idx, nxt, batch, fc)
    else:
        fold = _plan_flush_step(rs, rs.k, rs.u, idx, nxt, batch, rs.k.shape[3], 1.0, fc, rows_per=T,
                                write_o=False, compact=compact)
    fold.meta.update(pdl)
    return [snap, fold]


def _sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (the balanced commit's grid); for plans on
    the 'meta' device (offline sm_90 compiles) an H200's 132; 4 on the CPU (small grids for
    the interpreter)."""
    d = torch.device(device)
    if d.type == "cuda":
        return torch.cuda.get_device_properties(d).multi_processor_count
    return 132 if d.type == "meta" else 4


def _balanced_fits(rs: GDNReplayState, fc: dict) -> bool:
    """The commit row's BALANCED dict applies (gdn_commit_balanced_kernel): non-dual, the
    matrix-product fold (_fold_mma_fits; its chunks have >= 16 rows), at most its "max_hv"
    value heads and a draft window T = capacity - K of at most its "max_t"."""
    bal = fc.get("BALANCED")
    return bool(bal) and rs.mode != "dual" and _fold_mma_fits(rs, fc, 16) \
        and rs.hi.data.shape[1] <= bal.get("max_hv", 1 << 30) \
        and rs.capacity - rs.flush_period <= bal.get("max_t", 1 << 30)


def _plan_commit_balanced(rs: GDNReplayState, idx, lst, batch: int, fc: dict):
    """Plan of gdn_commit_balanced_kernel over the rows lst lists. fc["BALANCED"]: "per_sm"
    programs per SM, and its own launch keys ("maxnreg", "num_warps", "BLOCK_V": rows per
    chunk, "PF": prefetch hints) over the commit row's."""
    fc = {**fc, **{k: v for k, v in fc["BALANCED"].items() if k not in ("per_sm", "max_hv", "max_t")}}
    _, Hv, dv, dk = rs.hi.data.shape
    br = max(16, min(fc["BLOCK_V"], triton.next_power_of_2(dv)))
    nc = triton.cdiv(dv, br)
    nprog = _sm_count(lst.device) * int(fc["BALANCED"]["per_sm"])
    most = max(1, triton.cdiv(batch * Hv * nc, nprog))          # chunks a program folds, at most
    hi_lpr, hi_ls = cache_lines(rs.hi.data, dk)
    fm = replay_meta(fc, rs.capacity, dv, 1)
    descs = tma_rows(rs.hi.data, dk, [(br, fc["BLOCK_K"])], "F_TMA", None) if fc.get("TMA") else None
    args = [lst, idx, rs.hi.data, rs.u, rs.k, rs.g, descs[0] if descs else rs.hi.data, batch]
    meta = dict(HV=Hv, HK=rs.k.shape[2], DK=dk, DV=dv, L=rs.capacity, BLOCK_R=br, BLOCK_K=fc["BLOCK_K"],
                BLOCK_L=max(16, triton.next_power_of_2(rs.capacity)), NSEG=triton.cdiv(most - 1, nc) + 1,
                PF=fm["PF"], PF_DIST=fm["PF_DIST"], HI_LPR=hi_lpr, HI_LS=hi_ls, FOLD_PREC=_fold_precision(rs, fc),
                INTERP=interpreting(), EPS=L2_EPS, num_warps=fc["num_warps"], TMA=bool(descs),
                ST_TMA=bool(descs and fc.get("ST_TMA") and dv % br == 0))
    _launch_options(meta, fc)
    return Launch(gdn_commit_balanced_kernel, (nprog,), args, meta, fc["row"])


def _dual_2pass_fits(rs: GDNReplayState) -> bool:
    """gdn_dual_2pass_kernel's case: dual mode, fp32 high copy, 16-bit low copy without
    scales (an fp8 copy's per-row scale needs the whole row at once), at most 64 entries."""
    return (rs.mode == "dual" and rs.hi.data.dtype == torch.float32 and rs.hi.scale is None
            and rs.lo.data.dtype in (torch.bfloat16, torch.float16) and rs.capacity <= 64)


def _plan_dual_2pass(rs: GDNReplayState, q, o, idx, lst, batch: int, scale, fc: dict, rows_per: int,
                     write_o: bool, compact: bool):
    """Plan of gdn_dual_2pass_kernel: grid (workers, Hv x row tiles), workers
    NW = cdiv(batch * rows_per, K) as the flush step's. q [b, Hk, dk], o [b, Hv, dv]: the
    step's query and output (write_o; else any tensors, unread)."""
    _, Hv, dv, dk = rs.hi.data.shape
    Hk, L, K = rs.k.shape[2], rs.capacity, max(rs.flush_period, 1)
    bv = max(16, min(fc["BLOCK_V"], triton.next_power_of_2(dv)))
    ck = max(16, min(int(fc.get("CHUNK_K", VERIFY_CHUNK_K)), triton.next_power_of_2(dk)))
    nw = max(1, min(batch, triton.cdiv(batch * rows_per, K)))
    bb = triton.next_power_of_2(batch)
    grid = (nw, Hv * triton.cdiv(dv, bv))
    args = [lst, idx, rs.cursor, rs.hi.data, rs.lo.data, rs.k, rs.g, rs.v, rs.beta, q, o,
            *_strides(q, o, dims=2), scale, rs.flush_period, batch]
    meta = dict(HV=Hv, HK=Hk, DK=dk, DV=dv, L=L, BLOCK_V=bv, BLOCK_K=ck,
                BLOCK_L=max(16, triton.next_power_of_2(L)), BLOCK_B=bb, NW=nw, NT=triton.cdiv(bb, nw),
                COMPACT=compact, WRITE_O=write_o,
                P_PREC=_keys_precision(rs, fc, "P_PREC"),
                GRAM_PREC=mma_precision(rs.k.dtype, rs.k.dtype, "tf32x3t"),
                SMALL_PREC=split_precision(torch.float32, torch.float32),
                FOLD_PREC=_keys_precision(rs, fc, "FOLD_PREC"),
                INTERP=interpreting(), EPS=L2_EPS, num_warps=fc["num_warps"])
    _launch_options(meta, fc)
    return Launch(gdn_dual_2pass_kernel, grid, args, meta, fc["row"])


def plan_refresh_lo(rs: GDNReplayState, state_indices, batch: int) -> list[Launch]:
    """The stale low copies' refresh over `batch` rows (gdn_refresh_lo_kernel), then the stale
    bits cleared (common.jit.clear_lo_stale_kernel)."""
    _, Hv, dv, dk = rs.hi.data.shape
    ck, ck_meta = _hi_lo_args(rs)
    row = TABLE.pick("refresh_lo")
    block_v = min(row.params["BLOCK_V"], triton.next_power_of_2(dv))
    idx = _rows_index(state_indices, batch, rs.cursor.device)
    meta = dict(HV=Hv, DV=dv, DK=dk, BLOCK_V=block_v, BLOCK_K=triton.next_power_of_2(dk), INTERP=interpreting(),
                num_warps=row.params["num_warps"], **ck_meta)
    return [Launch(gdn_refresh_lo_kernel, (triton.cdiv(dv, block_v), Hv, batch),
                   [idx, rs.cursor.shape[0], rs.cursor, *ck], meta, row.name),
            _plan_clear_bits(rs, idx, batch)]


def _plan_clear_bits(rs: GDNReplayState, idx, batch: int) -> Launch:
    """common.jit.clear_lo_stale_kernel over `batch` rows: their cursor words reduced to the
    count (the stale bit and the deferred route's epoch cleared)."""
    row = TABLE.pick("clear_bits")
    return Launch(clear_lo_stale_kernel, (1,), [idx, rs.cursor.shape[0], rs.cursor, batch],
                  dict(HAS_IDX=True, BLOCK_B=triton.next_power_of_2(batch), num_warps=row.params["num_warps"]),
                  row.name)


# ----------------------------------------------------------------------------- entry points
def plan(op: str, *args, options: GDNOptions | None = None, **kw) -> list[Launch]:
    """The launches of one op, in order: plan("eager", state, q, k, v, g, beta, state_indices,
    scale, o), plan("replay" | "verify", rs, q, k, v, g, beta, state_indices, scale, o),
    plan("flush", rs, slots), plan("commit", rs, accepted, state_indices). scale: a float (the
    ops default it to dk^-0.5); o: the output tensor. A replay plan may mark `rs` as routed."""
    opt = options or GDNOptions()
    if op == "eager":
        return [plan_eager(*args, **kw, opt=opt)]
    if op == "replay":
        return plan_replay(*args, **kw, opt=opt)
    if op == "verify":
        rs = args[0] if args else kw["rs"]
        return [*_verify_prelude(rs, *args[6:7], v_batch=(args[3] if len(args) > 3 else kw["v"]).shape[0]),
                plan_verify(*args, **kw, opt=opt)]
    if op == "flush":
        return [plan_fold(*_flush_args(*args, **kw), None, 1, opt)]
    if op == "commit":
        return plan_commit(*args, **kw, opt=opt)
    raise ValueError(f"op {op!r}: allowed {', '.join(OPS)}")


def _flush_args(rs: GDNReplayState, slots=None):
    if slots is None:
        slots = torch.arange(rs.cursor.shape[0], dtype=torch.int32, device=rs.cursor.device)
    return rs, slots


def _verify_prelude(rs: GDNReplayState, state_indices=None, *, v_batch: int) -> list[Launch]:
    """What a verify launches first: the refresh of low copies a routed step left stale, or the
    deferred route's epoch bits cleared (the verify reads plain counts)."""
    if rs.mode == "dual" and rs.routed:
        return plan_refresh_lo(rs, state_indices, v_batch)
    if rs.deferred:
        return [_plan_clear_bits(rs, _rows_index(state_indices, v_batch, rs.cursor.device), v_batch)]
    return []


def _scale(scale, dk: int) -> float:
    return dk ** -0.5 if scale is None else float(scale)


def _run(launches) -> None:
    for launch in launches:
        launch()


def eager_step(state, q, k, v, g, beta, state_indices=None, scale=None, out=None, options=None):
    """Eager GDN step: state [S, Hv, dv, dk] updated in place; returns o [b, Hv, dv] (v's dtype)."""
    q, k, v = last_contig(q), last_contig(k), last_contig(v)
    o = torch.empty_like(v) if out is None else out
    if v.shape[0]:
        _run(plan("eager", state, q, k, v, g, beta, state_indices, _scale(scale, k.shape[-1]), o, options=options))
    return o


def replay_step(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, scale=None, out=None, options=None):
    """ReplaySSM GDN step; returns o [b, Hv, dv] (v's dtype)."""
    q, k, v = last_contig(q), last_contig(k), last_contig(v)
    o = torch.empty_like(v) if out is None else out
    if v.shape[0]:
        _run(plan("replay", rs, q, k, v, g, beta, state_indices, _scale(scale, k.shape[-1]), o, options=options))
    return o


def flush(rs: GDNReplayState, slots: torch.Tensor | None = None, options=None) -> None:
    """Fold every committed entry of `slots` (default all) whose cursor > 0; decided on the device."""
    if slots is None or slots.shape[0]:
        _run(plan("flush", rs, slots, options=options))


def commit(rs: GDNReplayState, accepted: torch.Tensor, state_indices=None, options=None) -> None:
    """cursor += accepted[b]; fold where the cursor reached K (on the device)."""
    if accepted.shape[0]:
        _run(plan("commit", rs, accepted, state_indices, options=options))


def verify(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, scale=None, out=None, options=None):
    """Outputs of T drafts (q/k [b,T,Hk,dk], v [b,T,Hv,dv], g/beta [b,T,Hv]) -> o [b,T,Hv,dv]."""
    q, k, v = last_contig(q), last_contig(k), last_contig(v)
    o = torch.empty_like(v) if out is None else out
    if v.shape[0]:
        _run(plan("verify", rs, q, k, v, g, beta, state_indices, _scale(scale, k.shape[-1]), o, options=options))
    return o


def compile_offline(launch: Launch, arch: int = 90, asm: bool = False) -> dict:
    """A launch compiled for CUDA sm_<arch> without a GPU (common.offline.compile_launch's
    resource use; 'asm' with asm=True). Plans may be built from tensors on the 'meta' device."""
    return compile_launch(launch.kernel, launch.args, launch.meta, arch, asm)
