"""H200 tuning of the Gated DeltaNet kernels (replayssm.triton.gdn), in one process and one device call.

    python3 tools/tune_gdn.py                # on the GPU machine (TUNE_BUDGET_S: wall-clock guard, default 200)

1. copy ceiling: torch.add(x, 0, out=y) on 1 GiB -> 1 GiB (2 GiB moved), CUDA graph, median;
2. every variant (launch config / constexpr route) is compiled ahead in a pool of processes
   (warm-up launches that fill Triton's on-disk cache), then checked against the reference
   (replayssm.reference) at the very shape it is timed at, 3 steps crossing flushes
   (outputs, checkpoints, cursors); a variant that fails is printed as FAIL and not timed;
3. timing: CUDA graph of K = 16 steps over enough independent layers that the state is
   >= 1 GiB, cursors staggered (sequence i starts at i mod K, as replaybench's kernel runner),
   cold state; us = median per step per layer; GB/s from replaybench.traffic's modelled bytes;
   pct = of the copy ceiling measured here.
The pre-tuning replay kernel (git 12a9be1) is embedded below as `old` for before/after, and
vLLM 0.26.0's own GDN decode kernel (the packed recurrent kernel its decode path calls) is timed
through replaybench.runners.peers when the kernel stub (.vllm-stub) is present.
Rows print as they are measured; the script stops starting new measurements past the budget.
"""
from __future__ import annotations

import copy
import os
import statistics
import sys
import time
import traceback

T0 = time.time()
BUDGET = float(os.environ.get("TUNE_BUDGET_S", "200"))
# TUNE_MODES: comma list of what to search, for a focused probe that fits a short device call:
# batch-256 Qwen3.5-122B modes (eager-f32, eager-bf16, f32, dual-fp8, dual-bf16, bf16), their
# small-program lists (lean-f32, lean-dual-bf16, lean-bf16), flush-step lists (flush-dual-bf16,
# flush-dual-fp8, flush-bf16, flush-f32; flush-dual-bf16-b8 / -b16 / -b32 at those batches;
# flush-dual-2pass: the two-pass dual kernel as the flush step),
# route-dual-b2 / -b4 / -b8 (dual bf16: eager route vs buffered) and
# b1 / b2 / b4 / b8 / b32 / b64 (fp32 eager vs replay at that batch, both Qwen3.5 dims). Unset: everything,
# then batch 1/32 and Qwen3.5-4B around this run's winners.
FOCUS = [m for m in os.environ.get("TUNE_MODES", "").split(",") if m]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(ROOT, ".vllm-stub")):
    sys.path.insert(0, os.path.join(ROOT, ".vllm-stub"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from replayssm import reference as R  # noqa: E402
from replayssm.inputs import GDNShape, gdn_step_inputs  # noqa: E402
from replayssm.state import GDNReplayState, dtype_of  # noqa: E402
from replayssm.triton import gdn as TK  # noqa: E402
from replayssm.triton.common import cast as _cast  # noqa: E402
from replayssm.triton.gdn import _CUR_MASK, _TICKET, _ckpt_load, _ckpt_store, _fold  # noqa: E402,F401
from replaybench.timing import capture, warm_up  # noqa: E402
from replaybench.traffic import eager_traffic, gdn_layer_bytes, replay_traffic  # noqa: E402

MODELS = {"q122b": (16, 64), "q4b": (16, 32)}       # (key heads, value heads); dk = dv = 128
L = K = 16
DEV = "cuda"
MODE = {  # name: (mode, state_dtype, lo_dtype, traffic method)
    "f32": ("replay", "float32", None, "replay"),
    "bf16": ("replay", "bfloat16", None, "replay"),
    "dual-bf16": ("dual", "float32", "bfloat16", "replay-dual"),
    "dual-fp8": ("dual", "float32", "float8_e4m3", "replay-dual"),
}


def elapsed() -> float:
    return time.time() - T0


# ----------------------------------------------------------------------------- the pre-tuning kernel
@triton.jit
def _old_buffer_terms(slot64, h, kh, n, kn, qn, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr,
                      HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
                      BLOCK_V: tl.constexpr, BLOCK_L: tl.constexpr, EPS: tl.constexpr):
    NCH: tl.constexpr = (L + BLOCK_L - 1) // BLOCK_L
    acc_k = tl.zeros([BLOCK_V], tl.float32)
    acc_q = tl.zeros([BLOCK_V], tl.float32)
    r = 0.0
    for cc in range(NCH):
        c0 = (NCH - 1 - cc) * BLOCK_L
        if c0 < n:
            ei = c0 + tl.arange(0, BLOCK_L)
            em = ei < n
            e = slot64 * L + ei
            gch = tl.load(gb_ptr + e * HV + h, mask=em, other=0.0).to(tl.float32)
            tot = tl.sum(gch, 0)
            w = tl.where(em, tl.exp(r + tot - tl.cumsum(gch, 0)), 0.0)
            kb = tl.load(kb_ptr + (e * HK + kh)[:, None] * DK + cols[None, :],
                         mask=em[:, None] & cmask[None, :], other=0.0).to(tl.float32)
            kb = kb * tl.rsqrt(tl.sum(kb * kb, 1) + EPS)[:, None]
            wkk = w * tl.sum(kb * kn[None, :], 1)
            wkq = w * tl.sum(kb * qn[None, :], 1)
            U = tl.load(ub_ptr + (e * HV + h)[:, None] * DV + rows[None, :],
                        mask=em[:, None] & rmask[None, :], other=0.0).to(tl.float32)
            acc_k += tl.sum(wkk[:, None] * U, 0)
            acc_q += tl.sum(wkq[:, None] * U, 0)
            r += tot
    return acc_k, acc_q, r


@triton.jit
def _old_replay_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr,
    hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, cur_ptr,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale, flush_period, nprog,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr,
    HI_FP8: tl.constexpr, LO_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
):
    """The replay kernel as of git 12a9be1 (per-tile programs, fused flush), for before/after."""
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    GROUP: tl.constexpr = HV // HK
    kh = h // GROUP
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    o_ptrs = o_ptr + b * sob + h * soh + rows
    slot = tl.load(idx_ptr + b)
    if slot < 0:
        tl.store(o_ptrs, _cast(tl.zeros([BLOCK_V], tl.float32), o_ptr.dtype.element_ty, INTERP), mask=rmask)
    else:
        slot64 = slot.to(tl.int64)
        row_off = (slot64 * HV + h) * DV + rows
        tile = row_off[:, None] * DK + cols[None, :]
        mask2 = rmask[:, None] & cmask[None, :]
        if DUAL:
            S = _ckpt_load(lo_ptr, lo_sc_ptr, tile, row_off, mask2, rmask, LO_FP8)
        else:
            S = _ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8)
        old = tl.atomic_add(cur_ptr + slot64, _TICKET, sem="relaxed")
        n = old & _CUR_MASK
        last = (old >> 16) == nprog - 1
        do_flush = n + 1 >= flush_period
        if last:
            tl.atomic_xchg(cur_ptr + slot64, tl.where(do_flush, 0, n + 1), sem="relaxed")
        k_in = k_ptr + b * skb + kh * skh + cols
        k_raw = tl.load(k_in, mask=cmask, other=0.0)
        kn = k_raw.to(tl.float32)
        kn = kn * tl.rsqrt(tl.sum(kn * kn, 0) + EPS)
        qn = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cmask, other=0.0).to(tl.float32)
        qn = qn * (tl.rsqrt(tl.sum(qn * qn, 0) + EPS) * scale)
        v_raw = tl.load(v_ptr + b * svb + h * svh + rows, mask=rmask, other=0.0)
        vv = v_raw.to(tl.float32)
        gt = tl.load(g_ptr + b * sgb + h * sgh).to(tl.float32)
        bt = tl.load(beta_ptr + b * sbb + h * sbh).to(tl.float32)
        alpha = tl.exp(gt)
        kq = tl.sum(kn * qn, 0)
        ent = slot64 * L + n
        ok = n < L
        if pid_v == 0:
            tl.store(gb_ptr + ent * HV + h, gt, mask=ok)
            if DUAL:
                tl.store(bb_ptr + ent * HV + h, bt, mask=ok)
            if h % GROUP == 0:
                tl.store(kb_ptr + (ent * HK + kh) * DK + cols, _cast(k_raw.to(tl.float32), kb_ptr.dtype.element_ty,
                                                                     INTERP), mask=cmask & ok)
        if DUAL:
            tl.store(vb_ptr + (ent * HV + h) * DV + rows, _cast(vv, vb_ptr.dtype.element_ty, INTERP), mask=rmask & ok)
        u_ptrs = ub_ptr + (ent * HV + h) * DV + rows
        if do_flush:
            if DUAL:
                S = _ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8)
            S = _fold(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
                      HV, HK, DK, DV, L, DUAL, EPS)
            u = bt * (vv - alpha * tl.sum(S * kn[None, :], 1))
            o = alpha * tl.sum(S * qn[None, :], 1) + u * kq
            S = alpha * S + u[:, None] * kn[None, :]
            if not DUAL:
                tl.store(u_ptrs, u, mask=rmask & ok)
            _ckpt_store(hi_ptr, hi_sc_ptr, tile, row_off, S, mask2, rmask, HI_FP8, INTERP)
            if DUAL:
                _ckpt_store(lo_ptr, lo_sc_ptr, tile, row_off, S, mask2, rmask, LO_FP8, INTERP)
        else:
            acc_k, acc_q, c = _old_buffer_terms(slot64, h, kh, n, kn, qn, rows, rmask, cols, cmask, ub_ptr, kb_ptr,
                                                gb_ptr, HV, HK, DK, DV, L, BLOCK_V, BLOCK_L, EPS)
            ec = tl.exp(c)
            u = bt * (vv - alpha * (ec * tl.sum(S * kn[None, :], 1) + acc_k))
            o = alpha * (ec * tl.sum(S * qn[None, :], 1) + acc_q) + u * kq
            tl.store(u_ptrs, u, mask=rmask & ok)
        tl.store(o_ptrs, _cast(o, o_ptr.dtype.element_ty, INTERP), mask=rmask)


