"""Gated DeltaNet Triton kernels (replayssm.gdn, backend='triton') against the exact reference.

On a CPU-only machine the kernels run under TRITON_INTERPRET=1 (conftest.py) at tiny shapes
(non-power-of-2 dk/dv, GQA, several dv tiles and buffer chunks via launch-config overrides);
on CUDA the same tests run on the GPU, plus the real Qwen3.5 dims at batch 1..512 and
CUDA-graph capture/replay over >= 64 steps spanning flushes. A CPU-side test compiles every
kernel for sm_90 (Triton's bundled ptxas) and checks registers/spills.

The reference runs in float32 on the same inputs, on a deep copy of the same state.
Outputs are written into NaN-poisoned tensors, so an element the kernel forgets fails.
Low-precision checkpoints are compared within one rounding step of their dtype and then
re-synchronised (kernel -> reference) so that a single rounding flip cannot cascade; every
output is still held to the fp32 tolerance.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

from replayssm import gdn as GD
from replayssm import inputs as I
from replayssm import reference as R
from replayssm.state import CURSOR_MASK, ByteCounter, GDNReplayState

from kernel_checks import CUDA, DEV, TOL_BF16_OUT, TOL_F32, check_epoch_wrap, check_route_words, gen, out_tol, \
    poisoned, random_rows, rel_err


ULP = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11, torch.float8_e4m3fn: 2.0 ** -4}  # half ulp

TINY = I.GDNShape(num_k_heads=1, num_v_heads=2, head_k_dim=8, head_v_dim=5)
GQA = I.GDNShape(num_k_heads=2, num_v_heads=4, head_k_dim=12, head_v_dim=10)   # 2 value heads per key head
TALL = I.GDNShape(num_k_heads=1, num_v_heads=2, head_k_dim=24, head_v_dim=40)    # several row tiles / dk chunks
# rows a multiple of 16: the flush step's chunks lie inside their heads (its TMA stores, ST_TMA)
EVEN = I.GDNShape(num_k_heads=2, num_v_heads=4, head_k_dim=24, head_v_dim=32)
# forces several dv tiles and buffer chunks at the tiny shapes (on CUDA too)
SMALL_TILES = {"BLOCK_V": 4, "BLOCK_L": 2}


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


# ----------------------------------------------------------------------------- eager
@pytest.mark.parametrize("config", [{"BLOCK_V": 4},
                                    # two tiles a program, no eviction hints: dv 10 leaves the second
                                    # program's second tile wholly masked
                                    {"BLOCK_V": 4, "TILES": 2, "LOAD_EV": "", "STORE_EV": "evict_last"}],
                         ids=["tile", "tiles2"])
@pytest.mark.parametrize("state_dtype,act", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                             (torch.float16, torch.float32)], ids=["f32", "bf16", "f16-state"])
def test_eager_matches_reference(state_dtype, act, config):
    g = gen(1)
    sh = GQA
    Hk, Hv, dk, dv = sh.num_k_heads, sh.num_v_heads, sh.head_k_dim, sh.head_v_dim
    st = I.random_state(6, Hv, dv, dk, dtype=state_dtype, device=DEV, gen=g)
    st_ref = st.clone()
    idx = torch.tensor([4, -1, 0, 2], dtype=torch.int32, device=DEV)
    for step in range(2):
        x = step_inputs(sh, 4, act, g)
        if step == 1:   # strided q/k/v views of one packed projection, as the decode layer passes them
            packed = torch.cat([x["q"].flatten(1), x["k"].flatten(1), x["v"].flatten(1)], 1)
            x["q"] = packed[:, :Hk * dk].view(4, Hk, dk)
            x["k"] = packed[:, Hk * dk:2 * Hk * dk].view(4, Hk, dk)
            x["v"] = packed[:, 2 * Hk * dk:].view(4, Hv, dv)
        out = poisoned(torch.empty(4, Hv, dv, dtype=act, device=DEV))
        o = GD.eager_step(st, **x, state_indices=idx, out=out, config=config)
        o_ref = R.gdn_eager_step(st_ref, **x, state_indices=idx)
        assert o is out
        assert rel_err(o, o_ref) <= out_tol(act), f"step {step}: {rel_err(o, o_ref):.3g}"
        assert (o[1] == 0).all(), "padded row must be 0"
        if state_dtype == torch.float32:
            assert rel_err(st, st_ref) <= TOL_F32
        else:
            bad = (st.double() - st_ref.double()).abs() > 2 * ULP[state_dtype] * st_ref.double().abs() + 1e-6
            assert not bad.any()
            st_ref.copy_(st)
        assert torch.equal(st[[1, 3, 5]], st_ref[[1, 3, 5]]), "untouched slots changed"


def test_eager_config_errors_name_the_key():
    st = torch.zeros(2, TINY.num_v_heads, TINY.head_v_dim, TINY.head_k_dim, device=DEV)
    x = step_inputs(TINY, 2, torch.float32, gen(3))
    with pytest.raises(ValueError, match="TILES=3: allowed 1, 2"):
        GD.eager_step(st, **x, config={"TILES": 3})
    with pytest.raises(ValueError, match="LOAD_EV='evict_normal'"):
        GD.eager_step(st, **x, config={"LOAD_EV": "evict_normal"})


def test_eager_default_config_and_no_indices():
    g = gen(2)
    st = I.random_state(3, TINY.num_v_heads, TINY.head_v_dim, TINY.head_k_dim, device=DEV, gen=g)
    st_ref = st.clone()
    x = step_inputs(TINY, 3, torch.float32, g)
    o = GD.eager_step(st, **x, scale=0.3)
    o_ref = R.gdn_eager_step(st_ref, **x, scale=0.3)
    assert rel_err(o, o_ref) <= TOL_F32 and rel_err(st, st_ref) <= TOL_F32


# ----------------------------------------------------------------------------- replay
REPLAY_CASES = [
    # id, shape, mode, state_dtype, lo_dtype, act, L, K, config
    # (replay configs: BLOCK_V rows per chunk, NR chunks and HP value heads per program, SPLIT: a
    #  second launch folds and moves the cursor, PREFETCH: cursor-independent buffer reads)
    ("f32-chunks", TINY, "replay", "float32", None, torch.float32, 6, 4, {"BLOCK_V": 4, "NR": 2, "HP": 2}),
    ("f32-gqa-split", GQA, "replay", "float32", None, torch.float32, 4, 3,
     {"BLOCK_V": 4, "NR": 2, "HP": 2, "SPLIT": True}),
    # the output route's chunk loop software-pipelined (cp.async), and its fp32 chunks through TMA
    ("f32-gqa-split-pipelined", GQA, "replay", "float32", None, torch.float32, 4, 3,
     {"BLOCK_V": 4, "NR": 2, "HP": 2, "SPLIT": True, "LOOP_STAGES": 3, "PF": 0}),
    ("f32-tall-split-tma", TALL, "replay", "float32", None, torch.bfloat16, 6, 4,
     {"BLOCK_V": 8, "NR": 2, "SPLIT": True, "TMA": True, "LOOP_STAGES": 3, "PF": 0}),
    ("dual-bf16-tall-split-tma", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 6, 4,
     {"BLOCK_V": 8, "NR": 2, "SPLIT": True, "TMA": True, "PF": 0, "F_BLOCK_V": 16, "F_NR": 2}),
    ("f32-tall-split-tma-flush", TALL, "replay", "float32", None, torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 2, "F_FOLD_MMA": True, "F_TMA": True}),
    ("dual-bf16-tall-split-tma-flush", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 2, "F_FOLD_MMA": True, "F_TMA": True}),
    ("bf16-state-tall-split-tma", TALL, "replay", "bfloat16", None, torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "TMA": True, "PF": 0, "F_BLOCK_V": 16}),
    ("dual-bf16-split-pipelined", TINY, "dual", "float32", "bfloat16", torch.float32, 4, 3,
     {"BLOCK_V": 4, "NR": 2, "SPLIT": True, "LOOP_STAGES": 2, "F_NR": 2, "F_BLOCK_V": 2}),
    ("bf16-state-split", TINY, "replay", "bfloat16", None, torch.bfloat16, 4, 3,
     {"BLOCK_V": 4, "SPLIT": True, "PREFETCH": True, "F_BLOCK_V": 8, "F_HP": 2}),
    ("dual-bf16-split", TINY, "dual", "float32", "bfloat16", torch.float32, 4, 3,
     {"BLOCK_V": 4, "NR": 2, "SPLIT": True, "F_NR": 2, "F_BLOCK_V": 2}),
    ("dual-f16-KeqL", TINY, "dual", "float32", "float16", torch.bfloat16, 3, 3, None),
    ("dual-fp8", TINY, "dual", "float32", "float8_e4m3", torch.float32, 4, 3, {"BLOCK_V": 8, "PREFETCH": True}),
    ("dual-fp8-gqa-split", GQA, "dual", "float32", "float8_e4m3", torch.float32, 4, 3,
     {"BLOCK_V": 8, "HP": 2, "SPLIT": True}),
    ("shared-bf16", TINY, "shared-low", "float32", "bfloat16", torch.float32, 4, 3, None),
    ("shared-fp8", TINY, "shared-low", "float32", "float8_e4m3", torch.float32, 4, 3, {"HP": 2, "SPLIT": True}),
    # flush step with the fold as one matrix product per chunk; one worker (batch 3 < K) visits several ranks
    ("f32-tall-split-foldmma", TALL, "replay", "float32", None, torch.float32, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 2, "F_FOLD_MMA": True}),
    ("f32-gqa-split-foldmma-bf16", GQA, "replay", "float32", None, torch.bfloat16, 5, 4,
     {"BLOCK_V": 8, "SPLIT": True, "F_BLOCK_V": 16, "F_HP": 2, "F_FOLD_MMA": True}),
    # 16-bit high copy: the same product, quantised on store
    ("bf16-state-tall-split-foldmma", TALL, "replay", "bfloat16", None, torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 2, "F_FOLD_MMA": True}),
    # four chunks per program (the 16-bit rows above 4096 batch x heads) with the bf16x3e fold
    ("bf16-state-tall-split-foldmma-nr4", TALL, "replay", "bfloat16", None, torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 4, "F_FOLD_MMA": True, "F_FOLD_PREC": "bf16x3e"}),
    # dual: u recomputed against the high copy by the triangular solve, low copy refreshed
    # (long flush periods: test_flush_step_fold_mma_long_windows)
    ("dual-bf16-tall-split-foldmma", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 2, "F_FOLD_MMA": True}),
    # four chunks per program (the dual rows from batch x heads 2049 to 4096), the last one past dv
    ("dual-bf16-tall-split-foldmma-nr4", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 4, "F_FOLD_MMA": True}),
    ("dual-fp8-gqa-split-foldmma", GQA, "dual", "float32", "float8_e4m3", torch.float32, 4, 3,
     {"BLOCK_V": 8, "SPLIT": True, "F_BLOCK_V": 16, "F_HP": 2, "F_FOLD_MMA": True}),
    # the state x raw-keys products as three bf16 terms of the fp32 side (mma "bf16x3e"; bf16 keys)
    ("dual-bf16-tall-split-foldmma-bf16x3e", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 4, "F_FOLD_MMA": True, "F_P_PREC": "bf16x3e",
      "F_FOLD_PREC": "bf16x3e"}),
    # and the triangular solve's small fp32 products as six bf16 MMAs (mma "bf16x6", session 27)
    ("dual-bf16-tall-split-foldmma-bf16x6", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 4, "F_FOLD_MMA": True, "F_P_PREC": "bf16x3e",
      "F_FOLD_PREC": "bf16x3e", "F_SMALL_PREC": "bf16x6"}),
    ("f32-gqa-split-foldmma-bf16x3e", GQA, "replay", "float32", None, torch.bfloat16, 5, 4,
     {"BLOCK_V": 8, "SPLIT": True, "F_BLOCK_V": 16, "F_HP": 2, "F_FOLD_MMA": True, "F_FOLD_PREC": "bf16x3e"}),
    # session 25: the flush step's stores through TMA too (ST_TMA: high copy, 16-bit low copy; an
    # fp8 low copy keeps its pointer stores), pipelined
    ("f32-even-split-tma-flush-st", EVEN, "replay", "float32", None, torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 2, "F_FOLD_MMA": True, "F_TMA": True, "F_ST_TMA": True}),
    ("bf16-state-even-split-tma-flush-st", EVEN, "replay", "bfloat16", None, torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 2, "F_FOLD_MMA": True, "F_TMA": True, "F_ST_TMA": True}),
    ("dual-bf16-even-split-tma-flush-st", EVEN, "dual", "float32", "bfloat16", torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 2, "F_FOLD_MMA": True, "F_TMA": True, "F_ST_TMA": True,
      "F_num_stages": 2, "F_P_PREC": "bf16x3e", "F_FOLD_PREC": "bf16x3e"}),
    ("dual-fp8-even-split-tma-flush-st", EVEN, "dual", "float32", "float8_e4m3", torch.float32, 4, 3,
     {"BLOCK_V": 8, "SPLIT": True, "F_BLOCK_V": 16, "F_HP": 2, "F_FOLD_MMA": True, "F_TMA": True, "F_ST_TMA": True}),
    # session 26: a 16-bit read copy's dots as one tensor-core product per chunk (RD_MMA: k and q
    # as three 16-bit terms each), through TMA or pointers, split or fused, pipelined, rows past
    # dv, bf16 and fp16
    ("dual-bf16-tall-split-mma-tma", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "NR": 2, "SPLIT": True, "TMA": True, "PF": 0, "RD_MMA": True, "F_BLOCK_V": 16}),
    ("bf16-state-tall-split-mma-tma-pipelined", TALL, "replay", "bfloat16", None, torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "HP": 2, "SPLIT": True, "TMA": True, "PF": 0, "RD_MMA": True, "LOOP_STAGES": 2,
      "F_BLOCK_V": 16}),
    ("dual-bf16-gqa-fused-mma", GQA, "dual", "float32", "bfloat16", torch.float32, 5, 3,
     {"BLOCK_V": 16, "HP": 2, "RD_MMA": True}),
    ("dual-f16-tall-split-mma-tma", TALL, "dual", "float32", "float16", torch.float32, 6, 4,
     {"BLOCK_V": 16, "NR": 2, "SPLIT": True, "TMA": True, "PF": 0, "RD_MMA": True, "F_BLOCK_V": 16}),
    ("shared-bf16-tall-split-mma", TALL, "shared-low", "float32", "bfloat16", torch.float32, 6, 4,
     {"BLOCK_V": 16, "NR": 2, "SPLIT": True, "RD_MMA": True, "F_BLOCK_V": 16}),
    # the rank-1 folds (FOLD_MMA off) at tiles FOLD_MMA would take, now that FOLD_MMA is the default
    ("f32-tall-split-rank1", TALL, "replay", "float32", None, torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_FOLD_MMA": False}),
    ("dual-bf16-tall-split-rank1", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_FOLD_MMA": False}),
    # the two-pass dual kernel as the flush step (opt-in F_TWO_PASS; the commit's by default): the
    # rows found by scanning the step's cursors, the output rewritten; row tiles, dk steps, GQA
    ("dual-bf16-tall-split-2pass", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_CHUNK_K": 16, "F_TWO_PASS": True}),
    ("dual-f16-gqa-split-2pass", GQA, "dual", "float32", "float16", torch.float32, 5, 3,
     {"BLOCK_V": 8, "SPLIT": True, "F_BLOCK_V": 16, "F_TWO_PASS": True}),
]
FOLD_ROUTE_CASES = [c for c in REPLAY_CASES if "F_FOLD_MMA" in (c[-1] or {}) or "F_TWO_PASS" in (c[-1] or {})]


@pytest.mark.parametrize("case", FOLD_ROUTE_CASES, ids=[c[0] for c in FOLD_ROUTE_CASES])
def test_fold_route_cases_take_that_route(case):
    # else the replay test would pass on the other fold and prove nothing about the one named
    name, sh, mode, sd, lo, act, L, K, cfg = case
    rs, _ = make_pair(sh, 4, L, K, mode, sd, lo, act, gen(3))
    x = step_inputs(sh, 3, act, gen(4))
    from replayssm.triton import gdn as TK
    plans = TK.plan_replay(rs, **x, state_indices=None, scale=0.3, o=x["v"], config=cfg)
    assert len(plans) == 2, name
    if cfg.get("F_TWO_PASS"):   # the two-pass dual kernel: the step's rows scanned, outputs rewritten
        assert plans[1][0] is TK._gdn_dual_2pass_kernel and plans[1][3]["WRITE_O"] and not plans[1][3]["COMPACT"]
    else:
        assert bool(plans[1][3].get("FOLD_MMA")) is cfg["F_FOLD_MMA"], name


def test_verify_precision_defaults(monkeypatch):
    # fp32 state x bf16 keys: the two-pass truncation split; small fp32 products: three passes;
    # VERIFY_F32_PRECISION names one precision for all of them instead
    from replayssm.triton import gdn as TK
    for act, s_want in ((torch.bfloat16, "tf32x2t"), (torch.float32, "tf32x3t")):
        rs, _ = make_pair(GQA, 3, 7, 3, "replay", "float32", None, act, gen(3))
        x = step_inputs(GQA, 3, act, gen(4), T=4)
        meta = TK.plan_verify(rs, **x, state_indices=None, scale=0.3, o=x["v"])[3]
        assert (meta["S_PREC"], meta["SMALL_PREC"]) == (s_want, "tf32x3t"), act
    monkeypatch.setattr(TK, "VERIFY_F32_PRECISION", "tf32x3")
    meta = TK.plan_verify(rs, **x, state_indices=None, scale=0.3, o=x["v"])[3]
    assert (meta["S_PREC"], meta["SMALL_PREC"], meta["K_PREC"]) == ("tf32x3",) * 3


def test_fold_mma_is_the_default_for_16_and_32_bit_high_copies():
    from replayssm.triton import gdn as TK
    for mode, sd, lo in (("replay", "float32", None), ("dual", "float32", "bfloat16"),
                         ("dual", "float32", "float8_e4m3"), ("replay", "bfloat16", None)):
        rs, _ = make_pair(TALL, 4, 6, 4, mode, sd, lo, torch.bfloat16, gen(3))
        x = step_inputs(TALL, 3, torch.bfloat16, gen(4))
        plans = TK.plan_replay(rs, **x, state_indices=None, scale=0.3, o=x["v"],
                               config={"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16})
        assert plans[1][3].get("FOLD_MMA") is True, (mode, sd, lo)


def _flush_nr(shape, batch, mode="replay", state_dtype="float32", cfg=None) -> int:
    """Chunks per program of the SPLIT step's flush launch for a state of `shape` at `batch`."""
    from replayssm.triton import gdn as TK
    rs = GDNReplayState.allocate(1, shape.num_k_heads, shape.num_v_heads, shape.head_k_dim, shape.head_v_dim, 16, 16,
                                 mode=mode, state_dtype=state_dtype, lo_dtype="bfloat16" if mode == "dual" else None,
                                 device="meta")
    return TK._flush_step_row(rs, batch, "flush_step", cfg).get("NR", 1)


