"""Mamba-2 Triton kernels (replayssm.mamba2, backend='triton') against the exact reference.

On a CPU-only machine the kernels run under TRITON_INTERPRET=1 (see conftest.py) at tiny
shapes; on CUDA the same tests run on the GPU, plus real model dims at batch 1..512 and
CUDA-graph capture/replay over >= 64 steps spanning flushes.

The reference runs in float32 on the same inputs. Low-precision checkpoints (bf16 / fp8)
are compared within one rounding step and then re-synchronised (triton -> reference), so
a single rounding flip cannot cascade, while every output is held to the fp32 tolerance.
"""
from __future__ import annotations

import copy

import pytest
import torch

from replayssm import inputs as I
from replayssm import mamba2 as M
from replayssm import reference as R
from replayssm.state import ByteCounter, Mamba2ReplayState, dtype_of

from kernel_checks import CUDA, DEV, TOL_F32, check_epoch_wrap, check_route_words, gen, out_tol, poisoned, \
    random_rows, rel_err

DEVICES = [pytest.param(DEV, id=DEV)]

ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float8_e4m3fn: 2.0 ** -3}

TINY = I.Mamba2Shape(nheads=4, head_dim=5, d_state=8, n_groups=2)   # 2 heads per group


# ----------------------------------------------------------------------------- helpers
def make_pair(shape, slots, L, K, mode="replay", state_dtype="float32", lo_dtype=None, act=torch.float32,
              g=None, cursor_lo=0):
    """Two identical replay states (kernel, reference) with a random checkpoint, random
    cursors in [cursor_lo, K-1] and every buffer row filled (rows past the cursor are
    finite garbage that must be ignored)."""
    H, P, N, G = shape.nheads, shape.head_dim, shape.d_state, shape.n_groups
    rs = Mamba2ReplayState.allocate(slots, H, P, N, G, L, K, mode=mode, state_dtype=state_dtype,
                                    lo_dtype=lo_dtype, act_dtype=act, device=DEV)
    every = torch.arange(slots, device=DEV)
    s0 = I.random_state(slots, H, P, N, device=DEV, gen=g)
    rs.hi.write(every, s0)
    if rs.lo is not None:
        rs.lo.write(every, s0)
    rs.cursor.copy_(torch.randint(cursor_lo, K, (slots,), generator=g).to(torch.int32))
    rs.x.copy_(torch.randn(rs.x.shape, generator=g, dtype=torch.float64).to(act))
    rs.B.copy_((torch.randn(rs.B.shape, generator=g, dtype=torch.float64) / N ** 0.5).to(act))
    rs.dt.copy_(R.softplus(torch.randn(rs.dt.shape, generator=g, dtype=torch.float64) * 0.5 - 2).to(rs.dt.dtype))
    return rs, copy.deepcopy(rs)


def ckpt_check(a, b, what: str) -> None:
    """Kernel checkpoint a vs reference b (state.Checkpoint), dequantised."""
    every = torch.arange(a.data.shape[0], device=a.data.device)
    x, y = a.read(every, torch.float32), b.read(every, torch.float32)
    if a.data.dtype in (torch.float32, torch.float64):
        assert rel_err(x, y) <= TOL_F32, f"{what}: rel err {rel_err(x, y):.3g}"
        return
    assert torch.isfinite(x).all(), f"{what}: non-finite"
    ulp = ULP[a.data.dtype]
    rowmax = y.abs().amax(-1, keepdim=True)
    sub = 2.0 ** -9 if a.is_fp8 else 2.0 ** -24          # absolute quantum near zero (per unit scale)
    lim = ulp * torch.maximum(x.abs(), y.abs()) + (sub + 1e-5) * rowmax + 1e-30
    bad = (x - y).abs() > lim
    assert not bad.any(), f"{what}: {int(bad.sum())} elements beyond one rounding step"
    flips = ((x - y).abs() > 1e-5 * rowmax).float().mean().item()
    assert flips <= 0.02, f"{what}: {flips:.1%} of elements differ (expected rare rounding flips)"


def state_check(rs, rr, what: str) -> None:
    assert torch.equal(rs.cursor, rr.cursor), f"{what}: cursor {rs.cursor.tolist()} vs {rr.cursor.tolist()}"
    ckpt_check(rs.hi, rr.hi, f"{what}: hi")
    if rs.lo is not None:
        ckpt_check(rs.lo, rr.lo, f"{what}: lo")
    valid = torch.arange(rs.capacity, device=rs.cursor.device)[None, :] < rs.entries()[:, None]   # [S, L]
    assert torch.equal(rs.x[valid], rr.x[valid]), f"{what}: buffer x"
    assert torch.equal(rs.B[valid], rr.B[valid]), f"{what}: buffer B"
    if valid.any():
        assert rel_err(rs.dt[valid], rr.dt[valid]) <= 1e-5, f"{what}: buffer dt"


def resync(rs, rr) -> None:
    """Copy the kernel's state into the reference's (after checking it)."""
    for a, b in ((rs.hi, rr.hi), (rs.lo, rr.lo)):
        if a is None:
            continue
        b.data.copy_(a.data)
        if a.scale is not None:
            b.scale.copy_(a.scale)
    for t, u in ((rs.x, rr.x), (rs.B, rr.B), (rs.dt, rr.dt), (rs.cursor, rr.cursor)):
        u.copy_(t)


def low_precision(rs) -> bool:
    return rs.hi.data.dtype not in (torch.float32, torch.float64) or rs.lo is not None


def step_inputs(shape, batch, act, g, T=None, gate=True):
    inp = I.mamba2_step_inputs(shape, batch, T=T, act_dtype=act, device="cpu", gate=gate, gen=g)
    return {k: (v.to(DEV) if v is not None else None) for k, v in inp.items()}


def params(shape, g):
    return {k: v.to(DEV) for k, v in I.mamba2_params(shape, gen=g).items()}


def run_steps(rs, rr, shape, idx, steps, act, g, gate=True, what=""):
    """Drive both states `steps` steps; compare outputs (poisoned out) and state every step."""
    p = params(shape, g)
    flushes = 0
    for t in range(steps):
        inp = step_inputs(shape, idx.shape[0], act, g, gate=gate)
        live = idx[idx >= 0].long()
        flushes += int((rr.cursor[live] + 1 >= rr.flush_period).sum())
        out = poisoned(inp["x"])
        y = M.replay_step(rs, **inp, **p, state_indices=idx, out=out)
        assert y is out
        yr = R.mamba2_replay_step(rr, **inp, **p, state_indices=idx)
        assert rel_err(y, yr) <= out_tol(act), f"{what} step {t}: y rel err {rel_err(y, yr):.3g}"
        assert (y[idx < 0] == 0).all(), "padded rows must output 0"
        state_check(rs, rr, f"{what} step {t}")
        if low_precision(rs):
            resync(rs, rr)
    return flushes


def force_config(monkeypatch, block_p, chunks, warps=4):
    from replayssm.triton import mamba2 as tk
    for key in list(tk.CONFIG_TABLE):
        monkeypatch.setitem(tk.CONFIG_TABLE, key, (block_p, chunks, warps))
    monkeypatch.setitem(tk.OVERRIDE, "replay", dict(block_p=block_p, chunks=chunks, warps=warps))


IDX4 = [5, -1, 2, 0]   # permuted slots, one padded row; slots 1, 3, 4, 6 are never addressed


# ----------------------------------------------------------------------------- eager
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("state_dtype,act,gate", [
    ("float32", torch.float32, True),
    ("float32", torch.bfloat16, False),
    ("bfloat16", torch.bfloat16, True),
    ("float16", torch.float32, True),
])
def test_eager_step(device, state_dtype, act, gate):
    g = gen(1)
    p = params(TINY, g)
    st = I.random_state(7, TINY.nheads, TINY.head_dim, TINY.d_state, dtype=dtype_of(state_dtype), device=device, gen=g)
    sr = st.clone()
    idx = torch.tensor(IDX4, dtype=torch.int32, device=device)
    for t in range(2):
        inp = step_inputs(TINY, 4, act, g, gate=gate)
        out = poisoned(inp["x"])
        y = M.eager_step(st, **inp, **p, state_indices=idx, out=out)
        yr = R.mamba2_eager_step(sr, **inp, **p, state_indices=idx)
        assert rel_err(y, yr) <= out_tol(act)
        assert (y[1] == 0).all()
        if st.dtype == torch.float32:
            assert rel_err(st, sr) <= TOL_F32
        else:  # one rounding of the new state; untouched slots bit-identical
            assert ((st.float() - sr.float()).abs() <= ULP[st.dtype] * sr.float().abs() + 1e-6).all()
            sr.copy_(st)
        assert torch.equal(st[[1, 3, 4, 6]], sr[[1, 3, 4, 6]])


@pytest.mark.parametrize("device", DEVICES)
def test_eager_no_indices_and_counter(device):
    """state_indices=None addresses slot b; the byte counter matches the reference's."""
    from replayssm.state import ByteCounter
    g = gen(2)
    p = params(TINY, g)
    st = I.random_state(3, TINY.nheads, TINY.head_dim, TINY.d_state, device=device, gen=g)
    sr = st.clone()
    inp = step_inputs(TINY, 3, torch.float32, g)
    c1, c2 = ByteCounter(), ByteCounter()
    y = M.eager_step(st, **inp, **p, counter=c1)
    yr = M.eager_step(sr, **inp, **p, counter=c2, backend="reference")
    assert rel_err(y, yr) <= TOL_F32 and rel_err(st, sr) <= TOL_F32
    assert c1 == c2


