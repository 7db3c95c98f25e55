"""Speculative traffic model (traffic.spec_traffic) against the ops' own byte accounting, and
the acceptance models (replaybench.accept)."""
import random

import pytest
import torch

from replaybench import accept as AC
from replaybench import traffic as TR
from replaybench.models import get_model
from replaybench.scenario import Case
from replayssm import perdraft as PD
from replayssm import reference as R
from replayssm.inputs import GDNShape, Mamba2Shape, gdn_step_inputs, mamba2_params, mamba2_step_inputs
from replayssm.state import ByteCounter, GDNReplayState, Mamba2ReplayState

M2 = Mamba2Shape(4, 8, 16, 2)
GD = GDNShape(2, 4, 16, 8)


def test_cursor_stats_by_hand():
    pm = lambda m, T=4: [1.0 if k == m else 0.0 for k in range(T + 1)]  # noqa: E731
    assert TR.spec_cursor_stats(pm(2), 16) == pytest.approx((7.0, 1 / 8, 2.0))      # cursor 0,2,..,14
    assert TR.spec_cursor_stats(pm(3), 16) == pytest.approx((7.5, 1 / 6, 3.0))      # 0,3,..,15: folds 18
    assert TR.spec_cursor_stats(pm(4), 16) == pytest.approx((6.0, 1 / 4, 4.0))
    assert TR.spec_cursor_stats(pm(0), 16) == pytest.approx((7.5, 0.0, 0.0))       # never moves
    for acc in ("uniform", "geom:0.7", "fixed:1"):
        pmf = AC.accept_pmf(acc, 4)
        # in the long run every committed entry is folded exactly once
        assert TR.spec_cursor_stats(pmf, 16)[2] == pytest.approx(AC.mean_accepted(acc, 4))


@pytest.mark.parametrize("acc", ["uniform", "geom:0.6"])
def test_cursor_stats_match_simulation(acc):
    T, K, n = 4, 16, 200_000
    pmf = AC.accept_pmf(acc, T)
    rng = random.Random(1)
    cur, s_cur, flushes, folded = 0, 0, 0, 0
    for m in rng.choices(range(T + 1), weights=pmf, k=n):
        s_cur += cur
        if cur + m >= K:
            flushes, folded, cur = flushes + 1, folded + cur + m, 0
        else:
            cur += m
    mc, fr, fo = TR.spec_cursor_stats(pmf, K)
    assert s_cur / n == pytest.approx(mc, rel=0.02)
    assert flushes / n == pytest.approx(fr, rel=0.03)
    assert folded / n == pytest.approx(fo, rel=0.03)


def _replay_rounds(family, m, K=4, T=2, rounds=12, lo=None):
    """batch = K sequences with cursors staggered 0..K-1, fixed accepted m; counts bytes over
    `rounds` rounds after a warm-up that puts every sequence on its cycle. lo: dual mode with
    that low-copy dtype (method spec-replay-dual)."""
    mode, method = ("dual", "spec-replay-dual") if lo else ("replay", "spec-replay")
    gen = torch.Generator().manual_seed(2)
    L, b = K + T, K
    cnt = ByteCounter()
    if family == "mamba2":
        rs = Mamba2ReplayState.allocate(b, 4, 8, 16, 2, L, K, mode=mode, lo_dtype=lo, counter=cnt)
        p = mamba2_params(M2, gen=gen)

        def rnd(acc):
            R.mamba2_verify(rs, **mamba2_step_inputs(M2, b, T, gen=gen), **p)
            R.mamba2_commit(rs, p["A"], acc)
        lb = TR.mamba2_layer_bytes(4, 8, 16, 2, method, "float32", lo or "none")
    else:
        rs = GDNReplayState.allocate(b, 2, 4, 16, 8, L, K, mode=mode, lo_dtype=lo, counter=cnt)

        def rnd(acc):
            R.gdn_verify(rs, **gdn_step_inputs(GD, b, T, gen=gen))
            R.gdn_commit(rs, acc)
        lb = TR.gdn_layer_bytes(2, 4, 16, 8, method, "float32", lo or "none")
    rs.cursor.copy_(torch.arange(b, dtype=torch.int32))
    acc = torch.full((b,), m, dtype=torch.int32)
    for _ in range(K):
        rnd(acc)
    cnt.reset()
    for _ in range(rounds):
        rnd(acc)
    return cnt, lb, rs


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("m,lo", [(0, None), (1, None), (2, None), (1, "bfloat16"), (2, "float8_e4m3")])
def test_spec_replay_model_matches_byte_accounting(family, m, lo):
    K, T, rounds = 4, 2, 12               # 12 rounds: a whole number of cycles (1, 4 or 2 rounds)
    cnt, lb, rs = _replay_rounds(family, m, K, T, rounds, lo)
    model = TR.spec_traffic(lb, K, K, T, [1.0 if k == m else 0.0 for k in range(T + 1)], perdraft=False)
    assert lb.row == rs.buffer_row_bytes()
    assert cnt.ckpt_read / rounds == pytest.approx(model.parts["state_read"])
    assert cnt.ckpt_write / rounds == pytest.approx(model.parts["state_write"])
    assert cnt.buf_read / rounds == pytest.approx(model.parts["buffer_read"])
    assert cnt.buf_write / rounds == pytest.approx(model.parts["buffer_write"])
    assert (cnt.io_read + cnt.io_write) / rounds == pytest.approx(model.parts["io"])
    assert cnt.total() / rounds == pytest.approx(model.total_bytes)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_perdraft_model_matches_byte_accounting(family):
    gen = torch.Generator().manual_seed(3)
    b, T = 3, 4
    tbl, start = PD.slot_table(torch.arange(b), T), torch.tensor([0, 2, 4], dtype=torch.int32)
    cnt = ByteCounter()
    if family == "mamba2":
        states = torch.zeros(b * (T + 1), 4, 8, 16)
        PD.mamba2_verify(states, tbl, start, **mamba2_step_inputs(M2, b, T, gen=gen), **mamba2_params(M2, gen=gen),
                         backend="reference", counter=cnt)
        lb = TR.mamba2_layer_bytes(4, 8, 16, 2, "spec-perdraft", "float32")
    else:
        states = torch.zeros(b * (T + 1), 4, 8, 16)
        PD.gdn_verify(states, tbl, start, **gdn_step_inputs(GD, b, T, gen=gen), backend="reference", counter=cnt)
        lb = TR.gdn_layer_bytes(2, 4, 16, 8, "spec-perdraft", "float32")
    model = TR.spec_traffic(lb, b, 0, T, 2.0, perdraft=True)
    assert cnt.ckpt_read == model.parts["state_read"] and cnt.ckpt_write == model.parts["state_write"]
    assert cnt.total() == pytest.approx(model.total_bytes)