def plan_old(rs, q, k, v, g, beta, idx, scale, o, bv, nw):
    batch, Hv, dv = v.shape
    Hk, dk = k.shape[1], k.shape[2]
    nt = triton.cdiv(dv, bv)
    ck, ck_meta = TK._hi_lo_args(rs)
    buf, dual = TK._buffer_args(rs)
    args = [q, k, v, g, beta, o, idx, *ck, *buf, rs.cursor, *TK._strides(q, k, v, g, beta, o, dims=2), scale,
            rs.flush_period, nt * Hv]
    meta = dict(BLOCK_V=bv, BLOCK_K=triton.next_power_of_2(dk), BLOCK_L=min(triton.next_power_of_2(L), 16),
                INTERP=False, EPS=R.L2_EPS, num_warps=nw, HV=Hv, HK=Hk, DK=dk, DV=dv, L=rs.capacity, DUAL=dual,
                **ck_meta)
    return [(_old_replay_kernel, (nt, Hv, batch), args, meta)]


# ----------------------------------------------------------------------------- variants
def rcfg(br, nw, nr=1, hp=1, pf=0, dist=1, split=False, prefetch=False, **extra):
    """A buffered-route replay config (EAGER_ROUTE off: the table routes small batches)."""
    c = dict(BLOCK_V=br, num_warps=nw, NR=nr, HP=hp, PF=pf, PF_DIST=dist, SPLIT=split, PREFETCH=prefetch,
             EAGER_ROUTE=False)
    c.update(extra)
    return c


def vname(c) -> str:
    if c.get("OLD"):
        return f"old BV{c['BLOCK_V']} w{c['num_warps']}"
    opts = "".join(f" {k}{c[k]}" for k in ("maxnreg", "num_stages", "LOOP_STAGES") if c.get(k))
    opts += " tma" if c.get("TMA") else ""
    ev = {k: c[k] for k in ("LOAD_EV", "STORE_EV", "F_LOAD_EV", "F_STORE_EV") if k in c}
    opts += "".join(f" {k.lower()}={v or '-'}" for k, v in ev.items())
    opts += " call" if c.get("PENDING_CALL") else ""
    opts += " mma" if c.get("RD_MMA") else ""
    if c.get("EAGER_ROUTE"):
        return f"eager-route BV{c['BLOCK_V']} w{c['num_warps']}{opts}"
    if "NR" not in c:
        return f"eager BV{c['BLOCK_V']} w{c['num_warps']}{opts}"
    s = f"{'split' if c.get('SPLIT') else 'fused'} R{c['BLOCK_V']}x{c['NR']} H{c['HP']} w{c['num_warps']}"
    s += f" pf{c['PF']}/{c.get('PF_DIST', 1)}" if c["PF"] else " pf0"   # (replay_meta's default distance)
    if c.get("PREFETCH"):
        s += " pre"
    if c.get("PDL") is False:
        s += " no-pdl"
    s += opts
    f = {k[2:]: v for k, v in c.items() if k.startswith("F_")}
    if f:
        s += " | B " + ",".join(f"{k}{v}" for k, v in f.items())
    return s


EAGER_SD = {"eager-f32": "float32", "eager-bf16": "bfloat16"}   # eager mode name: state dtype
EVS = [{}, {"LOAD_EV": "", "STORE_EV": ""}, {"LOAD_EV": ""}, {"STORE_EV": ""}]   # eviction-policy variants
OLD = lambda bv, nw: dict(OLD=True, BLOCK_V=bv, num_warps=nw)  # noqa: E731
EAGER = lambda bv, nw: dict(BLOCK_V=bv, num_warps=nw)  # noqa: E731
ROUTE = lambda bv, nw: dict(BLOCK_V=bv, num_warps=nw, EAGER_ROUTE=True)  # noqa: E731  (replay's eager route)

BIG = {   # batch 256, Qwen3.5-122B: the wide search
    "f32": [OLD(64, 8),
            rcfg(64, 8, 2, 4, 2, 2, True), rcfg(64, 8, 2, 4, 1, 2, True), rcfg(32, 4, 4, 4, 2, 2, True),
            rcfg(16, 4, 8, 4, 2, 4, True), rcfg(32, 4, 4, 4, 2, 4, True), rcfg(64, 8, 2, 4, 0, 1, True),
            rcfg(32, 4, 4, 2, 2, 2, True), rcfg(32, 4, 4, 4, 2, 2, True, True), rcfg(64, 4, 2, 4, 2, 2, True),
            rcfg(32, 4, 4, 4, 2, 2, True, F_BLOCK_V=64, F_num_warps=8),
            rcfg(32, 4, 4, 4, 2, 2, True, F_BLOCK_V=16, F_num_warps=4),
            rcfg(32, 4, 4, 4, 2, 2, True, F_NW_MUL=2),
            # flush step with the fold as one MMA per chunk and one reduction per own rank (FOLD_MMA;
            # sm_90 registers: 32 rows x 4 warps 168, 16 x 4 96, NR 4 200)
            rcfg(32, 4, 4, 4, 2, 2, True, F_FOLD_MMA=True),
            rcfg(32, 4, 4, 4, 2, 2, True, F_FOLD_MMA=True, F_BLOCK_V=16, F_num_warps=4),
            rcfg(32, 4, 4, 4, 2, 2, True, F_FOLD_MMA=True, F_NR=4),
            rcfg(32, 4, 4, 4, 2, 2, False), rcfg(64, 8, 1, 1, 0, 1, False)],
    "dual-bf16": [OLD(64, 8),
                  rcfg(64, 8, 2, 4, 2, 2, True), rcfg(32, 4, 4, 4, 2, 2, True), rcfg(64, 4, 2, 4, 2, 2, True),
                  rcfg(128, 8, 1, 4, 2, 2, True), rcfg(128, 4, 1, 4, 2, 2, True), rcfg(64, 8, 2, 4, 0, 1, True),
                  rcfg(64, 4, 2, 4, 2, 3, True)],
    "dual-fp8": [OLD(64, 8),
                 rcfg(128, 4, 1, 4, 2, 2, True), rcfg(64, 4, 2, 4, 2, 2, True), rcfg(128, 8, 1, 4, 2, 3, True),
                 rcfg(64, 8, 2, 4, 2, 2, True), rcfg(32, 4, 4, 4, 2, 4, True), rcfg(128, 4, 1, 4, 1, 2, True),
                 rcfg(128, 4, 1, 4, 2, 2, True, F_BLOCK_V=64, F_num_warps=8)],
    "bf16": [OLD(64, 8),
             rcfg(64, 4, 2, 4, 2, 2, True), rcfg(64, 8, 2, 4, 2, 2, True), rcfg(128, 8, 1, 4, 2, 2, True),
             rcfg(32, 4, 4, 4, 2, 2, True), rcfg(128, 4, 1, 4, 2, 2, True)],
    "eager-f32": [EAGER(32, 4), EAGER(64, 8), EAGER(16, 2), EAGER(32, 8), EAGER(16, 4),
                  EAGER(8, 1), EAGER(8, 2), EAGER(16, 1), EAGER(64, 4), EAGER(128, 8)],
    # bf16: ours 86-89 % of copy vs vLLM's 93-97 % at b256-512 (h200-kernels-20261130-s5); fp32's
    # winner was the smallest tile, 16 rows x 1 warp
    "eager-bf16": [EAGER(32, 4), EAGER(64, 4), EAGER(64, 8), EAGER(128, 8), EAGER(128, 4),
                   EAGER(16, 1), EAGER(32, 1), EAGER(32, 2), EAGER(16, 2), EAGER(64, 2), EAGER(8, 1), EAGER(8, 2),
                   EAGER(4, 1)],
}
# Small single-chunk programs at batch 256 (TUNE_MODES lean-f32, lean-dual-bf16, lean-bf16), after
# the Mamba-2 replay step took 10-42 % less time with 16-row, 1-warp programs of 72-80 registers
# (docs/kernels.md, session 7). Each list starts with the shipped large-batch row. sm_90
# registers of the output-only kernel (offline compile, Qwen3.5-122B b256; fp32 / dual bf16 /
# bf16): shipped 96 / 168 / 168; R16 w2 80 / 96 / 95; R16 w1 136 / 128 / 128; R32 w2 128 / 96 / 96.
_LEAN_TILES = [rcfg(16, 2, split=True), rcfg(16, 1, split=True), rcfg(32, 2, split=True), rcfg(8, 1, split=True),
               rcfg(16, 2, 1, 2, split=True), rcfg(32, 4, split=True)]
LEAN = {"f32": [rcfg(32, 4, 4, 2, 2, 2, True)] + _LEAN_TILES,
        "dual-bf16": [rcfg(128, 4, 1, 4, 2, 2, True), rcfg(32, 4, 4, 2, 2, 2, True)] + _LEAN_TILES,
        "bf16": [rcfg(128, 4, 1, 4, 2, 2, True), rcfg(32, 4, 4, 2, 2, 2, True)] + _LEAN_TILES}
# The flush-step launch of 16-bit high copies and of dual states (TUNE_MODES flush-dual-bf16,
# flush-dual-fp8, flush-bf16), each beside the shipped output launch: its rank-1 fold (session
# 7's default: Nsight Compute, Qwen3.5-122B b256: 151 us bf16 state, 215 us dual bf16, against
# 183-189 us for the output launch) and FOLD_MMA (dual: U by the triangular solve; sm_90
# registers, dual bf16 / fp8: 32 rows x 4 warps 255 + 296 / 284 bytes of spills, 16 x 4 249 / 255,
# 32 x 8 255 + 100 spills; split P_PREC tf32 instead: 238, no spills).
_OUT_BIG = dict(br=128, nw=4, nr=1, hp=4, pf=2, dist=2, split=True)
_FLUSH_TILES = [dict(F_FOLD_MMA=False), dict(F_FOLD_MMA=True), dict(F_FOLD_MMA=True, F_BLOCK_V=16, F_num_warps=4),
                dict(F_FOLD_MMA=True, F_BLOCK_V=16, F_num_warps=2)]
