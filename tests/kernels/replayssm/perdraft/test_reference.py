"""The per-draft speculative baseline's reference (reference.*_verify_perdraft) in float64.

Per-draft verification is eager stepping that stores every draft's state in its own slot;
the next round starts from the accepted slot. Over many rounds with random per-sequence
accept counts 0..T (mixed in one batch, with padded rows), the committed state must equal
eager stepping over the accepted tokens only, and every verify output must equal ReplaySSM's
verify (checkpoint + buffer, no per-draft state) from the same committed history.
"""
import pytest
import torch

from replayssm import perdraft as PD
from replayssm import reference as R
from replayssm.inputs import GDNShape, Mamba2Shape, gdn_step_inputs, mamba2_params, mamba2_step_inputs, random_state
from replayssm.state import ByteCounter, GDNReplayState, Mamba2ReplayState

F64 = torch.float64
M2 = Mamba2Shape(nheads=4, head_dim=5, d_state=6, n_groups=2)
GD = GDNShape(num_k_heads=2, num_v_heads=4, head_k_dim=6, head_v_dim=5)
REQ, BATCH, T, K = 6, 4, 3, 5       # requests, batch rows per round, drafts, ReplaySSM flush period
ROUNDS = 48


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


class Fam:
    def __init__(self, name, gen):
        self.name, self.gen = name, gen
        self.params = mamba2_params(M2, dtype=F64, gen=gen) if name == "mamba2" else {}

    def geom(self):
        return (M2.nheads, M2.head_dim, M2.d_state) if self.name == "mamba2" else \
            (GD.num_v_heads, GD.head_v_dim, GD.head_k_dim)

    def inputs(self, b, T=None):
        if self.name == "mamba2":
            return mamba2_step_inputs(M2, b, T, act_dtype=F64, gen=self.gen)
        return gdn_step_inputs(GD, b, T, act_dtype=F64, gen=self.gen)

    def perdraft(self, states, tbl, start, inp, counter=None):
        if self.name == "mamba2":
            return R.mamba2_verify_perdraft(states, tbl, start, **inp, **self.params, counter=counter)
        return R.gdn_verify_perdraft(states, tbl, start, **inp, counter=counter)

    def eager(self, state, inp, idx):
        if self.name == "mamba2":
            return R.mamba2_eager_step(state, **inp, **self.params, state_indices=idx)
        return R.gdn_eager_step(state, **inp, state_indices=idx)

    def alloc(self, L):
        if self.name == "mamba2":
            return Mamba2ReplayState.allocate(REQ, M2.nheads, M2.head_dim, M2.d_state, M2.n_groups, L, K,
                                              state_dtype="float64", act_dtype=F64)
        return GDNReplayState.allocate(REQ, GD.num_k_heads, GD.num_v_heads, GD.head_k_dim, GD.head_v_dim, L, K,
                                       state_dtype="float64", act_dtype=F64)

    def verify(self, rs, inp, idx):
        if self.name == "mamba2":
            return R.mamba2_verify(rs, **inp, **self.params, state_indices=idx)
        return R.gdn_verify(rs, **inp, state_indices=idx)

    def commit(self, rs, m, idx):
        if self.name == "mamba2":
            R.mamba2_commit(rs, self.params["A"], m, idx)
        else:
            R.gdn_commit(rs, m, idx)


def _round_rows(gen):
    """BATCH rows over REQ requests (shuffled each round); ~1 in 5 rows padded."""
    req = torch.randperm(REQ, generator=gen)[:BATCH].to(torch.int32)
    pad = torch.rand(BATCH, generator=gen) < 0.2
    return torch.where(pad, torch.full_like(req, -1), req)


