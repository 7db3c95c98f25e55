"""Triton kernels for Mamba-2 decode: the eager baseline and ReplaySSM.

Kernels (all CUDA-graph safe: fixed grids, every per-sequence decision on the device):
    _eager_kernel        S <- a S + dt x B^T; y = S C + D x (* silu z)      reads+writes S
    _replay_step_kernel  output-only route from checkpoint + buffer, append; fused flush
                         (fold + write checkpoint) for sequences whose cursor reaches K;
                         optionally moves the cursor itself (atomic ticket)
    _replay_flush_kernel the second launch of the "split" route (tuning alternative): the
                         fold of the sequences that flush this step
    _buffer_bc_kernel    large batches: B_i . C per (batch row, group), read by the step
                         (PRE_BC) instead of computed in each of the group's programs; with
                         COEF every per-head term of the step's output route (PRE_COEF)
    _fold_kernel         fold committed entries into the checkpoint (flush and commit; LIST:
                         the rows _commit_list_kernel listed, by a few workers per head tile)
    _commit_list_kernel  a commit's cursor moves and its list of folding rows (batch <= 128)
    _verify_kernel       T speculative drafts' outputs from checkpoint + buffer; writes drafts
    _cursor_kernel       the cursor pass that runs after the kernels above when they do
                         not move the cursor themselves (see below)

Launchers (eager_step, replay_step, flush, commit, verify, advance_cursor) run the launches
that the matching plan_* functions record (Launch objects); compile_offline compiles a
recorded launch for sm_90 on a machine without a GPU and reports registers and spills.

Shapes (letters as in replayssm.state): x [b, H, P], dt [b, H], B/C [b, G, N], z [b, H, P];
checkpoints [S, H, P, N] (+ fp8 row scales [S, H, P]); buffer x [S, L, H, P], B [S, L, G, N],
dt [S, L, H]. Head h uses group h // (H / G).

Grid of every per-head kernel: (row tiles of P, H, batch rows). Axis 0 is the fastest in
launch order, so the programs of one sequence and group run close together and the group's
buffered B rows (read by every head of the group) stay in L2. An eager/fold/verify program
owns ROW_CHUNKS consecutive chunks of BLOCK_P rows of one head and the whole state row (N);
a replay-step program owns one [rows, N] tile, loaded with one 2-D load before anything that
depends on the cursor. Per-head work that does not depend on the rows (decay weights,
B_i . C) is done once per program, so fewer, taller programs read the buffer less; at large
batches B_i . C (the same for every head of a group) comes from a launch ahead of the step
(REPLAY_CONFIGS' bc rows), and with it every per-head term of the output route (coef: the
decay weights too, and the dt / B appends), so a program's own work is its tile.

The cursor. Every program of a sequence reads cursor[slot]; programs are not ordered, so no
program may simply write it. Either the step takes it with an atomic ticket (one relaxed
atomic_add per program; the program drawing the last ticket stores the new cursor: one
launch), or a separate tiny kernel (_cursor_kernel) writes it right after, on the same
stream (two launches, no atomics). The cursor word's bit 15 (LO_STALE, replayssm.state) says
that a dual state's low copy is stale: the eager route leaves it so (writing the high copy
alone) and the next buffered step flushes that sequence (refreshing the copy) instead of
reading it. Both are graph-safe with no host sync; REPLAY_CONFIGS
picks per batch bucket (docs/kernels.md). In a model whose layers share one cursor tensor
the move can run once per step for all layers (replayssm.mamba2.replay_step(...,
advance_cursor=False) then replayssm.mamba2.advance_cursors).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..state import CURSOR_MASK, EPOCH_ROWS, LO_STALE
from ..common.jit import cast, clear_lo_stale_kernel, gdc_release, gdc_wait_prior, list_commit_rows, prefetch_hint, \
    route_next_word, route_ticket, route_word, silu, softplus
from ..common.launch import Launch, cache_lines, last_contig, out_like, pdl_meta, state_scratch, tma_rows
from ..common.mma import bf16_split3, mma_acc, mma_precision
from ..common.offline import compile_launch

_CUR_MASK = tl.constexpr(CURSOR_MASK)
_LO_STALE = tl.constexpr(LO_STALE)

# ----------------------------------------------------------------------------- launch configs
# Tables for the lead to tune; defaults measured on an H200 by tools/tune_mamba2.py (see
# docs/kernels.md, "H200 tuning"). Buckets: "small" = batch * H < SMALL_PROGRAMS (too few
# programs to fill 132 SMs; batch 1), "large" otherwise (batch 32 and up at the real dims).
# State element size 8 (fp64) uses the 4-byte rows.
#
# CONFIG_TABLE (eager, fold, verify). Key: (kernel, bytes per element of the state the kernel
# streams, bucket). Value: (BLOCK_P, ROW_CHUNKS, num_warps), or a list of candidates
# (BLOCK_P, ROW_CHUNKS, num_warps, p_mod) of which the first with P % p_mod == 0 is used (the
# last one always). BLOCK_P is clamped to next_pow2(P); ROW_CHUNKS = 0 means "the whole head
# in one program" (cdiv(P, BLOCK_P) chunks); otherwise it moves to the nearest divisor of the
# head's chunk count, so no program carries an all-masked chunk.
SMALL_PROGRAMS = 2048
CONFIG_TABLE: dict[tuple[str, int, str], tuple | list] = {
    # kernel    bytes  bucket      BLOCK_P CHUNKS warps
    ("eager",  4, "small"): (32, 1, 8),        # batch 1, Super: 4.44 us vs 4.99 (16 rows / 4 warps), vLLM 4.58
    ("eager",  4, "large"): (32, 1, 8),        # 97 % of copy at batch 256 (16 rows / 4 warps: 93 %)
    # 8 rows x 1 warp (session 17, tune_mamba2_s17a/b.txt; vs 16 x 4): Nano b1 / b8 / b16 3.46 /
    # 10.37 / 18.19 us vs 3.53 / 10.85 / 19.21, Super 3.51 / 10.93 / 19.35 vs 3.58 / 11.39 / 19.34
    ("eager",  2, "small"): (8, 1, 1),
    # 16 rows x 1 warp (session 17, tune_mamba2_s17c.txt; vs the rows it replaced, whole 64-row heads
    # on 8 warps where P % 64 == 0, else 16-row chunks of the whole head on 4 warps): b256 / b512
    # Nano 254.6 / 504.8 us (95 % of copy) vs 262.7 / 519.9, Super 271.4 / 538.9 vs 272.4 / 541.0;
    # b32 (tune_mamba2_s17a.txt, 8 x 1 there) Nano 35.0 vs 37.4, Super 37.1-37.3 vs 37.2
    ("eager",  2, "large"): (16, 1, 1),
    ("fold",   4, "small"): (16, 1, 4),
    # whole-head programs: a commit's mostly idle grid is 1/4 the size. 2 warps: T4 verify + commit
    # round b256 Super 472 us vs 488 (4 warps), Nano 577 vs 588; b32 Super 75.4 vs 74.4
    # (tools/tune_spec.py, one run, tune_spec_s10d.txt)
    ("fold",   4, "large"): (16, 0, 2),
    ("fold",   2, "small"): (16, 1, 4),
    ("fold",   2, "large"): (16, 0, 4),
    ("fold",   1, "small"): (16, 1, 4),
    ("fold",   1, "large"): (16, 0, 4),
    # verify: 16-32 rows per warp (the MMA's M); 4-8 warps per program ran at a third of the rate
    # (tools/tune_spec.py, H200, T 4, b256: Super 64x2w 487 us, 32x2w 557, 16x4w 2110; Nano 32x2w 582).
    # Heads of 64k + r rows (Nano: 80): the whole head per program (CHUNKS 0: a 64-row tile and a
    # tail tile, plan_verify): round 465 us vs 628 in 32-row tiles, 567 in two 64-row tiles, 565
    # in one 128-row tile (Nano b256 fp32, bf16x2; tune_spec_s11b.txt)
    ("verify", 4, "small"): [(64, 1, 2, 64), (32, 1, 2)],
    ("verify", 4, "large"): [(64, 1, 2, 64), (64, 0, 2)],
    ("verify", 2, "small"): [(64, 1, 2, 64), (32, 1, 2)],
    # dual bf16 Super: 385 us (32x2w 483); Nano whole heads 364 us vs 497 (32 x 2) and 453 (two
    # 64-row programs; tune_spec_s11g.txt). fp8 read copies: Nano's tiles not timed, unchanged
    ("verify", 2, "large"): [(64, 1, 2, 64), (64, 0, 2)],
    ("verify", 1, "small"): [(64, 1, 2, 64), (32, 1, 2)],
    ("verify", 1, "large"): [(64, 1, 2, 64), (32, 1, 2)],
}
# (bytes per element of the read copy, bucket) whose verify reads its state chunks through TMA
# descriptors (plan_verify; OVERRIDE["verify"]["tma"] decides otherwise). T4 verify + commit
# round, fp32 states (tools/tune_spec.py, tune_spec_s13h.txt, _s13i.txt): Super b128 232.9 us vs
# 239.4, b256 443.2 vs 456.2; Nano (64 + 16-row tiles) b128 243.9 vs 244.2, b256 466.8 vs 466.9.
# bf16 read copies (dual) lose with it: Super b128 208.5 vs 197.6, Nano 209.2 vs 193.0
VERIFY_TMA = {(4, "large")}
# REPLAY_CONFIGS (the step kernel). Key: (bytes per element of the copy the output path reads,
# bucket: "one" (batch 1), "small" / "large" (as above, batch > 1), or "route": the rows of
# batches <= ROUTE_BATCH[bytes] while SMALL_BATCH_ROUTE). Value:
# candidates (dicts), the first whose "p_mod" divides P is used (the last one
# always); keys not given take REPLAY_DEFAULTS. A program is one [block_p, N] tile
# (block_p a power of 2, clamped to next_pow2(P)), loaded with one 2-D load.
#   block_p, warps  rows per program, num_warps
#   route    "fused": one launch; sequences whose cursor reaches K fold and write the
#            checkpoint inside the step kernel. "split": a lean output-only step kernel for
#            every sequence + _replay_flush_kernel, whose programs return at once unless their
#            sequence flushes (two launches; measured slower everywhere: its mostly empty grid
#            still costs a wave of programs per SM, and without a low copy a flushing
#            sequence's checkpoint is read by both launches). "eager": a flush at every step
#            (_replay_eager_kernel: eager's traffic on the high checkpoint, pending entries
#            folded first; for small batches; only when the step advances its cursor).
#   early    issue the read-checkpoint tile load before the cursor (its address does not depend
#            on it), so the state streams while the cursor and buffer tiles are fetched.
#            False: the first version's order (state loaded after the buffered B tile).
#   preload  issue the buffered B and x tiles right after the cursor, before any compute (more
#            bytes in flight, more registers) instead of inside the branch that uses them.
#   ticket   advance the cursor inside the step kernel (atomic ticket: one launch) instead of
#            the _cursor_kernel launch after it. One atomic per program on the cursor's line:
#            at batch 256 the atomics queue (64-row programs: 400 -> 363 us without them),
#            at batch 1 the extra launch costs more (5.3 -> 6.5 us).
#   fold_rows  rows per fold chunk of a flushing program (re-reads its high rows, an L2 hit);
#            bounds the MMA operands' registers for tall programs. None/0: the whole tile.
#   fold_cols  columns per fold chunk (0: the whole row, one chunk per fold row chunk). Below N
#            the flush path re-reads [fold_rows, fold_cols] chunks of its high tile instead of
#            folding the read tile it holds, so the (rare) flush path needs fewer registers than
#            the output path and does not lower every program's occupancy. Not with row-scaled
#            (fp8) copies, whose scale needs the whole row: those fold whole rows.
#   evict    cache hint on the streamed state ("" or "evict_first"; no gain measured).
#   pf       prefetch hint for the read-checkpoint tile, issued before the cursor is taken (its
#            address depends on the slot only): 0 none, 1 into L2, 2 into L1. Holds no
#            registers, unlike `early`; for the late-loading lean kernels, whose state load
#            otherwise starts only when the cursor has returned (session 8's Nsight Compute:
#            54 % of the lean step's stall samples wait on global loads). Measured slower, so
#            off: b256 fp32 lean step 341 us with pf 1 or 2 vs 324 (Super), 324 vs 308 (Nano);
#            fp8 dual 427 vs 318 (Super) (session 9, tools/tune_mamba2.py -pf1 / -pf2).
#   maxnreg  ptxas register cap per thread (None: ptxas' choice).
#   route_k  route "eager" only: its period k (an int 1..127, at most the flush period counts):
#            the state written at every k-th step (_replay_defer_kernel, k >= 2; the steps
#            between append their entry, and the next folds it) instead of at every step
#            (_replay_eager_kernel, k = 1). reference.mamba2_replay_step's `route`.
#   fold_wait  with bc / coef: the flushing programs wait for the pre-pass at their end
#            (FOLD_WAIT), so no step finishes before it whatever its sequences do (session 37).
# Route batches <= ROUTE_BATCH[bytes] as the table's "route" rows say (where given; a row's max_b, where
# set, is the largest batch it routes, above which the step buffers). False: those rows
# are skipped, so every replay step buffers (tests of the buffered route, studies of it at
# batch 1). OVERRIDE still wins.
SMALL_BATCH_ROUTE = True
# Largest batch routed, per bytes per element of the read copy. fp32: batch 1-2 are
# latency-bound, the route costs eager's time (4.5 us at b1) and the buffered kernel more (5.6-6.0
# at b1; b2 7.24-7.38 vs eager 6.23-6.26, h200-small-batch-20261130-s7b); from batch 4 the lean
# buffered kernel below wins (tune_mamba2_small_lean.txt, fp32 Super, buffered vs route: b4
# 9.40 vs 10.76 us, b8 15.48 vs 19.15, b16 26.81 vs 35.78). bf16 state: the lean kernel loses
# to the route up to b16 (b8 Nano 12.78 vs 10.49 us, b16 19.67 vs 18.73; s7b vs
# h200-small-batch-bf16-20261130) and wins at b32.
# Since session 32 fp32 reads route to batch 4, but only Nano's deferred-route row goes past 2
# (the rows' max_b): the every-step route and dual states buffer from batch 3 as before.
ROUTE_BATCH = {4: 4, 2: 16}
# Dual states take the route on their high copy alone, as fp32 states do (the (4, "route") rows,
# at most batch 2): the low copy is not written there but marked stale (LO_STALE) and
# the next buffered step flushes, refreshing it (session 18; before, the route wrote both
# copies and dual states buffered from batch 1: 0.91-0.96x our fp32 eager at batch 1-2,
# h200-small-batch-20261201-s17b; at batch 4 the buffered dual step ran 1.20-1.24x).
REPLAY_DEFAULTS = dict(route="fused", early=True, preload=True, ticket=True, fold_rows=16, fold_cols=0, evict="",
                       maxnreg=None, pf=0, bc=False, pdl=None, route_k=1, coef=False, fold_wait=True)
_LEAN = dict(block_p=16, warps=1, early=False, preload=False, ticket=False, fold_cols=16)
REPLAY_CONFIGS: dict[tuple[int, str], list[dict]] = {
    # batch <= ROUTE_BATCH with SMALL_BATCH_ROUTE (fp32): the eager route, eager's traffic and
    # latency (Super b1 4.49 us vs eager 4.43; the buffered kernels 5.6-7.8, tune_mamba2_small_lean.txt)
    # Head dims not a multiple of 32 (Nano's 80: a third 32-row chunk half masked): 8 rows x 1
    # warp. Nano b2 6.03 us vs 6.57 (our eager 6.07-6.15; Super keeps 32 x 8: 6.20 vs 6.38 at
    # 8 x 1, tune_mamba2_s17c.txt); b1 4.47 vs 4.46 (tune_mamba2 session 7)
    # Session 32: the deferred route (route_k 2: the state written every other step) at Nano's
    # 8 x 1 tiles, fp32 states, batch 1-4 (probe_layers_s32b.txt, us, two rounds, our eager /
    # every-step route / deferred k 2 / the buffered step at b4): b1 4.51 / 4.42 / 4.42, b2 6.30-6.36
    # / 6.13-6.14 / 6.03-6.04, b4 10.37 / 10.38 / 9.43 / 9.86. It lost at Super's 32 x 8 (116
    # registers: b1 4.60 vs 4.52-4.55, b2 7.53 vs 6.29) and in 16 x 4 tiles (b2 6.86, b4 10.80 vs
    # the buffered 10.02), and for dual states (Nano b1 4.42 vs 4.36, b4 9.43 vs the buffered
    # 8.72): those keep the every-step route to batch 2 (max_b) and buffer above.
    (4, "route"): [dict(route="eager", block_p=32, warps=8, p_mod=32, max_b=2),
                   dict(route="eager", block_p=8, warps=1, dual=True, max_b=2),
                   dict(route="eager", block_p=8, warps=1, route_k=2)],
    # 16-bit read copies (bf16 state; dual states route on their high copy): 8 rows x 1 warp. bf16
    # state, routed / buffered x our bf16 eager: Super b1 1.05 / 0.74
    # (h200-small-batch-bf16-20261130, h200-kernels-20261130-s6)
    (2, "route"): [dict(route="eager", block_p=8, warps=1)],
    (4, "one"): [dict(block_p=16, warps=2)],                            # batch 1, buffered: 5.2 us
    (2, "one"): [dict(block_p=16, warps=4)],                            # dual bf16 batch 1: 4.9 us
    (1, "one"): [dict(block_p=16, warps=4)],                            # (not measured: as bf16)
    # batch > 1: 16 rows x 1 warp, every load after the cursor ("late": no state tile held
    # across the cursor and buffer loads), the flush folded in 16 x 16 chunks (fold_cols): 72-80
    # registers (sm_90) instead of 128-168, so 2-3x the warps per SM. tune_mamba2_late.txt (b256,
    # same run; before -> now): fp32 Super 362 -> 325 us, Nano 376 -> 314; dual bf16 Super
    # 333 -> 261, Nano 425 -> 246; bf16 Super 246 -> 247, Nano 306 -> 225. Large batches move the
    # cursor in a separate pass (the ticket's atomics queue there); small ones by ticket (one
    # launch: b4-b16 ~1 us faster, tune_mamba2_small_lean.txt; Super dual b8 13.75 vs 21.61 us).
    # From min_bh (batch x heads) on, B_i . C (the buffered entries' products with this step's C,
    # the same for every head of a group) comes from a launch ahead of the step (bc, PRE_BC:
    # _buffer_bc_kernel, the step its programmatic dependent) instead of from every program (as
    # many products as the state tile's own). tune_mamba2_s19b / _s19c (one run each, same call;
    # lean step / with bc, us): fp32 b256 Super 324.6 / 310.9 and 325.1 / 320.6, Nano 306.9 / 294.3
    # and 318.1 / 303.0; b128 Super 170.9 / 167.0, Nano 162.0 / 157.5; b64 88.1 / 89.0, 84.3 / 84.6
    # (a loss: the launch). 16-bit reads: dual bf16 b256 Super 262.4 / 238.7 and 260.7 / 242.4, Nano
    # 247.3 / 224.8 and 245.1 / 223.2; b64 72.0 / 68.3, 68.2 / 64.7; b32 39.3 / 39.4 (a tie); bf16
    # state b256 Super 237.9 / 209.6, Nano 225.0 / 198.4. Programs of 32 rows with it: faster at
    # Super b256 (head dim 64; bf16 state 197.0 / 195.1 us, dual bf16 237.3 / 235.0, against 209.6
    # / 215.8 and 238.7 / 242.4 in 16-row programs), slower at Nano (dual 239.5 / 236.7 vs 224.8 /
    # 223.2) and at Super dual b128 / b64 (127.5 / 72.3 vs 125.7 / 68.3): from batch x heads 32768
    # where the head dim is a multiple of 32.
    # The 16-row programs with bc of 16-bit copies load their state tile first (early, preload:
    # 80 registers, as late), session 21 (tune_mamba2_s21b.txt, _s21c.txt; us, late vs early):
    # dual bf16 Nano b128 117.4 / 114.3, b256 223.2 / 217.9 (again 223.2 / 217.8), b512 444.4 /
    # 435.8; Super b128 124.2 / 121.6; bf16 state Nano b128 103.9 / 102.0, b256 200.1 / 194.7 (198.5 /
    # 195.3), b512 394.5 / 383.7; Super b128 108.4 / 107.6. Not the 32-row programs (Super b256
    # dual 234.5 vs 232.1 early in 16 rows, but b512 450.5 vs 459.1; bf16 state 195.4 vs 204.2) nor
    # fp32 reads (Super / Nano b256 315.6 / 298.7 vs 330.2 / 309.9).
    # Session 36: every per-head term of the output path in that launch too (coef, PRE_COEF: the
    # decay weights w_i and the checkpoint's decay from the buffered dt, w_i (B_i . C), dt (B . C),
    # and the step's dt and B appends), vectorised over a group's heads, so a program's own work
    # is its tile, the cursor, x and its appended x row: the output route's sm_90 SASS 1280 -> 1016
    # instructions (bf16 state, Super b256), 1216 -> 1032 (fp32). Interleaved, twice each
    # (tune_mamba2_s36b.txt), us, without / with: fp32 b256 Super 308.4-308.5 / 293.4-293.8, Nano
    # 290.6-292.7 / 276.7-277.7, Ultra 611.1-615.8 / 582.4-585.3; b128 Super 161.6-161.9 /
    # 153.3-155.3, Nano 151.6-151.8 / 144.1-144.3. Dual bf16 b256 Super 214.1-214.2 / 205.4-205.8,
    # Nano 207.4-207.6 / 196.5-197.1, Ultra 401.1-401.4 / 390.1-390.6; b512 Super 411.6-411.7 /
    # 391.8-392.4, Nano 417.6-419.5 / 385.8-395.2; b128 Super 116.5 / 112.4-112.5, Nano 111.0 /
    # 106.6-106.7. bf16 state b256 Super 178.5-178.6 / 173.9-174.2, Nano 178.8-179.6 / 170.0-170.5,
    # Ultra 331.1-334.1 / 327.1-327.7; b512 Super 337.9-339.3 / 327.6-328.5, Nano 341.1-343.4 /
    # 324.8-337.8, Ultra 648.0-655.2 / 636.1-661.5 (IQR 55); b128 Super 102.6-102.8 / 101.9-102.4,
    # Nano 97.0-97.1 / 96.9-97.6 (a tie; the pre-pass's first form, its cursor-dependent loads not
    # issued first, lost 2.5 % there: _s36a). Then at batch 64 (_s36c, with / without): dual bf16
    # Super 64.0-64.1 / 64.4-64.5, Nano 61.4 / 61.4-61.6; dual fp8 b256 Super 232.9 / 262.6-262.9,
    # Nano 247.0-247.6 / 278.9-279.5; but the bf16 state's 16-row row lost there, Super 58.0 / 56.7-
    # 56.8, Nano 54.9 / 53.5. So every row with bc takes coef but that one (tied at b128).
    # With coef the bf16 state's 32-row programs pay below batch x heads 24576 too (_s36e, _s36f,
    # twice each, us, the 16-row row / 32 rows with coef): Super b128 102.8 / 98.1-98.3, Nano b128
    # 96.8-96.9 / 95.3-95.5, Nano b192 145.6-153.7 / 133.7; not at b64 (Super 56.8-56.9 / 59.4,
    # Nano 53.5-53.6 / 57.1-57.2). So that row from 12288 (Super from batch 96, Nano from 128).
    (4, "small"): [dict(_LEAN, ticket=True)],
    (4, "large"): [dict(_LEAN, bc=True, coef=True, min_bh=12288), _LEAN],
    (2, "small"): [dict(_LEAN, ticket=True)],
    # Dual states fold 32 columns per chunk there (fold_cols; 128 registers instead of 114 on
    # sm_90, 16 programs per SM instead of 17): half the fold's chunks, each a dependent round
    # trip in the one flushing program in K, and in 32-row programs from batch x heads 16384.
    # Super dual bf16, us, fold_cols 16 / 32 (tune_mamba2_s23b.txt): b256 234.5 / 220.0, b512
    # 451.6 / 424.6 (64 columns: 298.6 / 588.9; 32 rows x 32 columns per chunk: 237.3 / 463.8);
    # again on another H200 (_s23c): b256 235.9 / 221.0, b512 454.4 / 426.5, and b128 (then 16-row
    # programs, 122.4) 127.4 / 118.6. The bf16 state, b256: 195.0 / 197.4 (with a hint ahead of
    # the fold, which did not change the dual times: _s23a); Nano's 16-row programs lost with it.
    # Session 34: that dual row under a 96-register budget (maxnreg): ptxas spills 96 bytes, all
    # of them in the flushing programs' fold (the output path's SASS has no local loads or
    # stores), and 21 programs fit an SM instead of 16 (ncu: the row at 128 registers ran at 25 %
    # theoretical occupancy, 22 % achieved, DRAM 68 % of peak, 57 % of its stalls on L1TEX
    # scoreboards; results/device-logs-20261203-s34/ncu_super_replay-dual_s34a.txt). Super dual
    # bf16, us, 128 registers / 96 / 80 / 72 (tune_mamba2_s34a.txt): b128 117.9 / 115.9 / 117.5
    # / 118.8, b256 219.7 / 213.3 / 214.1 / 215.1, b512 424.3 / 410.9 / 414.3 / 412.8. Again,
    # interleaved, twice each (_s34b): 96 / none / 72: b128 115.6 / 117.6 / 118.9-119.1, b256
    # 213.2-213.3 / 219.5-219.8 / 214.7-214.9, b512 409.6-411.1 / 424.0-424.8 / 408.0-408.1.
    # Nano's dual step in the early 16-row programs (80 registers) under a 72-register budget
    # (4 bytes spilled, in the fold; 28 programs an SM instead of 25), _s34b, us, twice each,
    # none / 72: b128 114.3-114.5 / 109.8-110.0, b256 217.1-217.3 / 206.5-206.6, b512
    # 424.8-437.6 / 415.1-417.8; at b64 (_s34c) 63.0 / 61.3-61.5, and Super's dual b64 (the same
    # row: below its 32-row programs) 66.6-66.7 / 64.4. So a dual-only row with the budget wherever
    # the early row applied (batch x heads 6144 up to Super's 16384).
    # Session 35: the bf16 state's rows under budgets too (16-bit states that are not dual: bf16 /
    # fp16 states, shared-low). The 32-row programs (96 registers, 21 per SM; Nsight Compute, Super
    # b256: DRAM 66-67 % of peak, 27.5 % achieved occupancy, ncu_super_replay_bf16_s34e.txt) under
    # 72 spill 8 bytes, 28 per SM (64: 28 bytes, 32; 80: none, 25); the early 16-row programs (72
    # registers, 28 per SM) under 64 spill none and fit 32. Interleaved, twice each
    # (tune_mamba2_s35a.txt), us, none / 80 / 64 / 72: Super b256 (32 rows) 195.8-196.1 / 186.1 /
    # 179.8-180.0 / 178.8-179.0, b512 374.3-374.4 / 352.6-353.1 / 337.2 / 338.4-340.4; the 16-row
    # rows at Super b128 106.5-106.7 / 110.6-110.7 / 101.8-102.3 / 108.0, Nano b128 101.4 / 105.8-105.9
    # / 96.5-96.6 / 102.8-102.9, b256 191.1-191.7 / 201.5-201.8 / 182.5-182.7 / 194.3-194.8, b512
    # 373.9-377.3 / 395.0-395.8 / 368.6-380.8 / 384.6-396.3 (IQRs of 3-11 us there). The 16-row
    # programs under 80 compile to 80 registers, under 72 to their own 72 in another schedule: both
    # ran slower than without a budget.
    # Then Nano's bf16 state in 32-row programs (head dim 80: three a head, the third half
    # masked) under the same 72: a head's per-program work (the cursor, the decay weights, the
    # buffer's loads: by our count of the sm_90 SASS, 415 instructions before the branch on the
    # cursor and 645 in the output path, of which about 250 are the tile's own) runs 3 times
    # instead of 5, and Nano's bf16 step was issue-bound (ncu_nano_replay_bf16_s35c.txt: 0.82
    # instructions issued per scheduler cycle, SM throughput 80 %, DRAM 65.5 %). Interleaved, twice
    # each (tune_mamba2_s35e.txt), us, 16 rows under 64 / 32 rows under 72 / under 64: b256
    # 186.9-190.7 / 180.4-181.0 / 178.8-183.9, b512 378.4-399.6 / 349.0-363.8 / 346.3-363.6 (IQRs
    # up to 37 us), b128 97.3-98.8 / 99.6-99.9 / 98.9 (a loss); dual bf16 b256 207.1-207.2 /
    # 205.9 / 206.2-207.0 and b128 110.2-110.9 / 114.0-114.8 (dual states keep their rows). So the
    # bf16 32-row row from batch x heads 24576 (Nano from batch 256) whatever the head dim: at
    # Super's and Ultra's head dim 64 that moves batch 192-255 and 96-127 from 16-row programs
    # (tune_mamba2_s35f.txt). Since session 36 (coef, above) from 12288.
    (2, "large"): [dict(_LEAN, block_p=32, bc=True, coef=True, min_bh=16384, p_mod=32, fold_cols=32, dual=True,
                        maxnreg=96),
                   dict(_LEAN, block_p=32, bc=True, coef=True, min_bh=12288, dual=False, maxnreg=72),
                   dict(_LEAN, early=True, preload=True, bc=True, coef=True, min_bh=6144, dual=True, maxnreg=72),
                   dict(_LEAN, early=True, preload=True, bc=True, min_bh=6144, maxnreg=64), _LEAN],
    (1, "small"): [dict(block_p=16, warps=4)],                          # (not measured: as bf16)
    # dual fp8 at batch 256: the lean step in 32-row programs with bc, Super 263.3 / 269.1 us vs
    # 314.6 / 321.0 (64 x 2 below), Nano 279.5 / 285.9 vs 344.2 / 349.7 (16 x 1) (_s19c / _s19b);
    # smaller batches were not timed, so they keep the session-7 rows
    (1, "large"): [dict(_LEAN, block_p=32, bc=True, coef=True, min_bh=24576),
                   dict(block_p=64, warps=2, p_mod=64),                 # dual fp8 Super: 318 us
                   dict(block_p=16, warps=1)],                          # dual fp8 Nano: 349 us
}
# Tuning hook: OVERRIDE["replay"] = dict(block_p=, chunks=, warps=, route=, early=, preload=,
# ticket=, fold_rows=, fold_cols=, evict=, maxnreg=, pf=, bc=, coef=, pdl=) and OVERRIDE["eager"] = dict(block_p=,
# chunks=, warps=, evict=) replace the table entries above for every shape (only keys given).
# Empty in normal use.
OVERRIDE: dict[str, dict] = {}
CURSOR_BLOCK = 256
# Commit: list the folding rows first (one program) and fold them with a few workers per head
# tile, instead of one fold program per (row, head tile) that mostly finds nothing to do
# (plan_commit), up to COMMIT_LIST_MAX rows. OVERRIDE["fold"]["list"] (bool) for tuning. T4
# round, H200, listed vs per-row (tools/tune_spec.py, tune_spec_s12k/l/m.txt): b32 Nano 74.1
# vs 76.3 us, Super 71.5 vs 73.5; b128 Nano 243.3 vs 245.5, Super 238.6 vs 239.9, Nano dual bf16
# 192.5 vs 194.0; b256 equal in fp32 (465.6, 454.7), dual 0.6 % slower (363.3 vs 361.0);
# b512 Nano 911.7 vs 902.8 (Super equal): per-row above batch 128.
COMMIT_LIST = True
COMMIT_LIST_MAX = 128
# The speculative round's launches as programmatic dependents (launch.pdl_meta; LIST commits):
# the verify lets the list launch start early, the list launch the fold (and the fold the next
# layer's list launch, in a model's commit phase); each waits for the kernel ahead of it before
# touching memory. OVERRIDE["verify"]["pdl"] / ["fold"]["pdl"] for tuning.
PDL = True
# Verify: load the buffer tiles for all rows < min(K, L) before the cursor arrives (rows >= n
# zeroed after): one dependent round trip less per program, up to K - n rows more read.
VERIFY_EARLY_BUF = True
# Verify: tl.dot precision of the fp32 state tile times C ("tf32x3" ~2^-22 per product,
# "split3" exact products (three bf16 MMAs), "bf16x3" ~2^-16), and N columns per MMA step.
VERIFY_F32_PRECISION = "tf32x3"
VERIFY_CHUNK_N = 32
# Verify: the Gram matrices (B_i . C_t of the buffer and of the drafts, the same for every head
# of a group) from a launch ahead of the verify (_verify_gram_kernel, PRE_GRAM) instead of from
# each program's B tiles and MMAs. None: for fp32 read copies whose heads the programs tile
# without a tail, from batch x heads VERIFY_PRE_GRAM_MIN_BH; True / False: always / never;
# OVERRIDE["verify"]["gram"] for tuning. H200, T 4 round, default vs with it (tools/tune_spec.py,
# tune_spec_gram_b128.txt / _b256.txt, session 20): Super fp32 b128 232.6 vs 228.7 us, b256
# 445.0 vs 436.2; where it did not pay: Nano fp32 (64 + 16-row programs) 243.0 vs 243.4 /
# 467.4 vs 466.7, Super dual bf16 196.3 vs 195.8 / 373.1 vs 373.9, Nano dual bf16 191.1 vs
# 207.6 / 361.5 vs 395.1
VERIFY_PRE_GRAM: bool | None = None
VERIFY_PRE_GRAM_MIN_BH = 16384
# Precision of the flush fold's tl.dot (sum_i w_i x_i B_i^T over <= L entries). With a bf16
# buffer the fold runs as "bf16x3" (exact products, see _outer_sum); with other buffers it
# uses FOLD_DOT_PRECISION on fp32 operands: "tf32x3" (three TF32 MMAs, ~2^-22 relative per
# product) or "ieee" (exact FMA dot). Register cost on sm_90 (ptxas, replay kernel, Nano
# dims, 16-row programs, 4 warps): bf16x3 71, tf32x3 80, ieee 190 (its FMA dot holds a whole
# [L, cols] operand slice per thread); the output-only route alone needs 42.
FOLD_DOT_PRECISION = "tf32x3"


def _fold_precision(rs) -> str:
    return "bf16x3" if rs.x.dtype == torch.bfloat16 and rs.B.dtype == torch.bfloat16 else FOLD_DOT_PRECISION


def _interpreting() -> bool:
    """True under Triton's CPU interpreter (TRITON_INTERPRET=1)."""
    try:
        return bool(triton.knobs.runtime.interpret)
    except AttributeError:  # older triton without knobs
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _np2(v: int) -> int:
    return triton.next_power_of_2(max(int(v), 1))


