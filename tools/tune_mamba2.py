#!/usr/bin/env python3
"""Tune the Mamba-2 decode kernels (replayssm.triton.mamba2) on one GPU, in one process.

In order (no new measurement starts after --deadline seconds; rows print as they finish):
  1. the copy ceiling: torch.add(x, 0, out=y), x and y 1 GiB fp32 each (2 GiB moved);
  2. compilation: spawned workers run every planned launch's JIT warmup at batch 2, filling
     Triton's on-disk cache with the same keys the timed launches use (timing starts after);
  3. per group (model, method, batch, state dtype, low dtype), in priority order: enough
     layers that all their states are >= 1 GiB (replaybench.runners.kernel.Layer: random
     state, random buffer rows, cursors staggered across the batch); per variant a check
     against the reference at the real dims (batch 8 with one padded row, K + 2 steps so
     every sequence crosses a flush; outputs, final checkpoint and cursors) that fails
     loudly (the variant is not timed), then CUDA-graph timing (replaybench.timing: K steps
     x all layers per graph replay, cold state; the result is per step per layer).
One row per measurement: model, method, batch, dtypes, variant, us, GB/s (modelled bytes of
replaybench.traffic / time), % of the copy ceiling measured here, and the speedup over
vLLM's eager kernel at the same model, batch and state dtype (vLLM 0.26.0's
selective_state_update through the kernel stub in .vllm-stub, when present). A summary of
the best variant per case follows.

Variant names. "default": the shipped tables (REPLAY_CONFIGS / CONFIG_TABLE). Replay step:
v0 = the first version (16-row programs, 4 warps, state tile loaded after the buffered B
tile, separate cursor-pass launch); otherwise [split-|eager-]f{rows}w{warps}[-np][-nt][-late]
[-ev][-r{maxnreg}][-fr{fold rows}][-fc{fold cols}][-pf{1|2}]: fused (default), split or eager route (the
small-batch route: a flush at every step, eager's traffic), rows per program, warps;
-np buffer tiles loaded in the branch that uses them (not right after the cursor); -nt cursor
pass instead of the ticket; -late also the state load after the buffered B tile (the first
version's order); -ev evict_first on the state; -r ptxas register cap (-r0: none, over a table
row's); -fr rows per fold chunk of flushing programs (default 16); -fc columns per fold chunk
(default: whole rows); -pf a prefetch hint for the state tile before the cursor (1 into L2, 2 into L1; with -late); -bc the
buffer's B_i . C once per group in a launch ahead of the step (PRE_BC; -nopdl: the step not as its
programmatic dependent); -coef every per-head term of the output path in that launch (PRE_COEF: the
decay weights, B . C, the dt and B appends; -nocoef: not); -nofoldwait the flushing programs not waiting
for that launch at their end (FOLD_WAIT off, session 37's A/B). default-{flags}: the shipped tables with those flags' knobs over them
(default-fc32). Eager:
e{BLOCK_P}x{chunks}w{warps}[-ev] (chunks 0 = whole head). Variants map onto
replayssm.triton.mamba2.OVERRIDE.

usage:  python3 tools/tune_mamba2.py [--deadline 185] [--models super,nano,ultra] [--copies float32:bfloat16]
        python3 tools/tune_mamba2.py --only replay:256 --variants default,f32w4-np-nt-fc16
        TRITON_INTERPRET=1 python3 tools/tune_mamba2.py --cpu-smoke   (script check on a CPU)
"""
from __future__ import annotations

import argparse
import math
import os
import re
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
STUB = ROOT / ".vllm-stub"
if STUB.is_dir() and str(STUB) not in sys.path:
    sys.path.insert(0, str(STUB))

T0 = time.time()
import torch  # noqa: E402

GiB = 1 << 30
K = L = 16
MODELS = {"super": "nemotron-3-super-120b-a12b", "nano": "nemotron-3-nano-4b",
          "ultra": "nemotron-3-ultra-550b-a55b", "tiny": "tiny-mamba2"}
LO = {"none": None, "bfloat16": "bfloat16", "float8_e4m3": "float8_e4m3"}


