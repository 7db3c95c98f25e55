"""Mamba-2 eager step (replayssm.mamba2.eager_step, Triton) against the exact reference."""
from __future__ import annotations

import pytest
import torch

from replayssm import inputs as I
from replayssm import mamba2 as M
from replayssm import reference as R
from replayssm.state import ByteCounter, dtype_of

from kernel_checks import DEV, TOL_F32, gen, out_tol, poisoned, rel_err
from .m2_helpers import DEVICES, IDX4, MODEL_DIMS, TINY, ULP, cuda_only, graph_of, params, step_inputs


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block_p,chunks", [(8, 1), (8, 2), (4, 0)])
def test_eager_row_tiling(device, block_p, chunks):
    """head_dim 10 (like 80 scaled down): split heads, two chunks per program with a ragged
    tail, the whole head in one program (options.override("eager", ...))."""
    o = M.Mamba2Options().override("eager", block_p=block_p, chunks=chunks, warps=4)
    shape = I.Mamba2Shape(nheads=2, head_dim=10, d_state=8, n_groups=1)
    g = gen(20)
    idx = torch.tensor([3, 0, -1], dtype=torch.int32, device=device)
    p = params(shape, g)
    st = I.random_state(4, 2, 10, 8, device=device, gen=g)
    sr = st.clone()
    inp = step_inputs(shape, 3, torch.float32, g)
    y = M.eager_step(st, **inp, **p, state_indices=idx, out=poisoned(inp["x"]), options=o)
    yr = R.mamba2_eager_step(sr, **inp, **p, state_indices=idx)
    assert rel_err(y, yr) <= TOL_F32 and rel_err(st, sr) <= TOL_F32


@cuda_only
@pytest.mark.parametrize("model", list(MODEL_DIMS))
@pytest.mark.parametrize("batch", [1, 3, 64, 512])
def test_eager_real_dims_cuda(model, batch):
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
    graph = graph_of(lambda: M.eager_step(scratch, **static, **p, out=out))
    with torch.cuda.graph(graph):
        M.eager_step(st, **static, **p, out=out)
    for t in range(64):
        new = step_inputs(shape, batch, torch.float32, g)
        for k, v in new.items():
            static[k].copy_(v)
        graph.replay()
        yr = R.mamba2_eager_step(sr, **new, **p)
        assert rel_err(out, yr) <= TOL_F32 and rel_err(st, sr) <= TOL_F32, f"graph step {t}"