# dual: the high copy's error after FOLD_MMA flushes was 2e-5 (rank-1: 4.5e-7; session 8,
# tune_gdn_flush.txt): 2.7e-6 with SMALL_PREC "ieee", unchanged when S_0 K^T was summed from
# products over 32 or 16 columns (P_CHUNK at 4f45f01; tune_gdn_flush_dual.txt). The inverse is
# now kept as X = inv - I and U = R + R X (rounding relative to the off-identity part); NR > 1:
# one inverse per head.
_X3E = dict(F_P_PREC="bf16x3e", F_FOLD_PREC="bf16x3e")   # the dual flush step's products as three bf16 terms
_X3S = dict(_X3E, F_num_stages=1)
_W16 = dict(F_FOLD_MMA=True, F_BLOCK_V=16, F_num_warps=2)
_DUAL_TILES = [dict(F_FOLD_MMA=False), dict(_W16, F_NR=1), dict(_W16, F_NR=2), dict(_W16, F_NR=8),
               dict(_W16, F_NR=1, F_SMALL_PREC="tf32x3"), dict(_W16, F_NR=1, F_SMALL_PREC="ieee"),
               dict(_W16, F_NR=8, F_SMALL_PREC="ieee"), dict(_W16, F_NR=8, F_SMALL_PREC="tf32x3t")]
FLUSH = {"dual-bf16": [rcfg(**_OUT_BIG, **f) for f in _DUAL_TILES],
         "dual-fp8": [rcfg(**_OUT_BIG, **f) for f in _DUAL_TILES[:4]],
         "bf16": [rcfg(**_OUT_BIG, **f) for f in _FLUSH_TILES],
         "f32": [rcfg(32, 4, 4, 2, 2, 2, True, F_FOLD_MMA=True)]}
# Dual flush steps at batch 8 / 16 (TUNE_MODES flush-dual-bf16-b8, -b16): few sequences flush per
# step there, and the batch-256 tile (a whole head per program) ran h200-small-batch-20261130-s8
# at 0.66x our fp32 eager at Qwen3.5-122B b8 / b16 (the rank-1 fold, s7c: 0.90 / 0.93)
_SMALL_OUT = dict(br=32, nw=4, nr=2, hp=2, pf=2, dist=2, split=True, prefetch=True)
FLUSH_SMALL = [rcfg(**_SMALL_OUT, F_FOLD_MMA=False, F_BLOCK_V=32, F_num_warps=4, F_NR=1),
               rcfg(**_SMALL_OUT, **_W16, F_NR=1), rcfg(**_SMALL_OUT, **_W16, F_NR=2),
               rcfg(**_SMALL_OUT, **_W16, F_NR=8),
               rcfg(**_SMALL_OUT, F_FOLD_MMA=True, F_BLOCK_V=32, F_num_warps=4, F_NR=1)]
# batch 32 (flush-dual-bf16-b32, both Qwen3.5 dims): NR 8 ran Qwen3.5-4B at 0.66x fp32 eager
# (rank-1, s7c: 0.85), Qwen3.5-122B at 0.97 (0.92) in h200-small-batch-20261130-s8b
FLUSH_B32 = [rcfg(**_SMALL_OUT, F_FOLD_MMA=False, F_BLOCK_V=32, F_num_warps=4, F_NR=1),
             rcfg(**_SMALL_OUT, **_W16, F_NR=1), rcfg(**_SMALL_OUT, **_W16, F_NR=2), rcfg(**_SMALL_OUT, **_W16, F_NR=8)]
# Dual states at batch 2 / 4 / 8 (TUNE_MODES route-dual-b2, -b4, -b8): the eager route (a flush
# at every step, both copies written until session 18: no byte saving) against the buffered table
# rows (fused 8 x 1 warp at batch <= 4, split 32 x 4 warps above); h200-small-batch-20261130-s8c had
# the buffered dual at 0.63-0.73x our fp32 eager at b2-b4
DUAL_SMALL = [rcfg(8, 1, prefetch=True), rcfg(32, 4, 2, 2, 2, 2, True, True, F_NR=1, F_BLOCK_V=16, F_num_warps=2),
              ROUTE(4, 1), ROUTE(8, 1), ROUTE(8, 2), ROUTE(16, 1)]
# The two-pass dual kernel (_gdn_dual_2pass_kernel, the commit's since session 10) as the b256 flush
# step (TUNE_MODES flush-dual-2pass; session 11: 3 % faster, the high copy's error 50x, so not the
# default), beside the shipped row (16 rows x 2 warps x 8 chunks, the triangular solve per chunk chain). sm_90 registers, Qwen3.5-122B dims: 128 rows x 4
# warps 255 (16- or 32-column steps), 64 x 4 190, 128 x 8 244; no spills.
_2P = dict(F_TWO_PASS=True)
DUAL_2PASS = [rcfg(**_OUT_BIG, **f) for f in (
    dict(_W16, F_NR=8), dict(_2P, F_BLOCK_V=128, F_num_warps=4, F_CHUNK_K=16), dict(_2P, F_BLOCK_V=128, F_num_warps=4),
    dict(_2P, F_BLOCK_V=64, F_num_warps=4, F_CHUNK_K=16), dict(_2P, F_BLOCK_V=128, F_num_warps=8))]


def _table(mode: str, batch: int, **kw) -> dict:
    """The launch table's replay row for a MODE at this batch (dk = dv = 128; dual states: at
    Qwen3.5-122B's 64 value heads, DUAL_ROUTE_HEADS), with kw over it."""
    m, sd, lo, _ = MODE[mode]
    rb = dtype_of(lo or sd).itemsize
    row = TK.pick_config("replay", batch, 128, 128, L, None, state_bytes=rb, dual=m == "dual",
                         heads=MODELS["q122b"][1])
    # a buffered row says so: as a config at a shape the table routes (Qwen3.5-4B's dual states
    # to batch 16) it would otherwise keep that shape's route (tune_gdn_s26h.txt)
    row.setdefault("EAGER_ROUTE", False)
    return {**row, **kw}


def _route_list(mode: str, batch: int) -> list[dict]:
    """Session 17's candidates at a batch of 8-32: the table's row, the eager route (4 / 8 rows x 1
    warp) and, 16-bit read copies at batch >= 16, the batch-<=64 buffered row of the table with
    session 16's two changes (4 chunks per program without the early buffer reads; 16-row x
    8-chunk programs on 2 warps)."""
    cands = [_table(mode, batch), ROUTE(4, 1), ROUTE(8, 1)]
    if mode != "f32" and batch >= 16:
        cands += [rcfg(32, 4, 2, 2, 2, 2, True, True), rcfg(32, 4, 4, 2, 2, 1, True), rcfg(16, 2, 8, 2, 2, 2, True)]
    return list({vname(c): c for c in cands}.values())


def _x3(mode: str, prec: str) -> dict:
    """The flush step's products against the keys at a "bf16x3e" variant `prec` (dual: both)."""
    return dict(F_FOLD_PREC=prec, **({"F_P_PREC": prec} if mode.startswith("dual") else {}))