def _bucket(batch: int, nheads: int) -> str:
    return "small" if batch * nheads < SMALL_PROGRAMS else "large"


def _pick(candidates, P: int, work: int = 0, dual: bool = False):
    """The first candidate whose p_mod (last field, or key "p_mod") divides P, whose min_bh
    (key, dict candidates: least batch x heads) is at most `work` and which, where it has key
    "dual", has it equal to `dual` (a dual state's step); the last one otherwise."""
    for c in candidates[:-1]:
        mod = c.get("p_mod", 1) if isinstance(c, dict) else (c[3] if len(c) > 3 else 1)
        least = c.get("min_bh", 0) if isinstance(c, dict) else 0
        if P % mod == 0 and work >= least and (not isinstance(c, dict) or c.get("dual", dual) == dual):
            return c
    return candidates[-1]


def launch_config(kernel: str, P: int, state_bytes: int, batch: int, nheads: int) -> tuple[int, int, int]:
    """(BLOCK_P, ROW_CHUNKS, num_warps) for the eager, fold and verify kernels at a shape,
    from CONFIG_TABLE (and OVERRIDE[kernel]), clamped to the head."""
    key_bytes = min(state_bytes, 4)
    if kernel == "eager":
        key_bytes = max(key_bytes, 2)
    entry = CONFIG_TABLE[(kernel, key_bytes, _bucket(batch, nheads))]
    block_p, chunks, warps = (_pick(entry, P) if isinstance(entry, list) else entry)[:3]
    ov = OVERRIDE.get(kernel, {})
    block_p, chunks, warps = ov.get("block_p", block_p), ov.get("chunks", chunks), ov.get("warps", warps)
    block_p = min(block_p, _np2(P))
    tiles = triton.cdiv(P, block_p)
    if chunks <= 0:
        chunks = tiles
    else:   # nearest divisor of `tiles` (ties: the smaller, for more programs)
        chunks = min((d for d in range(1, tiles + 1) if tiles % d == 0), key=lambda d: (abs(d - chunks), d))
    return block_p, chunks, warps


