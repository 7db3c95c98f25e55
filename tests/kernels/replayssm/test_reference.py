"""The reference's ReplaySSM ops against eager stepping, in float64.

Replay, flush, verify and commit are rewritings of the eager recurrence; in exact
arithmetic they are equal, so at float64 they must agree to ~1e-12.
"""
import pytest
import torch

from replayssm import reference as R
from replayssm.inputs import (GDNShape, Mamba2Shape, gdn_step_inputs, mamba2_params, mamba2_step_inputs,
                              random_state)
from replayssm.state import GDNReplayState, Mamba2ReplayState

F64 = torch.float64
M2 = Mamba2Shape(nheads=4, head_dim=5, d_state=6, n_groups=2)
GD = GDNShape(num_k_heads=2, num_v_heads=4, head_k_dim=6, head_v_dim=5)
SLOTS = 6


def rel(a, b):
    return ((a - b).norm() / b.norm().clamp_min(1e-300)).item()


def _indices(t, gen):
    """Batch of 4 rows over 6 slots, shuffled each step; some rows padded at random.
    Different slots skip different steps, so cursors drift apart (mixed cursors)."""
    perm = torch.randperm(SLOTS, generator=gen)[:4].to(torch.int32)
    pad = torch.rand(4, generator=gen) < 0.25
    return torch.where(pad, torch.full_like(perm, -1), perm)


class Family:
    """Uniform driver over the two families for the tests below."""

    def __init__(self, name, gen):
        self.name, self.gen = name, gen
        self.params = mamba2_params(M2, dtype=F64, gen=gen) if name == "mamba2" else {}

    def alloc(self, L, K, mode="replay", state_dtype="float64", lo_dtype=None, act=F64):
        if self.name == "mamba2":
            return Mamba2ReplayState.allocate(SLOTS, M2.nheads, M2.head_dim, M2.d_state, M2.n_groups, L, K, mode,
                                              state_dtype, lo_dtype, act)
        return GDNReplayState.allocate(SLOTS, GD.num_k_heads, GD.num_v_heads, GD.head_k_dim, GD.head_v_dim, L, K,
                                       mode, state_dtype, lo_dtype, act)

    def state_shape(self):
        return (SLOTS, M2.nheads, M2.head_dim, M2.d_state) if self.name == "mamba2" else \
            (SLOTS, GD.num_v_heads, GD.head_v_dim, GD.head_k_dim)

    slow_decay = False

    def inputs(self, batch, T=None):
        if self.name == "mamba2":
            if self.slow_decay:
                self.params["A"] = torch.full_like(self.params["A"], -0.5)
                self.params["dt_bias"] = torch.full_like(self.params["dt_bias"], -5.0)
            return mamba2_step_inputs(M2, batch, T, act_dtype=F64, gen=self.gen)
        inp = gdn_step_inputs(GD, batch, T, act_dtype=F64, gen=self.gen)
        if self.slow_decay:
            inp["g"] = inp["g"] * 0.1
            inp["beta"] = inp["beta"] * 0.1
        return inp

    def eager(self, state, inp, idx):
        if self.name == "mamba2":
            return R.mamba2_eager_step(state, **inp, **self.params, state_indices=idx)
        return R.gdn_eager_step(state, **inp, state_indices=idx)

    def replay(self, rs, inp, idx):
        f = R.mamba2_replay_step if self.name == "mamba2" else R.gdn_replay_step
        return f(rs, **inp, **self.params, state_indices=idx)

    def verify(self, rs, inp, idx):
        f = R.mamba2_verify if self.name == "mamba2" else R.gdn_verify
        return f(rs, **inp, **self.params, state_indices=idx)

    def commit(self, rs, m, idx):
        if self.name == "mamba2":
            R.mamba2_commit(rs, self.params["A"], m, idx)
        else:
            R.gdn_commit(rs, m, idx)

    def flush(self, rs):
        R.mamba2_flush(rs, self.params["A"]) if self.name == "mamba2" else R.gdn_flush(rs)

    def step_slice(self, inp, j):
        return {k: (v[:, j] if v is not None else None) for k, v in inp.items()}