# TUNE_MODES names of the focused lists: (mode, configs, batch, models)
EXTRA = {**{f"route-dual-b{b}": ("dual-bf16", DUAL_SMALL, b, ("q122b", "q4b")) for b in (2, 4, 8)},
         # session 26: a bf16 read copy's dots as one tensor-core product per chunk (RD_MMA): the chunk
         # goes from its TMA copy's shared memory into the MMA, never through registers (the 16-bit
         # output launch ran 168 registers, 3 programs per SM, 33 % of its stall samples waiting on
         # its one chunk in flight: ncu_out_replay-dual_s26b.txt). With Triton's default depth 3 a
         # loop with a dot is pipelined (100 KiB of shared memory): num_stages 1 unpipelined. (Since
         # the dual rows shipped with it, their lists' first entry is itself RD_MMA; rdmma3 below
         # keeps the unpacking dots beside it)
         **{f"rdmma-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, RD_MMA=True, **o) for o in (
             dict(num_stages=1), dict(LOOP_STAGES=2), dict(num_stages=1, maxnreg=96),
             dict(num_stages=1, BLOCK_V=64, NR=2), dict(num_stages=1, BLOCK_V=64, NR=2, maxnreg=80),
             dict(num_stages=1, HP=2))], b, ("q122b", "q4b"))
            for m in ("dual-bf16", "bf16") for b in (16, 32, 64, 128, 256, 512)},
         # then around its best: the buffer's cursor-independent reads (PREFETCH), the first chunk
         # hinted into L2 at the program's start (PF 1), pipelined smaller chunks
         **{f"rdmma2-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, RD_MMA=True, **o) for o in (
             dict(num_stages=1), dict(num_stages=1, PREFETCH=True), dict(num_stages=1, PF=1, PF_DIST=1),
             dict(LOOP_STAGES=2, BLOCK_V=64, NR=2), dict(LOOP_STAGES=2, BLOCK_V=32, NR=4),
             dict(num_stages=1, BLOCK_V=64, NR=2, maxnreg=80),
             dict(num_stages=1, BLOCK_V=64, NR=2, maxnreg=80, PREFETCH=True))], b, ("q122b", "q4b"))
            for m in ("dual-bf16", "bf16") for b in (32, 64, 128, 256, 512)},
         # the dual rows at batch 16 / 32 (Qwen3.5-122B; Qwen3.5-4B is routed to the high copy there
         # up to batch 16) against the unpacking dots and 64-row chunks
         **{f"rdmma3-dual-bf16-b{b}": ("dual-bf16", [_table("dual-bf16", b)] + [_table("dual-bf16", b, **o) for o in (
             dict(RD_MMA=False), dict(BLOCK_V=64, NR=2), dict(BLOCK_V=64, NR=2, maxnreg=80))], b, ("q122b",))
            for b in (16, 32)},
         # session 27: the three-term bf16 split (mma "bf16x3e") in inline PTX, a pair of elements per
         # conversion (the table's since) against Triton's conversions ("_cvt", session 26's: one F2F
         # per element, a permute to pack, a multiply-add to widen; the dual flush step's chunk loop
         # 955 SASS instructions on sm_90 offline, 829 with the PTX). Timed first (tune_gdn_s27a.txt)
         # with the PTX also marked impure (pinned where the fp32 chunk is: 688 instructions but 249
         # registers), 1-2 % slower than pure, since removed. Dual rows also at depth 2 and under
         # register budgets (200: 5 programs per SM, no spill; 168: 6, a 64-byte spill), and (since
         # the table's small products are "bf16x6", below) with them in Triton's "tf32x3" as before
         **{f"split3-{m}-b{b}": (m, [_table(m, b), _table(m, b, **_x3(m, "bf16x3e_cvt"))]
                                 + ([_table(m, b, **o) for o in (
                                     dict(F_num_stages=2), dict(F_num_stages=2, F_maxnreg=200), dict(F_maxnreg=200),
                                     dict(F_maxnreg=168), dict(F_SMALL_PREC="tf32x3"))] if m == "dual-bf16" else [])
                                 + [_table(m, b)], b, ("q122b", "q4b"))
            for m in ("dual-bf16", "f32", "bf16") for b in (64, 128, 256, 512)},
         # the dual flush step's small fp32 products (the triangular solve's rounds, U = R + R X) as
         # six bf16 MMAs ("bf16x6", ~2^-23) against Triton's "tf32x3" (~2^-22, its cvt.rna selects):
         # offline the per-head setup 1751 -> 1356 SASS instructions, the chunk loop 829 -> 796
         # (tune_gdn_s27c.txt, b256 / b512: bf16x6 0.7-0.9 % faster; shipped, so since then the
         # lists' table rows are bf16x6 and the variant is the "tf32x3" before)
         **{f"small6-{m}-b{b}": (m, [_table(m, b), _table(m, b, F_SMALL_PREC="tf32x3"), _table(m, b)], b,
                                 ("q122b", "q4b")) for m in ("dual-bf16", "dual-fp8") for b in (32, 64, 128, 256, 512)},
         # session 26: dual states at batch 1 ran 0.984-0.990x our fp32 eager at Qwen3.5-4B dims in
         # every paper sweep since s18 (3.08 vs 3.04 us), where fp32 replay, the same route kernel
         # without DUAL, ties it. The DUAL rare path (u recomputed against the high copy) is inline
         # and moves the steady path's loads in the SASS; as a call (PENDING_CALL) it cannot
         # (it was no faster: tune_gdn_s26b.txt)
         "route-dual-b1": ("dual-bf16", [_table("dual-bf16", 1), _table("dual-bf16", 1, PENDING_CALL=True),
                                         _table("dual-bf16", 1, PENDING_CALL=True, maxnreg=None)], 1,
                           ("q122b", "q4b")),
         **{f"lean-{m}": (m, c, 256, ("q122b",)) for m, c in LEAN.items()},
         **{f"flush-{m}": (m, c, 256, ("q122b",)) for m, c in FLUSH.items()},
         **{f"flush-dual-bf16-b{b}": ("dual-bf16", FLUSH_SMALL, b, ("q122b",)) for b in (8, 16)},
         "flush-dual-bf16-b32": ("dual-bf16", FLUSH_B32, 32, ("q122b", "q4b")),
         "flush-dual-2pass": ("dual-bf16", DUAL_2PASS, 256, ("q122b", "q4b")),
         # session 16: 16-bit read copies at batch 8 / 32 (the table's batch <= 64 row) with the fp32
         # row's change (4 chunks per program, no early buffer reads) and 16-row x 8-chunk programs
         **{f"small16-{m}-b{b}": (m, [_table(m, b), _table(m, b, NR=4, PF_DIST=1, PREFETCH=False),
                                      _table(m, b, BLOCK_V=16, num_warps=2, NR=8, PREFETCH=False)], b, ("q122b", "q4b"))
            for m in ("dual-bf16", "bf16") for b in (8, 32)},
         # session 17: our eager kernel at batch 8-64 (the table ran 8 rows x 2 warps there, though
         # session 6 had 4 x 1 faster at batch 8: tune_gdn_route.txt), and the replay step's
         # routes beside it: the table's row against the eager route (4 / 8 rows x 1 warp) and,
         # 16-bit copies, the buffered rows of the session-16 probe
         **{f"eager-{m}-b{b}": (f"eager-{m}", [EAGER(4, 1), EAGER(8, 1), EAGER(8, 2), EAGER(16, 1), EAGER(16, 2),
                                               EAGER(4, 2)], b, ("q122b", "q4b"))
            for m in ("f32", "bf16") for b in (8, 16, 32, 64)},
         **{f"route-{m}-b{b}": (m, _route_list(m, b), b, ("q122b", "q4b"))
            for m in ("f32", "bf16", "dual-bf16") for b in (8, 16, 32)},
         # session 17: the eager route carries the rare path's registers (pending entries folded):
         # 126-127 at 8 rows x 1 warp vs the eager kernel's 64 (bf16) / 80 (fp32), half its
         # occupancy (bf16 b32: 37.8 / 20.1 us vs eager 35.1 / 18.9, tune_gdn_s17a.txt). Capped
         # by a register budget (ptxas spills in the rare path) or no loop pipelining
         **{f"route-regs-{m}-b{b}": (m, [ROUTE(8, 1), dict(ROUTE(8, 1), maxnreg=64), dict(ROUTE(8, 1), maxnreg=80),
                                         dict(ROUTE(8, 1), num_stages=1), ROUTE(4, 1), dict(ROUTE(4, 1), maxnreg=56),
                                         dict(ROUTE(4, 1), num_stages=1)], b, ("q122b", "q4b"))
            for m in ("f32", "bf16", "dual-bf16") for b in (1, 8, 32)},
         **{f"eager-{m}-b{b}": (f"eager-{m}", [EAGER(4, 1), EAGER(8, 1), EAGER(16, 1)], b, ("q122b", "q4b"))
            for m in ("f32", "bf16") for b in (1, 2, 4, 128, 256)},
         # bf16 eager at batch 512: 0.84-0.88x vLLM's at Qwen3.5-122B dims, 82-85 % of copy, where
         # batch 256 runs at 96 % (h200-eager-bf16-20261130, -20261201-s17)
         "eager-bf16-b512": ("eager-bf16", [EAGER(8, 1), EAGER(16, 1), EAGER(16, 2), EAGER(32, 2), EAGER(32, 4),
                                            EAGER(64, 4), EAGER(64, 8), EAGER(128, 8), EAGER(4, 1)], 512,
                             ("q122b", "q4b")),
         # session 29: the state's L2 eviction policies (LOAD_EV / STORE_EV; the kernels' default is
         # evict_first on both). Each list starts with the table's row, then: no hints, load
         # unhinted, store unhinted. bf16 eager at Qwen3.5-122B b512 (tools/probe_layers.py,
         # probe_layers_s29b.txt): 577 us with both hints, 539 with none, vLLM's 534
         **{f"ev-eager-{m}-b{b}": (f"eager-{m}", [dict(EAGER(4 if m == "f32" or b <= 2 else 8, 1), **ev) for ev in EVS],
                                   b, ("q122b", "q4b"))
            for m in ("f32", "bf16") for b in (1, 4, 8, 32, 64, 128, 256, 512)},
         **{f"ev-route-{m}-b{b}": (m, [dict(_table(m, b), **ev) for ev in EVS], b, ("q122b", "q4b"))
            for m, bs in (("f32", (1, 4, 8, 16)), ("bf16", (1, 4, 8, 16, 32)), ("dual-bf16", (1, 2)))
            for b in bs},
         **{f"ev-flush-{m}-b{b}": (m, [_table(m, b), _table(m, b, F_STORE_EV=""), _table(m, b, F_LOAD_EV="",
                                                                                          F_STORE_EV="")], b,
                                   ("q122b", "q4b"))
            for m in ("f32", "bf16") for b in (32, 256, 512)},
         # the eager kernel under the budgets that helped the route (fairness: the same treatment)
         **{f"eager-regs-{m}-b{b}": (f"eager-{m}", [EAGER(4, 1), dict(EAGER(4, 1), maxnreg=56), dict(EAGER(4, 1), maxnreg=48),
                                                    EAGER(8, 1), dict(EAGER(8, 1), maxnreg=56)], b, ("q122b", "q4b"))
            for m in ("f32", "bf16") for b in (1, 8, 32, 256)},
         # session 15: the SPLIT step's flush launch as a programmatic dependent (gdn.PDL) vs not,
         # the table's rows otherwise
         **{f"pdl-{m}-b{b}": (m, [_table(m, b), _table(m, b, PDL=False)], b, ("q122b", "q4b"))
            for m in ("f32", "dual-bf16") for b in (32, 256)},
         # session 20: the SPLIT step's flush launch (then one chunk per program: fp32 FOLD_MMA, 32 rows x
         # 4 warps, 168 registers, 3 programs per SM, 10 waves at Qwen3.5-122B b256, each program a chain
         # of dependent loads; 61 us at 40 % of DRAM peak). sm_90 registers: NR 2 127, 32 x 8 warps 116,
         # 64 x 8 170, a 128 budget 128 + 20 bytes of spills. The lists ran with the table's row of that
         # time (NR 1) first; now that the table has NR 2 above batch 64 (fp32) / 128 (16-bit), F_NR 1
         # is listed to keep the A/B
         **{f"flushtile-f32-b{b}": ("f32", [_table("f32", b)] + [_table("f32", b, **o) for o in (
             dict(F_NR=1), dict(F_NR=2), dict(F_NR=4), dict(F_BLOCK_V=32, F_num_warps=8),
             dict(F_BLOCK_V=64, F_num_warps=8), dict(F_maxnreg=128), dict(F_NR=2, F_PF_DIST=1))], b,
                                     ("q122b", "q4b"))
            for b in (32, 64, 128, 256, 512)},
         **{f"flushtile-bf16-b{b}": ("bf16", [_table("bf16", b)] + [_table("bf16", b, **o) for o in (
             dict(F_NR=1), dict(F_NR=2), dict(F_NR=4))], b, ("q122b", "q4b")) for b in (64, 128, 256, 512)},
         # session 35: bf16 states' output launch (whole 128-row heads through TMA, 4 warps, 128
         # registers: 4 programs per SM, 25 % occupancy; Nsight Compute, Qwen3.5-4B b256: 72 % of DRAM
         # peak, ncu_q4b_replay_bf16_s34e.txt) under register budgets: offline 96 -> 5 programs per SM,
         # 64-80 bytes spilled; 80 -> 6, 144-216 bytes (112 spills 20-24 and still fits 4). Interleaved,
         # twice each
         **{f"budget-bf16-b{b}": ("bf16", [_table("bf16", b), _table("bf16", b, maxnreg=96),
                                           _table("bf16", b, maxnreg=80)] * 2, b, ("q122b", "q4b"))
            for b in (128, 256, 512)},
         # the output-only launch's prefetch hints (prepared in session 20, timed in session 21): Nsight Compute
         # (Qwen3.5-122B fp32 b256, ncu_q122b_replay_b256.txt) had its L2 at 95 % of peak with an L1 hit
         # rate of 5 %, as if the L1 hints (PF 2) were fetched twice and hit L1 rarely; the current tile
         # was timed only with PF 2 at distance 2
         **{f"outpf-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, **o) for o in (
             dict(PF=0), dict(PF=1, PF_DIST=1), dict(PF=1, PF_DIST=2), dict(PF=2, PF_DIST=1), dict(PF=2, PF_DIST=3),
             dict(PREFETCH=True))], b, ("q122b", "q4b"))
            for m in ("f32", "bf16") for b in (256, 512)},
         # session 21 (tune_gdn_s21a.txt, b256): hints one chunk ahead beat two, L1 or L2 alike
         # (fp32 Qwen3.5-122B / Qwen3.5-4B 365.0 / 191.0 us vs 368.9 / 196.4; bf16 state 222.4 / 125.3
         # vs 232.4 / 133.3); distance 1 at the other batches, dual states, and tiles around it
         **{f"outpf2-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, PF_DIST=1, **o) for o in (
             ({}, dict(PF=1), dict(NR=2), dict(HP=4), dict(NR=8, HP=1)) if m == "f32" else
             ({}, dict(PF=1), dict(HP=2), dict(NR=2, HP=2)))], b, ("q122b", "q4b"))
            for m in ("f32", "bf16", "dual-bf16") for b in (128, 256, 512)},
         # the dual flush step's chunks per program (the table until dc684e5: one 16-row chunk up to
         # batch 64, a whole head, 8 chunks, above): in the s21 paper sweep Qwen3.5-4B dual bf16 ran 1.32x vLLM at
         # b128 and 1.79x at b256, as if its 8 rows x 32 heads of whole-head programs at b128 (256
         # programs, each a chain of 8 folds) left the GPU idle
         **{f"dualflush-b{b}": ("dual-bf16", [_table("dual-bf16", b)] + [_table("dual-bf16", b, F_NR=n)
                                                                          for n in (1, 2, 4, 8)], b, ("q122b", "q4b"))
            for b in (32, 64, 128, 256)},
         # prepared in session 21, timed in session 22: the dual flush step (Nsight Compute, Qwen3.5-122B
         # b256: 98.3 us at 31 % of DRAM peak, 255 registers and 51 KiB of shared memory for 4
         # programs of 2 warps per SM, 1024 whole-head programs whose 8 chunks run one after another).
         # sm_90 registers / shared memory (offline): 4 warps 219 / 51 KiB; pipelining depth 1 / 2 247 /
         # 254 and 35 / 43 KiB (3, Triton's default: 255, 51 KiB); hints one ahead or none 255 / 254.
         # Session 22: the state x keys products as three bf16 terms (mma "bf16x3e": bf16 MMAs, the
         # keys a bf16 operand) 255 + 4 bytes of spill, 31 KiB; with 32-row chunks x 8 warps 246, 47 KiB.
         # Timed (tune_gdn_s22a.txt): "bf16x3e" and depth 1 each faster, together fastest; 4 warps
         # and 32-row chunks slower
         **{f"dualflush2-b{b}": ("dual-bf16", [_table("dual-bf16", b)] + [_table("dual-bf16", b, **o) for o in (
             dict(F_num_warps=4), dict(F_num_stages=1), dict(F_num_stages=2), dict(F_PF_DIST=1), dict(F_PF=0),
             dict(F_num_warps=4, F_PF_DIST=1), dict(F_num_warps=4, F_num_stages=1), _X3E,
             dict(_X3E, F_num_stages=1), dict(_X3E, F_num_warps=4),
             *((dict(_X3E, F_BLOCK_V=32, F_NR=4, F_num_warps=8),) if b >= 256 else ()))], b, ("q122b", "q4b"))
            for b in (128, 256, 512)},
         # session 22 (tune_gdn_s22a.txt): "bf16x3e" products and pipelining depth 1 together were the
         # fastest at b128-512 (Qwen3.5-122B b256 264.9 vs 282.9 us); around them, and at the rows of
         # batch x heads <= 4096 (one chunk, four chunks per program)
         **{f"dualflush3-b{b}": ("dual-bf16", [_table("dual-bf16", b)] + [_table("dual-bf16", b, **o) for o in (
             _X3E, _X3S, dict(_X3S, F_PF=0), dict(_X3S, F_PF_DIST=1), dict(_X3S, F_PF=1))], b, ("q122b", "q4b"))
            for b in (32, 64, 128, 256, 512)},
         # the shipped dual rows (255 registers, spilling 2-10 bytes, 14 KiB of shared memory: 4
         # programs per SM by registers) under register budgets that allow 5, 6 and 8 (tune_gdn_s22c.txt:
         # all slower or equal)
         **{f"dualflush4-b{b}": ("dual-bf16", [_table("dual-bf16", b)] + [
             _table("dual-bf16", b, F_maxnreg=r) for r in (192, 168, 128)], b, ("q122b", "q4b"))
            for b in (64, 128, 256, 512)},
         # dual fp8 low copies take the same rows: the rows before session 22 ("tf32x2t" / "tf32x3", depth 3,
         # hints two ahead) vs the shipped ones (tune_gdn_s22c.txt: 4-7 % faster at b128 / b256, equal at b32)
         **{f"dualflush-fp8-b{b}": ("dual-fp8", [_table("dual-fp8", b, F_P_PREC="tf32x2t", F_FOLD_PREC="tf32x3",
                                                        F_num_stages=3, F_PF=2, F_PF_DIST=2),
                                                 _table("dual-fp8", b)], b, ("q122b", "q4b")) for b in (32, 128, 256)},
         # session 22: the non-dual flush step's fold (stored u x the raw keys) as three bf16 terms
         # of u against the bf16 keys ("bf16x3e") instead of Triton's "tf32x3" (until e007aaf the
         # table's, so the first entry of these lists; since e007aaf the table has "bf16x3e")
         **{f"foldprec-{m}-b{b}": (m, [_table(m, b), _table(m, b, F_FOLD_PREC="bf16x3e"),
                                      _table(m, b, F_FOLD_PREC="tf32x2t")], b, ("q122b", "q4b"))
            for m in ("f32", "bf16") for b in (128, 256, 512)},
         # tune_gdn_s22a.txt: "bf16x3e" 1-4 % faster at b256; at every batch, and at depth 1 (mixed)
         **{f"foldprec2-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, F_FOLD_PREC="bf16x3e", **o) for o in (
             {}, dict(F_num_stages=1))], b, ("q122b", "q4b")) for m in ("f32", "bf16") for b in (64, 128, 256, 512)},
         # session 23: the dual flush step hinting all its chunks (into L2) as soon as it has found its
         # row, instead of one chunk ahead (into L1): slower at every batch (tune_gdn_s23b.txt)
         **{f"dualflush-pfall-b{b}": ("dual-bf16", [_table("dual-bf16", b), _table("dual-bf16", b, F_PF=1, F_PF_DIST=8),
                                                   _table("dual-bf16", b, F_PF=1, F_PF_DIST=4),
                                                   _table("dual-bf16", b, F_PF=2, F_PF_DIST=8)], b, ("q122b", "q4b"))
            for b in (64, 128, 256, 512)},
         # session 24: the output launch's chunk loop software-pipelined (LOOP_STAGES: Triton's
         # pipeliner on a loop without a dot, cp.async into shared memory) and, fp32 read copies, its
         # state chunks through a TMA descriptor. Until now each chunk's loads issued only after the
         # chunk before was reduced (prefetch hints one ahead aside): Nsight Compute had the launch at
         # 78 % of DRAM peak with L2 at 95 % (hints fetched twice). sm_90 registers / shared memory at
         # Qwen3.5-122B b256 fp32 (offline): table 96; stages 2 / 3 128 (108 / 136 without hints), 19 /
         # 37 KiB; TMA 80 (72 without hints), TMA + stages 2-4 103-104, 19-56 KiB. Dual bf16: 168; stages
         # 2 194 (217 without hints), 41 KiB
         **{f"outpipe-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, **o) for o in (
             (dict(LOOP_STAGES=2, PF=0), dict(LOOP_STAGES=3, PF=0), dict(LOOP_STAGES=2), dict(TMA=True, PF=0),
              dict(TMA=True), dict(TMA=True, LOOP_STAGES=2, PF=0), dict(TMA=True, LOOP_STAGES=3, PF=0),
              dict(TMA=True, LOOP_STAGES=4, PF=0), dict(TMA=True, LOOP_STAGES=3, PF=0, HP=4),
              dict(TMA=True, LOOP_STAGES=3, PF=0, BLOCK_V=64, NR=2, num_warps=8))
             if m == "f32" else
             (dict(LOOP_STAGES=2), dict(LOOP_STAGES=2, PF=0), dict(LOOP_STAGES=3, PF=0),
              dict(BLOCK_V=64, NR=2, LOOP_STAGES=3, PF=0), dict(BLOCK_V=32, NR=4, LOOP_STAGES=3, PF=0)))],
                                 b, ("q122b", "q4b"))
            for m in ("f32", "bf16", "dual-bf16") for b in (128, 256, 512)},
         # tune_gdn_s24a.txt: software pipelining lost everywhere (fp32 b256 Qwen3.5-122B 480-545 us vs
         # 361.7); TMA chunks without it and without hints won (339.8; Qwen3.5-4B 181.9 vs 189.5, b512
         # 687.7 / 343.0 vs 710.8 / 363.5). Around it, and TMA for the 16/8-bit copies' int32 words.
         # sm_90 registers / shared memory (offline, b256): fp32 TMA 72 at HP 1-4, 2 warps 128, 64 rows
         # 128, 16 rows x 8 chunks on 2 warps 106; dual bf16 TMA 168 (128 rows), 128 (64 x 2), 80 (32 x 4,
         # HP 2); bf16 state 128; dual fp8 128
         **{f"outtma-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, **{"TMA": True, "PF": 0, **o}) for o in (
             ({}, dict(HP=1), dict(HP=4), dict(maxnreg=64), dict(BLOCK_V=16, NR=8, num_warps=2),
              dict(BLOCK_V=64, NR=2), dict(PF=1))
             if m == "f32" else
             ({}, dict(PF=2), dict(BLOCK_V=64, NR=2), dict(BLOCK_V=32, NR=4, HP=2), dict(BLOCK_V=32, NR=4, HP=4),
              dict(BLOCK_V=16, NR=8, HP=2, num_warps=2)))],
                                b, ("q122b", "q4b"))
            for m in ("f32", "bf16", "dual-bf16", "dual-fp8") for b in (32, 64, 128, 256, 512)},
         # (the output launch's maxnreg variants of outtma / outtma2 ran without the budget: plan_replay
         # passed no launch options to that launch until after tune_gdn_s24c; they are repeats)
         # tune_gdn_s24b.txt: fp32 64 rows x 2 chunks through TMA fastest at b32-128 (Qwen3.5-122B b128 176.9
         # vs 189.0 us) and Qwen3.5-4B b256 (178.4 vs 189.6); the 16/8-bit copies' table tile through TMA
         # 1-25 % faster at b128-256 (bf16 state Qwen3.5-122B b256 190.6 vs 209.0, dual fp8 221.4 vs
         # 261.8). Again, at every batch
         **{f"outtma2-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, **{"TMA": True, "PF": 0, **o}) for o in (
             ({}, dict(maxnreg=64), dict(BLOCK_V=64, NR=2), dict(BLOCK_V=64, NR=2, HP=1),
              dict(BLOCK_V=64, NR=2, maxnreg=96))
             if m == "f32" else
             ({}, dict(PF=2), dict(BLOCK_V=128, NR=1, HP=4, PF_DIST=1, num_warps=4),
              dict(BLOCK_V=128, NR=1, HP=2, num_warps=4)))],
                                 b, ("q122b", "q4b"))
            for m in ("f32", "bf16", "dual-bf16", "dual-fp8") for b in (32, 64, 128, 256, 512)
            if not (m == "bf16" and b < 64)},    # the eager route below
         # the shipped rows (since tune_gdn_s24c) against the rows before them, a real 96-register
         # budget on the fp32 row (5 programs per SM, ptxas spills 48 bytes) and, dual bf16, hints
         # one ahead (252.8 / 485.0 us vs 255.4 / 493.2 without at Qwen3.5-122B b256 / b512 in _s24c)
         **{f"outtma3-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, **o) for o in (
             (dict(maxnreg=96), dict(BLOCK_V=32, NR=4, PF=2, PF_DIST=1, TMA=False))
             if m == "f32" else (dict(PF=2, PF_DIST=1), dict(PF=2, PF_DIST=1, TMA=False)))], b, ("q122b", "q4b"))
            for m in ("f32", "dual-bf16") for b in (128, 256, 512)},
         # the flush step's high chunks through TMA (F_TMA; sm_90, Qwen3.5-122B b256: fp32 128 registers either
         # way, 24 instead of 16 KiB of shared memory; bf16 state 127, 105 without hints; dual 255 without
         # its 28-byte spill). tune_gdn_s24e.txt ran at de2c1b2, where the table's flush rows had no TMA;
         # since c275939 they have it, so the first entry of these lists is the second's repeat
         # (F_TMA=False gives the rows before)
         **{f"flushtma-{m}-b{b}": (m, [_table(m, b), _table(m, b, F_TMA=True), _table(m, b, F_TMA=True, F_PF=0)],
                                   b, ("q122b", "q4b"))
            for m in ("f32", "bf16", "dual-bf16") for b in (128, 256, 512)},
         # session 25: the dual flush step took 77 of 246 us at Qwen3.5-122B b256 (probe_gdn_overlap_s24a),
         # twice its bytes' copy time. Its chunk loop waits for each chunk's TMA copy when it needs it
         # (num_stages 1), and stores through a layout conversion and a tile of addresses. Here:
         # the stores through TMA too (F_ST_TMA), and the loop software-pipelined (num_stages 2-3:
         # with TMA the next chunk's copy waits in shared memory, not registers). sm_90 registers /
         # shared memory (offline, b256): table 255 / 14 KiB; ST_TMA 255 / 18 KiB (under a 168 budget
         # 80 bytes of spill vs 112); stages 2 255 (16-byte spill) / 22 KiB; stages 2 + ST_TMA 255 / 28 KiB,
         # no spill. (The product S_0 Kb^T with the state chunk as the MMA's second operand, so that each
         # warp would hold only its rows: 255 with an 8-byte spill, 240-292 bytes under a 168 budget;
         # not timed, removed)
         **{f"dualflush5-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, **o) for o in (
             dict(F_ST_TMA=True), dict(F_num_stages=2), dict(F_num_stages=2, F_ST_TMA=True),
             dict(F_num_stages=2, F_ST_TMA=True, F_PF=0), dict(F_num_stages=2, F_ST_TMA=True, F_PF=1),
             dict(F_num_stages=3, F_ST_TMA=True))], b, ("q122b", "q4b"))
            for m in ("dual-bf16", "dual-fp8") for b in (64, 128, 256, 512)},
         # tune_gdn_s25a.txt: the stores through TMA with the loop pipelined at depth 3 fastest at every batch
         # (Qwen3.5-122B dual bf16 b256 249.3 vs 252.4 us, b512 479.4 vs 488.7; dual fp8 b512 385.4 vs
         # 400.7); ST_TMA alone or at depth 2 slower or equal. Around it: depth 3 without ST_TMA, depth 4,
         # without hints, L2 hints
         **{f"dualflush6-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, **o) for o in (
             dict(F_num_stages=3, F_ST_TMA=True), dict(F_num_stages=3), dict(F_num_stages=4, F_ST_TMA=True),
             dict(F_num_stages=3, F_ST_TMA=True, F_PF=0), dict(F_num_stages=3, F_ST_TMA=True, F_PF=1))],
                                 b, ("q122b", "q4b"))
            for m in ("dual-bf16", "dual-fp8") for b in (32, 64, 128, 256, 512)},
         # tune_gdn_s25b.txt: depth 3 with the TMA stores and no hints fastest everywhere (shipped). With it,
         # programs of 4 warps compile without spills (sm_90, b256: 32-row chunks 255 registers, 66 KiB; 16-row
         # chunks 246, 36 KiB), where session 22 had them slower (32 x 8 warps 466.5 vs 263.4 us); register
         # budgets spill 88-384 bytes (192-128): not timed
         **{f"dualflush7-b{b}": ("dual-bf16", [_table("dual-bf16", b)] + [_table("dual-bf16", b, **o) for o in (
             dict(F_BLOCK_V=32, F_num_warps=4, F_NR=4), dict(F_BLOCK_V=16, F_num_warps=4))], b, ("q122b", "q4b"))
            for b in (128, 256, 512)},
         # the non-dual flush step's stores through TMA (bf16 state: 96 registers instead of 127; fp32 128
         # either way, 38-41 KiB of shared memory instead of 22-25)
         **{f"flushst-{m}-b{b}": (m, [_table(m, b)] + [_table(m, b, **o) for o in (
             dict(F_ST_TMA=True), dict(F_ST_TMA=True, F_num_stages=2), dict(F_ST_TMA=True, F_PF=0))],
                                 b, ("q122b", "q4b"))
            for m in ("f32", "bf16") for b in (64, 128, 256, 512)}}