# ----------------------------------------------------------------------------- replay step
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
    """>= 3 flushes per sequence, mixed cursors in one batch, padded row, every mode."""
    name, mode, sd, lo, act, K, L, gate = case
    g = gen(10)
    rs, rr = make_pair(TINY, 7, L, K, mode, sd, lo, act, g)
    untouched = [t.clone() for t in (rs.hi.data, rs.x)]
    idx = torch.tensor(IDX4, dtype=torch.int32, device=device)
    flushes = run_steps(rs, rr, TINY, idx, 3 * K + 1, act, g, gate=gate, what=name)
    assert flushes >= 9
    for before, now in zip(untouched, (rs.hi.data, rs.x)):
        assert torch.equal(before[[1, 3, 4, 6]], now[[1, 3, 4, 6]]), "an unaddressed slot was written"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_p,chunks", [(8, 1), (8, 2), (4, 0)])
def test_replay_row_tiling(device, block_p, chunks, monkeypatch):
    """head_dim 10 (like 80 scaled down) with several row tilings: split heads, two chunks
    per program with a ragged tail (replay: one 16-row tile), the whole head in one program."""
    force_config(monkeypatch, block_p, chunks)
    shape = I.Mamba2Shape(nheads=2, head_dim=10, d_state=8, n_groups=1)
    g = gen(20)
    rs, rr = make_pair(shape, 4, 4, 3, "dual", "float32", "float8_e4m3", torch.float32, g)
    idx = torch.tensor([3, 0, -1], dtype=torch.int32, device=device)
    run_steps(rs, rr, shape, idx, 4, torch.float32, g, what=f"tiling {block_p}x{chunks}")
    # eager with the same tiling
    p = params(shape, g)
    st = I.random_state(4, 2, 10, 8, device=device, gen=g)
    sr = st.clone()
    inp = step_inputs(shape, 3, torch.float32, g)
    y = M.eager_step(st, **inp, **p, state_indices=idx, out=poisoned(inp["x"]))
    yr = R.mamba2_eager_step(sr, **inp, **p, state_indices=idx)
    assert rel_err(y, yr) <= TOL_F32 and rel_err(st, sr) <= TOL_F32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("act", [torch.float32, torch.bfloat16], ids=["tf32x3", "bf16x3"])
def test_replay_dot_fold(device, act):
    """Tiles with every dim >= 16: the flush fold (fused in the step, and in commit's fold)
    runs on tl.dot: tf32x3 for an fp32 buffer, bf16x3 for a bf16 one; K < L."""
    from replayssm.triton import mamba2 as tk
    assert tk._block_l(16, 16, 16) == (16, True)
    shape = I.Mamba2Shape(nheads=2, head_dim=16, d_state=16, n_groups=1)
    g = gen(30)
    rs, rr = make_pair(shape, 3, 16, 12, "replay", "float32", None, act, g, cursor_lo=8)
    assert tk._fold_precision(rs) == ("bf16x3" if act == torch.bfloat16 else tk.FOLD_DOT_PRECISION)
    idx = torch.tensor([2, 0], dtype=torch.int32, device=device)
    assert run_steps(rs, rr, shape, idx, 5, act, g, what="dot") >= 2
    rs.cursor[1] = rr.cursor[1] = 11          # commit pushes slot 1 over K: fold kernel
    acc = torch.tensor([0, 3], dtype=torch.int32, device=device)
    idx2 = torch.tensor([2, 1], dtype=torch.int32, device=device)
    A = params(shape, g)["A"]
    M.commit(rs, A, acc, state_indices=idx2)
    R.mamba2_commit(rr, A, acc, state_indices=idx2)
    state_check(rs, rr, "dot commit")


