"""The replay step's small-batch route (gdn/route.py): every-step and deferred, mixed with the
buffered route and the other ops, against the reference."""
from __future__ import annotations

import pytest
import torch

from replayssm import inputs as I
from replayssm import reference as R
from replayssm.gdn import plan as TK
from replayssm.state import CURSOR_MASK, ByteCounter

from kernel_checks import DEV, TOL_F32, check_epoch_wrap, check_route_words, gen, out_tol, poisoned, random_rows, \
    rel_err
from .checks import GD, SHIPPED, TALL, TINY, ckpt_check, make_pair, resync, state_check, step_inputs

# two row tiles of BLOCK_V 8 and two dk chunks: the routes' loops at a third of TALL's interpreter time
ROUTE_SHAPE = I.GDNShape(num_k_heads=1, num_v_heads=2, head_k_dim=24, head_v_dim=16)


@pytest.mark.parametrize("mode,lo,sd", [("replay", None, "float32"), ("dual", "bfloat16", "float32"),
                                         ("dual", "float8_e4m3", "float32"), ("replay", None, "bfloat16"),
                                         ("shared-low", "float8_e4m3", "float32")],
                         ids=["f32", "dual-bf16", "dual-fp8", "bf16-state", "shared-fp8"])
def test_eager_route_mixes_with_the_buffered_route(mode, lo, sd):
    # the small-batch route (EAGER_ROUTE: a flush at every step, no append) folds whatever the
    # buffer holds first, so steps may switch routes: the reference's route semantics (route=True:
    # every row flushes; dual: the high copy alone, the low copy marked stale, and the next
    # buffered step flushes it) must agree on outputs, checkpoints and cursor words (its buffer
    # rows past the cursor differ: it appends before it flushes; the kernel route does not append)
    g = gen(7)
    K = 4
    rs, rr = make_pair(ROUTE_SHAPE, 4, 6, K, mode, sd, lo, torch.bfloat16, g)
    routes = [True, False, False, True, True, False, False, False, True, True]
    flushed_pending = stale_flushed = 0
    for step, eager in enumerate(routes):
        idx = random_rows(4, 3, g, pad_p=0.2)
        live = idx[idx >= 0].long()
        x = step_inputs(ROUTE_SHAPE, 3, torch.bfloat16, g)
        if eager:
            flushed_pending += int((rr.entries(live) > 0).sum())
        else:
            stale_flushed += int(rr.lo_stale(live).sum())
        lo_before = rs.lo.data.clone() if rs.lo is not None else None
        # the rare path inline, or as a call (PENDING_CALL: the 16-bit table row's form)
        o = GD.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]),
                           config={"BLOCK_V": 8, "num_warps": 1, "EAGER_ROUTE": eager, "PENDING_CALL": step % 2 == 0})
        o_ref = R.gdn_replay_step(rr, **x, state_indices=idx, route=eager)
        assert rel_err(o, o_ref) <= out_tol(torch.bfloat16), f"{mode} step {step}: {rel_err(o, o_ref):.3g}"
        assert (o[idx < 0] == 0).all()
        assert torch.equal(rs.cursor, rr.cursor), f"{mode} step {step}: cursors"
        ckpt_check(rs.hi, rr.hi, f"{mode} step {step}: hi")
        if rs.lo is not None:
            ckpt_check(rs.lo, rr.lo, f"{mode} step {step}: lo")
        if eager:
            assert (rs.entries(live) == 0).all()
            assert rs.lo_stale(live).all() == (mode == "dual") and rs.routed == (mode == "dual")
            if mode == "dual":     # the route writes the high copy alone
                assert torch.equal(rs.lo.data, lo_before)
        for name in ("u", "k", "g", "v", "beta"):   # the buffers as the reference has them
            if getattr(rs, name) is not None:
                getattr(rs, name).copy_(getattr(rr, name))
        resync(rs, rr)
    assert flushed_pending >= 3, f"only {flushed_pending} rows had entries to fold on the eager route"
    assert stale_flushed >= 3 or mode != "dual", f"only {stale_flushed} stale low copies refreshed"


