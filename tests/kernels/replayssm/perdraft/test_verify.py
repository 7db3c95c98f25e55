"""Per-draft baseline kernels (replayssm.perdraft, backend='triton') against the reference.

On a CPU-only machine the kernels run under TRITON_INTERPRET=1 at tiny shapes; on CUDA the
same tests run on the GPU, plus real model dims and CUDA-graph capture of verify + advance
over 64 rounds with accepted counts from a device tensor.
"""
from __future__ import annotations

import pytest
import torch

from replayssm import inputs as I
from replayssm import perdraft as PD
from replayssm import reference as R

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")

M2 = I.Mamba2Shape(nheads=4, head_dim=5, d_state=8, n_groups=2)      # 2 heads per group, ragged rows
GD = I.GDNShape(num_k_heads=2, num_v_heads=4, head_k_dim=8, head_v_dim=5)
TOL_F32 = 1e-5
TOL_BF16 = 8e-3


def rel_err(a, b) -> float:
    """max |a - b| / max |b|, on the tensors' device (GiB-sized states on a GPU)."""
    a, b = a.float(), b.float()
    assert torch.isfinite(a).all(), "non-finite values in the kernel result"
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))


def _geom(family, shape):
    return (shape.nheads, shape.head_dim, shape.d_state) if family == "mamba2" else \
        (shape.num_v_heads, shape.head_v_dim, shape.head_k_dim)


def _run(family, backend, states, tbl, start, inp, params, out=None):
    if family == "mamba2":
        return PD.mamba2_verify(states, tbl, start, **inp, **params, backend=backend, out=out)
    return PD.gdn_verify(states, tbl, start, **inp, backend=backend, out=out)


def _inputs(family, shape, b, T, act, gen, gate=True):
    if family == "mamba2":
        return I.mamba2_step_inputs(shape, b, T, act_dtype=act, device=DEV, gate=gate, gen=gen)
    return I.gdn_step_inputs(shape, b, T, act_dtype=act, device=DEV, gen=gen)


def _rounds(family, shape, T, state_dtype, act, rounds, seed, gate=True, batch=4, strided=False):
    """`rounds` verify + advance rounds on kernel and reference side by side (random start
    columns, random accepts 0..T, a padded row); returns the worst output / state errors."""
    g = torch.Generator().manual_seed(seed)
    params = {k: v.to(DEV) for k, v in I.mamba2_params(shape, gen=g).items()} if family == "mamba2" else {}
    idx = torch.arange(batch, dtype=torch.int32, device=DEV)
    idx[1] = -1
    tbl = PD.slot_table(idx, T)
    dg = torch.Generator(device=DEV).manual_seed(seed)      # large states are drawn where they live
    init = I.random_state(batch * (T + 1), *_geom(family, shape), dtype=torch.float32, device=DEV, gen=dg)
    sk, sr = init.to(state_dtype).clone(), init.to(state_dtype).clone()
    start = torch.randint(0, T + 1, (batch,), generator=g).to(torch.int32).to(DEV)
    start_r = start.clone()
    y_err = s_err = 0.0
    for _ in range(rounds):
        inp = _inputs(family, shape, batch, T, act, g, gate)
        if strided:   # views with a non-unit batch stride (only the last dim must be contiguous)
            inp = {k: (torch.cat([v, v], 1)[:, :T] if v is not None else None) for k, v in inp.items()}
        out = torch.full_like(inp["x" if family == "mamba2" else "v"], float("nan"))
        yk = _run(family, "triton", sk, tbl, start, inp, params, out=out)
        yr = _run(family, "reference", sr, tbl, start_r, inp, params)
        assert yk is out
        assert torch.all(yk[1] == 0), "padded row must produce 0"
        y_err = max(y_err, rel_err(yk, yr))
        s_err = max(s_err, rel_err(sk, sr))
        sk.copy_(sr)   # re-synchronise (low-precision storage: one rounding flip must not cascade)
        acc = torch.randint(0, T + 1, (batch,), generator=g).to(torch.int32).to(DEV)
        PD.advance(start, acc, T)
        R.perdraft_advance(start_r, acc, T)
        assert torch.equal(start, start_r)
    return y_err, s_err


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("state_dtype,act", [(torch.float32, torch.float32), (torch.float32, torch.bfloat16),
                                             (torch.bfloat16, torch.bfloat16)], ids=["f32", "f32-bf16act", "bf16"])