# ----------------------------------------------------------------------------- variants
def replay_variant(name: str) -> dict:
    """OVERRIDE['replay'] of a variant name (see the module docstring)."""
    if name == "default":
        return {}
    if name.startswith("default-"):   # the table's choice with the flags' knobs over it
        return _replay_flags({}, name[len("default"):], name)
    if name == "v0":
        return dict(block_p=16, chunks=1, warps=4, route="fused", early=False, preload=False, ticket=False,
                    fold_rows=16, fold_cols=0, evict="", maxnreg=None, pf=0, bc=False)
    m = re.fullmatch(r"(split-|eager-)?f(\d+)w(\d+)((?:-[a-z]+\d*)*)", name)
    if not m:
        raise ValueError(f"bad replay variant {name!r}")
    route = {"split-": "split", "eager-": "eager"}.get(m.group(1) or "", "fused")
    ov = dict(block_p=int(m.group(2)), chunks=1, warps=int(m.group(3)), route=route,
              early=True, preload=True, ticket=True, fold_rows=16, fold_cols=0, evict="",
              maxnreg=None, pf=0, bc=False)
    return _replay_flags(ov, m.group(4), name)


def _replay_flags(ov: dict, flags: str, name: str) -> dict:
    """ov with a variant name's '-flag' knobs set (see the module docstring)."""
    for flag in filter(None, flags.split("-")):
        if flag == "nt":
            ov["ticket"] = False
        elif flag == "late":
            ov["early"] = ov["preload"] = False
        elif flag == "np":
            ov["preload"] = False
        elif flag == "ev":
            ov["evict"] = "evict_first"
        elif flag.startswith("r"):
            ov["maxnreg"] = int(flag[1:])
        elif flag.startswith("fr"):
            ov["fold_rows"] = int(flag[2:])
        elif flag.startswith("fc"):
            ov["fold_cols"] = int(flag[2:])
        elif flag.startswith("pf"):
            ov["pf"] = int(flag[2:])
        elif flag == "bc":
            ov["bc"] = True
        elif flag == "coef":
            ov["coef"] = True
        elif flag == "nocoef":
            ov["coef"] = False
        elif flag == "nopdl":
            ov["pdl"] = False
        elif flag == "nofoldwait":
            ov["fold_wait"] = False
        else:
            raise ValueError(f"bad flag {flag!r} in {name!r}")
    return ov


def eager_variant(name: str) -> dict:
    if name == "default":
        return {}
    m = re.fullmatch(r"e(\d+)x(\d+)w(\d+)(-ev)?", name)
    if not m:
        raise ValueError(f"bad eager variant {name!r}")
    return dict(block_p=int(m.group(1)), chunks=int(m.group(2)), warps=int(m.group(3)),
                evict="evict_first" if m.group(4) else "")


def override_of(method: str, variant: str) -> tuple[str, dict] | None:
    if method == "vllm-eager":
        return None
    if method == "eager":
        return "eager", eager_variant(variant)
    return "replay", replay_variant(variant)


# ----------------------------------------------------------------------------- the plan
# Run 1 (docs/kernels.md, "H200 tuning") measured: v0 f16w4 f16w4-np f16w4-nt f16w2 f16w1 f16w1-np
# f16w1-nt f32w4 f32w2 f64w4 f64w4-np f64w4-nt f64w4-np-r96 f64w8 f64w8-r80 f64w4-ev f64w2 split-f64w8
# split-f16w4 f128w8; the lists below keep its winners ("default" = the shipped tables) and add
# the combinations it did not measure (no ticket with the winners' other knobs).
REPLAY_F32 = ["default", "v0", "f16w1-np", "f16w1-np-nt", "f16w1-nt", "f16w2-np-nt", "f32w2-np-nt", "f64w4",
              "f64w4-nt", "f64w4-np-nt", "f64w2-nt", "f64w2-np-nt"]
REPLAY_LOW = ["default", "v0", "f16w1", "f16w1-np", "f16w1-np-nt", "f32w2-nt", "f64w4-nt", "f64w2", "f64w2-nt",
              "f64w2-np-nt"]
REPLAY_SMALL = ["default", "v0", "f16w4", "f16w2", "f16w2-np", "f16w1-np", "f64w4-nt", "f16w1-np-nt"]
EAGER_F32 = ["default", "e16x1w4", "e32x1w8", "e64x1w8", "e32x1w4"]
EAGER_BF16 = ["default", "e16x0w4", "e64x1w8", "e32x1w2", "e64x1w4", "e32x1w8", "e8x1w1", "e16x1w1"]
# bf16 eager at batch 256-512 for Super / Ultra (0.94-0.95x vLLM): more rows per program, evict-first
EAGER_BF16_LARGE = ["e128x1w8", "e64x1w8-ev", "e32x1w4", "e64x0w8", "e128x1w4"]


