"""Bad inputs to every public op of replayssm.mamba2, replayssm.gdn and replayssm.perdraft, on
both backends (docs/api.md, "Validation").

One table, three kinds of rows:
- host: a shape / dtype / argument error: a ValueError naming the argument, on both backends,
  before anything is read or written (the state is compared with a copy);
- debug: an error only device data shows (an index past the pool, a slot twice, accepted out of
  range), raised with check=True;
- no-op: in normal mode an index outside 0 <= idx < S is a padded row: the op gives what it
  gives with -1 there, on both backends, and the two backends agree.
Plus non-finite inputs: a NaN stays in its row's output and its slot, bit for bit nothing else
changes. Tiny shapes: the Triton rows run under the CPU interpreter here and on CUDA on the
GPU machine (kernel_checks.DEV).
"""
from __future__ import annotations

import copy

import pytest
import torch

from replayssm import gdn as G
from replayssm import inputs as I
from replayssm import mamba2 as M
from replayssm import perdraft as PD
from replayssm.common import checks as chk
from replayssm.gdn.options import GDNOptions
from replayssm.mamba2.options import Mamba2Options

from kernel_checks import DEV

S, L, K, T, BATCH = 4, 8, 4, 2, 2
BACKENDS = ("triton", "reference")
SHAPES = {"mamba2": I.Mamba2Shape(nheads=2, head_dim=4, d_state=4, n_groups=1),
          "gdn": I.GDNShape(num_k_heads=1, num_v_heads=2, head_k_dim=4, head_v_dim=4)}
OPTS = {"mamba2": Mamba2Options(small_batch_route=False), "gdn": GDNOptions(small_batch_route=False)}
OPS = {"mamba2": M, "gdn": G}
IDX = [2, 0]    # the batch's slots


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


def new_state(fam, L=L, K=K):
    """A replay state with a random checkpoint and cursors 0..K-1 behind real entries."""
    sh = SHAPES[fam]
    if fam == "mamba2":
        rs = M.allocate(S, sh.nheads, sh.head_dim, sh.d_state, sh.n_groups, L, K, act_dtype=torch.float32, device=DEV)
        heads, rows, cols = sh.nheads, sh.head_dim, sh.d_state
    else:
        rs = G.allocate(S, sh.num_k_heads, sh.num_v_heads, sh.head_k_dim, sh.head_v_dim, L, K,
                        act_dtype=torch.float32, device=DEV)
        heads, rows, cols = sh.num_v_heads, sh.head_v_dim, sh.head_k_dim
    g = _gen(1)
    OPS[fam].load_state(rs, I.random_state(S, heads, rows, cols, device=DEV, gen=g))
    for step in range(2):      # slots 0 and 2 get two entries each through the ops
        OPS[fam].replay_step(rs, **step_inputs(fam, g=_gen(10 + step)), state_indices=idx(IDX),
                             backend="reference")
    return rs


def step_inputs(fam, T=None, g=None):
    sh = SHAPES[fam]
    g = g or _gen(2)
    if fam == "mamba2":
        d = I.mamba2_step_inputs(sh, BATCH, T=T, act_dtype=torch.float32, device=DEV, gen=g)
        return {**d, **I.mamba2_params(sh, device=DEV, gen=_gen(3))}
    return I.gdn_step_inputs(sh, BATCH, T=T, act_dtype=torch.float32, device=DEV, gen=g)


def idx(v, dtype=torch.int32):
    return torch.tensor(v, dtype=dtype, device=DEV)


def eager_state(fam):
    return new_state(fam).hi.data.clone()


