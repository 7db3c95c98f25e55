"""Mamba-2 small-batch route of the replay step (route "eager": the state written every
route_k-th step, pending entries folded first; dual states write the high copy alone and mark
the low copy stale): against the reference's route semantics (reference.mamba2_replay_step's
`route`), mixed with buffered steps, verify, commit and flush."""
from __future__ import annotations

import pytest
import torch

from replayssm import inputs as I
from replayssm import mamba2 as M
from replayssm import reference as R
from replayssm.mamba2.plan import state_route_period
from replayssm.mamba2.table import replay_params
from replayssm.state import ByteCounter

from kernel_checks import DEV, TOL_F32, check_epoch_wrap, check_route_words, gen, out_tol, poisoned, random_rows, \
    rel_err
from .m2_helpers import BUFFERED, DEVICES, IDX4, MODEL_DIMS, TINY, ckpt_check, cuda_only, graph_of, make_pair, \
    params, resync, state_check, step_inputs

SHAPE = I.Mamba2Shape(nheads=2, head_dim=12, d_state=16, n_groups=1)   # 2 heads per group


def routed(block_p=4, route_k=1):
    return BUFFERED.override("replay", route="eager", block_p=block_p, warps=1, route_k=route_k)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode,sd,lo,act", [("replay", "float32", None, torch.float32),
                                            ("replay", "float32", None, torch.bfloat16),
                                            ("dual", "float32", "bfloat16", torch.float32),
                                            ("dual", "float32", "float8_e4m3", torch.bfloat16),
                                            ("shared-low", "float32", "bfloat16", torch.float32)],
                         ids=["f32", "f32-bf16-act", "dual-bf16", "dual-fp8", "shared-bf16"])