SMALL = {  # batch 1 and 32: fp32 only
    # batch 1: the eager route (shipped: 4 rows x 1 warp, as the eager kernel) against eager
    # (session 16: the route's steady step ahead of its branch on the cursor); the buffered
    # rows lost here in sessions 5-6 (tune_gdn_b1.txt)
    1: {"f32": [ROUTE(4, 1), ROUTE(8, 1)],
        "eager-f32": [EAGER(4, 1), EAGER(8, 1)]},
    # batch 32: the split output launch ran 2 waves of 4-warp programs at 119 registers (2 heads
    # x 2 chunks of 32 rows each; Qwen3.5-4B 30.4 us in the graph, ~55 % of copy:
    # graph_profile_s16a.txt). Fatter programs fit one wave: 4 chunks (96 registers, 5 per SM)
    # or 8 chunks of 16 rows x 2 warps (105 registers); with and without the buffer's early
    # (cursor-independent) reads (tune_gdn_s16_b1_b32.txt: Qwen3.5-4B 32.9 us without them at
    # 4 chunks, 36.5 with)
    32: {"f32": [rcfg(32, 4, 2, 2, 2, 2, True, True), rcfg(32, 4, 4, 2, 2, 1, True), rcfg(32, 4, 4, 2, 2, 2, True),
                 rcfg(32, 4, 4, 4, 2, 1, True), rcfg(16, 2, 8, 2, 2, 2, True), rcfg(16, 2, 4, 2, 2, 2, True)],
         "eager-f32": [EAGER(8, 2)]},
}
# batch 64 (the same table row as batch 32): whether the batch-32 candidates hold there
SMALL[64] = {"f32": SMALL[32]["f32"], "eager-f32": [EAGER(8, 2)]}
# batch 2, 4 and 8: where the eager route stops paying (the buffered rows first: session 5's
# shipped fused 8 x 1 warp at batch <= 4, split 32 x 4 warps above)
for _b in (2, 4, 8):
    SMALL[_b] = {"f32": [rcfg(8, 1, prefetch=True), rcfg(32, 4, 2, 2, 2, 2, True, True), ROUTE(4, 1), ROUTE(8, 1),
                         ROUTE(8, 2), ROUTE(16, 1)],
                 "eager-f32": [EAGER(4, 1), EAGER(8, 2), EAGER(8, 1)]}


