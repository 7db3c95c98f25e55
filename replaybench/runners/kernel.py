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

import torch

from ..methods import METHODS
from ..models import get_model
from ..timing import measure
from ..traffic import route_period, step_traffic
from . import SkipCase, peers, spec
from .common import Layer, check_tol, layers_for, rel_err, state_geometry, step_inputs, steps_per_sample


def make_layer(op, dims, method, backend, batch, buffer_len, flush_period, state_dtype, lo_dtype, device, gen,
               options=None):
    """One layer of a decode-step case: ours (common.Layer, with the family's `options`) or vLLM's
    own kernel (backend 'vllm'); both step with step(inputs, params, idx)."""
    if backend == "vllm":
        return peers.VllmEagerLayer(op, dims, batch, state_dtype, device, gen)
    return Layer(op, dims, method, backend, batch, buffer_len, flush_period, state_dtype, lo_dtype, device, gen,
                 options=options)


def check_against_reference(case, model, device, steps: int | None = None, options=None) -> float:
    """Max relative output error of the case's backend (with the family's `options`) vs the
    reference (same storage dtypes, same inputs, same initial state) over enough steps to cross
    a flush. Raises if too large."""
    dims, op = model.ssm, model.op
    b = min(case.batch, 8)
    gen = torch.Generator().manual_seed(case.seed + 1)
    mk = lambda backend: make_layer(op, dims, case.method, backend, b, case.buffer_len, case.flush_period,  # noqa: E731
                               case.state_dtype, case.lo_dtype, device, torch.Generator().manual_seed(case.seed + 7),
                               options=options if backend != "reference" else None)
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
    _, params = step_inputs(op, dims, b, device, gen)
    for _ in range(steps or default):
        inp, _ = step_inputs(op, dims, b, device, gen)
        y_ours, y_ref = ours.step(inp, params, idx), ref.step(inp, params, idx)
        if not torch.isfinite(y_ours).all():
            raise AssertionError("non-finite output from the kernel")
        worst = max(worst, rel_err(y_ours, y_ref))
    tol = check_tol(case)
    if worst > tol:
        raise AssertionError(f"output differs from the reference: rel err {worst:.3g} > {tol}")
    return worst


def workload(case, model, device: str, options=None):
    """The timed work of a decode case: (sample, steps, layers). sample() runs `steps` decode
    steps (steps_per_sample: whole flush periods) over `layers` independent layer states
    (enough that the state, by the traffic model's bytes per step, streams from HBM on a GPU),
    all with the same inputs and slot indices 0..batch-1; one sample is steps x layers units
    of work."""
    dims, op = model.ssm, model.op
    parts = step_traffic(case, model).parts
    gen = torch.Generator().manual_seed(case.seed)
    nl = layers_for((parts["state_read"] + parts["state_write"]) / 2, device)
    layers = [make_layer(op, dims, case.method, case.backend, case.batch, case.buffer_len, case.flush_period,
                    case.state_dtype, case.lo_dtype, device, gen, options=options) for _ in range(nl)]
    inp, params = step_inputs(op, dims, case.batch, device, gen)
    idx = torch.arange(case.batch, dtype=torch.int32, device=device)
    steps = steps_per_sample(case.flush_period, nl, device)

    def sample():
        for _ in range(steps):
            for layer in layers:
                layer.step(inp, params, idx)

    return sample, steps, nl


def run(case, ctx) -> dict:
    m = METHODS.get(case.method)
    if m is not None and m.runner == "spec":     # speculative rounds: runners/spec.py
        return spec.run(case, ctx)
    if case.backend == "vllm" or (m is not None and m.runner == "peers"):   # vLLM's own kernels
        return peers.run(case, ctx)
    model = get_model(case.model)
    if m is None or m.runner != "kernel":
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
    rows, cols, heads = state_geometry(op, dims)
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
        "route_period": route_period(case, model) if m.traffic == "replay" else None,
    }
