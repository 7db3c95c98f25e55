"""Speculative-decoding runner: one SSM layer's verify + commit rounds at a model's real dims.

    spec-replay     ReplaySSM: verify T tokens from checkpoint + buffer (no per-draft state),
                    commit m of them (a cursor move; a flush where the cursor passes K)
                    -> replayssm.mamba2 / replayssm.gdn verify + commit
    spec-replay-dual  the same with a dual-precision checkpoint: outputs from the low copy (lo_dtype),
                    flushes fold into the fp32 high copy and refresh the low one
    spec-perdraft   the per-draft baseline (vLLM's speculative path, our kernels): eager over the
                    T tokens, the full state written after every token into 1 + T slots per
                    request; commit m moves the start slot -> replayssm.perdraft
    (vllm-spec      vLLM's own kernels: runners/peers.py)

Conventions are the kernel runner's (helpers shared through runners/common.py): the layer
count is chosen so every layer's state together streams from HBM, ReplaySSM cursors are
staggered across the batch (sequence i at i mod K), the backend is checked against the
reference (a padded row included, rounds crossing a flush of every sequence) before it is
timed. One sample = R rounds (R = max(K, 8); on a CPU max(K, 2)) over all layers; every round's accepted counts
come from a device tensor drawn from the case's acceptance model (replaybench.accept), so a
sample replays in one CUDA graph. median_us is per round per layer; a round verifies T tokens
of every sequence, so verified_tokens_per_s = batch * T / time and committed_tokens_per_s =
batch * mean accepted / time.
"""
from __future__ import annotations

import torch

from replayssm import gdn as G
from replayssm import mamba2 as M
from replayssm import perdraft as PD
from replayssm.inputs import random_state
from replayssm.state import ByteCounter, dtype_of

from ..accept import DEFAULT, draw_accepted, mean_accepted, resolve_accept
from ..memory import layer_memory
from ..methods import names
from ..models import get_model
from ..timing import measure
from ..traffic import step_traffic
from . import SkipCase
from .common import Layer, check_tol, device_gen, layers_for, rel_err, state_geometry, step_inputs

METHODS = names(runner="spec")          # the methods this runner measures (kernel.run routes them here)
REPLAY_METHODS = names(runner="spec", traffic="spec-replay")
MIN_ROUNDS = 8          # rounds per sample on a GPU: max(K, MIN_ROUNDS); on a CPU max(K, 2)


def spec_inputs(op, dims, batch, T, device, gen, act=torch.bfloat16):
    """(inputs [b, T, ...], params) of one round at a model's SSM dims."""
    return step_inputs(op, dims, batch, device, gen, T=T, act=act)


class ReplaySpecLayer:
    """One layer's ReplaySSM state (common.Layer: random checkpoint and buffer, staggered
    cursors); a round is verify + commit."""

    def __init__(self, op, dims, method, backend, batch, buffer_len, flush_period, state_dtype, lo_dtype, device,
                 gen, options=None, spec_window: int = 0):
        self.op, self.backend = op, backend
        self.kw = {} if options is None else {"options": options}     # the family's options (tune)
        self.rs = Layer(op, dims, method, backend, batch, buffer_len, flush_period, state_dtype, lo_dtype,
                        device, gen, spec_window=spec_window).rs      # L >= K + T checked at allocate

    def round(self, inp, params, idx, accepted, out=None, counter: ByteCounter | None = None):
        self.rs.counter = counter
        try:
            if self.op == "mamba2":
                y = M.verify(self.rs, **inp, **params, state_indices=idx, backend=self.backend, out=out, **self.kw)
                M.commit(self.rs, accepted, state_indices=idx, backend=self.backend, **self.kw)
            else:
                y = G.verify(self.rs, **inp, state_indices=idx, backend=self.backend, out=out, **self.kw)
                G.commit(self.rs, accepted, state_indices=idx, backend=self.backend, **self.kw)
        finally:
            self.rs.counter = None
        return y

    def state_bytes(self) -> int:
        return self.rs.hi.data.numel() * self.rs.hi.data.element_size() + sum(
            b.numel() * b.element_size() for b in self.rs.buffers())


class PerdraftSpecLayer:
    """One layer's per-draft states: 1 + T random slots per request (slot table and start
    columns are per-step metadata, shared by all layers like vLLM's); a round is the verify
    (the start move, PD.advance, runs once per round for all layers)."""

    def __init__(self, op, dims, backend, batch, T, state_dtype, device, gen):
        self.op, self.backend = op, backend
        rows, cols, heads = state_geometry(op, dims)
        self.states = random_state(batch * (T + 1), heads, rows, cols, dtype_of(state_dtype), device,
                                   device_gen(gen, device))

    def round(self, inp, params, tbl, start, out=None, counter: ByteCounter | None = None):
        if self.op == "mamba2":
            return PD.mamba2_verify(self.states, tbl, start, **inp, **params, backend=self.backend, out=out,
                                    counter=counter)
        return PD.gdn_verify(self.states, tbl, start, **inp, backend=self.backend, out=out, counter=counter)

    def state_bytes(self) -> int:
        return self.states.numel() * self.states.element_size()


