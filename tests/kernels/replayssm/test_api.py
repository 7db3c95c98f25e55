"""The verbs both families share (docs/api.md): load_state, then replay steps, verify and commit,
then export_state gives what eager decode holds after the same tokens, on both backends; one
signature shape for both families."""
from __future__ import annotations

import inspect

import pytest
import torch

from replayssm import gdn as G
from replayssm import inputs as I
from replayssm import mamba2 as M

from test_bad_inputs import BACKENDS, DEV, IDX, OPS, OPTS, S, SHAPES, T, idx, step_inputs


def _alloc(fam, **kw):
    sh = SHAPES[fam]
    if fam == "mamba2":
        return M.allocate(S, sh.nheads, sh.head_dim, sh.d_state, sh.n_groups, 8, 4, act_dtype=torch.float32,
                          device=DEV, **kw)
    return G.allocate(S, sh.num_k_heads, sh.num_v_heads, sh.head_k_dim, sh.head_v_dim, 8, 4,
                      act_dtype=torch.float32, device=DEV, **kw)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("mode", ["replay", "dual"])
@pytest.mark.parametrize("fam", ["mamba2", "gdn"])
def test_load_steps_export_equals_eager(fam, mode, backend):
    ops = OPS[fam]
    rs = _alloc(fam, spec_window=T, mode=mode, lo_dtype="bfloat16" if mode == "dual" else None)
    init = I.random_state(S, *rs.hi.data.shape[1:], device=DEV, gen=torch.Generator().manual_seed(7))
    ops.load_state(rs, init, backend=backend)
    eager = init.clone()
    kw = {"options": OPTS[fam]} if backend == "triton" else {}
    tokens = [step_inputs(fam, g=torch.Generator().manual_seed(40 + i)) for i in range(3)]
    for inp in tokens:
        ops.replay_step(rs, **inp, state_indices=idx(IDX), backend=backend, **kw)
        ops.eager_step(eager, **inp, state_indices=idx(IDX), backend="reference")
    assert torch.equal(ops.entries(rs, idx(IDX)).cpu(), torch.tensor([3, 3]))
    got = ops.export_state(rs, backend=backend)
    assert torch.allclose(got, eager, rtol=1e-4, atol=1e-5)
    # a verify and a commit of all T drafts: the same as T eager steps
    drafts = step_inputs(fam, T=T, g=torch.Generator().manual_seed(50))
    ops.verify(rs, **drafts, state_indices=idx(IDX), backend=backend, **kw)
    ops.commit(rs, idx([T, T]), idx(IDX), backend=backend, **kw)
    for t in range(T):
        ops.eager_step(eager, **{k: (v[:, t] if v.dim() > 1 and k not in ("A", "D", "dt_bias") else v)
                                 for k, v in drafts.items() if v is not None},
                       state_indices=idx(IDX), backend="reference")
    assert torch.allclose(ops.export_state(rs, backend=backend), eager, rtol=1e-4, atol=1e-5)
    assert not ops.export_state(rs, idx([-1, S]), backend=backend).any()


def test_one_signature_shape():
    """Same verbs; backend, options, out and check keyword-only everywhere."""
    for verb in ("allocate", "load_state", "export_state", "entries", "eager_step", "replay_step", "flush",
                 "verify", "commit"):
        for ops in (M, G):
            params = inspect.signature(getattr(ops, verb)).parameters
            for name in ("backend", "options", "out", "check", "spec_window", "scale", "counter", "A"):
                if name in params and not (name == "A" and verb in ("eager_step", "replay_step", "verify")):
                    assert params[name].kind == inspect.Parameter.KEYWORD_ONLY, (ops.__name__, verb, name)
    for verb in ("flush", "commit", "load_state", "export_state"):
        m = [p for p, v in inspect.signature(getattr(M, verb)).parameters.items() if v.kind != v.KEYWORD_ONLY]
        g = [p for p, v in inspect.signature(getattr(G, verb)).parameters.items() if v.kind != v.KEYWORD_ONLY]
        assert m == g, (verb, m, g)