# fp32 eager at batch 1, where vLLM's kernel was 8 % faster at Super dims (h200-paper-20261130); the
# winner among these and the defaults, 32 rows x 8 warps, is now the table's small-batch entry
EAGER_SMALL = {1: ["e8x1w1", "e8x1w2", "e16x1w1", "e16x1w2", "e4x1w1", "e32x1w4", "e64x1w4"]}
EAGER_MID = ["e8x1w1", "e16x1w1", "e16x1w2", "e16x1w4", "e32x1w4", "e64x1w8", "e32x1w2"]


def groups_for(model: str, nano: bool) -> list[dict]:
    """Measurement groups of one model, each tagged with its priority (0 first)."""
    r_f32, r_low = REPLAY_F32, REPLAY_LOW
    g = lambda prio, method, batch, sd, lo, variants: dict(prio=prio, model=model, method=method,  # noqa: E731
                                                           batch=batch, sd=sd, lo=lo, variants=variants)
    out = [
        g(0, "vllm-eager", 256, "float32", "none", ["vllm"]),
        g(0, "eager", 256, "float32", "none", EAGER_F32),
        g(0, "replay", 256, "float32", "none", r_f32),
        g(0, "replay-dual", 256, "float32", "bfloat16", r_low),
        g(2, "vllm-eager", 256, "bfloat16", "none", ["vllm"]),
        g(2, "eager", 256, "bfloat16", "none", EAGER_BF16),
        g(2, "replay", 256, "bfloat16", "none", r_low),
        g(3, "replay-dual", 256, "float32", "float8_e4m3", r_low),
    ]
    for b in (1, 32):
        out += [g(1, "vllm-eager", b, "float32", "none", ["vllm"]),
                g(1, "eager", b, "float32", "none", ["default", "e16x1w4", "e32x1w8"] + EAGER_SMALL.get(b, EAGER_MID)),
                g(1, "replay", b, "float32", "none", REPLAY_SMALL + (["f32w8", "f32w4", "f8w1", "f32w8-np", "f64w8",
                                                                      "eager-f32w8", "eager-f16w4", "eager-f8w1",
                                                                      "eager-f64w8", "eager-f16w2"] if b == 1 else [])),
                g(4, "replay-dual", b, "float32", "bfloat16", ["default", "v0", "f16w4", "f32w4", "f64w2"] +
                  (["eager-f8w1", "eager-f32w8", "eager-f16w2"] if b == 1 else [])),
                g(4, "vllm-eager", b, "bfloat16", "none", ["vllm"]),
                g(4, "eager", b, "bfloat16", "none", ["default", "e16x1w4", "e16x0w4", "e64x1w8"] +
                  EAGER_MID)]
    # batch 4, 8 and 16: where the eager route (a flush at every step) stops paying
    for b in (4, 8, 16):
        out += [g(7, "vllm-eager", b, "float32", "none", ["vllm"]),
                g(7, "eager", b, "float32", "none", ["default"] + EAGER_MID),
                g(7, "replay", b, "float32", "none", ["default", "f16w2", "eager-f8w1", "eager-f32w8", "eager-f16w2"]),
                g(7, "replay-dual", b, "float32", "bfloat16", ["default", "f16w4"])]
    # batch 2, fp32: the eager route (32 rows x 8 warps) ran 0.94x our eager at Nano dims (head dim
    # 80: a third 32-row chunk half masked) in h200-small-batch-20261201-s17; smaller route tiles
    out += [g(8, "replay", 2, "float32", "none", ["default", "eager-f16w4", "eager-f16w2", "eager-f8w1", "eager-f16w1",
                                                  "eager-f32w4"])]
    # our eager between batch 2 and 32 (session 17: GDN's table had a 19 % slower tile there for
    # bf16 states, 3-5 % for fp32); the table's rows against smaller and larger programs
    for b in (2, 8, 16):
        out += [g(8, "eager", b, "bfloat16", "none", ["default", "e16x0w4"] + EAGER_MID)]
    out += [g(8, "eager", 2, "float32", "none", ["default"] + EAGER_MID)]
    # batch 64 / 128: where the B_i . C pre-pass (-bc, a launch ahead of the step) starts paying
    for b in (64, 128):
        out += [g(9, "replay", b, "float32", "none", ["default"]),
                g(9, "replay-dual", b, "float32", "bfloat16", ["default"])]
    # session 21: 16-bit read copies in 16-row programs with the state load issued first (-nt-fc16-bc,
    # not -late): at b256 Nano dual bf16 217.9 vs 223.2 us, bf16 state 194.7 vs 200.1
    # (tune_mamba2_s21b.txt); the other batches of the table's row (dual b128: the group above)
    early = ["default", "f16w1-nt-fc16-bc", "f16w1-np-nt-fc16-bc"]
    out += [g(10, "replay-dual", 512, "float32", "bfloat16", early)]
    out += [g(10, "replay", b, "bfloat16", "none", early) for b in (128, 512)]
    # session 35: the bf16 state's 16-row programs under their 64-register budget from batch x heads
    # 6144 (Nano's batch 64, Super's 48-127); batch 64 beside the budget's A/B at 128-512
    out += [g(11, "replay", 64, "bfloat16", "none", ["default", "default-r0"])]
    # the 32-row bf16 row from batch x heads 24576: Super's batch 192 moved to it from the 16-row row
    out += [g(11, "replay", 192, "bfloat16", "none", ["default", "f16w1-nt-fc16-bc-r64"])]
    # session 36: with coef, from 12288 (Super's batch 96, Nano's 128) against the 16-row row
    out += [g(11, "replay", 96, "bfloat16", "none", ["default", "f16w1-nt-fc16-bc-r64"])]
    # bf16 eager at batch 512, where ours was 0.94x vLLM's (Super, h200-kernels-20261130-s5)
    out += [g(6, "vllm-eager", 512, "bfloat16", "none", ["vllm"]),
            g(6, "eager", 512, "bfloat16", "none", EAGER_BF16 + EAGER_BF16_LARGE)]
    return out