def replay_variant(P: int, read_bytes: int, batch: int, nheads: int, dual: bool = False,
                   hi_bytes: int = 4) -> dict:
    """Launch choice of the replay step at a shape: REPLAY_CONFIGS' candidate for P, filled from
    REPLAY_DEFAULTS, then OVERRIDE['replay']. Rows per program: next_pow2(block_p * chunks)
    (chunks 0 = whole head; default 1), at most next_pow2(P). Dual states (high copy of
    hi_bytes per element) take the route as a state of their high copy would."""
    v = dict(REPLAY_DEFAULTS, chunks=1)
    key = (min(read_bytes, 4), "one" if batch <= 1 else _bucket(batch, nheads))
    rb = min(hi_bytes, 4) if dual else key[0]     # the copy the route reads and writes
    row = None
    if SMALL_BATCH_ROUTE and batch <= ROUTE_BATCH.get(rb, 0) and (rb, "route") in REPLAY_CONFIGS:
        row = _pick(REPLAY_CONFIGS[(rb, "route")], P, batch * nheads, dual)
        if batch > row.get("max_b", batch):     # past the row's batches: the step buffers
            row = None
    v.update(row if row is not None else _pick(REPLAY_CONFIGS[key], P, batch * nheads, dual))
    v.update(OVERRIDE.get("replay", {}))
    chunks = v["chunks"] if v["chunks"] > 0 else triton.cdiv(P, v["block_p"])
    rows = min(_np2(v["block_p"] * chunks), _np2(P))
    if v["fold_cols"] and (v["fold_cols"] < 16 or v["fold_cols"] & (v["fold_cols"] - 1)):
        raise ValueError(f"replay fold_cols {v['fold_cols']}: allowed 0 (whole rows) or a power of 2 >= 16")
    if v["route"] not in ("fused", "split", "eager"):
        raise ValueError(f"unknown replay route {v['route']!r}; allowed: fused, split, eager")
    if v["pf"] not in (0, 1, 2):
        raise ValueError(f"replay pf {v['pf']!r}: allowed 0 (none), 1 (into L2), 2 (into L1)")
    rk = v["route_k"]
    if type(rk) is not int or not 1 <= rk <= 127:     # (not a bool: True is an int)
        raise ValueError(f"replay route_k={rk!r}: allowed an int 1..127")
    if rk > 1 and rows % EPOCH_ROWS:
        raise ValueError(f"replay block_p={rows} with route_k={rk}: allowed multiples of {EPOCH_ROWS} "
                         "(state.EPOCH_ROWS)")
    return {"block_p": rows, "warps": v["warps"], "route": v["route"], "early": bool(v["early"]),
            "preload": bool(v["preload"]), "ticket": bool(v["ticket"]), "evict": v["evict"] or "",
            "fold_rows": min(rows, v["fold_rows"] or rows), "fold_cols": int(v["fold_cols"] or 0),
            "maxnreg": v["maxnreg"], "pf": int(v["pf"]), "bc": bool(v["bc"]),
            "pdl": PDL if v["pdl"] is None else bool(v["pdl"]), "route_k": rk, "coef": bool(v["coef"]),
            "fold_wait": bool(v["fold_wait"])}


# ----------------------------------------------------------------------------- helpers
@triton.jit
def _load_state(ptr, sc_ptr, base, sbase, offs_p, offs_n, stride_p, mask, mask_p, HAS_SCALE: tl.constexpr,
                EV: tl.constexpr):
    """[BP, BN] float32 tile of a checkpoint (rows offs_p), dequantised with fp8 row scales.
    EV: cache eviction hint of the (streamed) tile ("" or "evict_first")."""
    s = tl.load(ptr + base + offs_p[:, None] * stride_p + offs_n[None, :], mask=mask, other=0.0,
                eviction_policy=EV).to(tl.float32)
    if HAS_SCALE:
        sc = tl.load(sc_ptr + sbase + offs_p, mask=mask_p, other=1.0)
        s = s * sc[:, None]
    return s


@triton.jit
def _store_state(ptr, sc_ptr, base, sbase, offs_p, offs_n, stride_p, mask, mask_p, s, HAS_SCALE: tl.constexpr,
                 EXACT: tl.constexpr, EV: tl.constexpr):
    """Store a float32 tile, rounding to the checkpoint dtype. fp8: per-row scale
    amax/448 (1 for a zero row), data = s / scale (as state.Checkpoint.write). Columns
    past N must hold 0 (they do: every operand is loaded with other=0)."""
    if HAS_SCALE:
        amax = tl.max(tl.abs(s), axis=1)
        sc = tl.where(amax > 0.0, amax / 448.0, 1.0)
        tl.store(sc_ptr + sbase + offs_p, sc, mask=mask_p)
        s = s / sc[:, None]
    tl.store(ptr + base + offs_p[:, None] * stride_p + offs_n[None, :], cast(s, ptr.dtype.element_ty, EXACT),
             mask=mask, eviction_policy=EV)


@triton.jit
def _buffer_weights(la, dt, mask_l, la_after):
    """Weights of buffered entries for a target after them.

    la [BL] log-decays dt_i * A (0 where masked), dt [BL], la_after: summed log-decay of
    what follows the buffer up to the target (the new entry; 0 for a plain fold).
    Returns w [BL] = dt_i * exp(sum_{j>i} la_j + la_after) and total = exp(sum la + la_after),
    the decay applied to the checkpoint. Suffix sums (not differences of prefix sums) keep
    the recent, heavy weights accurate when the cumulative decay is large."""
    suffix = tl.cumsum(la, 0, reverse=True) - la + la_after
    w = tl.where(mask_l, dt * tl.exp(suffix), 0.0)
    total = tl.exp(tl.sum(la, 0) + la_after)
    return w, total


@triton.jit
def _outer_sum(xw, bm, USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr, EXACT: tl.constexpr):
    """sum_i xw[i, :, None] * bm[i, None, :]: xw [BL, BP], bm [BL, BN] -> [BP, BN] float32.

    tl.dot when every dim >= 16, else a broadcast sum (tiny tiles only). DOT_PREC:
    "bf16x3": bm holds bf16 values (a bf16 buffer), so it is exact in bf16; xw (fp32) is
        split into three bf16 parts hi + mid + lo (24 significant bits) and three bf16 MMAs
        accumulate in fp32: every product is exact, the result is fp32-accurate, and the
        operands are half the registers of fp32 ones.
    "tf32x3" / "ieee" / "tf32": tl.dot's input_precision on fp32 operands (other buffers)."""
    if USE_DOT:
        if DOT_PREC == "bf16x3":
            b16 = bm.to(tl.bfloat16)
            hi, mid, lo = bf16_split3(xw, EXACT, "bf16x3e_cvt")     # (Triton's conversions, as timed)
            if EXACT:   # the CPU interpreter mis-evaluates bf16 dots: same products in fp32
                b32 = b16.to(tl.float32)
                acc = tl.dot(tl.trans(hi.to(tl.float32)), b32, input_precision="ieee")
                acc = tl.dot(tl.trans(mid.to(tl.float32)), b32, acc, input_precision="ieee")
                acc = tl.dot(tl.trans(lo.to(tl.float32)), b32, acc, input_precision="ieee")
            else:
                acc = tl.dot(tl.trans(hi), b16)
                acc = tl.dot(tl.trans(mid), b16, acc)
                acc = tl.dot(tl.trans(lo), b16, acc)
        else:
            acc = tl.dot(tl.trans(xw), bm, input_precision=DOT_PREC)
    else:
        acc = tl.sum(xw[:, :, None] * bm[:, None, :], axis=0)
    return acc


@triton.jit
def _load_buffer_B(bB_ptr, base, s_bB_l, offs_l, offs_n, mask_l, mask_n):
    """The group's buffered B rows [BL, BN] (float32; 0 past the cursor)."""
    return tl.load(bB_ptr + base + offs_l[:, None] * s_bB_l + offs_n[None, :],
                   mask=mask_l[:, None] & mask_n[None, :], other=0.0).to(tl.float32)


@triton.jit
def _fold_chunk(hi_ptr, hi_sc_ptr, ck_base, sc_base, s_ck_p, bxh_ptr, s_bx_l, offs_l, mask_l, w, total, Bb,
                offs_p, offs_n, mask_p, mask,
                HI_SCALE: tl.constexpr, USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr, EXACT: tl.constexpr):
    """High-checkpoint rows offs_p with the buffered entries folded in:
    total * S + sum_i w_i x_i B_i^T  ->  [BP, BN] float32 (not stored)."""
    Xb = tl.load(bxh_ptr + offs_l[:, None] * s_bx_l + offs_p[None, :],
                 mask=mask_l[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
    S = _load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE, "")
    return total * S + _outer_sum(Xb * w[:, None], Bb, USE_DOT, DOT_PREC, EXACT)


@triton.jit
def _store_ckpts(hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, ck_base, sc_base, s_ck_p, offs_p, offs_n, mask, mask_p, S,
                 HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr, LO_SCALE: tl.constexpr, EXACT: tl.constexpr,
                 EV: tl.constexpr):
    """Write folded rows to the high checkpoint and, in dual mode, the low copy."""
    _store_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, S, HI_SCALE, EXACT, EV)
    if HAS_LO:
        _store_state(lo_ptr, lo_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, S, LO_SCALE, EXACT,
                     EV)


@triton.jit
def _finish_y(yv, xv, Dh, z_row, y_row, offs_p, mask_p, in_p, HAS_Z: tl.constexpr, EXACT: tl.constexpr):
    """y = (yv + D x) * silu(z), stored for rows offs_p (padded rows: every operand is 0)."""
    yv = yv + Dh * xv
    if HAS_Z:
        yv = yv * silu(tl.load(z_row + offs_p, mask=mask_p, other=0.0).to(tl.float32))
    tl.store(y_row + offs_p, cast(yv, y_row.dtype.element_ty, EXACT), mask=in_p)


@triton.jit
def _slot_of(idx_ptr, row, HAS_IDX: tl.constexpr):
    """(slot as int64 clamped to >= 0, live) for batch row `row`; negative index = padding."""
    if HAS_IDX:
        slot = tl.load(idx_ptr + row).to(tl.int64)
    else:
        slot = row.to(tl.int64)
    return tl.maximum(slot, 0), slot >= 0


# ----------------------------------------------------------------------------- eager
@triton.jit
def _eager_kernel(
    st_ptr, x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr, idx_ptr,
    P, N, HPG,
    s_st_s, s_st_h, s_st_p,
    s_x_b, s_x_h, s_dt_b, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_y_b, s_y_h,
    BLOCK_P: tl.constexpr, ROW_CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, EXACT: tl.constexpr, EVICT: tl.constexpr,
):
    """One eager step for rows [pid_p*ROW_CHUNKS*BLOCK_P, ...) of head h of batch row b.
    Reads the [rows, N] state tile once and writes it once."""
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // HPG
    slot, live = _slot_of(idx_ptr, b, HAS_IDX)
    A = tl.load(A_ptr + h).to(tl.float32)
    Dh = tl.load(D_ptr + h).to(tl.float32)
    dt_v = softplus(tl.load(dt_ptr + b * s_dt_b + h).to(tl.float32) + tl.load(dtb_ptr + h).to(tl.float32))
    a = tl.exp(dt_v * A)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = (offs_n < N) & live
    Bv = tl.load(B_ptr + b * s_B_b + g * s_B_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    st_base = slot * s_st_s + h * s_st_h
    for c in tl.static_range(ROW_CHUNKS):
        offs_p = (pid_p * ROW_CHUNKS + c) * BLOCK_P + tl.arange(0, BLOCK_P)
        in_p = offs_p < P
        mask_p = in_p & live
        mask = mask_p[:, None] & mask_n[None, :]
        xv = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_p, mask=mask_p, other=0.0).to(tl.float32)
        S = _load_state(st_ptr, st_ptr, st_base, 0, offs_p, offs_n, s_st_p, mask, mask_p, False, EVICT)
        S = a * S + (dt_v * xv)[:, None] * Bv[None, :]
        _store_state(st_ptr, st_ptr, st_base, 0, offs_p, offs_n, s_st_p, mask, mask_p, S, False, EXACT, EVICT)
        _finish_y(tl.sum(S * Cv[None, :], axis=1), xv, Dh, z_ptr + b * s_z_b + h * s_z_h,
                  y_ptr + b * s_y_b + h * s_y_h, offs_p, mask_p, in_p, HAS_Z, EXACT)


# ----------------------------------------------------------------------------- replay step
@triton.jit
def _take_cursor(cur_ptr, slot, live, K, NPROG, TICKET: tl.constexpr, STALE: tl.constexpr):
    """This program's view of cursor[slot]: (n, stale), (0, False) for a padded row; stale:
    the LO_STALE bit (a dual state's low copy is stale, so the step flushes). STALE: a dual
    state, whose word may carry the bit. Any state's word may carry the deferred route's epoch
    (bits 8-14, state.py), so the count is always masked out of it.

    TICKET: every program of the sequence reads the cursor with one relaxed
    atomic_add(cursor, 1 << 16) (low 16 bits: the cursor word; high bits: programs that have
    read it); the one that draws ticket NPROG - 1 knows all others have read it (the reads are
    the atomics themselves, totally ordered on one address) and stores the advanced cursor
    (n + 1 >= K or stale ? 0 : n + 1), clearing the ticket bits. Otherwise a plain load (a
    _cursor_kernel launch, or the caller's advance_cursors, moves it later)."""
    if TICKET:
        t = tl.atomic_add(cur_ptr + slot, 65536, mask=live, sem="relaxed")
        n = tl.where(live, t & _CUR_MASK, 0)
        last = live & ((t >> 16) == NPROG - 1)
    else:
        t = tl.load(cur_ptr + slot, mask=live, other=0)
        n = t & _CUR_MASK
    if STALE:
        stale = live & ((t & _LO_STALE) != 0)
        new = tl.where((n + 1 >= K) | stale, 0, n + 1)
    else:
        stale = n < 0       # (always False; non-dual callers do not use it)
        new = tl.where(n + 1 >= K, 0, n + 1)
    if TICKET:
        tl.atomic_xchg(cur_ptr + slot, new, mask=last, sem="relaxed")
    return n, stale


@triton.jit
def _step_scalars(A_ptr, dt_ptr, dtb_ptr, B_ptr, b, h, g, offs_n, mask_n, s_dt_b, s_B_b, s_B_g):
    """The step's per-head raw inputs: (A[h], dt[b, h], dt_bias[h], B[b, g] [BLOCK_N]); h may
    be a vector of heads (then A, dt, dt_bias are vectors)."""
    A = tl.load(A_ptr + h)
    dt_raw = tl.load(dt_ptr + b * s_dt_b + h)
    dtb = tl.load(dtb_ptr + h)
    Bn_raw = tl.load(B_ptr + b * s_B_b + g * s_B_g + offs_n, mask=mask_n, other=0.0)
    return A, dt_raw, dtb, Bn_raw


@triton.jit
def _step_terms(A, dt_raw, dtb, Bn_raw, dt_i, mask_l, bdt_ptr, bB_ptr, EXACT: tl.constexpr):
    """(A, dt_n, w, total, Bn_buf) from _step_scalars' raw A, dt, dt_bias, B and the buffered
    dt_i [BL] (or [BL, heads], with mask_l and A, dt, dt_bias alike per head), fp32 but Bn_buf:
    dt_n = softplus(dt + dt_bias) as the buffer stores it, w and total as _buffer_weights (the
    decay up to and including the new entry), Bn_buf = B in the buffer's dtype (the appended row)."""
    A = A.to(tl.float32)
    dt_n = softplus(dt_raw.to(tl.float32) + dtb.to(tl.float32))
    dt_n = dt_n.to(bdt_ptr.dtype.element_ty).to(tl.float32)   # as stored in the buffer
    dt_i = dt_i.to(tl.float32)
    w, total = _buffer_weights(dt_i * A, dt_i, mask_l, dt_n * A)
    return A, dt_n, w, total, cast(Bn_raw.to(tl.float32), bB_ptr.dtype.element_ty, EXACT)


@triton.jit
def _buffer_bc_kernel(C_ptr, bB_ptr, bc_ptr, idx_ptr, A_ptr, dt_ptr, dtb_ptr, B_ptr, cur_ptr, bdt_ptr, N, NL, HPG,
                      s_C_b, s_C_g, s_bB_s, s_bB_l, s_bB_g, s_dt_b, s_B_b, s_B_g, s_bdt_s, s_bdt_l,
                      BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, HAS_IDX: tl.constexpr, GDC: tl.constexpr = False,
                      COEF: tl.constexpr = False, EXACT: tl.constexpr = False, BLOCK_H: tl.constexpr = 1):
    """bc[b, g, i] = B_i . C for buffer rows i < NL (min(K, L)) of batch row b's slot and group g:
    the output path's per-group products, once per group instead of once per program of the
    step (_replay_step_kernel's PRE_BC). Grid (G, b); bc [b, G, BLOCK_L] float32. Rows past
    the cursor are computed from whatever they hold: the step masks them. A padded row's
    slot is clamped to 0 (its outputs are never used).
    COEF (the step's PRE_COEF): instead, every per-head term of the output path for the group's
    HPG heads h, into bc [b, H, 2 BLOCK_L] float32: [0, BLOCK_L) w_i (B_i . C) for the n =
    cursor buffered rows (0 past them), BLOCK_L the checkpoint's decay `total`, BLOCK_L + 1
    dt_n (B . C) (as _replay_step_kernel computes them); and the step's appends of dt_n (each
    head) and B (the group) at row n, which the step then leaves out. The cursor must not move
    while this runs (no ticket: the cursor pass follows the step). Row n is past the cursor for
    every reader of the step (a flushing sequence's row n is junk after its flush, as rows past
    any cursor are).
    GDC: the step behind it is a programmatic dependent launch, let go at once: its programs
    run their cursor and state loads beside this kernel and wait for it (gdc_wait_prior)
    only before reading bc. This launch itself is an ordinary one, so everything ahead of it
    in the stream (the writes the step reads) has finished before either starts; the step's
    own appends may land in rows this kernel reads, rows past the cursor that it masks."""
    gdc_release(GDC)
    g = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot, live = _slot_of(idx_ptr, b, HAS_IDX)
    offs_n = tl.arange(0, BLOCK_N)
    offs_l = tl.arange(0, BLOCK_L)
    in_n = offs_n < N
    if COEF:    # every load ahead of what depends on the cursor (the buffered dt: all NL rows, masked after)
        word = tl.load(cur_ptr + slot)
        offs_h = tl.arange(0, BLOCK_H)
        in_h = offs_h < HPG
        hh = g * HPG + tl.minimum(offs_h, HPG - 1)      # (padding lanes repeat the last head, unstored)
        dt_all = tl.load(bdt_ptr + slot * s_bdt_s + offs_l[:, None] * s_bdt_l + hh[None, :],
                         mask=(offs_l < NL)[:, None], other=0.0)
        A, dt_raw, dtb, Bn_raw = _step_scalars(A_ptr, dt_ptr, dtb_ptr, B_ptr, b, hh, g, offs_n, in_n, s_dt_b,
                                               s_B_b, s_B_g)
    Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=in_n, other=0.0).to(tl.float32)
    Bb = tl.load(bB_ptr + slot * s_bB_s + g * s_bB_g + offs_l[:, None] * s_bB_l + offs_n[None, :],
                 mask=(offs_l < NL)[:, None] & in_n[None, :], other=0.0).to(tl.float32)
    bc = tl.sum(Bb * Cv[None, :], axis=1)
    if COEF:
        n = word & _CUR_MASK
        mask_l = (offs_l < n) & live
        m2 = mask_l[:, None] & in_h[None, :]
        dt_i = tl.where(m2, dt_all, 0.0)    # rows past the cursor may hold anything (even NaN)
        A, dt_n, w, total, Bn_buf = _step_terms(A, dt_raw, dtb, Bn_raw, dt_i, m2, bdt_ptr, bB_ptr, EXACT)
        cf = bc_ptr + (b * tl.num_programs(0) * HPG + hh) * (2 * BLOCK_L)     # [BLOCK_H] head rows
        tl.store(cf[None, :] + offs_l[:, None], tl.where(m2, w * bc[:, None], 0.0), mask=in_h[None, :])
        tl.store(cf + BLOCK_L, total, mask=in_h)
        tl.store(cf + BLOCK_L + 1, dt_n * tl.sum(Bn_buf.to(tl.float32) * Cv, axis=0), mask=in_h)
        tl.store(bdt_ptr + slot * s_bdt_s + n * s_bdt_l + hh, dt_n, mask=in_h & live)
        tl.store(bB_ptr + slot * s_bB_s + g * s_bB_g + n * s_bB_l + offs_n, Bn_buf, mask=in_n & live)
    else:
        tl.store(bc_ptr + (b * tl.num_programs(0) + g) * BLOCK_L + offs_l, bc)