class _Spec:
    """Layers of one case plus the per-round driver shared by the check, the byte count and the timing."""

    def __init__(self, case, model, backend, batch, device, nl, gen, options=None):
        self.method, self.T, self.device = case.method, case.spec_window, device
        op, dims = model.op, model.ssm
        if case.method in REPLAY_METHODS:
            self.layers = [ReplaySpecLayer(op, dims, case.method, backend, batch, case.buffer_len, case.flush_period,
                                           case.state_dtype, case.lo_dtype, device, gen, options, self.T)
                           for _ in range(nl)]
        else:
            self.layers = [PerdraftSpecLayer(op, dims, backend, batch, self.T, case.state_dtype, device, gen)
                           for _ in range(nl)]
        self.idx = torch.arange(batch, dtype=torch.int32, device=device)
        self.tbl = PD.slot_table(self.idx, self.T)
        self.start = torch.zeros(batch, dtype=torch.int32, device=device)

    def pad_last(self):
        """Make the last batch row padding (for the correctness check)."""
        if len(self.idx) > 1:
            self.idx[-1] = -1
            self.tbl = PD.slot_table(self.idx, self.T)

    def round(self, inp, params, accepted, out=None, counter=None, layers=None):
        y = None
        for layer in (layers or self.layers):
            if self.method in REPLAY_METHODS:
                y = layer.round(inp, params, self.idx, accepted, out, counter)
            else:
                y = layer.round(inp, params, self.tbl, self.start, out, counter)
        if self.method not in REPLAY_METHODS:     # per-draft slots: the start column moves
            PD.advance(self.start, accepted, self.T)
        return y


