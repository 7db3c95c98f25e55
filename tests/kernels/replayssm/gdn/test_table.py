"""The GDN launch table (gdn/table.py) as invariants: every row is reachable over the swept
range and agrees with the reference with its params forced; the pick and route_period are
consistent with each other and with the options; every plan names the rows it launches."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from replayssm import gdn
from replayssm import inputs as I
from replayssm import reference as R
from replayssm.common.table import Table
from replayssm.gdn import plan as TK
from replayssm.gdn.options import GDNOptions
from replayssm.gdn.table import TABLE
from replayssm.state import CURSOR_MASK, GDNReplayState

from kernel_checks import DEV, gen, out_tol, poisoned, random_rows, rel_err
from .checks import QWEN, ckpt_check, make_pair, resync, state_check, step_inputs

BATCHES = [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512]
# (mode, state dtype, low copy): what each read / high copy width comes from
STATES = {"f32": ("replay", "float32", None), "bf16": ("replay", "bfloat16", None),
          "dual-bf16": ("dual", "float32", "bfloat16"), "dual-fp8": ("dual", "float32", "float8_e4m3"),
          "shared-fp8": ("shared-low", "float32", "float8_e4m3")}
SQ = I.GDNShape(num_k_heads=1, num_v_heads=2, head_k_dim=16, head_v_dim=16)   # tiles >= 16: the MMA paths


def _meta_state(sh, state, L=20, K=16):
    mode, sd, lo = STATES[state]
    return GDNReplayState.allocate(8, sh.num_k_heads, sh.num_v_heads, sh.head_k_dim, sh.head_v_dim, L, K, mode=mode,
                                   state_dtype=sd, lo_dtype=lo, device="meta")


def _x(sh, b, T=None):
    lead = (b,) if T is None else (b, T)
    e = lambda *s, dt=torch.bfloat16: torch.empty(*lead, *s, dtype=dt, device="meta")  # noqa: E731
    return dict(q=e(sh.num_k_heads, sh.head_k_dim), k=e(sh.num_k_heads, sh.head_k_dim),
                v=e(sh.num_v_heads, sh.head_v_dim), g=e(sh.num_v_heads, dt=torch.float32),
                beta=e(sh.num_v_heads, dt=torch.float32))


def _sweep():
    """(state, options, op, launches) over the swept range: both Qwen3.5 dims, every state kind,
    batch 1-512, routing on and off."""
    for sh in QWEN.values():
        for b in BATCHES:
            idx = torch.empty(b, dtype=torch.int32, device="meta")
            for sd in (torch.float32, torch.bfloat16):
                st = torch.empty(8, sh.num_v_heads, sh.head_v_dim, sh.head_k_dim, dtype=sd, device="meta")
                x = _x(sh, b)
                yield "eager", TK.plan("eager", st, *x.values(), idx, .1, x["v"])
            for state in STATES:
                for route in (True, False):
                    opt = GDNOptions(small_batch_route=route)
                    x = _x(sh, b)
                    yield "replay", TK.plan("replay", _meta_state(sh, state), *x.values(), idx, .1, x["v"], options=opt)
                yield "flush", TK.plan("flush", _meta_state(sh, state), idx)
                x = _x(sh, b, 4)
                yield "verify", TK.plan("verify", _meta_state(sh, state), *x.values(), idx, .1, x["v"])
                yield "commit", TK.plan("commit", _meta_state(sh, state), idx, idx)
                rs = _meta_state(sh, state)
                if rs.mode == "dual":
                    yield "verify", TK.plan_refresh_lo(rs, idx, b)


def test_every_row_is_reachable_and_every_launch_names_its_row():
    seen = set()
    for op, launches in _sweep():
        assert launches, op
        for launch in launches:
            row = TABLE.row(launch.row)       # raises for a name the table lacks
            seen.add(row.name)
    dead = [r.name for r in TABLE if r.name not in seen]
    assert not dead, f"rows no case over the swept range picks: {dead}"


def test_rows_say_why_and_name_a_run():
    for r in TABLE:
        assert r.why and "\n" not in r.why and len(r.why) <= 110, r.name
        assert r.run == "" or r.run.startswith("h200-"), r.name


@pytest.mark.parametrize("heads", [32, 64])
@pytest.mark.parametrize("state", list(STATES))
def test_route_period_agrees_with_the_picked_row(heads, state):
    mode, sd, lo = STATES[state]
    read = {"float32": 4, "bfloat16": 2, "float8_e4m3": 1}[lo or sd]
    dual = mode == "dual"
    for b in BATCHES:
        for opt in (GDNOptions(), GDNOptions(small_batch_route=False), GDNOptions(dual_route_heads=64)):
            kw = dict(batch=b, heads=heads, head_dim=128, key_dim=128, buffer_len=16, read_bytes=read, dual=dual)
            k = gdn.route_period(**kw, flush_period=16, options=opt)
            cfg = TK.pick("replay", opt, batch=b, heads=heads, dv=128, dk=128, L=16, state_bytes=read, dual=dual)
            assert (k > 0) == bool(cfg.get("EAGER_ROUTE")), (b, cfg["row"])
            assert 0 <= k <= 16 and gdn.route_period(**kw, flush_period=1, options=opt) <= 1
            if not opt.small_batch_route:
                assert k == 0
            if dual and opt.small_batch_route:      # the high copy's route, while batch x heads is small
                assert (k > 0) == (b * heads <= opt.dual_route_heads), b


def _forced(row) -> GDNOptions:
    """Options whose table picks `row` (its conditions dropped) for its op, the shipped rows for
    the others; buffered-route tests of a flush-step row also force a SPLIT step."""
    bare = dataclasses.replace(row, name=row.name + "-forced", state_bytes=None, min_batch=None, max_batch=None,
                               min_work=None, max_work=None, dual=None, match={}, when=None)
    opt = GDNOptions(small_batch_route=False, table=Table([bare, *TABLE]))
    if row.op == "flush_step":
        opt = opt.override("replay", SPLIT=True, BLOCK_V=16, NR=1, HP=1, TMA=False, RD_MMA=False)
    return opt


def _state_for(row) -> str:
    if row.dual:
        return "dual-fp8" if row.state_bytes == 1 else "dual-bf16"
    return {2: "bf16", 1: "shared-fp8"}.get(row.state_bytes, "f32")


CHECKED = [r for r in TABLE if r.op in ("eager", "replay", "flush_step", "commit", "fold", "verify")]


@pytest.mark.parametrize("row", CHECKED, ids=[r.name for r in CHECKED])
def test_every_row_agrees_with_the_reference(row):
    g = gen(5)
    opt = _forced(row)
    sh, slots, batch, act = SQ, 3, 2, torch.bfloat16
    if row.op == "eager":
        st = I.random_state(slots, sh.num_v_heads, sh.head_v_dim, sh.head_k_dim, device=DEV, gen=g,
                            dtype=torch.bfloat16 if row.state_bytes == 2 else torch.float32)
        st_ref = st.clone()
        idx = random_rows(slots, batch, g)
        x = step_inputs(sh, batch, act, g)
        o = gdn.eager_step(st, **x, state_indices=idx, out=poisoned(x["v"]), options=opt)
        assert rel_err(o, R.gdn_eager_step(st_ref, **x, state_indices=idx)) <= out_tol(act)
        assert rel_err(st.float(), st_ref.float()) <= 1e-2
        return
    mode, sd, lo = STATES[_state_for(row)]
    T, K = 2, 2
    rs, rr = make_pair(sh, slots, K + T, K, mode, sd, lo, act, g)
    for step in range(3):
        idx = random_rows(slots, batch, g)
        if row.op in ("verify", "commit"):
            x = step_inputs(sh, batch, act, g, T=T)
            o = gdn.verify(rs, **x, state_indices=idx, out=poisoned(x["v"]), options=opt)
            assert rel_err(o, R.gdn_verify(rr, **x, state_indices=idx)) <= out_tol(act), step
            acc = torch.randint(0, T + 1, (batch,), generator=g).to(DEV)
            gdn.commit(rs, acc, idx, options=opt)
            R.gdn_commit(rr, acc, idx)
        elif row.op == "fold":
            gdn.flush(rs, idx, options=opt)
            R.gdn_flush(rr, idx)
        else:
            x = step_inputs(sh, batch, act, g)
            o = gdn.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]), options=opt)
            route = TK.state_route_period(rs, x["k"], x["v"], opt)
            o_ref = R.gdn_replay_step(rr, **x, state_indices=idx, route=route)
            assert rel_err(o, o_ref) <= out_tol(act), step
            if route:   # the route appends nothing: cursors and the high copy as the reference's route
                assert torch.equal(rs.cursor & CURSOR_MASK, rr.cursor & CURSOR_MASK), step
                ckpt_check(rs.hi, rr.hi, f"{row.name} step {step}: hi")
                for name in ("u", "k", "g", "v", "beta", "cursor"):
                    if getattr(rs, name) is not None:
                        getattr(rs, name).copy_(getattr(rr, name))
                resync(rs, rr)
                continue
        state_check(rs, rr, f"{row.name} step {step}")