@triton.jit
def _replay_step_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr, idx_ptr,
    cur_ptr, bx_ptr, bB_ptr, bdt_ptr, bc_ptr,
    rd_ptr, rd_sc_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    K, P, N, HPG, NPROG,
    s_x_b, s_x_h, s_dt_b, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_y_b, s_y_h,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, RD_SCALE: tl.constexpr, HI_SCALE: tl.constexpr,
    HAS_LO: tl.constexpr, LO_SCALE: tl.constexpr, USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr,
    EXACT: tl.constexpr, FUSED: tl.constexpr, TICKET: tl.constexpr, EARLY: tl.constexpr, EVICT: tl.constexpr,
    FOLD_ROWS: tl.constexpr, PRELOAD: tl.constexpr, FOLD_COLS: tl.constexpr,
    PF: tl.constexpr = 0, RD_LPR: tl.constexpr = 1, RD_LS: tl.constexpr = 32, PRE_BC: tl.constexpr = False,
    GDC: tl.constexpr = False, PRE_COEF: tl.constexpr = False, FOLD_WAIT: tl.constexpr = True,
):
    """One ReplaySSM step for BLOCK_P rows of head h of batch row b (see module docstring).

    n = cursor[slot] entries are buffered; the new entry (x, B, dt) is entry n.
    Output-only route: y = exp(c) (S_rd C) + sum_i w_i (B_i.C) x_i + dt (B.C) x from the read
    checkpoint tile and buffer rows 0..n-1; append the entry at row n (x: every program its
    rows; dt: row tile 0; B: row tile 0 of the group's first head).
    FUSED and n + 1 >= K (flush route): fold entries 0..n into the high tile, y = S_new C,
    write the high tile (and the low copy in dual mode); nothing is appended. Dual states
    also flush where the cursor word says the low copy is stale (LO_STALE; then n = 0).
    Not FUSED: every sequence takes the output-only route (flushing ones append row n too)
    and _replay_flush_kernel, launched next, folds and overwrites their y.
    PRE_BC: the output-only route reads B_i . C from bc_ptr [b, G, BLOCK_L] (float32, written
    by _buffer_bc_kernel just before) instead of computing it from the group's buffered B tile
    in every program (as many products as the state tile's own; the flush route still loads it);
    GDC: launched as that kernel's programmatic dependent (see _buffer_bc_kernel).
    PRE_COEF: the output-only route reads all its per-head terms (w_i (B_i . C), the decay
    `total`, dt_n (B . C)) from bc_ptr [b, H, 2 BLOCK_L] (_buffer_bc_kernel's COEF), which also
    made the dt and B appends; only the flush route loads A, dt, dt_bias, B and the buffered dt
    (a program's own work is then its tile, the cursor, x and its appended x row).
    FOLD_WAIT (with PRE_BC and GDC): the flush route waits for that kernel too, at its end, so
    every program of the step waits for it and the step cannot finish before it, even when
    every sequence flushes (then no program takes the output route).
    Rows 0..n-1 are only read and row n only written, so programs of one sequence never race.
    """
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // HPG
    slot, live = _slot_of(idx_ptr, b, HAS_IDX)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    in_p = offs_p < P
    mask_p = in_p & live
    offs_n = tl.arange(0, BLOCK_N)
    in_n = offs_n < N
    mask_n = in_n & live
    mask = mask_p[:, None] & mask_n[None, :]
    ck_base = slot * s_ck_s + h * s_ck_h
    sc_base = slot * s_sc_s + h * s_sc_h
    bx_base = slot * s_bx_s + h * s_bx_h
    bB_base = slot * s_bB_s + g * s_bB_g
    z_row = z_ptr + b * s_z_b + h * s_z_h
    y_row = y_ptr + b * s_y_b + h * s_y_h
    offs_l = tl.arange(0, BLOCK_L)
    # Loads first, grouped by what their addresses depend on, compute after (a warp stalls
    # at the first use of a pending load, not at the load): 1. what does not depend on the
    # cursor, the read-checkpoint tile above all (EARLY: it streams while the cursor and the
    # buffer tiles are fetched; the relaxed ticket does not order it); 2. the cursor; 3. the
    # buffer tiles it masks (PRELOAD; else inside the branch that uses them).
    if EARLY:
        S = _load_state(rd_ptr, rd_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, RD_SCALE, EVICT)
    elif PF > 0:    # the tile's lines on their way (RD_LPR lines of RD_LS elements per row), no registers
        prefetch_hint(rd_ptr, ck_base + tl.minimum(offs_p, P - 1) * s_ck_p, RD_LPR, RD_LS, PF, EXACT)
    Dh = tl.load(D_ptr + h)
    if not PRE_COEF:
        A, dt_raw, dtb, Bn_raw = _step_scalars(A_ptr, dt_ptr, dtb_ptr, B_ptr, b, h, g, offs_n, mask_n, s_dt_b,
                                               s_B_b, s_B_g)
    Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=mask_n, other=0.0)
    x_raw = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_p, mask=mask_p, other=0.0)
    n, stale = _take_cursor(cur_ptr, slot, live, K, NPROG, TICKET, HAS_LO)
    mask_l = (offs_l < n) & live
    if not PRE_COEF:
        dt_i = tl.load(bdt_ptr + slot * s_bdt_s + offs_l * s_bdt_l + h, mask=mask_l, other=0.0)
    if PRELOAD:
        if not PRE_COEF:
            Bb = tl.load(bB_ptr + bB_base + offs_l[:, None] * s_bB_l + offs_n[None, :],
                         mask=mask_l[:, None] & in_n[None, :], other=0.0)
        Xb = tl.load(bx_ptr + bx_base + offs_l[:, None] * s_bx_l + offs_p[None, :],
                     mask=mask_l[:, None] & mask_p[None, :], other=0.0)
    Dh = Dh.to(tl.float32)
    if not PRE_COEF:    # buffered entries 0..n-1: per-head decay weights (shared by all rows)
        A, dt_n, w, total, Bn_buf = _step_terms(A, dt_raw, dtb, Bn_raw, dt_i, mask_l, bdt_ptr, bB_ptr, EXACT)
        Bn = Bn_buf.to(tl.float32)   # as stored in the buffer
    Cv = Cv.to(tl.float32)
    x_buf = cast(x_raw.to(tl.float32), bx_ptr.dtype.element_ty, EXACT)   # entry n as stored
    if FUSED:
        do_fold = n + 1 >= K
        if HAS_LO:  # a stale low copy (LO_STALE) is not read: the step flushes, refreshing it
            do_fold = do_fold | stale
    else:
        do_fold = False
    # One branch per program (the decision is per sequence). Without PRELOAD each branch
    # loads the buffer tiles itself (fewer registers live across the cursor wait).
    if do_fold:
        if PRE_COEF:    # the per-head terms the output path takes from the pre-pass
            A, dt_raw, dtb, Bn_raw = _step_scalars(A_ptr, dt_ptr, dtb_ptr, B_ptr, b, h, g, offs_n, mask_n, s_dt_b,
                                                   s_B_b, s_B_g)
            dt_i = tl.load(bdt_ptr + slot * s_bdt_s + offs_l * s_bdt_l + h, mask=mask_l, other=0.0)
            A, dt_n, w, total, Bn_buf = _step_terms(A, dt_raw, dtb, Bn_raw, dt_i, mask_l, bdt_ptr, bB_ptr, EXACT)
            Bn = Bn_buf.to(tl.float32)
        if FOLD_ROWS == BLOCK_P and FOLD_COLS == BLOCK_N:    # the whole tile in one fold
            if PRELOAD and not PRE_COEF:
                Bbf = Bb.to(tl.float32)
                Xbf = Xb.to(tl.float32)
            else:
                Bbf = _load_buffer_B(bB_ptr, bB_base, s_bB_l, offs_l, offs_n, mask_l, in_n)
                Xbf = tl.load(bx_ptr + bx_base + offs_l[:, None] * s_bx_l + offs_p[None, :],
                              mask=mask_l[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
            if HAS_LO:      # the read tile is the low copy: fold the high one
                Sh = _load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE,
                                 EVICT)
            elif EARLY:     # the read tile is the high checkpoint itself
                Sh = S
            else:
                Sh = _load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE,
                                 EVICT)
            Sh = total * Sh + _outer_sum(Xbf * w[:, None], Bbf, USE_DOT, DOT_PREC, EXACT) \
                + (dt_n * x_buf.to(tl.float32))[:, None] * Bn[None, :]
            _store_ckpts(hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, ck_base, sc_base, s_ck_p, offs_p, offs_n, mask, mask_p,
                         Sh, HI_SCALE, HAS_LO, LO_SCALE, EXACT, EVICT)
            _finish_y(tl.sum(Sh * Cv[None, :], axis=1), x_raw.to(tl.float32), Dh, z_row, y_row, offs_p, mask_p, in_p,
                      HAS_Z, EXACT)
        else:
            # [FOLD_ROWS, FOLD_COLS] chunks, each re-reading its high rows (an L2 hit when they
            # are the tile just read; the read tile S is dead here): the fold's MMA operands and
            # accumulator cost a chunk's registers, not the program's tile's, so the flush path
            # (1 program in K) does not lower the occupancy of the output path. Row-scaled
            # copies come with FOLD_COLS == BLOCK_N (the planner): a scale needs the whole row.
            if FOLD_COLS == BLOCK_N:    # whole rows: the buffered B tile once, for every chunk
                if PRELOAD and not PRE_COEF:
                    Bbf = Bb.to(tl.float32)
                else:
                    Bbf = _load_buffer_B(bB_ptr, bB_base, s_bB_l, offs_l, offs_n, mask_l, in_n)
            for c in tl.range(0, BLOCK_P // FOLD_ROWS, num_stages=1, loop_unroll_factor=1):
                offs_q = pid_p * BLOCK_P + c * FOLD_ROWS + tl.arange(0, FOLD_ROWS)
                in_q = offs_q < P
                mask_q = in_q & live
                xw = tl.load(bx_ptr + bx_base + offs_l[:, None] * s_bx_l + offs_q[None, :],
                             mask=mask_l[:, None] & mask_q[None, :], other=0.0).to(tl.float32) * w[:, None]
                xq = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_q, mask=mask_q, other=0.0).to(tl.float32)
                xqn = dt_n * cast(xq, bx_ptr.dtype.element_ty, EXACT).to(tl.float32)
                yq = tl.zeros([FOLD_ROWS], tl.float32)
                for j in tl.range(0, BLOCK_N // FOLD_COLS, num_stages=1, loop_unroll_factor=1):
                    offs_m = j * FOLD_COLS + tl.arange(0, FOLD_COLS)
                    in_m = offs_m < N
                    mask2 = mask_q[:, None] & (in_m & live)[None, :]
                    Sq = _load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_q, offs_m, s_ck_p, mask2, mask_q,
                                     HI_SCALE, "")
                    if FOLD_COLS == BLOCK_N:
                        Bc, Bm, Cm = Bbf, Bn, Cv
                    else:
                        Bc = _load_buffer_B(bB_ptr, bB_base, s_bB_l, offs_l, offs_m, mask_l, in_m)
                        Bm = tl.load(B_ptr + b * s_B_b + g * s_B_g + offs_m, mask=in_m & live, other=0.0)
                        Bm = cast(Bm.to(tl.float32), bB_ptr.dtype.element_ty, EXACT).to(tl.float32)   # as buffered
                        Cm = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_m, mask=in_m & live, other=0.0)
                        Cm = Cm.to(tl.float32)
                    Sq = total * Sq + _outer_sum(xw, Bc, USE_DOT, DOT_PREC, EXACT) + xqn[:, None] * Bm[None, :]
                    _store_ckpts(hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, ck_base, sc_base, s_ck_p, offs_q, offs_m, mask2,
                                 mask_q, Sq, HI_SCALE, HAS_LO, LO_SCALE, EXACT, EVICT)
                    yq += tl.sum(Sq * Cm[None, :], axis=1)
                _finish_y(yq, xq, Dh, z_row, y_row, offs_q, mask_q, in_q, HAS_Z, EXACT)
        if PRE_BC and FOLD_WAIT:
            # The flush route reads nothing the pre-pass writes, but without this wait a step
            # whose sequences all flush (lockstep cursors, every K-th step) would have no program
            # waiting for the pre-pass, and only the stream's order around a programmatic pair
            # would keep the launches after this one (the cursor pass, the next step's pre-pass
            # into the same scratch) from overlapping it. Here it is done long before.
            gdc_wait_prior(GDC)
    else:
        if PRE_COEF:    # zero past the cursor (the pre-pass masked them)
            gdc_wait_prior(GDC)     # _buffer_bc_kernel's terms written and visible
            cf = bc_ptr + (b * tl.num_programs(1) + h) * (2 * BLOCK_L)
            coef = tl.load(cf + offs_l)                     # [BL] w_i (B_i . C)
            total = tl.load(cf + BLOCK_L)
            coef_n = tl.load(cf + BLOCK_L + 1)
        elif PRE_BC:  # rows past the cursor may hold anything (even NaN): masked below, not weighted
            gdc_wait_prior(GDC)     # _buffer_bc_kernel's products written and visible
            bc = tl.load(bc_ptr + (b * (tl.num_programs(1) // HPG) + g) * BLOCK_L + offs_l, mask=mask_l, other=0.0)
        elif PRELOAD:
            Bbf = Bb.to(tl.float32)
        else:
            Bbf = _load_buffer_B(bB_ptr, bB_base, s_bB_l, offs_l, offs_n, mask_l, in_n)
        if PRELOAD:
            Xbf = Xb.to(tl.float32)
        else:
            Xbf = tl.load(bx_ptr + bx_base + offs_l[:, None] * s_bx_l + offs_p[None, :],
                          mask=mask_l[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
        if not PRE_COEF:    # (else loaded above)
            if PRE_BC:
                coef = tl.where(mask_l, w * bc, 0.0)                # [BL] w_i (B_i . C)
            else:
                coef = w * tl.sum(Bbf * Cv[None, :], axis=1)       # [BL] w_i (B_i . C)
            coef_n = dt_n * tl.sum(Bn * Cv, axis=0)
        if not EARLY:
            S = _load_state(rd_ptr, rd_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, RD_SCALE,
                            EVICT)
        yv = total * tl.sum(S * Cv[None, :], axis=1) + tl.sum(Xbf * coef[:, None], axis=0) \
            + coef_n * x_buf.to(tl.float32)
        tl.store(bx_ptr + bx_base + n * s_bx_l + offs_p, x_buf, mask=mask_p)
        _finish_y(yv, x_raw.to(tl.float32), Dh, z_row, y_row, offs_p, mask_p, in_p, HAS_Z, EXACT)
        if not PRE_COEF:    # (else the pre-pass appended them)
            append = live & (pid_p == 0)
            tl.store(bdt_ptr + slot * s_bdt_s + n * s_bdt_l + h, dt_n, mask=append)
            tl.store(bB_ptr + bB_base + n * s_bB_l + offs_n, Bn_buf, mask=mask_n & append & (h % HPG == 0))


@triton.jit
def _replay_flush_kernel(
    x_ptr, A_ptr, C_ptr, D_ptr, z_ptr, y_ptr, idx_ptr, cur_ptr, bx_ptr, bB_ptr, bdt_ptr,
    hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    K, P, N, HPG,
    s_x_b, s_x_h, s_C_b, s_C_g, s_z_b, s_z_h, s_y_b, s_y_h,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr,
    LO_SCALE: tl.constexpr, USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr, EXACT: tl.constexpr,
    ADVANCED: tl.constexpr, EVICT: tl.constexpr, FOLD_ROWS: tl.constexpr,
):
    """Second launch of the split route, after _replay_step_kernel (FUSED False), same grid.
    A program whose sequence flushes this step folds the buffered entries 0..K-1 (the step
    kernel appended entry K-1) into its rows of the high checkpoint, writes them (and the low
    copy), and overwrites y with S_new C (+ D x, * silu z), as the fused route computes it.
    Every other program returns after one cursor load. ADVANCED: the step kernel already
    moved the cursor (ticket), so a flushing sequence is one whose cursor is now 0 (not for
    dual states, plan_replay_step); otherwise (cursor moved later) one with cursor + 1 >= K
    or a stale low copy (LO_STALE)."""
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    slot, live = _slot_of(idx_ptr, b, HAS_IDX)
    word = tl.load(cur_ptr + slot, mask=live, other=1)
    n = word & _CUR_MASK     # (LO_STALE, the deferred route's epoch)
    if ADVANCED:
        do = live & (n == 0)
        nf = K
    elif HAS_LO:
        do = live & ((n + 1 >= K) | ((word & _LO_STALE) != 0))
        nf = n + 1
    else:
        do = live & (n + 1 >= K)
        nf = n + 1
    if do:
        g = h // HPG
        A = tl.load(A_ptr + h).to(tl.float32)
        offs_l = tl.arange(0, BLOCK_L)
        mask_l = offs_l < nf
        dt_i = tl.load(bdt_ptr + slot * s_bdt_s + offs_l * s_bdt_l + h, mask=mask_l, other=0.0).to(tl.float32)
        w, total = _buffer_weights(dt_i * A, dt_i, mask_l, 0.0)
        offs_n = tl.arange(0, BLOCK_N)
        mask_n = offs_n < N
        Bb = _load_buffer_B(bB_ptr, slot * s_bB_s + g * s_bB_g, s_bB_l, offs_l, offs_n, mask_l, mask_n)
        Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
        Dh = tl.load(D_ptr + h).to(tl.float32)
        ck_base = slot * s_ck_s + h * s_ck_h
        sc_base = slot * s_sc_s + h * s_sc_h
        for c in tl.range(0, BLOCK_P // FOLD_ROWS, num_stages=1, loop_unroll_factor=1):
            offs_p = pid_p * BLOCK_P + c * FOLD_ROWS + tl.arange(0, FOLD_ROWS)
            mask_p = offs_p < P
            mask = mask_p[:, None] & mask_n[None, :]
            Xb = tl.load(bx_ptr + slot * s_bx_s + h * s_bx_h + offs_l[:, None] * s_bx_l + offs_p[None, :],
                         mask=mask_l[:, None] & mask_p[None, :], other=0.0).to(tl.float32)
            S = _load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE,
                            EVICT)
            S = total * S + _outer_sum(Xb * w[:, None], Bb, USE_DOT, DOT_PREC, EXACT)
            _store_ckpts(hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, ck_base, sc_base, s_ck_p, offs_p, offs_n, mask,
                         mask_p, S, HI_SCALE, HAS_LO, LO_SCALE, EXACT, EVICT)
            xv = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_p, mask=mask_p, other=0.0).to(tl.float32)
            _finish_y(tl.sum(S * Cv[None, :], axis=1), xv, Dh, z_ptr + b * s_z_b + h * s_z_h,
                      y_ptr + b * s_y_b + h * s_y_h, offs_p, mask_p, mask_p, HAS_Z, EXACT)


@triton.jit
def _replay_eager_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr, idx_ptr,
    cur_ptr, bx_ptr, bB_ptr, bdt_ptr, hi_ptr, hi_sc_ptr,
    P, N, HPG, NPROG,
    s_x_b, s_x_h, s_dt_b, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_y_b, s_y_h,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, CAP: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr,
    EXACT: tl.constexpr, EVICT: tl.constexpr,
):
    """The replay step's eager route (route "eager", a small-batch route): a flush at every
    step with eager's traffic, on BLOCK_P rows of the HIGH checkpoint of head h of batch row b.

    n = cursor, a plain load beside the state's. n > 0 (entries a buffered-route step left):
    fold entries 0..n-1 first (as a flush; CAP, the buffer capacity, bounds the loop), then
    take a ticket (cursor high bits); the program drawing NPROG - 1 resets the cursor to 0
    (dual: LO_STALE; every program read n before its own ticket, so all agree on n). Then the
    eager step with the new entry as the buffer would store it (x, B, dt rounded to the buffer
    dtypes, as the reference's flush folds it): S' = exp(dt A) S + dt x B^T, written to the
    high copy, and y = S' C (+ D x, * silu z). Dual (HAS_LO): the low copy is not written; the
    cursor word says it is stale (LO_STALE, stored by each program that finds the bit clear:
    the same value, and concurrent readers see n = 0 either way) and the next buffered step
    flushes, refreshing it. Nothing is appended; in the steady state (n = 0) there is no
    atomic, so steps may switch routes."""
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // HPG
    slot, live = _slot_of(idx_ptr, b, HAS_IDX)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    in_p = offs_p < P
    mask_p = in_p & live
    offs_n = tl.arange(0, BLOCK_N)
    in_n = offs_n < N
    mask_n = in_n & live
    mask = mask_p[:, None] & mask_n[None, :]
    ck_base = slot * s_ck_s + h * s_ck_h
    sc_base = slot * s_sc_s + h * s_sc_h
    S = _load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE, EVICT)
    word = tl.load(cur_ptr + slot, mask=live, other=0)
    n = word & _CUR_MASK
    A = tl.load(A_ptr + h).to(tl.float32)
    Dh = tl.load(D_ptr + h).to(tl.float32)
    dt_n = softplus(tl.load(dt_ptr + b * s_dt_b + h).to(tl.float32) + tl.load(dtb_ptr + h).to(tl.float32))
    dt_n = dt_n.to(bdt_ptr.dtype.element_ty).to(tl.float32)   # as the buffer would store it
    Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    Bn = tl.load(B_ptr + b * s_B_b + g * s_B_g + offs_n, mask=mask_n, other=0.0).to(tl.float32)
    Bn = cast(Bn, bB_ptr.dtype.element_ty, EXACT).to(tl.float32)
    x_in = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_p, mask=mask_p, other=0.0).to(tl.float32)
    x_buf = cast(x_in, bx_ptr.dtype.element_ty, EXACT).to(tl.float32)
    a_n = tl.exp(dt_n * A)      # the new entry's terms, computed while the state tile streams in
    dx_n = dt_n * x_buf
    if n > 0:
        # Pending entries folded one by one (rank-1 FMA updates, in order). This path is rare
        # (a route switch); a tl.dot fold here put the whole tile in an MMA-friendly layout and
        # slowed the steady state (H200, batch 1, Super: 5.44 us vs eager's 4.48 at 32 x 8).
        for i in range(CAP):
            if i < n:
                dt_i = tl.load(bdt_ptr + slot * s_bdt_s + i * s_bdt_l + h).to(tl.float32)
                x_i = tl.load(bx_ptr + slot * s_bx_s + h * s_bx_h + i * s_bx_l + offs_p, mask=mask_p,
                              other=0.0).to(tl.float32)
                B_i = tl.load(bB_ptr + slot * s_bB_s + g * s_bB_g + i * s_bB_l + offs_n, mask=in_n,
                              other=0.0).to(tl.float32)
                S = tl.exp(dt_i * A) * S + (dt_i * x_i)[:, None] * B_i[None, :]
        t = tl.atomic_add(cur_ptr + slot, 65536, mask=live, sem="relaxed")
        tl.atomic_xchg(cur_ptr + slot, _LO_STALE if HAS_LO else 0, mask=live & ((t >> 16) == NPROG - 1),
                       sem="relaxed")
    elif HAS_LO:
        tl.store(cur_ptr + slot, _LO_STALE, mask=live & (word == 0))
    S = a_n * S + dx_n[:, None] * Bn[None, :]
    _store_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, S, HI_SCALE, EXACT, EVICT)
    _finish_y(tl.sum(S * Cv[None, :], axis=1), x_in, Dh, z_ptr + b * s_z_b + h * s_z_h, y_ptr + b * s_y_b + h * s_y_h,
              offs_p, mask_p, in_p, HAS_Z, EXACT)


