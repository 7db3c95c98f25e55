"""`replaybench explain SCENARIO [--case ID]`: which kernels a case launches, on which grids,
with which tile options, and the launch-table row (and its reason) that chose each.

Nothing runs: the case's state and inputs are built on PyTorch's 'meta' device (shapes and
dtypes, no memory) and handed to the family's planner (`replayssm.<family>.plan.plan`), which
returns the launches the public op would make. So any case of any scenario, at real model dims
and batch 512, is explained in a second on a machine without a GPU. `--compile` adds the
sm_90 register count and spills of each launch (Triton's offline compile, no GPU either).
Per-sequence choices made on the device (whether a sequence flushes this step) are not
launches: every plan has a fixed grid, so what is printed is exactly what a CUDA graph holds.
"""
from __future__ import annotations

import os

import torch

from .methods import METHODS
from .models import get_model
from .runners.common import shape_of, state_geometry, step_inputs
from .scenario import Case

META = "meta"


def _family(op: str, perdraft: bool = False):
    """(the family's plan module, its table) of the kernel library."""
    if perdraft:
        from replayssm.perdraft import plan as p
        from replayssm.perdraft.table import TABLE
    elif op == "mamba2":
        from replayssm.mamba2 import plan as p
        from replayssm.mamba2.table import TABLE
    else:
        from replayssm.gdn import plan as p
        from replayssm.gdn.table import TABLE
    return p, TABLE


def _state(case: Case, model, mode: str):
    from replayssm.state import GDNReplayState, Mamba2ReplayState, dtype_of
    dims = model.ssm
    lo = None if case.lo_dtype == "none" else case.lo_dtype
    if model.op == "mamba2":
        return Mamba2ReplayState.allocate(case.batch, dims.nheads, dims.head_dim, dims.d_state, dims.n_groups,
                                          case.buffer_len, case.flush_period, mode, case.state_dtype, lo,
                                          torch.bfloat16, META)
    return GDNReplayState.allocate(case.batch, dims.num_k_heads, dims.num_v_heads, dims.head_k_dim,
                                   dims.head_v_dim, case.buffer_len, case.flush_period, mode, case.state_dtype,
                                   lo, torch.bfloat16, META)


def plan_case(case: Case) -> tuple[list, str]:
    """(launches, note) of one case: the Launch records its step (or speculative round) makes.
    The note says why there are none (a peer's kernel, the reference backend)."""
    from replayssm.state import dtype_of
    m = METHODS[case.method]
    if not m.ours or case.backend == "vllm":
        return [], f"{case.method}: {m.peer or 'a peer'}'s own kernel, not planned by replayssm"
    if case.backend == "reference":
        return [], "the PyTorch reference backend: no kernel launches"
    model = get_model(case.model)
    op, dims = model.op, model.ssm
    plan_mod, _ = _family(op)
    gen = torch.Generator().manual_seed(case.seed)
    T = case.spec_window if m.spec else None
    inp, params = step_inputs(op, dims, case.batch, META, gen, T=T)
    idx = torch.arange(case.batch, dtype=torch.int32, device=META)
    mode = m.mode
    rows, cols, heads = state_geometry(op, dims)
    if m.spec and not mode:     # the per-draft baseline: 1 + T state slots per sequence
        from replayssm import perdraft
        from replayssm.perdraft import plan as pd
        states = torch.empty(case.batch * (T + 1), heads, rows, cols, dtype=dtype_of(case.state_dtype), device=META)
        table = perdraft.slot_table(idx, T)
        start = torch.zeros(case.batch, dtype=torch.int32, device=META)
        if op == "mamba2":
            return pd.plan_mamba2(states, table, start, **inp, **params)[0], ""
        return pd.plan_gdn(states, table, start, *inp.values())[0], ""
    if not mode:
        state = torch.empty(case.batch, heads, rows, cols, dtype=dtype_of(case.state_dtype), device=META)
        if op == "mamba2":
            return plan_mod.plan("eager", state, **inp, **params, state_indices=idx), ""
        sh = shape_of(op, dims)
        o = torch.empty_like(inp["v"])
        return plan_mod.plan("eager", state, *inp.values(), idx, sh.head_k_dim ** -0.5, o), ""
    rs = _state(case, model, mode)
    accepted = torch.ones(case.batch, dtype=torch.int32, device=META)
    if op == "mamba2":
        if m.spec:
            return (plan_mod.plan("verify", rs, **inp, **params, state_indices=idx)
                    + plan_mod.plan("commit", rs, params["A"], accepted, state_indices=idx)), ""
        return plan_mod.plan("replay", rs, **inp, **params, state_indices=idx), ""
    scale = shape_of(op, dims).head_k_dim ** -0.5
    o = torch.empty_like(inp["v"])
    if m.spec:
        return (plan_mod.plan("verify", rs, *inp.values(), idx, scale, o)
                + plan_mod.plan("commit", rs, accepted, idx)), ""
    return plan_mod.plan("replay", rs, *inp.values(), idx, scale, o), ""


def _why(table, row_name: str) -> str:
    if not row_name:
        return "(no table row: a fixed-shape helper launch)"
    try:
        r = table.row(row_name)
    except KeyError:
        return ""
    return f"{r.why}" + (f" [{r.run}]" if r.run else "")


def explain_case(case: Case, compile: bool = False) -> str:
    """The text `replaybench explain` prints for one case."""
    lines = [f"case {case.case_id}"]
    launches, note = plan_case(case)
    if note:
        return "\n".join(lines + [f"  {note}"])
    m = METHODS[case.method]
    _, table = _family(get_model(case.model).op, perdraft=m.spec and not m.mode)
    for i, launch in enumerate(launches, 1):
        d = launch.describe()
        meta = " ".join(f"{k}={v}" for k, v in d["meta"].items())
        lines.append(f"  {i}. {d['kernel']}  grid={d['grid']}")
        lines.append(f"     row: {d['row'] or '-'}  {_why(table, d['row'])}")
        lines.append(f"     meta: {meta}")
        if compile:
            lines.append(f"     sm_90: {_compiled(launch)}")
    return "\n".join(lines)


def _compiled(launch) -> str:
    from replayssm.common.offline import compile_launch
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return "not compiled (TRITON_INTERPRET is set)"
    try:
        r = compile_launch(launch.kernel, launch.args, launch.meta, 90, False)
    except Exception as e:  # noqa: BLE001 (an offline compile failure is reported, not fatal)
        return f"compile failed: {type(e).__name__}: {e}"
    return f"{r.get('regs')} registers, spills {r.get('spill_stores', 0)} stores / {r.get('spill_loads', 0)} loads"


def explain(cases: list[Case], case_id: str | None = None, compile: bool = False) -> str:
    """Every case of a scenario (or the one named by case_id), explained."""
    if case_id is not None:
        chosen = [c for c in cases if c.case_id == case_id]
        if not chosen:
            near = [c.case_id for c in cases if case_id in c.case_id][:5]
            raise KeyError(f"--case {case_id!r}: no such case in the scenario"
                           + (f"; did you mean: {', '.join(near)}" if near else
                              f" ({len(cases)} cases; `replaybench sweep SCENARIO --dry-run` lists them)"))
        cases = chosen
    return "\n\n".join(explain_case(c, compile) for c in cases)