def base(fam, op):
    """The op's arguments (a dict the rows mutate) and the state it works on."""
    if op == "eager_step":
        return {"inp": step_inputs(fam), "state_indices": idx(IDX)}, eager_state(fam)
    if op == "replay_step":
        return {"inp": step_inputs(fam), "state_indices": idx(IDX)}, new_state(fam)
    if op == "verify":
        return {"inp": step_inputs(fam, T=T), "state_indices": idx(IDX)}, new_state(fam)
    if op == "commit":
        rs = new_state(fam)
        OPS[fam].verify(rs, **step_inputs(fam, T=T), state_indices=idx(IDX), backend="reference")
        return {"accepted": idx([1, 2]), "state_indices": idx(IDX)}, rs
    if op == "flush":
        return {"slots": idx(IDX)}, new_state(fam)
    if op == "load_state":
        rs = new_state(fam)
        return {"state": torch.randn(BATCH, *rs.hi.data.shape[1:], generator=_gen(4)).to(DEV),
                "slots": idx(IDX)}, rs
    if op == "export_state":
        return {"slots": idx(IDX)}, new_state(fam)
    raise KeyError(op)


def run(fam, op, st, a, backend, **kw):
    """Call op the documented way (inputs and state_indices as arguments, the rest keywords)."""
    ops = OPS[fam]
    if backend == "triton" and op not in ("load_state", "export_state"):
        kw = {"options": OPTS[fam], **kw}
    if op in ("eager_step", "replay_step", "verify"):
        return getattr(ops, op)(st, **a["inp"], state_indices=a["state_indices"], backend=backend, **kw)
    if op == "commit":
        return ops.commit(st, a["accepted"], a["state_indices"], backend=backend, **kw)
    if op == "flush":
        return ops.flush(st, a["slots"], backend=backend, **kw)
    if op == "load_state":
        return ops.load_state(st, a["state"], a["slots"], backend=backend, **kw)
    return ops.export_state(st, a["slots"], backend=backend)


def tensors(st):
    """Every tensor of a state (a replay state's parts, or the eager state itself)."""
    if isinstance(st, torch.Tensor):
        return {"state": st}
    out = {"hi": st.hi.data, "cursor": st.cursor}
    for n in ("x", "B", "dt", "u", "k", "g", "v", "beta"):
        if getattr(st, n, None) is not None:
            out[n] = getattr(st, n)
    return out


def inp(key, f):
    """A row's mutation of one input tensor."""
    return lambda fam, a: {**a, "inp": {**a["inp"], key: f(a["inp"][key], fam)}}


def arg(key, f):
    return lambda fam, a: {**a, key: f(a[key], fam)}


def triple(t, fam):
    """Three times the groups / key heads (they no longer divide the heads)."""
    return torch.cat([t] * 3, dim=-2)


def heads_key(fam):
    return "x" if fam == "mamba2" else "v"


# ----------------------------------------------------------------------------- host rows
# (id, families, ops, mutation, the argument the message names)
STEP_OPS = ("eager_step", "replay_step", "verify")
HOST = [
    ("wrong-head-count", ("mamba2", "gdn"), STEP_OPS,
     lambda fam, a: inp(heads_key(fam), lambda t, f: torch.cat([t, t[..., :1, :]], dim=-2))(fam, a),
     None),
    ("head-axis-missing", ("mamba2", "gdn"), STEP_OPS,
     lambda fam, a: inp("dt" if fam == "mamba2" else "g", lambda t, f: t[..., 0])(fam, a), None),
    ("batch-mismatch", ("mamba2", "gdn"), STEP_OPS,
     lambda fam, a: inp("dt" if fam == "mamba2" else "beta", lambda t, f: torch.cat([t, t[:1]]))(fam, a), None),
    ("short-A", ("mamba2",), STEP_OPS, inp("A", lambda t, f: t[:-1]), "A"),
    ("groups-do-not-divide-heads", ("mamba2",), ("eager_step",),
     lambda fam, a: inp("C", triple)(fam, inp("B", triple)(fam, a)),
     "groups G"),
    ("key-heads-do-not-divide-value-heads", ("gdn",), ("eager_step",),
     lambda fam, a: inp("k", triple)(fam, inp("q", triple)(fam, a)),
     "key heads"),
    ("state-dim-mismatch", ("mamba2", "gdn"), STEP_OPS,
     lambda fam, a: inp("B" if fam == "mamba2" else "k", lambda t, f: torch.cat([t, t], dim=-1))(fam, a), None),
    ("too-many-state-indices", ("mamba2", "gdn"), STEP_OPS + ("commit",),
     arg("state_indices", lambda t, f: torch.cat([t, t[:1] + 1])), "state_indices"),
    ("float-state-indices", ("mamba2", "gdn"), STEP_OPS + ("commit",),
     arg("state_indices", lambda t, f: t.float()), "state_indices"),
    ("integer-A", ("mamba2",), STEP_OPS, inp("A", lambda t, f: t.to(torch.int32)), "A"),
    ("float-accepted", ("mamba2", "gdn"), ("commit",), arg("accepted", lambda t, f: t.float()), "accepted"),
    ("short-accepted", ("mamba2", "gdn"), ("commit",), arg("accepted", lambda t, f: t[:1]), "from accepted"),
    ("float-slots", ("mamba2", "gdn"), ("flush", "load_state", "export_state"),
     arg("slots", lambda t, f: t.float()), "slots"),
    ("load-wrong-shape", ("mamba2", "gdn"), ("load_state",), arg("state", lambda t, f: t[..., :-1]), "state"),
]