def test_flush_step_rows():
    """The SPLIT step's flush launch, keyed by batch x value heads (the flushing heads per step):
    one 32-row chunk per program up to 2048, two above for fp32 high copies; for 16-bit ones two
    up to 4096 and four above (the f32-tall-split-foldmma and nr4 cases run those folds against
    the reference); 32-row chunks."""
    from replayssm.triton import gdn as TK
    q4b, q122b = QWEN["qwen3.5-4b"], QWEN["qwen3.5-122b"]
    assert [_flush_nr(q4b, b) for b in (1, 64, 65, 512)] == [1, 1, 2, 2]
    assert [_flush_nr(q122b, b) for b in (32, 33, 64)] == [1, 2, 2]
    assert [_flush_nr(q4b, b, state_dtype="bfloat16") for b in (64, 65, 128, 129)] == [1, 2, 2, 4]
    assert [_flush_nr(q122b, b, state_dtype="bfloat16") for b in (32, 33, 64, 65)] == [1, 2, 2, 4]
    assert TK.pick_config("flush_step", 256, 128, 128, 16)["BLOCK_V"] == 32


def test_dual_flush_step_rows():
    """The dual flush step's chunks per program follow batch x value heads too: one 16-row chunk
    up to 1024, two up to 2048, half a head (4 chunks) up to 4096, a whole head above; a per-call
    F_ key still wins."""
    q4b, q122b = QWEN["qwen3.5-4b"], QWEN["qwen3.5-122b"]
    assert [_flush_nr(q4b, b, "dual") for b in (32, 33, 64, 65, 128, 129, 256)] == [1, 2, 2, 4, 4, 8, 8]
    assert [_flush_nr(q122b, b, "dual") for b in (16, 17, 32, 33, 64, 65, 128)] == [1, 2, 2, 4, 4, 8, 8]
    assert _flush_nr(q4b, 128, "dual", cfg={"F_NR": 2}) == 2


@pytest.mark.parametrize("act,want", [(torch.bfloat16, ("bf16x3e", "bf16x3e")), (torch.float16, ("tf32x3", "tf32x2t")),
                                      (torch.float32, ("tf32x3", "tf32x3t"))])
def test_flush_step_key_products_by_key_dtype(act, want):
    """want: (FOLD_PREC, dual P_PREC). The flush step's products against the raw keys (dual:
    S_0 Kb^T, P_PREC; every fold: FOLD_PREC) take three bf16 terms of the fp32 side ("bf16x3e")
    only where the keys are exact in bf16; fp16 / fp32 keys fall back to the truncation split /
    Triton's "tf32x3". The dual rows pipeline their chunk loop at depth 3 (session 25; before,
    with pointer loads, at depth 1) and store through TMA."""
    from replayssm.triton import gdn as TK
    Hk, Hv, dk, dv, batch = 16, 64, 128, 128, 256
    e = lambda *s, dt=act: torch.empty(batch, *s, dtype=dt, device="meta")
    x = dict(q=e(Hk, dk), k=e(Hk, dk), v=e(Hv, dv), g=e(Hv, dt=torch.float32), beta=e(Hv, dt=torch.float32))
    for mode, sd in (("dual", "float32"), ("replay", "float32"), ("replay", "bfloat16")):
        rs = GDNReplayState.allocate(batch, Hk, Hv, dk, dv, 16, 16, mode=mode, state_dtype=sd, act_dtype=act,
                                     lo_dtype="bfloat16" if mode == "dual" else None, device="meta")
        meta = TK.plan_replay(rs, **x, state_indices=None, scale=.1, o=x["v"])[-1][3]
        assert meta["FOLD_MMA"] and meta["FOLD_PREC"] == want[0], (mode, sd)
        if mode == "dual":
            assert meta["P_PREC"] == want[1]
            assert meta["num_stages"] == 3 and meta["ST_TMA"] is True


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


@pytest.mark.parametrize("case", REPLAY_CASES, ids=[c[0] for c in REPLAY_CASES])
def test_replay_matches_reference(case):
    name, sh, mode, sd, lo, act, L, K, cfg = case
    g = gen(3)
    slots = 4
    batch = 2 if sh is GQA else 3
    rs, rr = make_pair(sh, slots, L, K, mode, sd, lo, act, g)
    flushes = random_steps(rs, rr, sh, slots, batch, act, g, 8 if sh is TINY else 6, cfg, name)
    assert flushes >= 3, f"only {flushes} flush steps exercised"


@pytest.mark.parametrize("mode,sd,lo,batch", [("replay", "float32", None, 20), ("replay", "bfloat16", None, 40),
                                               ("dual", "float32", "bfloat16", 12), ("dual", "float32", "float8_e4m3", 12),
                                               ("dual", "float32", "float16", 40)],
                         ids=["f32-b20", "bf16-state-b40", "dual-bf16-b12", "dual-fp8-b12", "dual-f16-b40"])
