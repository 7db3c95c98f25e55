"""Mamba-2 ReplaySSM step, the buffered path (replayssm.mamba2.replay_step, Triton): outputs,
checkpoints, buffer and cursors against the exact reference, over every precision mode and
every launch knob of the step (options.override("replay", ...))."""
from __future__ import annotations

import copy

import pytest
import torch

from replayssm import inputs as I
from replayssm import mamba2 as M
from replayssm import reference as R
from replayssm.mamba2.host import block_l, fold_precision
from replayssm.mamba2.table import replay_params
from replayssm.state import ByteCounter

from kernel_checks import DEV, TOL_F32, gen, rel_err
from .m2_helpers import BUFFERED, DEVICES, IDX4, MODEL_DIMS, TINY, cuda_only, graph_of, low_precision, make_pair, \
    params, resync, run_steps, state_check, step_inputs

REPLAY_CASES = [
    # id                    mode          state      lo             act             K  L  gate
    ("replay-f32",          "replay",     "float32", None,          torch.float32,  3, 4, True),
    ("replay-f32-K1",       "replay",     "float32", None,          torch.float32,  1, 2, False),
    ("replay-bf16state",    "replay",     "bfloat16", None,         torch.bfloat16, 3, 3, True),
    ("dual-bf16",           "dual",       "float32", "bfloat16",    torch.float32,  3, 5, True),
    ("dual-fp8",            "dual",       "float32", "float8_e4m3", torch.float32,  2, 3, True),
    ("shared-low-bf16",     "shared-low", "float32", "bfloat16",    torch.float32,  3, 4, False),
    ("shared-low-fp8",      "shared-low", "float32", "float8_e4m3", torch.bfloat16, 3, 4, True),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", REPLAY_CASES, ids=[c[0] for c in REPLAY_CASES])
def test_replay_steps(device, case):
    """>= 2 flushes per sequence, mixed cursors in one batch, padded row, every mode."""
    name, mode, sd, lo, act, K, L, gate = case
    g = gen(10)
    rs, rr = make_pair(TINY, 7, L, K, mode, sd, lo, act, g)
    untouched = [t.clone() for t in (rs.hi.data, rs.x)]
    idx = torch.tensor(IDX4, dtype=torch.int32, device=device)
    flushes = run_steps(rs, rr, TINY, idx, 2 * K + 1, act, g, gate=gate, what=name)
    assert flushes >= 6
    for before, now in zip(untouched, (rs.hi.data, rs.x)):
        assert torch.equal(before[[1, 3, 4, 6]], now[[1, 3, 4, 6]]), "an unaddressed slot was written"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_p,chunks", [(8, 1), (8, 2), (4, 0)])
def test_replay_row_tiling(device, block_p, chunks):
    """head_dim 10 (like 80 scaled down) with several row tilings: split heads, two chunks
    per program with a ragged tail (one 16-row tile), the whole head in one program."""
    o = BUFFERED.override("replay", block_p=block_p, chunks=chunks, warps=4)
    shape = I.Mamba2Shape(nheads=2, head_dim=10, d_state=8, n_groups=1)
    g = gen(20)
    rs, rr = make_pair(shape, 4, 4, 3, "dual", "float32", "float8_e4m3", torch.float32, g)
    idx = torch.tensor([3, 0, -1], dtype=torch.int32, device=device)
    run_steps(rs, rr, shape, idx, 4, torch.float32, g, what=f"tiling {block_p}x{chunks}", options=o)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16], ids=["tf32x3", "bf16x3"])