@pytest.mark.parametrize("device", DEVICES)
def test_replay_no_indices_counter_and_deferred_cursor(device):
    """state_indices=None; rs.counter counts like the reference; advance_cursor=False
    leaves the cursor for one advance_cursors pass (layers sharing a cursor)."""
    from replayssm.state import ByteCounter
    g = gen(40)
    rs, rr = make_pair(TINY, 3, 4, 3, "replay", "float32", None, torch.float32, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    p = params(TINY, g)
    inp = step_inputs(TINY, 3, torch.float32, g)
    before = rs.cursor.clone()
    y = M.replay_step(rs, **inp, **p, advance_cursor=False)
    assert torch.equal(rs.cursor, before)
    M.advance_cursors(rs, 3)
    yr = R.mamba2_replay_step(rr, **inp, **p)
    assert rel_err(y, yr) <= TOL_F32
    state_check(rs, rr, "deferred cursor")
    assert rs.counter == rr.counter


REPLAY_VARIANTS = [
    # id           OVERRIDE['replay'] (the launch knobs tools/tune_mamba2.py sweeps)
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
def test_replay_variants(device, variant, monkeypatch):
    """Step-kernel variants: split route (lean step kernel + flush kernel, ticket or cursor
    pass), the first version's load order, buffer tiles loaded in the branch. Dual fp8, so a
    flush writes both copies and the scales; then one deferred-cursor step (advance_cursors)."""
    from replayssm.triton import mamba2 as tk
    monkeypatch.setitem(tk.OVERRIDE, "replay", variant[1])
    g = gen(45)
    rs, rr = make_pair(TINY, 7, 4, 3, "dual", "float32", "float8_e4m3", torch.float32, g)
    idx = torch.tensor(IDX4, dtype=torch.int32, device=device)
    if variant[0] == "split":   # the ticket's cursor move hides a stale low copy's flush from the flush launch
        inp = step_inputs(TINY, 4, torch.float32, g)
        with pytest.raises(ValueError, match="split"):
            M.replay_step(rs, **inp, **params(TINY, g), state_indices=idx)
        rs, rr = make_pair(TINY, 7, 4, 3, "shared-low", "float32", "float8_e4m3", torch.float32, g)
    assert run_steps(rs, rr, TINY, idx, 4, torch.float32, g, what=variant[0]) >= 3
    p = params(TINY, g)
    inp = step_inputs(TINY, 4, torch.float32, g)
    before = rs.cursor.clone()
    y = M.replay_step(rs, **inp, **p, state_indices=idx, advance_cursor=False)
    assert torch.equal(rs.cursor, before)
    M.advance_cursors(rs, 4, state_indices=idx)
    yr = R.mamba2_replay_step(rr, **inp, **p, state_indices=idx)
    assert rel_err(y, yr) <= TOL_F32
    state_check(rs, rr, f"{variant[0]} deferred cursor")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("route,block_p,fold_cols,mode,lo,late,N", [
    ("fused", 32, 0, "replay", None, False, 32), ("split", 32, 0, "replay", None, False, 32),
    ("fused", 32, 16, "replay", None, False, 32), ("fused", 16, 16, "replay", None, True, 32),
    ("fused", 16, 16, "dual", "bfloat16", True, 32), ("fused", 16, 16, "dual", "float8_e4m3", False, 32),
    ("fused", 32, 32, "dual", "bfloat16", True, 64)])    # the Super-like dual rows: 32 x 32 chunks
def test_replay_fold_chunks(device, route, block_p, fold_cols, mode, lo, late, N, monkeypatch):
    """Flushes that fold in [16 rows, fold_cols] chunks (tl.dot, bf16x3), re-reading the high
    rows per chunk: 32-row programs in 16-row chunks (both routes), and 16- or 32-column chunks
    of a 32- or 64-column state (fold_cols), which row-scaled fp8 copies ignore (whole rows).
    `late`: the large-batch table entry's load order (every load after the cursor) and cursor pass."""
    from replayssm.triton import mamba2 as tk
    monkeypatch.setitem(tk.OVERRIDE, "replay", dict(block_p=block_p, chunks=1, fold_rows=16, fold_cols=fold_cols,
                                                    route=route, early=not late, preload=not late, ticket=not late))
    shape = I.Mamba2Shape(nheads=2, head_dim=32, d_state=N, n_groups=1)
    g = gen(46)
    rs, rr = make_pair(shape, 3, 5, 4, mode, "float32", lo, torch.bfloat16, g)
    v = tk.replay_variant(32, 4, 2, 2)
    assert (v["fold_rows"], v["fold_cols"]) == (16, fold_cols)
    idx = torch.tensor([2, 0], dtype=torch.int32, device=device)
    assert run_steps(rs, rr, shape, idx, 5, torch.bfloat16, g, what=f"fold chunks {route} cols {fold_cols}") >= 2


def test_replay_prepass_rows(monkeypatch):
    """Where the table runs the B_i . C pre-pass (bc) and with which tile, by batch x heads
    (min_bh) and head dim (p_mod): fp32 reads from 12288, 16-bit from 6144 (32-row programs
    from 12288 whatever the head dim, sessions 35-36; dual states' from 16384 when 32 divides the
    head dim, folding 32 columns per chunk), dual fp8 from 24576 in 32-row programs; a
    tuning override wins. Of the fp32 and 16-bit (lean) rows, 16-bit reads in 16-row programs
    with the pre-pass load their state tile first (early), the others after the cursor."""
    from replayssm.triton import mamba2 as tk
    super_, nano = (64, 128), (80, 96)     # (head dim, heads)
    cases = [  # (dims, read bytes, dual, batch) -> (bc, rows)
        (super_, 4, False, 64, False, 16), (super_, 4, False, 96, True, 16), (nano, 4, False, 96, False, 16),
        (nano, 4, False, 128, True, 16), (super_, 2, True, 32, False, 16), (super_, 2, True, 64, True, 16),
        (super_, 2, True, 256, True, 32), (nano, 2, False, 256, True, 32), (nano, 2, False, 192, True, 32),
        (nano, 2, False, 128, True, 32), (nano, 2, False, 96, True, 16), (super_, 2, False, 96, True, 32),
        (super_, 2, False, 64, True, 16), (nano, 2, True, 256, True, 16), (nano, 2, True, 64, True, 16),
        (super_, 1, True, 128, False, 64), (super_, 1, True, 256, True, 32), (nano, 1, True, 256, True, 32),
        (nano, 1, True, 128, False, 16)]
    for (P, H), rb, dual, batch, bc, rows in cases:
        v = tk.replay_variant(P, rb, batch, H, dual)
        assert (v["bc"], v["block_p"]) == (bc, rows), (P, rb, dual, batch, v)
        if rb > 1:      # the lean rows (fp8 rows without the pre-pass are session 7's, early)
            assert v["early"] == v["preload"] == (rb == 2 and bc and rows == 16), (P, rb, dual, batch, v)
    # dual states' 32-row programs (from batch x heads 16384) fold 32 columns per chunk, the others 16
    assert [(tk.replay_variant(P, 2, b, H, dual)["block_p"], tk.replay_variant(P, 2, b, H, dual)["fold_cols"])
            for (P, H), dual, b in ((super_, True, 256), (super_, True, 512), (super_, False, 256),
                                    (super_, True, 128), (super_, False, 128), (super_, True, 64), (nano, True, 256))] \
        == [(32, 32), (32, 32), (32, 16), (32, 32), (32, 16), (16, 16), (16, 16)]
    monkeypatch.setitem(tk.OVERRIDE, "replay", {"bc": False})
    assert not tk.replay_variant(64, 4, 256, 128)["bc"]


def test_16bit_rows_register_budgets(monkeypatch):
    """The 16-bit read copies' rows run under register budgets. Dual states (session 34, where
    the flushing programs' fold set the count): Super's 32-row programs (from batch x heads
    16384) at 96, the early 16-row programs from 6144 at 72 (Nano from batch 64, Super at batch
    48-127). bf16 states (sessions 35-36): the 32-row programs (from 12288: Super from batch 96,
    Nano, head dim 80, from 128) at 72, the early 16-row programs at 64. Smaller batches, fp32
    reads and fp8 low copies keep ptxas' own count; a tuning override's budget wins."""
    from replayssm.triton import mamba2 as tk
    super_, nano = (64, 128), (80, 96)     # (head dim, heads)
    cases = [  # (dims, read bytes, dual, batch) -> maxnreg
        (super_, 2, True, 128, 96), (super_, 2, True, 256, 96), (super_, 2, True, 512, 96),
        (super_, 2, True, 64, 72), (super_, 2, True, 32, None), (super_, 2, False, 256, 72),
        (super_, 2, False, 512, 72), (super_, 2, False, 192, 72), (super_, 2, False, 128, 72),
        (super_, 2, False, 96, 72), (super_, 2, False, 64, 64), (super_, 2, False, 48, 64),
        (super_, 2, False, 32, None), (super_, 4, False, 256, None), (nano, 2, True, 128, 72),
        (nano, 2, True, 256, 72), (nano, 2, True, 512, 72), (nano, 2, True, 64, 72), (nano, 2, True, 32, None),
        (nano, 2, False, 64, 64), (nano, 2, False, 96, 64), (nano, 2, False, 128, 72), (nano, 2, False, 192, 72),
        (nano, 2, False, 256, 72), (nano, 2, False, 512, 72),
        (nano, 2, False, 32, None),
        (nano, 4, False, 256, None), (nano, 1, True, 256, None)]
    got = [tk.replay_variant(P, rb, b, H, dual)["maxnreg"] for (P, H), rb, dual, b, _ in cases]
    assert got == [c[-1] for c in cases]
    monkeypatch.setitem(tk.OVERRIDE, "replay", {"maxnreg": 0})
    assert not tk.replay_variant(64, 2, 256, 128, True)["maxnreg"]


def test_replay_fold_cols_checked(monkeypatch):
    """fold_cols must be 0 or a power of 2 >= 16 (a tl.dot operand dim); pf 0, 1 or 2."""
    from replayssm.triton import mamba2 as tk
    for key, bad in (("fold_cols", 8), ("fold_cols", 24), ("pf", 3)):
        monkeypatch.setitem(tk.OVERRIDE, "replay", {key: bad})
        with pytest.raises(ValueError, match=key):
            tk.replay_variant(64, 4, 256, 128)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode,sd,lo,act", [("replay", "float32", None, torch.float32),
                                            ("replay", "float32", None, torch.bfloat16),
                                            ("dual", "float32", "bfloat16", torch.float32),
                                            ("dual", "float32", "float8_e4m3", torch.bfloat16),
                                            ("shared-low", "float32", "bfloat16", torch.float32)],
                         ids=["f32", "f32-bf16-act", "dual-bf16", "dual-fp8", "shared-bf16"])
def test_eager_route_mixes_with_the_buffered_route(device, mode, sd, lo, act, monkeypatch):
    """The small-batch route (route "eager": a flush at every step, pending entries folded
    first, nothing appended; dual: the high copy alone, the low copy marked stale, and the next
    buffered step flushes it) alternating with the buffered route step by step: the reference's
    route semantics (route=True) agree on outputs, checkpoints, cursor words and bytes."""
    from replayssm.triton import mamba2 as tk
    shape = I.Mamba2Shape(nheads=4, head_dim=12, d_state=16, n_groups=2)
    g = gen(47)
    K = 4
    rs, rr = make_pair(shape, 7, 6, K, mode, sd, lo, act, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    p = params(shape, g)
    idx = torch.tensor(IDX4, dtype=torch.int32, device=device)
    live = idx[idx >= 0].long()
    pending = stale_flushed = 0
    for step, eager in enumerate([True, False, False, True, True, False, False, False, True]):
        monkeypatch.setitem(tk.OVERRIDE, "replay", dict(route="eager", block_p=4, warps=1) if eager else {})
        inp = step_inputs(shape, 4, act, g)
        if eager:
            pending += int((rr.entries(live) > 0).sum())
        else:
            stale_flushed += int(rr.lo_stale(live).sum())
        lo_before = rs.lo.data.clone() if rs.lo is not None else None
        y = M.replay_step(rs, **inp, **p, state_indices=idx, out=poisoned(inp["x"]))
        yr = R.mamba2_replay_step(rr, **inp, **p, state_indices=idx, route=eager)
        assert rel_err(y, yr) <= out_tol(act), f"{mode} step {step}: {rel_err(y, yr):.3g}"
        assert (y[idx < 0] == 0).all()
        state_check(rs, rr, f"{mode} step {step}")
        if eager:
            assert (rs.entries(live) == 0).all() and rs.lo_stale(live).all() == (mode == "dual")
            assert tk.state_takes_eager_route(rs, inp["x"]) and rs.routed == (mode == "dual")
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
                         + [(*DEFER_MODES[0], 3, 8), (*DEFER_MODES[1], 3, 4), (*DEFER_MODES[0], 2, 8)],
                         ids=[f"{i}-2" for i in DEFER_IDS] + ["f32-3-rows8", "dual-bf16-3", "f32-2-rows8"])