def test_table_rows_read_through_tma(mode, sd, lo, batch):
    # session 24: the table's buffered rows read the state chunks through a TMA descriptor (fp32
    # from batch 17, 16/8-bit copies from batch 9), and the flush step its high chunks; with the
    # table's own rows, against the reference (dual 16-bit copies: since session 26 their rows read
    # the low copy's dots by MMA, RD_MMA)
    from replayssm.triton import gdn as TK
    g = gen(13)
    slots, K = batch + 4, 3
    # (rows of 8-bit words: 32 B; heads of 48 rows, a whole number of the dual flush step's 16-row
    # chunks, which since session 25 store through TMA too)
    sh = I.GDNShape(num_k_heads=1, num_v_heads=2, head_k_dim=32, head_v_dim=48)
    rs, rr = make_pair(sh, slots, 4, K, mode, sd, lo, torch.bfloat16, g)
    x = step_inputs(sh, batch, torch.bfloat16, g)
    plans = TK.plan_replay(rs, **x, state_indices=None, scale=0.3, o=x["v"])
    assert plans[0][3]["TMA"] is True and plans[1][3]["TMA"] is True     # the flush step's high chunks too
    assert plans[1][3]["ST_TMA"] is (mode == "dual")
    assert plans[0][3]["RD_MMA"] is (mode == "dual" and lo in ("bfloat16", "float16"))
    assert random_steps(rs, rr, sh, slots, batch, torch.bfloat16, g, 4) >= 3


@pytest.mark.parametrize("lo,batch", [("bfloat16", 100), ("float16", 130)], ids=["bf16-b100", "f16-b130"])
def test_dual_rows_take_the_low_copys_dots_as_mma(lo, batch):
    # session 26: from batch 9 a dual state's 16-bit low copy is read through its own table
    # rows (replay_dual:2), its dots one tensor-core product per chunk (RD_MMA), through TMA; a
    # bf16 state keeps replay:2's rows. (test_table_rows_read_through_tma runs these rows against
    # the reference at batch 12 and 40; at these small heads the rows above batch 128 differ from
    # them only in their register budget)
    from replayssm.triton import gdn as TK
    g = gen(17)
    sh = I.GDNShape(num_k_heads=1, num_v_heads=2, head_k_dim=32, head_v_dim=48)
    rs, _ = make_pair(sh, batch, 4, 3, "dual", "float32", lo, torch.bfloat16, g)
    x = step_inputs(sh, batch, torch.bfloat16, g)
    meta = TK.plan_replay(rs, **x, state_indices=None, scale=0.3, o=x["v"])[0][3]
    assert meta["RD_MMA"] is True and meta["TMA"] is True and meta["num_stages"] == 1
    assert (meta.get("maxnreg"), meta["BLOCK_R"]) == ((None, 64) if batch <= 128 else (80, 64))   # (48 rows: 64)
    st, _ = make_pair(sh, batch, 4, 3, "replay", "bfloat16", None, torch.bfloat16, g)
    assert TK.plan_replay(st, **x, state_indices=None, scale=0.3, o=x["v"])[0][3]["RD_MMA"] is False


@pytest.mark.parametrize("sh,lo,cfg,st", [(EVEN, "bfloat16", {"F_NR": 2}, True), (EVEN, "float8_e4m3", {}, True),
                                          (TALL, "bfloat16", {"F_NR": 2}, False), (EVEN, "bfloat16", {"F_TMA": False}, False)],
                         ids=["inside-heads", "fp8-low", "chunk-past-dv", "no-tma-loads"])
def test_flush_step_stores_through_tma_only_where_chunks_fit(sh, lo, cfg, st):
    # a bulk store writes its whole box: only where every chunk of a program lies inside its head
    # (dv a multiple of the rows a program covers), and only beside the TMA loads' descriptor
    rs, _ = make_pair(sh, 4, 6, 4, "dual", "float32", lo, torch.bfloat16, gen(3))
    meta = flush_step_meta(rs, sh, {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_FOLD_MMA": True, "F_TMA": True,
                                    "F_ST_TMA": True, **cfg})
    assert meta["ST_TMA"] is st


def test_tma_rows_falls_back_where_tma_cannot_read():
    # a table row's TMA (asked None) gives way to pointer loads where the state or the GPU cannot
    # take a descriptor; a config's TMA True names the key instead
    from replayssm.common.launch import tma_rows
    t = torch.zeros(8, 6, dtype=torch.float32)      # rows of 24 bytes: not a multiple of 16
    assert tma_rows(t, 6, [(8, 8)], "TMA", None) is None
    with pytest.raises(ValueError, match="TMA=True"):
        tma_rows(t, 6, [(8, 8)], "TMA", True)
    ok = torch.zeros(8, 8, dtype=torch.float32)
    assert tma_rows(ok, 8, [(8, 8)], "TMA", None) is not None
    assert tma_rows(ok, 8, [(512, 8)], "TMA", None) is None     # a box dim over 256
    assert tma_rows(ok, 8, [(8, 8)], "TMA", False) is None


@pytest.mark.parametrize("sh,mode,sd,lo,L,K", [(TALL, "dual", "float32", "bfloat16", 12, 11),
                                               (GQA, "dual", "float32", "float8_e4m3", 20, 18),
                                               (TALL, "replay", "bfloat16", None, 20, 17)],
                         ids=["dual-bf16-K11", "dual-fp8-K18", "bf16-state-K17"])
def test_flush_step_fold_mma_long_windows(sh, mode, sd, lo, L, K):
    # FOLD_MMA flush steps that fold up to K entries: K > 8 needs the M^8 factor of the dual
    # solve's inverse, K > 16 a 32-entry block (the M^16 factor). Cursors start within 3 of
    # the flush, every row steps every time: each sequence flushes within the 4 steps.
    g = gen(11)
    cfg = {"BLOCK_V": 8, "SPLIT": True, "F_BLOCK_V": 16, "F_FOLD_MMA": True}
    rs, rr = make_pair(sh, 3, L, K, mode, sd, lo, torch.float32, g)
    start = (K - 1 - torch.randint(0, 3, (3,), generator=g)).to(torch.int32)
    rs.cursor.copy_(start)
    rr.cursor.copy_(start)
    assert flush_step_meta(rs, sh, cfg)["FOLD_MMA"] is True
    for step in range(4):
        x = step_inputs(sh, 3, torch.float32, g)
        o = GD.replay_step(rs, **x, config=cfg)
        o_ref = R.gdn_replay_step(rr, **x)
        assert rel_err(o, o_ref) <= out_tol(torch.float32), f"step {step}: {rel_err(o, o_ref):.3g}"
        state_check(rs, rr, f"step {step}")
    assert (rr.cursor.cpu() < start).all(), "every sequence must have flushed"


def flush_step_meta(rs, sh, cfg):
    """The flush-step launch's meta for a 3-row step of this state under cfg."""
    from replayssm.triton import gdn as TK
    x = step_inputs(sh, 3, torch.float32, gen(4))
    return TK.plan_replay(rs, **x, state_indices=None, scale=0.3, o=x["v"], config=cfg)[1][3]


@pytest.mark.parametrize("mode,lo,sd", [("replay", None, "float32"), ("dual", "bfloat16", "float32"),
                                         ("dual", "float8_e4m3", "float32"), ("replay", None, "bfloat16"),
                                         ("shared-low", "float8_e4m3", "float32")],
                         ids=["f32", "dual-bf16", "dual-fp8", "bf16-state", "shared-fp8"])
def test_eager_route_mixes_with_the_buffered_route(mode, lo, sd):
    # the small-batch route (EAGER_ROUTE: a flush at every step, no append) folds whatever the
    # buffer holds first, so steps may switch routes: the reference's route semantics (route=True:
    # every row flushes; dual: the high copy alone, the low copy marked stale, and the next
    # buffered step flushes it) must agree on outputs, checkpoints and cursor words (its buffer
    # rows past the cursor differ: it appends before it flushes; the kernel route does not append)
    g = gen(7)
    K = 4
    rs, rr = make_pair(TALL, 4, 6, K, mode, sd, lo, torch.bfloat16, g)
    routes = [True, False, False, True, True, False, False, False, True, True]
    flushed_pending = stale_flushed = 0
    for step, eager in enumerate(routes):
        idx = random_rows(4, 3, g, pad_p=0.2)
        live = idx[idx >= 0].long()
        x = step_inputs(TALL, 3, torch.bfloat16, g)
        if eager:
            flushed_pending += int((rr.entries(live) > 0).sum())
        else:
            stale_flushed += int(rr.lo_stale(live).sum())
        lo_before = rs.lo.data.clone() if rs.lo is not None else None
        # the rare path inline, or as a call (PENDING_CALL: the 16-bit table row's form)
        o = GD.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]),
                           config={"BLOCK_V": 8, "num_warps": 1, "EAGER_ROUTE": eager, "PENDING_CALL": step % 2 == 0})
        o_ref = R.gdn_replay_step(rr, **x, state_indices=idx, route=eager)
        assert rel_err(o, o_ref) <= out_tol(torch.bfloat16), f"{mode} step {step}: {rel_err(o, o_ref):.3g}"
        assert (o[idx < 0] == 0).all()
        assert torch.equal(rs.cursor, rr.cursor), f"{mode} step {step}: cursors"
        ckpt_check(rs.hi, rr.hi, f"{mode} step {step}: hi")
        if rs.lo is not None:
            ckpt_check(rs.lo, rr.lo, f"{mode} step {step}: lo")
        if eager:
            assert (rs.entries(live) == 0).all()
            assert rs.lo_stale(live).all() == (mode == "dual") and rs.routed == (mode == "dual")
            if mode == "dual":     # the route writes the high copy alone
                assert torch.equal(rs.lo.data, lo_before)
        for name in ("u", "k", "g", "v", "beta"):   # the buffers as the reference has them
            if getattr(rs, name) is not None:
                getattr(rs, name).copy_(getattr(rr, name))
        resync(rs, rr)
    assert flushed_pending >= 3, f"only {flushed_pending} rows had entries to fold on the eager route"
    assert stale_flushed >= 3 or mode != "dual", f"only {stale_flushed} stale low copies refreshed"