def ultra_groups() -> list[dict]:
    m = MODELS["ultra"]
    g = lambda method, sd, lo, variants: dict(prio=5, model=m, method=method, batch=256, sd=sd, lo=lo,  # noqa: E731
                                              variants=variants)
    return [g("vllm-eager", "float32", "none", ["vllm"]), g("eager", "float32", "none", ["default"]),
            g("replay", "float32", "none", ["default", "v0", "f64w4", "f64w4-nt", "f64w2-nt"]),
            g("replay-dual", "float32", "bfloat16", ["default", "v0", "f64w4", "f64w2"]),
            g("vllm-eager", "bfloat16", "none", ["vllm"]),
            g("eager", "bfloat16", "none", EAGER_BF16 + EAGER_BF16_LARGE),
            g("replay", "bfloat16", "none", ["default", "default-r0"]),
            dict(prio=6, model=m, method="replay", batch=96, sd="bfloat16", lo="none",     # (as Super's b192)
                 variants=["default", "f16w1-nt-fc16-bc-r64"])] + [
        dict(prio=6, model=m, method=meth, batch=512, sd="bfloat16", lo="none", variants=v)
        for meth, v in (("vllm-eager", ["vllm"]), ("eager", EAGER_BF16 + EAGER_BF16_LARGE),
                        ("replay", ["default", "default-r0"]))]


# ----------------------------------------------------------------------------- helpers
def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def mode_of(method: str) -> str:
    return {"replay": "replay", "replay-dual": "dual"}[method]