def test_deferred_route_mixes_with_every_other_op(mode, lo, sd, rk, block_p, monkeypatch):
    """The small-batch route of period k (route_k >= 2, _replay_defer_kernel): the state written
    every k-th step, entries appended between, the cursor moved by one program with a plain
    store and an epoch (state.py). Mixed with the every-step route, buffered steps, a verify and
    commit, padded rows and slots left out of a step; outputs, checkpoints, cursor counts and
    stale bits, buffer entries below the cursor and byte counts as the reference's route
    semantics (route=k). 8-row programs over a head dim of 12 leave the second program's second
    epoch byte past the head (masked). Under the interpreter a sequence's programs run one after
    another, so most read the word the first one stored (the epoch's "late" case)."""
    from replayssm.triton import mamba2 as tk
    shape = I.Mamba2Shape(nheads=4, head_dim=12, d_state=16, n_groups=2)
    g = gen(61 + rk + block_p)
    K = 4
    rs, rr = make_pair(shape, 5, 8, K, mode, sd, lo, torch.bfloat16, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    p = params(shape, g)
    plan = ["defer"] * 5 + ["buffered", "defer", "defer", "eager", "defer", "defer", "defer", "spec", "defer",
                            "defer", "buffered", "buffered", "defer", "defer", "defer"]
    fast = appended = 0
    for step, how in enumerate(plan):
        idx = random_rows(5, 4, g, pad_p=0.2)
        live = idx[idx >= 0].long()
        before = rs.cursor.clone()
        if how == "spec":
            inp = step_inputs(shape, 4, torch.bfloat16, g, T=2)
            y = M.verify(rs, **inp, **p, state_indices=idx, out=poisoned(inp["x"]))
            yr = R.mamba2_verify(rr, **inp, **p, state_indices=idx)
            assert rel_err(y, yr) <= out_tol(torch.bfloat16), f"{mode} step {step} verify: {rel_err(y, yr):.3g}"
            acc = torch.randint(0, 3, (4,), generator=g).to(torch.int32).to(DEV)
            M.commit(rs, p["A"], acc, state_indices=idx)
            R.mamba2_commit(rr, p["A"], acc, state_indices=idx)
        else:
            route = {"defer": rk, "eager": 1, "buffered": 0}[how]
            monkeypatch.setattr(tk, "SMALL_BATCH_ROUTE", route > 0)
            monkeypatch.setitem(tk.OVERRIDE, "replay",
                                dict(route="eager", block_p=block_p, warps=1, route_k=route) if route else {})
            inp = step_inputs(shape, 4, torch.bfloat16, g)
            assert tk.state_route_period(rs, inp["x"]) == min(route, K)
            if how == "defer":
                appended += int((rr.entries(live) + 1 < rk).sum())
            y = M.replay_step(rs, **inp, **p, state_indices=idx, out=poisoned(inp["x"]))
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
    assert fast >= 10, f"only {fast} steps moved the cursor without a ticket"
    assert appended >= 5, f"only {appended} route steps appended an entry"


def test_deferred_route_epoch_wraps_and_stale_epochs_take_the_ticket(monkeypatch):
    """The epoch runs 1..127 and wraps to 1 (never 0, which marks another op's word); a slot
    whose recorded epochs are stale (a word stored elsewhere with an epoch it never saw: a
    restore) must not be taken for a sibling's store unless it is exactly the next one."""
    from replayssm.triton import mamba2 as tk
    shape = I.Mamba2Shape(nheads=4, head_dim=12, d_state=16, n_groups=2)
    g = gen(67)
    rs, rr = make_pair(shape, 3, 6, 4, "replay", "float32", None, torch.bfloat16, g)
    rs.cursor.zero_()
    rr.cursor.zero_()
    monkeypatch.setitem(tk.OVERRIDE, "replay", dict(route="eager", block_p=4, warps=1, route_k=2))
    p = params(shape, g)
    idx = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)

    def step():
        inp = step_inputs(shape, 3, torch.bfloat16, g)
        y = M.replay_step(rs, **inp, **p, state_indices=idx, out=poisoned(inp["x"]))
        return y, R.mamba2_replay_step(rr, **inp, **p, state_indices=idx, route=2)
    check_epoch_wrap(rs, rr, step, ckpt_check)


def test_deferred_route_config_errors(monkeypatch):
    from replayssm.triton import mamba2 as tk
    for bad in (0, 128, True, 2.0):
        monkeypatch.setitem(tk.OVERRIDE, "replay", dict(route="eager", block_p=4, warps=1, route_k=bad))
        with pytest.raises(ValueError, match=f"route_k={bad!r}: allowed an int 1..127"):
            tk.replay_variant(12, 4, 1, 4)
    monkeypatch.setitem(tk.OVERRIDE, "replay", dict(route="eager", block_p=2, warps=1, route_k=2))
    with pytest.raises(ValueError, match="block_p=2 with route_k=2"):
        tk.replay_variant(12, 4, 1, 4)


@pytest.mark.shipped_routes
def test_launch_tables_at_the_real_head_dims():
    """Session 17's rows: the fp32 eager route 32 rows x 8 warps where the head dim is a multiple
    of 32 (Super's 64), else 8 x 1 (Nano's 80); bf16 eager 8 rows x 1 warp in the small bucket,
    16 x 1 in the large one (whole-head tiles before)."""
    from replayssm.triton import mamba2 as tk
    route = lambda P, rb=4, dual=False: tk.replay_variant(P, rb, 2, 128, dual)    # noqa: E731
    assert (route(64)["block_p"], route(64)["warps"], route(64)["route"], route(64)["route_k"]) == (32, 8, "eager", 1)
    assert (route(80)["block_p"], route(80)["warps"], route(80)["route"], route(80)["route_k"]) == (8, 1, "eager", 2)
    assert route(64, 2, True) == route(64)                                      # dual: the fp32 route
    assert route(80, 1, True) == dict(route(80), route_k=1)                     # (every step: session 32)
    assert tk.launch_config("eager", 80, 2, 8, 64) == (8, 1, 1)
    for P in (64, 80):
        assert tk.launch_config("eager", P, 2, 256, 128) == (16, 1, 1)
    assert tk.launch_config("eager", 64, 4, 256, 128) == (32, 1, 8)              # fp32 unchanged


@pytest.mark.shipped_routes
def test_small_batch_route_periods_in_the_shipped_table(monkeypatch):
    """Session 32's rows, fp32 reads (and dual states, routed as their fp32 high copy): head dims
    that are a multiple of 32 (Super's 64) take the every-step route to batch 2 and buffer above;
    others (Nano's 80) the deferred route (period 2) to batch ROUTE_BATCH[4] = 4, their dual
    states the every-step route to batch 2. bf16 reads: the every-step route to batch 16; fp8
    reads buffer. With SMALL_BATCH_ROUTE off every step buffers."""
    from replayssm.triton import mamba2 as tk
    period = lambda P, b, rb=4, dual=False: tk.route_period(P, rb, b, 128, 16, dual)    # noqa: E731
    assert [period(64, b) for b in (1, 2, 3, 4, 5)] == [1, 1, 0, 0, 0]
    assert [period(80, b) for b in (1, 2, 3, 4, 5)] == [2, 2, 2, 2, 0]
    assert [period(12, b) for b in (1, 4, 5)] == [2, 2, 0]
    for P in (64, 80):
        assert [period(P, b, 2, True) for b in (1, 2, 3)] == [1, 1, 0]       # dual bf16: the high copy's route
        assert [period(P, b, 1, True) for b in (1, 2, 3)] == [1, 1, 0]       # dual fp8
        assert [period(P, b, 2) for b in (1, 16, 17)] == [1, 1, 0]           # bf16 state
        assert period(P, 1, 1) == 0                                          # fp8 reads
    assert tk.route_period(80, 4, 1, 128, 1) == 1      # the period is at most the flush period
    monkeypatch.setattr(tk, "SMALL_BATCH_ROUTE", False)
    assert period(64, 1) == period(80, 1) == 0