# ----------------------------------------------------------------------------- states, plans
def make_rs(model, mode, batch, slots=None, seed=0, init=True):
    Hk, Hv = MODELS[model]
    m, sd, lo, _ = MODE[mode]
    slots = batch if slots is None else slots
    rs = GDNReplayState.allocate(slots, Hk, Hv, 128, 128, L, K, mode=m, state_dtype=sd, lo_dtype=lo,
                                 act_dtype=torch.bfloat16, device=DEV)
    if init:
        gen = torch.Generator(device=DEV).manual_seed(seed)
        init = torch.randn(slots, Hv, 128, 128, generator=gen, device=DEV) * 0.5
        every = torch.arange(slots, device=DEV)
        rs.hi.write(every, init)
        if rs.lo is not None:
            rs.lo.write(every, init)
        del init
        for buf in rs.buffers():
            buf.copy_(torch.randn(buf.shape, generator=gen, device=DEV) * 0.3)
        rs.g.copy_(torch.log(0.9 + 0.1 * torch.rand(rs.g.shape, generator=gen, device=DEV)))
        if rs.beta is not None:
            rs.beta.copy_(0.05 + 0.9 * torch.rand(rs.beta.shape, generator=gen, device=DEV))
        rs.cursor.copy_((torch.arange(slots, device=DEV) % K).to(torch.int32))
    return rs