def test_replay_dot_fold(device, act):
    """Tiles with every dim >= 16: the flush fold (fused in the step, and in commit's fold)
    runs on tl.dot: tf32x3 for an fp32 buffer, bf16x3 for a bf16 one; K < L."""
    assert block_l(16, 16, 16) == (16, True)
    shape = I.Mamba2Shape(nheads=2, head_dim=16, d_state=16, n_groups=1)
    g = gen(30)
    rs, rr = make_pair(shape, 3, 16, 12, "replay", "float32", None, act, g, cursor_lo=8)
    assert fold_precision(rs, BUFFERED) == ("bf16x3" if act == torch.bfloat16 else BUFFERED.fold_dot_precision)
    idx = torch.tensor([2, 0], dtype=torch.int32, device=device)
    assert run_steps(rs, rr, shape, idx, 5, act, g, what="dot") >= 2
    rs.cursor[1] = rr.cursor[1] = 11          # commit pushes slot 1 over K: fold kernel
    acc = torch.tensor([0, 3], dtype=torch.int32, device=device)
    idx2 = torch.tensor([2, 1], dtype=torch.int32, device=device)
    A = params(shape, g)["A"]
    M.commit(rs, acc, state_indices=idx2, A=A)
    R.mamba2_commit(rr, A, acc, state_indices=idx2)
    state_check(rs, rr, "dot commit")


@pytest.mark.parametrize("device", DEVICES)
def test_replay_no_indices_counter_and_deferred_cursor(device):
    """state_indices=None; rs.counter counts like the reference; advance_cursor=False
    leaves the cursor for one advance_cursors pass (layers sharing a cursor)."""
    g = gen(40)
    rs, rr = make_pair(TINY, 3, 4, 3, "replay", "float32", None, torch.float32, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    p = params(TINY, g)
    inp = step_inputs(TINY, 3, torch.float32, g)
    before = rs.cursor.clone()
    y = M.replay_step(rs, **inp, **p, advance_cursor=False, options=BUFFERED)
    assert torch.equal(rs.cursor, before)
    M.advance_cursors(rs, 3)
    yr = R.mamba2_replay_step(rr, **inp, **p)
    assert rel_err(y, yr) <= TOL_F32
    state_check(rs, rr, "deferred cursor")
    assert rs.counter == rr.counter


REPLAY_VARIANTS = [
    # id           options.override("replay", ...): the step's launch knobs
    ("split",      dict(route="split")),
    ("split-nt",   dict(route="split", ticket=False)),
    ("first",      dict(early=False, preload=False, ticket=False)),
    ("nopreload",  dict(preload=False)),
    ("late-pf",    dict(early=False, preload=False, ticket=False, pf=1)),   # the state tile's L2 hint
    ("bc",         dict(bc=True)),      # B_i . C once per group, in a launch ahead of the step
    ("lean-bc",    dict(block_p=16, warps=1, early=False, preload=False, ticket=False, fold_cols=16, bc=True)),
    ("lean-bc-early", dict(block_p=16, warps=1, early=True, preload=True, ticket=False, fold_cols=16, bc=True)),
    # every per-head term of the output path (and the dt / B appends) in that launch (PRE_COEF)
    ("coef",       dict(coef=True, ticket=False)),
    ("split-coef", dict(route="split", ticket=False, coef=True)),
    ("lean-coef",  dict(block_p=16, warps=1, early=False, preload=False, ticket=False, fold_cols=16, coef=True)),
    ("lean-coef-early", dict(block_p=16, warps=1, early=True, preload=True, ticket=False, fold_cols=16, coef=True)),
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant", REPLAY_VARIANTS, ids=[v[0] for v in REPLAY_VARIANTS])
def test_replay_variants(device, variant):
    """Step-kernel variants: split route (lean step kernel + flush kernel, ticket or cursor
    pass), load orders, the pre-pass. Dual fp8, so a flush writes both copies and the scales;
    then one deferred-cursor step (advance_cursors)."""
    o = BUFFERED.override("replay", **variant[1])
    g = gen(45)
    rs, rr = make_pair(TINY, 7, 4, 3, "dual", "float32", "float8_e4m3", torch.float32, g)
    idx = torch.tensor(IDX4, dtype=torch.int32, device=device)
    if variant[0] == "split":   # the ticket's cursor move hides a stale low copy's flush from the flush launch
        inp = step_inputs(TINY, 4, torch.float32, g)
        with pytest.raises(ValueError, match="split"):
            M.replay_step(rs, **inp, **params(TINY, g), state_indices=idx, options=o)
        rs, rr = make_pair(TINY, 7, 4, 3, "shared-low", "float32", "float8_e4m3", torch.float32, g)
    assert run_steps(rs, rr, TINY, idx, 4, torch.float32, g, what=variant[0], options=o) >= 3
    p = params(TINY, g)
    inp = step_inputs(TINY, 4, torch.float32, g)
    before = rs.cursor.clone()
    y = M.replay_step(rs, **inp, **p, state_indices=idx, advance_cursor=False, options=o)
    assert torch.equal(rs.cursor, before)
    M.advance_cursors(rs, 4, state_indices=idx, options=o)
    yr = R.mamba2_replay_step(rr, **inp, **p, state_indices=idx)
    assert rel_err(y, yr) <= TOL_F32
    state_check(rs, rr, f"{variant[0]} deferred cursor")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route,block_p,fold_cols,mode,lo,late,N", [
    ("fused", 32, 0, "replay", None, False, 32), ("split", 32, 0, "replay", None, False, 32),
    ("fused", 32, 16, "replay", None, False, 32), ("fused", 16, 16, "replay", None, True, 32),
    ("fused", 16, 16, "dual", "bfloat16", True, 32), ("fused", 16, 16, "dual", "float8_e4m3", False, 32),
    ("fused", 32, 32, "dual", "bfloat16", True, 64)])    # the Super-like dual rows: 32 x 32 chunks