@pytest.mark.parametrize("batch", [1, 5])
def test_small_batches_take_the_tables_route_by_default(batch):
    # the shipped table at small batch: outputs, checkpoints, cursor counts and bytes as the
    # reference's route semantics with the table's period (batch 1: a flush at every step; batch 5:
    # every other step, the deferred route; entries pending from the buffered route at the start
    # are folded first)
    g = gen(11 + batch)
    K = 4
    rs, rr = make_pair(TALL, batch + 1, 6, K, "replay", "float32", None, torch.bfloat16, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    x = step_inputs(TALL, batch, torch.bfloat16, g)
    period = TK.state_route_period(rs, x["k"], x["v"])
    assert period == (1 if batch == 1 else 2)
    for step in range(6):
        idx = random_rows(batch + 1, batch, g, pad_p=0.2)
        x = step_inputs(TALL, batch, torch.bfloat16, g)
        o = SHIPPED.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]))
        o_ref = R.gdn_replay_step(rr, **x, state_indices=idx, route=period)
        assert rel_err(o, o_ref) <= out_tol(torch.bfloat16), f"step {step}: {rel_err(o, o_ref):.3g}"
        assert torch.equal(rs.cursor & CURSOR_MASK, rr.cursor), f"step {step}: cursors"
        ckpt_check(rs.hi, rr.hi, f"step {step}: hi")
        assert (rs.entries(idx[idx >= 0].long()) < period).all()
        for name in ("u", "k", "g"):     # rows past the cursor: the reference's
            getattr(rs, name).copy_(getattr(rr, name))
        resync(rs, rr)
    assert rs.counter == rr.counter