def test_matches_reference(family, state_dtype, act):
    shape = M2 if family == "mamba2" else GD
    y_err, s_err = _rounds(family, shape, 3, state_dtype, act, rounds=2, seed=1)
    tol_y = TOL_F32 if act == torch.float32 else TOL_BF16
    tol_s = TOL_F32 if state_dtype == torch.float32 else 2.0 ** -7
    assert y_err <= tol_y and s_err <= tol_s, (y_err, s_err)


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_other_windows_no_gate_strided(family):
    shape = M2 if family == "mamba2" else GD
    for T in (1, 4):
        y_err, s_err = _rounds(family, shape, T, torch.float32, torch.float32, rounds=2, seed=2 + T,
                               gate=False, batch=3, strided=True)
        assert y_err <= TOL_F32 and s_err <= TOL_F32, (T, y_err, s_err)


def test_null_destination_is_skipped():
    """A negative destination slot is not written (the rest of the row still is)."""
    g = torch.Generator().manual_seed(3)
    T = 2
    p = {k: v.to(DEV) for k, v in I.mamba2_params(M2, gen=g).items()}
    tbl = PD.slot_table(torch.arange(2, dtype=torch.int32, device=DEV), T)
    tbl[0, 2] = -1
    start = torch.zeros(2, dtype=torch.int32, device=DEV)
    init = I.random_state(2 * (T + 1), *_geom("mamba2", M2), gen=g).to(DEV)
    sk, sr = init.clone(), init.clone()
    inp = _inputs("mamba2", M2, 2, T, torch.float32, g)
    yk = _run("mamba2", "triton", sk, tbl, start, inp, p)
    yr = _run("mamba2", "reference", sr, tbl, start, inp, p)
    assert rel_err(yk, yr) <= TOL_F32 and rel_err(sk, sr) <= TOL_F32
    assert torch.equal(sk[2], init[2])


def test_launch_table_override_and_errors():
    g = torch.Generator().manual_seed(4)
    T = 2
    tbl = PD.slot_table(torch.arange(2, dtype=torch.int32, device=DEV), T)
    start = torch.zeros(2, dtype=torch.int32, device=DEV)
    init = I.random_state(2 * (T + 1), *_geom("gdn", GD), gen=g).to(DEV)
    inp = _inputs("gdn", GD, 2, T, torch.float32, g)
    sk, sr = init.clone(), init.clone()
    opt = PD.PerdraftOptions().override("gdn", BLOCK_R=2, num_warps=1)     # 3 row tiles of dv=5
    yk = PD.gdn_verify(sk, tbl, start, **inp, options=opt)
    yr = PD.gdn_verify(sr, tbl, start, **inp, backend="reference")
    assert rel_err(yk, yr) <= TOL_F32 and rel_err(sk, sr) <= TOL_F32
    with pytest.raises(ValueError, match="slot_table"):
        PD.gdn_verify(sk, tbl[:, :T], start, **inp)
    with pytest.raises(ValueError, match="backend"):
        PD.gdn_verify(sk, tbl, start, **inp, backend="cuda")


# ----------------------------------------------------------------------------- GPU only
REAL = {"nemotron-3-nano-4b": I.Mamba2Shape(96, 80, 128, 8), "qwen3.5-122b": I.GDNShape(16, 64, 128, 128)}


@cuda_only
@pytest.mark.parametrize("model", list(REAL))
@pytest.mark.parametrize("batch", [1, 64, 256])
def test_real_dims_cuda(model, batch):
    family = "mamba2" if "nemotron" in model else "gdn"
    y_err, s_err = _rounds(family, REAL[model], 4, torch.float32, torch.bfloat16, rounds=3, seed=batch,
                           batch=max(batch, 2))
    assert y_err <= TOL_BF16 and s_err <= 1e-4, (y_err, s_err)


