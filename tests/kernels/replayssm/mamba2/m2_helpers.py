"""What the Mamba-2 kernel tests share: paired kernel / reference states, their comparison
within one rounding step of the storage dtype, and the step / verify-commit drivers. Kernel
tests pass options explicitly; BUFFERED turns the small-batch route off, so every step buffers
as the reference does unless a test asks for a route."""
from __future__ import annotations

import copy

import pytest
import torch

from replayssm import inputs as I
from replayssm import mamba2 as M
from replayssm import reference as R
from replayssm.mamba2.options import Mamba2Options
from replayssm.state import Mamba2ReplayState

from kernel_checks import CUDA, DEV, TOL_F32, gen, out_tol, poisoned, rel_err  # noqa: F401

BUFFERED = Mamba2Options(small_batch_route=False)
DEVICES = [pytest.param(DEV, id=DEV)]

ULP = {torch.bfloat16: 2.0 ** -7, torch.float16: 2.0 ** -10, torch.float8_e4m3fn: 2.0 ** -3}

TINY = I.Mamba2Shape(nheads=4, head_dim=5, d_state=8, n_groups=2)   # 2 heads per group
IDX4 = [5, -1, 2, 0]   # permuted slots, one padded row; slots 1, 3, 4, 6 are never addressed


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


def run_steps(rs, rr, shape, idx, steps, act, g, gate=True, what="", options=None):
    """Drive both states `steps` steps; compare outputs (poisoned out) and state every step.
    options: the kernels' (default BUFFERED: the reference buffers every step)."""
    options = BUFFERED if options is None else options
    p = params(shape, g)
    flushes = 0
    for t in range(steps):
        inp = step_inputs(shape, idx.shape[0], act, g, gate=gate)
        live = idx[idx >= 0].long()
        flushes += int((rr.cursor[live] + 1 >= rr.flush_period).sum())
        out = poisoned(inp["x"])
        y = M.replay_step(rs, **inp, **p, state_indices=idx, out=out, options=options)
        assert y is out
        yr = R.mamba2_replay_step(rr, **inp, **p, state_indices=idx)
        assert rel_err(y, yr) <= out_tol(act), f"{what} step {t}: y rel err {rel_err(y, yr):.3g}"
        assert (y[idx < 0] == 0).all(), "padded rows must output 0"
        state_check(rs, rr, f"{what} step {t}")
        if low_precision(rs):
            resync(rs, rr)
    return flushes



def verify_commit_cycles(device, shape, name, mode, sd, lo, act, T, options=None):
    """Three rounds of verify T drafts -> commit random accepted counts, a plain step between
    the first two, each checked against the reference (outputs, drafts in the buffer, state)."""
    K, L = 3, 3 + T
    g = gen(60)
    rs, rr = make_pair(shape, 7, L, K, mode, sd, lo, act, g)
    p = params(shape, g)
    idx = torch.tensor(IDX4, dtype=torch.int32, device=device)
    for cycle in range(3):
        if cycle == 1:   # a plain step between speculative rounds
            run_steps(rs, rr, shape, idx, 1, act, g, what=f"{name} plain", options=options)
        inp = step_inputs(shape, 4, act, g, T=T)
        out = poisoned(inp["x"])
        y = M.verify(rs, **inp, **p, state_indices=idx, out=out, options=options)
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
        M.commit(rs, acc, state_indices=idx, A=p["A"], options=options)
        R.mamba2_commit(rr, p["A"], acc, state_indices=idx)
        state_check(rs, rr, f"{name} cycle {cycle}: commit")
        if low_precision(rs):
            resync(rs, rr)


MODEL_DIMS = {   # MODELS.md
    "nemotron-3-nano-4b": I.Mamba2Shape(nheads=96, head_dim=80, d_state=128, n_groups=8),
    "nemotron-3-super-120b": I.Mamba2Shape(nheads=128, head_dim=64, d_state=128, n_groups=8),
}
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU (real dims, CUDA graphs)")



def graph_of(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()            # compile + warm up outside the capture (on scratch state)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    return g


