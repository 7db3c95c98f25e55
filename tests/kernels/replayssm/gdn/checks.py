"""Shared pieces of the GDN kernel tests: shapes, paired kernel / reference states, the state
checks, and `Ops`: replayssm.gdn's ops with explicit GDNOptions (the buffered route unless
route=True; `config` = the per-op table override).

The reference runs in float32 on the same inputs, on a deep copy of the same state. Outputs are
written into NaN-poisoned tensors, so an element the kernel forgets fails. Low-precision
checkpoints are compared within one rounding step of their dtype and then re-synchronised
(kernel -> reference) so that a single rounding flip cannot cascade; every output is still held
to the fp32 tolerance.
"""
from __future__ import annotations

import copy

import torch

from replayssm import gdn as _gdn
from replayssm import inputs as I
from replayssm import reference as R
from replayssm.gdn.options import GDNOptions
from replayssm.state import GDNReplayState

from kernel_checks import DEV, TOL_F32, out_tol, poisoned, random_rows, rel_err

ULP = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float8_e4m3fn: 2.0 ** -4}  # half ulp

TINY = I.GDNShape(num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=5)
GQA = I.GDNShape(num_k_heads=2, num_v_heads=4, head_k_dim=12, head_v_dim=10)   # 2 value heads per key head
TALL = I.GDNShape(num_k_heads=1, num_v_heads=2, head_k_dim=24, head_v_dim=40)    # several row tiles / dk chunks
# rows a multiple of 16: the flush step's chunks lie inside their heads (its TMA stores, ST_TMA)
EVEN = I.GDNShape(num_k_heads=2, num_v_heads=4, head_k_dim=24, head_v_dim=32)
# forces several dv tiles and buffer chunks at the tiny shapes (on CUDA too)
SMALL_TILES = {"BLOCK_V": 4, "BLOCK_L": 2}
QWEN = {"qwen3.5-4b": I.GDNShape(16, 32, 128, 128), "qwen3.5-122b": I.GDNShape(16, 64, 128, 128)}
_OP = {"eager_step": "eager", "replay_step": "replay", "verify": "verify", "commit": "commit", "flush": "fold"}


def opts(op: str | None = None, config: dict | None = None, route: bool = False, **kw) -> GDNOptions:
    """GDNOptions for a test: small-batch routing off unless `route`, `config` as op's override
    (one config serves a test's several ops: each takes the keys it knows)."""
    o = GDNOptions(small_batch_route=route, **kw)
    config = {k: v for k, v in (config or {}).items() if k in GDNOptions.TUNABLE.get(op, ())}
    return o.override(op, **config) if config else o


class Ops:
    """replayssm.gdn's ops taking `config=` (op override) and passing GDNOptions."""

    def __init__(self, route: bool = False, **kw):
        self.route, self.kw = route, kw

    def __getattr__(self, name):
        fn = getattr(_gdn, name)
        if name not in _OP:
            return fn

        def call(*a, config=None, **kw):
            if kw.get("backend") == "reference":
                return fn(*a, **kw)
            return fn(*a, options=opts(_OP[name], config, self.route, **self.kw), **kw)
        return call


GD = Ops()                  # the buffered route at every batch (the reference's state layout)
SHIPPED = Ops(route=True)   # the table's small-batch routes


# ----------------------------------------------------------------------------- helpers
def step_inputs(shape, batch, act, g, T=None):
    return {k: v.to(DEV) for k, v in I.gdn_step_inputs(shape, batch, T=T, act_dtype=act, gen=g).items()}


def make_pair(shape, slots, L, K, mode="replay", state_dtype="float32", lo_dtype=None, act=torch.float32,
              g=None, cursor_hi=None):
    """(kernel state, reference state): identical, with a random checkpoint, random cursors in
    [0, cursor_hi] (default K-1) and every buffer row filled with finite values (rows past a
    cursor are garbage that must be ignored)."""
    Hk, Hv, dk, dv = shape.num_k_heads, shape.num_v_heads, shape.head_k_dim, shape.head_v_dim
    rs = GDNReplayState.allocate(slots, Hk, Hv, dk, dv, L, K, mode=mode, state_dtype=state_dtype,
                                 lo_dtype=lo_dtype, act_dtype=act, device=DEV)
    every = torch.arange(slots, device=DEV)
    s0 = I.random_state(slots, Hv, dv, dk, device=DEV, gen=g)
    rs.hi.write(every, s0)
    if rs.lo is not None:
        rs.lo.write(every, s0)
    hi = K - 1 if cursor_hi is None else cursor_hi
    rs.cursor.copy_(torch.randint(0, hi + 1, (slots,), generator=g).to(torch.int32))
    rnd = lambda t, s=1.0: torch.randn(t.shape, generator=g, dtype=torch.float64).mul(s).to(t.dtype)  # noqa: E731
    uni = lambda t: torch.rand(t.shape, generator=g, dtype=torch.float64)  # noqa: E731
    rs.u.copy_(rnd(rs.u, 0.3))
    rs.k.copy_(rnd(rs.k))
    rs.g.copy_(torch.log(0.9 + 0.1 * uni(rs.g)).to(rs.g.dtype))
    if rs.v is not None:
        rs.v.copy_(rnd(rs.v))
        rs.beta.copy_((0.05 + 0.9 * uni(rs.beta)).to(rs.beta.dtype))
    return rs, copy.deepcopy(rs)