def test_replay_fold_chunks(device, route, block_p, fold_cols, mode, lo, late, N):
    """Flushes that fold in [16 rows, fold_cols] chunks (tl.dot, bf16x3), re-reading the high
    rows per chunk: 32-row programs in 16-row chunks (both routes), and 16- or 32-column chunks
    of a 32- or 64-column state (fold_cols), which row-scaled fp8 copies ignore (whole rows).
    `late`: every load after the cursor and a cursor pass (the lean rows)."""
    o = BUFFERED.override("replay", block_p=block_p, chunks=1, fold_rows=16, fold_cols=fold_cols, route=route,
                          early=not late, preload=not late, ticket=not late)
    shape = I.Mamba2Shape(nheads=2, head_dim=32, d_state=N, n_groups=1)
    g = gen(46)
    rs, rr = make_pair(shape, 3, 5, 4, mode, "float32", lo, torch.bfloat16, g)
    v = replay_params(head_dim=32, read_bytes=4, batch=2, heads=2, options=o)
    assert (v["fold_rows"], v["fold_cols"]) == (16, fold_cols)
    idx = torch.tensor([2, 0], dtype=torch.int32, device=device)
    assert run_steps(rs, rr, shape, idx, 5, torch.bfloat16, g, what=f"fold chunks {route} cols {fold_cols}",
                     options=o) >= 2


def test_replay_knobs_checked():
    """fold_cols must be 0 or a power of 2 >= 16 (a tl.dot operand dim); pf 0, 1 or 2; route
    one of fused / split / eager."""
    for key, bad in (("fold_cols", 8), ("fold_cols", 24), ("pf", 3), ("route", "x")):
        with pytest.raises(ValueError, match=key):
            replay_params(head_dim=64, read_bytes=4, batch=256, heads=128,
                          options=BUFFERED.override("replay", **{key: bad}))


# ----------------------------------------------------------------------------- CUDA only
@cuda_only
@pytest.mark.parametrize("model", list(MODEL_DIMS))
@pytest.mark.parametrize("batch", [1, 3, 64, 512])
def test_replay_real_dims_cuda(model, batch):
    """Every precision mode at real dims and the shipped buffered rows (bf16 activations: the
    16-bit rows with their register budgets; fp32 buffers run at least 2 warps)."""
    shape = MODEL_DIMS[model]
    g = gen(70)
    idx = torch.randperm(batch + 2, generator=g)[:batch].to(device=DEV, dtype=torch.int32)
    if batch > 2:
        idx[1] = -1
    f32, bf16 = torch.float32, torch.bfloat16
    for mode, sd, lo, act in (("replay", "float32", None, f32), ("dual", "float32", "float8_e4m3", f32),
                              ("dual", "float32", "bfloat16", f32), ("replay", "bfloat16", None, bf16),
                              ("dual", "float32", "bfloat16", bf16)):
        rs, rr = make_pair(shape, batch + 2, 16, 8, mode, sd, lo, act, g)
        run_steps(rs, rr, shape, idx, 9, act, g, what=f"{model} b{batch} {mode} {sd} {lo} {act}")