def check_spec(case, model, device, rounds: int | None = None, options=None) -> float:
    """Max relative output error of the case's backend vs the reference over `rounds` rounds
    (default: enough that every sequence's cursor crosses K once; twice on a GPU), same
    initial state and inputs, uniformly random accepts 0..T per sequence, a padded row."""
    b = min(case.batch, 8)
    T, K = case.spec_window, max(case.flush_period, 1)
    gen = torch.Generator().manual_seed(case.seed + 1)
    mk = lambda backend: _Spec(case, model, backend, b, device, 1, torch.Generator().manual_seed(case.seed + 7),  # noqa: E731
                               options if backend != "reference" else None)
    ours, ref = mk(case.backend), mk("reference")
    ours.pad_last()
    ref.pad_last()
    if rounds is None:
        rounds = (2 if device.startswith("cuda") else 1) * -(-2 * K // T) + 1 if case.method in REPLAY_METHODS else 3
    acc = torch.as_tensor(draw_accepted("uniform", T, b, rounds, case.seed + 3), device=device)
    worst = 0.0
    for r in range(rounds):
        inp, params = spec_inputs(model.op, model.ssm, b, T, device, gen)
        y_ours = ours.round(inp, params, acc[r])
        y_ref = ref.round(inp, params, acc[r])
        if not torch.isfinite(y_ours).all():
            raise AssertionError("non-finite output from the kernel")
        if b > 1 and not torch.all(y_ours[-1] == 0):
            raise AssertionError("padded row produced a non-zero output")
        worst = max(worst, rel_err(y_ours, y_ref))
    tol = check_tol(case)
    if worst > tol:
        raise AssertionError(f"output differs from the reference: rel err {worst:.3g} > {tol}")
    return worst


def _request_bytes(case, model) -> tuple[float, float]:
    """(state, buffer) bytes per request of one layer for the case (memory.layer_memory)."""
    st_b, buf_b, _ = layer_memory(model, case.method, case.spec_window, max(case.buffer_len, 1), case.state_dtype,
                                  case.lo_dtype if case.lo_dtype != "none" else "bfloat16")
    return st_b, buf_b


def workload(case, model, device: str, accept, options=None):
    """The timed work of a speculative case: (sample, rounds, layers, accepted [rounds, b] as
    drawn, count_bytes). sample() runs `rounds` verify + commit rounds (at least one flush
    period) over `layers` independent layer states, enough that all their state together is
    >= the kernel runner's target (HBM, not L2), with accept counts drawn from `accept` and read
    on the device. count_bytes() runs one sample's schedule on the first layer under the ops'
    byte counter (syncs; untimed) and returns its bytes per round."""
    T, B = case.spec_window, case.batch
    st_b, buf_b = _request_bytes(case, model)
    nl = layers_for(B * (st_b + buf_b), device)
    gen = torch.Generator().manual_seed(case.seed)
    spec = _Spec(case, model, case.backend, B, device, nl, gen, options)
    inp, params = spec_inputs(model.op, model.ssm, B, T, device, gen)
    out = torch.empty_like(inp["x"] if model.op == "mamba2" else inp["v"])
    rounds = max(case.flush_period, MIN_ROUNDS if str(device).startswith("cuda") else 2)
    acc_np = draw_accepted(accept, T, B, rounds, case.seed)
    acc = torch.as_tensor(acc_np, device=device).contiguous()        # [R, b] int32, read on the device

    def sample():
        for r in range(rounds):
            spec.round(inp, params, acc[r], out)

    def count_bytes() -> float:
        cnt = ByteCounter()
        for r in range(rounds):
            spec.round(inp, params, acc[r], out, counter=cnt, layers=spec.layers[:1])
        return cnt.total() / rounds

    return sample, rounds, nl, acc_np, count_bytes


def run(case, ctx) -> dict:
    if case.method not in METHODS:
        raise SkipCase(f"method {case.method!r} is not measured by the speculative runner; allowed: "
                       f"{', '.join(METHODS)}")
    if case.backend not in ("triton", "reference"):
        raise SkipCase(f"backend {case.backend!r}: allowed triton, reference")
    model = get_model(case.model)
    device, T, B = ctx.device, case.spec_window, case.batch
    if T < 1:
        raise ValueError(f"{case.method} needs spec_window >= 1")
    accept = resolve_accept(case.accept if case.accept not in (None, "", "none") else DEFAULT, T)
    check = float("nan") if case.backend == "reference" else check_spec(case, model, device)

    sample, rounds, nl, acc_np, count_bytes = workload(case, model, device, accept)
    # the ops' own byte accounting over one sample's schedule (one layer, untimed; syncs;
    # skipped for interpreted Triton kernels on a CPU, where it would only add minutes)
    cuda = str(device).startswith("cuda")
    bytes_counted = count_bytes() if cuda or case.backend == "reference" else None
    t = measure(sample, device, ctx.timing, per=rounds * nl)
    st_b, buf_b = _request_bytes(case, model)
    traffic = step_traffic(case, model)
    m_drawn = float(acc_np.mean())
    rows, cols, heads = state_geometry(model.op, model.ssm)
    per_s = 1e6 / t.median_us
    return {
        **t.columns(),
        "bytes_model": traffic.total_bytes, "read_bytes_model": traffic.read_bytes,
        "write_bytes_model": traffic.write_bytes, "flops_model": traffic.flops, "intensity": traffic.intensity,
        "state_bytes_model": traffic.parts["state_read"] + traffic.parts["state_write"],
        "buffer_bytes_model": traffic.parts["buffer_read"] + traffic.parts["buffer_write"],
        "bytes_counted": bytes_counted,
        "counted_vs_model": None if bytes_counted is None else bytes_counted / traffic.total_bytes,
        "check_rel_err": check, "layers": nl, "rounds_per_sample": rounds, "steps_per_sample": rounds,
        "mean_accepted": mean_accepted(accept, T), "mean_accepted_drawn": m_drawn,
        "verified_tokens_per_s": B * T * per_s, "committed_tokens_per_s": B * m_drawn * per_s,
        "slots_per_request": 1 if case.method in REPLAY_METHODS else T + 1,
        "ssm_bytes_per_request_layer": st_b + buf_b,
        "heads": heads, "state_rows": rows, "state_cols": cols,
        "groups": getattr(model.ssm, "n_groups", getattr(model.ssm, "num_k_heads", None)),
    }


def profile_rounds(case, device: str, rounds: int) -> None:
    """For Nsight Compute (replaybench.ncu): one layer at the case's batch, 2 * rounds rounds of
    warm-up, then `rounds` rounds between cudaProfilerStart/Stop (the case's acceptance model)."""
    model = get_model(case.model)
    T = case.spec_window
    accept = resolve_accept(case.accept if case.accept not in (None, "", "none") else DEFAULT, T)
    gen = torch.Generator().manual_seed(case.seed)
    spec = _Spec(case, model, case.backend, case.batch, device, 1, gen)
    inp, params = spec_inputs(model.op, model.ssm, case.batch, T, device, gen)
    out = torch.empty_like(inp["x"] if model.op == "mamba2" else inp["v"])
    acc = torch.as_tensor(draw_accepted(accept, T, case.batch, 3 * rounds, case.seed), device=device)
    for r in range(2 * rounds):
        spec.round(inp, params, acc[r], out)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    for r in range(2 * rounds, 3 * rounds):
        spec.round(inp, params, acc[r], out)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