def make_state(model, sdtype, batch, seed=0):
    Hk, Hv = MODELS[model]
    gen = torch.Generator(device=DEV).manual_seed(seed)
    return (torch.randn(batch, Hv, 128, 128, generator=gen, device=DEV) * 0.5).to(getattr(torch, sdtype))


def inputs(model, batch, seed):
    Hk, Hv = MODELS[model]
    g = torch.Generator().manual_seed(seed)
    return {k: v.to(DEV) for k, v in gdn_step_inputs(GDNShape(Hk, Hv, 128, 128), batch, gen=g).items()}


def plans_for(kind, cfg, rs_or_state, x, idx, o):
    scale = 128 ** -0.5
    if kind == "eager":
        return [TK.plan_eager(rs_or_state, **x, state_indices=idx, scale=scale, o=o, config=cfg)]
    if cfg.get("OLD"):
        return plan_old(rs_or_state, x["q"], x["k"], x["v"], x["g"], x["beta"], idx, scale, o, cfg["BLOCK_V"],
                        cfg["num_warps"])
    return TK.plan_replay(rs_or_state, **x, state_indices=idx, scale=scale, o=o, config=cfg)


def probe_layers(model, mode, batch):
    """(layers, x, idx, o, nl) of the timing probes (tools/probe_gdn_*.py): nl replay states of
    `mode` for >= 1 GiB of state (cursors staggered), one step's inputs x, the slot indices and
    an output buffer."""
    _, sd, _, _ = MODE[mode]
    _, Hv = MODELS[model]
    nl = layers_for(batch * Hv * 128 * 128 * (4 if sd == "float32" else 2))
    layers = [make_rs(model, mode, batch, seed=11 + i) for i in range(nl)]
    x = inputs(model, batch, 1)
    return layers, x, torch.arange(batch, dtype=torch.int32, device=DEV), torch.empty_like(x["v"]), nl


def run_probe(run, cases) -> None:
    """A timing probe's main: the copy ceiling, then run(*case) for each case, freeing the GPU's
    cached memory after each (a case's layers hold >= 1 GiB)."""
    global COPY
    COPY = copy_ceiling()
    print(f"copy {COPY:.0f} GB/s", flush=True)
    for case in cases:
        run(*case)
        torch.cuda.empty_cache()


def launch_only(plans, i):
    """fn for time_graph: K steps of launch i of every layer's plans alone."""
    def f():
        for _ in range(K):
            for p in plans:
                launch([p[i]])
    return f


def launch(plans):
    cks = []
    for kernel, grid, args, meta in plans:
        cks.append(kernel[grid](*args, **meta))
    return cks


def job_list():
    """(model, kind/mode, batch, cfg) of everything this run may compile (order = priority)."""
    jobs = []
    for mode, cfgs in BIG.items():
        for c in cfgs:
            if not FOCUS or mode in FOCUS:
                jobs.append(("q122b", mode, 256, c))
    if FOCUS:
        jobs += [(mo, m, b, c) for name, (m, cfgs, b, models) in EXTRA.items() if name in FOCUS
                 for mo in models for c in cfgs]
        for b in SMALL:
            if f"b{b}" in FOCUS:
                jobs += [(m, mode, b, c) for m in ("q122b", "q4b") for mode, cfgs in SMALL[b].items() for c in cfgs]
        return jobs
    for b in (1, 32):
        for mode, cfgs in SMALL[b].items():
            for c in cfgs:
                jobs.append(("q122b", mode, b, c))
    # Qwen3.5-4B: defaults and a few likely winners (the best of each are timed at the end)
    for mode, cfgs in BIG.items():
        for c in cfgs[:4]:
            jobs.append(("q4b", mode, 256, c))
    for b in (1, 32):
        for mode, cfgs in SMALL[b].items():
            for c in cfgs[:4]:
                jobs.append(("q4b", mode, b, c))
    return jobs


def _compile_job(job):
    """Worker: fill Triton's disk cache for one job (warm-up compile, nothing launched)."""
    model, mode, batch, cfg = job
    try:
        torch.cuda.set_device(0)
        x = inputs(model, batch, 0)
        idx = torch.arange(batch, dtype=torch.int32, device=DEV)
        o = torch.empty_like(x["v"])
        if mode.startswith("eager"):
            st = make_state(model, {"f32": "float32", "bf16": "bfloat16"}[mode.split("-")[1]], 1)
            plans = plans_for("eager", cfg, st, x, idx, o)
        else:
            plans = plans_for("replay", cfg, make_rs(model, mode, batch, slots=1, init=False), x, idx, o)
        for kernel, grid, args, meta in plans:
            kernel.warmup(*args, grid=grid, **meta)
        return None
    except Exception as e:  # reported, the main process compiles (or fails) again
        return f"{model} {mode} b{batch} {vname(cfg)}: {type(e).__name__}: {str(e)[:200]}"