@cuda_only
@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_cuda_graph_rounds(family):
    """verify + advance captured once, replayed 64 rounds with new inputs and accepted counts
    copied into static device tensors; equal to the reference round by round."""
    shape = I.Mamba2Shape(128, 64, 128, 8) if family == "mamba2" else I.GDNShape(16, 32, 128, 128)
    batch, T = 16, 4
    g = torch.Generator().manual_seed(81)
    p = {k: v.to(DEV) for k, v in I.mamba2_params(shape, gen=g).items()} if family == "mamba2" else {}
    idx = torch.arange(batch, dtype=torch.int32, device=DEV)
    idx[3] = -1
    tbl = PD.slot_table(idx, T)
    init = I.random_state(batch * (T + 1), *_geom(family, shape), gen=g).to(DEV)
    sk, sr = init.clone(), init.clone()
    start = torch.zeros(batch, dtype=torch.int32, device=DEV)
    start_r = start.clone()
    acc = torch.zeros(batch, dtype=torch.int32, device=DEV)
    static = _inputs(family, shape, batch, T, torch.float32, g)
    out = torch.empty_like(static["x" if family == "mamba2" else "v"])

    def round_():
        _run(family, "triton", sk, tbl, start, static, p, out=out)
        PD.advance(start, acc, T)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):     # warm up (compile) on scratch copies
        keep = (sk.clone(), start.clone())
        round_()
        sk.copy_(keep[0])
        start.copy_(keep[1])
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        round_()
    sk.copy_(init)
    start.zero_()
    for r in range(64):
        new = _inputs(family, shape, batch, T, torch.float32, g)
        for k, v in new.items():
            if v is not None:
                static[k].copy_(v)
        acc.copy_(torch.randint(0, T + 1, (batch,), generator=g).to(torch.int32))
        yr = _run(family, "reference", sr, tbl, start_r, new, p)
        graph.replay()
        R.perdraft_advance(start_r, acc, T)
        assert rel_err(out, yr) <= 1e-4, f"round {r}"
        assert torch.equal(start, start_r)
    assert rel_err(sk, sr) <= 1e-4


_OFFLINE = r"""
import json, torch
from replayssm import inputs as I
from replayssm.perdraft import plan as tk
dev, b = "meta", 256
m2, gd = I.Mamba2Shape(96, 80, 128, 8), I.GDNShape(16, 64, 128, 128)   # Nemotron-3-Nano-4B, Qwen3.5-122B
p = {k: v.to(dev) for k, v in I.mamba2_params(m2).items()}
out = {}
for T, sd in ((8, torch.float32), (4, torch.bfloat16)):
    inp = {k: v.to(dev) for k, v in I.mamba2_step_inputs(m2, b, T, act_dtype=torch.bfloat16).items()}
    S = torch.zeros(b * (T + 1), 96, 80, 128, dtype=sd, device=dev)
    tbl, st = torch.zeros(b, T + 1, dtype=torch.int32, device=dev), torch.zeros(b, dtype=torch.int32, device=dev)
    out[f"mamba2 T{T} {sd}"] = tk.compile_offline(tk.plan_mamba2(S, tbl, st, **inp, **p)[0][0])
for T, bb in ((8, 256), (4, 64), (2, 4)):                 # the three rows of the GDN launch table
    inp = {k: v.to(dev) for k, v in I.gdn_step_inputs(gd, bb, T, act_dtype=torch.bfloat16).items()}
    S = torch.zeros(bb * (T + 1), 64, 128, 128, device=dev)
    tbl, st = torch.zeros(bb, T + 1, dtype=torch.int32, device=dev), torch.zeros(bb, dtype=torch.int32, device=dev)
    out[f"gdn T{T} b{bb}"] = tk.compile_offline(tk.plan_gdn(S, tbl, st, **inp)[0][0])
print(json.dumps(out))
"""


def test_compiles_for_sm90():
    """Both kernels compile for sm_90 at real dims (Triton's LLVM + bundled ptxas, no GPU),
    T = 2..8: no register spills, <= 128 registers."""
    import json
    import os
    import subprocess
    import sys

    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("Triton's bundled ptxas is not available")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", _OFFLINE], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    print(report)
    for name, r in report.items():
        assert r["spill_stores"] == 0 and r["spill_loads"] == 0, f"{name} spills: {r}"
        assert r["regs"] is not None and r["regs"] <= 128, f"{name} uses {r['regs']} registers"