@pytest.mark.shipped_routes
def test_eager_route_plan(monkeypatch):
    from replayssm.triton import gdn as TK
    rs, _ = make_pair(TALL, 4, 6, 4, "replay", "float32", None, torch.bfloat16, gen(3))
    x = step_inputs(TALL, 3, torch.bfloat16, gen(4))
    plans = TK.plan_replay(rs, **x, state_indices=None, scale=0.3, o=x["v"], config={"EAGER_ROUTE": True})
    assert [p[0] for p in plans] == [TK._gdn_replay_eager_kernel]
    assert TK.state_takes_eager_route(rs, x["k"], x["v"], {"EAGER_ROUTE": True})
    assert TK.state_takes_eager_route(rs, x["k"], x["v"])          # fp32, batch 3: the shipped table routes it
    assert not TK.state_takes_eager_route(rs, x["k"], x["v"], {"EAGER_ROUTE": False})
    assert not TK.takes_eager_route(32, 128, 128, 16, 4)           # batch 32: buffered
    assert TK.takes_eager_route(1, 128, 128, 16, 2)                # 16-bit read copies too
    # dual states route while batch x value heads <= DUAL_ROUTE_HEADS (session 18), on the fp32
    # table's route row (their high copy), whatever the low copy's width
    assert TK.DUAL_ROUTE_HEADS == 512
    for heads, last in ((32, 16), (64, 8)):       # Qwen3.5-4B, Qwen3.5-122B
        for lo_bytes in (2, 1):
            assert TK.takes_eager_route(last, 128, 128, 16, lo_bytes, dual=True, heads=heads)
            assert not TK.takes_eager_route(last + 1, 128, 128, 16, lo_bytes, dual=True, heads=heads)
        assert TK.pick_config("replay", last, 128, 128, 16, state_bytes=2, dual=True, heads=heads) == \
            TK.pick_config("replay", 1, 128, 128, 16)
    with pytest.raises(ValueError, match="needs heads"):
        TK.takes_eager_route(1, 128, 128, 16, 2, dual=True)
    assert not TK.takes_eager_route(1, 128, 128, 16, 1)            # 8-bit read copies: buffered
    # the 16-bit 8 x 1 route row calls its rare path (session 18); the 4 x 1 and fp32 rows inline it
    assert [bool(TK.pick_config("replay", b, 128, 128, 16, state_bytes=sb).get("PENDING_CALL"))
            for b, sb in ((4, 2), (8, 2), (32, 2), (8, 4))] == [False, True, True, False]
    assert TK.takes_eager_route(32, 128, 128, 16, 2)               # bf16 state up to batch 32 (session 17)
    assert not TK.takes_eager_route(33, 128, 128, 16, 2)
    # the route's tiles: fp32 4 rows x 1 warp, under a 56-register budget to batch 4, then without
    # it on the deferred route (ROUTE_K 2: the state written every other step, session 30) to
    # batch 16; 16-bit 4 rows up to batch 4, then 8; dual states keep the every-step route
    keys = ("BLOCK_V", "num_warps", "maxnreg", "ROUTE_K")
    assert [tuple(TK.pick_config("replay", b, 128, 128, 16).get(k) for k in keys) for b in (1, 4, 5, 16)] == \
        [(4, 1, 56, None)] * 2 + [(4, 1, None, 2)] * 2
    assert [TK.route_period(b, 128, 128, 16, 4, 16) for b in (1, 4, 5, 16, 17)] == [1, 1, 2, 2, 0]
    assert TK.route_period(8, 128, 128, 16, 4, 1) == 1          # at most the flush period
    assert [TK.route_period(b, 128, 128, 16, 2, 16, dual=True, heads=32) for b in (1, 8, 16, 17)] == [1, 1, 1, 0]
    assert [TK.pick_config("replay", b, 128, 128, 16, state_bytes=2)["BLOCK_V"] for b in (1, 4, 5, 32)] == [4, 4, 8, 8]
    # dual 16-bit reads, buffered (their own rows, replay_dual:2): the session-6 row up to batch 8,
    # chunks through TMA above, read by the tensor cores (RD_MMA, session 26): 64 rows x 2 with 2
    # heads per program to batch 16, whole heads to 128 (2 heads per program to batch 32), then
    # 64 rows x 2 under an 80-register budget
    keys = ("BLOCK_V", "NR", "HP", "TMA", "RD_MMA", "maxnreg")
    assert [tuple(TK.pick_config("replay", b, 128, 128, 16, state_bytes=2, dual=True, heads=64).get(k) for k in keys)
            for b in (9, 16, 17, 32, 33, 128, 129, 512)] == \
        [(64, 2, 2, True, True, None)] * 2 + [(128, 1, 2, True, True, None)] * 2 + \
        [(128, 1, 4, True, True, None)] * 2 + [(64, 2, 4, True, True, 80)] * 2
    assert not TK.pick_config("replay", 512, 128, 128, 16, state_bytes=2).get("RD_MMA")     # bf16 states: replay:2
    assert TK.pick_config("replay", 8, 128, 128, 16, state_bytes=2, dual=True, heads=128)["NR"] == 2
    monkeypatch.setattr(TK, "SMALL_BATCH_ROUTE", False)
    assert not TK.state_takes_eager_route(rs, x["k"], x["v"])
    assert TK.pick_config("replay", 3, 40, 24, 6) == TK.pick_config("replay", 3, 40, 24, 6, {"PREFETCH": True})
    assert TK.state_takes_eager_route(rs, x["k"], x["v"], {"EAGER_ROUTE": True})   # a per-call config still wins


@pytest.mark.shipped_routes
def test_eager_table():
    """Our eager kernel's tiles (session 17's tuning): fp32 4 rows x 1 warp at every batch; 16-bit
    states 4 rows x 1 warp up to batch 2, 8 x 1 above, two such tiles a program above batch 256;
    no register budget; the state's eviction hints (evict_first) dropped above batch 256 (session
    29), and the plan passes that to the launch."""
    from replayssm.triton import gdn as TK
    hints = lambda c: (c.get("LOAD_EV", "evict_first"), c.get("STORE_EV", "evict_first"))  # noqa: E731
    for b in (1, 8, 64, 256, 512):
        cfg = TK.pick_config("eager", b, 128, 128)
        assert (cfg["BLOCK_V"], cfg["num_warps"], cfg.get("maxnreg"), cfg.get("TILES", 1)) == (4, 1, None, 1)
        assert hints(cfg) == (("", "") if b > 256 else ("evict_first", "evict_first"))
    got = [TK.pick_config("eager", b, 128, 128, state_bytes=2) for b in (1, 2, 3, 32, 256, 257, 512)]
    assert [(c["BLOCK_V"], c.get("TILES", 1)) for c in got] == [(4, 1), (4, 1), (8, 1), (8, 1), (8, 1), (8, 2), (8, 2)]
    assert [hints(c) for c in got[-3:]] == [("evict_first", "evict_first"), ("", ""), ("", "")]
    big = torch.empty(512, 2, 128, 128, dtype=torch.bfloat16, device="meta")
    xb = {k: v.to("meta") for k, v in step_inputs(I.GDNShape(1, 2, 128, 128), 512, torch.bfloat16, gen(0)).items()}
    _, grid, _, mb = TK.plan_eager(big, **xb, state_indices=None, scale=0.3, o=xb["v"])
    assert grid == (8, 2, 512) and (mb["TILES"], mb["LOAD_EV"], mb["STORE_EV"]) == (2, "", "")
    st = torch.empty(4, 8, 16, 32, device="meta")
    x = {k: v.to("meta") for k, v in step_inputs(I.GDNShape(4, 8, 32, 16), 2, torch.bfloat16, gen(0)).items()}
    meta = TK.plan_eager(st, **x, state_indices=None, scale=0.3, o=x["v"], config={"maxnreg": 40})[3]
    assert meta["maxnreg"] == 40                                   # a per-call budget reaches the launch


