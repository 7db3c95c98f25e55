"""H200 probe: does a kernel's time per layer depend on how the timing lays out its layers?

    python3 tools/probe_layers.py [--rounds 2] [--only NAME,...]     # on the GPU machine

Two open questions of issue 3 (docs/kernels.md, sessions 17 and 28):

1. `layers`: our bf16 eager kernel ran 0.88x vLLM's at Qwen3.5-122B dims batch 512 and 0.95x at
   Ultra-550B dims batch 512 in the sweep: shapes whose 1 GiB of state is one layer, so a sample
   is one launch over one state, in place. At batch 256 (two layers) it ran 1.01x. Here the same
   kernels (the kernel runner's Layer, eager and vLLM) are timed with the layer count and the
   steps per sample varied: nl layers (1, 2, 4: 1-4 GiB), 1 or 16 steps per CUDA-graph sample.
2. `nostore`: at batch 1 the replay route is the eager step plus a cursor load, so it cannot beat
   eager unless it skips work. Would a step that skips the state write be faster at batch 1
   (the latency-bound regime)? The eager kernel as a copy with the state store removed, against
   the library's eager kernel and replay step, Qwen3.5 dims, fp32, 64 layers (sweep layout).

Rows print as measured: name, config, us per step per layer (median of the CUDA-graph samples,
replaybench.timing), with A and B interleaved over --rounds rounds.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if os.path.isdir(os.path.join(ROOT, ".vllm-stub")):
    sys.path.insert(0, os.path.join(ROOT, ".vllm-stub"))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from replayssm.triton import gdn as TK  # noqa: E402
from replayssm.triton import mamba2 as MK  # noqa: E402
from replayssm.triton.common import softplus  # noqa: E402
from replayssm.triton.gdn import _eager_tile  # noqa: E402
from replaybench.models import get_model  # noqa: E402
from replaybench.runners.kernel import Layer, _inputs, layers_for  # noqa: E402
from replaybench.scenario import TimingConfig  # noqa: E402
from replaybench.timing import measure  # noqa: E402

DEV = os.environ.get("PROBE_DEVICE", "cuda")
TIMING = TimingConfig(warmup=3, min_samples=10, max_samples=200, max_time_s=0.6, rel_iqr=0.005)


def time_layers(model_name, method, backend, batch, sd, nl, steps, K=16):
    """us per step per layer of `nl` Layers of (method, backend) stepped `steps` times a sample."""
    model = get_model(model_name)
    gen = torch.Generator().manual_seed(3)
    lo = "bfloat16" if method == "replay-dual" else "none"
    kk = K if method.startswith("replay") else 0
    layers = [Layer(model.op, model.ssm, method, backend, batch, kk, kk, sd, lo, DEV, gen) for _ in range(nl)]
    inp, params = _inputs(model.op, model.ssm, batch, DEV, gen)
    idx = torch.arange(batch, dtype=torch.int32, device=DEV)

    def sample():
        for _ in range(steps):
            for lay in layers:
                lay.step(inp, params, idx)
    t = measure(sample, DEV, TIMING, per=steps * nl)
    del layers
    torch.cuda.empty_cache()
    return t.median_us


def time_nostore(model_name, batch, nl=64, steps=16):
    model = get_model(model_name)
    gen = torch.Generator().manual_seed(3)
    layers = [Layer(model.op, model.ssm, "eager", "triton", batch, 0, 0, "float32", "none", DEV, gen)
              for _ in range(nl)]
    inp, _ = _inputs(model.op, model.ssm, batch, DEV, gen)
    idx = torch.arange(batch, dtype=torch.int32, device=DEV)
    o = torch.empty_like(inp["v"])
    scale = inp["k"].shape[-1] ** -0.5
    plans = []
    for lay in layers:
        _, grid, args, meta = TK.plan_eager(lay.state, inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], idx,
                                            scale, o)
        plans.append((_eager_probe_kernel, grid, args, dict(_probe_meta(meta), STORE_STATE=False)))
    del layers
    return _time_launches(plans, steps, nl)


def _probe_meta(meta: dict) -> dict:
    """An eager plan's launch meta for _eager_probe_kernel (one tile a program)."""
    return {k: v for k, v in meta.items() if k != "TILES"}