def _accepts(gen, rnd):
    m = torch.randint(0, T + 1, (BATCH,), generator=gen).to(torch.int32)
    if rnd < 2:
        m[:] = 0 if rnd == 0 else T          # both extremes appear
    return m


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_perdraft_rounds_equal_eager_over_accepted_and_replay_verify(family):
    """>= 40 rounds, random accepts 0..T per sequence mixed in the batch, padded rows: per-draft
    outputs == eager stepping over the drafts from the committed state; the accepted slot ==
    eager state over the accepted tokens; untouched slots stay; outputs == ReplaySSM verify."""
    gen = torch.Generator().manual_seed(5 if family == "mamba2" else 6)
    fam = Fam(family, gen)
    heads, rows, cols = fam.geom()
    init = random_state(REQ, heads, rows, cols, dtype=F64, gen=gen)
    eager = init.clone()                                  # committed state of each request
    table = PD.slot_table(torch.arange(REQ, dtype=torch.int32), T)          # [REQ, 1+T]
    states = torch.full((REQ * (T + 1), heads, rows, cols), float("nan"), dtype=F64)
    states[table[:, 0].long()] = init                     # each request starts from column 0
    start = torch.zeros(REQ, dtype=torch.int32)           # per request, persistent
    rs = fam.alloc(K + T)
    rs.hi.data.copy_(init)
    seen = []
    for rnd in range(ROUNDS):
        idx = _round_rows(gen)
        live = idx >= 0
        lr = idx[live].long()
        tbl = torch.where(live[:, None], table[idx.clamp(min=0).long()], torch.full((BATCH, T + 1), -1,
                                                                                   dtype=torch.int32))
        st = torch.where(live, start[idx.clamp(min=0).long()], torch.zeros_like(start[:BATCH]))
        inp = fam.inputs(BATCH, T)
        before = states.clone()
        y = fam.perdraft(states, tbl, st, inp)
        assert torch.all(y[~live] == 0), "padded rows produce 0"
        # the start slot and every slot of an unscheduled request are untouched
        keep = torch.ones(states.shape[0], dtype=torch.bool)
        written = tbl[live].gather(1, R.perdraft_columns(st[live], T)).flatten().long()
        keep[written] = False
        assert torch.equal(states[keep].nan_to_num(7.0), before[keep].nan_to_num(7.0))
        assert keep[tbl[live].gather(1, st[live, None].long()).flatten().long()].all()
        # drafts == eager stepping over all T tokens from the committed state (a scratch copy)
        scratch = eager.clone()
        for j in range(T):
            ye = fam.eager(scratch, {k: (v[:, j] if v is not None else None) for k, v in inp.items()}, idx)
            assert rel(y[live, j], ye[live]) < 1e-12, (rnd, j)
        # ... and == ReplaySSM verify from checkpoint + buffer (no per-draft state)
        yr = fam.verify(rs, inp, idx)
        assert rel(y[live], yr[live]) < 1e-10, rnd
        # commit m: eager over the accepted tokens only; per-draft: move the start column
        m = _accepts(gen, rnd)
        seen += m[live].tolist()
        for j in range(T):
            fam.eager(eager, {k: (v[:, j] if v is not None else None) for k, v in inp.items()},
                      torch.where(m > j, idx, torch.full_like(idx, -1)))
        st_new = R.perdraft_advance(st.clone(), m, T)
        start[lr] = st_new[live]
        fam.commit(rs, m, idx)
        acc_slots = table[lr].gather(1, start[lr, None].long())[:, 0].long()
        assert rel(states[acc_slots], eager[lr]) < 1e-12, rnd
    assert 0 in seen and T in seen and len(seen) >= 40 * BATCH * 0.6
    # every request's accepted slot holds its eager state at the end
    final = table.gather(1, start[:, None].long())[:, 0].long()
    assert rel(states[final], eager) < 1e-12


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_perdraft_storage_rounding_and_counter(family):
    """Low-precision storage: each stored draft state is the fp32 working state rounded once
    (the working copy is not re-rounded between drafts); the counter counts 1 read + T writes."""
    gen = torch.Generator().manual_seed(9)
    fam = Fam(family, gen)
    heads, rows, cols = fam.geom()
    b = 3
    idx = torch.tensor([0, -1, 2], dtype=torch.int32)
    tbl = PD.slot_table(idx, T)
    st = torch.tensor([2, 0, 3], dtype=torch.int32)
    init = random_state(3 * (T + 1), heads, rows, cols, dtype=F64, gen=gen)
    s64, s16 = init.clone(), init.to(torch.bfloat16)
    s64[tbl[[0, 2]].gather(1, st[[0, 2], None].long()).flatten().long()] = \
        s16[tbl[[0, 2]].gather(1, st[[0, 2], None].long()).flatten().long()].double()
    inp = fam.inputs(b, T)
    cnt = ByteCounter()
    fam.perdraft(s64, tbl, st, inp)
    fam.perdraft(s16, tbl, st, inp, counter=cnt)
    cols_w = tbl[[0, 2]].gather(1, R.perdraft_columns(st[[0, 2]], T)).flatten().long()
    assert torch.equal(s16[cols_w], s64[cols_w].to(torch.bfloat16))
    sb = s16[0].numel() * 2
    assert cnt.ckpt_read == 2 * sb and cnt.ckpt_write == 2 * T * sb


def test_perdraft_argument_errors():
    fam = Fam("mamba2", torch.Generator().manual_seed(0))
    states = torch.zeros(8, *fam.geom(), dtype=F64)
    inp = fam.inputs(2, T)
    with pytest.raises(ValueError, match="1 \\+ T"):
        fam.perdraft(states, torch.zeros(2, T, dtype=torch.int32), torch.zeros(2, dtype=torch.int32), inp)
    # a start column outside 0..T: a padded row (as the kernel makes it); the debug check names it
    y = fam.perdraft(states, PD.slot_table(torch.arange(2), T), torch.tensor([0, T + 1]), inp)
    assert not y[1].any()
    with pytest.raises(ValueError, match="start"):
        PD.mamba2_verify(states, PD.slot_table(torch.arange(2), T), torch.tensor([0, T + 1]), **inp, **fam.params,
                         backend="reference", check=True)


def test_slot_table_and_advance():
    tbl = PD.slot_table(torch.tensor([1, -1, 0], dtype=torch.int32), 2)
    assert tbl.tolist() == [[3, 4, 5], [-1, -1, -1], [0, 1, 2]] and tbl.dtype == torch.int32
    start = torch.tensor([2, 0, 1], dtype=torch.int32)
    assert R.perdraft_columns(start, 2).tolist() == [[0, 1], [1, 2], [2, 0]]
    PD.advance(start, torch.tensor([2, 0, 1], dtype=torch.int32), 2)
    assert start.tolist() == [1, 0, 2] and start.dtype == torch.int32