@pytest.mark.shipped_routes
def test_verify_route_plan():
    """The verify table at batch > 4: a whole 128-row head per program on 2 warps up to T = 8
    (16 packed draft columns); 64 rows when T > 8 (32 columns), unless a config sets the rows.
    A bf16 read copy (dual) runs under a 168-register budget at T = 4 and 6 only, and reads its
    state chunks through a TMA descriptor at T = 2, 4, 6 (fp32 read copies never)."""
    from triton.tools.tensor_descriptor import TensorDescriptor
    from replayssm.triton import gdn as TK
    Hk, Hv, dk, dv, K, batch = 16, 64, 128, 128, 16, 256
    for T, rows in ((2, 128), (4, 128), (5, 128), (6, 128), (8, 128), (9, 64), (16, 64)):
        rs = GDNReplayState.allocate(batch, Hk, Hv, dk, dv, K + T, K, device="meta")
        e = lambda *s, dt=torch.bfloat16: torch.empty(batch, T, *s, dtype=dt, device="meta")   # noqa: E731
        x = dict(q=e(Hk, dk), k=e(Hk, dk), v=e(Hv, dv), g=e(Hv, dt=torch.float32), beta=e(Hv, dt=torch.float32))
        _, grid, _, meta = TK.plan_verify(rs, **x, state_indices=None, scale=.1, o=x["v"])
        assert (grid, meta["num_warps"], meta["BLOCK_P"]) == ((dv // rows, Hv, batch), 2, 16 if T <= 8 else 32), T
        assert "maxnreg" not in meta and not meta["TMA"]
        _, grid, _, _ = TK.plan_verify(rs, **x, state_indices=None, scale=.1, o=x["v"], config={"BLOCK_V": 128})
        assert grid[0] == 1
        dual = GDNReplayState.allocate(batch, Hk, Hv, dk, dv, K + T, K, mode="dual", lo_dtype="bfloat16", device="meta")
        _, grid, args, meta = TK.plan_verify(dual, **x, state_indices=None, scale=.1, o=x["v"])
        assert grid[0] == dv // rows and meta.get("maxnreg") == (168 if T in (4, 6) else None), T
        tma = T in (2, 4, 6)
        assert meta["TMA"] == tma and isinstance(args[9], TensorDescriptor) == tma, T
        if tma:   # the low copy as [rows, dk], one [rows per program, dk step] block per load
            assert list(args[9].shape) == [batch * Hv * dv, dk] and list(args[9].block_shape) == [rows, meta["BLOCK_K"]]


def test_commit_route_plan():
    """The shipped commit routes: a cursor launch listing the flushing rows, then for fp32
    states the flush step (FOLD_MMA, no output, workers sized for T entries per row), for dual
    states with a 16-bit low copy the two-pass kernel; fp8 low copies and COMMIT_FOLD take the
    rank-1 fold kernel."""
    from replayssm.triton import gdn as TK
    Hk, Hv, dk, dv, K, T, batch = 16, 64, 128, 128, 16, 4, 256
    acc = torch.empty(batch, dtype=torch.int32, device="meta")

    def rs(mode, lo=None):
        return GDNReplayState.allocate(batch, Hk, Hv, dk, dv, K + T, K, mode=mode, lo_dtype=lo, device="meta")
    snap, step = TK.plan_commit(rs("replay"), acc, None)
    assert (snap[0], step[0]) == (TK._gdn_commit_cursor_kernel, TK._gdn_flush_step_kernel)
    assert step[3]["FOLD_MMA"] and not step[3]["WRITE_O"] and step[3]["BLOCK_L"] == 32   # K + T - 1 entries
    assert step[1][2] == batch * T // K                                                   # workers per head block
    assert snap[3]["COMPACT"] and step[3]["COMPACT"]             # the cursor launch lists the flushing rows
    assert step[2][3].numel() >= batch + 1                       # ... and their count
    scan = TK.plan_commit(rs("replay"), acc, None, {"F_COMPACT": False})
    assert not scan[0][3]["COMPACT"] and not scan[1][3]["COMPACT"]
    # the fold's fp32 side as three bf16 terms against bf16 keys; split by truncation for keys not
    # exact in bf16: two passes for fp16 keys (exact in tf32), three for fp32
    assert step[3]["FOLD_PREC"] == "bf16x3e"
    assert step[3]["TMA"] and step[3]["ST_TMA"]                  # chunks in and out through TMA (session 25)
    small = TK.plan_commit(rs("replay"), torch.empty(64, dtype=torch.int32, device="meta"), None)[1][3]
    assert small["FOLD_PREC"] == "tf32x2t"                       # batch <= 64: the truncation split
    for act, want in ((torch.float16, "tf32x2t"), (torch.float32, "tf32x3t")):
        keys = GDNReplayState.allocate(batch, Hk, Hv, dk, dv, K + T, K, act_dtype=act, device="meta")
        assert TK.plan_commit(keys, acc, None)[1][3]["FOLD_PREC"] == want, act
    # dual: the two-pass kernel over the listed rows (whole heads, 16-column dk steps); an fp8
    # low copy (per-row scales) through the rank-1 fold kernel; F_TWO_PASS off: the flush step
    snap, two = TK.plan_commit(rs("dual", "bfloat16"), acc, None)
    assert (snap[0], two[0]) == (TK._gdn_commit_cursor_kernel, TK._gdn_dual_2pass_kernel) and snap[3]["COMPACT"]
    assert (two[1], two[3]["BLOCK_K"], two[3]["BLOCK_L"]) == ((batch * T // K, Hv), 16, 32)
    assert (two[3]["P_PREC"], two[3]["FOLD_PREC"]) == ("tf32x2t", "bf16x3e")
    assert [p[0] for p in TK.plan_commit(rs("dual", "float8_e4m3"), acc, None)] == [TK._gdn_fold_kernel]
    assert [p[0] for p in TK.plan_commit(rs("dual", "bfloat16"), acc, None, {"COMMIT_FOLD": True})] == [
        TK._gdn_fold_kernel]
    dual_step = TK.plan_commit(rs("dual", "bfloat16"), acc, None, {"F_TWO_PASS": False})
    assert [p[0] for p in dual_step] == [TK._gdn_commit_cursor_kernel, TK._gdn_flush_step_kernel]
    assert dual_step[1][3]["DUAL"] and not dual_step[1][3]["WRITE_O"]
    assert [p[0] for p in TK.plan_commit(rs("replay"), acc, None, {"COMMIT_FOLD": True})] == [TK._gdn_fold_kernel]
    # at <= 32 value heads (Qwen3.5-4B) the fold is balanced over 6 programs per SM (132 for
    # 'meta' plans), each with at most cdiv(256 x 32 x 8, 792) = 83 16-row chunks: 12 segments
    small = GDNReplayState.allocate(batch, Hk, 32, dk, dv, K + T, K, device="meta")
    snap, bal = TK.plan_commit(small, acc, None)
    assert (snap[0], bal[0], bal[1]) == (TK._gdn_commit_cursor_kernel, TK._gdn_commit_balanced_kernel, (792,))
    assert (bal[3]["NSEG"], bal[3]["BLOCK_R"], bal[3]["maxnreg"], bal[3]["PF"]) == (12, 16, 168, 0)
    # above batch 64 the folds' chunks come and go through TMA (session 25), balanced or not
    assert bal[3]["TMA"] and bal[3]["ST_TMA"]
    assert TK.plan_commit(small, acc, None, {"F_BALANCED": None})[1][3]["ST_TMA"] is True
    assert TK.plan_commit(GDNReplayState.allocate(64, Hk, 32, dk, dv, K + T, K, device="meta"),
                          acc[:64], None)[1][0] is TK._gdn_flush_step_kernel        # batch <= 64: the flush step
    assert TK.plan_commit(GDNReplayState.allocate(batch, Hk, 32, dk, dv, K + 6, K, device="meta"),
                          acc, None)[1][0] is TK._gdn_flush_step_kernel             # T 6: the flush step
    assert TK.plan_commit(small, acc, None, {"F_BALANCED": None})[1][0] is TK._gdn_flush_step_kernel
    # the cursor launch and the fold are programmatic dependent launches (both wait in the kernel:
    # GDC); PDL False, or a device without them (the CPU): neither
    for p in (snap, bal):
        assert p[3]["GDC"] and p[3]["launch_pdl"]
    assert not any(p[3].get("launch_pdl") or p[3]["GDC"] for p in TK.plan_commit(small, acc, None, {"PDL": False}))
    cpu = GDNReplayState.allocate(4, Hk, 32, dk, dv, K + T, K)
    on_cpu = TK.plan_commit(cpu, torch.zeros(4, dtype=torch.int32), None)
    assert not any(p[3].get("launch_pdl") or p[3]["GDC"] for p in on_cpu)


@pytest.mark.shipped_routes
@pytest.mark.parametrize("batch", [1, 5])
def test_small_batches_take_the_tables_route_by_default(batch):
    # the shipped table at small batch: outputs, checkpoints, cursor counts and bytes as the
    # reference's route semantics with the table's period (batch 1: a flush at every step; batch 5:
    # every other step, the deferred route; entries pending from the buffered route at the start
    # are folded first)
    from replayssm.triton import gdn as TK
    g = gen(11 + batch)
    K = 4
    rs, rr = make_pair(TALL, batch + 1, 6, K, "replay", "float32", None, torch.bfloat16, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    x = step_inputs(TALL, batch, torch.bfloat16, g)
    period = TK.state_route_period(rs, x["k"], x["v"])
    assert period == (1 if batch == 1 else 2)
    for step in range(6):
        idx = random_rows(batch + 1, batch, g, pad_p=0.2)
        x = step_inputs(TALL, batch, torch.bfloat16, g)
        o = GD.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]))
        o_ref = R.gdn_replay_step(rr, **x, state_indices=idx, route=period)
        assert rel_err(o, o_ref) <= out_tol(torch.bfloat16), f"step {step}: {rel_err(o, o_ref):.3g}"
        assert torch.equal(rs.cursor & CURSOR_MASK, rr.cursor), f"step {step}: cursors"
        ckpt_check(rs.hi, rr.hi, f"step {step}: hi")
        assert (rs.entries(idx[idx >= 0].long()) < period).all()
        for name in ("u", "k", "g"):     # rows past the cursor: the reference's
            getattr(rs, name).copy_(getattr(rr, name))
        resync(rs, rr)
    assert rs.counter == rr.counter


def test_replay_counts_bytes_like_reference():
    g = gen(4)
    rs, rr = make_pair(TINY, 3, 4, 3, "dual", "float32", "bfloat16", torch.float32, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    for _ in range(3):
        idx = torch.tensor([2, -1, 0], dtype=torch.int32, device=DEV)
        x = step_inputs(TINY, 3, torch.float32, g)
        GD.replay_step(rs, **x, state_indices=idx)
        R.gdn_replay_step(rr, **x, state_indices=idx)
    GD.flush(rs)
    R.gdn_flush(rr)
    assert rs.counter == rr.counter


def test_eager_route_counts_bytes_like_a_flush_every_step():
    # dual: the route writes the high copy alone; the stale low copy's refresh is counted where
    # it happens (the next buffered step's flush, a verify, a flush)
    g = gen(4)
    rs, rr = make_pair(TINY, 3, 6, 3, "dual", "float32", "bfloat16", torch.float32, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    idx = torch.tensor([2, -1, 0], dtype=torch.int32, device=DEV)
    for i, route in enumerate((True, True, False, True)):
        x = step_inputs(TINY, 3, torch.float32, g)
        GD.replay_step(rs, **x, state_indices=idx, config={"EAGER_ROUTE": route})
        R.gdn_replay_step(rr, **x, state_indices=idx, route=route)
        assert rs.counter == rr.counter
        if i == 0:      # two live rows, the high copy alone written
            assert rs.counter.ckpt_write == 2 * rs.hi.bytes_per_slot()
    x = step_inputs(TINY, 3, torch.float32, g, T=2)
    GD.verify(rs, **x, state_indices=idx)
    R.gdn_verify(rr, **x, state_indices=idx)
    assert rs.counter == rr.counter
    acc = torch.tensor([1, 0, 2], dtype=torch.int32, device=DEV)
    GD.commit(rs, acc, idx)
    R.gdn_commit(rr, acc, idx)
    x = step_inputs(TINY, 3, torch.float32, g)
    GD.replay_step(rs, **x, state_indices=idx, config={"EAGER_ROUTE": True})
    R.gdn_replay_step(rr, **x, state_indices=idx, route=True)
    GD.flush(rs)
    R.gdn_flush(rr)
    assert rs.counter == rr.counter


ROUTE_MODES = [("replay", None, "float32"), ("dual", "bfloat16", "float32"), ("dual", "float8_e4m3", "float32"),
               ("replay", None, "bfloat16"), ("shared-low", "float8_e4m3", "float32")]
ROUTE_IDS = ["f32", "dual-bf16", "dual-fp8", "bf16-state", "shared-fp8"]


@pytest.mark.parametrize("mode,lo,sd,rk", [(*m, 2) for m in ROUTE_MODES] + [(*ROUTE_MODES[i], 3) for i in (0, 1)],
                         ids=[f"{i}-2" for i in ROUTE_IDS] + [f"{ROUTE_IDS[i]}-3" for i in (0, 1)])
def test_deferred_route_mixes_with_every_other_op(mode, lo, sd, rk):
    # the small-batch route of period k (ROUTE_K >= 2): the state written every k-th step, the
    # cursor moved by one program with a plain store and an epoch (state.py). Mixed with the
    # every-step route, buffered steps, a verify and commit, padded rows and slots left out of a
    # step; outputs, checkpoints, cursor counts and stale bits, buffer entries below the cursor and
    # byte counts as the reference's route semantics (route=k). Under the interpreter a
    # sequence's programs run one after another, so most read the word the first one stored
    # (the epoch's "late" case); on a GPU most read the word from before the launch.
    g = gen(17 + rk)
    K = 4
    rs, rr = make_pair(TALL, 5, 8, K, mode, sd, lo, torch.bfloat16, g)
    rs.counter, rr.counter = ByteCounter(), ByteCounter()
    plan = ["defer"] * 5 + ["buffered", "defer", "defer", "eager", "defer", "defer", "defer", "spec", "defer",
                            "defer", "buffered", "buffered", "defer", "defer", "defer"]
    fast = 0
    for step, how in enumerate(plan):
        idx = random_rows(5, 4, g, pad_p=0.2)
        live = idx[idx >= 0].long()
        before = rs.cursor.clone()
        if how == "spec":
            x = step_inputs(TALL, 4, torch.bfloat16, g, T=2)
            o = GD.verify(rs, **x, state_indices=idx, out=poisoned(x["v"]))
            o_ref = R.gdn_verify(rr, **x, state_indices=idx)
            assert rel_err(o, o_ref) <= out_tol(torch.bfloat16), f"{mode} step {step} verify: {rel_err(o, o_ref):.3g}"
            acc = torch.randint(0, 3, (4,), generator=g).to(torch.int32).to(DEV)
            GD.commit(rs, acc, idx)
            R.gdn_commit(rr, acc, idx)
        else:
            x = step_inputs(TALL, 4, torch.bfloat16, g)
            route = {"defer": rk, "eager": 1, "buffered": 0}[how]
            cfg = {"BLOCK_V": 8, "num_warps": 1, "EAGER_ROUTE": route > 0, "ROUTE_K": max(route, 1)}
            o = GD.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]), config=cfg)
            o_ref = R.gdn_replay_step(rr, **x, state_indices=idx, route=route)
            assert rel_err(o, o_ref) <= out_tol(torch.bfloat16), f"{mode} step {step}: {rel_err(o, o_ref):.3g}"
            assert (o[idx < 0] == 0).all()
        fast += check_route_words(rs, rr, before, live, how == "defer", rk, f"{mode} step {step}")
        ckpt_check(rs.hi, rr.hi, f"{mode} step {step}: hi")
        if rs.lo is not None:
            ckpt_check(rs.lo, rr.lo, f"{mode} step {step}: lo")
        n = rr.entries()
        below = torch.arange(8, device=DEV)[None, :] < n[:, None]              # [slots, L]
        for name in ("k", "g", "v", "beta"):
            a, b = getattr(rs, name), getattr(rr, name)
            if a is not None:
                assert torch.equal(a[below], b[below]), f"{mode} step {step}: buffer {name}"
        if below.any():
            assert rel_err(rs.u[below], rr.u[below]) <= TOL_F32, f"{mode} step {step}: buffer u"
        for name in ("u", "k", "g", "v", "beta"):     # rows past the cursor: the reference's
            if getattr(rs, name) is not None:
                getattr(rs, name).copy_(getattr(rr, name))
        resync(rs, rr)
        assert rs.counter == rr.counter, f"{mode} step {step}: bytes"
    assert fast >= 10, f"only {fast} steps moved the cursor without a ticket"


def test_deferred_route_epoch_wraps_and_stale_epochs_take_the_ticket():
    # the epoch runs 1..127 and wraps to 1 (never 0, which marks another op's word); a slot whose
    # recorded epochs are stale (a word stored elsewhere with an epoch bit pattern it never saw:
    # a restore) must not be taken for a sibling's store unless it is exactly the next one
    g = gen(23)
    rs, rr = make_pair(TALL, 3, 6, 4, "replay", "float32", None, torch.bfloat16, g, cursor_hi=0)
    cfg = {"BLOCK_V": 8, "num_warps": 1, "EAGER_ROUTE": True, "ROUTE_K": 2}
    idx = torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)

    def step():
        x = step_inputs(TALL, 3, torch.bfloat16, g)
        o = GD.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]), config=cfg)
        return o, R.gdn_replay_step(rr, **x, state_indices=idx, route=2)
    check_epoch_wrap(rs, rr, step, ckpt_check)


def test_deferred_route_config_errors():
    g = gen(5)
    rs, _ = make_pair(TALL, 2, 6, 4, "replay", "float32", None, torch.bfloat16, g)
    x = step_inputs(TALL, 2, torch.bfloat16, g)
    for bad in (0, 128, True, 2.0):
        with pytest.raises(ValueError, match=f"ROUTE_K={bad!r}: allowed an int 1..127"):
            GD.replay_step(rs, **x, config={"EAGER_ROUTE": True, "ROUTE_K": bad})
    with pytest.raises(ValueError, match="BLOCK_V=2 with ROUTE_K"):
        GD.replay_step(rs, **x, config={"EAGER_ROUTE": True, "ROUTE_K": 2, "BLOCK_V": 2})