FAMILIES = ["mamba2", "gdn"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("L,K", [(8, 8), (16, 5), (4, 1)])
def test_replay_equals_eager_fp64_long_horizon(family, L, K):
    gen = torch.Generator().manual_seed(hash((family, L, K)) % 2**31)
    fam = Family(family, gen)
    init = random_state(*fam.state_shape(), dtype=F64, gen=gen)
    eager = init.clone()
    rs = fam.alloc(L, K)
    rs.hi.data.copy_(init)
    cursors_seen = set()
    worst = 0.0
    for t in range(300):    # 37 to 300 flushes per sequence: fp64 drift would show
        idx = _indices(t, gen)
        inp = fam.inputs(4)
        live = idx[idx >= 0].long()
        cursors_seen.add(tuple(rs.cursor[live].tolist()))
        ye, yr = fam.eager(eager, inp, idx), fam.replay(rs, inp, idx)
        assert torch.all(yr[idx < 0] == 0), "padded rows must produce 0"
        worst = max(worst, rel(yr, ye))
    fam.flush(rs)
    assert worst < 1e-10, worst
    assert rel(rs.hi.data, eager) < 1e-10
    if K > 1:  # the batch really held sequences at different buffer positions
        assert any(len(set(c)) > 1 for c in cursors_seen)


@pytest.mark.parametrize("family", FAMILIES)
def test_speculative_rounds_equal_eager_over_accepted(family):
    gen = torch.Generator().manual_seed(7 if family == "gdn" else 3)
    fam = Family(family, gen)
    T, K = 4, 6
    rs = fam.alloc(L=K + T, K=K)
    init = random_state(*fam.state_shape(), dtype=F64, gen=gen)
    rs.hi.data.copy_(init)
    eager = init.clone()
    counts = []
    for rnd in range(60):
        idx = _indices(rnd, gen)
        inp = fam.inputs(4, T)
        y = fam.verify(rs, inp, idx)
        m = torch.randint(0, T + 1, (4,), generator=gen)
        if rnd < 2:  # make sure both extremes appear
            m[:] = 0 if rnd == 0 else T
        counts += m[idx >= 0].tolist()
        # eager over the accepted tokens only: step j for the rows that accept > j
        for j in range(T):
            row_idx = torch.where(m > j, idx, torch.full_like(idx, -1))
            ye = fam.eager(eager, fam.step_slice(inp, j), row_idx)
            acc = row_idx >= 0
            if acc.any():
                assert rel(y[acc, j], ye[acc]) < 1e-10, (rnd, j)
        fam.commit(rs, m, idx)
        assert int(rs.cursor.max()) < K
    fam.flush(rs)
    assert rel(rs.hi.data, eager) < 1e-10
    assert 0 in counts and T in counts


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("lo", ["bfloat16", "float8_e4m3"])
def test_dual_high_checkpoint_is_exact_while_shared_low_drifts(family, lo):
    """Dual: the high checkpoint equals the fp64 eager state at every flush (no low-precision
    error enters it). Shared-low: one low copy for both paths, so its state error grows."""
    gen = torch.Generator().manual_seed(11)
    fam = Family(family, gen)
    fam.slow_decay = True  # long-memory heads (decay ~0.99/step), where rounding error can accumulate
    K, steps = 4, 200
    init = random_state(*fam.state_shape(), dtype=F64, gen=gen)
    eager = init.clone()
    dual = fam.alloc(8, K, "dual", "float64", lo)
    shared = fam.alloc(8, K, "shared-low", "float64", lo)
    for rs in (dual, shared):
        rs.hi.write(torch.arange(SLOTS), init)
        if rs.lo is not None:
            rs.lo.write(torch.arange(SLOTS), init)
    dual.hi.data.copy_(init)
    idx = torch.arange(SLOTS, dtype=torch.int32)
    dual_state_err, shared_state_err, once_err, dual_out, shared_out = [], [], [], [], []
    for t in range(steps):
        inp = fam.inputs(SLOTS)
        ye = fam.eager(eager, inp, idx)
        yd, ys = fam.replay(dual, inp, idx), fam.replay(shared, inp, idx)
        dual_out.append(rel(yd, ye))
        shared_out.append(rel(ys, ye))
        if (t + 1) % K == 0:  # every sequence just flushed
            assert int(dual.cursor.max()) == 0
            dual_state_err.append(rel(dual.hi.data, eager))
            shared_state_err.append(rel(shared.hi.read(torch.arange(SLOTS), F64), eager))
            once_err.append(rel(dual.lo.read(torch.arange(SLOTS), F64), eager))  # one rounding of the exact state
    assert max(dual_state_err) < 1e-10, "low-precision error entered the high checkpoint"
    tol = 1e-2 if lo == "bfloat16" else 1e-1
    assert max(dual_out) < tol  # the low copy only perturbs the current output
    assert min(shared_state_err) > 1e3 * max(dual_state_err)
    # shared-low re-rounds a state that already carries rounding error at every flush:
    # its error exceeds that of rounding the exact state once (what dual's low copy holds)
    shared_mean, once_mean = sum(shared_state_err) / len(shared_state_err), sum(once_err) / len(once_err)
    print(family, lo, f"shared {shared_mean:.3e} once {once_mean:.3e}")
    assert shared_mean > 1.5 * once_mean, f"shared-low {shared_mean:.2e} vs one rounding {once_mean:.2e}"
    assert sum(shared_out[-20:]) > sum(dual_out[-20:])


@pytest.mark.parametrize("family", FAMILIES)
def test_dual_route_leaves_the_low_copy_stale_and_the_high_copy_exact(family):
    """The small-batch route's semantics (route=True) mixed with buffered steps, speculative
    rounds and a flush on a dual state (fp64 high copy, bf16 low copy): the route writes the
    high copy alone and marks the low copy stale (LO_STALE, count 0); the next op that would
    read it refreshes it first (a buffered step flushes, a verify rewrites it and clears the
    bit). Whatever the order, the high checkpoint stays the eager state exactly, and every
    output computed from the high copy (route steps, the flushes the stale bit forces) is exact."""
    from replayssm.state import LO_STALE
    gen = torch.Generator().manual_seed(19)
    fam = Family(family, gen)
    T, K = 2, 4
    rs = fam.alloc(K + T, K, "dual", "float64", "bfloat16")
    init = random_state(*fam.state_shape(), dtype=F64, gen=gen)
    rs.hi.write(torch.arange(SLOTS), init)
    rs.lo.write(torch.arange(SLOTS), init)
    eager = init.clone()
    ops = {"route": 0, "stale flush": 0, "verify refresh": 0}
    for t in range(120):
        idx = _indices(t, gen)
        live = idx[idx >= 0].long()
        op = ["route", "step", "spec"][int(torch.randint(0, 3, (1,), generator=gen))]
        stale = rs.lo_stale(live)
        if op == "spec":
            inp = fam.inputs(4, T)
            y = fam.verify(rs, inp, idx)
            assert not rs.lo_stale(live).any()
            ops["verify refresh"] += int(stale.sum())
            m = torch.randint(0, T + 1, (4,), generator=gen)
            for j in range(T):
                row_idx = torch.where(m > j, idx, torch.full_like(idx, -1))
                ye = fam.eager(eager, fam.step_slice(inp, j), row_idx)
                acc = row_idx >= 0
                if acc.any():
                    assert rel(y[acc, j], ye[acc]) < 2e-2, (t, j)     # from the (refreshed) bf16 copy
            fam.commit(rs, m, idx)
            continue
        inp = fam.inputs(4)
        ye = fam.eager(eager, inp, idx)
        f = R.mamba2_replay_step if family == "mamba2" else R.gdn_replay_step
        y = f(rs, **inp, **fam.params, state_indices=idx, route=op == "route")
        rows = (idx >= 0).nonzero().flatten()
        if op == "route":
            assert (rs.cursor[live] == LO_STALE).all()
            exact = rows
        else:
            exact = rows[stale]                   # the stale rows flushed: output from the high copy
            ops["stale flush"] += len(exact)
            assert not rs.lo_stale(live).any()
        ops[op] = ops.get(op, 0) + 1
        if len(exact):
            assert rel(y[exact], ye[exact]) < 1e-10, (t, op)
        assert rel(y, ye) < 2e-2
    fam.flush(rs)
    assert not rs.lo_stale().any() and int(rs.cursor.max()) == 0
    assert rel(rs.hi.data, eager) < 1e-10
    assert rel(rs.lo.read(torch.arange(SLOTS), F64), eager) < 1e-2     # refreshed: one rounding
    assert min(ops.values()) >= 3, ops


@pytest.mark.parametrize("family", FAMILIES)
def test_buffer_overflow_and_window_errors(family):
    fam = Family(family, torch.Generator().manual_seed(0))
    rs = fam.alloc(L=4, K=4)
    rs.cursor[:] = 2
    with pytest.raises(RuntimeError, match="does not fit"):
        fam.verify(rs, fam.inputs(2, 3), torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="flush_period"):
        fam.alloc(L=4, K=5)


def test_modes_validate_dtypes():
    with pytest.raises(ValueError, match="lo_dtype"):
        Mamba2ReplayState.allocate(2, 2, 2, 2, 1, 4, 4, mode="dual", lo_dtype=None)
    with pytest.raises(ValueError, match="float32"):
        Mamba2ReplayState.allocate(2, 2, 2, 2, 1, 4, 4, mode="dual", state_dtype="bfloat16", lo_dtype="float16")
    with pytest.raises(ValueError, match="mode"):
        Mamba2ReplayState.allocate(2, 2, 2, 2, 1, 4, 4, mode="triple")


def test_gdn_rederive_u_makes_random_buffers_agree_with_a_flush():
    """A dual state with random buffers and pending entries: after gdn_rederive_u, a buffered
    step's output (stored u) equals that of a step that flushes first (u recomputed from v,
    beta against the high checkpoint), at fp64 with a checkpoint exact in the bf16 low copy
    (so both paths see the same state); before, they disagree."""
    gen = torch.Generator().manual_seed(5)
    sh = GDNShape(num_k_heads=1, num_v_heads=2, head_k_dim=6, head_v_dim=5)
    slots, L, K = 3, 6, 6
    outs = {}
    for fix in (False, True):
        g = torch.Generator().manual_seed(9)
        rs = GDNReplayState.allocate(slots, 1, 2, 6, 5, L, K, mode="dual", state_dtype="float64",
                                     lo_dtype="bfloat16", act_dtype=torch.float64)
        init = random_state(slots, 2, 5, 6, dtype=F64, gen=g).to(torch.bfloat16).to(F64)
        rs.hi.write(torch.arange(slots), init)
        rs.lo.write(torch.arange(slots), init)
        for buf in rs.buffers():
            buf.copy_(torch.randn(buf.shape, generator=g, dtype=buf.dtype) * 0.3)
        rs.g.copy_(torch.log(0.9 + 0.1 * torch.rand(rs.g.shape, generator=g, dtype=F64)))
        rs.beta.copy_(0.1 + 0.8 * torch.rand(rs.beta.shape, generator=g, dtype=F64))
        rs.cursor.copy_(torch.tensor([0, 2, 4], dtype=torch.int32))
        if fix:
            R.gdn_rederive_u(rs)
        flushed = GDNReplayState.allocate(slots, 1, 2, 6, 5, L, 1, mode="dual", state_dtype="float64",
                                          lo_dtype="bfloat16", act_dtype=torch.float64)
        for a, b in zip(rs.buffers(), flushed.buffers()):
            b.copy_(a)
        flushed.hi.data.copy_(rs.hi.data)
        flushed.lo.data.copy_(rs.lo.data)
        flushed.cursor.copy_(rs.cursor)
        inp = gdn_step_inputs(sh, slots, act_dtype=F64, gen=gen)
        outs[fix] = rel(R.gdn_replay_step(rs, **inp), R.gdn_replay_step(flushed, **inp))
    assert outs[True] < 1e-12, outs
    assert outs[False] > 1e-3, outs
    with pytest.raises(ValueError, match="dual"):
        R.gdn_rederive_u(GDNReplayState.allocate(1, 1, 2, 6, 5, L, K, mode="replay"))
