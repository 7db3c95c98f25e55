"""The Mamba-2 launch table (replayssm.mamba2.table) by its invariants, not its contents: it
picks a valid launch for every case of the swept range, every row is reachable, and every
row's params, forced at a small shape, give the reference's results."""
from __future__ import annotations

import pytest
import torch

from replayssm import inputs as I
from replayssm import mamba2 as M
from replayssm import reference as R
from replayssm.mamba2.options import Mamba2Options
from replayssm.mamba2.table import TABLE, replay_params, tile_params

from kernel_checks import DEV, TOL_F32, gen, out_tol, poisoned, rel_err
from .m2_helpers import BUFFERED, make_pair, params, run_steps, verify_commit_cycles

BATCHES = [1, 2, 3, 4, 5, 8, 16, 17, 32, 48, 64, 96, 128, 192, 256, 384, 512]
DIMS = [(64, 128), (80, 96), (64, 256), (64, 64), (12, 4), (5, 4)]      # (head dim, heads)


def _sweep():
    for P, H in DIMS:
        for b in BATCHES:
            yield P, H, b


def test_the_table_picks_a_valid_launch_over_the_swept_range():
    """Every op picks a row at every case (batch 1-512, the models' head dims and small ones,
    every state width, dual or not); tiles are powers of 2 within the head, chunk counts divide
    the head's tiles, the replay params pass their checks; the route (period >= 1) only at the
    small batches of the route rows, never with small_batch_route off; every row is reachable."""
    used = set()
    off = Mamba2Options(small_batch_route=False)
    for P, H, b in _sweep():
        for sb in (8, 4, 2, 1):
            for op in ("eager", "fold", "verify"):
                block_p, chunks, warps, row = tile_params(op, head_dim=P, state_bytes=sb, batch=b, heads=H,
                                                          options=BUFFERED)
                used.add(row)
                tiles = -(-P // block_p)
                assert block_p & (block_p - 1) == 0 and block_p <= max(P, 1) * 2 and tiles % chunks == 0, (op, row)
                assert warps in (1, 2, 4, 8), (op, row)
            for dual in (False, True):
                for o in (Mamba2Options(), off):
                    v = replay_params(head_dim=P, read_bytes=sb, batch=b, heads=H, dual=dual, hi_bytes=4, options=o)
                    used.add(v["row"])
                    assert v["block_p"] & (v["block_p"] - 1) == 0 and v["block_p"] <= 2 * P
                    if v["route"] == "eager":
                        assert o.small_batch_route and b <= 16 and TABLE.row(v["row"]).op == "route", (P, H, b, v)
                    else:
                        assert TABLE.row(v["row"]).op == "replay", (P, H, b, v)
    assert used >= {r.name for r in TABLE if not (r.op == "route" and r.params["route"] == "buffered")}, \
        sorted({r.name for r in TABLE} - used)


def test_every_row_says_why_and_names_its_run():
    for r in TABLE:
        assert r.why and "\n" not in r.why and len(r.why) < 130, r.name
        assert r.run == "" or r.run.startswith("h200-"), r.name
        assert r.run or "not measured" in r.why, r.name


def test_options_reject_unknown_knobs():
    with pytest.raises(ValueError, match="unknown params.*blockp"):
        Mamba2Options().override("replay", blockp=16)
    with pytest.raises(ValueError, match="unknown op 'step'"):
        Mamba2Options().override("step", block_p=16)
    with pytest.raises(TypeError):
        Mamba2Options(small_batch_routes=False)
    with pytest.raises(TypeError, match="Mamba2Options"):
        M.eager_step(torch.zeros(1, 4, 5, 8), *[None] * 7, options={"pdl": False})   # before any input check


# ----------------------------------------------------------------------------- every row against the reference
SHAPE = I.Mamba2Shape(nheads=2, head_dim=16, d_state=16, n_groups=1)   # 2 heads per group
_STATE = {4: ("replay", "float32", None), 2: ("dual", "float32", "bfloat16"), 1: ("dual", "float32", "float8_e4m3")}


def _distinct_rows():
    """One row per distinct (op, params, state width, dual), skipping the route rows that buffer."""
    seen, rows = set(), []
    for r in TABLE:
        if r.op == "route" and r.params["route"] == "buffered":
            continue
        key = (r.op, tuple(sorted(r.params.items())), r.state_bytes, r.dual)
        if key not in seen:
            seen.add(key)
            rows.append(r)
    return rows


ROWS = _distinct_rows()


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_every_row_agrees_with_the_reference(row):
    """The row's params forced (options.override) at a small shape (head dim 16: tiles clamp to
    it), on a state of the row's width (dual where the row asks for it), against the reference."""
    g = gen(90)
    sb = row.state_bytes or 4
    mode, sd, lo = _STATE[sb]
    if row.dual is False or (sb == 2 and row.dual is None and row.op in ("eager", "fold")):
        mode, sd, lo = ("replay", "bfloat16", None) if sb == 2 else (mode, sd, lo)
    params_ = {k: v for k, v in row.params.items() if not (k == "tma" and v is None)}
    if row.op == "eager":
        o = BUFFERED.override("eager", **params_)
        p = params(SHAPE, g)
        dt = torch.float32 if sb == 4 else torch.bfloat16
        st = I.random_state(5, SHAPE.nheads, 16, 16, dtype=dt, device=DEV, gen=g)
        sr = st.clone()
        idx = torch.tensor([3, -1, 0], dtype=torch.int32, device=DEV)
        inp = {k: v.to(DEV) for k, v in I.mamba2_step_inputs(SHAPE, 3, act_dtype=torch.float32, gen=g).items()}
        y = M.eager_step(st, **inp, **p, state_indices=idx, out=poisoned(inp["x"]), options=o)
        yr = R.mamba2_eager_step(sr, **inp, **p, state_indices=idx)
        assert rel_err(y, yr) <= TOL_F32
        assert rel_err(st.float(), sr.float()) <= (TOL_F32 if sb == 4 else 2.0 ** -7)
    elif row.op == "fold":
        o = BUFFERED.override("fold", **params_)
        verify_commit_cycles(DEV, SHAPE, row.name, mode, sd, lo, torch.bfloat16, 2, options=o)
    elif row.op == "verify":
        o = BUFFERED.override("verify", **params_)
        verify_commit_cycles(DEV, SHAPE, row.name, mode, sd, lo, torch.bfloat16, 2, options=o)
    else:
        o = BUFFERED.override("replay", **params_)
        rs, rr = make_pair(SHAPE, 5, 3, 2, mode, sd, lo, torch.bfloat16, g)
        idx = torch.tensor([3, -1, 0], dtype=torch.int32, device=DEV)
        if row.op == "route":       # the route's semantics in the reference: route = its period
            period = min(row.params.get("route_k", 1), 2)
            p = params(SHAPE, g)
            for step in range(3):
                inp = {k: v.to(DEV) for k, v in I.mamba2_step_inputs(SHAPE, 3, act_dtype=torch.bfloat16, gen=g).items()}
                y = M.replay_step(rs, **inp, **p, state_indices=idx, options=o)
                yr = R.mamba2_replay_step(rr, **inp, **p, state_indices=idx, route=period)
                assert rel_err(y, yr) <= out_tol(torch.bfloat16), (row.name, step)
        else:
            assert run_steps(rs, rr, SHAPE, idx, 3, torch.bfloat16, g, what=row.name, options=o) >= 2


def test_plan_names_kernels_grids_and_rows_without_running():
    """plan(op, ...) on 'meta' tensors: the launches a case makes, each with the table row that
    chose it (explain's data); the buffered step at Super b256 fp32 is the pre-pass, the step
    and the cursor pass."""
    from replayssm.mamba2.plan import explain, plan
    from replayssm.state import Mamba2ReplayState
    sh = I.Mamba2Shape(128, 64, 128, 8)
    p = {k: v.to("meta") for k, v in I.mamba2_params(sh).items()}
    inp = {k: v.to("meta") for k, v in I.mamba2_step_inputs(sh, 256).items()}
    rs = Mamba2ReplayState.allocate(256, 128, 64, 128, 8, 16, 16, device="meta")
    got = explain(plan("replay", rs, **inp, **p))
    assert [d["kernel"] for d in got] == ["_buffer_bc_kernel", "_replay_step_kernel", "_cursor_kernel"]
    assert got[1]["row"] == TABLE.pick("replay", state_bytes=4, batch=256, heads=128, head_dim=64, dual=False).name
    assert got[1]["grid"] == (64 // got[1]["meta"]["BLOCK_P"], 128, 256)
    st = torch.empty(256, 128, 64, 128, device="meta")
    (e,) = plan("eager", st, **inp, **p)
    assert e.row.startswith("eager.") and e.describe()["meta"]["num_warps"] == TABLE.row(e.row).params["warps"]
    assert [la.name for la in plan("advance_cursors", rs, 256)] == ["_cursor_kernel"]
    with pytest.raises(ValueError, match="unknown Mamba-2 op 'step'"):
        plan("step", rs)