def precompile(jobs, workers, deadline_s=75.0):
    """Warm Triton's disk cache for `jobs` in `workers` spawned processes (each with its own CUDA
    context); gives up waiting after deadline_s (the main process then compiles what is left)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    t = time.time()
    ex = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"))
    futs = [ex.submit(_compile_job, j) for j in jobs]
    done, pending = cf.wait(futs, timeout=deadline_s)
    errs = []
    for f in done:
        try:
            r = f.result()
        except Exception as e:      # a worker that died
            r = f"{type(e).__name__}: {str(e)[:200]}"
        if r:
            errs.append(r)
    ex.shutdown(wait=False, cancel_futures=True)
    print(f"# precompiled {len(done)}/{len(jobs)} jobs on {workers} processes in {time.time() - t:.1f} s"
          f" ({len(errs)} errors)", flush=True)
    for e in errs[:12]:
        print("#   precompile error:", e, flush=True)


# ----------------------------------------------------------------------------- measuring
def time_graph(fn, reps=5) -> float:
    """Median microseconds of one replay of a CUDA graph of fn (warmed up and captured first)."""
    warm_up(fn, 1)
    g = capture(fn)
    g.replay()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3)
    del g
    return statistics.median(ts)


def copy_ceiling() -> float:
    x = torch.randn(1 << 28, device=DEV)
    y = torch.empty_like(x)
    us = time_graph(lambda: [torch.add(x, 0, out=y) for _ in range(4)], reps=7) / 4
    del x, y
    return 2 * (1 << 30) / (us * 1e-6) / 1e9


def layers_for(bytes_per_layer: float) -> int:
    return max(1, min(256, -(-(1 << 30) // int(bytes_per_layer))))


def model_bytes(model, mode, batch) -> float:
    Hk, Hv = MODELS[model]
    if mode.startswith("eager") or mode.startswith("vllm"):
        sd = mode.split("-")[1]
        sd = {"f32": "float32", "bf16": "bfloat16"}[sd]
        return eager_traffic(gdn_layer_bytes(Hk, Hv, 128, 128, "eager", sd, "none"), batch).total_bytes
    m, sd, lo, method = MODE[mode]
    lb = gdn_layer_bytes(Hk, Hv, 128, 128, method, sd, lo or "none")
    return replay_traffic(lb, batch, K).total_bytes


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def clone_rs(rs):
    c = copy.copy(rs)
    for f in ("u", "k", "g", "v", "beta", "cursor"):
        t = getattr(rs, f)
        setattr(c, f, None if t is None else t.clone())
    c.hi = copy.copy(rs.hi)
    c.hi.data, c.hi.scale = rs.hi.data.clone(), None if rs.hi.scale is None else rs.hi.scale.clone()
    if rs.lo is not None:
        c.lo = copy.copy(rs.lo)
        c.lo.data, c.lo.scale = rs.lo.data.clone(), None if rs.lo.scale is None else rs.lo.scale.clone()
    if hasattr(c, "_gdn_nxt"):
        del c._gdn_nxt
    return c


def check_replay(model, mode, batch, cfg, base, steps=3) -> str:
    """'' if the variant matches the reference over `steps` steps (outputs, checkpoints, cursors), else why."""
    rs, rr = clone_rs(base), clone_rs(base)
    # the eager route: the reference's route semantics (a flush at every step; dual: the high
    # copy alone, the low copy marked stale)
    route = bool(cfg.get("EAGER_ROUTE"))
    idx = torch.arange(batch, dtype=torch.int32, device=DEV)
    worst = 0.0
    for s in range(steps):
        x = inputs(model, batch, 100 + s)
        o = torch.full_like(x["v"], float("nan"))
        launch(plans_for("replay", cfg, rs, x, idx, o))
        o_ref = R.gdn_replay_step(rr, **x, state_indices=idx, route=route)
        if not torch.isfinite(o).all():
            return f"step {s}: non-finite output"
        worst = max(worst, rel(o, o_ref))
    tol = 2e-2 if mode == "dual-fp8" else 1e-2
    if worst > tol:
        return f"output rel err {worst:.3g} > {tol}"
    if not torch.equal(rs.cursor, rr.cursor):
        return "cursors differ"
    every = torch.arange(batch, device=DEV)
    e_hi = rel(rs.hi.read(every, torch.float32), rr.hi.read(every, torch.float32))
    if e_hi > (1e-3 if rs.hi.data.dtype == torch.float32 else 2e-2):
        return f"checkpoint rel err {e_hi:.3g}"
    if rs.lo is not None and not route:
        e_lo = rel(rs.lo.read(every, torch.float32), rr.lo.read(every, torch.float32))
        if e_lo > 7e-2:
            return f"low copy rel err {e_lo:.3g}"
    e_u = 0.0 if route else rel(rs.u, rr.u)    # (the eager route appends nothing)
    if e_u > 1e-2:
        return f"buffer u rel err {e_u:.3g}"
    del rs, rr
    return f"ok (out {worst:.1e}, hi {e_hi:.1e})"


def check_eager(model, sd, batch, cfg) -> str:
    st = make_state(model, sd, batch, seed=3)
    ref = st.clone()
    idx = torch.arange(batch, dtype=torch.int32, device=DEV)
    x = inputs(model, batch, 7)
    o = torch.full_like(x["v"], float("nan"))
    launch(plans_for("eager", cfg, st, x, idx, o))
    o_ref = R.gdn_eager_step(ref, **x, state_indices=idx)
    e = rel(o, o_ref)
    es = rel(st, ref)
    del st, ref
    if not (e <= 1e-2 and es <= (1e-4 if sd == "float32" else 1e-2)):
        return f"FAIL eager out {e:.3g} state {es:.3g}"
    return f"ok (out {e:.1e})"


ROWS = []
COPY = None


def report(model, mode, batch, name, us, note=""):
    by = model_bytes(model, mode, batch)
    gbs = by / (us * 1e-6) / 1e9
    ROWS.append((model, mode, batch, name, us, gbs, 100 * gbs / COPY))
    print(f"{model:6s} {mode:10s} b{batch:<4d} {name:44s} {us:9.1f} us {gbs:7.0f} GB/s "
          f"{100 * gbs / COPY:5.1f} %  {note}",
          flush=True)


def run_replay(model, mode, batch, cfgs):
    """Check then time each replay variant on one set of layers; returns [(us, cfg)]."""
    Hk, Hv = MODELS[model]
    m, sd, lo, _ = MODE[mode]
    per_layer = batch * Hv * 128 * 128 * (4 if sd == "float32" else 2)
    nl = layers_for(per_layer)
    layers = [make_rs(model, mode, batch, seed=11 + i) for i in range(nl)]
    # every variant's check starts from this untimed state (the timing steps the layers: a check
    # from layers[0] would start from the cursors and states earlier variants left behind)
    fresh = make_rs(model, mode, batch, seed=10)
    x = inputs(model, batch, 1)
    idx = torch.arange(batch, dtype=torch.int32, device=DEV)
    o = torch.empty_like(x["v"])
    out = []
    for cfg in cfgs:
        if elapsed() > BUDGET:
            print(f"# budget reached: skipping {model} {mode} b{batch} {vname(cfg)}", flush=True)
            continue
        name = vname(cfg)
        try:
            why = check_replay(model, mode, batch, cfg, fresh)
            if not why.startswith("ok"):
                print(f"FAIL {model} {mode} b{batch} {name}: {why}", flush=True)
                continue
            cks = launch(plans_for("replay", cfg, layers[0], x, idx, o))
            regs = "/".join(str(c.n_regs) + (f"+{c.n_spills}sp" if c.n_spills else "") for c in cks)
            plans = [plans_for("replay", cfg, rs, x, idx, o) for rs in layers]

            def sample():
                for _ in range(K):
                    for p in plans:
                        launch(p)
            us = time_graph(sample) / (K * nl)
            report(model, mode, batch, name, us, f"regs {regs}  {why}")
            out.append((us, cfg))
        except Exception as e:
            print(f"ERROR {model} {mode} b{batch} {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            traceback.print_exc(limit=2)
            if "CUDA" in str(e) or "illegal" in str(e):
                raise
    del layers
    torch.cuda.empty_cache()
    return out


def run_eager(model, sd, batch, cfgs):
    Hk, Hv = MODELS[model]
    mode = "eager-" + {"float32": "f32", "bfloat16": "bf16"}[sd]
    nl = layers_for(batch * Hv * 128 * 128 * (4 if sd == "float32" else 2))
    states = [make_state(model, sd, batch, seed=20 + i) for i in range(nl)]
    x = inputs(model, batch, 2)
    idx = torch.arange(batch, dtype=torch.int32, device=DEV)
    o = torch.empty_like(x["v"])
    out = []
    for cfg in cfgs:
        if elapsed() > BUDGET:
            print(f"# budget reached: skipping {model} {mode} b{batch} {vname(cfg)}", flush=True)
            continue
        try:
            why = check_eager(model, sd, batch, cfg)
            if not why.startswith("ok"):
                print(f"FAIL {model} {mode} b{batch} {vname(cfg)}: {why}", flush=True)
                continue
            cks = launch(plans_for("eager", cfg, states[0], x, idx, o))
            plans = [plans_for("eager", cfg, st, x, idx, o) for st in states]

            def sample():
                for _ in range(K):
                    for p in plans:
                        launch(p)
            us = time_graph(sample) / (K * nl)
            report(model, mode, batch, vname(cfg), us, f"regs {cks[0].n_regs}")
            out.append((us, cfg))
        except Exception as e:
            print(f"ERROR {model} {mode} b{batch} {vname(cfg)}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    del states
    torch.cuda.empty_cache()
    return out


def run_vllm(model, sd, batch):
    if elapsed() > BUDGET:
        return None
    try:
        from replaybench.models import get_model
        from replaybench.runners.peers import VllmEagerLayer
        dims = get_model({"q122b": "qwen3.5-122b-a10b", "q4b": "qwen3.5-4b"}[model]).ssm
        Hk, Hv = MODELS[model]
        nl = layers_for(batch * Hv * 128 * 128 * (4 if sd == "float32" else 2))
        gen = torch.Generator().manual_seed(5)
        layers = [VllmEagerLayer("gdn", dims, batch, sd, DEV, gen) for _ in range(nl)]
        x = inputs(model, batch, 3)
        idx = torch.arange(batch, dtype=torch.int32, device=DEV)

        def sample():
            for _ in range(K):
                for lay in layers:
                    lay.step(x, {}, idx)
        us = time_graph(sample) / (K * nl)
        report(model, "vllm-" + {"float32": "f32", "bfloat16": "bf16"}[sd], batch, "vLLM 0.26.0 packed decode", us)
        del layers
        return us
    except Exception as e:
        print(f"# vLLM peer not timed ({type(e).__name__}: {str(e)[:200]})", flush=True)
        return None


def best(res):
    return sorted(res, key=lambda t: t[0])


def main():
    global COPY
    torch.cuda.set_device(0)
    p = torch.cuda.get_device_properties(0)
    print(f"# {p.name}, {p.multi_processor_count} SMs; torch {torch.__version__}, triton {triton.__version__}",
          flush=True)
    jobs = job_list()
    precompile(jobs, workers=max(2, min(14, (os.cpu_count() or 4) - 2)))
    COPY = copy_ceiling()
    print(f"# copy ceiling (torch.add(x, 0, out=y), 1 GiB -> 1 GiB): {COPY:.0f} GB/s   [{elapsed():.0f} s]", flush=True)
    print(f"{'model':6s} {'mode':10s} {'batch':5s} {'variant':44s} {'us/step/layer':>12s} {'GB/s':>9s} {'%copy':>7s}",
          flush=True)
    winners = {}
    if FOCUS:
        small = {f"b{b}" for b in SMALL}
        extra = set(EXTRA)
        bad = sorted(set(FOCUS) - set(BIG) - small - extra)
        if bad:
            sys.exit(f"TUNE_MODES: unknown {bad}; allowed: {', '.join(BIG)}, {', '.join(sorted(small | extra))}")
        if set(FOCUS) & (set(BIG) | extra):
            run_vllm("q122b", "float32", 256)
        for mode in FOCUS:
            if mode in extra:
                m, cfgs, b, models = EXTRA[mode]
                for mo in models:
                    if m.startswith("eager-"):
                        sd = EAGER_SD[m]
                        run_eager(mo, sd, b, cfgs)
                        if b >= 256:        # vLLM's kernel beside ours where the two are compared
                            run_vllm(mo, sd, b)
                    else:
                        run_replay(mo, m, b, cfgs)
                continue
            if mode in small:   # fp32 eager vs replay at a small batch, both Qwen3.5 dims
                b = int(mode[1:])
                for model in ("q122b", "q4b"):
                    run_eager(model, "float32", b, SMALL[b]["eager-f32"])
                    run_vllm(model, "float32", b)
                    run_replay(model, "f32", b, SMALL[b]["f32"])
            elif mode.startswith("eager-"):
                run_eager("q122b", EAGER_SD[mode], 256, BIG[mode])
            else:
                run_replay("q122b", mode, 256, BIG[mode])
        summary()
        return
    # 1. Qwen3.5-122B, batch 256: eager and every replay mode, the wide search
    for sd, mode in (("float32", "eager-f32"), ("bfloat16", "eager-bf16")):
        winners[mode] = best(run_eager("q122b", sd, 256, BIG[mode]))
    for sd in ("float32", "bfloat16"):
        run_vllm("q122b", sd, 256)
    for mode in ("f32", "dual-fp8", "dual-bf16", "bf16"):
        winners[mode] = best(run_replay("q122b", mode, 256, BIG[mode]))
        print(f"# [{elapsed():.0f} s]", flush=True)
    # 2. batch 1 and 32 (fp32), Qwen3.5-122B
    for b in (1, 32):
        we = best(run_eager("q122b", "float32", b, SMALL[b]["eager-f32"]))
        run_vllm("q122b", "float32", b)
        wr = best(run_replay("q122b", "f32", b, SMALL[b]["f32"]))
        winners[f"b{b}"] = (we, wr)
    # 3. Qwen3.5-4B: the defaults' neighbourhood and this run's winners
    for sd, mode in (("float32", "eager-f32"), ("bfloat16", "eager-bf16")):
        cf = [c for _, c in winners[mode][:2]] or BIG[mode][:1]
        run_eager("q4b", sd, 256, cf)
    for sd in ("float32", "bfloat16"):
        run_vllm("q4b", sd, 256)
    for mode in ("f32", "dual-fp8", "dual-bf16", "bf16"):
        cf = [BIG[mode][0]] + [c for _, c in winners[mode][:2] if not c.get("OLD")]
        run_replay("q4b", mode, 256, cf)
    for b in (1, 32):
        we, wr = winners[f"b{b}"]
        run_eager("q4b", "float32", b, [c for _, c in we[:1]] or SMALL[b]["eager-f32"][:1])
        run_replay("q4b", "f32", b, [SMALL[b]["f32"][0]] + [c for _, c in wr[:2] if not c.get("OLD")])
    summary()


def summary():
    """Best variant per (model, mode, batch) of the rows measured."""
    print("\n# best per case (variant, us, % of copy)", flush=True)
    seen = {}
    for r in ROWS:
        k = r[:3]
        if k not in seen or r[4] < seen[k][4]:
            seen[k] = r
    for k, r in seen.items():
        print(f"#   {r[0]:6s} {r[1]:10s} b{r[2]:<4d} {r[3]:44s} {r[4]:9.1f} us {r[6]:5.1f} %", flush=True)
    print(f"# done in {elapsed():.0f} s", flush=True)


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)     # do not wait for precompile workers still running