@triton.jit
def _eager_probe_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, s_ptr,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
    LOAD_EV: tl.constexpr = "evict_first", STORE_EV: tl.constexpr = "evict_first", STORE_STATE: tl.constexpr = True,
):
    """replayssm's _gdn_eager_kernel (as of session 29's start) with the state's eviction
    policies as parameters, and STORE_STATE False: without the state store (what the write
    costs; the update is kept live through o)."""
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kh = h // (HV // HK)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    slot = tl.load(idx_ptr + b)
    if slot >= 0:
        row_off = (slot.to(tl.int64) * HV + h) * DV + rows
        tile = row_off[:, None] * DK + cols[None, :]
        mask2 = rmask[:, None] & cmask[None, :]
        S = tl.load(s_ptr + tile, mask=mask2, other=0.0, eviction_policy=LOAD_EV).to(tl.float32)
        S, o = _eager_tile(S, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols, cmask,
                           sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
        if STORE_STATE:
            tl.store(s_ptr + tile, S.to(s_ptr.dtype.element_ty), mask=mask2, eviction_policy=STORE_EV)
        else:
            o = o + 0.0 * tl.sum(S, 1)
        tl.store(o_ptr + b * sob + h * soh + rows, o.to(o_ptr.dtype.element_ty), mask=rmask)


def time_eager_launches(model_name, batch, sd, nl, steps, parts=1, ev=None, config=None):
    """us per step per layer of our GDN eager step over nl layers, each step as `parts` launches
    over equal slices of the batch; ev = (load, store) eviction policies: the probe kernel;
    config: a launch config over the table's row (the library kernel)."""
    model = get_model(model_name)
    gen = torch.Generator().manual_seed(3)
    layers = [Layer(model.op, model.ssm, "eager", "triton", batch, 0, 0, sd, "none", DEV, gen) for _ in range(nl)]
    inp, _ = _inputs(model.op, model.ssm, batch, DEV, gen)
    idx = torch.arange(batch, dtype=torch.int32, device=DEV)
    o = torch.empty_like(inp["v"])
    scale = inp["k"].shape[-1] ** -0.5
    cut = [batch * i // parts for i in range(parts + 1)]
    plans = []
    for lay in layers:
        for a, z in zip(cut, cut[1:]):
            kern, grid, args, meta = TK.plan_eager(lay.state, *(inp[n][a:z] for n in ("q", "k", "v", "g", "beta")),
                                                   idx[a:z], scale, o[a:z],
                                                   config if ev is None else dict(config or {}, TILES=1))
            if ev is not None:
                kern, meta = _eager_probe_kernel, {**_probe_meta(meta), "LOAD_EV": ev[0], "STORE_EV": ev[1]}
            plans.append((kern, grid, args, meta))

    del layers
    return _time_launches(plans, steps, nl)


def launch_plans(plans) -> None:
    """One step: every launch of `plans` ((kernel, grid, args, meta), one a layer), in order."""
    for kern, grid, args, meta in plans:
        kern[grid](*args, **meta)


def _time_launches(plans, steps, nl):
    """us per launch of `plans` ((kernel, grid, args, meta) a layer step) run `steps` times a
    CUDA-graph sample over nl layers' worth of launches."""
    def sample():
        for _ in range(steps):
            launch_plans(plans)
    t = measure(sample, DEV, TIMING, per=steps * nl)
    torch.cuda.empty_cache()
    return t.median_us


@triton.jit
def _m2_eager_probe_kernel(
    st_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr, idx_ptr,
    P, N, HPG,
    s_st_s, s_st_h, s_st_p,
    s_x_b, s_x_h, s_dt_b, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_y_b, s_y_h,
    BLOCK_P: tl.constexpr, ROW_CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, EXACT: tl.constexpr, EVICT: tl.constexpr,
    STORE_STATE: tl.constexpr = True,
):
    """replayssm's Mamba-2 _eager_kernel (session 32's start) with STORE_STATE False: without
    the state store (what the write costs at batch 1-2; the update is kept live through y)."""
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // HPG
    slot, live = MK._slot_of(idx_ptr, b, HAS_IDX)
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
        S = MK._load_state(st_ptr, st_ptr, st_base, 0, offs_p, offs_n, s_st_p, mask, mask_p, False, EVICT)
        S = a * S + (dt_v * xv)[:, None] * Bv[None, :]
        if STORE_STATE:
            MK._store_state(st_ptr, st_ptr, st_base, 0, offs_p, offs_n, s_st_p, mask, mask_p, S, False, EXACT,
                            EVICT)
        MK._finish_y(tl.sum(S * Cv[None, :], axis=1), xv, Dh, z_ptr + b * s_z_b + h * s_z_h,
                     y_ptr + b * s_y_b + h * s_y_h, offs_p, mask_p, in_p, HAS_Z, EXACT)


def m2_eager_plans(model_name, batch, store=True):
    """The Mamba-2 eager step as the probe copy (store False: without its state store), fp32,
    the sweep's layer count: ([(kernel, grid, args, meta)] one launch per layer, nl)."""
    model = get_model(model_name)
    gen = torch.Generator().manual_seed(3)
    nl = sweep_layers(model_name, batch)
    layers = [Layer(model.op, model.ssm, "eager", "triton", batch, 0, 0, "float32", "none", DEV, gen)
              for _ in range(nl)]
    inp, params = _inputs(model.op, model.ssm, batch, DEV, gen)
    idx = torch.arange(batch, dtype=torch.int32, device=DEV)
    y = torch.empty_like(inp["x"])
    plans = []
    for lay in layers:
        (ln,), _ = MK.plan_eager_step(lay.state, **inp, **params, state_indices=idx, out=y)
        plans.append((_m2_eager_probe_kernel, ln.grid, ln.args, dict(ln.meta, STORE_STATE=store)))
    return plans, nl


def time_m2_eager(model_name, batch, store=True, steps=16):
    """us per step per layer of m2_eager_plans' launches in a CUDA graph."""
    plans, nl = m2_eager_plans(model_name, batch, store)
    return _time_launches(plans, steps, nl)


@contextlib.contextmanager
def m2_route(route_k=None, block_p=None, warps=None, maxnreg=None):
    """Within the block, Mamba-2's replay step forced onto the small-batch route
    (OVERRIDE["replay"]: route "eager", route_k, block_p x warps, maxnreg); route_k None: the
    table as shipped. The override is restored after."""
    saved = dict(MK.OVERRIDE.get("replay", {}))
    try:
        if route_k is not None:
            ov = dict(route="eager", route_k=route_k, maxnreg=maxnreg)
            if block_p is not None:
                ov.update(block_p=block_p, warps=warps)
            MK.OVERRIDE["replay"] = ov
        yield
    finally:
        MK.OVERRIDE["replay"] = saved


def time_m2_route(model_name, method, batch, route_k=None, block_p=None, warps=None, maxnreg=None, steps=16):
    """us per step per layer of a Mamba-2 replay method through the sweep's Layer objects, with
    the small-batch route forced (m2_route; route_k None: the table's row as shipped), the
    sweep's layer count."""
    with m2_route(route_k, block_p, warps, maxnreg):
        return time_layers(model_name, method, "triton", batch, "float32", sweep_layers(model_name, batch), steps)


def sweep_layers(model_name, batch) -> int:
    """The sweep's layer count for an fp32 state at this batch (runners.kernel.layers_for: >= 1
    GiB of state, at most 64 layers)."""
    return layers_for(batch * get_model(model_name).state_bytes_per_layer(), "cuda")


@contextlib.contextmanager
def patched_route(batch, route_k=None, route=None):
    """Within the block, the GDN table's small-batch route row replaced by `route` (a dict:
    BLOCK_V, num_warps, maxnreg, ...; None: the row's own) with ROUTE_K = route_k, and covering
    `batch`; both None: the row as shipped. The table is restored after."""
    rows = TK.CONFIGS["replay"]
    saved = list(rows)
    try:
        if route is not None or route_k is not None:
            i = next(j for j, r in enumerate(rows) if len(r) > 3 and r[3].get("EAGER_ROUTE"))
            opts = dict(route if route is not None else rows[i][3], EAGER_ROUTE=True)
            if route_k is not None:
                opts["ROUTE_K"] = route_k
            bv, nw = opts.pop("BLOCK_V", rows[i][1]), opts.pop("num_warps", rows[i][2])
            rows[i] = (max(rows[i][0], batch), bv, nw, opts)
        yield
    finally:
        rows[:] = saved


def time_route(model_name, method, batch, route_k=None, route=None, steps=16, sd="float32"):
    """us per step per layer of a replay method through the sweep's Layer objects, the table's
    small-batch route row replaced by `route` (a dict: BLOCK_V, num_warps, maxnreg, ...) with
    ROUTE_K = route_k (None: the row as shipped; patched_route); eager methods as they are.
    Layers: >= 1 GiB of fp32 state (at most 64), as the sweep lays them out; `steps` steps a
    sample (SAMPLE_STEPS)."""
    with patched_route(batch, route_k, route):
        return time_layers(model_name, method, "vllm" if method == "vllm-eager" else "triton", batch, sd,
                           sweep_layers(model_name, batch), steps)


def _power_w() -> float:
    try:
        import pynvml
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
        return pynvml.nvmlDeviceGetPowerUsage(h) / 1e3, pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
    except Exception:
        return float("nan"), float("nan")


def time_fresh(model_name, method, batch, sd, fill="dense", ev=None, alpha_one=False, reps=30, steps=16):
    """(us per step, W, MHz, zero fraction after) of one layer stepped `steps` times a CUDA-graph
    replay, timed over `reps` replays right after the state is filled: "dense" (randn x 0.5, what
    a layer starts from) or "rank1" (a x b^T per head: the fixed point identical inputs drive
    an eager GDN state to). vLLM's layer: alpha_one sets its A_log so that alpha ~ 1 (the state
    stays dense over the timing, as ours with alpha in [0.9, 1])."""
    import statistics
    from replaybench.timing import capture
    model = get_model(model_name)
    gen = torch.Generator().manual_seed(3)
    be = "vllm" if method == "vllm-eager" else "triton"
    lay = Layer(model.op, model.ssm, method, be, batch, 0, 0, sd, "none", DEV, gen)
    inp, params = _inputs(model.op, model.ssm, batch, DEV, gen)
    idx = torch.arange(batch, dtype=torch.int32, device=DEV)
    st = lay.peer.state[1:] if lay.peer is not None else lay.state
    if lay.peer is not None and alpha_one:
        lay.peer.A_log.fill_(-9.0)
    o = torch.empty_like(inp["v"]) if model.op == "gdn" else None
    if ev is not None:
        kern, grid, args, meta = TK.plan_eager(lay.state, inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], idx,
                                               inp["k"].shape[-1] ** -0.5, o)
        meta = dict(meta, LOAD_EV=ev[0], STORE_EV=ev[1])
        fn = lambda: kern[grid](*args, **meta)  # noqa: E731
    else:
        fn = lambda: lay.step(inp, params, idx)  # noqa: E731

    def sample():
        for _ in range(steps):
            fn()
    sample()
    g = capture(sample)
    dg = torch.Generator(device=DEV).manual_seed(7)
    shp = st.shape
    if fill == "dense":
        st.copy_((torch.randn(shp, generator=dg, device=DEV) * 0.5).to(st.dtype))
    else:
        a = torch.randn(*shp[:-1], 1, generator=dg, device=DEV)
        b = torch.randn(*shp[:-2], 1, shp[-1], generator=dg, device=DEV)
        st.copy_((a * b * 0.5).to(st.dtype))
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        e1.synchronize()
        ts.append(e0.elapsed_time(e1) * 1e3 / steps)
    w, mhz = _power_w()
    zeros = float((st == 0).float().mean())
    del g, lay
    torch.cuda.empty_cache()
    return statistics.median(ts), w, mhz, zeros


def probes():
    """(name, label, thunk) in run order; A/B pairs adjacent so --rounds interleaves them."""
    out = []
    for model, batch, sd in (("qwen3.5-122b-a10b", 512, "bfloat16"), ("qwen3.5-122b-a10b", 256, "bfloat16"),
                             ("nemotron-3-ultra-550b-a55b", 512, "bfloat16"), ("qwen3.5-122b-a10b", 512, "float32")):
        for nl, steps in ((1, 1), (1, 16), (2, 1), (2, 16), (4, 4)):
            for method, backend in (("eager", "triton"), ("vllm-eager", "vllm")):
                label = f"{model} b{batch} {sd} nl{nl} steps{steps} {method}"
                out.append(("layers", label, (lambda m=model, me=method, be=backend, b=batch, s=sd, n=nl, st=steps:
                                              time_layers(m, me, be, b, s, n, st))))
    q122 = "qwen3.5-122b-a10b"
    # session 29, third call: bf16 b512 with and without the state's eviction hints, against
    # vLLM's kernel, in three layouts (tune_gdn_s29a.txt had ours at 607-613 us either way, nl 1)
    for model, b in ((q122, 512), ("qwen3.5-4b", 512), (q122, 256)):
        for nl, steps in ((1, 16), (2, 8), (4, 4)):
            tag = f"{model} b{b} bfloat16 nl{nl} steps{steps}"
            out.append(("b512ab", f"{tag} eager (hints)", lambda m=model, b=b, n=nl, st=steps:
                        time_eager_launches(m, b, "bfloat16", n, st)))
            out.append(("b512ab", f"{tag} eager-ev load=- store=-", lambda m=model, b=b, n=nl, st=steps:
                        time_eager_launches(m, b, "bfloat16", n, st, 1, ("", ""))))
            out.append(("b512ab", f"{tag} vllm-eager", lambda m=model, b=b, n=nl, st=steps:
                        time_layers(m, "vllm-eager", "vllm", b, "bfloat16", n, st)))
    for b in (320, 384, 448, 512):     # where does bf16 eager fall behind? (2 layers, 8 steps a sample)
        out.append(("b512", f"{q122} b{b} bfloat16 nl2 steps8 eager", lambda b=b: time_layers(
            q122, "eager", "triton", b, "bfloat16", 2, 8)))
        out.append(("b512", f"{q122} b{b} bfloat16 nl2 steps8 vllm-eager", lambda b=b: time_layers(
            q122, "vllm-eager", "vllm", b, "bfloat16", 2, 8)))
    for parts in (1, 2, 4):
        out.append(("b512", f"{q122} b512 bfloat16 nl2 steps8 eager as {parts} launches", lambda p=parts:
                    time_eager_launches(q122, 512, "bfloat16", 2, 8, parts)))
    for ev in (("evict_first", "evict_first"), ("", ""), ("evict_first", ""), ("", "evict_first"),
               ("evict_first", "evict_last")):
        out.append(("b512", f"{q122} b512 bfloat16 nl2 steps8 eager-ev load={ev[0] or '-'} store={ev[1] or '-'}",
                    lambda ev=ev: time_eager_launches(q122, 512, "bfloat16", 2, 8, 1, ev)))
    out.append(("b512", f"{q122} b256 float32 nl2 steps8 eager", lambda: time_layers(
        q122, "eager", "triton", 256, "float32", 2, 8)))
    out.append(("b512", f"{q122} b256 float32 nl2 steps8 vllm-eager", lambda: time_layers(
        q122, "vllm-eager", "vllm", 256, "float32", 2, 8)))
    # session 29, fourth call: is our bf16 eager's time data-dependent? Fresh dense vs rank-1
    # states, 30 replays of 16 steps right after the fill (the tuner's timing is this, on dense
    # states; the probes above ran long enough for identical inputs to wear the state down)
    for model, b, sd in ((q122, 512, "bfloat16"), (q122, 256, "float32"), ("qwen3.5-4b", 512, "bfloat16"),
                         ("nemotron-3-ultra-550b-a55b", 512, "bfloat16")):
        for fill in ("dense", "rank1"):
            tag = f"{model} b{b} {sd} {fill}"
            out.append(("dense", f"{tag} eager", lambda m=model, b=b, s=sd, f=fill:
                        time_fresh(m, "eager", b, s, f)))
            if model != "nemotron-3-ultra-550b-a55b":
                out.append(("dense", f"{tag} eager-ev load=- store=-", lambda m=model, b=b, s=sd, f=fill:
                            time_fresh(m, "eager", b, s, f, ("", ""))))
                out.append(("dense", f"{tag} vllm-eager alpha~1", lambda m=model, b=b, s=sd, f=fill:
                            time_fresh(m, "vllm-eager", b, s, f, alpha_one=True)))
            out.append(("dense", f"{tag} vllm-eager", lambda m=model, b=b, s=sd, f=fill:
                        time_fresh(m, "vllm-eager", b, s, f)))
    # session 29, fifth call: two tiles a program (TILES 2: both loads issued first), with and
    # without the eviction hints, against the table's row and vLLM's kernel
    nh = {"LOAD_EV": "", "STORE_EV": ""}
    for model, b, sd, nl, steps in ((q122, 512, "bfloat16", 1, 16), ("qwen3.5-4b", 512, "bfloat16", 1, 16),
                                    (q122, 256, "bfloat16", 2, 8), (q122, 64, "bfloat16", 8, 2),
                                    (q122, 512, "float32", 1, 16), (q122, 256, "float32", 1, 16),
                                    ("qwen3.5-4b", 256, "float32", 2, 8), (q122, 32, "float32", 16, 1)):
        tile = 4 if sd == "float32" else 8
        for cfg in ({}, nh, {"TILES": 2}, dict(nh, TILES=2), {"BLOCK_V": tile // 2, "TILES": 2},
                    dict(nh, BLOCK_V=tile // 2, TILES=2)):
            tag = f"{model} b{b} {sd} nl{nl} steps{steps} eager {cfg or 'table'}"
            out.append(("tiles", tag, lambda m=model, b=b, s=sd, n=nl, st=steps, c=cfg:
                        time_eager_launches(m, b, s, n, st, config=c)))
        out.append(("tiles", f"{model} b{b} {sd} nl{nl} steps{steps} vllm-eager", lambda m=model, b=b, s=sd, n=nl,
                    st=steps: time_layers(m, "vllm-eager", "vllm", b, s, n, st)))
    # session 30: the deferred small-batch route (ROUTE_K: the state written every k-th step, the
    # cursor moved without a ticket) against our eager kernel and the every-step route, in the
    # sweep's layout (>= 1 GiB of layers, 16 steps a sample); eager also at 1 step a sample (the
    # layout the sweep used for eager until this session). First call (probe_layers_s30a.txt):
    # the entries' loads masked by the cursor, and a 56-register budget: slower everywhere
    # but b8-b32 at 4 x 1 without the budget; the list below is the second call's
    for model in ("qwen3.5-4b", q122):
        out.append(("defer", f"{model} b1 f32 eager steps1", lambda m=model: time_route(m, "eager", 1, steps=1)))
        for b in (1, 2, 4, 8, 16, 32, 64):
            tag = f"{model} b{b} f32"
            out.append(("defer", f"{tag} eager", lambda m=model, b=b: time_route(m, "eager", b)))
            out.append(("defer", f"{tag} replay table", lambda m=model, b=b: time_route(m, "replay", b)))
            for k, bv in ((2, 4), (2, 8), (3, 4), (4, 4), (4, 8)):
                out.append(("defer", f"{tag} replay route k{k} {bv}x1", lambda m=model, b=b, k=k, bv=bv: time_route(
                    m, "replay", b, k, {"BLOCK_V": bv, "num_warps": 1})))
        for b in (1, 4, 8, 16):
            tag = f"{model} b{b} f32+bf16"
            out.append(("defer", f"{tag} replay-dual table", lambda m=model, b=b: time_route(m, "replay-dual", b)))
            for k in (2, 4):
                out.append(("defer", f"{tag} replay-dual route k{k} 4x1", lambda m=model, b=b, k=k:
                            time_route(m, "replay-dual", b, k, {"BLOCK_V": 4, "num_warps": 1})))
    # session 30, fourth call: the deferred route's tile at batch 1-4 (its per-program work, the
    # epoch byte and the pending entry's loads and norm, falls with fewer, larger programs)
    for model in ("qwen3.5-4b", q122):
        for b in (1, 2, 4):
            tag = f"{model} b{b} f32"
            out.append(("defer_tiles", f"{tag} eager", lambda m=model, b=b: time_route(m, "eager", b)))
            out.append(("defer_tiles", f"{tag} replay table", lambda m=model, b=b: time_route(m, "replay", b)))
            for bv, nw in ((8, 1), (8, 2), (16, 1), (16, 2), (16, 4), (32, 2), (32, 4)):
                out.append(("defer_tiles", f"{tag} replay route k2 {bv}x{nw}", lambda m=model, b=b, bv=bv, nw=nw:
                            time_route(m, "replay", b, 2, {"BLOCK_V": bv, "num_warps": nw})))
    # session 30, fifth call: the every-step route's register budget at batch 1-4. Under the
    # table's 56 registers ptxas issues two of the tile's four 16-byte loads after the inputs'
    # round trip (the k / q norms' shuffles), without it (64) all four before (sm_90 SASS)
    for model in ("qwen3.5-4b", q122):
        for b in (1, 4):
            tag = f"{model} b{b} f32"
            out.append(("route_regs", f"{tag} eager", lambda m=model, b=b: time_route(m, "eager", b)))
            for regs in (56, None, 64, 72):
                cfg = {"BLOCK_V": 4, "num_warps": 1, **({"maxnreg": regs} if regs else {})}
                out.append(("route_regs", f"{tag} replay route 4x1 maxnreg {regs or '-'}", lambda m=model, b=b, c=cfg:
                            time_route(m, "replay", b, 1, c)))
            if b == 1:
                for regs in (56, None):
                    cfg = {"BLOCK_V": 4, "num_warps": 1, **({"maxnreg": regs} if regs else {})}
                    out.append(("route_regs", f"{model} b1 f32+bf16 replay-dual route 4x1 maxnreg {regs or '-'}",
                                lambda m=model, c=cfg: time_route(m, "replay-dual", 1, 1, c)))
    # session 31: the deferred route (its 4-, 8- and 16-row tiles) against eager and the table at
    # batch 1-16; the closed forms and the evict-last entry were timed with it (probe_layers_s31a-e)
    for model in ("qwen3.5-4b", q122):
        for b in (1, 2, 4, 8, 16):
            tag = f"{model} b{b} f32"
            out.append(("defer2", f"{tag} eager", lambda m=model, b=b: time_route(m, "eager", b)))
            out.append(("defer2", f"{tag} replay table", lambda m=model, b=b: time_route(m, "replay", b)))
            for bv in (4, 8, 16):
                out.append(("defer2", f"{tag} replay route k2 {bv}x1", lambda m=model, b=b, bv=bv: time_route(
                    m, "replay", b, 2, {"BLOCK_V": bv, "num_warps": 1})))
        for b in (1, 4, 16):
            tag = f"{model} b{b} f32+bf16"
            out.append(("defer2", f"{tag} replay-dual table", lambda m=model, b=b: time_route(m, "replay-dual", b)))
            for bv in (4, 16):
                out.append(("defer2", f"{tag} replay-dual route k2 {bv}x1", lambda m=model, b=b, bv=bv:
                            time_route(m, "replay-dual", b, 2, {"BLOCK_V": bv, "num_warps": 1})))
    # session 31: Mamba-2's every-step route at batch 1-2 against our eager kernel, >= 1 GiB of
    # layers (the route with its step ahead of the cursor's branch was timed with it: _s31f)
    for model in ("nemotron-3-nano-4b", "nemotron-3-super-120b-a12b"):
        for b in (1, 2):
            nl = sweep_layers(model, b)
            for method in ("eager", "replay", "replay-dual"):
                out.append(("m2route", f"{model} b{b} f32 {method}", lambda m=model, b=b, n=nl, me=method:
                            time_layers(m, me, "triton", b, "float32", n, 16)))
    # session 32: what the Mamba-2 eager step's state write costs at batch 1-4 (a route that
    # writes the state every other step would save up to that on its other steps)
    for model in ("nemotron-3-nano-4b", "nemotron-3-super-120b-a12b"):
        for b in (1, 2, 4):
            nl = sweep_layers(model, b)
            out.append(("m2nostore", f"{model} b{b} f32 eager", lambda m=model, b=b, n=nl:
                        time_layers(m, "eager", "triton", b, "float32", n, 16)))
            out.append(("m2nostore", f"{model} b{b} f32 eager-probe", lambda m=model, b=b: time_m2_eager(m, b)))
            out.append(("m2nostore", f"{model} b{b} f32 eager-nostore", lambda m=model, b=b:
                        time_m2_eager(m, b, store=False)))
            out.append(("m2nostore", f"{model} b{b} f32 replay", lambda m=model, b=b, n=nl:
                        time_layers(m, "replay", "triton", b, "float32", n, 16)))
    # session 32: Mamba-2's deferred route (route_k: the state written every k-th step, the
    # entries between appended to the buffer) against our eager kernel and the every-step route
    for model, tiles in (("nemotron-3-nano-4b", ((8, 1), (16, 2), (16, 4))),
                         ("nemotron-3-super-120b-a12b", ((32, 8), (16, 4), (64, 8)))):
        for b in (1, 2, 4):
            tag = f"{model} b{b} f32"
            nl = sweep_layers(model, b)
            out.append(("m2defer", f"{tag} eager", lambda m=model, b=b, n=nl:
                        time_layers(m, "eager", "triton", b, "float32", n, 16)))
            out.append(("m2defer", f"{tag} replay table", lambda m=model, b=b: time_m2_route(m, "replay", b)))
            bp, nw = tiles[0]
            for k in (1, 2, 3, 4):
                out.append(("m2defer", f"{tag} replay route k{k} {bp}x{nw}", lambda m=model, b=b, k=k, bp=bp, nw=nw:
                            time_m2_route(m, "replay", b, k, bp, nw)))
            for bp2, nw2 in tiles[1:]:
                out.append(("m2defer", f"{tag} replay route k2 {bp2}x{nw2}", lambda m=model, b=b, bp=bp2, nw=nw2:
                            time_m2_route(m, "replay", b, 2, bp, nw)))
            if bp == 32:    # 116 registers unbudgeted: 2 programs an SM (64: 4, with a spill; 72: 3)
                for regs in (64, 72):
                    out.append(("m2defer", f"{tag} replay route k2 {bp}x{nw} maxnreg {regs}", lambda m=model, b=b,
                                r=regs: time_m2_route(m, "replay", b, 2, 32, 8, r)))
            out.append(("m2defer", f"{tag}+bf16 replay-dual table", lambda m=model, b=b:
                        time_m2_route(m, "replay-dual", b)))
            out.append(("m2defer", f"{tag}+bf16 replay-dual route k2 {bp}x{nw}", lambda m=model, b=b, bp=bp, nw=nw:
                        time_m2_route(m, "replay-dual", b, 2, bp, nw)))
    for model in ("qwen3.5-4b", "qwen3.5-122b-a10b"):
        out.append(("nostore", f"{model} b1 float32 eager", lambda m=model: time_layers(m, "eager", "triton", 1,
                                                                                         "float32", 64, 16)))
        out.append(("nostore", f"{model} b1 float32 eager-nostore", lambda m=model: time_nostore(m, 1)))
        out.append(("nostore", f"{model} b1 float32 replay", lambda m=model: time_layers(m, "replay", "triton", 1,
                                                                                          "float32", 64, 16)))
        out.append(("nostore", f"{model} b1 float32 replay-dual", lambda m=model: time_layers(
            m, "replay-dual", "triton", 1, "float32", 64, 16)))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--only", default="", help="comma list of probe names (layers, b512, b512ab, dense, tiles, nostore, "
                                               "defer, defer_tiles, route_regs, defer2, m2route, m2nostore, m2defer)")
    ap.add_argument("--deadline", type=float, default=400.0, help="seconds: start no probe after this")
    a = ap.parse_args()
    only = {s for s in a.only.split(",") if s}
    t0 = time.time()
    todo = [p for p in probes() if not only or p[0] in only]
    print(f"# {torch.cuda.get_device_name()}  torch {torch.__version__}  triton {triton.__version__}", flush=True)
    for r in range(a.rounds):
        for name, label, fn in todo:
            if time.time() - t0 > a.deadline:
                print(f"# deadline: skipped {label} (round {r})", flush=True)
                continue
            try:
                res = fn()
                if isinstance(res, tuple):
                    us, w, mhz, z = res
                    print(f"{name:8s} r{r} {label:70s} {us:10.2f} us  {w:6.0f} W {mhz:5.0f} MHz  zeros {z:.3f}",
                          flush=True)
                else:
                    print(f"{name:8s} r{r} {label:70s} {res:10.2f} us", flush=True)
            except Exception as e:  # a probe that fails is reported, the rest go on
                print(f"{name:8s} r{r} {label:70s} ERROR {type(e).__name__}: {str(e)[:200]}", flush=True)


if __name__ == "__main__":
    main()
