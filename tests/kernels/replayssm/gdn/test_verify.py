"""Speculative verify and commit (gdn/verify.py, fold.py) against the reference."""
from __future__ import annotations

import pytest
import torch

from replayssm import reference as R
from replayssm.gdn import plan as TK

from kernel_checks import DEV, TOL_BF16_OUT, gen, out_tol, poisoned, random_rows, rel_err
from .checks import EVEN, GD, GQA, SMALL_TILES, TALL, TINY, make_pair, opts, state_check, step_inputs


def test_verify_precision_defaults():
    # fp32 state x bf16 keys: the two-pass truncation split; small fp32 products: three passes;
    # GDNOptions.verify_f32_precision names one precision for all of them instead
    for act, s_want in ((torch.bfloat16, "tf32x2t"), (torch.float32, "tf32x3t")):
        rs, _ = make_pair(GQA, 3, 7, 3, "replay", "float32", None, act, gen(3))
        x = step_inputs(GQA, 3, act, gen(4), T=4)
        meta = TK.plan_verify(rs, **x, state_indices=None, scale=0.3, o=x["v"], opt=opts()).meta
        assert (meta["S_PREC"], meta["SMALL_PREC"]) == (s_want, "tf32x3t"), act
    meta = TK.plan_verify(rs, **x, state_indices=None, scale=0.3, o=x["v"],
                          opt=opts(verify_f32_precision="tf32x3")).meta
    assert (meta["S_PREC"], meta["SMALL_PREC"], meta["K_PREC"]) == ("tf32x3",) * 3


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
    # the balanced fold's chunks through TMA: the pointer stores of a head with a
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
    for cyc in range(4):
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
    """12 speculative rounds with random per-row accept counts (0..T, mixed in one batch) and
    padded rows, through the shipped fp32 commit route (the flush step's matrix-product fold,
    32 x 32 dk tiles here): outputs, checkpoints, cursors and buffers stay the reference's
    round after round, across many flushes. (Dual states commit through the fold kernel,
    which the GPU's 64-round CUDA-graph test runs.)"""
    g = gen(12)
    T, K, L, slots, batch = 3, 4, 7, 4, 3
    rs, rr = make_pair(TALL, slots, L, K, "replay", "float32", None, torch.bfloat16, g)
    flushes = 0
    for rnd in range(12):
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
    assert flushes >= 6, f"only {flushes} flushes exercised"