def _host_cases():
    for rid, fams, ops, mut, name in HOST:
        for fam in fams:
            for op in ops:
                yield pytest.param(fam, op, mut, name, id=f"{rid}-{fam}-{op}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fam,op,mut,name", list(_host_cases()))
def test_host_check(fam, op, mut, name, backend):
    a, st = base(fam, op)
    a = mut(fam, a)
    before = {k: v.clone() for k, v in tensors(st).items()}
    with pytest.raises(ValueError, match=name or "must be") as e:
        run(fam, op, st, a, backend)
    assert f"{op}:" in str(e.value) and "got" in str(e.value), str(e.value)
    for k, v in tensors(st).items():
        assert torch.equal(v, before[k]), f"{k} written before the check failed"


@pytest.mark.parametrize("fam", ["mamba2", "gdn"])
def test_window_and_keywords(fam):
    """L >= K + T: at allocate (spec_window) and at verify; backend is keyword-only."""
    sh = SHAPES[fam]
    dims = ((sh.nheads, sh.head_dim, sh.d_state, sh.n_groups) if fam == "mamba2" else
            (sh.num_k_heads, sh.num_v_heads, sh.head_k_dim, sh.head_v_dim))
    with pytest.raises(ValueError, match="spec_window"):
        OPS[fam].allocate(S, *dims, 8, 8, spec_window=4)
    rs = new_state(fam, L=8, K=8)     # the case: L = K = 8, T = 4
    for backend in BACKENDS:
        with pytest.raises(ValueError, match="draft window"):
            run(fam, "verify", rs, {"inp": step_inputs(fam, T=4), "state_indices": idx(IDX)}, backend)
    a, rs = base(fam, "flush")
    with pytest.raises(TypeError):
        OPS[fam].flush(rs, a["slots"], "reference")


@pytest.mark.parametrize("fam", ["mamba2", "gdn"])
def test_strided_state_triton_only(fam):
    """A state with a non-contiguous slot axis (vLLM's page views): the reference takes it, the
    Triton backend names the tensor."""
    a, st = base(fam, "replay_step")
    wide = torch.zeros(2 * S, *st.hi.data.shape[1:], device=DEV)
    wide[::2] = st.hi.data
    st.hi.data = wide[::2]
    run(fam, "replay_step", copy.deepcopy(st), a, "reference")
    with pytest.raises(ValueError, match="rs.hi"):
        run(fam, "replay_step", st, a, "triton")
    with pytest.raises(ValueError, match="state"):
        run(fam, "eager_step", eager_state(fam).transpose(2, 3), a, "triton")


@pytest.mark.parametrize("fam", ["mamba2", "gdn"])
def test_input_dtype_other_than_the_buffer(fam):
    """Inputs in fp16 into an fp32-activation state: both backends accept them (the buffered
    ones stored in the buffer's dtype) and agree."""
    a, st0 = base(fam, "replay_step")
    a = {**a, "inp": {k: (v.half() if k in ("x", "z", "B", "C", "q", "k", "v") else v) for k, v in a["inp"].items()}}
    got = {}
    for backend in BACKENDS:
        st = copy.deepcopy(st0)
        got[backend] = (run(fam, "replay_step", st, a, backend), tensors(st))
    (yt, st_t), (yr, st_r) = got["triton"], got["reference"]
    assert yt.dtype == torch.float16 and torch.allclose(yt.float(), yr.float(), rtol=2e-3, atol=2e-3)
    for k in st_t:
        assert torch.allclose(st_t[k].double(), st_r[k].double(), rtol=1e-4, atol=1e-5), k