def test_eager_route_counts_bytes_like_a_flush_every_step():
    # dual: the route writes the high copy alone; the stale low copy's refresh is counted where
    # it happens (the next buffered step's flush, a verify, a flush)
    g = gen(4)
    rs, rr = make_pair(TINY, 3, 6, 3, "dual", "float32", "bfloat16", torch.float32, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    idx = torch.tensor([2, -1, 0], dtype=torch.int32, device=DEV)
    for i, route in enumerate((True, True, False, True)):
        x = step_inputs(TINY, 3, torch.float32, g)
        GD.replay_step(rs, **x, state_indices=idx, config={"EAGER_ROUTE": route})
        R.gdn_replay_step(rr, **x, state_indices=idx, route=route)
        assert rs.counter == rr.counter
        if i == 0:      # two live rows, the high copy alone written
            assert rs.counter.ckpt_write == 2 * rs.hi.bytes_per_slot()
    x = step_inputs(TINY, 3, torch.float32, g, T=2)
    GD.verify(rs, **x, state_indices=idx)
    R.gdn_verify(rr, **x, state_indices=idx)
    assert rs.counter == rr.counter
    acc = torch.tensor([1, 0, 2], dtype=torch.int32, device=DEV)
    GD.commit(rs, acc, idx)
    R.gdn_commit(rr, acc, idx)
    x = step_inputs(TINY, 3, torch.float32, g)
    GD.replay_step(rs, **x, state_indices=idx, config={"EAGER_ROUTE": True})
    R.gdn_replay_step(rr, **x, state_indices=idx, route=True)
    GD.flush(rs)
    R.gdn_flush(rr)
    assert rs.counter == rr.counter


ROUTE_MODES = [("replay", None, "float32"), ("dual", "bfloat16", "float32"), ("dual", "float8_e4m3", "float32"),
               ("replay", None, "bfloat16"), ("shared-low", "float8_e4m3", "float32")]
ROUTE_IDS = ["f32", "dual-bf16", "dual-fp8", "bf16-state", "shared-fp8"]


@pytest.mark.parametrize("mode,lo,sd,rk", [(*m, 2) for m in ROUTE_MODES] + [(*ROUTE_MODES[i], 3) for i in (0, 1)],
                         ids=[f"{i}-2" for i in ROUTE_IDS] + [f"{ROUTE_IDS[i]}-3" for i in (0, 1)])
def test_deferred_route_mixes_with_every_other_op(mode, lo, sd, rk):
    # the small-batch route of period k (ROUTE_K >= 2): the state written every k-th step, the
    # cursor moved by one program with a plain store and an epoch (state.py). Mixed with the
    # every-step route, buffered steps, a verify and commit, padded rows and slots left out of a
    # step; outputs, checkpoints, cursor counts and stale bits, buffer entries below the cursor and
    # byte counts as the reference's route semantics (route=k). Under the interpreter a
    # sequence's programs run one after another, so most read the word the first one stored
    # (the epoch's "late" case); on a GPU most read the word from before the launch.
    g = gen(17 + rk)
    K = 4
    rs, rr = make_pair(ROUTE_SHAPE, 5, 8, K, mode, sd, lo, torch.bfloat16, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    plan = ["defer"] * 5 + ["buffered", "defer", "defer", "eager", "defer", "defer", "defer", "spec", "defer",
                            "defer", "buffered", "buffered", "defer", "defer", "defer"]
    fast = 0
    for step, how in enumerate(plan):
        idx = random_rows(5, 4, g, pad_p=0.2)
        live = idx[idx >= 0].long()
        before = rs.cursor.clone()
        if how == "spec":
            x = step_inputs(ROUTE_SHAPE, 4, torch.bfloat16, g, T=2)
            o = GD.verify(rs, **x, state_indices=idx, out=poisoned(x["v"]))
            o_ref = R.gdn_verify(rr, **x, state_indices=idx)
            assert rel_err(o, o_ref) <= out_tol(torch.bfloat16), f"{mode} step {step} verify: {rel_err(o, o_ref):.3g}"
            acc = torch.randint(0, 3, (4,), generator=g).to(torch.int32).to(DEV)
            GD.commit(rs, acc, idx)
            R.gdn_commit(rr, acc, idx)
        else:
            x = step_inputs(ROUTE_SHAPE, 4, torch.bfloat16, g)
            route = {"defer": rk, "eager": 1, "buffered": 0}[how]
            cfg = {"BLOCK_V": 8, "num_warps": 1, "EAGER_ROUTE": route > 0, "ROUTE_K": max(route, 1)}
            o = GD.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]), config=cfg)
            o_ref = R.gdn_replay_step(rr, **x, state_indices=idx, route=route)
            assert rel_err(o, o_ref) <= out_tol(torch.bfloat16), f"{mode} step {step}: {rel_err(o, o_ref):.3g}"
            assert (o[idx < 0] == 0).all()
        fast += check_route_words(rs, rr, before, live, how == "defer", rk, f"{mode} step {step}")
        ckpt_check(rs.hi, rr.hi, f"{mode} step {step}: hi")
        if rs.lo is not None:
            ckpt_check(rs.lo, rr.lo, f"{mode} step {step}: lo")
        n = rr.entries()
        below = torch.arange(8, device=DEV)[None, :] < n[:, None]              # [slots, L]
        for name in ("k", "g", "v", "beta"):
            a, b = getattr(rs, name), getattr(rr, name)
            if a is not None:
                assert torch.equal(a[below], b[below]), f"{mode} step {step}: buffer {name}"
        if below.any():
            assert rel_err(rs.u[below], rr.u[below]) <= TOL_F32, f"{mode} step {step}: buffer u"
        for name in ("u", "k", "g", "v", "beta"):     # rows past the cursor: the reference's
            if getattr(rs, name) is not None:
                getattr(rs, name).copy_(getattr(rr, name))
        resync(rs, rr)
        assert rs.counter == rr.counter, f"{mode} step {step}: bytes"
    assert fast >= 10, f"only {fast} steps moved the cursor without a ticket"


def test_deferred_route_epoch_wraps_and_stale_epochs_take_the_ticket():
    # the epoch runs 1..127 and wraps to 1 (never 0, which marks another op's word); a slot whose
    # recorded epochs are stale (a word stored elsewhere with an epoch bit pattern it never saw:
    # a restore) must not be taken for a sibling's store unless it is exactly the next one
    g = gen(23)
    rs, rr = make_pair(TALL, 3, 6, 4, "replay", "float32", None, torch.bfloat16, g, cursor_hi=0)
    cfg = {"BLOCK_V": 8, "num_warps": 1, "EAGER_ROUTE": True, "ROUTE_K": 2}
    idx = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)

    def step():
        x = step_inputs(TALL, 3, torch.bfloat16, g)
        o = GD.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]), config=cfg)
        return o, R.gdn_replay_step(rr, **x, state_indices=idx, route=2)
    check_epoch_wrap(rs, rr, step, ckpt_check)


