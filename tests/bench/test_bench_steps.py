"""Example GPU benchmarks over this project's kernels, written as ordinary tests.

    pytest tests/bench --benchmark-autosave                                   # store a baseline
    pytest tests/bench --benchmark-compare --benchmark-compare-fail=median:3%  # gate against it

One sample is a whole flush period (K decode steps) over enough independent layer states that
they stream from HBM, as replaybench's kernel runner measures (runners/kernel.py); the stored
time is per step per layer. Without CUDA every test here skips at set-up with the fixture's
reason (replaybench/pytest_plugin.py). The fixture comes from the installed package's pytest
plugin (entry point pytest11 `replaybench`; `pip install -e .`).
"""
import math

import pytest

from replaybench.models import get_model

STATE_TARGET_BYTES = 1 << 30        # all layers' states together, >> the L2 cache
MAX_LAYERS = 64
K = 16                              # buffer length = flush period
DEVICE = "cuda"


def _layers(state_bytes_per_layer: int) -> int:
    return max(1, min(MAX_LAYERS, math.ceil(STATE_TARGET_BYTES / state_bytes_per_layer)))


def _replay_layer(op: str, dims, batch: int, device: str, gen):
    """One layer's replay state (fp32 checkpoint, buffers of K entries) filled with real-looking
    values, cursors staggered across the batch."""
    import torch

    from replayssm.inputs import random_state
    from replayssm.state import GDNReplayState, Mamba2ReplayState
    if op == "mamba2":
        rs = Mamba2ReplayState.allocate(batch, dims.nheads, dims.head_dim, dims.d_state, dims.n_groups,
                                        K, K, "replay", "float32", None, torch.bfloat16, device)
        heads, rows, cols = dims.nheads, dims.head_dim, dims.d_state
    else:
        rs = GDNReplayState.allocate(batch, dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim,
                                     K, K, "replay", "float32", None, torch.bfloat16, device)
        heads, rows, cols = dims.num_v_heads, dims.head_v_dim, dims.head_k_dim
    rs.hi.write(torch.arange(batch, device=device), random_state(batch, heads, rows, cols, torch.float32, device, gen))
    for buf in rs.buffers():
        buf.copy_(torch.randn(buf.shape, generator=gen, device=device) * 0.3)
    if op == "gdn":
        rs.g.copy_(torch.log(0.9 + 0.1 * torch.rand(rs.g.shape, generator=gen, device=device)))
        if rs.beta is not None:
            rs.beta.copy_(0.05 + 0.9 * torch.rand(rs.beta.shape, generator=gen, device=device))
    else:
        rs.dt.copy_(0.01 + 0.2 * torch.rand(rs.dt.shape, generator=gen, device=device))
    rs.cursor.copy_((torch.arange(batch, device=device) % K).to(torch.int32))
    return rs


def _inputs(op: str, dims, batch: int, device: str, gen):
    """One step's inputs (drawn on the CPU generator `gen`, moved to `device`) and parameters."""
    from replayssm.inputs import GDNShape, Mamba2Shape, gdn_step_inputs, mamba2_params, mamba2_step_inputs
    if op == "mamba2":
        sh = Mamba2Shape(dims.nheads, dims.head_dim, dims.d_state, dims.n_groups)
        return mamba2_step_inputs(sh, batch, device=device, gen=gen), mamba2_params(sh, device=device, gen=gen)
    sh = GDNShape(dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim)
    return gdn_step_inputs(sh, batch, device=device, gen=gen), {}


@pytest.mark.parametrize("batch", [1, 8, 32])
@pytest.mark.parametrize("model", ["nemotron-3-nano-4b", "qwen3.5-4b"])   # Mamba-2, Gated DeltaNet
def test_replay_step(gpu_benchmark, model, batch):
    import torch

    from replayssm import gdn, mamba2
    m = get_model(model)
    op, dims, device = m.op, m.ssm, DEVICE
    gen = torch.Generator(device=device).manual_seed(0)
    first = _replay_layer(op, dims, batch, device, gen)
    states = [first] + [_replay_layer(op, dims, batch, device, gen)
                        for _ in range(_layers(first.state_bytes_per_slot() * batch) - 1)]
    inp, params = _inputs(op, dims, batch, device, torch.Generator().manual_seed(1))
    idx = torch.arange(batch, dtype=torch.int32, device=device)
    step = (mamba2 if op == "mamba2" else gdn).replay_step

    def sample():                    # K steps: every flush phase once, on every layer
        for _ in range(K):
            for rs in states:
                step(rs, **inp, **params, state_indices=idx)

    t = gpu_benchmark(sample, per=K * len(states), max_time_s=0.5)
    assert t is None or t.median_us > 0      # None: benchmarks disabled (xdist), fn ran once


@pytest.mark.parametrize("model", ["nemotron-3-nano-4b", "qwen3.5-4b"])
def test_eager_step_cold_l2(gpu_benchmark, model):
    """The eager step of one layer at batch 1 with a cold L2 before every sample (flush_l2)."""
    import torch

    from replayssm import gdn, mamba2
    from replayssm.inputs import random_state
    m = get_model(model)
    op, dims, device = m.op, m.ssm, DEVICE
    gen = torch.Generator(device=device).manual_seed(0)
    heads, rows, cols = ((dims.nheads, dims.head_dim, dims.d_state) if op == "mamba2"
                         else (dims.num_v_heads, dims.head_v_dim, dims.head_k_dim))
    state = random_state(1, heads, rows, cols, torch.float32, device, gen)
    inp, params = _inputs(op, dims, 1, device, torch.Generator().manual_seed(1))
    idx = torch.zeros(1, dtype=torch.int32, device=device)
    step = (mamba2 if op == "mamba2" else gdn).eager_step
    t = gpu_benchmark(lambda: step(state, **inp, **params, state_indices=idx), flush_l2=True, max_time_s=0.5)
    assert t is None or t.median_us > 0      # None: benchmarks disabled (xdist), fn ran once