def ckpt_check(a, b, what: str) -> None:
    """Kernel checkpoint a vs reference b (state.Checkpoint), dequantised; fp32: norm-wise
    relative error (max |a - b| / max |b|) within TOL_F32; low precision: every element within
    one rounding step (+ a tiny slack for the fp32 sum order). Compared in fp64 a block of
    slots at a time, so a GiB-sized state (batch 512 at real dims) needs a few hundred MiB of
    temporaries, not ten times its size (GPU tests share one GPU between workers)."""
    n = a.data.shape[0]
    per = max(1, (1 << 25) // max(1, a.data[0].numel()))
    if a.scale is not None:   # fp8: the scales themselves
        assert rel_err(a.scale, b.scale) <= 1e-5, f"{what}: fp8 scales differ"
    diff = ref = 0.0
    bad = 0
    for s0 in range(0, n, per):
        rows = torch.arange(s0, min(n, s0 + per), device=a.data.device)
        x, y = a.read(rows, torch.float32).double(), b.read(rows, torch.float32).double()
        assert torch.isfinite(x).all(), f"{what}: non-finite"
        if a.data.dtype in (torch.float32, torch.float64):
            diff, ref = max(diff, float((x - y).abs().max())), max(ref, float(y.abs().max()))
            continue
        slack = 1e-5 * y.abs().amax(dim=-1, keepdim=True)
        step = 2 * ULP[a.data.dtype] * y.abs()
        if a.scale is not None:   # fp8: subnormal spacing of the row scale
            step = step + b.scale[rows].double()[..., None] * 2.0 ** -9
        bad += int(((x - y).abs() > step + slack).sum())
    if a.data.dtype in (torch.float32, torch.float64):
        err = diff / max(ref, 1e-30)
        assert err <= TOL_F32, f"{what}: rel err {err:.3g}"
    assert not bad, f"{what}: {bad} elements off by more than one rounding step"


def resync(rs, rr) -> None:
    """Copy the kernel's low-precision checkpoints into the reference (after checking them)."""
    for a, b in ((rs.hi, rr.hi), (rs.lo, rr.lo)):
        if a is not None and a.data.dtype not in (torch.float32, torch.float64):
            b.data.copy_(a.data)
            if a.scale is not None:
                b.scale.copy_(a.scale)


def state_check(rs, rr, what: str) -> None:
    assert torch.equal(rs.cursor, rr.cursor), f"{what}: cursor {rs.cursor.tolist()} != {rr.cursor.tolist()}"
    ckpt_check(rs.hi, rr.hi, f"{what}: hi")
    if rs.lo is not None:
        ckpt_check(rs.lo, rr.lo, f"{what}: lo")
    for name in ("k", "g", "v", "beta"):
        a, b = getattr(rs, name), getattr(rr, name)
        if a is not None:
            assert torch.equal(a, b), f"{what}: buffer {name} differs"
    assert rel_err(rs.u, rr.u) <= TOL_F32, f"{what}: buffer u rel err {rel_err(rs.u, rr.u):.3g}"
    resync(rs, rr)



def random_steps(rs, rr, sh, slots: int, batch: int, act, g, steps: int, cfg=None, what: str = "") -> int:
    """Drive kernel and reference states `steps` replay steps over random rows (some padded):
    outputs (poisoned out), padded rows' zeros and the state checked every step. Returns how
    many sequence steps flushed."""
    flushes = 0
    for step in range(steps):
        idx = random_rows(slots, batch, g)
        x = step_inputs(sh, batch, act, g)
        live = idx[idx >= 0].long()
        flushes += int((rr.cursor[live] + 1 >= rr.flush_period).sum())
        o = GD.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]), config=cfg)
        o_ref = R.gdn_replay_step(rr, **x, state_indices=idx)
        assert rel_err(o, o_ref) <= out_tol(act), f"{what} step {step}: {rel_err(o, o_ref):.3g}"
        assert (o[idx < 0] == 0).all()
        state_check(rs, rr, f"{what} step {step}")
    return flushes