def test_step_traffic_follows_the_case_acceptance_model():
    model = get_model("nemotron-3-nano-4b")

    def case(method, accept, L=20, K=16):
        return Case(case_id="x", runner="kernel", model=model.name, op="mamba2", method=method, backend="triton",
                    batch=8, buffer_len=L, flush_period=K, spec_window=4, state_dtype="float32", lo_dtype="none",
                    accept=accept)
    lo, hi = (TR.step_traffic(case("spec-replay", a), model) for a in ("fixed:1", "fixed:4"))
    assert lo.parts["state_write"] == pytest.approx(8 * 4 * 80 * 96 * 128 / 16)       # one flush per 16 rounds
    assert hi.parts["state_write"] == pytest.approx(8 * 4 * 80 * 96 * 128 / 4)
    assert TR.step_traffic(case("spec-replay", "none"), model).total_bytes == pytest.approx(
        TR.step_traffic(case("spec-replay", "fixed:2"), model).total_bytes)           # default fixed:T/2
    pd = [TR.step_traffic(case("spec-perdraft", a, 0, 0), model).total_bytes for a in ("fixed:0", "uniform")]
    assert pd[0] == pd[1]
    # per-draft moves 1 + T states per round, ReplaySSM 1 + 2/8 (a flush every 8 rounds) + buffer:
    # the bandwidth ceiling of the speedup at T = 4 is ~3.7x (the goal: >= 3x)
    assert 3.6 < pd[0] / TR.step_traffic(case("spec-replay", "fixed:2"), model).total_bytes < 3.8


def test_acceptance_models():
    assert AC.parse_accept(3) == "fixed:3" and AC.parse_accept(" uniform ") == "uniform"
    assert AC.parse_accept("geom:0.70") == "geom:0.7" and AC.parse_accept("fixed:T/2") == "fixed:T/2"
    assert AC.resolve_accept("fixed:T/2", 5) == "fixed:2" and AC.resolve_accept("fixed:T", 6) == "fixed:6"
    for bad in (-1, True, "geom:1.5", "geom:0", "fixed:x", "poisson", 2.5):
        with pytest.raises(ValueError, match="allowed"):
            AC.parse_accept(bad)
    with pytest.raises(ValueError, match="> spec_window"):
        AC.resolve_accept(5, 4)
    assert AC.accept_pmf("geom:0.5", 2) == pytest.approx([0.5, 0.25, 0.25])
    assert AC.mean_accepted("uniform", 4) == pytest.approx(2.0)
    a = AC.draw_accepted("uniform", 4, 64, 50, seed=1)
    assert a.shape == (50, 64) and a.dtype.name == "int32" and set(a.flatten()) == set(range(5))
    assert (a == AC.draw_accepted("uniform", 4, 64, 50, seed=1)).all()
    assert (AC.draw_accepted("fixed:3", 4, 2, 3) == 3).all()
