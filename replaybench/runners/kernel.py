"""Kernel runner: one SSM layer op (eager / replay / dual / shared-low / speculative) at a
model's real SSM dims, checked against the reference, then timed.

A sample is `steps` decode steps over `layers` independent layer states (each with its own
checkpoint, buffer and cursors), so that the state streams from HBM and not from L2: on a
GPU the layer count is chosen so all states together are >= STATE_TARGET_BYTES. Cursors
are staggered across the batch (sequence i starts at cursor i mod K), as in serving where
sequences arrive at different times, and `steps` = K covers a whole flush period, so one
sample averages over every flush phase (batch 1 included). The reported median_us is per
step per layer: what one decode step of one SSM layer costs for the whole batch.
"""
from __future__ import annotations

import math

import torch

from replayssm import reference as R
from replayssm.inputs import (GDNShape, Mamba2Shape, gdn_step_inputs, mamba2_params, mamba2_step_inputs,
                              random_state)
from replayssm.state import GDNReplayState, Mamba2ReplayState, dtype_of

from ..models import get_model
from ..timing import measure
from ..traffic import REPLAY_METHODS, route_period, step_traffic
from . import SkipCase

STATE_TARGET_BYTES = 1 << 30      # all layers' state together: ~18x the H200's 60 MB L2
MAX_LAYERS = 64
# A CUDA-graph sample holds the same number of decode steps for every method (SAMPLE_STEPS,
# rounded up to whole flush periods), so the graph-to-graph gap each sample carries weighs the
# same on eager, vLLM and replay rows of a case set: with one step a sample, an eager case of 64
# layers at batch 1 (a 64-launch graph, ~190 us) carried it over 16x fewer launches than the
# replay case beside it (16 steps, 1024 launches). It also keeps >= 16 launches in a one-layer
# sample: a graph of one long launch ran some kernels 6-10 % slower than the same launches back
# to back (H200, tools/probe_layers.py, probe_layers_s29a.txt: our Mamba-2 eager at Ultra-550B
# dims b512 1181 us vs 1081 with 16 steps a sample; vLLM's GDN kernel at Qwen3.5-122B b512 592 vs
# 535).
SAMPLE_STEPS = 16
CHECK_TOL = {"float8_e4m3": 0.1, "bfloat16": 3e-2, "float16": 3e-2, "float32": 3e-2}
MODE_OF = {"replay": "replay", "replay-dual": "dual", "replay-shared-low": "shared-low", "spec-replay": "replay",
           "spec-replay-dual": "dual"}


def _ops(op: str, backend: str):
    """The public op module for a family, or None for the reference backend."""
    if backend == "reference":
        return None
    if backend == "triton":
        if op == "mamba2":
            from replayssm import mamba2 as m
        else:
            from replayssm import gdn as m
        return m
    raise ValueError(f"unknown backend {backend!r}; allowed: reference, triton, vllm")