@triton.jit
def _replay_defer_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr, idx_ptr,
    cur_ptr, ep_ptr, bx_ptr, bB_ptr, bdt_ptr, hi_ptr, hi_sc_ptr,
    P, N, HPG, NPROG,
    s_x_b, s_x_h, s_dt_b, s_B_b, s_B_g, s_C_b, s_C_g, s_z_b, s_z_h, s_y_b, s_y_h,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, CAP: tl.constexpr,
    HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr, HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr,
    EXACT: tl.constexpr, EVICT: tl.constexpr, RK: tl.constexpr, EP_ROWS: tl.constexpr,
):
    """The small-batch route with period RK >= 2 ("route_k"): the state written at every RK-th
    step only. One [BLOCK_P, N] tile of the HIGH checkpoint per program, as the eager route
    (_replay_eager_kernel); at count n < RK the tile gets buffer entries 0..n-1 folded in
    (S <- exp(dt_i A) S + dt_i x_i B_i^T, the inputs as buffered), then this step's entry
    (rounded as the buffer stores it): y = S' C (+ D x, * silu z); n + 1 = RK: S' written,
    count 0; else the entry appended at row n (as the buffered step appends it), count n + 1.
    So the route moves the state's read and 1/RK of its write a step, against eager's read and
    write; its entries are plain buffer entries, which every other op folds as its own.

    The cursor moves without a ticket (state.py, "the route's epoch"; common.route_word):
    program (0, 0) of the sequence stores the next word (common.route_next_word), every program
    its epoch (ep_ptr: route_epoch [S, H, ceil(P / EP_ROWS)], one byte per EP_ROWS rows). Any
    other word takes the rare path: the tile re-read, entries 0..nw-1 folded, this step, S'
    written or the entry appended at nw, and a ticket each (common.route_ticket). The steady step
    is computed ahead of the branch on the path. Dual (HAS_LO): the high copy alone; the words
    carry LO_STALE (the next buffered step flushes, a verify refreshes the low copy first)."""
    tl.static_assert(BLOCK_P % EP_ROWS == 0, "BLOCK_P: a multiple of EP_ROWS (state.EPOCH_ROWS)")
    EW: tl.constexpr = BLOCK_P // EP_ROWS
    pid_p, h, b, g, slot, live, offs_p, in_p, offs_n, in_n = _program_tile(idx_ptr, P, N, HPG, BLOCK_P, BLOCK_N,
                                                                           HAS_IDX)
    z_row = z_ptr + b * s_z_b + h * s_z_h
    y_row = y_ptr + b * s_y_b + h * s_y_h
    if live:
        mask = in_p[:, None] & in_n[None, :]
        ck_base = slot * s_ck_s + h * s_ck_h
        sc_base = slot * s_sc_s + h * s_sc_h
        S0 = _load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, in_p, HI_SCALE, EVICT)
        word = tl.load(cur_ptr + slot)
        ep_at = ep_ptr + (slot * tl.num_programs(1) + h) * ((P + EP_ROWS - 1) // EP_ROWS) + pid_p * EW
        ep = tl.load(ep_at).to(tl.int32)
        A = tl.load(A_ptr + h).to(tl.float32)
        Dh = tl.load(D_ptr + h).to(tl.float32)
        dt_n = softplus(tl.load(dt_ptr + b * s_dt_b + h).to(tl.float32) + tl.load(dtb_ptr + h).to(tl.float32))
        dt_n = dt_n.to(bdt_ptr.dtype.element_ty).to(tl.float32)   # as the buffer stores it
        Cv = tl.load(C_ptr + b * s_C_b + g * s_C_g + offs_n, mask=in_n, other=0.0).to(tl.float32)
        Bn_buf = cast(tl.load(B_ptr + b * s_B_b + g * s_B_g + offs_n, mask=in_n, other=0.0).to(tl.float32),
                      bB_ptr.dtype.element_ty, EXACT)
        x_in = tl.load(x_ptr + b * s_x_b + h * s_x_h + offs_p, mask=in_p, other=0.0).to(tl.float32)
        x_buf = cast(x_in, bx_ptr.dtype.element_ty, EXACT)
        bx_base = slot * s_bx_s + h * s_bx_h
        bB_base = slot * s_bB_s + g * s_bB_g
        fast, n, nw, e_next = route_word(word, ep, RK)
        # the steady step, whatever the path: entries 0..n-1 (n <= RK - 1) loaded whatever n is
        # (rows at or past the count may hold anything: selected away, never multiplied in)
        S = S0
        for i in tl.static_range(RK - 1):
            S = tl.where(i < n, _with_entry(S, i, A, bx_ptr, bB_ptr, bdt_ptr, bx_base, bB_base, slot, h, s_bx_l, s_bB_l,
                                            s_bdt_s, s_bdt_l, offs_p, in_p, offs_n, in_n), S)
        S = tl.exp(dt_n * A) * S + (dt_n * x_buf.to(tl.float32))[:, None] * Bn_buf.to(tl.float32)[None, :]
        ep_new = e_next
        if fast:
            _defer_finish(S, n, x_in, x_buf, Bn_buf, dt_n, Cv, Dh, z_row, y_row, bx_ptr, bB_ptr, bdt_ptr, hi_ptr,
                          hi_sc_ptr, ck_base, sc_base, bx_base, bB_base, slot, s_bx_l, s_bB_l, s_bdt_s, s_bdt_l,
                          s_ck_p, h, HPG, offs_p, in_p, offs_n, in_n, mask, HAS_Z, HI_SCALE, EXACT, EVICT, RK)
            if (pid_p == 0) & (h == 0):
                tl.store(cur_ptr + slot, route_next_word(n, e_next, RK, HAS_LO))
        else:
            # the rare path: the step again from the tile as stored (nothing is written before
            # this branch) with every entry the word counts folded in, in order
            S = _load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, in_p, HI_SCALE, EVICT)
            for j in range(CAP):
                if j < nw:
                    S = _with_entry(S, j, A, bx_ptr, bB_ptr, bdt_ptr, bx_base, bB_base, slot, h, s_bx_l, s_bB_l,
                                    s_bdt_s, s_bdt_l, offs_p, in_p, offs_n, in_n)
            S = tl.exp(dt_n * A) * S + (dt_n * x_buf.to(tl.float32))[:, None] * Bn_buf.to(tl.float32)[None, :]
            _defer_finish(S, nw, x_in, x_buf, Bn_buf, dt_n, Cv, Dh, z_row, y_row, bx_ptr, bB_ptr, bdt_ptr, hi_ptr,
                          hi_sc_ptr, ck_base, sc_base, bx_base, bB_base, slot, s_bx_l, s_bB_l, s_bdt_s, s_bdt_l,
                          s_ck_p, h, HPG, offs_p, in_p, offs_n, in_n, mask, HAS_Z, HI_SCALE, EXACT, EVICT, RK)
            route_ticket(cur_ptr + slot, NPROG, nw, RK, HAS_LO)
            ep_new = 1
        ew = tl.arange(0, EW)
        tl.store(ep_at + ew, tl.full([EW], 0, tl.int8) + ep_new.to(tl.int8), mask=pid_p * BLOCK_P + ew * EP_ROWS < P)
    else:
        tl.store(y_row + offs_p, cast(tl.zeros([BLOCK_P], tl.float32), y_ptr.dtype.element_ty, EXACT), mask=in_p)


@triton.jit
def _program_tile(idx_ptr, P, N, HPG, BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_IDX: tl.constexpr):
    """A [BLOCK_P, N] tile program's place, grid (cdiv(P, BLOCK_P), H, batch): (pid_p, head h,
    batch row b, group g, slot, live, rows offs_p [BLOCK_P] and in_p, columns offs_n [BLOCK_N]
    and in_n)."""
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    slot, live = _slot_of(idx_ptr, b, HAS_IDX)
    offs_p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    offs_n = tl.arange(0, BLOCK_N)
    return pid_p, h, b, h // HPG, slot, live, offs_p, offs_p < P, offs_n, offs_n < N


@triton.jit
def _with_entry(S, i, A, bx_ptr, bB_ptr, bdt_ptr, bx_base, bB_base, slot, h, s_bx_l, s_bB_l, s_bdt_s, s_bdt_l,
                offs_p, in_p, offs_n, in_n):
    """The tile S [BLOCK_P, BLOCK_N] with buffer entry i folded in, as stored: exp(dt_i A) S +
    dt_i x_i B_i^T."""
    dt_i = tl.load(bdt_ptr + slot * s_bdt_s + i * s_bdt_l + h).to(tl.float32)
    x_i = tl.load(bx_ptr + bx_base + i * s_bx_l + offs_p, mask=in_p, other=0.0).to(tl.float32)
    B_i = tl.load(bB_ptr + bB_base + i * s_bB_l + offs_n, mask=in_n, other=0.0).to(tl.float32)
    return tl.exp(dt_i * A) * S + (dt_i * x_i)[:, None] * B_i[None, :]


@triton.jit
def _defer_finish(S, n, x_in, x_buf, Bn_buf, dt_n, Cv, Dh, z_row, y_row, bx_ptr, bB_ptr, bdt_ptr, hi_ptr, hi_sc_ptr,
                  ck_base, sc_base, bx_base, bB_base, slot, s_bx_l, s_bB_l, s_bdt_s, s_bdt_l, s_ck_p, h, HPG,
                  offs_p, in_p, offs_n, in_n, mask, HAS_Z: tl.constexpr, HI_SCALE: tl.constexpr,
                  EXACT: tl.constexpr, EVICT: tl.constexpr, RK: tl.constexpr):
    """The deferred route's writes of a step taken at count n: n + 1 >= RK: the tile S to the
    high copy; else entry n of the buffer (x: this program's rows; dt: row tile 0; B: row tile 0
    of the group's first head). Then y [BLOCK_P]."""
    if n + 1 >= RK:
        _store_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, in_p, S, HI_SCALE, EXACT,
                     EVICT)
    else:
        tl.store(bx_ptr + bx_base + n * s_bx_l + offs_p, x_buf, mask=in_p)
        if tl.program_id(0) == 0:
            tl.store(bdt_ptr + slot * s_bdt_s + n * s_bdt_l + h, dt_n)
            if h % HPG == 0:
                tl.store(bB_ptr + bB_base + n * s_bB_l + offs_n, Bn_buf, mask=in_n)
    _finish_y(tl.sum(S * Cv[None, :], axis=1), x_in, Dh, z_row, y_row, offs_p, in_p, in_p, HAS_Z, EXACT)


# ----------------------------------------------------------------------------- fold (flush / commit)
@triton.jit
def _fold_kernel(
    idx_ptr, acc_ptr, cur_ptr, bx_ptr, bB_ptr, bdt_ptr, A_ptr,
    hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    THRESH, P, N, L, HPG,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    BLOCK_P: tl.constexpr, ROW_CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
    HAS_ACC: tl.constexpr, HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr, LO_SCALE: tl.constexpr,
    USE_DOT: tl.constexpr, DOT_PREC: tl.constexpr, EXACT: tl.constexpr,
    LIST: tl.constexpr = False, ROWS=0, NW=1, NT: tl.constexpr = 1, GDC: tl.constexpr = False,
):
    """Fold buffer entries 0..n-1 into the high checkpoint tile and write it (and the low
    copy in dual mode), where n = cursor[slot] (+ accepted[row] for a commit) and only if
    n >= THRESH (flush: 1, commit: K), or, for a flush of a dual state, where the low copy is
    stale (LO_STALE, n = 0: no entries folded, both copies written; a commit follows a verify,
    which has refreshed it). Row r of the grid addresses slot idx[r] (< 0: skip).
    LIST (a commit after _commit_list_kernel, which has moved the cursors): grid dim 2 is NW
    workers; acc_ptr holds the folding rows as (r << 16) | n at ranks 0.., their count at
    [ROWS]; worker w folds the ranks w, w + NW, ... < the count (NT = cdiv(ROWS, NW) slots;
    no program per batch row that only finds nothing to do). GDC: launched as a programmatic
    dependent (of the list launch), it waits for the kernel ahead of it before any load, then
    lets a programmatic dependent behind it start early (the next layer's commit, in a model)."""
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    if LIST:
        w = tl.program_id(2)
        mine = (tl.load(acc_ptr + ROWS) - w + NW - 1) // NW
        for t in range(NT):       # (a loop bound loaded from memory: not under the interpreter)
            if t < mine:
                key = tl.load(acc_ptr + w + t * NW)
                slot = tl.load(idx_ptr + (key >> 16)).to(tl.int64)
                _fold_head(slot, key & 0xFFFF, pid_p, h, bx_ptr, bB_ptr, bdt_ptr, A_ptr, hi_ptr, hi_sc_ptr, lo_ptr,
                           lo_sc_ptr, P, N, L, HPG, s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
                           s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h, BLOCK_P, ROW_CHUNKS, BLOCK_N, BLOCK_L, HI_SCALE,
                           HAS_LO, LO_SCALE, USE_DOT, DOT_PREC, EXACT)
    else:
        r = tl.program_id(2).to(tl.int64)
        slot = tl.load(idx_ptr + r).to(tl.int64)
        live = slot >= 0
        slot = tl.maximum(slot, 0)
        word = tl.load(cur_ptr + slot, mask=live, other=0)
        n = word & _CUR_MASK     # (LO_STALE, the deferred route's epoch)
        if HAS_ACC:
            n = n + tl.load(acc_ptr + r, mask=live, other=0).to(tl.int32)
            do = n >= THRESH
        elif HAS_LO:
            do = (n >= THRESH) | ((word & _LO_STALE) != 0)
        else:
            do = n >= THRESH
        if live & do:
            _fold_head(slot, n, pid_p, h, bx_ptr, bB_ptr, bdt_ptr, A_ptr, hi_ptr, hi_sc_ptr, lo_ptr,
                       lo_sc_ptr, P, N, L, HPG, s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
                       s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h, BLOCK_P, ROW_CHUNKS, BLOCK_N, BLOCK_L, HI_SCALE,
                       HAS_LO, LO_SCALE, USE_DOT, DOT_PREC, EXACT)