@pytest.mark.parametrize("lo", ["bfloat16", "float8_e4m3"])
def test_dual_route_low_copy_refreshed_where_needed(lo):
    # LO_STALE end to end: after eager-route steps (high copy only), a verify refreshes the low
    # copy before reading it (and clears the bit, in a second launch), a flush
    # refreshes it, and a buffered step flushes stale rows; the reference agrees on outputs,
    # both copies and cursor words after every op
    g = gen(21)
    T, K, L, slots, batch = 2, 3, 6, 4, 3
    rs, rr = make_pair(TALL, slots, L, K, "dual", "float32", lo, torch.bfloat16, g)

    def route_step(tag):
        idx = random_rows(slots, batch, g, pad_p=0.2)
        x = step_inputs(TALL, batch, torch.bfloat16, g)
        o = GD.replay_step(rs, **x, state_indices=idx, config={"BLOCK_V": 8, "num_warps": 1, "EAGER_ROUTE": True})
        assert rel_err(o, R.gdn_replay_step(rr, **x, state_indices=idx, route=True)) <= out_tol(torch.bfloat16)
        for name in ("u", "k", "g", "v", "beta"):   # rows past the cursor: the reference appended there
            getattr(rs, name).copy_(getattr(rr, name))
        state_check(rs, rr, tag)
        return idx

    for rnd in range(3):
        idx = route_step(f"route {rnd}")
        live = idx[idx >= 0].long()
        assert rs.lo_stale(live).all() and rs.routed
        lo_stale_data = rs.lo.data.clone()
        x = step_inputs(TALL, batch, torch.bfloat16, g, T=T)
        o = GD.verify(rs, **x, state_indices=idx)
        assert rel_err(o, R.gdn_verify(rr, **x, state_indices=idx)) <= out_tol(torch.bfloat16), f"verify {rnd}"
        assert not torch.equal(rs.lo.data[live], lo_stale_data[live]), "verify read a stale low copy"
        assert not rs.lo_stale().any()          # refreshed, the bit cleared
        state_check(rs, rr, f"verify {rnd}")
        acc = torch.randint(0, T + 1, (batch,), generator=g).to(DEV)
        GD.commit(rs, acc, idx)
        R.gdn_commit(rr, acc, idx)
        assert not rs.lo_stale().any()
        state_check(rs, rr, f"commit {rnd}")
    idx = route_step("route before flush")
    GD.flush(rs)
    R.gdn_flush(rr)
    assert not rs.lo_stale().any() and (rs.entries() == 0).all()
    state_check(rs, rr, "flush")
    idx = route_step("route before a buffered step")
    for split in (False, True):     # fused: the replay kernel's dual flush; SPLIT: the flush-step launch
        x = step_inputs(TALL, batch, torch.bfloat16, g)
        o = GD.replay_step(rs, **x, state_indices=idx, config={"SPLIT": split, "EAGER_ROUTE": False})
        assert rel_err(o, R.gdn_replay_step(rr, **x, state_indices=idx)) <= out_tol(torch.bfloat16)
        assert not rs.lo_stale().any() and (rs.entries(idx[idx >= 0].long()) == 0).all()   # flushed
        state_check(rs, rr, f"buffered split={split}")
        if not split:
            idx = route_step("route before a split step")


def test_reference_backend_dispatch():
    g = gen(5)
    rs, rr = make_pair(TINY, 2, 4, 3, g=g)
    x = step_inputs(TINY, 2, torch.float32, g)
    out = poisoned(x["v"])
    o = GD.replay_step(rs, **x, backend="reference", out=out)
    o_ref = R.gdn_replay_step(rr, **x)
    assert o is out and torch.equal(o, o_ref)
    with pytest.raises(ValueError, match="backend"):
        GD.flush(rs, backend="cuda")


# ----------------------------------------------------------------------------- flush
@pytest.mark.parametrize("mode,sd,lo", [("replay", "float32", None), ("dual", "float32", "float8_e4m3"),
                                        ("shared-low", "float32", "bfloat16")], ids=["f32", "dual-fp8", "shared-bf16"])
def test_flush_matches_reference(mode, sd, lo):
    g = gen(6)
    rs, rr = make_pair(TINY, 5, 5, 5, mode, sd, lo, torch.float32, g, cursor_hi=4)
    rs.cursor[1] = rr.cursor[1] = 0          # nothing to fold
    rs.cursor[2] = rr.cursor[2] = 4
    some = torch.tensor([2, 1, 4], device=DEV)
    GD.flush(rs, some, config={"BLOCK_V": 4})
    R.gdn_flush(rr, some)
    state_check(rs, rr, "flush(slots)")
    GD.flush(rs)
    R.gdn_flush(rr)
    state_check(rs, rr, "flush(all)")
    assert (rs.cursor == 0).all()


# ----------------------------------------------------------------------------- verify + commit
VERIFY_CASES = [
    # id, shape, mode, state_dtype, lo_dtype, act, T, K, L, config
    ("f32-T3", TINY, "replay", "float32", None, torch.float32, 3, 5, 8, SMALL_TILES),   # 4 chunks
    ("dual-bf16-T4", TINY, "dual", "float32", "bfloat16", torch.float32, 4, 4, 8, None),
    ("shared-fp8-T1", TINY, "shared-low", "float32", "float8_e4m3", torch.float32, 1, 2, 3, None),
    ("f32-gqa-T2", GQA, "replay", "float32", None, torch.bfloat16, 2, 3, 5, {"BLOCK_V": 8}),
    # packed draft columns [k | q]: T 8 fills 16 columns; T 9 takes 32 (dv 40: 3 row tiles, dk 2 chunks);
    # buffer read after the cursor
    ("packed-full-dual-bf16-T8", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 8, 4, 12,
     {"BLOCK_V": 16, "CHUNK_K": 16, "EARLY_BUF": False}),
    ("packed-wide-f32-gqa-T9", TALL, "replay", "float32", None, torch.float32, 9, 3, 12, {"BLOCK_V": 16}),
    ("dual-fp8-gqa-T5", GQA, "dual", "float32", "float8_e4m3", torch.bfloat16, 5, 3, 8, None),
    # commit routes besides the table's (fp32: the flush step; dual 16-bit: the two-pass kernel):
    # dual through the flush step's fold, fp32 through the rank-1 fold kernel (dual-fp8-gqa-T5
    # takes it by the table)
    ("commit-step-dual-bf16-T3", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 3, 4, 7,
     {"COMMIT_FOLD": False, "F_TWO_PASS": False}),
    ("commit-fold-f32-T3", TALL, "replay", "float32", None, torch.bfloat16, 3, 4, 7, {"COMMIT_FOLD": True}),
    # the flush step's two ways to find the flushing rows: a batch-wide scan (fp32: the table lists
    # them in the cursor launch, COMPACT) and the list (dual)
    ("commit-scan-f32-T3", TALL, "replay", "float32", None, torch.bfloat16, 3, 4, 7, {"F_COMPACT": False}),
    ("commit-list-dual-bf16-T2", GQA, "dual", "float32", "bfloat16", torch.bfloat16, 2, 3, 5,
     {"COMMIT_FOLD": False, "F_COMPACT": True, "F_TWO_PASS": False}),
    # the dual commit's two-pass kernel (_gdn_dual_2pass_kernel): row tiles, dk steps, GQA, fp16 low copy
    ("commit-2pass-dual-bf16-T3", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 3, 4, 7,
     {"COMMIT_FOLD": False, "F_TWO_PASS": True, "F_CHUNK_K": 16}),
    ("commit-2pass-dual-f16-gqa-T4", GQA, "dual", "float32", "float16", torch.float32, 4, 3, 7,
     {"COMMIT_FOLD": False, "F_TWO_PASS": True, "F_BLOCK_V": 16}),
    # the fp32 commit's fold balanced over a fixed grid (BALANCED programs per SM; 4 "SMs" off a
    # GPU): ranges of chunks that cross (row, head) segments (dv 40: 3 chunks, the last partly
    # masked); GQA with one chunk per head and more programs than chunks
    ("commit-balanced-f32-T3", TALL, "replay", "float32", None, torch.bfloat16, 3, 4, 7,
     {"F_BALANCED": {"per_sm": 1}, "F_BLOCK_V": 16}),
    ("commit-balanced-f32-gqa-T2", GQA, "replay", "float32", None, torch.float32, 2, 3, 5,
     {"F_BALANCED": {"per_sm": 2, "BLOCK_V": 16}}),
    ("commit-balanced-bf16-state-T4", TALL, "replay", "bfloat16", None, torch.bfloat16, 4, 4, 8,
     {"F_BALANCED": {"per_sm": 1, "max_hv": 2}, "F_BLOCK_V": 16}),
    # the balanced fold's chunks through TMA (session 25): the pointer stores of a head with a
    # partial last chunk (dv 40), TMA stores of whole-chunk heads (EVEN, dv 32), a bf16 state
    ("commit-balanced-tma-f32-T3", TALL, "replay", "float32", None, torch.bfloat16, 3, 4, 7,
     {"F_BALANCED": {"per_sm": 1, "TMA": True, "ST_TMA": True}, "F_BLOCK_V": 16}),
    ("commit-balanced-tma-st-f32-T2", EVEN, "replay", "float32", None, torch.bfloat16, 2, 3, 5,
     {"F_BALANCED": {"per_sm": 2, "TMA": True, "ST_TMA": True}, "F_BLOCK_V": 16}),
    ("commit-balanced-tma-st-bf16-state-T4", EVEN, "replay", "bfloat16", None, torch.bfloat16, 4, 4, 8,
     {"F_BALANCED": {"per_sm": 1, "max_hv": 4, "TMA": True, "ST_TMA": True, "num_stages": 2}, "F_BLOCK_V": 16}),
    # truncation-split products (mma.py "tf32x2t" state x raw keys, "tf32x3t" small products)
    ("trunc-split-f32-gqa-T4", GQA, "replay", "float32", None, torch.bfloat16, 4, 3, 7,
     {"S_PREC": "tf32x2t", "SMALL_PREC": "tf32x3t"}),
    # three bf16 terms of the fp32 side against raw bf16 keys / drafts (mma "bf16x3e"): the state x
    # drafts product, the commit's fold (balanced and not), the dual two-pass kernel's products
    ("bf16x3e-f32-gqa-T4", GQA, "replay", "float32", None, torch.bfloat16, 4, 3, 7,
     {"S_PREC": "bf16x3e", "F_FOLD_PREC": "bf16x3e"}),
    ("bf16x3e-balanced-f32-T3", TALL, "replay", "float32", None, torch.bfloat16, 3, 4, 7,
     {"F_BALANCED": {"per_sm": 1}, "F_BLOCK_V": 16, "F_FOLD_PREC": "bf16x3e"}),
    ("bf16x3e-2pass-dual-bf16-T3", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 3, 4, 7,
     {"COMMIT_FOLD": False, "F_TWO_PASS": True, "F_CHUNK_K": 16, "F_P_PREC": "bf16x3e", "F_FOLD_PREC": "bf16x3e"}),
    # the state chunks through a TMA descriptor (fp32 read copy; a dual bf16 low copy, 2 row tiles)
    ("tma-f32-gqa-T3", GQA, "replay", "float32", None, torch.bfloat16, 3, 3, 6, {"BLOCK_V": 16, "TMA": True}),
    ("tma-dual-bf16-T4", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 4, 4, 8,
     {"BLOCK_V": 16, "CHUNK_K": 16, "TMA": True}),
]


@pytest.mark.parametrize("case", VERIFY_CASES, ids=[c[0] for c in VERIFY_CASES])
def test_verify_commit_match_reference(case):
    name, sh, mode, sd, lo, act, T, K, L, cfg = case
    g = gen(7)
    slots, batch = 4, (2 if sh is GQA else 3)
    rs, rr = make_pair(sh, slots, L, K, mode, sd, lo, act, g)
    flushes = 0
    for cyc in range(6):
        idx = random_rows(slots, batch, g).long()     # int64 indices are accepted too
        x = step_inputs(sh, batch, act, g, T=T)
        out = poisoned(x["v"])
        o = GD.verify(rs, **x, state_indices=idx, out=out, config=cfg)
        o_ref = R.gdn_verify(rr, **x, state_indices=idx)
        assert rel_err(o, o_ref) <= out_tol(act), f"{name} cycle {cyc}: {rel_err(o, o_ref):.3g}"
        assert (o[idx < 0] == 0).all()
        state_check(rs, rr, f"{name} verify {cyc}")
        acc = torch.randint(0, T + 1, (batch,), generator=g).to(DEV)
        live = idx >= 0
        flushes += int((rr.cursor[idx[live].long()] + acc[live] >= K).sum())
        GD.commit(rs, acc, idx, config=cfg)
        R.gdn_commit(rr, acc, idx)
        state_check(rs, rr, f"{name} commit {cyc}")
        if cyc % 2:   # a plain decode step between speculative rounds
            x = step_inputs(sh, batch, act, g)
            flushes += int((rr.cursor[idx[live].long()] + 1 >= K).sum())
            o = GD.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]), config=cfg)
            o_ref = R.gdn_replay_step(rr, **x, state_indices=idx)
            assert rel_err(o, o_ref) <= out_tol(act)
            state_check(rs, rr, f"{name} step {cyc}")
    assert flushes >= 3, f"only {flushes} flushes exercised"


