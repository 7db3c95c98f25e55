"""GDN replay step (gdn/replay.py, flush_step.py) against the reference: fused and SPLIT
routes, the flush step's folds, TMA and MMA read paths, byte counts."""
from __future__ import annotations

import pytest
import torch

from replayssm import reference as R
from replayssm.gdn import plan as TK
from replayssm.state import ByteCounter, GDNReplayState

from kernel_checks import DEV, gen, out_tol, poisoned, rel_err
from .checks import EVEN, GD, GQA, TALL, TINY, make_pair, opts, random_steps, state_check, step_inputs


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
    # and the triangular solve's small fp32 products as six bf16 MMAs (mma "bf16x6")
    ("dual-bf16-tall-split-foldmma-bf16x6", TALL, "dual", "float32", "bfloat16", torch.bfloat16, 6, 4,
     {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16, "F_NR": 4, "F_FOLD_MMA": True, "F_P_PREC": "bf16x3e",
      "F_FOLD_PREC": "bf16x3e", "F_SMALL_PREC": "bf16x6"}),
    ("f32-gqa-split-foldmma-bf16x3e", GQA, "replay", "float32", None, torch.bfloat16, 5, 4,
     {"BLOCK_V": 8, "SPLIT": True, "F_BLOCK_V": 16, "F_HP": 2, "F_FOLD_MMA": True, "F_FOLD_PREC": "bf16x3e"}),
    # the flush step's stores through TMA too (ST_TMA: high copy, 16-bit low copy; an
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
    # a 16-bit read copy's dots as one tensor-core product per chunk (RD_MMA: k and q
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
    plans = TK.plan_replay(rs, **x, state_indices=None, scale=0.3, o=x["v"], opt=opts("replay", cfg))
    assert len(plans) == 2, name
    if cfg.get("F_TWO_PASS"):   # the two-pass dual kernel: the step's rows scanned, outputs rewritten
        assert plans[1].kernel is TK.gdn_dual_2pass_kernel and plans[1].meta["WRITE_O"] and not plans[1].meta["COMPACT"]
    else:
        assert bool(plans[1].meta.get("FOLD_MMA")) is cfg["F_FOLD_MMA"], name


def test_fold_mma_is_the_default_for_16_and_32_bit_high_copies():
    for mode, sd, lo in (("replay", "float32", None), ("dual", "float32", "bfloat16"),
                         ("dual", "float32", "float8_e4m3"), ("replay", "bfloat16", None)):
        rs, _ = make_pair(TALL, 4, 6, 4, mode, sd, lo, torch.bfloat16, gen(3))
        x = step_inputs(TALL, 3, torch.bfloat16, gen(4))
        plans = TK.plan_replay(rs, **x, state_indices=None, scale=0.3, o=x["v"],
                               opt=opts("replay", {"BLOCK_V": 16, "SPLIT": True, "F_BLOCK_V": 16}))
        assert plans[1].meta.get("FOLD_MMA") is True, (mode, sd, lo)


@pytest.mark.parametrize("act,want", [(torch.bfloat16, ("bf16x3e", "bf16x3e")), (torch.float16, ("tf32x3", "tf32x2t")),
                                      (torch.float32, ("tf32x3", "tf32x3t"))])
def test_flush_step_key_products_by_key_dtype(act, want):
    """want: (FOLD_PREC, dual P_PREC). The flush step's products against the raw keys (dual:
    S_0 Kb^T, P_PREC; every fold: FOLD_PREC) take three bf16 terms of the fp32 side ("bf16x3e")
    only where the keys are exact in bf16; fp16 / fp32 keys fall back to the truncation split /
    Triton's "tf32x3". The dual rows pipeline their chunk loop at depth 3 and store through TMA."""
    Hk, Hv, dk, dv, batch = 16, 64, 128, 128, 256
    e = lambda *s, dt=act: torch.empty(batch, *s, dtype=dt, device="meta")
    x = dict(q=e(Hk, dk), k=e(Hk, dk), v=e(Hv, dv), g=e(Hv, dt=torch.float32), beta=e(Hv, dt=torch.float32))
    for mode, sd in (("dual", "float32"), ("replay", "float32"), ("replay", "bfloat16")):
        rs = GDNReplayState.allocate(batch, Hk, Hv, dk, dv, 16, 16, mode=mode, state_dtype=sd, act_dtype=act,
                                     lo_dtype="bfloat16" if mode == "dual" else None, device="meta")
        meta = TK.plan_replay(rs, **x, state_indices=None, scale=.1, o=x["v"], opt=opts())[-1].meta
        assert meta["FOLD_MMA"] and meta["FOLD_PREC"] == want[0], (mode, sd)
        if mode == "dual":
            assert meta["P_PREC"] == want[1]
            assert meta["num_stages"] == 3 and meta["ST_TMA"] is True


@pytest.mark.parametrize("case", REPLAY_CASES, ids=[c[0] for c in REPLAY_CASES])
def test_replay_matches_reference(case):
    name, sh, mode, sd, lo, act, L, K, cfg = case
    g = gen(3)
    slots = 4
    batch = 2 if sh is GQA else 3
    rs, rr = make_pair(sh, slots, L, K, mode, sd, lo, act, g)
    flushes = random_steps(rs, rr, sh, slots, batch, act, g, 6 if sh in (TINY, GQA) else 5, cfg, name)
    assert flushes >= 3, f"only {flushes} flush steps exercised"


@pytest.mark.parametrize("sh,lo,cfg,st", [(EVEN, "bfloat16", {"F_NR": 2}, True), (EVEN, "float8_e4m3", {}, True),
                                          (TALL, "bfloat16", {"F_NR": 2}, False),
                                          (EVEN, "bfloat16", {"F_TMA": False}, False)],
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
    x = step_inputs(sh, 3, torch.float32, gen(4))
    return TK.plan_replay(rs, **x, state_indices=None, scale=0.3, o=x["v"], opt=opts("replay", cfg))[1].meta


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