@pytest.mark.shipped_routes
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode,lo", [("replay", None), ("dual", "bfloat16")])
@pytest.mark.parametrize("batch", [1, 4])
def test_small_batches_route_by_default(device, mode, lo, batch):
    """The shipped table at batch 1 and 4 (a head dim of 12: the rows of Nano's 80), over 7 steps
    from random cursors (pending entries folded first): the route the table picks (fp32: the
    deferred route, period 2; dual: the every-step route at batch 1, buffered at 4) agrees with
    the reference's route semantics on outputs, checkpoints, cursor counts and bytes."""
    from replayssm.triton import mamba2 as tk
    shape = I.Mamba2Shape(nheads=4, head_dim=12, d_state=16, n_groups=2)
    g = gen(53 + batch)
    K = 4
    rs, rr = make_pair(shape, 7, 6, K, mode, "float32", lo, torch.bfloat16, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    p = params(shape, g)
    idx = torch.tensor(IDX4[:batch] if batch < 4 else IDX4, dtype=torch.int32, device=device)
    want = {("replay", 1): 2, ("replay", 4): 2, ("dual", 1): 1, ("dual", 4): 0}[(mode, batch)]
    for step in range(7):
        inp = step_inputs(shape, batch, torch.bfloat16, g)
        route = tk.state_route_period(rs, inp["x"])
        assert route == want
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


# ----------------------------------------------------------------------------- flush, verify, commit
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("mode,lo", [("replay", None), ("dual", "float8_e4m3")])
def test_flush(device, mode, lo):
    g = gen(50)
    rs, rr = make_pair(TINY, 7, 5, 4, mode, "float32", lo, torch.float32, g, cursor_lo=0)
    rs.cursor[2] = rr.cursor[2] = 0                       # a slot with nothing to fold
    A = params(TINY, g)["A"]
    slots = torch.tensor([2, -1, 5, 0], dtype=torch.int32, device=device)
    M.flush(rs, A, slots)
    R.mamba2_flush(rr, A, slots[slots >= 0].long())
    state_check(rs, rr, "flush(slots)")
    if low_precision(rs):
        resync(rs, rr)
    M.flush(rs, A)
    R.mamba2_flush(rr, A)
    state_check(rs, rr, "flush(all)")
    assert (rs.cursor == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lo", ["bfloat16", "float8_e4m3"])
def test_dual_route_low_copy_refreshed_where_needed(device, lo, monkeypatch):
    """LO_STALE end to end: after eager-route steps (high copy only), a verify refreshes the low
    copy before reading it (and clears the bit, in a second launch), a flush
    refreshes it, and a buffered step flushes stale rows (fused with the ticket, fused with the
    cursor pass, split with the cursor pass); the reference agrees after every op."""
    from replayssm.triton import mamba2 as tk
    T, K, slots, batch = 2, 3, 6, 4
    g = gen(66)
    rs, rr = make_pair(TINY, slots, K + T, K, "dual", "float32", lo, torch.bfloat16, g)
    p = params(TINY, g)
    idx = torch.tensor(IDX4, dtype=torch.int32, device=device)
    live = idx[idx >= 0].long()

    def route_step(tag):
        monkeypatch.setitem(tk.OVERRIDE, "replay", dict(route="eager", block_p=4, warps=1))
        inp = step_inputs(TINY, batch, torch.bfloat16, g)
        y = M.replay_step(rs, **inp, **p, state_indices=idx)
        assert rel_err(y, R.mamba2_replay_step(rr, **inp, **p, state_indices=idx, route=True)) <= \
            out_tol(torch.bfloat16), tag
        state_check(rs, rr, tag)
        assert rs.lo_stale(live).all() and rs.routed
        resync(rs, rr)
        monkeypatch.setitem(tk.OVERRIDE, "replay", {})

    for rnd in range(3):
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
        M.commit(rs, p["A"], acc, state_indices=idx)
        R.mamba2_commit(rr, p["A"], acc, state_indices=idx)
        assert not rs.lo_stale().any()
        state_check(rs, rr, f"commit {rnd}")
        resync(rs, rr)
    route_step("route before flush")
    M.flush(rs, p["A"])
    R.mamba2_flush(rr, p["A"])
    assert not rs.lo_stale().any() and (rs.entries() == 0).all()
    state_check(rs, rr, "flush")
    resync(rs, rr)
    for name, v in (("fused-ticket", {}), ("fused-pass", dict(ticket=False)),
                    ("split-pass", dict(route="split", ticket=False))):
        route_step(f"route before {name}")
        monkeypatch.setitem(tk.OVERRIDE, "replay", v)
        inp = step_inputs(TINY, batch, torch.bfloat16, g)
        y = M.replay_step(rs, **inp, **p, state_indices=idx)
        assert rel_err(y, R.mamba2_replay_step(rr, **inp, **p, state_indices=idx)) <= out_tol(torch.bfloat16), name
        assert not rs.lo_stale().any() and (rs.entries(live) == 0).all(), f"{name}: stale rows flushed"
        state_check(rs, rr, name)
        resync(rs, rr)


SPEC_CASES = [
    # id                 mode          state      lo             act             T
    ("replay-f32",       "replay",     "float32", None,          torch.float32,  3),
    ("replay-f32-bf16y", "replay",     "float32", None,          torch.bfloat16, 4),   # bf16x2 state product
    ("dual-fp8",         "dual",       "float32", "float8_e4m3", torch.float32,  2),
    ("shared-low-bf16",  "shared-low", "float32", "bfloat16",    torch.bfloat16, 2),
]


def test_verify_state_precision():
    """The verify's state x C product: a two-pass bf16 split for fp32 states feeding 16-bit
    outputs when C is exact in bf16 (three passes when it is fp16), tl.dot's fp32 precision
    for fp32 outputs, plain bf16 MMAs for 16-bit read copies."""
    from replayssm.triton import mamba2 as tk
    f32, bf16, f16, fp8 = torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn
    assert tk._verify_state_precision(f32, bf16, bf16) == "bf16x2"
    assert tk._verify_state_precision(f32, bf16, f16) == "bf16x2"
    assert tk._verify_state_precision(f32, f16, f16) == "bf16x3"
    assert tk._verify_state_precision(f32, f32, f32) == tk.VERIFY_F32_PRECISION
    assert tk._verify_state_precision(f32, bf16, f32) == tk.VERIFY_F32_PRECISION
    assert tk._verify_state_precision(bf16, bf16, bf16) == "bf16"
    assert tk._verify_state_precision(fp8, bf16, bf16) == "bf16"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_verify_commit(device, case):
    """verify T drafts -> commit a random accepted count (device tensor), interleaved with
    plain steps; the commit's flush decision is made on the device."""
    verify_commit_cycles(device, TINY, *case)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", SPEC_CASES + [("late-f32", "replay", "float32", None, torch.float32, 3)],
                         ids=[c[0] for c in SPEC_CASES] + ["late-f32"])
def test_verify_gram_prepass(device, case, monkeypatch):
    """The verify with its Gram matrices from _verify_gram_kernel (PRE_GRAM, a launch ahead of
    it) instead of its own MMAs, early or late buffer loads: the same cycles against the
    reference (padded rows, buffer rows past the cursor holding old entries)."""
    from replayssm.triton import mamba2 as tk
    monkeypatch.setitem(tk.OVERRIDE, "verify", dict(gram=True, early_buf=case[0] != "late-f32"))
    verify_commit_cycles(device, TINY, *case)
    rs, _ = make_pair(TINY, 7, 7, 3, "replay", "float32", None, torch.bfloat16, gen(65))
    inp = step_inputs(TINY, 4, torch.bfloat16, gen(66), T=3)
    first, second = tk.plan_verify(rs, **inp, **params(TINY, gen(67)))[0]
    assert (first.kernel, second.kernel, second.meta["PRE_GRAM"]) == (tk._verify_gram_kernel, tk._verify_kernel, True)


def test_verify_gram_rows(monkeypatch):
    """Where the verify runs its Gram pre-pass by default: fp32 read copies whose heads are
    tiled without a tail (Super's 64-row heads; not Nano's 64 + 16), from batch x heads
    VERIFY_PRE_GRAM_MIN_BH (Super b128); never for a dual state's 16-bit read copy; the
    module flag and a tuning override win."""
    from replayssm.state import Mamba2ReplayState
    from replayssm.triton import mamba2 as tk

    def kernels(P, H, batch, mode="replay", lo=None):
        rs = Mamba2ReplayState.allocate(2, H, P, 128, 8, 20, 16, mode=mode, lo_dtype=lo, device="meta")
        inp = I.mamba2_step_inputs(I.Mamba2Shape(H, P, 128, 8), batch, T=4, act_dtype=torch.bfloat16, device="meta")
        prm = I.mamba2_params(I.Mamba2Shape(H, P, 128, 8), device="meta")
        return [launch.kernel for launch in tk.plan_verify(rs, **inp, **prm)[0]]

    gram = [tk._verify_gram_kernel, tk._verify_kernel]
    assert kernels(64, 128, 128) == gram and kernels(64, 128, 96) == [tk._verify_kernel]
    assert kernels(80, 96, 256) == [tk._verify_kernel]
    assert kernels(64, 128, 256, "dual", "bfloat16") == [tk._verify_kernel]
    monkeypatch.setattr(tk, "VERIFY_PRE_GRAM", True)
    assert kernels(80, 96, 8) == [tk._verify_gram_kernel, tk._verify_kernel]
    monkeypatch.setitem(tk.OVERRIDE, "verify", {"gram": False})
    assert kernels(64, 128, 256) == [tk._verify_kernel]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("listed,rounds", [(True, 40), (False, 12)], ids=["list", "per-row"])
def test_commit_routes_long_horizon(device, listed, rounds, monkeypatch):
    """Rounds of verify + commit with random accepts 0..T per row over random row subsets
    (padded rows too) through the commit's two routes: the folding rows listed and folded by
    NW workers per head (COMMIT_LIST, the default; 40 rounds) and one fold program per row (12).
    Outputs, cursors and checkpoints stay the reference's; many folds, several in one commit."""
    from replayssm.triton import mamba2 as tk
    monkeypatch.setitem(tk.OVERRIDE, "fold", {"list": listed})
    T, K, slots, batch = 3, 4, 9, 6
    g = gen(64)
    rs, rr = make_pair(TINY, slots, K + T, K, "replay", "float32", None, torch.bfloat16, g)
    p = params(TINY, g)
    folds = multi = 0
    for rnd in range(rounds):
        idx = torch.randperm(slots, generator=g)[:batch].to(torch.int32)
        idx[torch.rand(batch, generator=g) < 0.2] = -1
        idx = idx.to(device)
        inp = step_inputs(TINY, batch, torch.bfloat16, g, T=T)
        y = M.verify(rs, **inp, **p, state_indices=idx, out=poisoned(inp["x"]))
        assert rel_err(y, R.mamba2_verify(rr, **inp, **p, state_indices=idx)) <= out_tol(torch.bfloat16), rnd
        acc = torch.randint(0, T + 1, (batch,), generator=g).to(device=device, dtype=torch.int32)
        live = idx >= 0
        n = int((rr.cursor[idx[live].long()] + acc[live] >= K).sum())
        folds, multi = folds + n, multi + (n > 1)
        assert (tk.plan_commit(rs, p["A"], acc, idx)[0].kernel is tk._commit_list_kernel) == listed
        M.commit(rs, p["A"], acc, state_indices=idx)
        R.mamba2_commit(rr, p["A"], acc, state_indices=idx)
        state_check(rs, rr, f"round {rnd}")
    assert folds >= rounds * 3 // 4 and multi >= rounds // 8, (folds, multi)


def test_verify_tma_plan():
    """The verify reads fp32 checkpoints through TMA descriptors in the large bucket (VERIFY_TMA):
    the read copy as [rows, N] with the main tile's and the tail's blocks (Nano: 64 + 16 rows);
    bf16 read copies (dual) and small batches load by pointers."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    from replayssm.state import Mamba2ReplayState
    from replayssm.triton import mamba2 as tk
    H, P, N, G, K, T = 96, 80, 128, 8, 16, 4
    sh = I.Mamba2Shape(H, P, N, G)
    p = {k: v.to("meta") for k, v in I.mamba2_params(sh).items()}
    for batch, mode, lo, tma in ((128, "replay", None, True), (128, "dual", "bfloat16", False),
                                 (8, "replay", None, False)):
        rs = Mamba2ReplayState.allocate(batch, H, P, N, G, K + T, K, mode, "float32", lo, torch.bfloat16, "meta")
        inp = {k: v.to("meta") for k, v in I.mamba2_step_inputs(sh, batch, T=T, act_dtype=torch.bfloat16).items()}
        (la,), _ = tk.plan_verify(rs, **inp, **p)
        assert la.meta["TMA"] == tma, (batch, mode)
        descs = [a for a in la.args if isinstance(a, TensorDescriptor)]
        if tma:
            assert [list(d.shape) for d in descs] == [[batch * H * P, N]] * 2
            assert [list(d.block_shape) for d in descs] == [[64, 32], [16, 32]]
        else:
            assert not descs


def test_commit_list_plan():
    """The listed commit's launches up to COMMIT_LIST_MAX (128) rows: one list program over the
    batch, then the fold with NW = cdiv(rows * T, K) workers per head tile (T = capacity - K),
    NT rank slots each, both programmatic dependent launches; above it the per-row fold and the
    cursor pass."""
    from replayssm.state import Mamba2ReplayState
    from replayssm.triton import mamba2 as tk
    H, P, N, G, K, T = 96, 80, 128, 8, 16, 4
    for batch, nw in ((128, 32), (100, 25), (3, 1), (256, None)):
        rs = Mamba2ReplayState.allocate(batch, H, P, N, G, K + T, K, "replay", "float32", None, torch.bfloat16,
                                        "meta")
        acc = torch.empty(batch, dtype=torch.int32, device="meta")
        first, second = tk.plan_commit(rs, torch.empty(H, device="meta"), acc)
        if nw is None:
            assert (first.kernel, second.kernel, first.grid[2]) == (tk._fold_kernel, tk._cursor_kernel, batch)
            continue
        assert first.kernel is tk._commit_list_kernel and first.grid == (1,)
        assert second.grid[1:] == (H, nw) and second.meta["LIST"] and second.meta["NT"] == -(-batch // nw), batch
        # both programmatic dependent launches (PDL; 'meta' plans stand for the H200)
        assert all(p.meta["GDC"] and p.meta["launch_pdl"] for p in (first, second))


# head dim 20 in a 16-row tile and a 16-row tail (12 rows masked), state columns in two 16-column steps
TAILED = I.Mamba2Shape(nheads=4, head_dim=20, d_state=24, n_groups=2)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("tma", [False, True], ids=["loads", "tma"])
def test_verify_tail_tile(device, tma, monkeypatch):
    """A whole head per program as a BLOCK_P tile plus a tail tile (Nano's 80 rows = 64 + 16):
    the plan's tiles, then verify + commit cycles against the reference; the state chunks by
    pointer loads or through TMA descriptors (the tail's rows 20-31 then read the next head's)."""
    from replayssm.triton import mamba2 as tk
    monkeypatch.setitem(tk.OVERRIDE, "verify", dict(block_p=16, whole=True, chunk_n=16, tma=tma))
    rs, _ = make_pair(TAILED, 7, 7, 3, "replay", "float32", None, torch.bfloat16, gen(61))
    inp = step_inputs(TAILED, 4, torch.bfloat16, gen(62), T=4)
    (launch,), _ = tk.plan_verify(rs, **inp, **params(TAILED, gen(63)))
    assert launch.grid == (1, TAILED.nheads, 4) and launch.meta["TAIL_P"] == 16
    verify_commit_cycles(device, TAILED, "tail-f32-bf16y", "replay", "float32", None, torch.bfloat16, 4)
    verify_commit_cycles(device, TAILED, "tail-dual-bf16", "dual", "float32", "bfloat16", torch.bfloat16, 3)


def verify_commit_cycles(device, shape, name, mode, sd, lo, act, T):
    """Three rounds of verify T drafts -> commit random accepted counts, a plain step between
    the first two, each checked against the reference (outputs, drafts in the buffer, state)."""
    K, L = 3, 3 + T
    g = gen(60)
    rs, rr = make_pair(shape, 7, L, K, mode, sd, lo, act, g)
    p = params(shape, g)
    idx = torch.tensor(IDX4, dtype=torch.int32, device=device)
    for cycle in range(3):
        if cycle == 1:   # a plain step between speculative rounds
            run_steps(rs, rr, shape, idx, 1, act, g, what=f"{name} plain")
        inp = step_inputs(shape, 4, act, g, T=T)
        out = poisoned(inp["x"])
        y = M.verify(rs, **inp, **p, state_indices=idx, out=out)
        yr = R.mamba2_verify(rr, **inp, **p, state_indices=idx)
        assert rel_err(y, yr) <= out_tol(act), f"{name} cycle {cycle}: y"
        assert (y[1] == 0).all()
        # drafts are in the buffer at cursor..cursor+T-1
        for b, s in enumerate(IDX4):
            if s >= 0:
                n = int(rr.cursor[s])
                assert torch.equal(rs.x[s, n:n + T], rr.x[s, n:n + T])
                assert torch.equal(rs.B[s, n:n + T], rr.B[s, n:n + T])
        acc = torch.randint(0, T + 1, (4,), generator=g).to(device=device, dtype=torch.int32)
        M.commit(rs, p["A"], acc, state_indices=idx)
        R.mamba2_commit(rr, p["A"], acc, state_indices=idx)
        state_check(rs, rr, f"{name} cycle {cycle}: commit")
        if low_precision(rs):
            resync(rs, rr)


# ----------------------------------------------------------------------------- CUDA only
MODEL_DIMS = {   # MODELS.md
    "nemotron-3-nano-4b": I.Mamba2Shape(nheads=96, head_dim=80, d_state=128, n_groups=8),
    "nemotron-3-super-120b": I.Mamba2Shape(nheads=128, head_dim=64, d_state=128, n_groups=8),
}
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (real dims, CUDA graphs)")


@cuda_only
@pytest.mark.parametrize("model", list(MODEL_DIMS))
@pytest.mark.parametrize("batch", [1, 3, 64, 512])
def test_real_dims_cuda(model, batch):
    shape = MODEL_DIMS[model]
    H, P, N = shape.nheads, shape.head_dim, shape.d_state
    g = gen(70)
    p = params(shape, g)
    idx = torch.randperm(batch + 2, generator=g)[:batch].to(device=DEV, dtype=torch.int32)
    if batch > 2:
        idx[1] = -1
    for sd, act in (("float32", torch.bfloat16), ("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        st = I.random_state(batch + 2, H, P, N, dtype=dtype_of(sd), device=DEV, gen=g)
        sr = st.clone()
        inp = step_inputs(shape, batch, act, g)
        y = M.eager_step(st, **inp, **p, state_indices=idx, out=poisoned(inp["x"]))
        yr = R.mamba2_eager_step(sr, **inp, **p, state_indices=idx)
        assert rel_err(y, yr) <= out_tol(act), f"eager {sd} {act}"
    # bf16 activations too: the launch table's 16-bit rows (register budgets included) are the
    # ones bf16 buffers take (fp32 buffers run at least 2 warps, see plan_replay_step)
    f32, bf16 = torch.float32, torch.bfloat16
    for mode, sd, lo, act in (("replay", "float32", None, f32), ("dual", "float32", "float8_e4m3", f32),
                              ("dual", "float32", "bfloat16", f32), ("replay", "bfloat16", None, bf16),
                              ("dual", "float32", "bfloat16", bf16)):
        rs, rr = make_pair(shape, batch + 2, 16, 8, mode, sd, lo, act, g)
        run_steps(rs, rr, shape, idx, 9, act, g, what=f"{model} b{batch} {mode} {sd} {lo} {act}")


def _graph(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()            # compile + warm up outside the capture (on scratch state)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    return g


def _graph_replay_steps(mode, lo, batch, steps, seed):
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
    graph = _graph(lambda: M.replay_step(scratch, **static, **p, state_indices=idx, out=out))
    with torch.cuda.graph(graph):
        M.replay_step(rs, **static, **p, state_indices=idx, out=out)
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
    """Large batches at Nano's dims, where the shipped table runs the B_i . C pre-pass
    (_buffer_bc_kernel, the step its programmatic dependent) and a separate cursor launch:
    three launches captured, replayed 40 steps (5 flushes per sequence)."""
    from replayssm.triton import mamba2 as tk
    shape = MODEL_DIMS["nemotron-3-nano-4b"]
    read = 1 if lo == "float8_e4m3" else 2 if lo else 4
    batch = 256 if read == 1 else 160       # fp8 copies take the pre-pass from batch x heads 24576
    assert tk.replay_variant(shape.head_dim, read, batch, shape.nheads, dual=mode == "dual")["bc"]
    _graph_replay_steps(mode, lo, batch, 40, 81)


@cuda_only
@pytest.mark.parametrize("mode,lo", [("replay", None), ("dual", "bfloat16"), ("shared-low", "bfloat16")])
def test_cuda_graph_replay_coef_prepass(mode, lo, monkeypatch):
    """The coef knob at Nano's dims, batch 160: every per-head term of the output path and the
    dt / B appends in the pre-pass (_buffer_bc_kernel's COEF, the step's PRE_COEF), captured
    with the step and the cursor launch and replayed 40 steps (5 flushes per sequence)."""
    from replayssm.triton import mamba2 as tk
    monkeypatch.setitem(tk.OVERRIDE, "replay", {"coef": True})
    shape = MODEL_DIMS["nemotron-3-nano-4b"]
    v = tk.replay_variant(shape.head_dim, 2 if lo else 4, 160, shape.nheads, dual=mode == "dual")
    assert v["coef"] and not v["ticket"]
    _graph_replay_steps(mode, lo, 160, 40, 83)


@cuda_only
@pytest.mark.shipped_routes
def test_cuda_graph_dual_route_and_buffered_steps():
    """A dual bf16 state at Nano's dims driven by two captured steps over overlapping slots: the
    shipped eager route at batch 2 (high copy only, low copy marked stale) and the buffered step
    at batch 24 (the large bucket's lean kernel and cursor pass), replayed 64 times in a random
    order: the buffered step flushes the rows the route left stale, all on the device. Checked
    against the reference's route semantics after every replay."""
    from replayssm.triton import mamba2 as tk
    shape = MODEL_DIMS["nemotron-3-nano-4b"]
    K, L, slots = 8, 8, 28
    g = gen(82)
    p = params(shape, g)
    rs, rr = make_pair(shape, slots, L, K, "dual", "float32", "bfloat16", torch.float32, g)
    perm = torch.randperm(slots, generator=g).to(device=DEV, dtype=torch.int32)
    idx = {2: perm[:2].clone(), 24: perm[:24].clone()}       # the small batch's slots are in the large one
    idx[24][5] = -1
    assert tk.state_takes_eager_route(rs, torch.empty(2, shape.nheads, shape.head_dim))
    assert not tk.state_takes_eager_route(rs, torch.empty(24, shape.nheads, shape.head_dim))
    static = {b: step_inputs(shape, b, torch.float32, g) for b in idx}
    out = {b: torch.empty_like(static[b]["x"]) for b in idx}
    graphs = {}
    for b in idx:
        scratch = copy.deepcopy(rs)
        graphs[b] = _graph(lambda: M.replay_step(scratch, **static[b], **p, state_indices=idx[b], out=out[b]))
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


@cuda_only
def test_cuda_graph_eager():
    shape = MODEL_DIMS["nemotron-3-nano-4b"]
    batch = 16
    g = gen(81)
    p = params(shape, g)
    st = I.random_state(batch, shape.nheads, shape.head_dim, shape.d_state, device=DEV, gen=g)
    sr = st.clone()
    static = step_inputs(shape, batch, torch.float32, g)
    out = torch.empty_like(static["x"])
    scratch = st.clone()
    graph = _graph(lambda: M.eager_step(scratch, **static, **p, out=out))
    with torch.cuda.graph(graph):
        M.eager_step(st, **static, **p, out=out)
    for t in range(64):
        new = step_inputs(shape, batch, torch.float32, g)
        for k, v in new.items():
            static[k].copy_(v)
        graph.replay()
        yr = R.mamba2_eager_step(sr, **new, **p)
        assert rel_err(out, yr) <= TOL_F32 and rel_err(st, sr) <= TOL_F32, f"graph step {t}"


@cuda_only
@pytest.mark.parametrize("model,batch,mode,lo,act", [
    ("nemotron-3-super-120b", 16, "dual", "float8_e4m3", torch.float32),
    # Nano's whole-head verify (64 + 16 rows) with the bf16x2 state product: the large bucket
    ("nemotron-3-nano-4b", 24, "replay", None, torch.bfloat16),
    # Super fp32 at batch 128: the Gram pre-pass ahead of the verify (VERIFY_PRE_GRAM's rule)
    ("nemotron-3-super-120b", 128, "replay", None, torch.bfloat16)],
    ids=["super-dual-fp8", "nano-f32-bf16y", "super-f32-gram"])
def test_cuda_graph_spec(model, batch, mode, lo, act):
    """verify + commit captured together (accepted counts from a device tensor), 64 rounds."""
    shape = MODEL_DIMS[model]
    T, K, L = 3, 8, 11
    g = gen(82)
    p = params(shape, g)
    rs, rr = make_pair(shape, batch, L, K, mode, "float32", lo, act, g)
    idx = torch.arange(batch, device=DEV, dtype=torch.int32)
    static = step_inputs(shape, batch, act, g, T=T)
    acc = torch.zeros(batch, dtype=torch.int32, device=DEV)
    out = torch.empty_like(static["x"])
    scratch = copy.deepcopy(rs)

    def round_(r):
        M.verify(r, **static, **p, state_indices=idx, out=out)
        M.commit(r, p["A"], acc, state_indices=idx)

    graph = _graph(lambda: round_(scratch))
    with torch.cuda.graph(graph):
        round_(rs)
    for t in range(64):
        new = step_inputs(shape, batch, act, g, T=T)
        for k, v in new.items():
            static[k].copy_(v)
        acc.copy_(torch.randint(0, T + 1, (batch,), generator=g).to(torch.int32))
        graph.replay()
        yr = R.mamba2_verify(rr, **new, **p, state_indices=idx)
        R.mamba2_commit(rr, p["A"], acc, state_indices=idx)
        assert rel_err(out, yr) <= out_tol(act), f"spec round {t}"
        state_check(rs, rr, f"spec round {t}")
        resync(rs, rr)


# ----------------------------------------------------------------------------- sm_90 compile (no GPU needed)
_OFFLINE = r"""
import json, os
os.environ.pop("TRITON_INTERPRET", None)
import torch
from replayssm import inputs as I
from replayssm.state import Mamba2ReplayState
from replayssm.triton import mamba2 as tk

sh, dev, b = I.Mamba2Shape(96, 80, 128, 8), "meta", 256     # Nemotron-3-Nano-4B, large bucket
p = {k: v.to(dev) for k, v in I.mamba2_params(sh).items()}
inp = lambda act, T=None: {k: v.to(dev) for k, v in I.mamba2_step_inputs(sh, b, T=T, act_dtype=act).items()}
idx = torch.zeros(b, dtype=torch.int32, device=dev)
acc = torch.zeros(b, dtype=torch.int32, device=dev)
st = lambda dt: torch.zeros(b, 96, 80, 128, dtype=dt, device=dev)
rs = lambda mode, lo=None, act=torch.bfloat16, K=16, L=16, sd="float32": Mamba2ReplayState.allocate(
    b, 96, 80, 128, 8, L, K, mode=mode, state_dtype=sd, lo_dtype=lo, act_dtype=act, device=dev)
plans = {
    "eager fp32": tk.plan_eager_step(st(torch.float32), **inp(torch.bfloat16), **p, state_indices=idx)[0],
    "eager bf16": tk.plan_eager_step(st(torch.bfloat16), **inp(torch.bfloat16), **p, state_indices=idx)[0],
    "replay fp32": tk.plan_replay_step(rs("replay"), **inp(torch.bfloat16), **p, state_indices=idx)[0],
    "replay dual fp8": tk.plan_replay_step(rs("dual", "float8_e4m3"), **inp(torch.bfloat16), **p,
                                           state_indices=idx)[0],
    "replay dual bf16": tk.plan_replay_step(rs("dual", "bfloat16"), **inp(torch.bfloat16), **p, state_indices=idx)[0],
    "replay bf16": tk.plan_replay_step(rs("replay", sd="bfloat16"), **inp(torch.bfloat16), **p, state_indices=idx)[0],
    "replay fp32 acts (tf32x3)": tk.plan_replay_step(rs("replay", act=torch.float32), **inp(torch.float32), **p,
                                                     state_indices=idx, advance=False)[0],
    "commit dual bf16": tk.plan_commit(rs("dual", "bfloat16", K=16, L=20), p["A"], acc, idx),
    # batch 128: the listed commit, both launches programmatic dependents (PDL)
    "commit fp32 b128 listed": tk.plan_commit(rs("replay", K=16, L=20), p["A"], acc[:128], idx[:128]),
    "verify T4 fp32 (64 + 16 rows)": tk.plan_verify(rs("replay", K=16, L=20), **inp(torch.bfloat16, T=4), **p,
                                                     state_indices=idx)[0],
    "verify T4 dual bf16 (64 + 16 rows)": tk.plan_verify(rs("dual", "bfloat16", K=16, L=20),
                                                         **inp(torch.bfloat16, T=4), **p, state_indices=idx)[0],
    "verify T4 dual fp8": tk.plan_verify(rs("dual", "float8_e4m3", K=16, L=20), **inp(torch.bfloat16, T=4), **p,
                                         state_indices=idx)[0],
}
plans["refresh lo dual fp8"] = tk.plan_refresh_lo(rs("dual", "float8_e4m3"), idx, b)   # a routed dual state's verify
# batch 4: the shipped small-batch routes (fp32: the deferred route, 8 x 1, period 2; dual: every step at batch 2)
plans["replay fp32 b4 deferred route"] = tk.plan_replay_step(rs("replay"), **{k: v[:4] for k, v in inp(
    torch.bfloat16).items()}, **p, state_indices=idx[:4])[0]
plans["replay dual bf16 b2 route"] = tk.plan_replay_step(rs("dual", "bfloat16"), **{k: v[:2] for k, v in inp(
    torch.bfloat16).items()}, **p, state_indices=idx[:2])[0]
tk.OVERRIDE["verify"] = dict(gram=True)     # the verify's Gram pre-pass (opt-in, session 19)
plans["verify T4 fp32 gram"] = tk.plan_verify(rs("replay", K=16, L=20), **inp(torch.bfloat16, T=4), **p,
                                              state_indices=idx)[0]
plans["verify T4 dual bf16 gram"] = tk.plan_verify(rs("dual", "bfloat16", K=16, L=20), **inp(torch.bfloat16, T=4),
                                                   **p, state_indices=idx)[0]
tk.OVERRIDE.clear()
# Nemotron-3-Super-120B (64-row heads: whole-head programs)
sh = I.Mamba2Shape(128, 64, 128, 8)
p = {k: v.to(dev) for k, v in I.mamba2_params(sh).items()}
rs2 = lambda mode, lo=None, sd="float32": Mamba2ReplayState.allocate(b, 128, 64, 128, 8, 16, 16, mode=mode,
                                                                     state_dtype=sd, lo_dtype=lo,
                                                                     act_dtype=torch.bfloat16, device=dev)
plans["super replay fp32"] = tk.plan_replay_step(rs2("replay"), **inp(torch.bfloat16), **p, state_indices=idx)[0]
plans["super replay dual bf16"] = tk.plan_replay_step(rs2("dual", "bfloat16"), **inp(torch.bfloat16), **p,
                                                      state_indices=idx)[0]
plans["super replay bf16"] = tk.plan_replay_step(rs2("replay", sd="bfloat16"), **inp(torch.bfloat16), **p,
                                                 state_indices=idx)[0]
plans["super eager bf16"] = tk.plan_eager_step(torch.zeros(b, 128, 64, 128, dtype=torch.bfloat16, device=dev),
                                               **inp(torch.bfloat16), **p, state_indices=idx)[0]
tk.OVERRIDE["replay"] = dict(route="eager", block_p=32, warps=4)     # the small-batch eager route (opt-in)
plans["super replay eager route fp32"] = tk.plan_replay_step(rs2("replay"), **inp(torch.bfloat16), **p,
                                                             state_indices=idx)[0]
plans["super replay eager route dual bf16"] = tk.plan_replay_step(rs2("dual", "bfloat16"), **inp(torch.bfloat16),
                                                                  **p, state_indices=idx)[0]
tk.OVERRIDE["replay"] = dict(tk._LEAN, pf=1)     # the lean step with the state tile's L2 hint (tuning)
plans["super replay fp32 pf1"] = tk.plan_replay_step(rs2("replay"), **inp(torch.bfloat16), **p, state_indices=idx)[0]
plans["super replay dual bf16 pf1"] = tk.plan_replay_step(rs2("dual", "bfloat16"), **inp(torch.bfloat16), **p,
                                                          state_indices=idx)[0]
tk.OVERRIDE.clear()
out = {}
for name, launches in plans.items():
    for launch in launches:
        r = tk.compile_offline(launch)
        r["warps"] = launch.meta["num_warps"]
        out[f"{name}: {launch.kernel.__name__}"] = r
print(json.dumps(out))
"""


# Launches timed fastest as they compile, spills included (bytes of spill stores / loads allowed).
# Nano's dual bf16 whole-head verify: ptxas holds it to 128 registers with a 12-byte spill
# (8 programs per SM); under a 160-register budget it compiles without one (6 per SM). Measured
# as shipped: 364 us round vs 453-497 for the spill-free tiles at b256
# (results/device-logs-20261130-s11/tune_spec_s11g.txt); 194.5 vs 218.2 us under the 160 budget
# at b128 (device-logs-20261130-s12/tune_spec_s12a.txt).
# Nano's dual fp8 replay step, 32 rows x 1 warp (row-scaled copies fold whole rows): 255 registers
# and a 72-byte spill; timed as compiled, 279.5 / 285.9 us at b256 vs 344.2 / 349.7 for the
# spill-free 16-row step (results/device-logs-20261201-s19/tune_mamba2_s19c.txt, _s19b.txt).
# Super's dual bf16 step from batch x heads 16384 (32 rows x 1 warp): a 96-register budget, 96
# spilled bytes, all in the flushing programs' fold; 213.3 vs 219.7 us at b256 without the budget
# (results/device-logs-20261203-s34/tune_mamba2_s34a.txt).
# Nano's, 16 rows x 1 warp from 6144: a 72-register budget, 4 bytes spilled in the fold; 206.5 vs
# 217.1 us at b256 without it (_s34b).
# Super's bf16 state step from batch x heads 24576 (32 rows x 1 warp): a 72-register budget, 8
# bytes spilled; 178.8-179.0 vs 195.8-196.1 us at b256 without it (device-logs-20261203-s35/
# tune_mamba2_s35a.txt); Nano's from batch 256 too (8 bytes; _s35e: 180.4-181.0 vs 186.9-190.7 us in
# 16-row programs, which spill nothing under their 64). Since session 36 (coef: the flushing
# programs compute the per-head terms the output route takes from the pre-pass) 16 bytes each; the
# output route alone (compiled as the split route's first launch) spills none; 173.9-174.2 vs
# 178.5-178.6 us at Super b256, 170.0-170.5 vs 178.8-179.6 at Nano (device-logs-20261203-s36/
# tune_mamba2_s36b.txt).
SPILL_ALLOWED = {"verify T4 dual bf16 (64 + 16 rows)": 12, "replay dual fp8": 72, "super replay dual bf16": 96,
                 "replay dual bf16": 4, "super replay bf16": 16, "replay bf16": 16}


def _offline_json(script: str) -> dict:
    """Run an offline sm_90 compile script (Triton's LLVM + bundled ptxas, no GPU) in a process
    of its own, without TRITON_INTERPRET; its last stdout line, as JSON. Skips where Triton
    has no bundled ptxas."""
    import json
    import os
    import subprocess
    import sys

    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("Triton's bundled ptxas is not available")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_compiles_for_sm90():
    """Every kernel compiles for sm_90 at real dims (Triton's LLVM + bundled ptxas, no GPU)
    with the launch table's configs: no register spills (but those of SPILL_ALLOWED), and at
    least 4 programs fit on an SM (65536 registers, 2048 threads), which the tuned configs were
    measured with."""
    report = _offline_json(_OFFLINE)
    for name, r in report.items():
        allowed = SPILL_ALLOWED.get(name.split(":")[0], 0)
        assert r["spill_stores"] <= allowed and r["spill_loads"] <= allowed, f"{name} spills: {r}"
        assert r["regs"] is not None, name
        threads = 32 * r["warps"]
        assert min(2048 // threads, 65536 // (threads * r["regs"])) >= 4, f"{name}: {r}"


_OFFLINE_FOLD_WAIT = r"""
import json, os
os.environ.pop("TRITON_INTERPRET", None)
import torch
from replayssm import inputs as I
from replayssm.state import Mamba2ReplayState
from replayssm.triton import mamba2 as tk

sh, dev, b = I.Mamba2Shape(128, 64, 128, 8), "meta", 256     # Nemotron-3-Super-120B, a coef row
p = {k: v.to(dev) for k, v in I.mamba2_params(sh).items()}
inp = {k: v.to(dev) for k, v in I.mamba2_step_inputs(sh, b, act_dtype=torch.bfloat16).items()}
idx = torch.zeros(b, dtype=torch.int32, device=dev)
out = {}
for wait in (True, False):
    tk.OVERRIDE["replay"] = dict(fold_wait=wait)
    rs = Mamba2ReplayState.allocate(b, 128, 64, 128, 8, 16, 16, mode="dual", lo_dtype="bfloat16",
                                    act_dtype=torch.bfloat16, device=dev)
    step = [ln for ln in tk.plan_replay_step(rs, **inp, **p, state_indices=idx)[0]
            if ln.kernel is tk._replay_step_kernel][0]
    assert step.meta["PRE_COEF"] and step.meta["GDC"], step.meta
    out[str(wait)] = tk.compile_offline(step, asm=True)["asm"]["ptx"].count("griddepcontrol.wait")
print(json.dumps(out))
"""


def test_flushing_programs_wait_for_the_prepass():
    """The step behind the coef / B_i . C pre-pass (a programmatic dependent launch) waits for it
    in its flushing programs too (FOLD_WAIT), not only in the output route, so that a step whose
    sequences all flush still cannot finish before the pre-pass: the sm_90 PTX of the shipped Super
    dual bf16 b256 step holds more grid-dependency waits with the knob than without."""
    waits = _offline_json(_OFFLINE_FOLD_WAIT)
    assert waits["False"] >= 1 and waits["True"] > waits["False"], waits