class Layer:
    """One layer's state for a method, plus its step function (reference or Triton)."""

    def __init__(self, op, dims, method, backend, batch, buffer_len, flush_period, state_dtype, lo_dtype,
                 device, gen, act=torch.bfloat16):
        self.op, self.method, self.backend = op, method, backend
        self.peer = None
        if backend == "vllm":   # vLLM's own kernels, called as its layers call them
            from . import peers
            self.peer = peers.VllmEagerLayer(op, dims, batch, state_dtype, device, gen)
            return
        self.ops = _ops(op, backend)
        self.batch, self.K = batch, max(flush_period, 1)
        rows, cols, heads = _state_geometry(op, dims)
        if method in ("eager", "vllm-eager"):
            self.state = random_state(batch, heads, rows, cols, dtype_of(state_dtype), device, _device_gen(gen, device))
            self.rs = None
        else:
            mode = MODE_OF[method]
            lo = None if lo_dtype == "none" else lo_dtype
            if op == "mamba2":
                self.rs = Mamba2ReplayState.allocate(batch, dims.nheads, dims.head_dim, dims.d_state, dims.n_groups,
                                                     buffer_len, flush_period, mode, state_dtype, lo, act, device)
            else:
                self.rs = GDNReplayState.allocate(batch, dims.num_k_heads, dims.num_v_heads, dims.head_k_dim,
                                                  dims.head_v_dim, buffer_len, flush_period, mode, state_dtype, lo,
                                                  act, device)
            init = random_state(batch, heads, rows, cols, torch.float32, device, _device_gen(gen, device))
            all_slots = torch.arange(batch, device=device)
            self.rs.hi.write(all_slots, init)
            if self.rs.lo is not None:
                self.rs.lo.write(all_slots, init)
            dg = _device_gen(gen, device)
            rnd = lambda t: torch.randn(t.shape, generator=dg, device=device)  # noqa: E731
            uni = lambda t: torch.rand(t.shape, generator=dg, device=device)  # noqa: E731
            for buf in self.rs.buffers():   # never time on zeros: buffered rows hold real-looking values
                buf.copy_(rnd(buf) * 0.3)
            if op == "gdn":
                self.rs.g.copy_(torch.log(0.9 + 0.1 * uni(self.rs.g)))
                if self.rs.beta is not None:
                    self.rs.beta.copy_(0.05 + 0.9 * uni(self.rs.beta))
                if mode == "dual":   # stored u as appends would have made them (a flush recomputes them)
                    R.gdn_rederive_u(self.rs)
            else:
                self.rs.dt.copy_(0.01 + 0.2 * uni(self.rs.dt))
            self.rs.cursor.copy_((torch.arange(batch, device=device) % self.K).to(torch.int32))

    def step(self, inp, params, idx):
        """One decode step; returns the output tensor."""
        fam = self.op
        if self.peer is not None:
            return self.peer.step(inp, params, idx)
        if self.rs is None:
            if self.ops is None:
                f = R.mamba2_eager_step if fam == "mamba2" else R.gdn_eager_step
                return f(self.state, **inp, **params, state_indices=idx)
            return self.ops.eager_step(self.state, **inp, **params, state_indices=idx)
        if self.ops is None:
            f = R.mamba2_replay_step if fam == "mamba2" else R.gdn_replay_step
            return f(self.rs, **inp, **params, state_indices=idx)
        return self.ops.replay_step(self.rs, **inp, **params, state_indices=idx)


def _device_gen(gen: torch.Generator, device) -> torch.Generator:
    """A generator on `device` seeded from `gen` (large tensors are drawn where they live)."""
    return torch.Generator(device=device).manual_seed(int(torch.randint(2**31, (1,), generator=gen)))


def _state_geometry(op, dims):
    """(rows, cols, heads) of one head's state matrix."""
    if op == "mamba2":
        return dims.head_dim, dims.d_state, dims.nheads
    return dims.head_v_dim, dims.head_k_dim, dims.num_v_heads


def _inputs(op, dims, batch, device, gen):
    if op == "mamba2":
        sh = Mamba2Shape(dims.nheads, dims.head_dim, dims.d_state, dims.n_groups)
        return mamba2_step_inputs(sh, batch, device=device, gen=gen), mamba2_params(sh, device=device, gen=gen)
    sh = GDNShape(dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim)
    return gdn_step_inputs(sh, batch, device=device, gen=gen), {}


def _rel(a, b) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


def check_against_reference(case, model, device, steps: int | None = None) -> float:
    """Max relative output error of the case's backend vs the reference (same storage dtypes,
    same inputs, same initial state) over enough steps to cross a flush. Raises if too large."""
    dims, op = model.ssm, model.op
    b = min(case.batch, 8)
    gen = torch.Generator().manual_seed(case.seed + 1)
    mk = lambda backend: Layer(op, dims, case.method, backend, b, case.buffer_len, case.flush_period,  # noqa: E731
                               case.state_dtype, case.lo_dtype, device, torch.Generator().manual_seed(case.seed + 7))
    ours, ref = mk(case.backend), mk("reference")
    idx = torch.arange(b, dtype=torch.int32, device=device)
    if b > 1:
        idx[-1] = -1  # a padded row too
    worst = 0.0
    # cross at least one flush of every sequence (two on a GPU, where steps are cheap)
    default = (2 if device.startswith("cuda") else 1) * max(case.flush_period, 1) + 1
    # the layer's parameters (A, D, dt_bias) are fixed, as in a model: a buffered Mamba-2 step
    # decays its entries with the A it is given, so A drawn anew per step would make the output
    # depend on when the state was last flushed (and on the route a batch size takes)
    _, params = _inputs(op, dims, b, device, gen)
    for _ in range(steps or default):
        inp, _ = _inputs(op, dims, b, device, gen)
        y_ours, y_ref = ours.step(inp, params, idx), ref.step(inp, params, idx)
        if not torch.isfinite(y_ours).all():
            raise AssertionError("non-finite output from the kernel")
        worst = max(worst, _rel(y_ours, y_ref))
    tol = CHECK_TOL.get(case.lo_dtype if case.lo_dtype != "none" else case.state_dtype, 3e-2)
    if worst > tol:
        raise AssertionError(f"output differs from the reference: rel err {worst:.3g} > {tol}")
    return worst