# noinline: inlined into the LIST rank loop, ptxas took 255 registers and spilled 64-96 bytes
# (Nano dims, sm_90); as a call 152-170 and none, as in the per-row kernel
@triton.jit(noinline=True)
def _fold_head(slot, n, pid_p, h, bx_ptr, bB_ptr, bdt_ptr, A_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
               P, N, L, HPG, s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
               s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
               BLOCK_P: tl.constexpr, ROW_CHUNKS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr,
               HI_SCALE: tl.constexpr, HAS_LO: tl.constexpr, LO_SCALE: tl.constexpr, USE_DOT: tl.constexpr,
               DOT_PREC: tl.constexpr, EXACT: tl.constexpr):
    """_fold_kernel's fold of entries 0..n-1 of slot's head h, rows of program pid_p."""
    g = h // HPG
    A = tl.load(A_ptr + h).to(tl.float32)
    offs_l = tl.arange(0, BLOCK_L)
    mask_l = (offs_l < n) & (offs_l < L)
    offs_n = tl.arange(0, BLOCK_N)
    mask_n = offs_n < N
    dt_i = tl.load(bdt_ptr + slot * s_bdt_s + offs_l * s_bdt_l + h, mask=mask_l, other=0.0).to(tl.float32)
    w, total = _buffer_weights(dt_i * A, dt_i, mask_l, 0.0)
    Bb = _load_buffer_B(bB_ptr, slot * s_bB_s + g * s_bB_g, s_bB_l, offs_l, offs_n, mask_l, mask_n)
    ck_base = slot * s_ck_s + h * s_ck_h
    sc_base = slot * s_sc_s + h * s_sc_h
    bx_base = slot * s_bx_s + h * s_bx_h
    for c in tl.static_range(ROW_CHUNKS):
        offs_p = (pid_p * ROW_CHUNKS + c) * BLOCK_P + tl.arange(0, BLOCK_P)
        mask_p = offs_p < P
        mask = mask_p[:, None] & mask_n[None, :]
        S = _fold_chunk(hi_ptr, hi_sc_ptr, ck_base, sc_base, s_ck_p, bx_ptr + bx_base, s_bx_l, offs_l, mask_l,
                        w, total, Bb, offs_p, offs_n, mask_p, mask, HI_SCALE, USE_DOT, DOT_PREC, EXACT)
        _store_ckpts(hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, ck_base, sc_base, s_ck_p, offs_p, offs_n, mask, mask_p,
                     S, HI_SCALE, HAS_LO, LO_SCALE, EXACT, "")


@triton.jit
def _commit_list_kernel(idx_ptr, acc_ptr, cur_ptr, lst_ptr, rows, K, BLOCK_B: tl.constexpr,
                        GDC: tl.constexpr = False):
    """First launch of a LIST commit, one program: m = cursor + accepted[r] per live row; the
    cursor becomes 0 where m >= K (the row folds entries 0..m-1) else m; the folding rows are
    listed as lst[rank] = (r << 16) | m (m <= L < 2^16, r < 2^15), their count at lst[rows]
    (common.list_commit_rows).
    GDC (a programmatic dependent launch): waits for the kernel ahead of it, then lets the
    fold behind it launch."""
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    list_commit_rows(idx_ptr, acc_ptr, cur_ptr, lst_ptr, rows, K, BLOCK_B, False)


# ----------------------------------------------------------------------------- verify (speculation)
@triton.jit
def _mma_acc(a, b, acc, PREC: tl.constexpr, EXACT: tl.constexpr):
    """acc + a @ b: triton.mma precisions, plus "split3" / "split3b": b / a holds bf16 values
    and the other (fp32) operand is split into three bf16 parts (24 significant bits: three
    exact-product MMAs, _outer_sum's bf16x3)."""
    if PREC == "split3":
        r = acc + _outer_sum(tl.trans(a.to(tl.float32)), b, True, "bf16x3", EXACT)
    elif PREC == "split3b":
        r = acc + tl.trans(_outer_sum(b.to(tl.float32), tl.trans(a), True, "bf16x3", EXACT))
    else:
        r = mma_acc(a, b, acc, PREC, EXACT)
    return r


@triton.jit
def _verify_tile_x(x_ptr, bx_ptr, b, h, bx_base, offs_p, mask_p, offs_t, mask_t, offs_l, in_l,
                   s_x_b, s_x_t, s_x_h, s_bx_l, EXACT: tl.constexpr):
    """A row tile's draft inputs XdT [R, BT] (rounded to the buffer's dtype, as appended) and
    buffered inputs XbT [R, BL] (rows in_l; rows >= n masked later by _verify_tile_out)."""
    XdT = cast(tl.load(x_ptr + b * s_x_b + offs_t[None, :] * s_x_t + h * s_x_h + offs_p[:, None],
                       mask=mask_p[:, None] & mask_t[None, :], other=0.0).to(tl.float32),
               bx_ptr.dtype.element_ty, EXACT)
    XbT = tl.load(bx_ptr + bx_base + offs_l[None, :] * s_bx_l + offs_p[:, None],
                  mask=in_l[None, :] & mask_p[:, None], other=0.0)
    return XdT, XbT


@triton.jit
def _verify_tile_out(Y, offs_p, mask_p, in_p, XbT, XdT, W, Wd, decay, mask_l, Dh, n, mask_t,
                     z_ptr, y_ptr, bx_ptr, rd_sc_ptr, b, slot, h, bx_base,
                     s_z_b, s_z_t, s_z_h, s_y_b, s_y_t, s_y_h, s_bx_l, s_sc_s, s_sc_h, L,
                     T: tl.constexpr, BLOCK_T: tl.constexpr, HAS_Z: tl.constexpr, RD_SCALE: tl.constexpr,
                     X_PREC: tl.constexpr, EXACT: tl.constexpr):
    """One row tile's outputs (rows offs_p [R]) from its checkpoint term Y = S C^T [R, BT], its
    buffered inputs XbT [R, BL] (rows >= n not yet masked) and drafts XdT [R, BT]; stores y and
    appends the drafts' x at buffer rows n..n+T-1 (see _verify_kernel)."""
    offs_t = tl.arange(0, BLOCK_T)
    if RD_SCALE:
        Y = Y * tl.load(rd_sc_ptr + slot * s_sc_s + h * s_sc_h + offs_p, mask=mask_p, other=1.0)[:, None]
    XbT = tl.where(mask_l[None, :], XbT, 0.0)   # rows >= n may be stale: never multiplied
    Y = Y * decay[None, :]
    Y = _mma_acc(XbT, W, Y, X_PREC, EXACT)
    Y = _mma_acc(XdT, Wd, Y, X_PREC, EXACT)
    Y += Dh * XdT.to(tl.float32)
    mask_pt = mask_p[:, None] & mask_t[None, :]
    if HAS_Z:
        Y = Y * silu(tl.load(z_ptr + b * s_z_b + offs_t[None, :] * s_z_t + h * s_z_h + offs_p[:, None],
                              mask=mask_pt, other=0.0).to(tl.float32))
    tl.store(y_ptr + b * s_y_b + offs_t[None, :] * s_y_t + h * s_y_h + offs_p[:, None],
             cast(Y, y_ptr.dtype.element_ty, EXACT), mask=in_p[:, None] & (offs_t < T)[None, :])
    pos = n + offs_t
    wr = mask_t & (pos < L)
    tl.store(bx_ptr + bx_base + pos[None, :] * s_bx_l + offs_p[:, None], XdT, mask=wr[None, :] & mask_p[:, None])


@triton.jit
def _verify_gram_kernel(B_ptr, C_ptr, bB_ptr, gram_ptr, idx_ptr, L, N: tl.constexpr,
                        s_B_b, s_B_t, s_B_g, s_C_b, s_C_t, s_C_g, s_bB_s, s_bB_l, s_bB_g,
                        T: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_N: tl.constexpr,
                        HAS_IDX: tl.constexpr, BC_PREC: tl.constexpr, EXACT: tl.constexpr,
                        GDC: tl.constexpr = False):
    """The verify's Gram matrices of batch row b and group g, once per group instead of once per
    program of its heads (_verify_kernel's PRE_GRAM): gram[b, g] [BLOCK_L + BLOCK_T, BLOCK_T]
    float32, rows 0..BLOCK_L-1 the buffer's B_i . C_t (rows i < L, the cursor not known here:
    the verify masks rows >= n), rows BLOCK_L.. the drafts' B_j . C_t, products exactly as the
    verify forms them (the drafts' B rounded as the buffer stores them; BC_PREC). Grid (G, b).
    GDC: the verify behind it is its programmatic dependent, let go at once (it reads gram only
    after waiting; this launch is an ordinary one, so all before it has finished)."""
    gdc_release(GDC)
    g = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    slot, live = _slot_of(idx_ptr, b, HAS_IDX)
    offs_t = tl.arange(0, BLOCK_T)
    offs_l = tl.arange(0, BLOCK_L)
    mask_t = offs_t < T
    in_l = offs_l < L
    bB_base = slot * s_bB_s + g * s_bB_g
    CB = tl.zeros([BLOCK_L, BLOCK_T], tl.float32)
    CdB = tl.zeros([BLOCK_T, BLOCK_T], tl.float32)
    for c0 in tl.range(0, N, BLOCK_N):
        offs_n = c0 + tl.arange(0, BLOCK_N)
        in_n = offs_n < N
        CdT = tl.trans(tl.load(C_ptr + b * s_C_b + offs_t[:, None] * s_C_t + g * s_C_g + offs_n[None, :],
                               mask=mask_t[:, None] & in_n[None, :], other=0.0))
        Bb = tl.load(bB_ptr + bB_base + offs_l[:, None] * s_bB_l + offs_n[None, :],
                     mask=in_l[:, None] & in_n[None, :], other=0.0)
        Bd = cast(tl.load(B_ptr + b * s_B_b + offs_t[:, None] * s_B_t + g * s_B_g + offs_n[None, :],
                          mask=mask_t[:, None] & in_n[None, :], other=0.0).to(tl.float32),
                  bB_ptr.dtype.element_ty, EXACT)
        CB = _mma_acc(Bb, CdT, CB, BC_PREC, EXACT)
        CdB = _mma_acc(Bd, CdT, CdB, BC_PREC, EXACT)
    base = gram_ptr + (b * tl.num_programs(0) + g) * ((BLOCK_L + BLOCK_T) * BLOCK_T)
    tl.store(base + offs_l[:, None] * BLOCK_T + offs_t[None, :], CB)
    tl.store(base + (BLOCK_L + offs_t)[:, None] * BLOCK_T + offs_t[None, :], CdB)