def test_verify_commit_long_horizon():
    """40 speculative rounds with random per-row accept counts (0..T, mixed in one batch) and
    padded rows, through the shipped fp32 commit route (the flush step's matrix-product fold,
    32 x 32 dk tiles here): outputs, checkpoints, cursors and buffers stay the reference's
    round after round, across many flushes. (Dual states commit through the fold kernel,
    which the GPU's 64-round CUDA-graph test runs.)"""
    g = gen(12)
    T, K, L, slots, batch = 3, 4, 7, 4, 3
    rs, rr = make_pair(TALL, slots, L, K, "replay", "float32", None, torch.bfloat16, g)
    flushes = 0
    for rnd in range(40):
        idx = random_rows(slots, batch, g)
        x = step_inputs(TALL, batch, torch.bfloat16, g, T=T)
        o = GD.verify(rs, **x, state_indices=idx, out=poisoned(x["v"]))
        assert rel_err(o, R.gdn_verify(rr, **x, state_indices=idx)) <= TOL_BF16_OUT, f"round {rnd}"
        acc = torch.randint(0, T + 1, (batch,), generator=g).to(DEV)
        live = idx >= 0
        flushes += int((rr.cursor[idx[live].long()] + acc[live] >= K).sum())
        GD.commit(rs, acc, idx)
        R.gdn_commit(rr, acc, idx)
        state_check(rs, rr, f"round {rnd}")
    assert flushes >= 15, f"only {flushes} flushes exercised"


# ----------------------------------------------------------------------------- GPU compile (CPU side)
_COMPILE_SCRIPT = r"""
import json, torch
from replayssm.triton import gdn as G
from replayssm.state import GDNReplayState
Hk, Hv, dk, dv, M = 16, 64, 128, 128, "meta"
def x(b, T=None):
    lead = (b,) if T is None else (b, T)
    e = lambda *s, dt=torch.bfloat16: torch.empty(*lead, *s, dtype=dt, device=M)
    return dict(q=e(Hk, dk), k=e(Hk, dk), v=e(Hv, dv), g=e(Hv, dt=torch.float32), beta=e(Hv, dt=torch.float32))
def rs(mode, lo=None, L=16, sd="float32"):
    return GDNReplayState.allocate(8, Hk, Hv, dk, dv, L, 16, mode=mode, lo_dtype=lo, state_dtype=sd, device=M)
res = {}
for b in (1, 256):
    i = x(b)
    res[f"eager b{b}"] = G.plan_eager(torch.empty(8, Hv, dv, dk, device=M), **i, state_indices=None, scale=.1, o=i["v"])
    modes = [("replay", None, "float32"), ("dual", "float8_e4m3", "float32")]
    if b > 1:   # the large-batch table: SPLIT routes, 16- and 8-bit read copies
        modes += [("replay", None, "bfloat16"), ("dual", "bfloat16", "float32"),
                  ("shared-low", "float8_e4m3", "float32")]
    if b == 1:   # bf16 state, batch 16: the 8 x 1 route with its rare path as a call (PENDING_CALL)
        i16 = x(16)
        res["replay bf16 route b16"] = G.plan_replay(rs("replay", sd="bfloat16"), **i16, state_indices=None, scale=.1,
                                                     o=i16["v"])[0]
    for mode, lo, sd in modes:
        for j, p in enumerate(G.plan_replay(rs(mode, lo, sd=sd), **i, state_indices=None, scale=.1, o=i["v"])):
            res[f"replay {mode} {lo or sd} b{b} launch {j}"] = p
    if b == 1:  # the small-batch eager route at another tile; batch 32's row (two heads x 4 chunks per program)
        i32 = x(32)
        for j, p in enumerate(G.plan_replay(rs("replay"), **i32, state_indices=None, scale=.1, o=i32["v"])):
            res[f"replay replay float32 b32 launch {j}"] = p
        for mode, lo in (("replay", None), ("dual", "bfloat16")):
            res[f"replay eager-route {mode} b1"] = G.plan_replay(rs(mode, lo), **i, state_indices=None, scale=.1,
                                                                 o=i["v"], config={"EAGER_ROUTE": True, "BLOCK_V": 8,
                                                                                   "num_warps": 1})[0]
            for rk, bv in ((2, 4), (4, 8)):   # the deferred route (ROUTE_K)
                res[f"replay deferred-route k{rk} {mode} b1"] = G.plan_replay(
                    rs(mode, lo), **i, state_indices=None, scale=.1, o=i["v"],
                    config={"EAGER_ROUTE": True, "ROUTE_K": rk, "BLOCK_V": bv, "num_warps": 1})[0]
    if b > 1:   # the flush step's rank-1 fold (FOLD_MMA is the default; one chunk per program: at the
        # table's two it spills); the opt-in two-pass dual flush
        res["replay rank-1 flush step b256"] = G.plan_replay(rs("replay"), **i, state_indices=None, scale=.1,
                                                             o=i["v"], config={"F_FOLD_MMA": False, "F_NR": 1})[-1]
        res["replay dual two-pass b256 launch 1"] = G.plan_replay(
            rs("dual", "bfloat16"), **i, state_indices=None, scale=.1, o=i["v"],
            config={"F_TWO_PASS": True, "F_BLOCK_V": 128, "F_num_warps": 4, "F_CHUNK_K": 16})[-1]
    res[f"fold dual b{b}"] = G.plan_fold(rs("dual", "float8_e4m3"), torch.empty(b, dtype=torch.int32, device=M), None, 1)
    iv = x(b, 4)
    if b > 1:   # int64 state indices (accepted by the ops): the flush steps' rank lookups (session 25)
        i64 = torch.empty(b, dtype=torch.int64, device=M)
        res["replay int64 indices b256 launch 1"] = G.plan_replay(rs("replay"), **i, state_indices=i64, scale=.1,
                                                                  o=i["v"])[-1]
        res["commit scan int64 indices b256 launch 1"] = G.plan_commit(
            rs("replay", None, 20), torch.empty(b, dtype=torch.int32, device=M), i64, {"F_COMPACT": False})[-1]
    res[f"verify T4 b{b}"] = G.plan_verify(rs("dual", "bfloat16", 20), **iv, state_indices=None, scale=.1, o=iv["v"])
    res[f"verify fp32 T4 b{b}"] = G.plan_verify(rs("replay", None, 20), **iv, state_indices=None, scale=.1, o=iv["v"])
    res[f"verify tf32x3 T4 b{b}"] = G.plan_verify(rs("replay", None, 20), **iv, state_indices=None, scale=.1,
                                                 o=iv["v"], config={"S_PREC": "tf32x3", "SMALL_PREC": "tf32x3"})
    acc = torch.empty(b, dtype=torch.int32, device=M)
    for mode, lo in (("replay", None), ("dual", "bfloat16")):
        for j, p in enumerate(G.plan_commit(rs(mode, lo, 20), acc, None, {"COMMIT_FOLD": False})):
            res[f"commit {mode} b{b} launch {j}"] = p
    if b > 1:   # Qwen3.5-4B's 32 value heads: the balanced fold
        half = GDNReplayState.allocate(8, Hk, 32, dk, dv, 20, 16, device=M)
        res[f"commit balanced b{b} launch 1"] = G.plan_commit(half, acc, None)[1]
    for j, p in enumerate(G.plan_refresh_lo(rs("dual", "float8_e4m3"), None, b)):   # a routed dual state's verify
        res[f"refresh lo b{b} launch {j}"] = p
    iv6 = x(b, 6)
    res[f"verify T6 b{b}"] = G.plan_verify(rs("dual", "bfloat16", 22), **iv6, state_indices=None, scale=.1, o=iv6["v"])
    iv8 = x(b, 8)
    res[f"verify T8 b{b}"] = G.plan_verify(rs("dual", "bfloat16", 20), **iv8, state_indices=None, scale=.1, o=iv8["v"])
print(json.dumps({k: G.compile_offline(p) for k, p in res.items()}))
"""


# Launches whose table row was timed faster with a small spill than without it (bytes of spill
# stores / loads allowed): the dual verify at T 6 under its 168-register budget, 6 programs per
# SM instead of 5 (b256 Qwen3.5-122B 617 vs 666 us per round, Qwen3.5-4B 328 vs 352;
# results/device-logs-20261130-s12/tune_spec_s12e_T6.txt); with the state chunks through TMA
# (TMA_T) 16 bytes at T 6 and 4 at T 4, timed faster than without TMA at b32-512
# (results/device-logs-20261201-s13/: T4 b256 Qwen3.5-4B 263.0 vs 268.8 us, T6 324.6 vs 328.7).
# (The dual flush step spilled 4-28 bytes from session 22 until its chunks came through TMA:
# none since sessions 24-25.) The commit's opt-in batch-wide scan (F_COMPACT False, not a table
# route; compiled here for its int64 indices) spills 20 bytes under the commit row's 160-register
# budget with TMA. The dual output launch above batch 128 (RD_MMA, 64-row chunks under an
# 80-register budget, 6 programs per SM) spills 12 / 16 bytes, timed faster than the same
# chunks without it (104 registers, no spill) at b256 Qwen3.5-122B 239.7 vs 251.0 us
# (results/device-logs-20261202-s26/tune_gdn_s26c.txt).
SPILL_ALLOWED = {"verify T4 b256": 4, "verify T6 b256": 16, "commit scan int64 indices b256 launch 1": 24,
                 "replay dual bfloat16 b256 launch 0": 16}