def _graph_replay_steps(mode, lo, batch, steps, seed, options=BUFFERED):
    """One captured replay_step at Nano's dims (K = L = 8, two null rows) replayed `steps`
    times, checked against the reference after every replay."""
    shape = MODEL_DIMS["nemotron-3-nano-4b"]
    K, L = 8, 8
    g = gen(seed)
    p = params(shape, g)
    rs, rr = make_pair(shape, batch + 4, L, K, mode, "float32", lo, torch.float32, g)
    idx = torch.randperm(batch + 4, generator=g)[:batch].to(device=DEV, dtype=torch.int32)
    idx[[3, 17]] = -1
    static = step_inputs(shape, batch, torch.float32, g)
    out = torch.empty_like(static["x"])
    scratch = copy.deepcopy(rs)
    graph = graph_of(lambda: M.replay_step(scratch, **static, **p, state_indices=idx, out=out, options=options))
    with torch.cuda.graph(graph):
        M.replay_step(rs, **static, **p, state_indices=idx, out=out, options=options)
    for t in range(steps):
        new = step_inputs(shape, batch, torch.float32, g)
        for k, v in new.items():
            static[k].copy_(v)
        out.fill_(float("nan"))
        graph.replay()
        yr = R.mamba2_replay_step(rr, **new, **p, state_indices=idx)
        assert rel_err(out, yr) <= TOL_F32, f"graph step {t}"
        state_check(rs, rr, f"graph step {t}")
        if low_precision(rs):
            resync(rs, rr)


@cuda_only
@pytest.mark.parametrize("mode,lo", [("replay", None), ("dual", "float8_e4m3"), ("shared-low", "bfloat16")])
def test_cuda_graph_replay(mode, lo):
    """One captured replay_step (one launch: the cursor moves by ticket at batch 32)
    replayed 72 steps (K = 8: every sequence flushes 9 times)."""
    _graph_replay_steps(mode, lo, 32, 72, 80)


@cuda_only
@pytest.mark.parametrize("mode,lo", [("replay", None), ("dual", "bfloat16"), ("dual", "float8_e4m3")])
def test_cuda_graph_replay_bc_prepass(mode, lo):
    """Large batches at Nano's dims, where the shipped table runs the B_i . C pre-pass (the step
    its programmatic dependent) and a separate cursor launch: three launches captured, replayed
    40 steps (5 flushes per sequence)."""
    shape = MODEL_DIMS["nemotron-3-nano-4b"]
    read = 1 if lo == "float8_e4m3" else 2 if lo else 4
    batch = 256 if read == 1 else 160       # fp8 copies take the pre-pass from batch x heads 24576
    assert replay_params(head_dim=shape.head_dim, read_bytes=read, batch=batch, heads=shape.nheads,
                         dual=mode == "dual", options=BUFFERED)["bc"]
    _graph_replay_steps(mode, lo, batch, 40, 81)


@cuda_only
@pytest.mark.parametrize("mode,lo", [("replay", None), ("dual", "bfloat16"), ("shared-low", "bfloat16")])
def test_cuda_graph_replay_coef_prepass(mode, lo):
    """The coef knob at Nano's dims, batch 160: every per-head term of the output path and the
    dt / B appends in the pre-pass, captured with the step and the cursor launch and replayed
    40 steps (5 flushes per sequence)."""
    o = BUFFERED.override("replay", coef=True)
    shape = MODEL_DIMS["nemotron-3-nano-4b"]
    v = replay_params(head_dim=shape.head_dim, read_bytes=2 if lo else 4, batch=160, heads=shape.nheads,
                      dual=mode == "dual", options=o)
    assert v["coef"] and not v["ticket"]
    _graph_replay_steps(mode, lo, 160, 40, 83, options=o)