def test_deferred_route_config_errors():
    g = gen(5)
    rs, _ = make_pair(TALL, 2, 6, 4, "replay", "float32", None, torch.bfloat16, g)
    x = step_inputs(TALL, 2, torch.bfloat16, g)
    for bad in (0, 128, True, 2.0):
        with pytest.raises(ValueError, match=f"ROUTE_K={bad!r}: allowed an int 1..127"):
            GD.replay_step(rs, **x, config={"EAGER_ROUTE": True, "ROUTE_K": bad})
    with pytest.raises(ValueError, match="BLOCK_V=2 with ROUTE_K"):
        GD.replay_step(rs, **x, config={"EAGER_ROUTE": True, "ROUTE_K": 2, "BLOCK_V": 2})


@pytest.mark.parametrize("lo", ["bfloat16", "float8_e4m3"])
def test_dual_route_low_copy_refreshed_where_needed(lo):
    # LO_STALE end to end: after eager-route steps (high copy only), a verify refreshes the low
    # copy before reading it (and clears the bit, in a second launch), a flush
    # refreshes it, and a buffered step flushes stale rows; the reference agrees on outputs,
    # both copies and cursor words after every op
    g = gen(21)
    T, K, L, slots, batch = 2, 3, 6, 4, 3
    rs, rr = make_pair(TALL, slots, L, K, "dual", "float32", lo, torch.bfloat16, g)

    def route_step(tag):
        idx = random_rows(slots, batch, g, pad_p=0.2)
        x = step_inputs(TALL, batch, torch.bfloat16, g)
        o = GD.replay_step(rs, **x, state_indices=idx, config={"BLOCK_V": 8, "num_warps": 1, "EAGER_ROUTE": True})
        assert rel_err(o, R.gdn_replay_step(rr, **x, state_indices=idx, route=True)) <= out_tol(torch.bfloat16)
        for name in ("u", "k", "g", "v", "beta"):   # rows past the cursor: the reference appended there
            getattr(rs, name).copy_(getattr(rr, name))
        state_check(rs, rr, tag)
        return idx

    for rnd in range(3):
        idx = route_step(f"route {rnd}")
        live = idx[idx >= 0].long()
        assert rs.lo_stale(live).all() and rs.routed
        lo_stale_data = rs.lo.data.clone()
        x = step_inputs(TALL, batch, torch.bfloat16, g, T=T)
        o = GD.verify(rs, **x, state_indices=idx)
        assert rel_err(o, R.gdn_verify(rr, **x, state_indices=idx)) <= out_tol(torch.bfloat16), f"verify {rnd}"
        assert not torch.equal(rs.lo.data[live], lo_stale_data[live]), "verify read a stale low copy"
        assert not rs.lo_stale().any()          # refreshed, the bit cleared
        state_check(rs, rr, f"verify {rnd}")
        acc = torch.randint(0, T + 1, (batch,), generator=g).to(DEV)
        GD.commit(rs, acc, idx)
        R.gdn_commit(rr, acc, idx)
        assert not rs.lo_stale().any()
        state_check(rs, rr, f"commit {rnd}")
    idx = route_step("route before flush")
    GD.flush(rs)
    R.gdn_flush(rr)
    assert not rs.lo_stale().any() and (rs.entries() == 0).all()
    state_check(rs, rr, "flush")
    idx = route_step("route before a buffered step")
    for split in (False, True):     # fused: the replay kernel's dual flush; SPLIT: the flush-step launch
        x = step_inputs(TALL, batch, torch.bfloat16, g)
        o = GD.replay_step(rs, **x, state_indices=idx, config={"SPLIT": split, "EAGER_ROUTE": False})
        assert rel_err(o, R.gdn_replay_step(rr, **x, state_indices=idx)) <= out_tol(torch.bfloat16)
        assert not rs.lo_stale().any() and (rs.entries(idx[idx >= 0].long()) == 0).all()   # flushed
        state_check(rs, rr, f"buffered split={split}")
        if not split:
            idx = route_step("route before a split step")
