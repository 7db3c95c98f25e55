"""Drift runner: how far each state precision's outputs drift from an fp64 decode over a long
decode (replaybench.drift_study has the method, the spectra and the metrics).

A case is one configuration (method, state_dtype, lo_dtype) of one model, decoding `steps`
steps (the case's `steps` axis; default 8,192 on a GPU, 128 on the CPU) for `batch`
sequences. It runs the op-level decode and the stack-level decode and returns one row: the
values at the last measurement point as flat columns (step, rel_err, rel_err_p99,
state_rel_err, kl, top1) and every point in `drift_series` (JSON: a list of records with
step, out_med, out_p99, state_med, state_p99, lo_med, lo_p99, kl_mean, kl_p99, top1;
replaybench.report.drift expands it into long rows). The fp64 references of a model (op and
stack) are computed once and shared by the cases that follow with the same model, batch,
seed, step count and device. Nothing is timed (median_us is empty).

Backends: 'triton' (the kernels; on a GPU) or 'reference' (replayssm.reference; the CPU).
"""
from __future__ import annotations

import json
import math

import torch

from .. import drift_study as D
from ..models import get_model
from . import SkipCase

DEFAULT_STEPS = {"cuda": 8192, "cpu": 128}
_CACHE: dict = {}       # one model's fp64 references: {key: (op_ref, stack_ref)}


def default_steps(device: str) -> int:
    return DEFAULT_STEPS["cuda" if str(device).startswith("cuda") else "cpu"]


def _references(model, batch: int, params: dict, device: str, n: int, seed: int):
    key = (model.name, batch, seed, n, str(device))
    if key not in _CACHE:
        _CACHE.clear()      # one model at a time: at real dims the states are ~GiB
        op_ref = D.op_reference(model.op, model.ssm, batch, params, device, n, seed)
        stack_ref = D.stack_reference(model, batch, device, n, seed)
        _CACHE[key] = (op_ref, stack_ref)
    return _CACHE[key]


def _clean(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


def _route_period(case, model):
    """The Triton replay step's small-batch route period at this shape (0: buffered), or None
    when the kernel library cannot say: a routed step flushes every step or every other one and
    a routed dual step reads its high copy, so a drift row must be buffered to measure the
    method."""
    mode = D.method_mode(case.method)
    if case.backend != "triton" or mode is None:
        return None
    from replayssm.state import dtype_of
    read = case.lo_dtype if case.lo_dtype != "none" else case.state_dtype   # dual: the low copy
    kw = dict(batch=case.batch, read_bytes=torch.empty((), dtype=dtype_of(read)).element_size(),
              flush_period=case.flush_period, dual=mode == "dual")
    d = model.ssm
    try:
        if model.op == "mamba2":
            from replayssm import mamba2
            return mamba2.route_period(heads=d.nheads, head_dim=d.head_dim, **kw)
        from replayssm import gdn
        return gdn.route_period(heads=d.num_v_heads, head_dim=d.head_v_dim, key_dim=d.head_k_dim,
                                buffer_len=case.buffer_len, **kw)
    except Exception:       # noqa: BLE001 - informational: the scenario's batch is above the routes
        return None


def run(case, ctx) -> dict:
    model = get_model(case.model)
    if case.method not in D.METHODS:
        raise SkipCase(f"method {case.method!r} is not measured by the drift runner; allowed: "
                       f"{', '.join(D.METHODS)}")
    if case.backend not in ("reference", "triton"):
        raise SkipCase(f"backend {case.backend!r}: allowed reference, triton")
    if case.state_dtype == "float64":
        raise SkipCase("float64 state is the reference every row is compared with")
    if D.method_mode(case.method) in (None, "replay") and case.state_dtype not in ("float32", "bfloat16", "float16"):
        raise SkipCase(f"{case.method} with state_dtype {case.state_dtype!r}; allowed: float32, bfloat16, float16")
    device = ctx.device
    n = case.steps or default_steps(device)
    window = D.WINDOW
    if n < 2 * window:
        raise ValueError(f"steps {n} < twice the measurement window {window}; allowed: steps >= {2 * window}")
    L = case.buffer_len or 16
    K = case.flush_period or 16
    route = _route_period(case, model)
    if route:
        raise SkipCase(f"batch {case.batch} takes the Triton small-batch route (period {route}): its steps "
                       f"read the high checkpoint, not the low copy; use a larger batch")
    params = D.decay_params(model.op, D.heads(model.op, model.ssm), case.seed)
    threads = torch.get_num_threads()
    if not str(device).startswith("cuda"):
        torch.set_num_threads(1)     # tiny CPU tensors: thread hand-offs cost more than the math
    try:
        op_ref, stack_ref = _references(model, case.batch, params, device, n, case.seed)
        op = D.op_drift(model.op, model.ssm, case.method, case.state_dtype, case.lo_dtype, case.batch, params,
                        case.backend, device, n, op_ref, case.seed, L, K, window)
        st = D.stack_drift(model, case.method, case.state_dtype, case.lo_dtype, case.batch, case.backend,
                           device, n, stack_ref, case.seed, L, K, window)
    finally:
        torch.set_num_threads(threads)
    by_step = {r["step"]: dict(r) for r in op}
    for r in st:
        by_step.setdefault(r["step"], {"step": r["step"]}).update(r)
    series = [{k: _clean(v) for k, v in by_step[s].items() if k not in ("graph", "stack_graph")}
              for s in sorted(by_step)]
    last = series[-1]
    flushed = [r for r in series if r.get("state_med") is not None]
    hidden, vocab = D.stack_dims(model)
    return {
        "config": D.config_label(case.method, case.state_dtype, case.lo_dtype),
        "steps": n, "step": last["step"],
        "rel_err": last.get("out_med"), "rel_err_p99": last.get("out_p99"),
        "state_rel_err": flushed[-1]["state_med"] if flushed else None,
        "state_rel_err_p99": flushed[-1]["state_p99"] if flushed else None,
        "kl": last.get("kl_mean"), "kl_p99": last.get("kl_p99"), "top1": last.get("top1"),
        "drift_series": json.dumps(series),
        "window": window, "ref_entropy": stack_ref.entropy,
        "stack_layers": D.STACK_LAYERS, "stack_hidden": hidden, "stack_vocab": vocab,
        "heads": D.heads(model.op, model.ssm), "route_period": route,
        # replayed as CUDA graphs (checked against an eager twin first), or step by step
        "graphed": bool(op[-1].get("graph")), "stack_graphed": bool(st[-1].get("stack_graph")),
        **D.spectrum_summary(params),
    }