# ----------------------------------------------------------------------------- debug rows
DEBUG = [
    ("index-past-pool", STEP_OPS + ("commit",), arg("state_indices", lambda t, f: idx([2, S])), "state_indices"),
    ("duplicate-slots", STEP_OPS + ("commit",), arg("state_indices", lambda t, f: idx([2, 2])), "distinct"),
    ("slot-past-pool", ("flush", "load_state"), arg("slots", lambda t, f: idx([2, S + 5])), "slots"),
    ("accepted-negative", ("commit",), arg("accepted", lambda t, f: idx([-1, 0])), "accepted"),
    ("accepted-past-window", ("commit",), arg("accepted", lambda t, f: idx([T + 1, 0])), "accepted"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fam", ["mamba2", "gdn"])
@pytest.mark.parametrize("rid,ops,mut,name", [pytest.param(*r, id=r[0]) for r in DEBUG])
def test_debug_check(rid, ops, mut, name, fam, backend, monkeypatch):
    for op in ops:
        a, st = base(fam, op)
        a = mut(fam, a)
        with pytest.raises(ValueError, match=name):
            run(fam, op, st, a, backend, check=True)
    monkeypatch.setenv("REPLAYSSM_CHECK", "1")     # the environment switch, for one op
    try:
        assert chk.read_env()
        a, st = base(fam, ops[0])
        with pytest.raises(ValueError, match=name):
            run(fam, ops[0], st, mut(fam, a), backend)
    finally:
        monkeypatch.delenv("REPLAYSSM_CHECK")
        chk.read_env()


# ----------------------------------------------------------------------------- no-op rows
NOOP_OPS = STEP_OPS + ("commit", "flush", "load_state", "export_state")


def _with(a, op, bad):
    key = "slots" if op in ("flush", "load_state", "export_state") else "state_indices"
    return {**a, key: idx([IDX[0], bad])}


@pytest.mark.parametrize("fam", ["mamba2", "gdn"])
@pytest.mark.parametrize("op", NOOP_OPS)
def test_out_of_pool_index_is_a_noop_row(fam, op):
    """An index >= S (or far past it) does on both backends what -1 (padding) does."""
    a, st0 = base(fam, op)
    want_st = copy.deepcopy(st0)
    want = run(fam, op, want_st, _with(a, op, -1), "reference")
    for backend, bad in (("reference", S), ("triton", S), ("triton", 2 ** 31 - 1)):
        st = copy.deepcopy(st0)
        got = run(fam, op, st, _with(a, op, bad), backend)
        if want is not None:
            assert torch.allclose(got, want, rtol=1e-4, atol=1e-5), f"{backend} idx {bad}: output"
            assert not got[1].any(), "the no-op row's output is 0"
        for k, v in tensors(st).items():
            assert torch.allclose(v.double(), tensors(want_st)[k].double(), rtol=1e-4, atol=1e-5), \
                f"{backend} idx {bad}: state {k}"


@pytest.mark.parametrize("fam", ["mamba2", "gdn"])
def test_accepted_out_of_range_keeps_the_cursor_in_the_buffer(fam):
    """Normal mode: accepted is clamped to 0..L-K on both backends (a cursor below K stays
    below L), so later steps and verifies stay inside the buffer; the backends agree."""
    a, st0 = base(fam, "commit")
    for bad in ([-1, 2], [100, -7]):
        sts = {}
        for backend in BACKENDS:
            st = copy.deepcopy(st0)
            run(fam, "commit", st, {**a, "accepted": idx(bad)}, backend)
            assert int(OPS[fam].entries(st).max()) < st.capacity
            run(fam, "verify", st, {"inp": step_inputs(fam, T=T), "state_indices": idx(IDX)}, backend)
            sts[backend] = tensors(st)
        for k, v in sts["triton"].items():
            assert torch.allclose(v.double(), sts["reference"][k].double(), rtol=1e-4, atol=1e-5), f"{bad}: {k}"


def test_perdraft_out_of_pool_slots_are_skipped():
    """Per-draft verify: a start slot past the pool is a padded row, a destination past it is
    skipped, a start column past T is a padded row; both backends agree."""
    for fam in ("mamba2", "gdn"):
        sh = SHAPES[fam]
        dims = (sh.nheads, sh.head_dim, sh.d_state) if fam == "mamba2" else \
            (sh.num_v_heads, sh.head_v_dim, sh.head_k_dim)
        states0 = I.random_state(3 * (1 + T), *dims, device=DEV, gen=_gen(5))
        tbl = PD.slot_table(idx([0, 1]), T)
        tbl[1, 1] = 10 ** 6                 # a destination past the pool
        bad_start = idx([1, 0])
        bad_start[0] = T + 3                # row 0 padded by its start column
        inp = step_inputs(fam, T=T)
        outs = {}
        for backend in BACKENDS:
            st = states0.clone()
            fn = PD.mamba2_verify if fam == "mamba2" else PD.gdn_verify
            y = fn(st, tbl, bad_start, **inp, backend=backend)
            outs[backend] = (y, st)
            assert not y[0].any()
        (yt, st_t), (yr, st_r) = outs["triton"], outs["reference"]
        assert torch.allclose(yt, yr, rtol=1e-4, atol=1e-5) and torch.allclose(st_t, st_r, rtol=1e-4, atol=1e-5)
        with pytest.raises(ValueError, match="slot_table"):
            fn(states0.clone(), tbl, bad_start, **inp, backend="reference", check=True)
        with pytest.raises(ValueError, match="start"):
            fn(states0.clone(), PD.slot_table(idx([0, 1]), T), bad_start, **inp, backend="triton", check=True)
        with pytest.raises(ValueError, match="slot_table"):     # a host check
            fn(states0.clone(), tbl.float(), idx([0, 0]), **inp, backend="triton")


# ----------------------------------------------------------------------------- non-finite values
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fam", ["mamba2", "gdn"])
def test_nan_stays_in_its_row_and_slot(fam, backend):
    """NaN in row 0's input: row 1's outputs and every slot but row 0's are bit for bit those of
    the clean run, over steps that cross a flush, a verify and a commit."""
    key = heads_key(fam)
    runs = {}
    for dirty in (False, True):
        rs, state = new_state(fam), eager_state(fam)
        ys = []
        for step in range(3):
            a = {"inp": step_inputs(fam, g=_gen(20 + step)), "state_indices": idx(IDX)}
            if dirty and step == 0:
                a["inp"][key] = a["inp"][key].clone()
                a["inp"][key][0, 0, 0] = float("nan")
            ys.append(run(fam, "replay_step", rs, a, backend))
            ys.append(run(fam, "eager_step", state, a, backend))
        a = {"inp": step_inputs(fam, T=T, g=_gen(30)), "state_indices": idx(IDX)}
        ys.append(run(fam, "verify", rs, a, backend))
        run(fam, "commit", rs, {"accepted": idx([T, T]), "state_indices": idx(IDX)}, backend)
        runs[dirty] = (ys, tensors(rs), state)
    (ys0, rs0, st0), (ys1, rs1, st1) = runs[False], runs[True]
    for y0, y1 in zip(ys0, ys1):
        assert torch.equal(y0[1], y1[1]), "the clean row's output changed"
    nan_slot = IDX[0]
    assert not torch.isfinite(rs1["hi"][nan_slot]).all() or not torch.isfinite(ys1[-1][0]).all()
    others = [s for s in range(S) if s != nan_slot]
    for k in rs0:
        assert torch.equal(rs0[k][others], rs1[k][others]), f"state {k}: a NaN reached another slot"
    assert torch.equal(st0[others], st1[others]), "eager state: a NaN reached another slot"