def copy_ceiling(dev: str) -> float:
    """GB/s of torch.add(x, 0, out=y) (bytes read + written), x and y 1 GiB fp32 each."""
    n = (GiB if dev == "cuda" else 64 << 20) // 4
    x = torch.ones(n, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    for _ in range(3):
        torch.add(x, 0, out=y)
    if dev == "cuda":
        torch.cuda.synchronize()
        ts = []
        for _ in range(7):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(10):
                torch.add(x, 0, out=y)
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) / 1e3 / 10)
    else:
        ts = []
        for _ in range(3):
            t = time.perf_counter()
            torch.add(x, 0, out=y)
            ts.append(time.perf_counter() - t)
    ts.sort()
    return 2 * n * 4 / ts[len(ts) // 2] / 1e9


# ----------------------------------------------------------------------------- background compile
def _warm_job(job) -> str:
    """Worker: plan the job's launches at batch 2 on the GPU and JIT-warm them (compile only)."""
    model_name, method, sd, lo, variant = job
    try:
        from replayssm.inputs import Mamba2Shape, mamba2_params, mamba2_step_inputs
        from replayssm.state import Mamba2ReplayState, dtype_of
        from replayssm.triton import mamba2 as tk

        from replaybench.models import get_model
        d = get_model(model_name).ssm
        sh = Mamba2Shape(d.nheads, d.head_dim, d.d_state, d.n_groups)
        b, dev = 2, "cuda"
        inp = mamba2_step_inputs(sh, b, device=dev)
        params = mamba2_params(sh, device=dev)
        idx = torch.arange(b, dtype=torch.int32, device=dev)
        kind, ov = override_of(method, variant)
        tk.OVERRIDE.clear()
        tk.OVERRIDE[kind] = ov
        if kind == "eager":
            st = torch.zeros(b, d.nheads, d.head_dim, d.d_state, dtype=dtype_of(sd), device=dev)
            launches = tk.plan_eager_step(st, **inp, **params, state_indices=idx)[0]
        else:
            rs = Mamba2ReplayState.allocate(b, d.nheads, d.head_dim, d.d_state, d.n_groups, L, K, mode_of(method),
                                            sd, LO[lo], torch.bfloat16, dev)
            launches = tk.plan_replay_step(rs, **inp, **params, state_indices=idx)[0]
        for la in launches:
            la.kernel.warmup(*la.args, grid=la.grid, **la.meta)
        return ""
    except Exception as e:  # noqa: BLE001 - the main process compiles it again and reports
        return f"{job}: {type(e).__name__}: {e}"


def start_background_compile(groups, workers: int):
    import multiprocessing as mp
    jobs, seen = [], set()
    for g in groups:
        if g["method"] == "vllm-eager":
            continue
        for v in g["variants"]:
            key = (g["model"], g["method"], g["sd"], g["lo"], v)
            if key not in seen:
                seen.add(key)
                jobs.append(key)
    pool = mp.get_context("spawn").Pool(workers)
    return pool, pool.map_async(_warm_job, jobs, chunksize=1), len(jobs)


# ----------------------------------------------------------------------------- check + time
def rel(a, b) -> float:
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


TOL = {("float32", "none"): 5e-3, ("bfloat16", "none"): 3e-2, ("float32", "bfloat16"): 3e-2,
       ("float32", "float8_e4m3"): 0.1}


def check(model, method, sd, lo, dev) -> str:
    """'' if the current OVERRIDE's kernels match the reference, else what differs."""
    from replaybench.runners.kernel import Layer, _inputs
    dims, b = model.ssm, 8
    mk = lambda backend: Layer("mamba2", dims, method, backend, b, L, K, sd, lo, dev,  # noqa: E731
                               torch.Generator().manual_seed(7))
    ours, ref = mk("triton"), mk("reference")
    if ours.rs is not None:     # the eager route (OVERRIDE's or the table's at this batch) flushes at every step
        from replayssm.triton import mamba2 as tk
        rd = ours.rs.read_ckpt.data
        if tk.takes_eager_route(dims.head_dim, rd.element_size(), b, dims.nheads, ours.rs.mode == "dual"):
            ref.rs.flush_period = 1
    gen = torch.Generator().manual_seed(1)
    idx = torch.arange(b, dtype=torch.int32, device=dev)
    idx[-1] = -1
    worst = 0.0
    for _ in range(K + 2):
        inp, params = _inputs("mamba2", dims, b, dev, gen)
        yo, yr = ours.step(inp, params, idx), ref.step(inp, params, idx)
        if not torch.isfinite(yo).all():
            return "non-finite output"
        worst = max(worst, rel(yo, yr))
        if not (yo[-1] == 0).all():
            return "padded row output not 0"
    tol = TOL[(sd, lo)]
    msg = []
    if worst > tol:
        msg.append(f"output rel err {worst:.3g} > {tol}")
    if ours.rs is not None:
        if not torch.equal(ours.rs.cursor, ref.rs.cursor):
            msg.append(f"cursor {ours.rs.cursor.tolist()} vs {ref.rs.cursor.tolist()}")
        e = rel(ours.rs.hi.data[:b - 1], ref.rs.hi.data[:b - 1])
        if e > (1e-4 if sd == "float32" else tol):
            msg.append(f"checkpoint rel err {e:.3g}")
    else:
        e = rel(ours.state[:b - 1], ref.state[:b - 1])
        if e > (1e-4 if sd == "float32" else tol):
            msg.append(f"state rel err {e:.3g}")
    return "; ".join(msg)


def state_bytes(layer) -> int:
    if layer.peer is not None or layer.rs is None:
        st = layer.state if layer.peer is None else layer.peer.state
        return st.numel() * st.element_size()
    return layer.rs.state_bytes_per_slot() * layer.rs.cursor.shape[0]


ROWS: list[dict] = []
CHECKED: dict = {}
VLLM: dict = {}
EAGER_BEST: dict = {}


def run_group(g, dev, ctx, args):
    from replaybench.models import get_model
    from replaybench.runners.kernel import Layer, _inputs
    from replaybench.timing import measure
    from replaybench.traffic import step_traffic
    from replayssm.triton import mamba2 as tk

    model = get_model(g["model"])
    method, batch, sd, lo = g["method"], g["batch"], g["sd"], g["lo"]
    backend = "vllm" if method == "vllm-eager" else "triton"
    # backend "triton": the traffic model asks the kernel tables (and OVERRIDE) for the route
    case = SimpleNamespace(method=method, batch=batch, state_dtype=sd, lo_dtype=lo, flush_period=K, buffer_len=L,
                           backend="triton")
    nbytes = step_traffic(case, model).total_bytes
    gen = torch.Generator().manual_seed(0)
    flush = method not in ("eager", "vllm-eager")
    try:
        first = Layer("mamba2", model.ssm, method, backend, batch, L if flush else 0, K if flush else 0, sd, lo, dev,
                      gen)
    except Exception as e:  # noqa: BLE001 - e.g. vLLM not importable
        log(f"skip {g['model']} {method} b{batch} {sd}/{lo}: {type(e).__name__}: {e}")
        return
    per_layer = state_bytes(first)
    nl = 1 if dev == "cpu" else max(1, min(args.max_layers, math.ceil(GiB / per_layer)))
    layers = [first] + [Layer("mamba2", model.ssm, method, backend, batch, L if flush else 0, K if flush else 0, sd,
                              lo, dev, gen) for _ in range(nl - 1)]
    inp, params = _inputs("mamba2", model.ssm, batch, dev, gen)
    idx = torch.arange(batch, dtype=torch.int32, device=dev)
    steps = K if flush else 1
    if method in ("eager", "vllm-eager"):
        steps = 4   # no per-step phase; a few steps per replay

    def sample():
        for _ in range(steps):
            for layer in layers:
                layer.step(inp, params, idx)

    short = g["model"].split("-")[2] if g["model"].startswith("nemotron") else g["model"]
    for v in g["variants"]:
        if time.time() - T0 > args.deadline:
            log(f"deadline: {short} {method} b{batch} {sd}/{lo} {v} not measured")
            continue
        tk.OVERRIDE.clear()
        ov = override_of(method, v)
        if ov is not None:
            tk.OVERRIDE[ov[0]] = ov[1]
        err = ""
        ckey = (g["model"], method, sd, lo, v)
        if backend == "triton" and ckey not in CHECKED:
            try:
                err = check(model, method, sd, lo, dev)
            except Exception as e:  # noqa: BLE001
                err = f"{type(e).__name__}: {e}"
            CHECKED[ckey] = err
        err = CHECKED.get(ckey, "")
        if err:
            log(f"CHECK FAILED {short} {method} {sd}/{lo} {v}: {err}")
            ROWS.append(dict(model=short, method=method, batch=batch, sd=sd, lo=lo, variant=v, us=float("nan"),
                             error=err))
            continue
        try:
            t = measure(sample, dev, ctx, per=steps * nl)
        except Exception as e:  # noqa: BLE001
            log(f"TIMING FAILED {short} {method} {sd}/{lo} {v}: {type(e).__name__}: {e}")
            continue
        us = t.median_us
        nb = step_traffic(case, model).total_bytes if method.startswith("replay") else nbytes   # the variant's route
        gbps = nb / us / 1e3
        base = VLLM.get((short, batch, sd if method != "replay-dual" else "float32"))
        if method == "vllm-eager":
            VLLM[(short, batch, sd)] = us
        if method == "eager":
            EAGER_BEST[(short, batch, sd)] = min(us, EAGER_BEST.get((short, batch, sd), float("inf")))
        row = dict(model=short, method=method, batch=batch, sd=sd, lo=lo, variant=v, us=us, iqr=t.iqr_us,
                   gbps=gbps, pct=100 * gbps / args.copy, vs_vllm=(base / us if base else float("nan")),
                   layers=nl, samples=t.samples, error="")
        ROWS.append(row)
        print(fmt(row), flush=True)
    tk.OVERRIDE.clear()
    del layers, first
    if dev == "cuda":
        torch.cuda.empty_cache()


HEADER = (f"{'model':6} {'method':12} {'batch':>5} {'state':9} {'low':11} {'variant':15} {'us':>9} {'iqr':>6} "
          f"{'GB/s':>7} {'%copy':>6} {'xvLLM':>6} {'lay':>4} {'n':>4}")


def fmt(r) -> str:
    return (f"{r['model']:6} {r['method']:12} {r['batch']:5d} {r['sd']:9} {r['lo']:11} {r['variant']:15} "
            f"{r['us']:9.2f} {r['iqr']:6.2f} {r['gbps']:7.0f} {r['pct']:6.1f} {r['vs_vllm']:6.3f} {r['layers']:4d} "
            f"{r['samples']:4d}")


def summary() -> None:
    print("\n=== best variant per case (xvLLM: vLLM eager us / us, same model, batch, state dtype; "
          "xEager: our best eager us / us)", flush=True)
    best = {}
    for r in ROWS:
        if r.get("error"):
            continue
        k = (r["model"], r["method"], r["batch"], r["sd"], r["lo"])
        if k not in best or r["us"] < best[k]["us"]:
            best[k] = r
    print(HEADER + f" {'xEager':>6} {'v0 us':>8}", flush=True)
    for k, r in best.items():
        v0 = next((x["us"] for x in ROWS if not x.get("error") and x["variant"] == "v0"
                   and (x["model"], x["method"], x["batch"], x["sd"], x["lo"]) == k), float("nan"))
        e = EAGER_BEST.get((r["model"], r["batch"], r["sd"] if r["method"] != "replay-dual" else "float32"))
        print(fmt(r) + f" {(e / r['us'] if e else float('nan')):6.3f} {v0:8.2f}", flush=True)
    failed = [r for r in ROWS if r.get("error")]
    for r in failed:
        print(f"CHECK FAILED: {r['model']} {r['method']} {r['sd']}/{r['lo']} {r['variant']}: {r['error']}")


def offline_regs(groups) -> None:
    """sm_90 registers / spills of every planned variant (no GPU: compile_offline on 'meta'
    tensors), with the resident programs per SM those registers allow (65536 registers,
    <= 2048 threads, <= 32 programs)."""
    from replayssm.inputs import Mamba2Shape, mamba2_params, mamba2_step_inputs
    from replayssm.state import Mamba2ReplayState, dtype_of
    from replayssm.triton import mamba2 as tk

    from replaybench.models import get_model
    seen = set()
    for g in groups:
        if g["method"] == "vllm-eager":
            continue
        d = get_model(g["model"]).ssm
        sh = Mamba2Shape(d.nheads, d.head_dim, d.d_state, d.n_groups)
        b, dev = 256, "meta"
        inp = {k: v.to(dev) for k, v in mamba2_step_inputs(sh, b).items()}
        params = {k: v.to(dev) for k, v in mamba2_params(sh).items()}
        idx = torch.zeros(b, dtype=torch.int32, device=dev)
        for v in g["variants"]:
            key = (g["model"], g["method"], g["sd"], g["lo"], v)
            if key in seen:
                continue
            seen.add(key)
            kind, ov = override_of(g["method"], v)
            tk.OVERRIDE.clear()
            tk.OVERRIDE[kind] = ov
            if kind == "eager":
                st = torch.zeros(b, d.nheads, d.head_dim, d.d_state, dtype=dtype_of(g["sd"]), device=dev)
                launches = tk.plan_eager_step(st, **inp, **params, state_indices=idx)[0]
            else:
                rs = Mamba2ReplayState.allocate(b, d.nheads, d.head_dim, d.d_state, d.n_groups, L, K,
                                                mode_of(g["method"]), g["sd"], LO[g["lo"]], torch.bfloat16, dev)
                launches = tk.plan_replay_step(rs, **inp, **params, state_indices=idx)[0]
            out = []
            for la in launches:
                r = tk.compile_offline(la)
                thr = 32 * la.meta["num_warps"]
                progs = min(32, 2048 // thr, 65536 // (thr * max(r["regs"], 1)))
                out.append(f"{la.kernel.__name__.strip('_')}: {r['regs']} regs, spill {r['spill_stores']}/"
                           f"{r['spill_loads']} B, {progs} progs/SM")
            print(f"{g['model'].split('-')[2]:6} {g['method']:12} {g['sd']:9} {g['lo']:11} {v:15} " + "; ".join(out),
                  flush=True)
    tk.OVERRIDE.clear()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deadline", type=float, default=185.0, help="seconds after start: no new measurement")
    ap.add_argument("--models", default="super,nano,ultra")
    ap.add_argument("--only", default="", help="method:batch[,...] groups to keep (e.g. eager:1,vllm-eager:1)")
    ap.add_argument("--max-layers", type=int, default=512)
    ap.add_argument("--workers", type=int, default=12, help="background compile processes (0: none)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny model on the CPU (TRITON_INTERPRET=1)")
    ap.add_argument("--variants", default="", help="replay variants to time instead of the groups' own lists "
                    "(comma list; replay and replay-dual groups)")
    ap.add_argument("--copies", default="", help="state:low[,...] groups to keep by dtypes (state float32 /"
                    " bfloat16, low none / bfloat16 / float8_e4m3; e.g. float32:bfloat16,bfloat16:none)")
    ap.add_argument("--regs", action="store_true", help="only print sm_90 registers of the variants (no GPU)")
    args = ap.parse_args()

    from replaybench.scenario import TimingConfig
    dev = "cpu" if args.cpu_smoke or not torch.cuda.is_available() else "cuda"
    if dev == "cuda":
        log(f"{torch.cuda.get_device_name()} torch {torch.__version__}")
    ctx = TimingConfig(warmup=1, min_samples=10, max_samples=40, max_time_s=0.25, rel_iqr=0.01)
    if args.cpu_smoke:
        groups = groups_for(MODELS["tiny"], nano=False)[:4]
        for g in groups:
            g["batch"] = 3
            g["variants"] = [v for v in g["variants"] if v in ("default", "v0", "f16w1-np-nt", "vllm", "e16x0w4")]
        ctx = TimingConfig(warmup=1, min_samples=1, max_samples=1, max_time_s=0.01, rel_iqr=1.0)
    else:
        names = args.models.split(",")
        groups = [g for m in ("super", "nano") if m in names for g in groups_for(MODELS[m], nano=(m == "nano"))]
        if "ultra" in names:
            groups += ultra_groups()
        groups.sort(key=lambda g: g["prio"])    # stable: Super before Nano within a priority
        if args.only:
            keep = set(args.only.split(","))
            groups = [g for g in groups if f"{g['method']}:{g['batch']}" in keep]
            if not groups:
                raise SystemExit(f"--only {args.only}: no group; names are method:batch, e.g. eager:1")
        if args.copies:
            keep = set(args.copies.split(","))
            groups = [g for g in groups if f"{g['sd']}:{g['lo']}" in keep]
            if not groups:
                raise SystemExit(f"--copies {args.copies}: no group; names are state:low, e.g. float32:bfloat16")
    if args.variants:
        for g in groups:
            if g["method"] in ("replay", "replay-dual"):
                g["variants"] = args.variants.split(",")
                for v in g["variants"]:
                    replay_variant(v)   # a bad name fails here, before any measurement
    if args.regs:
        offline_regs([g for g in groups if g["batch"] == 256])
        return 0
    args.copy = copy_ceiling(dev)
    log(f"copy ceiling {args.copy:.0f} GB/s (torch.add(x, 0, out=y), 2 x 1 GiB fp32)")
    if dev == "cuda" and args.workers > 0:
        # Compile first, time after: the workers' CUDA contexts time-slice the GPU while they
        # run (run 1 timed during compilation: IQRs of up to 18 % on the first rows).
        try:
            pool, res, n = start_background_compile(groups, args.workers)
            log(f"compiling: {n} jobs on {args.workers} workers")
            errs = [e for e in res.get(timeout=max(10.0, args.deadline / 3)) if e]
            log(f"compile done ({len(errs)} failed)" + "".join(f"\n  {e}" for e in errs[:5]))
            pool.close()
            pool.join()
        except Exception as e:  # noqa: BLE001 - the main process compiles on demand instead
            log(f"background compile: {type(e).__name__}: {e}")
            try:
                pool.terminate()
            except Exception:  # noqa: BLE001
                pass
    print(HEADER, flush=True)
    try:
        for g in groups:
            if time.time() - T0 > args.deadline:
                break
            run_group(g, dev, ctx, args)
    finally:
        summary()
    return 0


if __name__ == "__main__":
    sys.exit(main())