@triton.jit
def _verify_kernel(
    x_ptr, dt_ptr, A_ptr, B_ptr, C_ptr, D_ptr, dtb_ptr, z_ptr, y_ptr, idx_ptr,
    cur_ptr, bx_ptr, bB_ptr, bdt_ptr, rd_ptr, rd_sc_ptr, rd_desc, rd_desc_q, gram_ptr,
    P, N: tl.constexpr, L, HPG,
    s_x_b, s_x_t, s_x_h, s_dt_b, s_dt_t, s_B_b, s_B_t, s_B_g, s_C_b, s_C_t, s_C_g,
    s_z_b, s_z_t, s_z_h, s_y_b, s_y_t, s_y_h,
    s_bx_s, s_bx_l, s_bx_h, s_bB_s, s_bB_l, s_bB_g, s_bdt_s, s_bdt_l,
    s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
    T: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_P: tl.constexpr, TAIL_P: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_L: tl.constexpr, HAS_Z: tl.constexpr, HAS_IDX: tl.constexpr,
    RD_SCALE: tl.constexpr, S_PREC: tl.constexpr, BC_PREC: tl.constexpr, X_PREC: tl.constexpr,
    EARLY_BUF: tl.constexpr, EXACT: tl.constexpr, TMA: tl.constexpr = False, GDC: tl.constexpr = False,
    PRE_GRAM: tl.constexpr = False, GDC_WAIT: tl.constexpr = False,
):
    """Outputs of T drafts for rows [pid_p*R, +R) of head h of batch row b (R = BLOCK_P +
    TAIL_P), from the read checkpoint tile (read once for all T), buffer rows 0..n-1 and the
    drafts themselves (causally masked); writes the drafts at buffer rows n..n+T-1. No state
    is written and the cursor does not move.

    Matrix form, targets t as columns (every dim padded to >= 16 for tl.dot):
        Y [P, T] = (S [P, N] @ C^T [N, T]) * exp(c_buf + cd_t)[None, :]
                 + Xb^T [P, L] @ W [L, T]       W[i, t]  = dt_i exp(suf_i + cd_t) (B_i . C_t)
                 + Xd^T [P, T] @ Wd [T, T]      Wd[j, t] = [j <= t] dt_j exp(cd_t - cd_j) (B_j . C_t)
    with suf_i = sum_{i<j<n} dt_j A, c_buf = sum_{i<n} dt_i A and cd the drafts' inclusive
    cumulative log-decay. S C^T and the B . C Gram matrices (BC_PREC) accumulate over N in
    chunks of BLOCK_N columns whose loads feed the MMAs (the state tile is never whole in
    registers). The rows are one BLOCK_P tile and, with TAIL_P > 0, a second TAIL_P tile right
    after it (both powers of 2): a head whose row count is no power of 2 (Nano's 80 = 64 +
    16) runs in one program with no masked rows, its per-head work (the Gram matrices, W, Wd)
    done once. S_PREC: exact "bf16" for bf16 / fp8 read copies (fp8 row scales applied to Y's
    rows after), "bf16x2" / "bf16x3" / "tf32x3" for fp32 ones (_verify_state_precision);
    X_PREC "split3b": the fp32 weights split into three bf16 parts against the bf16 buffered x
    (exact products). Load order: the state chunks first (their address needs only the slot),
    then the drafts; with EARLY_BUF the buffer tiles are loaded for all BLOCK_L rows before
    the cursor arrives and rows >= n are selected away after (never multiplied: stale rows may
    hold anything; one dependent round trip less, up to K - n rows more read). TMA: the state
    chunks through TMA descriptors over the read copy as [rows, N] (rd_desc: [BLOCK_P, BLOCK_N]
    blocks, rd_desc_q: the tail's [TAIL_P, BLOCK_N]): one copy per chunk; rows past the head or
    of a null slot are read from wherever they point (their outputs are never stored). GDC:
    lets a programmatic dependent launch behind it (the commit's list launch) start early.
    PRE_GRAM: the Gram matrices come from gram_ptr (_verify_gram_kernel, launched just before;
    GDC_WAIT: as its programmatic dependent, waiting for it only before reading them) instead of
    from the program's own B tiles and MMAs.
    """
    gdc_release(GDC)
    pid_p = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    g = h // HPG
    slot, live = _slot_of(idx_ptr, b, HAS_IDX)
    offs_p = pid_p * (BLOCK_P + TAIL_P) + tl.arange(0, BLOCK_P)
    in_p = offs_p < P
    mask_p = in_p & live
    TP: tl.constexpr = TAIL_P if TAIL_P > 0 else 16    # the tail's shape (unused without a tail)
    offs_q = pid_p * (BLOCK_P + TAIL_P) + BLOCK_P + tl.arange(0, TP)
    in_q = offs_q < P
    mask_q = in_q & live
    ck_base = slot * s_ck_s + h * s_ck_h
    row0 = ((slot * tl.num_programs(1) + h) * P + pid_p * (BLOCK_P + TAIL_P)).to(tl.int32)   # TMA: first row
    offs_t = tl.arange(0, BLOCK_T)
    mask_t = (offs_t < T) & live
    offs_l = tl.arange(0, BLOCK_L)
    bx_base = slot * s_bx_s + h * s_bx_h
    bB_base = slot * s_bB_s + g * s_bB_g
    if EARLY_BUF:
        in_l = (offs_l < L) & live
    else:
        n = tl.load(cur_ptr + slot, mask=live, other=0)
        in_l = (offs_l < n) & live

    # Dots over N in chunks of BLOCK_N columns (loads feed the MMAs directly; the state tile is
    # never in registers whole): the checkpoint term S C^T [BP, T] (and the tail's) and the Gram
    # matrices B_i . C_t of the buffer [L, T] and of the drafts [T, T].
    Y = tl.zeros([BLOCK_P, BLOCK_T], tl.float32)
    Yq = tl.zeros([TP, BLOCK_T], tl.float32)
    CB = tl.zeros([BLOCK_L, BLOCK_T], tl.float32)
    CdB = tl.zeros([BLOCK_T, BLOCK_T], tl.float32)
    for c0 in tl.range(0, N, BLOCK_N):
        offs_n = c0 + tl.arange(0, BLOCK_N)
        in_n = offs_n < N
        if TMA:
            S = rd_desc.load([row0, c0])
            if TAIL_P > 0:
                Sq = rd_desc_q.load([row0 + BLOCK_P, c0])
        else:
            S = tl.load(rd_ptr + ck_base + offs_p[:, None] * s_ck_p + offs_n[None, :],
                        mask=mask_p[:, None] & in_n[None, :], other=0.0)
            if TAIL_P > 0:
                Sq = tl.load(rd_ptr + ck_base + offs_q[:, None] * s_ck_p + offs_n[None, :],
                             mask=mask_q[:, None] & in_n[None, :], other=0.0)
        CdT = tl.trans(tl.load(C_ptr + b * s_C_b + offs_t[:, None] * s_C_t + g * s_C_g + offs_n[None, :],
                               mask=mask_t[:, None] & in_n[None, :], other=0.0))                    # [BN, BT]
        if not PRE_GRAM:
            Bb = tl.load(bB_ptr + bB_base + offs_l[:, None] * s_bB_l + offs_n[None, :],
                         mask=in_l[:, None] & in_n[None, :], other=0.0)
            Bd = cast(tl.load(B_ptr + b * s_B_b + offs_t[:, None] * s_B_t + g * s_B_g + offs_n[None, :],
                              mask=mask_t[:, None] & in_n[None, :], other=0.0).to(tl.float32),
                      bB_ptr.dtype.element_ty, EXACT)
        Y = _mma_acc(S, CdT, Y, S_PREC, EXACT)
        if TAIL_P > 0:
            Yq = _mma_acc(Sq, CdT, Yq, S_PREC, EXACT)
        if not PRE_GRAM:
            CB = _mma_acc(Bb, CdT, CB, BC_PREC, EXACT)
            CdB = _mma_acc(Bd, CdT, CdB, BC_PREC, EXACT)

    # drafts' other inputs, then the buffer's dt and x
    A = tl.load(A_ptr + h).to(tl.float32)
    Dh = tl.load(D_ptr + h).to(tl.float32)
    bias = tl.load(dtb_ptr + h).to(tl.float32)
    dd = softplus(tl.load(dt_ptr + b * s_dt_b + offs_t * s_dt_t + h, mask=mask_t, other=0.0).to(tl.float32) + bias)
    dd = tl.where(mask_t, dd.to(bdt_ptr.dtype.element_ty).to(tl.float32), 0.0)
    XdT, XbT = _verify_tile_x(x_ptr, bx_ptr, b, h, bx_base, offs_p, mask_p, offs_t, mask_t, offs_l, in_l,
                              s_x_b, s_x_t, s_x_h, s_bx_l, EXACT)                                 # [BP, BT], [BP, BL]
    dt_i = tl.load(bdt_ptr + slot * s_bdt_s + offs_l * s_bdt_l + h, mask=in_l, other=0.0).to(tl.float32)
    if TAIL_P > 0:
        XdTq, XbTq = _verify_tile_x(x_ptr, bx_ptr, b, h, bx_base, offs_q, mask_q, offs_t, mask_t, offs_l, in_l,
                                    s_x_b, s_x_t, s_x_h, s_bx_l, EXACT)
    if PRE_GRAM:    # computed for rows i < L and every batch row: masked like the tiles above
        gdc_wait_prior(GDC_WAIT)
        gbase = gram_ptr + (b * (tl.num_programs(1) // HPG) + g) * ((BLOCK_L + BLOCK_T) * BLOCK_T)
        CB = tl.load(gbase + offs_l[:, None] * BLOCK_T + offs_t[None, :])
        CdB = tl.load(gbase + (BLOCK_L + offs_t)[:, None] * BLOCK_T + offs_t[None, :])
        CdB = tl.where(mask_t[:, None] & mask_t[None, :], CdB, 0.0)
    if EARLY_BUF:   # rows >= n are stale: selected away (never multiplied: they may hold anything)
        n = tl.load(cur_ptr + slot, mask=live, other=0)
        mask_l = (offs_l < n) & live
        dt_i = tl.where(mask_l, dt_i, 0.0)
        CB = tl.where(mask_l[:, None], CB, 0.0)
    else:
        mask_l = in_l
        if PRE_GRAM:
            CB = tl.where(mask_l[:, None], CB, 0.0)

    # decay weights: columns are targets t
    la = dt_i * A
    suf = tl.cumsum(la, 0, reverse=True) - la                 # sum_{i<j<n} la_j
    c_buf = tl.sum(la, 0)
    cd = tl.cumsum(dd * A, 0)                                  # inclusive over drafts
    W = tl.where(mask_l[:, None], dt_i[:, None] * tl.exp(suf[:, None] + cd[None, :]), 0.0) * CB     # [BL, BT]
    causal = (offs_t[:, None] <= offs_t[None, :]) & mask_t[:, None]
    Wd = dd[:, None] * tl.exp(tl.where(causal, cd[None, :] - cd[:, None], -float("inf"))) * CdB     # [BT(j), BT(t)]
    decay = tl.exp(c_buf + cd)
    _verify_tile_out(Y, offs_p, mask_p, in_p, XbT, XdT, W, Wd, decay, mask_l, Dh, n, mask_t,
                     z_ptr, y_ptr, bx_ptr, rd_sc_ptr, b, slot, h, bx_base,
                     s_z_b, s_z_t, s_z_h, s_y_b, s_y_t, s_y_h, s_bx_l, s_sc_s, s_sc_h, L,
                     T, BLOCK_T, HAS_Z, RD_SCALE, X_PREC, EXACT)
    if TAIL_P > 0:
        _verify_tile_out(Yq, offs_q, mask_q, in_q, XbTq, XdTq, W, Wd, decay, mask_l, Dh, n, mask_t,
                         z_ptr, y_ptr, bx_ptr, rd_sc_ptr, b, slot, h, bx_base,
                         s_z_b, s_z_t, s_z_h, s_y_b, s_y_t, s_y_h, s_bx_l, s_sc_s, s_sc_h, L,
                         T, BLOCK_T, HAS_Z, RD_SCALE, X_PREC, EXACT)

    # append the drafts' dt (once per head) and B rows (once per group) at rows n..n+T-1
    pos = n + offs_t
    wr = mask_t & (pos < L) & (pid_p == 0)
    tl.store(bdt_ptr + slot * s_bdt_s + pos * s_bdt_l + h, dd, mask=wr)
    if h % HPG == 0:   # the group's B rows (re-read: L2 hits)
        for c0 in tl.range(0, N, BLOCK_N):
            offs_n = c0 + tl.arange(0, BLOCK_N)
            m2 = wr[:, None] & (offs_n < N)[None, :]
            Bd = tl.load(B_ptr + b * s_B_b + offs_t[:, None] * s_B_t + g * s_B_g + offs_n[None, :], mask=m2, other=0.0)
            tl.store(bB_ptr + bB_base + pos[:, None] * s_bB_l + offs_n[None, :],
                     cast(Bd.to(tl.float32), bB_ptr.dtype.element_ty, EXACT), mask=m2)


# ----------------------------------------------------------------------------- low-copy refresh
@triton.jit
def _refresh_lo_kernel(idx_ptr, cur_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr, P, N,
                       s_ck_s, s_ck_h, s_ck_p, s_sc_s, s_sc_h,
                       BLOCK_P: tl.constexpr, BLOCK_N: tl.constexpr, HAS_IDX: tl.constexpr,
                       HI_SCALE: tl.constexpr, LO_SCALE: tl.constexpr, EXACT: tl.constexpr):
    """Before a verify of a dual state that has taken the eager route: where the cursor word
    says the low copy is stale (LO_STALE), copy BLOCK_P rows of head h of the high checkpoint
    into it (quantising). Grid (cdiv(P, BLOCK_P), H, batch). The bit is cleared by the launch
    after (common.clear_lo_stale_kernel; no program here may, as another may not have read it
    yet), so the verify reads plain counts."""
    h = tl.program_id(1)
    slot, live = _slot_of(idx_ptr, tl.program_id(2).to(tl.int64), HAS_IDX)
    stale = live & ((tl.load(cur_ptr + slot, mask=live, other=0) & _LO_STALE) != 0)
    if stale:
        offs_p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
        offs_n = tl.arange(0, BLOCK_N)
        mask_p = offs_p < P
        mask = mask_p[:, None] & (offs_n < N)[None, :]
        ck_base = slot * s_ck_s + h * s_ck_h
        sc_base = slot * s_sc_s + h * s_sc_h
        S = _load_state(hi_ptr, hi_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, HI_SCALE, "")
        _store_state(lo_ptr, lo_sc_ptr, ck_base, sc_base, offs_p, offs_n, s_ck_p, mask, mask_p, S, LO_SCALE, EXACT, "")


# ----------------------------------------------------------------------------- cursor pass
@triton.jit
def _cursor_kernel(cur_ptr, idx_ptr, acc_ptr, rows, K,
                   MODE: tl.constexpr, HAS_IDX: tl.constexpr, BLOCK: tl.constexpr, STALE: tl.constexpr = True):
    """New cursors after a launch of the kernels above (which only read them).
    MODE 0 (step):   n + 1 >= K or stale ? 0 : n + 1   (stale: LO_STALE, the step flushed)
    MODE 1 (commit): n + accepted >= K ? 0 : n + accepted
    MODE 2 (flush):  0
    STALE: the state is dual (its words may carry LO_STALE). Counts are masked out of the
    words (the deferred route's epoch)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < rows
    if HAS_IDX:
        slot = tl.load(idx_ptr + offs, mask=m, other=-1).to(tl.int64)
    else:
        slot = offs.to(tl.int64)
    live = m & (slot >= 0)
    slot = tl.maximum(slot, 0)
    word = tl.load(cur_ptr + slot, mask=live, other=0)
    n = word & _CUR_MASK
    if MODE == 0:
        n = n + 1
        if STALE:
            new = tl.where((n >= K) | ((word & _LO_STALE) != 0), 0, n)
        else:
            new = tl.where(n >= K, 0, n)
    elif MODE == 1:
        n = n + tl.load(acc_ptr + offs, mask=live, other=0).to(tl.int32)
        new = tl.where(n >= K, 0, n)
    else:
        new = tl.zeros_like(n)
    tl.store(cur_ptr + slot, new, mask=live)


# ----------------------------------------------------------------------------- launchers
def _ckpt_args(ck, like):
    """(data, scale, has_scale) of a checkpoint; `like` stands in for a missing pointer."""
    if ck is None:
        return like, like, False
    if ck.scale is None:
        return ck.data, ck.data, False
    return ck.data, ck.scale, True


def _check_ckpts(*cks):
    ref = cks[0].data
    for ck in cks:
        if ck is None:
            continue
        if not ck.data.is_contiguous() or ck.data.shape != ref.shape:
            raise ValueError("checkpoints must be contiguous [S, H, P, N] tensors of one shape")
        if ck.scale is not None and not ck.scale.is_contiguous():
            raise ValueError("fp8 scales must be contiguous [S, H, P]")


def _buffer_strides(rs):
    for t in (rs.x, rs.B):
        if t.stride(-1) != 1:
            raise ValueError("buffer tensors need a unit stride in their last dim")
    return (rs.x.stride(0), rs.x.stride(1), rs.x.stride(2), rs.B.stride(0), rs.B.stride(1), rs.B.stride(2),
            rs.dt.stride(0), rs.dt.stride(1))


def _ckpt_strides(rs):
    d = rs.hi.data
    # scale strides: any fp8 copy has the contiguous [S, H, P] layout
    return (d.stride(0), d.stride(1), d.stride(2), d.shape[1] * d.shape[2], d.shape[2])


def _state_bytes(ck):
    return ck.data.element_size()


def _record(kernel, grid):
    return lambda *args, **meta: Launch(kernel, grid, args, meta)


def _run(launches) -> None:
    for launch in launches:
        launch()


def plan_eager_step(state, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, out=None):
    """([launches], y) of the eager step; see eager_step."""
    if state.stride(-1) != 1:
        raise ValueError("state needs a unit stride in its last dim")
    x, dt, B, C, z, A, D, dt_bias = (last_contig(t) for t in (x, dt, B, C, z, A, D, dt_bias))
    bsz, H, P = x.shape
    N, G = B.shape[-1], B.shape[1]
    y = out_like(out, x)
    if bsz == 0:
        return [], y
    block_p, chunks, warps = launch_config("eager", P, state.element_size(), bsz, H)
    grid = (triton.cdiv(P, block_p * chunks), H, bsz)
    zz = z if z is not None else x
    idx = state_indices if state_indices is not None else x
    launch = _record(_eager_kernel, grid)(
        state, x, dt, A, B, C, D, dt_bias, zz, y, idx,
        P, N, H // G,
        state.stride(0), state.stride(1), state.stride(2),
        x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        zz.stride(0), zz.stride(1), y.stride(0), y.stride(1),
        BLOCK_P=block_p, ROW_CHUNKS=chunks, BLOCK_N=_np2(N),
        HAS_Z=z is not None, HAS_IDX=state_indices is not None, EXACT=_interpreting(),
        EVICT=OVERRIDE.get("eager", {}).get("evict", ""), num_warps=warps)
    return [launch], y


def eager_step(state, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, out=None):
    """Launch the eager step. state [S, H, P, N] (fp32/bf16/fp16, updated in place),
    x [b, H, P], dt [b, H], A/D/dt_bias [H], B/C [b, G, N], z [b, H, P] or None,
    state_indices [b] int (negative = padding) or None (row b -> slot b). Returns y [b, H, P]
    (written into `out` when given: every element, padded rows as 0)."""
    launches, y = plan_eager_step(state, x, dt, A, B, C, D, dt_bias, z, state_indices, out)
    _run(launches)
    return y


def _block_l(L, block_p, block_n):
    """Buffer tile height: >= 16 where the fold can use tl.dot (all dims >= 16)."""
    bl = _np2(L)
    if block_p >= 16 and block_n >= 16:
        bl = max(bl, 16)
    return bl, (block_p >= 16 and block_n >= 16 and bl >= 16)


def plan_cursor(rs, state_indices, rows: int, mode: int, accepted=None):
    """[launch] of the cursor pass (see _cursor_kernel). rows: batch rows (or slots)."""
    if rows == 0:
        return []
    idx = state_indices if state_indices is not None else rs.cursor
    acc = accepted if accepted is not None else rs.cursor
    return [_record(_cursor_kernel, (triton.cdiv(rows, CURSOR_BLOCK),))(
        rs.cursor, idx, acc, rows, rs.flush_period,
        MODE=mode, HAS_IDX=state_indices is not None, BLOCK=CURSOR_BLOCK, STALE=rs.lo is not None, num_warps=4)]


def advance_cursor(rs, state_indices, rows: int, mode: int, accepted=None):
    """Run the cursor pass: mode 0 step, 1 commit (with accepted), 2 flush."""
    _run(plan_cursor(rs, state_indices, rows, mode, accepted))


def plan_replay_step(rs, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, advance=True, out=None):
    """([launches], y) of one ReplaySSM step. Fused route: the step kernel (advancing the
    cursor by ticket when `advance`); split route: the output-only step kernel + the flush
    kernel. With the ticket off (knob "ticket", REPLAY_CONFIGS) the cursor pass follows when
    `advance`."""
    x, dt, B, C, z, A, D, dt_bias = (last_contig(t) for t in (x, dt, B, C, z, A, D, dt_bias))
    bsz, H, P = x.shape
    N, G = B.shape[-1], B.shape[1]
    L = rs.capacity
    y = out_like(out, x)
    if bsz == 0:
        return [], y
    _check_ckpts(rs.hi, rs.lo)
    rd = rs.read_ckpt
    v = replay_variant(P, _state_bytes(rd), bsz, H, rs.mode == "dual", _state_bytes(rs.hi))
    if v["route"] == "eager" and advance:
        return [_plan_replay_eager(rs, x, dt, A, B, C, D, dt_bias, z, state_indices, y, v)], y
    block_p, warps, fused = v["block_p"], v["warps"], v["route"] == "fused"
    if _fold_precision(rs) != "bf16x3" and "warps" not in OVERRIDE.get("replay", {}):
        warps = max(warps, 2)   # fp32 buffers: the tf32x3 fold's operands spill at 1 warp (untuned path)
    ticket = advance and v["ticket"]
    block_n = _np2(N)
    # fold column chunk: whole rows unless fold_cols is set and no copy carries row scales
    fold_cols = block_n
    if v["fold_cols"] and not any(ck is not None and ck.scale is not None for ck in (rs.hi, rs.lo)):
        fold_cols = min(v["fold_cols"], block_n)
    block_l, use_dot = _block_l(min(rs.flush_period, L), v["fold_rows"], fold_cols)   # a step sees n <= K - 1
    grid = (triton.cdiv(P, block_p), H, bsz)
    nprog = grid[0] * H
    if ticket and (nprog >= 1 << 15 or L > CURSOR_MASK):
        raise ValueError(f"ticket cursor needs < 32768 programs per sequence ({nprog}) and L < 32768 ({L})")
    if ticket and not fused and rs.mode == "dual":
        raise ValueError("replay route 'split' with the ticket cannot serve a dual state (its flush launch could "
                         "not tell a stale low copy's flush from a full buffer's); allowed: route 'fused', or ticket "
                         "False")
    rd_d, rd_s, rd_has = _ckpt_args(rd, rs.hi.data)
    rd_lpr, rd_ls = cache_lines(rd_d, N)      # the read tile's rows, for the pf hint
    hi_d, hi_s, hi_has = _ckpt_args(rs.hi, rs.hi.data)
    lo_d, lo_s, lo_has = _ckpt_args(rs.lo, rs.hi.data)
    zz = z if z is not None else x
    idx = state_indices if state_indices is not None else x
    launches = []
    bc, pdl = x, {}     # (bc unread without the pre-pass)
    coef = v["coef"] and not ticket     # (the pre-pass reads the cursor: a ticket step moves it beside it)
    if v["bc"] or coef:     # B_i . C once per group (the step's PRE_BC; coef: every per-head term, PRE_COEF)
        numel = bsz * (H * 2 if coef else G) * block_l
        bc = state_scratch(rs, "_bc_scratch", numel, x.device).view(torch.float32)
        pdl = pdl_meta(x.device, v["pdl"])
        launches.append(_record(_buffer_bc_kernel, (G, bsz))(
            C, rs.B, bc, idx, A, dt, dt_bias, B, rs.cursor, rs.dt, N, min(rs.flush_period, L), H // G,
            C.stride(0), C.stride(1), rs.B.stride(0), rs.B.stride(1), rs.B.stride(2),
            dt.stride(0), B.stride(0), B.stride(1), rs.dt.stride(0), rs.dt.stride(1),
            BLOCK_N=block_n, BLOCK_L=block_l, HAS_IDX=state_indices is not None, GDC=pdl["GDC"], COEF=coef,
            EXACT=_interpreting(), BLOCK_H=_np2(H // G), num_warps=1))
    common = dict(BLOCK_P=block_p, BLOCK_N=block_n, BLOCK_L=block_l, HAS_Z=z is not None,
                  HAS_IDX=state_indices is not None, HI_SCALE=hi_has, HAS_LO=rs.lo is not None, LO_SCALE=lo_has,
                  USE_DOT=use_dot, DOT_PREC=_fold_precision(rs), EXACT=_interpreting(), EVICT=v["evict"],
                  FOLD_ROWS=v["fold_rows"], num_warps=warps)
    if v["maxnreg"]:
        common["maxnreg"] = v["maxnreg"]
    launches.append(_record(_replay_step_kernel, grid)(
        x, dt, A, B, C, D, dt_bias, zz, y, idx,
        rs.cursor, rs.x, rs.B, rs.dt, bc,
        rd_d, rd_s, hi_d, hi_s, lo_d, lo_s,
        rs.flush_period, P, N, H // G, nprog,
        x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        zz.stride(0), zz.stride(1), y.stride(0), y.stride(1),
        *_buffer_strides(rs), *_ckpt_strides(rs),
        RD_SCALE=rd_has, FUSED=fused, TICKET=ticket, EARLY=v["early"], PRELOAD=v["preload"], FOLD_COLS=fold_cols,
        PF=v["pf"], RD_LPR=rd_lpr, RD_LS=rd_ls, PRE_BC=v["bc"] or coef, PRE_COEF=coef, FOLD_WAIT=v["fold_wait"],
        **pdl, **common))
    if not fused:
        launches.append(_record(_replay_flush_kernel, grid)(
            x, A, C, D, zz, y, idx, rs.cursor, rs.x, rs.B, rs.dt,
            hi_d, hi_s, lo_d, lo_s,
            rs.flush_period, P, N, H // G,
            x.stride(0), x.stride(1), C.stride(0), C.stride(1), zz.stride(0), zz.stride(1), y.stride(0), y.stride(1),
            *_buffer_strides(rs), *_ckpt_strides(rs),
            ADVANCED=ticket, **common))
    if advance and not ticket:
        launches += plan_cursor(rs, state_indices, bsz, 0)
    return launches, y


def takes_eager_route(P: int, read_bytes: int, batch: int, nheads: int, dual: bool = False,
                      hi_bytes: int = 4) -> bool:
    """True when a replay step of this shape (advancing its cursor) runs the eager route, i.e.
    flushes at every step: for traffic models, a step with flush period 1 (a dual state's
    writes the high copy alone). read_bytes: bytes per element of the copy the output path
    reads (the low copy in dual mode); hi_bytes: the high copy's (dual)."""
    return replay_variant(P, read_bytes, batch, nheads, dual, hi_bytes)["route"] == "eager"


def state_takes_eager_route(rs, x) -> bool:
    """takes_eager_route for an advancing step of `rs` with inputs x [b, H, P]."""
    return takes_eager_route(x.shape[2], _state_bytes(rs.read_ckpt), x.shape[0], x.shape[1], rs.mode == "dual",
                             _state_bytes(rs.hi))


def route_period(P: int, read_bytes: int, batch: int, nheads: int, flush_period: int, dual: bool = False,
                 hi_bytes: int = 4) -> int:
    """The small-batch route's period k at this shape (0: the step buffers, not routed): the
    route row's route_k (1: a flush at every step), at most the flush period. For traffic
    models and byte counts (reference.mamba2_replay_step's `route`)."""
    v = replay_variant(P, read_bytes, batch, nheads, dual, hi_bytes)
    return min(v["route_k"], flush_period) if v["route"] == "eager" else 0


def state_route_period(rs, x) -> int:
    """route_period for an advancing step of `rs` with inputs x [b, H, P]."""
    return route_period(x.shape[2], _state_bytes(rs.read_ckpt), x.shape[0], x.shape[1], rs.flush_period,
                        rs.mode == "dual", _state_bytes(rs.hi))


def _plan_replay_eager(rs, x, dt, A, B, C, D, dt_bias, z, state_indices, y, v: dict):
    """Launch of the small-batch route, grid (cdiv(P, block_p), H, b): route_k 1,
    _replay_eager_kernel (a flush at every step); k >= 2 (at most the flush period),
    _replay_defer_kernel (the state written every k-th step)."""
    bsz, H, P = x.shape
    N, G = B.shape[-1], B.shape[1]
    grid = (triton.cdiv(P, v["block_p"]), H, bsz)
    nprog = grid[0] * H
    if nprog >= 1 << 15:
        raise ValueError(f"the eager route's ticket needs < 32768 programs per sequence ({nprog})")
    hi_d, hi_s, hi_has = _ckpt_args(rs.hi, rs.hi.data)
    zz = z if z is not None else x
    idx = state_indices if state_indices is not None else x
    rs.routed = rs.routed or rs.lo is not None     # its low copies may go stale: verify refreshes them first
    rk = min(v["route_k"], rs.flush_period)
    rs.deferred = rs.deferred or rk > 1     # its cursor words carry epochs: verify clears them first
    strides = (x.stride(0), x.stride(1), dt.stride(0), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
               zz.stride(0), zz.stride(1), y.stride(0), y.stride(1), *_buffer_strides(rs), *_ckpt_strides(rs))
    meta = dict(BLOCK_P=v["block_p"], BLOCK_N=_np2(N), CAP=rs.capacity, HAS_Z=z is not None,
                HAS_IDX=state_indices is not None, HI_SCALE=hi_has, HAS_LO=rs.lo is not None,
                EXACT=_interpreting(), EVICT=v["evict"], num_warps=v["warps"])
    if v["maxnreg"]:
        meta["maxnreg"] = v["maxnreg"]
    if rk > 1:
        return _record(_replay_defer_kernel, grid)(
            x, dt, A, B, C, D, dt_bias, zz, y, idx, rs.cursor, rs.route_epoch, rs.x, rs.B, rs.dt, hi_d, hi_s,
            P, N, H // G, nprog, *strides, RK=rk, EP_ROWS=EPOCH_ROWS, **meta)
    return _record(_replay_eager_kernel, grid)(
        x, dt, A, B, C, D, dt_bias, zz, y, idx, rs.cursor, rs.x, rs.B, rs.dt, hi_d, hi_s,
        P, N, H // G, nprog, *strides, **meta)


def replay_step(rs, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, advance=True, out=None):
    """Launch one ReplaySSM step (advancing the cursor when `advance`). Shapes as eager_step;
    rs: replayssm.state.Mamba2ReplayState. Returns y [b, H, P]."""
    launches, y = plan_replay_step(rs, x, dt, A, B, C, D, dt_bias, z, state_indices, advance, out)
    _run(launches)
    return y


def plan_fold(rs, A, idx, thresh: int, accepted=None, listed=None):
    """[launch] of the fold over rows idx [r] (slots; negative = skip): entries 0..n-1 with
    n = cursor (+ accepted[r]) are folded into the checkpoint where n >= thresh.
    The cursor is not touched (the caller runs the cursor pass). listed = (lst, workers): the
    rows _commit_list_kernel listed in lst, folded by that many workers per head tile instead."""
    rows = idx.shape[0]
    if rows == 0:
        return []
    A = last_contig(A)
    _check_ckpts(rs.hi, rs.lo)
    H, P, N = rs.hi.data.shape[1:]
    G = rs.B.shape[2]
    L = rs.capacity
    block_p, chunks, warps = launch_config("fold", P, _state_bytes(rs.hi), rows, H)
    block_n = _np2(N)
    block_l, use_dot = _block_l(L, block_p, block_n)
    hi_d, hi_s, hi_has = _ckpt_args(rs.hi, rs.hi.data)
    lo_d, lo_s, lo_has = _ckpt_args(rs.lo, rs.hi.data)
    acc = accepted if accepted is not None else idx
    grid = (triton.cdiv(P, block_p * chunks), H, rows)
    extra = {}
    if listed is not None:
        acc, nw = listed
        grid = grid[:2] + (nw,)
        extra = dict(LIST=True, ROWS=rows, NW=nw, NT=triton.cdiv(rows, nw))
    return [_record(_fold_kernel, grid)(
        idx, acc, rs.cursor, rs.x, rs.B, rs.dt, A,
        hi_d, hi_s, lo_d, lo_s,
        thresh, P, N, L, H // G,
        *_buffer_strides(rs), *_ckpt_strides(rs),
        BLOCK_P=block_p, ROW_CHUNKS=chunks, BLOCK_N=block_n, BLOCK_L=block_l,
        HAS_ACC=accepted is not None, HI_SCALE=hi_has, HAS_LO=rs.lo is not None, LO_SCALE=lo_has,
        USE_DOT=use_dot, DOT_PREC=_fold_precision(rs), EXACT=_interpreting(), num_warps=warps, **extra)]


def plan_flush(rs, A, slots=None):
    """[launches] of flush: the fold (threshold 1) and the cursor pass (0)."""
    if slots is None:
        slots = torch.arange(rs.cursor.shape[0], device=rs.cursor.device, dtype=torch.int32)
    return plan_fold(rs, A, slots, 1) + plan_cursor(rs, slots, slots.shape[0], 2)


def flush(rs, A, slots=None):
    """Fold every committed entry of `slots` ([s] int; default all slots; negative = skip)
    into the checkpoint and reset their cursors. Sequences with cursor 0 are untouched."""
    _run(plan_flush(rs, A, slots))


def plan_commit(rs, A, accepted, state_indices=None):
    """[launches] of commit (n = cursor + accepted, folded where n >= K). COMMIT_LIST (up to
    COMMIT_LIST_MAX rows): _commit_list_kernel moves the cursors and lists the folding rows,
    then NW = cdiv(rows * T, K) workers per head tile fold them (T = capacity - K, the most a
    commit adds: a staggered batch's folds in one pass each), the fold a programmatic
    dependent launch of the list launch and that one of the verify (PDL); else the fold with
    one program per (row, head tile), then the cursor pass."""
    bsz = accepted.shape[0]
    idx = state_indices if state_indices is not None else torch.arange(
        bsz, device=accepted.device, dtype=torch.int32)
    if bsz == 0 or not OVERRIDE.get("fold", {}).get("list", COMMIT_LIST) or bsz > COMMIT_LIST_MAX:
        return plan_fold(rs, A, idx, rs.flush_period, accepted) + plan_cursor(rs, idx, bsz, 1, accepted)
    lst = state_scratch(rs, "_m2_commit_rows", bsz + 1, accepted.device)   # listed rows, then their count
    nw = max(1, min(bsz, triton.cdiv(bsz * max(1, rs.capacity - rs.flush_period), rs.flush_period)))
    bb = triton.next_power_of_2(bsz)
    pdl = pdl_meta(accepted.device, bool(OVERRIDE.get("fold", {}).get("pdl", PDL)))
    fold = plan_fold(rs, A, idx, rs.flush_period, accepted, listed=(lst, nw))
    fold[0].meta.update(pdl)
    return ([_record(_commit_list_kernel, (1,))(idx, accepted, rs.cursor, lst, bsz, rs.flush_period, BLOCK_B=bb,
                                                num_warps=4 if bb >= 256 else 1, **pdl)] + fold)


def commit(rs, A, accepted, state_indices=None):
    """Accept accepted[b] drafts per row (a cursor move) and fold where the cursor reaches K."""
    _run(plan_commit(rs, A, accepted, state_indices))


def _verify_state_precision(rd: torch.dtype, c: torch.dtype, y: torch.dtype) -> str:
    """Precision of the verify MMA state tile x C. An fp32 tile feeding bf16 / fp16 outputs
    takes a bf16 split (~2^-16 per product, 128x below the output's own rounding): "bf16x2"
    (two passes) when C is exact in bf16, else Triton's "bf16x3" (three; 10-17 % faster than
    "tf32x3" on the H200; against a bf16 C its third pass adds zeros). fp32 outputs keep
    VERIFY_F32_PRECISION. Only y depends on this product (the buffer keeps the inputs), so
    nothing of its error reaches a checkpoint."""
    p = mma_precision(rd, c, VERIFY_F32_PRECISION)
    if p == VERIFY_F32_PRECISION and y in (torch.bfloat16, torch.float16):
        return "bf16x2" if c in (torch.bfloat16, torch.float8_e4m3fn) else "bf16x3"
    return p


def plan_verify(rs, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, out=None):
    """([launches], y) of speculative verification; see verify: the verify launch, after a
    _verify_gram_kernel launch with the Gram pre-pass where VERIFY_PRE_GRAM's rule (or
    OVERRIDE["verify"] gram) says. Grid (cdiv(P, R), H, b): one [R, N] state tile per program,
    R = BLOCK_P from
    CONFIG_TABLE["verify"] (or OVERRIDE["verify"]: block_p, warps, whole, early_buf, s_prec,
    x_prec, chunk_n, maxnreg, tma, pdl, gram), every tile dim >= 16 (tl.dot). A row of ROW_CHUNKS 0 (the whole head in one program; "whole" in
    OVERRIDE) adds a tail tile of next_pow2(P - BLOCK_P) rows (>= 16) when BLOCK_P < P:
    R = BLOCK_P + tail."""
    x, dt, B, C, z, A, D, dt_bias = (last_contig(t) for t in (x, dt, B, C, z, A, D, dt_bias))
    bsz, T, H, P = x.shape
    N, G = B.shape[-1], B.shape[2]
    L = rs.capacity
    y = out_like(out, x)
    if bsz == 0 or T == 0:
        return [], y
    _check_ckpts(rs.hi, rs.lo)
    rd = rs.read_ckpt
    block_p, chunks, warps = launch_config("verify", P, _state_bytes(rd), bsz, H)
    ov = OVERRIDE.get("verify", {})
    block_p = max(16, min(ov.get("block_p", block_p), _np2(P)))
    tail = max(16, _np2(P - block_p)) if ov.get("whole", chunks > 1) and P > block_p else 0
    early_buf = ov.get("early_buf", VERIFY_EARLY_BUF)
    block_l = max(16, _np2(min(rs.flush_period, L)))   # committed entries only: n <= K - 1 before a verify
    block_n = max(16, min(ov.get("chunk_n", VERIFY_CHUNK_N), _np2(N)))   # state columns per MMA step
    rd_d, rd_s, rd_has = _ckpt_args(rd, rs.hi.data)
    # the read copy as [rows, N] through TMA (the main tile's and the tail's blocks): where
    # OVERRIDE says, else in VERIFY_TMA's cases
    asked = bool(ov["tma"]) if "tma" in ov else (
        None if (min(_state_bytes(rd), 4), _bucket(bsz, H)) in VERIFY_TMA else False)
    blocks = [(block_p, block_n)] + ([(tail, block_n)] if tail else [])    # no tail: rd_desc_q unread
    descs = tma_rows(rd_d, N, blocks, 'OVERRIDE["verify"]["tma"]', asked)
    tma = descs is not None
    descs = [descs[0], descs[-1]] if tma else [rd_d, rd_d]
    zz = z if z is not None else x
    idx = state_indices if state_indices is not None else x
    grid = (triton.cdiv(P, block_p + tail), H, bsz)
    block_t = max(16, _np2(T))
    bc_prec = mma_precision(rs.B.dtype, C.dtype, VERIFY_F32_PRECISION)
    pre_gram = ov.get("gram", VERIFY_PRE_GRAM)
    if pre_gram is None:
        pre_gram = _state_bytes(rd) == 4 and not tail and bsz * H >= VERIFY_PRE_GRAM_MIN_BH
    pre_gram = bool(pre_gram)
    pdl = pdl_meta(x.device, bool(ov.get("pdl", PDL)))
    launches, gram, wait = [], x, {}        # (gram unread without the pre-pass)
    if pre_gram:    # the Gram matrices once per group, ahead of the verify
        gram = state_scratch(rs, "_gram_scratch", bsz * G * (block_l + block_t) * block_t,
                             x.device).view(torch.float32)
        wait = {"GDC_WAIT": pdl["GDC"], **({"launch_pdl": True} if pdl["GDC"] else {})}
        launches.append(_record(_verify_gram_kernel, (G, bsz))(
            B, C, rs.B, gram, idx, L, N, B.stride(0), B.stride(1), B.stride(2), C.stride(0), C.stride(1),
            C.stride(2), rs.B.stride(0), rs.B.stride(1), rs.B.stride(2),
            T=T, BLOCK_T=block_t, BLOCK_L=block_l, BLOCK_N=block_n, HAS_IDX=state_indices is not None,
            BC_PREC=bc_prec, EXACT=_interpreting(), GDC=pdl["GDC"], num_warps=1))
    launches.append(_record(_verify_kernel, grid)(
        x, dt, A, B, C, D, dt_bias, zz, y, idx,
        rs.cursor, rs.x, rs.B, rs.dt, rd_d, rd_s, *descs, gram,
        P, N, L, H // G,
        x.stride(0), x.stride(1), x.stride(2), dt.stride(0), dt.stride(1),
        B.stride(0), B.stride(1), B.stride(2), C.stride(0), C.stride(1), C.stride(2),
        zz.stride(0), zz.stride(1), zz.stride(2), y.stride(0), y.stride(1), y.stride(2),
        *_buffer_strides(rs), *_ckpt_strides(rs),
        T=T, BLOCK_T=block_t, BLOCK_P=block_p, TAIL_P=tail, BLOCK_N=block_n, BLOCK_L=block_l,
        HAS_Z=z is not None, HAS_IDX=state_indices is not None, RD_SCALE=rd_has,
        S_PREC=ov.get("s_prec", _verify_state_precision(rd.data.dtype, C.dtype, y.dtype)),
        BC_PREC=bc_prec, PRE_GRAM=pre_gram, **wait,
        X_PREC=ov.get("x_prec", "split3b" if rs.x.dtype == torch.bfloat16 else FOLD_DOT_PRECISION),
        EARLY_BUF=bool(early_buf), EXACT=_interpreting(), TMA=tma, num_warps=ov.get("warps", warps),
        GDC=pdl["GDC"], **({"maxnreg": int(ov["maxnreg"])} if ov.get("maxnreg") else {})))
    return launches, y


def verify(rs, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, out=None):
    """Launch speculative verification of T drafts. x [b, T, H, P], dt [b, T, H],
    B/C [b, T, G, N], z [b, T, H, P] or None. Returns y [b, T, H, P]; cursor unchanged."""
    launches, y = plan_verify(rs, x, dt, A, B, C, D, dt_bias, z, state_indices, out)
    if launches and rs.lo is not None and rs.routed:     # low copies the eager route left stale
        launches = plan_refresh_lo(rs, state_indices, x.shape[0]) + launches
    elif launches and rs.deferred:     # the deferred route's epoch bits: the verify reads plain counts
        launches = [_plan_clear_bits(rs, state_indices, x.shape[0])] + launches
    _run(launches)
    return y


def plan_refresh_lo(rs, state_indices, rows: int):
    """[launches] of the stale low copies' refresh over `rows` batch rows: _refresh_lo_kernel
    (16-row tiles, 1 warp: a rare path), then the LO_STALE bits cleared (clear_lo_stale_kernel)."""
    _, H, P, N = rs.hi.data.shape
    block_p = min(16, _np2(P))
    hi_d, hi_s, hi_has = _ckpt_args(rs.hi, rs.hi.data)
    lo_d, lo_s, lo_has = _ckpt_args(rs.lo, rs.hi.data)
    idx = state_indices if state_indices is not None else rs.cursor
    return [_record(_refresh_lo_kernel, (triton.cdiv(P, block_p), H, rows))(
        idx, rs.cursor, hi_d, hi_s, lo_d, lo_s, P, N, *_ckpt_strides(rs),
        BLOCK_P=block_p, BLOCK_N=_np2(N), HAS_IDX=state_indices is not None, HI_SCALE=hi_has, LO_SCALE=lo_has,
        EXACT=_interpreting(), num_warps=1),
        _plan_clear_bits(rs, state_indices, rows)]


def _plan_clear_bits(rs, state_indices, rows: int) -> Launch:
    """Launch of common.clear_lo_stale_kernel over `rows` batch rows: their cursor words
    reduced to the count (the LO_STALE bit and the deferred route's epoch cleared)."""
    idx = state_indices if state_indices is not None else rs.cursor
    return _record(clear_lo_stale_kernel, (1,))(idx, rs.cursor, rows, HAS_IDX=state_indices is not None,
                                                 BLOCK_B=_np2(rows), num_warps=4)


# ----------------------------------------------------------------------------- offline compile
def compile_offline(launch: Launch, arch: int = 90, asm: bool = False) -> dict:
    """A recorded launch compiled for CUDA sm_<arch> without a GPU: offline.compile_launch's
    resource use ('regs', 'spill_stores', 'spill_loads', 'stack', ...; 'asm' with asm=True; EXACT compiled
    as False). Plans may be built from tensors on the 'meta' device."""
    return compile_launch(launch.kernel, launch.args, launch.meta, arch, asm)