def layers_for(state_bytes_per_layer: float, device: str) -> int:
    if not device.startswith("cuda"):
        return 1
    return max(1, min(MAX_LAYERS, math.ceil(STATE_TARGET_BYTES / max(state_bytes_per_layer, 1))))


def steps_per_sample(flush_period: int, layers: int, device: str) -> int:
    """Decode steps in one timed sample over `layers` layer states: on a GPU SAMPLE_STEPS rounded
    up to whole flush periods (every flush phase equally often; period 1 for methods without
    one), whatever the layer count; on the CPU one period."""
    period = max(flush_period, 1)
    if not device.startswith("cuda"):
        return period
    return period * math.ceil(SAMPLE_STEPS / period)


def workload(case, model, device: str):
    """The timed work of a decode case: (sample, steps, layers). sample() runs `steps` decode
    steps (steps_per_sample: whole flush periods) over `layers` independent layer states
    (enough that the state, by the traffic model's bytes per step, streams from HBM on a GPU),
    all with the same inputs and slot indices 0..batch-1; one sample is steps x layers units
    of work."""
    dims, op = model.ssm, model.op
    parts = step_traffic(case, model).parts
    gen = torch.Generator().manual_seed(case.seed)
    nl = layers_for((parts["state_read"] + parts["state_write"]) / 2, device)
    layers = [Layer(op, dims, case.method, case.backend, case.batch, case.buffer_len, case.flush_period,
                    case.state_dtype, case.lo_dtype, device, gen) for _ in range(nl)]
    inp, params = _inputs(op, dims, case.batch, device, gen)
    idx = torch.arange(case.batch, dtype=torch.int32, device=device)
    steps = steps_per_sample(case.flush_period, nl, device)

    def sample():
        for _ in range(steps):
            for layer in layers:
                layer.step(inp, params, idx)

    return sample, steps, nl


def run(case, ctx) -> dict:
    from . import spec
    if case.method in spec.METHODS:     # speculative rounds: runners/spec.py
        return spec.run(case, ctx)
    if case.backend == "vllm":          # vLLM's own kernels: see runners/peers.py
        from . import peers
        return peers.run(case, ctx)
    model = get_model(case.model)
    if case.method not in ("eager", "replay", "replay-dual", "replay-shared-low"):
        raise SkipCase(f"method {case.method!r} is not measured by the kernel runner yet")
    device = ctx.device
    dims, op = model.ssm, model.op
    traffic = step_traffic(case, model)
    if case.backend == "reference":
        check = float("nan")    # the reference is the oracle; its exactness is tested in tests/
    else:
        check = check_against_reference(case, model, device)
    state_bytes = traffic.parts["state_read"] + traffic.parts["state_write"]
    sample, steps, nl = workload(case, model, device)
    t = measure(sample, device, ctx.timing, per=steps * nl)
    rows, cols, heads = _state_geometry(op, dims)
    return {
        **t.columns(),
        "bytes_model": traffic.total_bytes, "read_bytes_model": traffic.read_bytes,
        "write_bytes_model": traffic.write_bytes, "flops_model": traffic.flops, "intensity": traffic.intensity,
        "state_bytes_model": state_bytes, "buffer_bytes_model": traffic.parts["buffer_read"] + traffic.parts[
            "buffer_write"],
        "check_rel_err": check, "layers": nl, "steps_per_sample": steps,
        "heads": heads, "state_rows": rows, "state_cols": cols,
        "groups": getattr(dims, "n_groups", getattr(dims, "num_k_heads", None)),
        # which route the replay step took at this batch (0: buffered; k: the small-batch route,
        # the state written every k-th step: k = 1 is eager-shaped), so a reader of a batch-1
        # row knows what was timed
        "route_period": route_period(case, model) if case.method in REPLAY_METHODS else None,
    }
