"""What the runners share: one layer's state and step, inputs at a model's dims, the layer
count and steps of a timed sample, and the output check's tolerance and error measure.

The kernel, speculative, layer and peer runners import this module, never each other's
helpers (runners/kernel.py dispatches a case to runners/spec.py or runners/peers.py by
its method's ``runner``, replaybench.methods).
"""
from __future__ import annotations

import math

import torch

from replayssm import reference as R
from replayssm.inputs import (GDNShape, Mamba2Shape, gdn_step_inputs, mamba2_params, mamba2_step_inputs,
                              random_state)
from replayssm.state import GDNReplayState, Mamba2ReplayState, dtype_of

from ..methods import METHODS

STATE_TARGET_BYTES = 1 << 30      # all layers' state together: ~18x the H200's 60 MB L2
MAX_LAYERS = 64
# A CUDA-graph sample holds the same number of decode steps for every method (SAMPLE_STEPS,
# rounded up to whole flush periods), so the graph-to-graph gap each sample carries weighs the
# same on eager, vLLM and replay rows of a case set, and a one-layer sample still holds >= 16
# launches: a graph of one long launch ran some kernels 6-10 % slower than the same launches
# back to back on the H200.
SAMPLE_STEPS = 16
CHECK_TOL = {"float8_e4m3": 0.1, "bfloat16": 3e-2, "float16": 3e-2, "float32": 3e-2}


def check_tol(case) -> float:
    """The output check's tolerance: by the dtype the case's steps read (the low copy if any)."""
    return CHECK_TOL.get(case.lo_dtype if case.lo_dtype != "none" else case.state_dtype, 3e-2)


def family(op: str):
    """The public op module of a family (replayssm.mamba2 / replayssm.gdn)."""
    import importlib
    return importlib.import_module(f"replayssm.{op}")


def ops(op: str, backend: str):
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


def device_gen(gen: torch.Generator, device) -> torch.Generator:
    """A generator on `device` seeded from `gen` (large tensors are drawn where they live)."""
    return torch.Generator(device=device).manual_seed(int(torch.randint(2**31, (1,), generator=gen)))


def state_geometry(op, dims) -> tuple[int, int, int]:
    """(rows, cols, heads) of one head's state matrix."""
    if op == "mamba2":
        return dims.head_dim, dims.d_state, dims.nheads
    if op == "gdn":
        return dims.head_v_dim, dims.head_k_dim, dims.num_v_heads
    raise ValueError(f"unknown op {op!r}; allowed: mamba2, gdn")


def shape_of(op, dims):
    """The kernel library's op shape (replayssm.inputs) for a model's SSM dims."""
    if op == "mamba2":
        return Mamba2Shape(dims.nheads, dims.head_dim, dims.d_state, dims.n_groups)
    return GDNShape(dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim)


def step_inputs(op, dims, batch, device, gen, T: int | None = None, act=torch.bfloat16):
    """(inputs, params) of one decode step (T None) or of one round of T drafts ([b, T, ...])."""
    sh = shape_of(op, dims)
    if op == "mamba2":
        return (mamba2_step_inputs(sh, batch, T, act_dtype=act, device=device, gen=gen),
                mamba2_params(sh, device=device, gen=gen))
    return gdn_step_inputs(sh, batch, T, act_dtype=act, device=device, gen=gen), {}


def rel_err(a, b) -> float:
    """Relative L2 error of a against b."""
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30)).item()


class Layer:
    """One layer's state for a method of ours, plus its step function (reference or Triton)."""

    def __init__(self, op, dims, method, backend, batch, buffer_len, flush_period, state_dtype, lo_dtype,
                 device, gen, act=torch.bfloat16, options=None, spec_window: int = 0):
        self.op, self.method, self.backend = op, method, backend
        # the family's frozen options (replayssm.<family>.options; None: what ships), which
        # `replaybench tune` sets to time a variant of the launch table
        self.kw = {} if options is None else {"options": options}
        self.ops = ops(op, backend)
        self.batch, self.K = batch, max(flush_period, 1)
        rows, cols, heads = state_geometry(op, dims)
        mode = METHODS[method].mode
        if not mode:
            self.state = random_state(batch, heads, rows, cols, dtype_of(state_dtype), device, device_gen(gen, device))
            self.rs = None
            return
        lo = None if lo_dtype == "none" else lo_dtype
        if op == "mamba2":
            self.rs = Mamba2ReplayState.allocate(batch, dims.nheads, dims.head_dim, dims.d_state, dims.n_groups,
                                                 buffer_len, flush_period, mode, state_dtype, lo, act, device,
                                                 spec_window=spec_window)
        else:
            self.rs = GDNReplayState.allocate(batch, dims.num_k_heads, dims.num_v_heads, dims.head_k_dim,
                                              dims.head_v_dim, buffer_len, flush_period, mode, state_dtype, lo,
                                              act, device, spec_window=spec_window)
        init = random_state(batch, heads, rows, cols, torch.float32, device, device_gen(gen, device))
        family(op).load_state(self.rs, init)
        dg = device_gen(gen, device)
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
        if self.rs is None:
            if self.ops is None:
                f = R.mamba2_eager_step if fam == "mamba2" else R.gdn_eager_step
                return f(self.state, **inp, **params, state_indices=idx)
            return self.ops.eager_step(self.state, **inp, **params, state_indices=idx, **self.kw)
        if self.ops is None:
            f = R.mamba2_replay_step if fam == "mamba2" else R.gdn_replay_step
            return f(self.rs, **inp, **params, state_indices=idx)
        return self.ops.replay_step(self.rs, **inp, **params, state_indices=idx, **self.kw)


def layers_for(state_bytes_per_layer: float, device: str) -> int:
    """Independent layer states per sample: on a GPU enough that they stream from HBM, not L2."""
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