def test_eager_route_mixes_with_the_buffered_route(device, mode, sd, lo, act):
    """The every-step route alternating with the buffered step: outputs, checkpoints, cursor
    words and bytes as the reference's; dual: the low copy left stale, the next buffered step
    flushes it."""
    g = gen(47)
    K = 4
    rs, rr = make_pair(SHAPE, 7, 6, K, mode, sd, lo, act, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    p = params(SHAPE, g)
    idx = torch.tensor(IDX4, dtype=torch.int32, device=device)
    live = idx[idx >= 0].long()
    pending = stale_flushed = 0
    for step, eager in enumerate([True, False, False, True, True, False, True]):
        o = routed() if eager else BUFFERED
        inp = step_inputs(SHAPE, 4, act, g)
        if eager:
            pending += int((rr.entries(live) > 0).sum())
        else:
            stale_flushed += int(rr.lo_stale(live).sum())
        lo_before = rs.lo.data.clone() if rs.lo is not None else None
        y = M.replay_step(rs, **inp, **p, state_indices=idx, out=poisoned(inp["x"]), options=o)
        yr = R.mamba2_replay_step(rr, **inp, **p, state_indices=idx, route=eager)
        assert rel_err(y, yr) <= out_tol(act), f"{mode} step {step}: {rel_err(y, yr):.3g}"
        assert (y[idx < 0] == 0).all()
        state_check(rs, rr, f"{mode} step {step}")
        if eager:
            assert (rs.entries(live) == 0).all() and rs.lo_stale(live).all() == (mode == "dual")
            assert state_route_period(rs, inp["x"], o) == 1 and rs.routed == (mode == "dual")
            if mode == "dual":     # the route writes the high copy alone
                assert torch.equal(rs.lo.data, lo_before)
        resync(rs, rr)
    assert rs.counter == rr.counter
    assert pending >= 3, f"only {pending} rows had entries to fold on the eager route"
    assert stale_flushed >= 3 or mode != "dual", f"only {stale_flushed} stale low copies refreshed"


DEFER_MODES = [("replay", None, "float32"), ("dual", "bfloat16", "float32"), ("dual", "float8_e4m3", "float32"),
               ("replay", None, "bfloat16"), ("shared-low", "float8_e4m3", "float32")]
DEFER_IDS = ["f32", "dual-bf16", "dual-fp8", "bf16-state", "shared-fp8"]


@pytest.mark.parametrize("mode,lo,sd,rk,block_p", [(*m, 2, 4) for m in DEFER_MODES]
                         + [(*DEFER_MODES[0], 3, 8), (*DEFER_MODES[1], 3, 4)],
                         ids=[f"{i}-2" for i in DEFER_IDS] + ["f32-3-rows8", "dual-bf16-3"])
def test_deferred_route_mixes_with_every_other_op(mode, lo, sd, rk, block_p):
    """The route of period k >= 2 (_replay_defer_kernel): the state written every k-th step,
    entries appended between, the cursor moved by one program with a plain store and an epoch
    (state.py). Mixed with the every-step route, buffered steps, a verify and commit, padded
    rows and slots left out of a step; outputs, checkpoints, cursor counts and stale bits,
    buffer entries below the cursor and byte counts as the reference's (route=k). 8-row
    programs over a head dim of 12 leave the second program's second epoch byte past the head."""
    g = gen(61 + rk + block_p)
    K = 4
    rs, rr = make_pair(SHAPE, 5, 8, K, mode, sd, lo, torch.bfloat16, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    p = params(SHAPE, g)
    plan = ["defer"] * 4 + ["buffered", "defer", "eager", "defer", "defer", "spec", "defer", "buffered", "defer",
                            "defer"]
    fast = appended = 0
    for step, how in enumerate(plan):
        idx = random_rows(5, 4, g, pad_p=0.2)
        live = idx[idx >= 0].long()
        before = rs.cursor.clone()
        if how == "spec":
            inp = step_inputs(SHAPE, 4, torch.bfloat16, g, T=2)
            y = M.verify(rs, **inp, **p, state_indices=idx, out=poisoned(inp["x"]))
            yr = R.mamba2_verify(rr, **inp, **p, state_indices=idx)
            assert rel_err(y, yr) <= out_tol(torch.bfloat16), f"{mode} step {step} verify: {rel_err(y, yr):.3g}"
            acc = torch.randint(0, 3, (4,), generator=g).to(torch.int32).to(DEV)
            M.commit(rs, acc, state_indices=idx, A=p["A"])
            R.mamba2_commit(rr, p["A"], acc, state_indices=idx)
        else:
            route = {"defer": rk, "eager": 1, "buffered": 0}[how]
            o = routed(block_p, route) if route else BUFFERED
            inp = step_inputs(SHAPE, 4, torch.bfloat16, g)
            assert state_route_period(rs, inp["x"], o) == min(route, K)
            if how == "defer":
                appended += int((rr.entries(live) + 1 < rk).sum())
            y = M.replay_step(rs, **inp, **p, state_indices=idx, out=poisoned(inp["x"]), options=o)
            yr = R.mamba2_replay_step(rr, **inp, **p, state_indices=idx, route=route)
            assert rel_err(y, yr) <= out_tol(torch.bfloat16), f"{mode} step {step}: {rel_err(y, yr):.3g}"
            assert (y[idx < 0] == 0).all()
        fast += check_route_words(rs, rr, before, live, how == "defer", rk, f"{mode} step {step}")
        ckpt_check(rs.hi, rr.hi, f"{mode} step {step}: hi")
        if rs.lo is not None:
            ckpt_check(rs.lo, rr.lo, f"{mode} step {step}: lo")
        below = torch.arange(8, device=DEV)[None, :] < rr.entries()[:, None]              # [slots, L]
        assert torch.equal(rs.x[below], rr.x[below]) and torch.equal(rs.B[below], rr.B[below]), \
            f"{mode} step {step}: buffer"
        if below.any():
            assert rel_err(rs.dt[below], rr.dt[below]) <= 1e-6, f"{mode} step {step}: buffer dt"
        rr.cursor.copy_(rs.cursor)      # (the epochs too: resync copies every word)
        resync(rs, rr)
        assert rs.counter == rr.counter, f"{mode} step {step}: bytes"
    assert fast >= 6, f"only {fast} steps moved the cursor without a ticket"
    assert appended >= 3, f"only {appended} route steps appended an entry"


def test_deferred_route_epoch_wraps_and_stale_epochs_take_the_ticket():
    """The epoch runs 1..127 and wraps to 1 (never 0, which marks another op's word); a slot
    whose recorded epochs are stale (a word stored elsewhere with an epoch it never saw: a
    restore) must not be taken for a sibling's store unless it is exactly the next one."""
    g = gen(67)
    rs, rr = make_pair(SHAPE, 3, 6, 4, "replay", "float32", None, torch.bfloat16, g)
    rs.cursor.zero_()
    rr.cursor.zero_()
    o = routed(4, 2)
    p = params(SHAPE, g)
    idx = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)

    def step():
        inp = step_inputs(SHAPE, 3, torch.bfloat16, g)
        y = M.replay_step(rs, **inp, **p, state_indices=idx, out=poisoned(inp["x"]), options=o)
        return y, R.mamba2_replay_step(rr, **inp, **p, state_indices=idx, route=2)
    check_epoch_wrap(rs, rr, step, ckpt_check)


def test_deferred_route_config_errors():
    for bad in (0, 128, True, 2.0):
        with pytest.raises(ValueError, match=f"route_k={bad!r}: allowed an int 1..127"):
            replay_params(head_dim=12, read_bytes=4, batch=1, heads=4, options=routed(4, bad))
    with pytest.raises(ValueError, match="block_p=2 with route_k=2"):
        replay_params(head_dim=12, read_bytes=4, batch=1, heads=4, options=routed(2, 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode,lo", [("replay", None), ("dual", "bfloat16")])
@pytest.mark.parametrize("batch", [1, 4])
def test_small_batches_route_by_default(device, mode, lo, batch):
    """The shipped options at batch 1 and 4 (a head dim of 12 takes the rows of Nano's 80),
    from random cursors (pending entries folded first): the route the table picks agrees with
    the reference's route semantics on outputs, checkpoints, cursor counts and bytes."""
    g = gen(53 + batch)
    K = 4
    rs, rr = make_pair(SHAPE, 7, 6, K, mode, "float32", lo, torch.bfloat16, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    p = params(SHAPE, g)
    idx = torch.tensor(IDX4[:batch] if batch < 4 else IDX4, dtype=torch.int32, device=device)
    for step in range(5):
        inp = step_inputs(SHAPE, batch, torch.bfloat16, g)
        route = state_route_period(rs, inp["x"])
        y = M.replay_step(rs, **inp, **p, state_indices=idx, out=poisoned(inp["x"]))
        yr = R.mamba2_replay_step(rr, **inp, **p, state_indices=idx, route=route)
        assert rel_err(y, yr) <= out_tol(torch.bfloat16), f"step {step}: {rel_err(y, yr):.3g}"
        assert torch.equal(rs.entries(), rr.entries()) and torch.equal(rs.lo_stale(), rr.lo_stale()), f"step {step}"
        ckpt_check(rs.hi, rr.hi, f"step {step}: hi")
        if rs.lo is not None:
            ckpt_check(rs.lo, rr.lo, f"step {step}: lo")
        rr.cursor.copy_(rs.cursor)
        resync(rs, rr)
    assert rs.counter == rr.counter


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lo", ["bfloat16", "float8_e4m3"])
def test_dual_route_low_copy_refreshed_where_needed(device, lo):
    """LO_STALE end to end: after route steps (high copy only), a verify refreshes the low copy
    before reading it (and clears the bit), a flush refreshes it, and a buffered step flushes
    stale rows (fused with the ticket, fused with the cursor pass, split with the cursor pass);
    the reference agrees after every op."""
    T, K, slots, batch = 2, 3, 6, 4
    g = gen(66)
    rs, rr = make_pair(TINY, slots, K + T, K, "dual", "float32", lo, torch.bfloat16, g)
    p = params(TINY, g)
    idx = torch.tensor(IDX4, dtype=torch.int32, device=device)
    live = idx[idx >= 0].long()

    def route_step(tag):
        inp = step_inputs(TINY, batch, torch.bfloat16, g)
        y = M.replay_step(rs, **inp, **p, state_indices=idx, options=routed())
        assert rel_err(y, R.mamba2_replay_step(rr, **inp, **p, state_indices=idx, route=True)) <= \
            out_tol(torch.bfloat16), tag
        state_check(rs, rr, tag)
        assert rs.lo_stale(live).all() and rs.routed
        resync(rs, rr)

    for rnd in range(2):
        route_step(f"route {rnd}")
        lo_stale_data = rs.lo.data.clone()
        inp = step_inputs(TINY, batch, torch.bfloat16, g, T=T)
        y = M.verify(rs, **inp, **p, state_indices=idx)
        assert rel_err(y, R.mamba2_verify(rr, **inp, **p, state_indices=idx)) <= out_tol(torch.bfloat16), rnd
        assert not torch.equal(rs.lo.data[live], lo_stale_data[live]), "verify read a stale low copy"
        assert not rs.lo_stale().any()          # refreshed, the bit cleared
        state_check(rs, rr, f"verify {rnd}")
        resync(rs, rr)
        acc = torch.randint(0, T + 1, (batch,), generator=g).to(device=device, dtype=torch.int32)
        M.commit(rs, acc, state_indices=idx, A=p["A"])
        R.mamba2_commit(rr, p["A"], acc, state_indices=idx)
        assert not rs.lo_stale().any()
        state_check(rs, rr, f"commit {rnd}")
        resync(rs, rr)
    route_step("route before flush")
    M.flush(rs, A=p["A"])
    R.mamba2_flush(rr, p["A"])
    assert not rs.lo_stale().any() and (rs.entries() == 0).all()
    state_check(rs, rr, "flush")
    resync(rs, rr)
    for name, v in (("fused-ticket", {}), ("fused-pass", dict(ticket=False)),
                    ("split-pass", dict(route="split", ticket=False))):
        route_step(f"route before {name}")
        inp = step_inputs(TINY, batch, torch.bfloat16, g)
        y = M.replay_step(rs, **inp, **p, state_indices=idx, options=BUFFERED.override("replay", **v))
        assert rel_err(y, R.mamba2_replay_step(rr, **inp, **p, state_indices=idx)) <= out_tol(torch.bfloat16), name
        assert not rs.lo_stale().any() and (rs.entries(live) == 0).all(), f"{name}: stale rows flushed"
        state_check(rs, rr, name)
        resync(rs, rr)


@cuda_only
def test_cuda_graph_dual_route_and_buffered_steps():
    """A dual bf16 state at Nano's dims driven by two captured steps over overlapping slots: the
    shipped route at batch 2 (high copy only, low copy marked stale) and the buffered step at
    batch 24, replayed 64 times in a random order: the buffered step flushes the rows the route
    left stale, all on the device. Checked against the reference's route semantics."""
    import copy
    shape = MODEL_DIMS["nemotron-3-nano-4b"]
    K, L, slots = 8, 8, 28
    g = gen(82)
    p = params(shape, g)
    rs, rr = make_pair(shape, slots, L, K, "dual", "float32", "bfloat16", torch.float32, g)
    perm = torch.randperm(slots, generator=g).to(device=DEV, dtype=torch.int32)
    idx = {2: perm[:2].clone(), 24: perm[:24].clone()}       # the small batch's slots are in the large one
    idx[24][5] = -1
    assert state_route_period(rs, torch.empty(2, shape.nheads, shape.head_dim)) == 1
    assert state_route_period(rs, torch.empty(24, shape.nheads, shape.head_dim)) == 0
    static = {b: step_inputs(shape, b, torch.float32, g) for b in idx}
    out = {b: torch.empty_like(static[b]["x"]) for b in idx}
    graphs = {}
    for b in idx:
        scratch = copy.deepcopy(rs)
        graphs[b] = graph_of(lambda: M.replay_step(scratch, **static[b], **p, state_indices=idx[b], out=out[b]))
        with torch.cuda.graph(graphs[b]):
            M.replay_step(rs, **static[b], **p, state_indices=idx[b], out=out[b])
    order = [2 if r < 0.5 else 24 for r in torch.rand(64, generator=g).tolist()]
    stale_flushed = 0
    for t, b in enumerate(order):
        new = step_inputs(shape, b, torch.float32, g)
        for k, v in new.items():
            static[b][k].copy_(v)
        out[b].fill_(float("nan"))
        live = idx[b][idx[b] >= 0].long()
        stale_flushed += int(rr.lo_stale(live).sum()) if b == 24 else 0
        graphs[b].replay()
        yr = R.mamba2_replay_step(rr, **new, **p, state_indices=idx[b], route=b == 2)
        assert rel_err(out[b], yr) <= TOL_F32, f"graph step {t} (batch {b})"
        state_check(rs, rr, f"graph step {t} (batch {b})")
        resync(rs, rr)
    assert stale_flushed >= 4, stale_flushed