@pytest.mark.skipif(CUDA, reason="the CUDA run compiles and runs the kernels for real")
def test_kernels_compile_for_hopper_without_spills():
    """Compile the kernels at Qwen3.5-122B dims for sm_90 (no GPU needed): catches code the
    interpreter accepts but the compiler rejects, and register spills in the launch table (but
    those of SPILL_ALLOWED)."""
    import triton
    if not os.path.exists(os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")):
        pytest.skip("triton wheel without the NVIDIA backend binaries")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    r = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    use = json.loads(r.stdout.strip().splitlines()[-1])
    for name, u in use.items():
        allowed = SPILL_ALLOWED.get(name, 0)
        assert u["spill_stores"] <= allowed and u["spill_loads"] <= allowed, f"{name} spills: {u}"
        assert allowed or (u["local"] == 0 and u["stack"] == 0), f"{name} spills: {u}"
        # verify: the H200-measured fastest launch (128 rows / 2 warps, tools/tune_spec.py) holds
        # ~235 registers, i.e. 4 programs per SM; the dual flush step and the dual commit (the
        # triangular solve; they move 1/K of the states; tools/tune_gdn.py flush-dual-*,
        # tune_spec.py d2p-*) up to 255; the streaming kernels need <= 192 for occupancy
        dual_flush = name.startswith("replay dual") and name.endswith("launch 1")
        commit_fold = name.startswith("commit") and name.endswith("launch 1")   # 32-entry tiles, 1/K of the states
        limit = 255 if name.startswith("verify") or dual_flush or commit_fold else 192
        assert u["regs"] <= limit, f"{name}: {u['regs']} registers/thread (occupancy)"


# ----------------------------------------------------------------------------- CUDA only
QWEN = {"qwen3.5-4b": I.GDNShape(16, 32, 128, 128), "qwen3.5-122b": I.GDNShape(16, 64, 128, 128)}
cuda_only = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


@cuda_only
@pytest.mark.parametrize("model", list(QWEN))
@pytest.mark.parametrize("batch", [1, 7, 16, 64, 512])   # 16: the dual rows' 64-row MMA chunks (session 26)
@pytest.mark.parametrize("mode,lo,sd", [("replay", None, "float32"), ("dual", "bfloat16", "float32"),
                                        ("replay", None, "bfloat16"), ("dual", "float8_e4m3", "float32")],
                         ids=["f32", "dual-bf16", "bf16-state", "dual-fp8"])
def test_real_dims(model, batch, mode, lo, sd):
    sh = QWEN[model]
    g = gen(8)
    K, L, T = 4, 8, 4
    rs, rr = make_pair(sh, batch, L, K, mode, sd, lo, torch.bfloat16, g)
    st = I.random_state(batch, sh.num_v_heads, sh.head_v_dim, sh.head_k_dim, device=DEV, gen=g)
    st_ref = st.clone()
    idx = torch.arange(batch, dtype=torch.int32, device=DEV).flip(0)
    if batch > 1:
        idx[1] = -1
    for step in range(K + 1):
        x = step_inputs(sh, batch, torch.bfloat16, g)
        o = GD.eager_step(st, **x, state_indices=idx, out=poisoned(x["v"]))
        assert rel_err(o, R.gdn_eager_step(st_ref, **x, state_indices=idx)) <= TOL_BF16_OUT
        o = GD.replay_step(rs, **x, state_indices=idx, out=poisoned(x["v"]))
        assert rel_err(o, R.gdn_replay_step(rr, **x, state_indices=idx)) <= TOL_BF16_OUT
        state_check(rs, rr, f"step {step}")
    assert rel_err(st, st_ref) <= TOL_F32
    x = step_inputs(sh, batch, torch.bfloat16, g, T=T)
    o = GD.verify(rs, **x, state_indices=idx, out=poisoned(x["v"]))
    assert rel_err(o, R.gdn_verify(rr, **x, state_indices=idx)) <= TOL_BF16_OUT
    acc = torch.randint(0, T + 1, (batch,), generator=g).to(DEV)
    GD.commit(rs, acc, idx)
    R.gdn_commit(rr, acc, idx)
    state_check(rs, rr, "commit")


@cuda_only
@pytest.mark.parametrize("model", list(QWEN))
@pytest.mark.parametrize("batch", [256, 512])     # 512: two tiles a program, no eviction hints (session 29)
def test_eager_bf16_state_real_dims(model, batch):
    sh = QWEN[model]
    g = gen(9)
    st = I.random_state(batch, sh.num_v_heads, sh.head_v_dim, sh.head_k_dim, dtype=torch.bfloat16, device=DEV, gen=g)
    st_ref = st.clone()
    idx = torch.arange(batch, dtype=torch.int32, device=DEV).flip(0)
    idx[3] = -1
    for step in range(3):
        x = step_inputs(sh, batch, torch.bfloat16, g)
        o = GD.eager_step(st, **x, state_indices=idx, out=poisoned(x["v"]))
        assert rel_err(o, R.gdn_eager_step(st_ref, **x, state_indices=idx)) <= TOL_BF16_OUT, f"step {step}"
        assert (o[3] == 0).all(), "padded row must be 0"
        bad = (st.double() - st_ref.double()).abs() > 2 * ULP[torch.bfloat16] * st_ref.double().abs() + 1e-6
        assert not bad.any(), f"step {step}: {int(bad.sum())} state elements off by > 2 ulp"
        st_ref.copy_(st)


@cuda_only
@pytest.mark.parametrize("model", list(QWEN))
@pytest.mark.parametrize("mode,sd,lo", [("dual", "float32", "bfloat16"), ("replay", "bfloat16", None),
                                        ("dual", "float32", "float16")], ids=["dual-bf16", "bf16-state", "dual-f16"])
@pytest.mark.parametrize("cfg", [{"RD_MMA": False}, {"RD_MMA": True, "num_stages": 1},
                                 {"RD_MMA": True, "num_stages": 1, "BLOCK_V": 64, "NR": 2, "maxnreg": 80}],
                         ids=["unpacked", "mma", "mma-64x2"])
def test_16bit_read_dots_keep_fp32_accuracy(model, mode, sd, lo, cfg):
    # RD_MMA (session 26): the read copy's S k and S q as 16-bit tensor-core products (wgmma at
    # these tiles) with k and q as three 16-bit terms, against the reference with fp32 activations,
    # so no output rounding hides an error of the dots: as tight as the unpacking route's
    sh = QWEN[model]
    g = gen(21)
    batch = 128
    rs, rr = make_pair(sh, batch, 16, 16, mode, sd, lo, torch.float32, g)
    row = GD._kernels().pick_config("replay", batch, sh.head_v_dim, sh.head_k_dim, 16, None,
                                    state_bytes=2, dual=mode == "dual", heads=sh.num_v_heads)
    for step in range(3):
        x = step_inputs(sh, batch, torch.float32, g)
        o = GD.replay_step(rs, **x, out=poisoned(x["v"]), config={**row, **cfg})
        err = rel_err(o, R.gdn_replay_step(rr, **x))
        assert err <= TOL_F32, f"step {step}: {err:.3g}"
        state_check(rs, rr, f"step {step}")


@cuda_only
@pytest.mark.parametrize("mode,lo,batch", [("replay", None, 12), ("dual", "float8_e4m3", 12), ("replay", None, 24),
                                           ("dual", "bfloat16", 24)], ids=["f32", "dual-fp8", "f32-b24", "dual-bf16-b24"])
def test_cuda_graph_replay_steps(mode, lo, batch):
    """Capture one replay step in a CUDA graph; replay 72 steps (K = 8: flushes at different
    steps per sequence) comparing with the reference step by step. Batch 12: the routes of small
    batches (fp32: the eager route; dual fp8 at 384 heads: the high copy's); 24: the buffered
    SPLIT rows, state chunks through TMA."""
    sh, K = QWEN["qwen3.5-4b"], 8
    g = gen(9)
    rs, rr = make_pair(sh, batch + 4, K, K, mode, "float32", lo, torch.bfloat16, g)
    idx = random_rows(batch + 4, batch, g)
    static = step_inputs(sh, batch, torch.bfloat16, g)
    out = torch.empty_like(static["v"])
    GD.replay_step(rs, **static, state_indices=idx, out=out)      # compile + warm up outside the graph
    R.gdn_replay_step(rr, **static, state_indices=idx)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        GD.replay_step(rs, **static, state_indices=idx, out=out)
    torch.cuda.current_stream().wait_stream(s)
    state_check(rs, rr, "after capture")   # capturing must not have run the step
    for step in range(72):
        x = step_inputs(sh, batch, torch.bfloat16, g)
        for k_, v_ in x.items():
            static[k_].copy_(v_)
        out.fill_(float("nan"))
        graph.replay()
        o_ref = R.gdn_replay_step(rr, **x, state_indices=idx)
        assert rel_err(out, o_ref) <= TOL_BF16_OUT, f"step {step}"
        state_check(rs, rr, f"graph step {step}")


@cuda_only
@pytest.mark.shipped_routes
def test_cuda_graph_dual_route_and_buffered_steps():
    """A dual bf16 state at Qwen3.5-4B's dims driven by two captured steps over overlapping
    slots: the shipped eager route at batch 2 (high copy only, low copy marked stale) and the
    buffered SPLIT step at batch 24, replayed 64 times in a random order: the buffered step
    flushes the rows the route left stale, all on the device. Checked against the reference's
    route semantics after every replay."""
    from replayssm.triton import gdn as TK
    sh, K, slots = QWEN["qwen3.5-4b"], 8, 28
    g = gen(13)
    rs, rr = make_pair(sh, slots, K, K, "dual", "float32", "bfloat16", torch.bfloat16, g)
    perm = torch.randperm(slots, generator=g).to(device=DEV, dtype=torch.int32)
    idx = {2: perm[:2].clone(), 24: perm[:24].clone()}       # the small batch's slots are in the large one
    idx[24][5] = -1
    static = {b: step_inputs(sh, b, torch.bfloat16, g) for b in idx}
    assert TK.state_takes_eager_route(rs, static[2]["k"], static[2]["v"])
    assert not TK.state_takes_eager_route(rs, static[24]["k"], static[24]["v"])
    out = {b: torch.empty_like(static[b]["v"]) for b in idx}
    graphs = {}
    for b in idx:
        scratch = copy.deepcopy(rs)
        GD.replay_step(scratch, **static[b], state_indices=idx[b], out=out[b])    # compile outside the graph
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        graphs[b] = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s), torch.cuda.graph(graphs[b], stream=s):
            GD.replay_step(rs, **static[b], state_indices=idx[b], out=out[b])
        torch.cuda.current_stream().wait_stream(s)
    order = [2 if r < 0.5 else 24 for r in torch.rand(64, generator=g).tolist()]
    stale_flushed = 0
    for t, b in enumerate(order):
        x = step_inputs(sh, b, torch.bfloat16, g)
        for k_, v_ in x.items():
            static[b][k_].copy_(v_)
        out[b].fill_(float("nan"))
        live = idx[b][idx[b] >= 0].long()
        stale_flushed += int(rr.lo_stale(live).sum()) if b == 24 else 0
        graphs[b].replay()
        o_ref = R.gdn_replay_step(rr, **x, state_indices=idx[b], route=b == 2)
        assert rel_err(out[b], o_ref) <= TOL_BF16_OUT, f"graph step {t} (batch {b})"
        if b == 2:      # rows past the cursor: the reference appended there, the route does not
            for name in ("u", "k", "g", "v", "beta"):
                getattr(rs, name).copy_(getattr(rr, name))
        state_check(rs, rr, f"graph step {t} (batch {b})")
    assert stale_flushed >= 4, stale_flushed


@cuda_only
@pytest.mark.parametrize("mode,lo,batch,T", [("dual", "bfloat16", 8, 4), ("dual", "bfloat16", 8, 6),
                                            ("replay", None, 96, 4)], ids=["dual-T4", "dual-T6", "f32-b96-T4"])
def test_cuda_graph_verify_commit(mode, lo, batch, T):
    """verify + commit (accepted counts read from a device tensor) captured in one graph, 64
    rounds; dual bf16 at T 4 and 6, the table's register-budgeted verify launches; fp32 at
    batch 96, whose commit takes the balanced fold (a grid of 6 programs per SM, whatever the
    number of flushing rows)."""
    sh, K = QWEN["qwen3.5-4b"], 6
    g = gen(10)
    rs, rr = make_pair(sh, batch + 8, K + T, K, mode, "float32", lo, torch.bfloat16, g)
    if batch > 64:
        from replayssm.triton import gdn as TK
        plan = TK.plan_commit(rs, torch.zeros(batch, dtype=torch.int64, device=DEV), None)
        assert plan[1][0] is TK._gdn_commit_balanced_kernel
    idx = random_rows(batch + 8, batch, g)
    static = step_inputs(sh, batch, torch.bfloat16, g, T=T)
    acc = torch.zeros(batch, dtype=torch.int64, device=DEV)
    out = torch.empty_like(static["v"])
    GD.verify(rs, **static, state_indices=idx, out=out)
    GD.commit(rs, acc, idx)
    R.gdn_verify(rr, **static, state_indices=idx)
    R.gdn_commit(rr, acc, idx)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(s), torch.cuda.graph(graph, stream=s):
        GD.verify(rs, **static, state_indices=idx, out=out)
        GD.commit(rs, acc, idx)
    torch.cuda.current_stream().wait_stream(s)
    for cyc in range(64):
        x = step_inputs(sh, batch, torch.bfloat16, g, T=T)
        for k_, v_ in x.items():
            static[k_].copy_(v_)
        acc.copy_(torch.randint(0, T + 1, (batch,), generator=g))
        out.fill_(float("nan"))
        graph.replay()
        o_ref = R.gdn_verify(rr, **x, state_indices=idx)
        R.gdn_commit(rr, acc, idx)
        assert rel_err(out, o_ref) <= TOL_BF16_OUT, f"cycle {cyc}"
        state_check(rs, rr, f"graph cycle {cyc}")
