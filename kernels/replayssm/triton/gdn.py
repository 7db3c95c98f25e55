"""Triton kernels for Gated DeltaNet (GDN) decode: eager, ReplaySSM replay (fused flush, or an
output-only launch plus a flush-step launch), fold (standalone flush and speculative commit)
and speculative verify.

Layouts (all contiguous except the activations, which may be strided views):
    state / checkpoint  [S, Hv, dv, dk]   o = S q: rows = dv, cols = dk (contiguous)
    fp8 row scales      [S, Hv, dv]       float32
    buffer u            [S, L, Hv, dv]    float32 (float64 in exact runs)
    buffer k            [S, L, Hk, dk]    raw keys, activation dtype
    buffer g, beta      [S, L, Hv]        float32
    buffer v            [S, L, Hv, dv]    raw values (dual mode only)
    cursor              [S]               int32
    q, k [b, Hk, dk]; v, o [b, Hv, dv]; g, beta [b, Hv]   (verify: an extra draft dim T after b)

Grid of eager, fold, verify: (cdiv(dv, BLOCK_V), Hv, batch). Each row of S evolves
independently given the keys (u is per row), so a program owns a [BLOCK_V, dk] tile of one
value head of one sequence and never needs another program's data. The replay step instead
streams: a program owns HP value heads of one key head x NR chunks of BLOCK_V rows and loops
over them, so that the per-sequence work (cursor, q/k norms, the buffered keys, the decay
weights) is done once per program rather than once per tile (_gdn_replay_kernel).

Cursor protocol ("ticket cursor"): ops that move the cursor in one launch (fused replay, fold)
must let every program of a sequence see the OLD cursor while one of them writes the new one,
with no host sync and a fixed grid (CUDA graphs). Each program takes the cursor with one
relaxed atomic_add(cursor[slot], 1 << 16): the low 16 bits are the cursor word (bits 0-7 the
count, 8-14 the deferred small-batch route's epoch, bit 15 LO_STALE: a dual state's low copy is
stale, see replayssm.state), the high bits
count the programs that have read it. The program that draws ticket nprog - 1 knows every other
program of the sequence has already read the cursor (all reads are the atomics themselves,
totally ordered on one address), so it stores the new cursor, clearing the ticket bits.
Between launches the cursor is a plain int. Costs one L2 atomic per program, no extra launch;
needs L < 256 and nprog < 32768. The SPLIT replay route reads the cursor with a plain load
and leaves the move to its second launch (_gdn_flush_step_kernel); verify reads it with a
plain load (it never moves it; verify() has cleared any LO_STALE bit with the refresh launches).
"""
from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ..reference import L2_EPS
from ..state import CURSOR_MASK, EPOCH_ROWS, FP8_MAX, LO_STALE, GDNReplayState
from ..common.jit import cast, clear_lo_stale_kernel, commit_counts, gdc_release, gdc_wait_prior, list_commit_rows, \
    prefetch_hint, route_next_word, route_ticket, route_word
from ..common.launch import cache_lines, last_contig, pdl_meta, state_scratch, tma_rows
from ..common.mma import bf16_split3, exact_b_holds, mm, mma_acc, mma_precision, split_precision
from ..common.offline import compile_launch

_TICKET = tl.constexpr(1 << 16)
_CUR_MASK = tl.constexpr(CURSOR_MASK)
_LO_STALE = tl.constexpr(LO_STALE)
_FP8_MAX = tl.constexpr(FP8_MAX)
EVICT_POLICIES = ("evict_first", "evict_last", "")    # a state load's / store's L2 policy ("": none)
_EVICT_FIRST = tl.constexpr("evict_first")   # the jit helpers' default (a plain str default does not compile)

# ----------------------------------------------------------------------------- launch table
# Per op: rows (max_batch, BLOCK_V, num_warps[, options]); the first row with batch <= max_batch
# wins (None = any batch); "op:N" rows, when present, serve state copies of N bytes per element
# (the copy the op streams: replay's read copy, eager's state). BLOCK_V is clamped to
# next_pow2(dv). Picked on an H200 at Qwen3.5 dims (dk = dv = 128) by tools/tune_gdn.py (one
# run, numbers in docs/kernels.md). Replay: BLOCK_V = rows per chunk; NR chunks x HP value heads
# per program; PF prefetch hints (1 L2, 2 L1) PF_DIST chunks ahead; PREFETCH cursor-independent
# buffer reads; SPLIT = output-only launch + flush-step launch (else the fused kernel, ticket cursor).
_BIG_READ = {"NR": 1, "HP": 4, "PF": 2, "PF_DIST": 1, "SPLIT": True}     # 16/8-bit read copies, batch > 64
# Since session 24 the output launch's state chunks come through a TMA descriptor (one copy
# instruction per chunk, no address registers; TMA, where the state and GPU allow it:
# launch.tma_rows), mostly without prefetch hints (PF 0)
_BIG_TMA = dict(_BIG_READ, PF=0, TMA=True)
# The fp32 commit's fold balanced over a fixed grid (_gdn_commit_balanced_kernel) where the state
# has at most max_hv value heads and T is at most max_t (at T 6 it lost, docs/kernels.md session
# 14): per_sm programs per SM of 2 warps under a 168-register budget (ptxas alone: 214), no
# prefetch hints (PF 0: 138.5 vs 140.3 us with L1 hints, Qwen3.5-4B b128)
_BALANCED_COMMIT = {"max_hv": 32, "max_t": 4, "per_sm": 6, "maxnreg": 168, "PF": 0}
# Launches that follow one another within an op as programmatic dependents (launch.pdl_meta),
# each waiting for the kernel ahead of it before touching memory: in the speculative round the
# verify lets the commit's cursor launch start early, which lets the fold start early; in a SPLIT
# replay step the output-only launch lets the flush step start early. The folds release too, so
# in a model's commit phase (layer after layer) the next cursor launch starts early the same way.
# Config key PDL per call.
PDL = True
# The replay step's flush step reads its high chunks through TMA since session 24 (TMA). Whole
# step, us, without / with, Qwen3.5-122B / Qwen3.5-4B (tune_gdn_s24e.txt, one call): fp32 b128
# 178.3 / 97.2 vs 177.8 / 96.7, b256 351.5 / 179.8 vs 339.2 / 178.5, b512 691.9 / 349.0 vs 679.5 /
# 355.9 (the one loss); bf16 state b256 196.8 / 110.4 vs 193.1 / 109.9, b512 387.7 / 209.2 vs 384.1 /
# 208.4; dual bf16 b128 132.8 / 79.4 vs 131.3 / 78.3, b256 257.2 / 140.6 vs 253.6 / 138.8, b512
# 495.4 / 274.8 vs 489.0 / 271.2 (and the dual step's 28-byte spill gone on sm_90). The commit's
# rows (its own table entries) keep pointer loads: untimed there
_FLUSH_STEP = {"HP": 1, "PF": 2, "PF_DIST": 2, "FOLD_MMA": True, "FOLD_PREC": "bf16x3e",
               "TMA": True}   # flush_step(:2) rows
_DUAL_FLUSH = {"HP": 1, "PF": 2, "PF_DIST": 2, "FOLD_MMA": True, "SMALL_PREC": "tf32x3"}   # flush_step_dual rows
# the dual flush step since session 22: its products against the raw keys as three bf16 terms
# ("bf16x3e", where the keys are bf16 / fp8) and no software pipelining of the chunk loop
_DUAL_FLUSH_X3E = dict(_DUAL_FLUSH, P_PREC="bf16x3e", FOLD_PREC="bf16x3e", num_stages=1, TMA=True)
# Session 25: the folded chunks go out through TMA too (ST_TMA: the high copy and a 16-bit low
# copy), and the chunk loop is software-pipelined at depth 3 (Triton's pipeliner: the next
# chunks' TMA copies wait in shared memory, 37 KiB, not in registers), without prefetch hints
_DUAL_FLUSH_ST = dict(_DUAL_FLUSH_X3E, num_stages=3, ST_TMA=True, PF=0)
# Session 27: the small fp32 products (the triangular solve's rounds, U = R + R X) as six bf16
# MMAs of three-term splits (mma "bf16x6", ~2^-23) instead of Triton's "tf32x3" (~2^-22, whose
# cvt.rna runs as selects): 1751 -> 1356 SASS instructions per head on sm_90; whole step, dual
# bf16, Qwen3.5-122B / Qwen3.5-4B, us (tune_gdn_s27c.txt): b256 235.5-236.4 / 119.6-119.8 vs
# 234.1 / 118.7, b512 448.2-449.4 / 234.7-234.9 vs 445.2 / 233.1; then as the table's rows vs
# "tf32x3" (_s27d.txt): b32 42.1-42.2 / 24.0-24.1 vs 43.1 / 24.7, b64 71.0 / 40.1 vs 71.9 / 41.0,
# b128 120.9-121.1 / 67.5-67.6 vs 122.1 / 68.5, dual fp8 b256 184.6-184.7 / 101.3 vs 186.6 / 103.3;
# the high copy's error unchanged
_DUAL_FLUSH_S6 = dict(_DUAL_FLUSH_ST, SMALL_PREC="bf16x6")
CONFIGS: dict[str, list[tuple]] = {
    # fp32 eager: 4 rows x 1 warp at every batch. Session 17 (tune_gdn_s17a-c.txt), us, Qwen3.5-122B /
    # Qwen3.5-4B, against the rows it replaces (8 x 2 warps at batch 5-64, 16 x 1 above): b8 18.1 /
    # 10.1 vs 19.1 / 10.7, b32 65.7 / 34.0 vs 67.2 / 35.0, b128 259.3 / 130.3 vs 264.3 / 133.2
    # (16 x 1), b256 519.5 / 259.6 (twice; once 532.6 / 261.0 against 16 x 1's 532.7 / 266.0);
    # 98 % of copy from batch 64. A register budget (56, 48) only slows it.
    # Session 29: above batch 256 the state's load and store unhinted (no evict_first): Qwen3.5-122B
    # b512 (2 GiB of state, one layer) 1032.1 / 1032.3 us vs 1045.2 / 1045.5 hinted, vLLM's 1050.2
    # (probe_layers_s29e.txt, one call); at batch <= 256 the hints win or tie (Qwen3.5-4B b256
    # 258.3 vs 260.8 unhinted, Qwen3.5-122B b32 65.9 vs 67.4; b256 518.8-520.1 vs 517.4-517.5)
    "eager":    [(256, 4, 1), (None, 4, 1, {"LOAD_EV": "", "STORE_EV": ""})],
    # bf16 eager: 4 rows x 1 warp up to batch 2, 8 x 1 above (Qwen3.5-122B / Qwen3.5-4B b1 3.2 / 2.5
    # us vs 3.5 / 3.2 at 8 x 1; b32 35.1 / 18.9 vs 43.5 / 23.3 for the 8 x 2 warps this table had at
    # batch 5-64, a 19 % slower baseline there; b256 272 us, 94 % of copy, vs 333 for 64 x 4 warps)
    # Session 29: above batch 256 two 8-row tiles a program (TILES 2: both loads in flight before
    # either is used) with the state unhinted. Qwen3.5-122B b512 (1 GiB, one layer), two rounds of
    # one call (probe_layers_s29e.txt): 533.2 / 533.0 us vs the 8 x 1 row's 560.4 / 561.5 (unhinted
    # alone 550.7 / 552.2, TILES 2 alone 551.9 / 552.2), vLLM's 531.4 / 531.7; Qwen3.5-4B b512
    # 269.7 / 269.5 vs 269.9 / 272.0. At batch <= 256 it ties or loses (Qwen3.5-122B b256 268.7 /
    # 268.5 vs 268.1 / 268.2, b64 70.0 / 69.9 vs 67.7 / 67.6)
    "eager:2":  [(2, 4, 1), (256, 8, 1), (None, 8, 1, {"TILES": 2, "LOAD_EV": "", "STORE_EV": ""})],
    # fp32 replay, batch <= 16: the eager route (a flush at every step, eager's traffic; see
    # _gdn_replay_eager_kernel). Qwen3.5-122B b1 / b4 / b8: 4.3 / 10.5 / 18.5 us vs 5.9 / 13.0 /
    # 21.6 buffered (eager 4.0 / 10.1 / 18.1); at b16 buffered ran 0.83x (Qwen3.5-4B) and 0.96x
    # eager (h200-small-batch-20261130); at batch 32 the buffered split route wins.
    # Batch 17-64: programs of 2 heads x 4 chunks of 32 rows (one wave at batch 32), no early
    # buffer reads. Qwen3.5-4B / Qwen3.5-122B b32 31.8 / 61.4 us, b64 62.0 / 107.7, against
    # 36.3 / 64.3 and 65.3 / 116.1 for 2 chunks with them (eager b32 34.9 / 67.3;
    # tune_gdn_s16_b32_b64.txt). Prefetch hints one chunk ahead (PF_DIST 1) at every batch since
    # session 21 (above 64 they were two ahead): the whole step, Qwen3.5-122B / Qwen3.5-4B, us, two
    # ahead vs one (tune_gdn_s21a.txt, _s21b.txt, one call each): b128 196.7 / 108.7 vs 191.8 /
    # 105.0; b256 368.9 / 196.4 vs 365.0 / 191.0 (again 373.9 / 196.5 vs 368.1 / 191.6); b512 727.4
    # / 374.3 vs 720.1 / 368.8. L2 hints (PF 1) alike; three ahead or none slower; other tiles with
    # it (2 or 8 chunks, 4 heads) equal or slower. The 16-bit rows' (_BIG_READ) too: bf16 state b128
    # / b256 / b512 134.7 / 233.2 / 455.3 vs 126.5 / 222.9 / 440.3 (Qwen3.5-122B), 75.1 / 133.4 /
    # 256.7 vs 71.4 / 125.1 / 238.3 (Qwen3.5-4B); dual bf16 155.4 / 292.8 / 553.2 vs 149.0 / 283.4 /
    # 541.2, and 109.4 / 159.7 / 313.0 vs 105.4 / 152.0 / 295.3
    # The route under a 56-register budget (ptxas: 64 without, no spills with): Qwen3.5-122B /
    # Qwen3.5-4B b1 3.9 / 3.1 us vs 4.1 / 3.1, b8 18.2 / 10.2 vs 18.6 / 10.6 (tune_gdn_s17b.txt)
    # Session 24: batch > 16 in 64-row chunks through TMA, 2 chunks x 2 heads per program, no hints
    # (128 registers on sm_90). Software pipelining of the chunk loop (LOOP_STAGES, cp.async or TMA)
    # lost everywhere: b256 480-545 us (tune_gdn_s24a.txt). Whole step, us, the row before (32 x 4
    # chunks, hints one ahead) vs this, Qwen3.5-122B / Qwen3.5-4B (tune_gdn_s24c.txt; _s24b alike):
    # b32 61.2 / 31.5 vs 53.6 / 30.2, b64 104.1 / 62.2 vs 96.1 / 54.5, b128 189.2 / 104.4 vs 176.7 /
    # 96.5, b256 363.7 / 189.6 vs 352.3 / 177.8, b512 709.9 / 369.5 vs 687.5 / 358.7. 32-row chunks
    # through TMA (72 registers): b256 350.2 / 181.6, b32 61.4 / 31.1
    # Session 30: batch 5-16 take the deferred route (ROUTE_K 2: the state written every other
    # step, _gdn_route_defer_kernel), 4 rows x 1 warp without the budget (80 registers; under 56
    # it ran 20 % slower). In the sweep's layout (probe_layers_s30b.txt, one call; us, eager /
    # every-step route / deferred k 2): Qwen3.5-4B b8 10.18 / 10.16 / 9.99, b16 18.18 / 18.22 /
    # 16.99; Qwen3.5-122B b8 18.18 / 18.21 / 16.97, b16 34.15 / 34.26 / 30.93. At batch 1-4 it
    # lost (b1 3.29-3.39 vs 3.04 at Qwen3.5-4B, 4.20-4.33 vs 3.93 at Qwen3.5-122B; b4 6.40 vs 6.10
    # and 9.99 vs 10.18), k 3 and 4 lost to k 2 everywhere, and dual states lost with it (their
    # fold recomputes u: Qwen3.5-122B b8 20.88 vs 18.26): they keep the every-step row.
    "replay":   [(4, 4, 1, {"EAGER_ROUTE": True, "maxnreg": 56}),
                 (16, 4, 1, {"EAGER_ROUTE": True, "ROUTE_K": 2}),
                 (4, 8, 1, {"PREFETCH": True}),         # batch <= 4 when SMALL_BATCH_ROUTE is off
                 (None, 64, 4, {"NR": 2, "HP": 2, "PF": 0, "SPLIT": True, "TMA": True})],
    # 16-bit read copies (bf16 state; dual states route on the fp32 row above): the eager route,
    # 4 rows x 1 warp up to batch 4, 8 x 1 up to batch 32 (bf16 b8 11.5 / 6.7 vs 11.9 / 7.0;
    # tune_gdn_s17b.txt). bf16 state at batch 16 / 32 (tune_gdn_s17a.txt, _s17c.txt), routed vs
    # the best buffered row: Qwen3.5-122B 20.1 / 37.8 us vs 23.1 / 40.9, Qwen3.5-4B 11.4 / 20.1 vs
    # 16.9 / 23.1. PENDING_CALL (session 18): the rare path as a call (_route_pending), 95
    # registers instead of 127 with no spill, the 8 x 1 route as fast as our bf16 eager
    # (tune_gdn_s18a_*.txt, session 17's kernel / this one / eager: Qwen3.5-122B b8 11.5 / 10.6 /
    # 10.7 us, b32 38.1 / 35.5 / 35.4; Qwen3.5-4B b8 6.7 / 6.5 / 6.4, b32 20.4 / 18.9 / 19.1). At
    # 4 x 1 the call ran slower (b8 12.4 vs 12.0 and 7.5 vs 7.0), and fp32 rows keep the inline
    # path, spill-free under their 56-register budget.
    # Buffered, batch 5-8: the session-6 row; 9-64: 4 chunks per program without the early buffer
    # reads, dual bf16 b16 / b32 Qwen3.5-122B 27.3 / 52.2 us vs 32.8 / 57.1, Qwen3.5-4B 21.9 / 27.0
    # vs 22.5 / 33.1 (at b8 it lost: Qwen3.5-4B 16.2 vs 14.7, tune_gdn_s16_small16.txt)
    "replay:2": [(4, 4, 1, {"EAGER_ROUTE": True}),
                 (32, 8, 1, {"EAGER_ROUTE": True, "PENDING_CALL": True}),
                 (4, 8, 1, {"PREFETCH": True}),
    # Session 24: from batch 9 whole 128-row heads through TMA (int32 words), no hints; 2 heads per
    # program to batch 32, 4 above. Whole step, us, the rows before vs these, Qwen3.5-122B / Qwen3.5-4B
    # (tune_gdn_s24c.txt): dual bf16 b32 52.6 / 28.7 vs 47.2 / 29.2 (4 heads 49.8 / 29.3), b64 84.5 /
    # 52.5 vs 77.6 / 47.1, b128 138.1 / 81.3 vs 131.7 / 78.9, b256 263.4 / 141.9 vs 255.4 / 139.9 (with
    # hints: 252.8 / 139.9), b512 505.6 / 276.6 vs 493.2 / 273.5 (485.0 / 270.2); bf16 state b64 70.3 /
    # 42.8 vs 56.5 / 34.1, b128 114.7 / 66.9 vs 103.2 / 59.8, b256 209.5 / 117.8 vs 191.6 / 108.9 (with
    # hints 206.1 / 113.2), b512 411.0 / 221.2 vs 383.1 / 207.2
                 (8, 32, 4, {"NR": 2, "HP": 2, "PF": 2, "PF_DIST": 2, "SPLIT": True, "PREFETCH": True}),
                 (32, 128, 4, dict(_BIG_TMA, HP=2)),
                 (None, 128, 4, _BIG_TMA)],
    # Dual states' 16-bit low copies (pick_config: a dual state's buffered rows; bf16 / fp16 state
    # copies keep replay:2). Session 26: from batch 9 the low copy's dots as one tensor-core
    # product per chunk (RD_MMA: the chunk from its TMA copy's shared memory into the MMA, never
    # unpacked in registers), unpipelined (Triton pipelines a loop with a dot at depth 3 by default:
    # 100 KiB of shared memory a program); to batch 16 64-row chunks x 2 (96 registers), to 128
    # the 128-row chunks (128-136 registers), above 64-row chunks x 2 under an 80-register budget
    # (6 programs per SM; 12-16 bytes spilled). Whole step, us, the replay:2 row vs these,
    # Qwen3.5-122B / Qwen3.5-4B (tune_gdn_s26f.txt, _s26c, _s26d, _s26i: other H200s): b16 (_s26i;
    # Qwen3.5-4B takes the high copy's route there) 29.2 vs 25.9 (128-row chunks 28.4), b32 45.2 /
    # 29.1 vs 44.8 / 25.2 (64-row chunks 44.2 / 25.7), b64 74.2 / 45.7 vs 75.0 / 42.6,
    # b128 124.5 / 75.9 vs 125.8 / 71.0 (_s26d; _s26c 125.6 / 76.3 vs 126.2 / 71.8), b256 243.8 /
    # 133.0 vs 238.8 / 122.8 (_s26d; _s26c 242.2 / 133.4 vs 239.7 / 124.6), b512 (_s26c) 468.9 /
    # 260.3 vs 458.6 / 241.5. On bf16 states the product tied (b256 196.3 / 106.2 vs 193.5 / 108.1)
    # and the 64-row budget lost (203.0 / 110.1), so they keep replay:2. Lost everywhere: depth 2
    # (b256 345.3 / 178.8 at 64-row chunks), the early buffer reads (PREFETCH: 264.9 / 129.0), an
    # L2 hint for the first chunk (249.2 / 129.9)
    "replay_dual:2": [(4, 8, 1, {"PREFETCH": True}),
                      (8, 32, 4, {"NR": 2, "HP": 2, "PF": 2, "PF_DIST": 2, "SPLIT": True, "PREFETCH": True}),
                      (16, 64, 4, dict(_BIG_TMA, HP=2, NR=2, RD_MMA=True, num_stages=1)),
                      (32, 128, 4, dict(_BIG_TMA, HP=2, RD_MMA=True, num_stages=1)),
                      (128, 128, 4, dict(_BIG_TMA, RD_MMA=True, num_stages=1)),
                      (None, 64, 4, dict(_BIG_TMA, NR=2, RD_MMA=True, num_stages=1, maxnreg=80))],
    # 8-bit read copies (dual fp8), session 24: from batch 9 the 16-bit copies' tile through TMA, here
    # with hints one ahead above batch 64 and the early buffer reads below (as timed), us, the rows
    # before vs these (tune_gdn_s24c.txt): b32 53.6 / 31.1 vs 40.8 / 25.0, b64 95.6 / 54.1 vs 69.2 /
    # 42.4, b128 131.3 / 86.8 vs 114.0 / 67.0, b256 261.6 / 160.6 vs 221.8 / 120.9, b512 501.4 / 316.0
    # vs 421.4 / 232.5 (without hints 434.7 / 241.3)
    "replay:1": [(4, 8, 1, {"PREFETCH": True}),
                 (8, 32, 4, {"NR": 2, "HP": 2, "PF": 2, "PF_DIST": 2, "SPLIT": True, "PREFETCH": True}),
                 (64, 128, 4, dict(_BIG_TMA, PREFETCH=True)),
                 (None, 128, 4, dict(_BIG_READ, TMA=True))],
    # FOLD_MMA, Qwen3.5-122B b256 step vs rank-1 folds, same config otherwise (tools/tune_gdn.py):
    # fp32 450 vs 563 us (session 5), bf16 state 246 vs 346 us (session 8). Above batch 64, two
    # chunks per program (NR 2: half the programs, each chunk's loads hinted ahead of the other's;
    # fp32 127 registers instead of 168). Whole step, NR 2 vs 1, Qwen3.5-122B / Qwen3.5-4B
    # (tune_gdn_s20b_flushtile*.txt, _s20c: one call each): fp32 b128 196.1 / 108.8 us vs 201.7 /
    # 112.0, b256 367.6 / 197.0 vs 377.9 / 203.1 (again 367.1 / 197.0 vs 377.5 / 202.8), b512
    # 718.3 / 373.9 vs 778.8 / 399.1 (NR 4 712.0 / 372.2); bf16 state b256 232.6 / 133.3 vs
    # 245.3 / 139.2 (NR 4 228.6 / 133.0); bf16 state b128 128.3 / 74.2 vs 134.5 / 74.9 (session 21,
    # tune_gdn_s21a.txt). Since session 21 the rows are keyed by batch x value heads (BY_HEADS: the
    # flushing heads per step scale with both), after batch 32 and 64 (tune_gdn_s21a.txt, _s21f.txt;
    # us, NR 1 vs 2, the number keyed in brackets): fp32 Qwen3.5-122B b32 (2048) 61.4 vs 62.9, b64
    # (4096) 107.6 vs 104.5 (107.5 vs 104.3 in _s21a); Qwen3.5-4B b32 (1024) 31.7 vs 36.1, b64 (2048)
    # 62.3 vs 63.7. bf16 state b64: Qwen3.5-122B (4096) 75.1 vs 74.1, Qwen3.5-4B (2048) 46.1 vs 44.7,
    # so 16-bit high copies took two chunks from 1025 (1025-2047 untimed; session 22: see below)
    # Session 22: the fold's product (stored u x the raw keys) as three bf16 terms of u against
    # the bf16 keys (mma "bf16x3e"; Triton's "tf32x3" before, and where the keys are not bf16 /
    # fp8). Whole step, us, "tf32x3" vs "bf16x3e", Qwen3.5-122B / Qwen3.5-4B (tune_gdn_s22b.txt):
    # fp32 b64 104.6 / 62.2 vs 104.3 / 62.0, b128 191.3 / 105.2 vs 189.5 / 104.3, b256 367.6 /
    # 191.8 vs 361.4 / 190.0 (_s22a: 367.1 / 191.7 vs 364.2 / 189.9), b512 721.5 / 372.0 vs
    # 712.2 / 369.9; bf16 state b64 74.0 / 44.4 vs 70.1 / 45.3, b128 120.4 / 70.5 vs 116.8 / 66.5,
    # b256 222.2 / 125.1 vs 212.1 / 119.5, b512 440.0 / 237.8 vs 416.4 / 225.1. The high copy's
    # error against the fp32 reference: the same (1.2-1.7e-7 fp32). With it, 16-bit high copies'
    # chunks per program again, NR 1 / 2 / 4, us (tune_gdn_s22e.txt, _s22f.txt; batch x heads in
    # brackets): Qwen3.5-4B b64 (2048) 43.4 / 45.7 / 50.8, Qwen3.5-122B b64 (4096) 71.7 / 70.6 /
    # 74.7, Qwen3.5-4B b128 (4096) 67.7 / 66.8 / 70.7, Qwen3.5-122B b128 (8192) 119.9 / 116.8 / 114.9,
    # b256 (8192 / 16384) Qwen3.5-4B 124.7 / 119.8 / 118.3, Qwen3.5-122B 223.8 / 213.0 / 209.8, b512
    # 235.9 / 225.6 / 222.0, 441.3 / 417.9 / 411.1: one chunk to 2048, two to 4096, four above. fp32
    # NR 2 vs 4 within 1 % either way (b256 361.2 / 189.4 vs 361.9 / 187.9): two chunks stay
    "flush_step": [(2048, 32, 4, dict(_FLUSH_STEP, NR=1)), (None, 32, 4, dict(_FLUSH_STEP, NR=2))],
    "flush_step:2": [(2048, 32, 4, dict(_FLUSH_STEP, NR=1)), (4096, 32, 4, dict(_FLUSH_STEP, NR=2)),
                     (None, 32, 4, dict(_FLUSH_STEP, NR=4))],
    # dual states (u recomputed by the triangular solve): 16 rows x 2 warps, a whole head (NR 8:
    # one inverse per head) per program, the small products in Triton's "tf32x3". Qwen3.5-122B
    # b256, dual bf16: 290 us (NR 8) vs 329 (NR 1) and 406 rank-1; dual fp8 278 vs 404 us
    # (tune_gdn_flush_dual2.txt; high-copy error after 3 steps 1e-5 with "tf32x3t", 5.8e-6 with
    # "tf32x3" at NR 1, 2.5-3.2e-6 with "ieee", which spills at this tile; rank-1: 4.5e-7)
    # batch <= 64 (few rows flush per step): one 16-row chunk per program. Qwen3.5-122B b8 / b16 /
    # b32: 18.9 / 33.2 / 57.6 us vs 28.9 / 52.9 / 70.0 (NR 8) and 21.2 / 37.9 / 73.8 rank-1;
    # Qwen3.5-4B b32 33.4 vs 53.9 / 41.7 (tune_gdn_flush_dual_small.txt, _b32.txt; b64-128 untimed)
    # TWO_PASS (opt-in, F_TWO_PASS): _gdn_dual_2pass_kernel, the dual commit's kernel, over the
    # step's flushing rows. Qwen3.5-122B b256 step 284.5 vs 292.9 us, but the high copy's error
    # 1.2e-5 vs 2.5e-7 (tools/tune_gdn.py flush-dual-2pass, tune_gdn_2pass.txt): not the default
    # Session 21: keyed by batch x value heads (BY_HEADS), as the flushing heads per step are
    # (about batch x heads / K): a whole head per program only from 8192, 4 chunks (half a head) from
    # 2049. Whole step, dual bf16, us, the old rows (one chunk to batch 64, a head above) vs NR 4
    # (tune_gdn_s21e.txt): Qwen3.5-4B b128 (4096) 105.6 vs 87.5 (NR 1 93.5), Qwen3.5-122B b64
    # (4096) 97.5 vs 90.1; NR 8 stays best at 8192 (Qwen3.5-122B b128 148.5 vs 156.5 NR 4,
    # Qwen3.5-4B b256 151.1 vs 160.1) and NR 1-2 at 2048 (Qwen3.5-4B b64 55.7 vs 64.4 NR 4)
    # Session 22: both products against the raw keys (S_0 Kb^T and the fold) as three bf16 terms
    # of the fp32 side ("bf16x3e": bf16 MMAs, the keys a bf16 operand; "tf32x2t" / "tf32x3"
    # before), no software pipelining (num_stages 1: 35 instead of 51 KiB of shared memory), hints
    # one chunk ahead where a program has more than one (none where it has one). Nsight Compute
    # before (Qwen3.5-122B b256): 98.3 us at 31 % of DRAM peak, 255 registers, 4 two-warp programs
    # per SM. Whole step, us, the rows before vs these, Qwen3.5-122B / Qwen3.5-4B (tune_gdn_s22b.txt;
    # _s22a.txt alike): b32 54.9 / 29.0 vs 54.6 / 28.6, b64 89.9 / 55.5 vs 84.4 / 55.0, b128 148.2 /
    # 86.6 vs 138.2 / 81.2, b256 282.6 / 151.4 vs 263.4 / 142.2, b512 541.8 / 295.3 vs 506.3 / 276.3.
    # Each change alone (b256, _s22a): "bf16x3e" 266.3 / 143.1, depth 1 272.3 / 146.0. Four warps
    # lost everywhere (344.8 / 181.5 at b256), as did 32-row chunks (466.5 / 244.6) and register
    # budgets of 192 / 168 / 128 (ptxas spills 2-10 bytes at 255; under them 24-112, 0.5-24 %
    # slower, _s22c.txt). The high copy's error: the same (2.4-3.2e-7). Dual fp8 low copies, old
    # rows vs these: b128 141.4 / 93.5 vs 131.7 / 87.0, b256 275.1 / 168.7 vs 263.7 / 161.3, b32
    # 56.3 / 31.0 vs 56.3 / 30.9 (_s22c.txt). Then chunks per program again, NR 1 / 2 / 4 / 8, us
    # (_s22e.txt, _s22f.txt; batch x heads in brackets): Qwen3.5-4B b32 (1024) 28.8 / 34.0 / 41.2 /
    # 56.4, Qwen3.5-122B b32 (2048) 54.7 / 52.3 / 59.0 / 74.1, Qwen3.5-4B b64 (2048) 55.2 / 52.5 /
    # 59.4 / 74.9, Qwen3.5-122B b64 (4096) 97.1 / 91.9 / 84.6 / 98.1, Qwen3.5-4B b128 (4096) 94.1 /
    # 88.5 / 81.7 / 95.0, Qwen3.5-122B b128 (8192) 170.0 / 157.9 / 145.2 / 138.9: two chunks (no
    # hints, as timed) from 1025 to 2048
    # Session 25: the stores through TMA and the loop pipelined at depth 3, without hints
    # (_DUAL_FLUSH_ST). Whole step, us, the rows before vs these, Qwen3.5-122B / Qwen3.5-4B
    # (tune_gdn_s25b.txt; _s25a.txt alike): dual bf16 b32 46.5 / 29.5 vs 44.9 / 29.0, b64 76.5 /
    # 47.1 vs 74.0 / 45.6, b128 130.5 / 78.0 vs 125.2 / 75.8, b256 252.4 / 138.5 vs 243.5 / 133.8,
    # b512 489.2 / 270.5 vs 468.3 / 259.9; dual fp8 (the low copy stored through pointers) b128
    # 109.5 / 65.0 vs 103.6 / 62.7, b256 207.1 / 113.0 vs 193.2 / 106.9, b512
    # 399.0 / 218.3 vs 371.5 / 205.9. Each part alone is worth less: the TMA stores alone slower
    # (b256 259.0 / 141.8), depth 3 alone 250.0 / 137.0, both with the hints 249.6 / 137.0; depth 2
    # or 4 no better; L2 hints (PF 1) 240.8 at Qwen3.5-122B b256 but 137.0 at Qwen3.5-4B
    "flush_step_dual": [(1024, 16, 2, dict(_DUAL_FLUSH_S6, NR=1)),
                        (2048, 16, 2, dict(_DUAL_FLUSH_S6, NR=2)),
                        (4096, 16, 2, dict(_DUAL_FLUSH_S6, NR=4)),
                        (None, 16, 2, dict(_DUAL_FLUSH_S6, NR=8))],
    # the speculative commit (plan_commit), fp32 states: the flush step's fold over up to K + T - 1
    # entries (32-entry tiles at T <= 16), a whole head per program, over the rows the cursor launch
    # lists (COMPACT), the fold's fp32 side split by truncation (FOLD_SPLIT). T4 verify + commit round
    # (tools/tune_spec.py, one run each): listing the rows, Qwen3.5-122B b256 546 us vs 562 scanning
    # the batch in every program; FOLD_SPLIT 540 vs 546 ("tf32x3"); then 16 rows x 2 warps x 8 chunks
    # 528 (126 registers; 32 x 4 x 4: 205-216), Qwen3.5-4B b256 281 vs 283, but Qwen3.5-122B b32
    # 85.1 vs 80.6, hence the split at batch 64 (tune_spec_s10a.txt). The rank-1 fold kernel
    # (COMMIT_FOLD): 708 / 371 / 103 us. At batch 128, 4 chunks per program (half a head): Qwen3.5-4B
    # 139.6 vs 142.1 us, Qwen3.5-122B 248.7 vs 252.8, twice (tune_spec_s11c.txt, _s11d.txt).
    # Session 14, batch > 64: a 160-register budget (ptxas: 164 at batch 128, 126 at 256 without
    # it; 150 / 142 with it), Qwen3.5-122B b128 / b256 248.5 / 472.4 us vs 249.6 / 476.7, Qwen3.5-4B
    # 139.9 / 256.6 vs 140.2 / 258.8; and at <= 32 value heads the balanced fold
    # (_gdn_commit_balanced_kernel, _BALANCED_COMMIT), Qwen3.5-4B 138.6 / 254.4 (twice: 138.5 /
    # 254.1; at Qwen3.5-122B 249.9 / 476.0, no gain) (tune_spec_s14d-g.txt)
    # Session 22, above batch 64: the fold as three bf16 terms of u against bf16 / fp8 keys
    # (FOLD_PREC "bf16x3e"; FOLD_SPLIT's "tf32x2t" for other keys). T4 verify + commit round, us,
    # "tf32x2t" vs "bf16x3e" (tune_spec_s22b.txt, _s22c.txt): b128 Qwen3.5-4B 137.3 vs 134.7,
    # Qwen3.5-122B 247.2 vs 245.6; b256 253.0 vs 250.4, 471.0 vs 467.3; but b32 (the 32 x 4 row)
    # Qwen3.5-122B 75.5 vs 76.1, so batch <= 64 keeps "tf32x2t"
    # Session 25, above batch 64: the fold's chunks loaded and stored through TMA (TMA, ST_TMA; in the
    # balanced fold too, over a loop of the segment's own chunks). T4 round, us, before vs with
    # (tune_spec_s25b.txt, _s25c.txt): Qwen3.5-4B (the balanced fold) b128 134.75 vs 133.52, b256
    # 250.34 vs 247.95; Qwen3.5-122B (the flush step's fold) b128 245.51 vs 243.76 (_s25a: 245.48 vs
    # 243.73), b256 467.0 either way. sm_90 at b128: 157 registers under the 160 budget (146 without
    # TMA; TMA loads alone: 160 and an 8-byte spill), the balanced fold 166 of its 168
    "commit":   [(64, 32, 4, {"NR": 4, "HP": 1, "PF": 2, "PF_DIST": 2, "FOLD_MMA": True, "COMPACT": True,
                              "FOLD_SPLIT": True}),
                 (128, 16, 2, {"NR": 4, "HP": 1, "PF": 2, "PF_DIST": 2, "FOLD_MMA": True, "COMPACT": True,
                               "FOLD_SPLIT": True, "FOLD_PREC": "bf16x3e", "maxnreg": 160,
                               "BALANCED": _BALANCED_COMMIT, "TMA": True, "ST_TMA": True}),
                 (None, 16, 2, {"NR": 8, "HP": 1, "PF": 2, "PF_DIST": 2, "FOLD_MMA": True, "COMPACT": True,
                                "FOLD_SPLIT": True, "FOLD_PREC": "bf16x3e", "maxnreg": 160,
                                "BALANCED": _BALANCED_COMMIT, "TMA": True, "ST_TMA": True})],
    # Dual states: the two-pass kernel (_gdn_dual_2pass_kernel), a whole head per program on 4
    # warps in 16-column dk steps: T4 verify + commit round, Qwen3.5-122B b256 dual bf16, 558 us vs
    # 633 with the rank-1 fold kernel, 600 (64 rows x 4 warps), 632 (128 x 8 warps), 805 (32 x 4)
    # (tune_spec_s10f.txt, one run). The rank-1 fold kernel serves the low copies it does not
    # take (fp8, with per-row scales); F_TWO_PASS False: the flush step (its keys as below).
    # Session 22: the fold's product as three bf16 terms (FOLD_PREC "bf16x3e", "tf32x2t" before):
    # T4 round dual bf16, us, Qwen3.5-122B / Qwen3.5-4B, b128 258.0 / 139.5 vs 247.7 / 133.9
    # (with the state x keys product so too, P_PREC: 249.3 / 134.6; tune_spec_s22b.txt), b256
    # 496.7 / 261.9 vs 478.5 / 251.9 (_s22c.txt)
    "commit_dual": [(None, 128, 4, dict(_DUAL_FLUSH, NR=1, TWO_PASS=True, CHUNK_K=16, FOLD_PREC="bf16x3e"))],
    "fold":     [(None, 32, 4)],
    # verify, batch > 4: a whole 128-row head per program on 2 warps (64 rows per warp), so the
    # per-head work (the buffer keys' and drafts' Gram products, the solve's coefficients) is done
    # once per head instead of once per row tile. T4 verify + commit round (tools/tune_spec.py,
    # one run, tune_spec_s10c.txt): Qwen3.5-122B b256 477 us vs 528 (64 rows x 2 warps, the
    # session-9 row), 472 (16-column steps, 4 stages), 583 (4 warps); Qwen3.5-4B b256 258 vs 282;
    # Qwen3.5-122B b32 76.2 vs 80.6; dual bf16 Qwen3.5-122B b256 637 vs 686. WIDE_BLOCK_V: rows
    # per program when T > 8 (32 packed draft columns): 128 rows spill ~500 bytes on sm_90, 64 rows 8-16
    "verify":   [(4, 16, 1), (None, 128, 2, {"WIDE_BLOCK_V": 64})],
    # 16-bit read copies (dual fp32 + bf16): the same tile, at T 4 under a 168-register budget
    # (MAXNREG_T: {T: budget}): 6 programs per SM on 2 warps, not 5 at ptxas's 190. T4 round
    # Qwen3.5-122B b256 506 vs 558 us, b128 263 vs 289, Qwen3.5-4B b256 269 vs 295 (tune_spec_s11d.txt,
    # _s11h.txt); fp32 reads lose with it (530 vs 478 us, b256). Only T 4 (and 1) compile under it
    # without spilling on sm_90 (T 2, 3, 5-8: 4-16 bytes). T 6 (ptxas alone: 186 registers, 5 per
    # SM) runs faster under it despite a 12-byte spill: b256 Qwen3.5-122B 617 vs 666 us, Qwen3.5-4B
    # 328 vs 352 (session 12, tune_spec_s12e_T6.txt); T 2 compiles to 168 without a budget (with
    # one: a 4-byte spill, 369 vs 366 us, _s12d_T2.txt). Other T: not timed, no budget.
    # TMA_T: the T whose state chunks come through a TMA descriptor (session 13, dual bf16 rounds,
    # Qwen3.5-4B / Qwen3.5-122B, us with vs without: T4 b32 60.7 / 62.4, 76.8 / 79.3; b128 140.7 /
    # 144.6, 259.3 / 264.5; b256 263.0 / 268.8, 498.8 / 504.9; b512 500.8 / 510.7, 969.2 / 982.5;
    # b256 T2 190.6 / 196.3, 354.7 / 363.9; T6 324.6 / 328.7, 612.5 / 617.4; tune_spec_s13c-g).
    # Under the budget it adds a 4-byte spill at T4 (16 bytes at T6, 12 without). T5 would take
    # 255 registers with it (186 without); T3 / T8 fewer; untimed, so off. fp32 read copies lose
    # with it (Qwen3.5-4B b128 142.5 vs 140.2 us), so "verify" has none
    "verify:2": [(4, 16, 1), (None, 128, 2, {"WIDE_BLOCK_V": 64, "MAXNREG_T": {4: 168, 6: 168},
                                            "TMA_T": (2, 4, 6)})],
}
# Tables whose rows are keyed by batch x value heads instead of batch (_flush_step_row)
BY_HEADS = {"flush_step", "flush_step_dual"}
MAX_BLOCK_L = 16   # other kernels; replay reads the whole buffer as one chunk
# Verify: tl.dot precision of products with fp32 operands (the fp32 state tile times the
# drafts' raw keys/queries, and the small T- and L-sized products). "split" (default): the
# truncation splits of mma.split_precision ("tf32x2t" for fp32 x bf16 keys, "tf32x3t" for
# fp32 x fp32; ~2^-20 per product), 15 % faster than Triton's "tf32x3" at Qwen3.5-122B b256
# T4 on the H200 (tools/tune_spec.py, docs/kernels.md); or any single precision for all of
# them ("tf32x3" ~2^-22, "bf16x3" ~2^-16, "ieee" exact, FMA).
VERIFY_F32_PRECISION = "split"
VERIFY_CHUNK_K = 32   # dk columns per MMA step of the verify kernel's loop over the state tile
# Tuning hook: OVERRIDE["verify"] = {BLOCK_V, num_warps, S_PREC, EARLY_BUF, CHUNK_K, SMALL_PREC,
# num_stages, maxnreg} and OVERRIDE["fold"] = {BLOCK_V, num_warps, COMMIT_FOLD, F_<flush-step key>}
# replace the table for every shape (a per-call `config` wins). Empty in normal use.
OVERRIDE: dict[str, dict] = {}
# Route small batches as the table says (rows with EAGER_ROUTE). False: those rows are skipped,
# so every replay step buffers (the buffered route's own small-batch rows serve), as tests of
# the buffered route and studies of it at batch 1 need. A per-call `config` still wins.
SMALL_BATCH_ROUTE = True
# Dual states take the eager route on their high copy alone (the fp32 table's route row): the
# low copy is not written there but marked stale (LO_STALE) and refreshed by the next buffered
# step, which flushes (session 18; before, the route wrote both copies and lost 9-31 % to
# fp32 eager at batch 1-16). So the route moves fp32 eager's bytes, the buffered step reads
# half of them: routed while batch x value heads <= DUAL_ROUTE_HEADS. H200 (s17b runs, our fp32
# eager ~ the fp32 route vs the buffered dual bf16 step): Qwen3.5-4B (32 heads) b16 18.1 vs
# 23.1 us, b32 34.2 vs 28.9; Qwen3.5-122B (64 heads) b8 18.1 vs 18.4, b16 34.1 vs 29.0.
DUAL_ROUTE_HEADS = 512


def pick_config(op: str, batch: int, dv: int, dk: int, L: int = 1, override: dict | None = None,
                state_bytes: int = 4, dual: bool = False, heads: int | None = None) -> dict:
    """Launch config {BLOCK_V, BLOCK_K, BLOCK_L, num_warps, ...} for `op` at this shape; an
    `override` that sets the tile (BLOCK_V or num_warps) without a maxnreg drops the row's.
    `state_bytes`: bytes per element of the state copy the op streams (table key "op:bytes"
    when present, else "op"); `dual`: a dual-mode state of `heads` value heads (replay: see
    DUAL_ROUTE_HEADS; its route row is the fp32 table's, its buffered rows the read copy's)."""
    rows = CONFIGS.get(f"{op}:{state_bytes}", CONFIGS[op])
    routed = lambda r: len(r) > 3 and r[3].get("EAGER_ROUTE")   # noqa: E731
    if not SMALL_BATCH_ROUTE:
        rows = [r for r in rows if not routed(r)]
    if op == "replay" and dual:
        if heads is None:
            raise ValueError("pick_config('replay', dual=True) needs heads (the value heads)")
        hi_route = [r for r in CONFIGS[op] if routed(r)]
        if SMALL_BATCH_ROUTE and hi_route and batch * heads <= DUAL_ROUTE_HEADS:
            rows = [(None, *hi_route[0][1:])]
        else:   # a dual state's own rows for its low copy where the table has them
            rows = [r for r in CONFIGS.get(f"replay_dual:{state_bytes}", rows) if not routed(r)]
    for row in rows:
        if row[0] is None or batch <= row[0]:
            break
    cfg = {"BLOCK_V": row[1], "num_warps": row[2], "BLOCK_L": min(triton.next_power_of_2(L), MAX_BLOCK_L)}
    if len(row) > 3:
        cfg.update(row[3])
    if override:
        if ("BLOCK_V" in override or "num_warps" in override) and "maxnreg" not in override:
            cfg.pop("maxnreg", None)    # a row's register budget belongs to its tile
        cfg.update(override)
    cfg["BLOCK_V"] = min(cfg["BLOCK_V"], triton.next_power_of_2(dv))
    cfg["BLOCK_K"] = triton.next_power_of_2(dk)
    return cfg


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# ----------------------------------------------------------------------------- jit helpers
@triton.jit
def _ckpt_load(ptr, sc_ptr, tile_off, row_off, mask, rmask, FP8: tl.constexpr, EV: tl.constexpr = _EVICT_FIRST):
    """Dequantised [BLOCK_V, BLOCK_K] fp32 tile (masked elements 0). Streamed once: evict first
    by default; EV: the L2 eviction policy ("" for none: see LOAD_EV of the eager kernels)."""
    s = tl.load(ptr + tile_off, mask=mask, other=0.0, eviction_policy=EV).to(tl.float32)
    if FP8:
        s = s * tl.load(sc_ptr + row_off, mask=rmask, other=1.0)[:, None]
    return s


@triton.jit
def _ckpt_store(ptr, sc_ptr, tile_off, row_off, s, mask, rmask, FP8: tl.constexpr, INTERP: tl.constexpr,
                EV: tl.constexpr = _EVICT_FIRST):
    """Store a fp32 tile, quantising; fp8: per-row scale amax/448 (1 for a zero row).
    Whole rows live in one program (we tile dv only), so the row amax is local."""
    if FP8:
        amax = tl.max(tl.abs(s), 1)            # masked columns hold 0
        sc = tl.where(amax > 0, tl.math.div_rn(amax, _FP8_MAX), 1.0)
        tl.store(sc_ptr + row_off, sc, mask=rmask)
        s = tl.math.div_rn(s, sc[:, None])
    tl.store(ptr + tile_off, cast(s, ptr.dtype.element_ty, INTERP), mask=mask, eviction_policy=EV)


@triton.jit
def _fold(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
          HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
          DUAL: tl.constexpr, EPS: tl.constexpr):
    """Fold buffer entries 0..n-1 into the fp32 tile S [BLOCK_V, BLOCK_K], in order.

    Non-dual: S = alpha_i S + u_i k_i^T with the stored u_i.
    Dual: u_i is recomputed against the (high-precision) S being folded,
    u_i = beta_i (v_i - alpha_i S k_i), so no u computed from the low copy enters the state.
    A loop over <= L entries at 1/K of the steps; the loads do not depend on S, so they pipeline.
    """
    for i in range(L):
        if i < n:
            e = slot64 * L + i
            gi = tl.load(gb_ptr + e * HV + h).to(tl.float32)
            ai = tl.exp(gi)
            ki = tl.load(kb_ptr + (e * HK + kh) * DK + cols, mask=cmask, other=0.0).to(tl.float32)
            ki = ki * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)
            if DUAL:
                vi = tl.load(vb_ptr + (e * HV + h) * DV + rows, mask=rmask, other=0.0).to(tl.float32)
                bi = tl.load(bb_ptr + e * HV + h).to(tl.float32)
                ui = bi * (vi - ai * tl.sum(S * ki[None, :], 1))
            else:
                ui = tl.load(ub_ptr + (e * HV + h) * DV + rows, mask=rmask, other=0.0).to(tl.float32)
            S = ai * S + ui[:, None] * ki[None, :]
    return S


@triton.jit
def _tile_at(slot64, h, rows, rmask, cols, cmask, HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr):
    """Where a [BLOCK_V, BLOCK_K] tile of (slot, value head h), rows `rows`, lies in a
    [slots, Hv, dv, dk] state: (its row offsets [BLOCK_V], element offsets, mask)."""
    row_off = (slot64 * HV + h) * DV + rows
    return row_off, row_off[:, None] * DK + cols[None, :], rmask[:, None] & cmask[None, :]


@triton.jit
def _folded_tile(hi_ptr, hi_sc_ptr, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, slot64, h, kh, n, rows, rmask, cols, cmask,
                 HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
                 HI_FP8: tl.constexpr, DUAL: tl.constexpr, EPS: tl.constexpr, EV: tl.constexpr = _EVICT_FIRST):
    """The high checkpoint's [BLOCK_V, dk] tile of (slot, value head h), rows `rows`, with buffer
    entries 0..n-1 folded in (_fold): (S, its element offsets, its row offsets, its mask)."""
    row_off, tile, mask2 = _tile_at(slot64, h, rows, rmask, cols, cmask, HV, DV, DK)
    S = _ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8, EV)
    S = _fold(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
              HV, HK, DK, DV, L, DUAL, EPS)
    return S, tile, row_off, mask2


# ----------------------------------------------------------------------------- eager
@triton.jit
def _gdn_eager_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, s_ptr,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
    LOAD_EV: tl.constexpr = _EVICT_FIRST, STORE_EV: tl.constexpr = _EVICT_FIRST, TILES: tl.constexpr = 1,
):
    """Eager step on one [BLOCK_V, dk] tile: read S once, write S once.
    sk = S k, sq = S q (one pass), u = beta (v - alpha sk), S' = alpha S + u k^T,
    o = S' q = alpha sq + u (k . q). LOAD_EV / STORE_EV: the L2 eviction policies of the
    state's load and store (the table's; see CONFIGS["eager"]).
    TILES 2: the program takes two consecutive [BLOCK_V, dk] tiles, both loads issued before
    either is used (twice the bytes in flight per program at the registers of one fp32 tile
    plus one raw tile), the step's inputs loaded and normalised once for both."""
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kh = h // (HV // HK)
    rows = pid_v * (BLOCK_V * TILES) + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    o_ptrs = o_ptr + b * sob + h * soh + rows
    slot = tl.load(idx_ptr + b)
    if slot < 0:
        for t in tl.static_range(TILES):
            tl.store(o_ptrs + t * BLOCK_V, cast(tl.zeros([BLOCK_V], tl.float32), o_ptr.dtype.element_ty, INTERP),
                     mask=rmask & (rows + t * BLOCK_V < DV))
    else:
        slot64 = slot.to(tl.int64)
        row_off, tile, mask2 = _tile_at(slot64, h, rows, rmask, cols, cmask, HV, DV, DK)
        if TILES == 1:
            S = tl.load(s_ptr + tile, mask=mask2, other=0.0, eviction_policy=LOAD_EV).to(tl.float32)
            S, o = _eager_tile(S, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols, cmask,
                               sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
            tl.store(s_ptr + tile, cast(S, s_ptr.dtype.element_ty, INTERP), mask=mask2, eviction_policy=STORE_EV)
            tl.store(o_ptrs, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rmask)
        else:
            tl.static_assert(TILES == 2, "TILES: 1 or 2")
            rows1 = rows + BLOCK_V
            rmask1 = rows1 < DV
            mask21 = rmask1[:, None] & cmask[None, :]
            tile1 = tile + BLOCK_V * DK
            raw0 = tl.load(s_ptr + tile, mask=mask2, other=0.0, eviction_policy=LOAD_EV)
            raw1 = tl.load(s_ptr + tile1, mask=mask21, other=0.0, eviction_policy=LOAD_EV)
            kn, qn, vv, alpha, bt = _eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols,
                                                  cmask, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
            S, o = _eager_update(raw0.to(tl.float32), kn, qn, vv, alpha, bt)
            tl.store(s_ptr + tile, cast(S, s_ptr.dtype.element_ty, INTERP), mask=mask2, eviction_policy=STORE_EV)
            tl.store(o_ptrs, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rmask)
            vv1 = tl.load(v_ptr + b * svb + h * svh + rows1, mask=rmask1, other=0.0).to(tl.float32)
            S, o = _eager_update(raw1.to(tl.float32), kn, qn, vv1, alpha, bt)
            tl.store(s_ptr + tile1, cast(S, s_ptr.dtype.element_ty, INTERP), mask=mask21, eviction_policy=STORE_EV)
            tl.store(o_ptrs + BLOCK_V, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rmask1)


@triton.jit
def _eager_tile(S, q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols, cmask,
                sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS: tl.constexpr):
    """One eager step of the fp32 tile S [BLOCK_V, BLOCK_K] (rows `rows` of value head h, batch
    row b): returns (S', o [BLOCK_V]) with sk = S k, sq = S q (one pass), u = beta (v - alpha sk),
    S' = alpha S + u k^T, o = S' q = alpha sq + u (k . q)."""
    kn, qn, vv, alpha, bt = _eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols, cmask,
                                          sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
    return _eager_update(S, kn, qn, vv, alpha, bt)


@triton.jit
def _eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols, cmask,
                  sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS: tl.constexpr):
    """The step's inputs for one tile: normalised k [BLOCK_K], q [BLOCK_K] (times scale),
    v [BLOCK_V], alpha = exp(g) and beta (scalars), all fp32."""
    kn = tl.load(k_ptr + b * skb + kh * skh + cols, mask=cmask, other=0.0).to(tl.float32)
    kn = kn * tl.rsqrt(tl.sum(kn * kn, 0) + EPS)
    qn = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cmask, other=0.0).to(tl.float32)
    qn = qn * (tl.rsqrt(tl.sum(qn * qn, 0) + EPS) * scale)
    vv = tl.load(v_ptr + b * svb + h * svh + rows, mask=rmask, other=0.0).to(tl.float32)
    alpha = tl.exp(tl.load(g_ptr + b * sgb + h * sgh).to(tl.float32))
    bt = tl.load(beta_ptr + b * sbb + h * sbh).to(tl.float32)
    return kn, qn, vv, alpha, bt


@triton.jit
def _eager_update(S, kn, qn, vv, alpha, bt):
    """(S', o) of one eager step of the tile S from its inputs (see _eager_tile)."""
    sk = tl.sum(S * kn[None, :], 1)
    sq = tl.sum(S * qn[None, :], 1)
    u = bt * (vv - alpha * sk)
    return alpha * S + u[:, None] * kn[None, :], alpha * sq + u * tl.sum(kn * qn, 0)


@triton.jit
def _gdn_replay_eager_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, hi_ptr, cur_ptr,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale, nprog,
    # from here on what the steady state (n = 0) never reads (fp8 scales, the buffer): the eager
    # kernel's arguments first took a launch from 3.98 to 3.90 us, the eager kernel's time
    # (Qwen3.5-122B batch 1, in a CUDA graph: graph_profile_s16_params.txt). No low copy: the
    # route never writes it (dual: LO_STALE).
    hi_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    HI_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
    PENDING_CALL: tl.constexpr = False, LOAD_EV: tl.constexpr = _EVICT_FIRST, STORE_EV: tl.constexpr = _EVICT_FIRST,
):
    """The replay step's eager route (EAGER_ROUTE, a small-batch route): a flush at every step,
    with eager's traffic and latency. One [BLOCK_V, dk] tile of the HIGH checkpoint per program.

    n = cursor, read with a plain load beside the state's. The eager step on the tile, written
    to the high copy, o = S' q. Dual: the low copy is not written; the cursor word says it is
    stale (LO_STALE, stored once by each program that finds the bit clear: the same value, and
    concurrent readers see n = 0 either way), and the next buffered step flushes, refreshing it.
    n > 0 (entries a buffered-route step left): the step is taken from the tile with them
    folded in first, as a flush folds them (_fold; dual: u recomputed against the high state),
    then the program counts itself in with a ticket (cursor high bits); the last program resets
    the cursor to 0 (dual: LO_STALE). Every program has read n before that (it reads before its
    own ticket), so all agree on n. The steady state (n = 0) is computed ahead of the branch on
    n and the rare path redoes it from a second read of the tile (see the comment in the body);
    PENDING_CALL: the rare path is a call (_route_pending), which holds fewer registers.
    Nothing is appended and, at n = 0, no atomic happens: the state stays consistent for steps
    of either route. LOAD_EV / STORE_EV: as the eager kernel's, for the high copy's tile."""
    pid_v, h, b, kh, rows, rmask, cols, cmask, o_ptrs = _route_coords(o_ptr, sob, soh, HV, HK, DK, DV, BLOCK_V,
                                                                       BLOCK_K)
    slot = tl.load(idx_ptr + b)
    if slot < 0:
        tl.store(o_ptrs, cast(tl.zeros([BLOCK_V], tl.float32), o_ptr.dtype.element_ty, INTERP), mask=rmask)
    else:
        slot64 = slot.to(tl.int64)
        row_off, tile, mask2 = _tile_at(slot64, h, rows, rmask, cols, cmask, HV, DV, DK)
        S = _ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8, LOAD_EV)
        word = tl.load(cur_ptr + slot64)
        n = word & _CUR_MASK
        kn, qn, vv, alpha, bt = _eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols,
                                              cmask, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
        # The steady state (n = 0) runs the eager kernel's step as it is, and only then branches
        # on n. With the step after the branch, ptxas issued the tile's loads after the inputs'
        # round trip (their norms): one DRAM latency more per launch than the eager kernel
        # (Qwen3.5-4B batch 1, in a CUDA graph: 3.24 vs 2.87 us).
        # Each branch stores its own results: a phi of the two would be stored through a layout
        # conversion in shared memory, behind a barrier, that the eager kernel does not have.
        S, o = _eager_update(S, kn, qn, vv, alpha, bt)
        if n > 0:
            # pending entries (rare: after a route switch): the step again, from the tile as
            # stored (nothing is written before this branch) with the entries folded in first
            if PENDING_CALL:
                _route_pending(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, hi_ptr, hi_sc_ptr, cur_ptr,
                               ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb,
                               sbh, sob, soh, scale, nprog, pid_v, h, b, slot64, n,
                               HV, HK, DK, DV, L, BLOCK_V, BLOCK_K, HI_FP8, DUAL, INTERP, EPS, LOAD_EV, STORE_EV)
            else:   # inline, the steady path's inputs reused (fp32 tiles: spill-free under 56 registers)
                S = _ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8, LOAD_EV)
                S = _fold(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
                          HV, HK, DK, DV, L, DUAL, EPS)
                S, o = _eager_update(S, kn, qn, vv, alpha, bt)
                _route_store(hi_ptr, hi_sc_ptr, o_ptrs, tile, row_off, S, o, mask2, rmask, HI_FP8, INTERP, STORE_EV)
                _route_ticket(cur_ptr, slot64, nprog, DUAL)
        else:
            _route_store(hi_ptr, hi_sc_ptr, o_ptrs, tile, row_off, S, o, mask2, rmask, HI_FP8, INTERP, STORE_EV)
            if DUAL:
                if word == 0:
                    tl.store(cur_ptr + slot64, _LO_STALE)


@triton.jit
def _route_coords(o_ptr, sob, soh, HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                  BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr):
    """A small-batch route program's place, grid (cdiv(dv, BLOCK_V), Hv, batch): (pid_v, value
    head h, batch row b, key head kh, rows [BLOCK_V] and their mask, cols [BLOCK_K] and their
    mask, the output row pointers)."""
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    cols = tl.arange(0, BLOCK_K)
    return pid_v, h, b, h // (HV // HK), rows, rows < DV, cols, cols < DK, o_ptr + b * sob + h * soh + rows


@triton.jit(noinline=True)
def _route_pending(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, hi_ptr, hi_sc_ptr, cur_ptr,
                   ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh,
                   sob, soh, scale, nprog, pid_v, h, b, slot64, n,
                   HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
                   BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, HI_FP8: tl.constexpr, DUAL: tl.constexpr,
                   INTERP: tl.constexpr, EPS: tl.constexpr, LOAD_EV: tl.constexpr, STORE_EV: tl.constexpr):
    """The eager route's rare path (n > 0 pending entries) as a call (PENDING_CALL): the tile
    re-read, the entries folded (_fold), the inputs re-read, the step, the writes and the
    cursor ticket. Scalar arguments only (noinline): no tile of the steady path is live across
    it. sm_90, bf16 state, 8 rows x 1 warp: 95 registers instead of the inline form's 127."""
    kh = h // (HV // HK)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    S, tile, row_off, mask2 = _folded_tile(hi_ptr, hi_sc_ptr, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, slot64, h, kh, n,
                                           rows, rmask, cols, cmask, HV, HK, DK, DV, L, HI_FP8, DUAL, EPS, LOAD_EV)
    kn, qn, vv, alpha, bt = _eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols,
                                          cmask, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
    S, o = _eager_update(S, kn, qn, vv, alpha, bt)
    _route_store(hi_ptr, hi_sc_ptr, o_ptr + b * sob + h * soh + rows, tile, row_off, S, o, mask2, rmask, HI_FP8,
                 INTERP, STORE_EV)
    _route_ticket(cur_ptr, slot64, nprog, DUAL)


@triton.jit
def _route_ticket(cur_ptr, slot64, nprog, DUAL: tl.constexpr):
    """The rare path's cursor move: a ticket each; the last program stores 0 (dual: LO_STALE)."""
    old = tl.atomic_add(cur_ptr + slot64, _TICKET, sem="relaxed")
    if (old >> 16) == nprog - 1:
        tl.atomic_xchg(cur_ptr + slot64, _LO_STALE if DUAL else 0, sem="relaxed")


@triton.jit
def _route_store(hi_ptr, hi_sc_ptr, o_ptrs, tile, row_off, S, o, mask2, rmask,
                 HI_FP8: tl.constexpr, INTERP: tl.constexpr, EV: tl.constexpr = _EVICT_FIRST):
    """The eager route's writes: the tile S to the high copy (eviction policy EV), o [BLOCK_V]."""
    _ckpt_store(hi_ptr, hi_sc_ptr, tile, row_off, S, mask2, rmask, HI_FP8, INTERP, EV)
    tl.store(o_ptrs, cast(o, o_ptrs.dtype.element_ty, INTERP), mask=rmask)


@triton.jit
def _gdn_route_defer_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, hi_ptr, cur_ptr, ep_ptr,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale, nprog,
    hi_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    HI_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr, RK: tl.constexpr,
    EP_ROWS: tl.constexpr, LOAD_EV: tl.constexpr = _EVICT_FIRST, STORE_EV: tl.constexpr = _EVICT_FIRST,
):
    """The small-batch route with period RK >= 2 (ROUTE_K): the state is written at every
    RK-th step only. One [BLOCK_V, dk] tile of the HIGH checkpoint per program, as the eager
    route; at cursor n < RK the tile gets entries 0..n-1 folded in (stored u; dual: u
    recomputed against it), then this step: o = S' q; n + 1 = RK: S' written, cursor 0; else
    the entry appended at n (u, k, g; dual: v, beta), cursor n + 1. So the route moves the
    state's read and 1/RK of its write a step, against eager's read and write.

    The cursor moves without a ticket (state.py, "the route's epoch"): program (0, 0) of the
    sequence stores (e' << 8) | n' (dual: | LO_STALE), e' = ep % 127 + 1, where ep is the epoch
    the program's rows last saw (route_epoch, ep_ptr: one byte per 4 rows); every program
    stores e' there. A program reading epoch ep sees the word from before the launch; epoch
    e' is a sibling's store, whose count n' came from n by n -> (n + 1) mod RK. Any other word
    (epoch 0: another op moved the cursor; or n >= RK) takes the rare path: entries 0..n-1
    folded, this step, S' written, and a ticket each; the last program stores epoch 1, count 0.
    Every program has read the word before its own ticket, so all agree on the path and on n.
    The steady step is computed ahead of the branch on the path (see _gdn_replay_eager_kernel)."""
    tl.static_assert(BLOCK_V % EP_ROWS == 0, "BLOCK_V: a multiple of EP_ROWS (state.EPOCH_ROWS)")
    NE: tl.constexpr = (DV + EP_ROWS - 1) // EP_ROWS
    EW: tl.constexpr = BLOCK_V // EP_ROWS
    pid_v, h, b, kh, rows, rmask, cols, cmask, o_ptrs = _route_coords(o_ptr, sob, soh, HV, HK, DK, DV, BLOCK_V,
                                                                       BLOCK_K)
    slot = tl.load(idx_ptr + b)
    if slot < 0:
        tl.store(o_ptrs, cast(tl.zeros([BLOCK_V], tl.float32), o_ptr.dtype.element_ty, INTERP), mask=rmask)
    else:
        slot64 = slot.to(tl.int64)
        row_off, tile, mask2 = _tile_at(slot64, h, rows, rmask, cols, cmask, HV, DV, DK)
        S0 = _ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8, LOAD_EV)
        word = tl.load(cur_ptr + slot64)
        ep_at = ep_ptr + (slot64 * HV + h) * NE + pid_v * EW
        ep = tl.load(ep_at).to(tl.int32)
        kn, qn, vv, alpha, bt = _eager_inputs(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, b, h, kh, rows, rmask, cols,
                                              cmask, sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, scale, EPS)
        fast, n, nw, e_next = route_word(word, ep, RK)
        # the steady step, whatever the path (its loads issue first: see the eager route)
        S = _fold_few(S0, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
                      HV, HK, DK, DV, L, DUAL, EPS, RK - 1)
        u = bt * (vv - alpha * tl.sum(S * kn[None, :], 1))
        S = alpha * S + u[:, None] * kn[None, :]
        o = tl.sum(S * qn[None, :], 1)
        ep_new = e_next
        if fast:
            _route_finish(S, u, o, n, o_ptrs, hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, rows, cols, cmask,
                          ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, k_ptr, g_ptr, b, h, kh, slot64, vv, bt,
                          skb, skh, sgb, sgh, HV, HK, DK, DV, L, HI_FP8, DUAL, INTERP, RK, STORE_EV)
            if (pid_v == 0) & (h == 0):
                tl.store(cur_ptr + slot64, route_next_word(n, e_next, RK, DUAL))
        else:
            # the rare path: the step again from the tile with every entry the word counts folded
            # in; the cursor by ticket, the last program storing epoch 1
            S = _fold(S0, slot64, h, kh, nw, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
                      HV, HK, DK, DV, L, DUAL, EPS)
            u = bt * (vv - alpha * tl.sum(S * kn[None, :], 1))
            S = alpha * S + u[:, None] * kn[None, :]
            o = tl.sum(S * qn[None, :], 1)
            _route_finish(S, u, o, nw, o_ptrs, hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, rows, cols, cmask,
                          ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, k_ptr, g_ptr, b, h, kh, slot64, vv, bt,
                          skb, skh, sgb, sgh, HV, HK, DK, DV, L, HI_FP8, DUAL, INTERP, RK, STORE_EV)
            ep_new = 1
            route_ticket(cur_ptr + slot64, nprog, nw, RK, DUAL)
        ew = tl.arange(0, EW)
        tl.store(ep_at + ew, tl.full([EW], 0, tl.int8) + ep_new.to(tl.int8),
                 mask=pid_v * BLOCK_V + ew * EP_ROWS < DV)


@triton.jit
def _route_finish(S, u, o, n, o_ptrs, hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, rows, cols, cmask,
                  ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, k_ptr, g_ptr, b, h, kh, slot64, vv, bt,
                  skb, skh, sgb, sgh, HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr,
                  L: tl.constexpr, HI_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, RK: tl.constexpr,
                  STORE_EV: tl.constexpr):
    """The deferred route's writes of a step taken at count n: n + 1 >= RK: the tile S to the
    high copy; else entry n of the buffer (u rows; dual: v rows; program 0 of the head: g (dual:
    beta); of the key head's first value head: k). Then o [BLOCK_V]."""
    if n + 1 >= RK:
        _ckpt_store(hi_ptr, hi_sc_ptr, tile, row_off, S, mask2, rmask, HI_FP8, INTERP, STORE_EV)
    else:
        ent = slot64 * L + n
        tl.store(ub_ptr + (ent * HV + h) * DV + rows, u, mask=rmask)
        if DUAL:
            tl.store(vb_ptr + (ent * HV + h) * DV + rows, cast(vv, vb_ptr.dtype.element_ty, INTERP), mask=rmask)
        if tl.program_id(0) == 0:
            tl.store(gb_ptr + ent * HV + h, tl.load(g_ptr + b * sgb + h * sgh).to(tl.float32))
            if DUAL:
                tl.store(bb_ptr + ent * HV + h, bt)
            if h % (HV // HK) == 0:
                k_raw = tl.load(k_ptr + b * skb + kh * skh + cols, mask=cmask, other=0.0)
                tl.store(kb_ptr + (ent * HK + kh) * DK + cols, cast(k_raw.to(tl.float32), kb_ptr.dtype.element_ty,
                                                                    INTERP), mask=cmask)
    tl.store(o_ptrs, cast(o, o_ptrs.dtype.element_ty, INTERP), mask=rmask)


@triton.jit
def _fold_few(S, slot64, h, kh, n, rows, rmask, cols, cmask, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr,
              HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
              DUAL: tl.constexpr, EPS: tl.constexpr, NMAX: tl.constexpr):
    """_fold of entries 0..n-1, n <= NMAX, unrolled and without branches. Every entry < NMAX is
    loaded whatever n is (its addresses do not depend on the cursor, so the loads issue with the
    tile's instead of a round trip after the cursor's: at batch 1, with the loads masked by
    i < n, the route ran 3.5-3.9 us against eager's 3.0, probe_layers_s30a.txt); an entry i >= n
    (whatever its rows hold) is then replaced by decay 1 and u 0, so it leaves S as it is."""
    for i in tl.static_range(NMAX):
        ok = i < n
        e = slot64 * L + i
        gi = tl.load(gb_ptr + e * HV + h).to(tl.float32)
        ki = tl.load(kb_ptr + (e * HK + kh) * DK + cols, mask=cmask, other=0.0).to(tl.float32)
        if DUAL:
            vi = tl.load(vb_ptr + (e * HV + h) * DV + rows, mask=rmask, other=0.0).to(tl.float32)
            bi = tl.load(bb_ptr + e * HV + h).to(tl.float32)
        else:
            ui = tl.load(ub_ptr + (e * HV + h) * DV + rows, mask=rmask, other=0.0).to(tl.float32)
        ai = tl.where(ok, tl.exp(tl.where(ok, gi, 0.0)), 1.0)
        ki = tl.where(ok, ki, 0.0)
        ki = ki * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)
        if DUAL:
            ui = tl.where(ok, bi, 0.0) * (tl.where(ok, vi, 0.0) - ai * tl.sum(S * ki[None, :], 1))
        else:
            ui = tl.where(ok, ui, 0.0)
        S = ai * S + ui[:, None] * ki[None, :]
    return S


# ----------------------------------------------------------------------------- replay
@triton.jit
def _opaque(x, INTERP: tl.constexpr):
    """int32 identity the compiler cannot see through. Indexing the buffered u rows with it
    hides their contiguity, so their [rows, entries] tile gets a plain layout instead of one
    vectorised along the rows, and Triton then converts the small per-row sums into the state
    chunk's layout rather than the whole chunk into theirs. No-op when interpreting."""
    if not INTERP:
        x = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.int32, is_pure=True, pack=1)
    return x


@triton.jit
def _hint_chunk(ptr, slot64, h0, r0, c, ar, HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr,
                NR: tl.constexpr, BLOCK_R: tl.constexpr, LPR: tl.constexpr, LS: tl.constexpr, PF: tl.constexpr,
                INTERP: tl.constexpr):
    """Prefetch hint (PF) for chunk c of a program's state copy: value head h0 + c // NR, rows
    r0 + (c % NR) * BLOCK_R + ar (clamped to the head) of sequence slot64, DK elements a row."""
    if not INTERP:
        prefetch_hint(ptr, ((slot64 * HV + h0 + c // NR) * DV + tl.minimum(r0 + (c % NR) * BLOCK_R + ar, DV - 1)) * DK,
                      LPR, LS, PF, INTERP)


@triton.jit
def _rd_dots(rd_ptr, rd_desc, row, row0, rm, cp, kn_0, kn_1, kn_2, kn_3, qn_0, qn_1, qn_2, qn_3,
             DK: tl.constexpr, PK: tl.constexpr, RD_KIND: tl.constexpr, TMA: tl.constexpr, INTERP: tl.constexpr):
    """(S k, S q) [R] of the state rows `row` [R] (row indices into [*, DK]) of the read copy.

    PK > 1 (16- and 8-bit copies): read as int32 words of PK elements and unpacked to fp32 with
    bit operations (bf16) or cvt (fp16, fp8 e4m3); phase t holds the columns PK j + t and is
    dotted with the matching phase of k and q (kn_t, qn_t). The words are laid out like an
    fp32 tile (16-byte vectors, the row sums within a warp); loaded in their own dtype and
    widened, Triton would move the whole chunk through shared memory into another layout
    (it hoists the layout conversion above the widening). RD_KIND: 0 fp32/fp64, 1 bf16, 2 fp16, 3 fp8.
    TMA: the rows come through rd_desc, a TMA descriptor over the copy as [rows, DK] (fp32) or
    [rows, DK / PK] int32 words, block [R, that width], from row row0 (int32; rows past the head
    are read from the next one and never stored): one copy instruction per chunk and no address
    registers (session 24). Under the interpreter fp16 / fp8 words keep their strided loads.
    """
    DW: tl.constexpr = DK // PK
    m2 = rm[:, None] & (cp < DW)[None, :]
    if PK == 1:
        if TMA:
            Sf = rd_desc.load([row0, 0]).to(tl.float32)
        else:
            Sf = tl.load(rd_ptr + row[:, None] * DK + cp[None, :], mask=m2, other=0.0,
                         eviction_policy="evict_first").to(tl.float32)
        Pk = Sf * kn_0[None, :]
        Pq = Sf * qn_0[None, :]
    else:
        if INTERP and RD_KIND != 1:   # no inline asm under the interpreter: strided element loads
            base = rd_ptr + row[:, None] * DK + cp[None, :] * PK
            S0 = tl.load(base, mask=m2, other=0.0).to(tl.float32)
            S1 = tl.load(base + 1, mask=m2, other=0.0).to(tl.float32)
            if PK == 4:
                S2 = tl.load(base + 2, mask=m2, other=0.0).to(tl.float32)
                S3 = tl.load(base + 3, mask=m2, other=0.0).to(tl.float32)
        else:
            if TMA:
                W = rd_desc.load([row0, 0])
            else:
                W = tl.load(rd_ptr.to(tl.pointer_type(tl.int32)) + row[:, None] * DW + cp[None, :], mask=m2, other=0,
                            eviction_policy="evict_first")
            if RD_KIND == 1:
                S0 = (W << 16).to(tl.float32, bitcast=True)
                S1 = (W & -65536).to(tl.float32, bitcast=True)
            elif RD_KIND == 2:
                S0, S1 = tl.inline_asm_elementwise(
                    "{ .reg .b16 a, b; mov.b32 {a, b}, $2; cvt.f32.f16 $0, a; cvt.f32.f16 $1, b; }",
                    "=r,=r,r", [W], dtype=(tl.float32, tl.float32), is_pure=True, pack=1)
            else:
                S0, S1, S2, S3 = tl.inline_asm_elementwise(
                    "{ .reg .b16 lo, hi, a, b, c, d; .reg .b32 x, y; mov.b32 {lo, hi}, $4;"
                    " cvt.rn.f16x2.e4m3x2 x, lo; cvt.rn.f16x2.e4m3x2 y, hi; mov.b32 {a, b}, x; mov.b32 {c, d}, y;"
                    " cvt.f32.f16 $0, a; cvt.f32.f16 $1, b; cvt.f32.f16 $2, c; cvt.f32.f16 $3, d; }",
                    "=r,=r,=r,=r,r", [W], dtype=(tl.float32, tl.float32, tl.float32, tl.float32), is_pure=True,
                    pack=1)
        Pk = S0 * kn_0[None, :] + S1 * kn_1[None, :]
        Pq = S0 * qn_0[None, :] + S1 * qn_1[None, :]
        if PK == 4:
            Pk += S2 * kn_2[None, :] + S3 * kn_3[None, :]
            Pq += S2 * qn_2[None, :] + S3 * qn_3[None, :]
    return tl.sum(Pk, 1), tl.sum(Pq, 1)


# fp16 read copies (RD_MMA): k and q scaled by 2^12 before their split into fp16 terms, so that
# the third term of a unit-norm vector's components stays clear of fp16's subnormals; the
# products come back scaled by 2^-12 (exact: powers of two)
_F16_KQ_SCALE = tl.constexpr(4096.0)


@triton.jit
def _f16_split3(a):
    """(hi, mid, lo) fp16 with a ~= hi + mid + lo: |a - hi - mid - lo| <= 2^-33 |a| while the
    terms are normal fp16 (lo ~ 2^-22 |a| >= 2^-14: |a| >= 2^8, i.e. components of a unit
    vector scaled by _F16_KQ_SCALE down to 2^-4; below, lo's subnormal rounding still errs by
    less than 2^-24 of the scaled vector's norm)."""
    hi = a.to(tl.float16)
    r = a - hi.to(tl.float32)
    mid = r.to(tl.float16)
    return hi, mid, (r - mid.to(tl.float32)).to(tl.float16)


@triton.jit
def _kq_operand(kn, qn, F16: tl.constexpr, INTERP: tl.constexpr):
    """[BLOCK_K, 16] second operand of _rd_dots_mma: columns 0-2 the normalised k [BLOCK_K] as
    three terms of the read copy's dtype (bf16: mma.bf16_split3, their sum is k to 2^-24; fp16
    (F16): _f16_split3 of k * _F16_KQ_SCALE), columns 3-5 q's, the rest 0. In that dtype (fp32
    holding the same values under the interpreter, whose 16-bit dots are wrong)."""
    c = tl.arange(0, 16)[None, :]
    if F16:
        k0, k1, k2 = _f16_split3(kn * _F16_KQ_SCALE)
        q0, q1, q2 = _f16_split3(qn * _F16_KQ_SCALE)
    else:
        k0, k1, k2 = bf16_split3(kn, INTERP, "bf16x3e")
        q0, q1, q2 = bf16_split3(qn, INTERP, "bf16x3e")
    kq = tl.where(c == 0, k0.to(tl.float32)[:, None], 0.0)
    kq = tl.where(c == 1, k1.to(tl.float32)[:, None], kq)
    kq = tl.where(c == 2, k2.to(tl.float32)[:, None], kq)
    kq = tl.where(c == 3, q0.to(tl.float32)[:, None], kq)
    kq = tl.where(c == 4, q1.to(tl.float32)[:, None], kq)
    kq = tl.where(c == 5, q2.to(tl.float32)[:, None], kq)
    if not INTERP:
        kq = kq.to(tl.float16 if F16 else tl.bfloat16)
    return kq


@triton.jit
def _rd_dots_mma(rd_ptr, rd_desc, row, row0, rm, cols, KQ, DK: tl.constexpr, F16: tl.constexpr, TMA: tl.constexpr,
                 INTERP: tl.constexpr):
    """(S k, S q) [R] of the 16-bit read copy's rows `row` as one tensor-core product (RD_MMA,
    session 26): the chunk [R, BLOCK_K] (bf16, or fp16 with F16), read through rd_desc (a TMA
    descriptor over the copy as [rows, DK] elements, from row row0) or pointers, times KQ
    (_kq_operand) -> [R, 16] fp32, then k's three columns summed and q's. Every product is
    exact (16 x 16 bits in fp32) and the terms of k and q sum to them within 2^-24, so the dots
    keep fp32 accuracy. The chunk goes from the TMA copy's shared memory straight into the
    MMA: it never occupies registers and is never unpacked, which _rd_dots spends most of its
    registers and instructions on (the 16-bit output launch: 168 registers, 3 programs per SM,
    its warps mostly waiting on their one chunk in flight: Nsight Compute, session 26)."""
    if TMA:
        Sb = rd_desc.load([row0, 0])
    else:
        Sb = tl.load(rd_ptr + row[:, None] * DK + cols[None, :], mask=rm[:, None] & (cols < DK)[None, :], other=0.0,
                     eviction_policy="evict_first")
    if INTERP:
        P = tl.dot(Sb.to(tl.float32), KQ, input_precision="ieee")
    else:
        P = tl.dot(Sb, KQ)
    c = tl.arange(0, 16)[None, :]
    sk = tl.sum(tl.where(c < 3, P, 0.0), 1)
    sq = tl.sum(tl.where((c >= 3) & (c < 6), P, 0.0), 1)
    if F16:
        sk = sk * (1.0 / _F16_KQ_SCALE)
        sq = sq * (1.0 / _F16_KQ_SCALE)
    return sk, sq


@triton.jit
def _gdn_replay_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr,
    hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, cur_ptr, nxt_ptr, rd_desc,
    sqb, sqh, skb, skh, svb, svh, sgb, sgh, sbb, sbh, sob, soh,
    scale, flush_period, nprog,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, NR: tl.constexpr, HP: tl.constexpr,
    SPLIT: tl.constexpr, PREFETCH: tl.constexpr, PF: tl.constexpr, PF_DIST: tl.constexpr, PK: tl.constexpr,
    RD_KIND: tl.constexpr,
    RD_LPR: tl.constexpr, RD_LS: tl.constexpr, HI_LPR: tl.constexpr, HI_LS: tl.constexpr, U_LPR: tl.constexpr,
    HI_FP8: tl.constexpr, LO_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
    GDC: tl.constexpr = False, LOOP_STAGES: tl.constexpr = None, TMA: tl.constexpr = False,
    RD_MMA: tl.constexpr = False,
):
    """One ReplaySSM step. A program owns HP value heads (of one key head) x NR chunks of
    BLOCK_R rows of one sequence and streams its HP * NR chunks (state rows, buffered u rows,
    v) in one loop, with prefetch hints PF_DIST chunks ahead; what does not depend on the rows
    (the cursor ticket, q/k normalisation, the buffered keys and their dot products with k and
    q, every head's decay weights) is computed once per program. The state chunk keeps the
    layout it is loaded in (fp32 tile, or int32 words of a 16/8-bit copy: _rd_dots).

    n = cursor, c_i = g_0 + .. + g_i, C = c_{n-1}, w_i = exp(C - c_i) (i < n; every exponent <= 0).
    Output-only route, per chunk (fp8: the row scale multiplies the dot products):
        acc_k = sum_i w_i (k_i . k) u_i,  acc_q = sum_i w_i (k_i . q) u_i
        u = beta (v - alpha (e^C S_c k + acc_k)),  o = alpha (e^C S_c q + acc_q) + u (k . q)
    writes u and o, appends the entry (position n is read by no program of the launch).
    Flush step (n + 1 >= K), decided per sequence:
      non-dual: the output route, then the chunk is re-read as a plain tile (a cache hit) and
        S_t = alpha (e^C S_c + sum_i w_i u_i k_i^T) + u k^T (an unrolled loop over the entries,
        whose rows the route has just read), written back.
      dual: the HIGH chunks are streamed instead; u_0..u_{n-1} are recomputed against them in
        order (no u computed from the low copy enters the state), then this step eagerly;
        o from the high state; high and low copies written; u not stored (as the reference).
    PREFETCH: the buffer's addresses do not depend on the cursor (rows 0..BLOCK_L-1 are read
    whatever n is and rows >= n are zeroed with where), so these loads issue with the first
    chunk and the ticket instead of after the ticket returns; costs BLOCK_L - n extra rows.
    SPLIT: the output-only route alone (no flush code, which would cost every program registers,
    hence occupancy): a plain read of the cursor, n stored to nxt[b] (-1: padded row) for
    _gdn_flush_step_kernel, launched next, which folds, writes the state and moves the cursor.
    Dual flush steps only append here (their output comes from the high copy, in that kernel).
    Dual states flush also where the cursor word says the low copy is stale (LO_STALE, left by
    the eager route; then n = 0): the low copy is refreshed by that flush instead of read.
    GDC (SPLIT): lets that launch, a programmatic dependent, start early (it waits for this one).
    """
    gdc_release(GDC)
    GROUP: tl.constexpr = HV // HK
    RP: tl.constexpr = BLOCK_R * NR
    NRS: tl.constexpr = (DV + RP - 1) // RP
    NJ: tl.constexpr = HP * NR
    RD_FP8: tl.constexpr = LO_FP8 if DUAL else HI_FP8
    pid0 = tl.program_id(0)
    kh = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    hs = pid0 // NRS
    r0 = (pid0 % NRS) * RP
    h0 = kh * GROUP + hs * HP
    ar = tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    cp = tl.arange(0, BLOCK_K // PK)
    hidx = tl.arange(0, HP)
    ei = tl.arange(0, BLOCK_L)
    slot = tl.load(idx_ptr + b)
    if slot < 0:
        zero = cast(tl.zeros([BLOCK_R], tl.float32), o_ptr.dtype.element_ty, INTERP)
        for j in range(NJ):
            rr = r0 + (j % NR) * BLOCK_R + ar
            tl.store(o_ptr + b * sob + (h0 + j // NR) * soh + rr, zero, mask=rr < DV)
        if SPLIT:
            if (pid0 == 0) & (kh == 0):
                tl.store(nxt_ptr + b, -1)
    else:
        slot64 = slot.to(tl.int64)
        if DUAL:
            rd_ptr = lo_ptr
            rd_sc_ptr = lo_sc_ptr
        else:
            rd_ptr = hi_ptr
            rd_sc_ptr = hi_sc_ptr
        # 1. hints for the first chunks of the read copy (addresses independent of the cursor)
        for c in tl.static_range(PF_DIST):
            if c < NJ:
                _hint_chunk(rd_ptr, slot64, h0, r0, c, ar, HV, DV, DK, NR, BLOCK_R, RD_LPR, RD_LS, PF,
                            INTERP)
        # 2. the cursor: SPLIT: plain read (the flush-step kernel moves it); else the ticket
        #    (module docstring): low bits cursor, high bits programs so far
        if SPLIT:
            old = tl.load(cur_ptr + slot64)
        else:
            old = tl.atomic_add(cur_ptr + slot64, _TICKET, sem="relaxed")
        # 3. inputs: k, q (whole, and split by column phase for _rd_dots), per-head g, beta
        k_raw = tl.load(k_ptr + b * skb + kh * skh + cols, mask=cmask, other=0.0)
        qn = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cmask, other=0.0).to(tl.float32)
        if PK > 1:
            kq_in = k_ptr + b * skb + kh * skh + cp * PK
            qq_in = q_ptr + b * sqb + kh * sqh + cp * PK
            kn_0 = tl.load(kq_in, mask=cp * PK < DK, other=0.0).to(tl.float32)
            kn_1 = tl.load(kq_in + 1, mask=cp * PK + 1 < DK, other=0.0).to(tl.float32)
            qn_0 = tl.load(qq_in, mask=cp * PK < DK, other=0.0).to(tl.float32)
            qn_1 = tl.load(qq_in + 1, mask=cp * PK + 1 < DK, other=0.0).to(tl.float32)
            kn_2, kn_3, qn_2, qn_3 = kn_0, kn_1, qn_0, qn_1
            if PK == 4:
                kn_2 = tl.load(kq_in + 2, mask=cp * PK + 2 < DK, other=0.0).to(tl.float32)
                kn_3 = tl.load(kq_in + 3, mask=cp * PK + 3 < DK, other=0.0).to(tl.float32)
                qn_2 = tl.load(qq_in + 2, mask=cp * PK + 2 < DK, other=0.0).to(tl.float32)
                qn_3 = tl.load(qq_in + 3, mask=cp * PK + 3 < DK, other=0.0).to(tl.float32)
        g2 = tl.load(g_ptr + b * sgb + (h0 + hidx) * sgh).to(tl.float32)       # [HP]
        b2 = tl.load(beta_ptr + b * sbb + (h0 + hidx) * sbh).to(tl.float32)    # [HP]
        # 4. buffer: keys [BL, dk] and decays [HP, BL]
        e = slot64 * L + ei
        if PREFETCH:
            lm = ei < L
        else:
            lm = ei < (old & _CUR_MASK)
        kb = tl.load(kb_ptr + (e * HK + kh)[:, None] * DK + cols[None, :], mask=lm[:, None] & cmask[None, :],
                     other=0.0).to(tl.float32)
        G2 = tl.load(gb_ptr + (e * HV)[None, :] + (h0 + hidx)[:, None], mask=lm[None, :], other=0.0).to(tl.float32)
        n = old & _CUR_MASK
        do_flush = n + 1 >= flush_period
        if DUAL:    # a stale low copy (left by the eager route) is not read: this step flushes
            do_flush = do_flush | ((old & _LO_STALE) != 0)
        if SPLIT:
            if (pid0 == 0) & (kh == 0):
                tl.store(nxt_ptr + b, old & (_LO_STALE | _CUR_MASK))
        else:
            if (old >> 16) == nprog - 1:
                tl.atomic_xchg(cur_ptr + slot64, tl.where(do_flush, 0, n + 1), sem="relaxed")
        em = ei < n
        if PREFETCH:   # rows >= n may hold anything (even non-finite): zero them
            kb = tl.where(em[:, None], kb, 0.0)
            G2 = tl.where(em[None, :], G2, 0.0)
        kn = k_raw.to(tl.float32)
        k_inv = tl.rsqrt(tl.sum(kn * kn, 0) + EPS)
        q_inv = tl.rsqrt(tl.sum(qn * qn, 0) + EPS) * scale
        kn = kn * k_inv
        qn = qn * q_inv
        kq = tl.sum(kn * qn, 0)
        if PK > 1:
            kn_0, kn_1, kn_2, kn_3 = kn_0 * k_inv, kn_1 * k_inv, kn_2 * k_inv, kn_3 * k_inv
            qn_0, qn_1, qn_2, qn_3 = qn_0 * q_inv, qn_1 * q_inv, qn_2 * q_inv, qn_3 * q_inv
        else:
            kn_0, kn_1, kn_2, kn_3, qn_0, qn_1, qn_2, qn_3 = kn, kn, kn, kn, qn, qn, qn, qn
        if RD_MMA:   # k and q as one MMA operand, once per program (_rd_dots_mma)
            KQ = _kq_operand(kn, qn, RD_KIND == 2, INTERP)
        rn = tl.rsqrt(tl.sum(kb * kb, 1) + EPS)                                  # key norms [BL]
        kk_ = tl.sum(kb * kn[None, :], 1) * rn
        kq_ = tl.sum(kb * qn[None, :], 1) * rn
        C2 = tl.sum(G2, 1)                                                      # [HP]
        W2 = tl.where(em[None, :], tl.exp(C2[:, None] - tl.cumsum(G2, 1)), 0.0)  # [HP, BL]
        ec2 = tl.exp(C2)
        a2 = tl.exp(g2)
        ent = slot64 * L + n
        ok = n < L
        if PREFETCH:
            um = lm
        else:
            um = em

        if SPLIT and DUAL and do_flush:
            # ---- dual flush step, SPLIT: append v only (the flush-step kernel does the rest)
            for j in range(NJ):
                h = h0 + j // NR
                rr = r0 + (j % NR) * BLOCK_R + ar
                v_c = tl.load(v_ptr + b * svb + h * svh + rr, mask=rr < DV, other=0.0)
                tl.store(vb_ptr + (ent * HV + h) * DV + rr, cast(v_c.to(tl.float32), vb_ptr.dtype.element_ty, INTERP),
                         mask=(rr < DV) & ok)
        elif (not SPLIT) and DUAL and do_flush:
            # ---- dual flush: stream the HIGH chunks, recompute u_i against them, step, write both
            for c in tl.static_range(PF_DIST):
                if c < NJ:
                    _hint_chunk(hi_ptr, slot64, h0, r0, c, ar, HV, DV, DK, NR, BLOCK_R, HI_LPR, HI_LS, PF,
                                INTERP)
            for j in range(NJ):
                hh = j // NR
                h = h0 + hh
                rr = r0 + (j % NR) * BLOCK_R + ar
                rm = rr < DV
                row = (slot64 * HV + h) * DV + rr
                cn = j + PF_DIST
                if cn < NJ:
                    _hint_chunk(hi_ptr, slot64, h0, r0, cn, ar, HV, DV, DK, NR, BLOCK_R, HI_LPR, HI_LS, PF,
                                INTERP)
                # this chunk's raw v rows: the entry loop below reads them (hinted into L1 now)
                if not INTERP:
                    prefetch_hint(vb_ptr, ((slot64 * L + ei) * HV + h) * DV + r0 + (j % NR) * BLOCK_R, 1, 1, 2,
                                  INTERP)
                S = tl.load(hi_ptr + row[:, None] * DK + cols[None, :], mask=rm[:, None] & cmask[None, :], other=0.0,
                            eviction_policy="evict_first").to(tl.float32)
                v_c = tl.load(v_ptr + b * svb + h * svh + rr, mask=rm, other=0.0).to(tl.float32)
                sel = hidx == hh
                al_h = tl.sum(tl.where(sel, a2, 0.0), 0)
                bt_h = tl.sum(tl.where(sel, b2, 0.0), 0)
                for i in range(BLOCK_L):     # dynamic: an unrolled loop hoists every entry's loads (registers)
                    i_ok = i < n
                    ei_ = (slot64 * L + i) * HV + h
                    ki = tl.load(kb_ptr + ((slot64 * L + i) * HK + kh) * DK + cols, mask=cmask & i_ok,
                                 other=0.0).to(tl.float32)
                    ki = ki * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)
                    vi = tl.load(vb_ptr + ei_ * DV + rr, mask=rm & i_ok, other=0.0).to(tl.float32)
                    # masked: BLOCK_L may exceed L (rows past the slot's, past the tensor for the last)
                    ai = tl.exp(tl.load(gb_ptr + ei_, mask=i_ok, other=0.0).to(tl.float32))
                    bi = tl.load(bb_ptr + ei_, mask=i_ok, other=0.0).to(tl.float32)
                    ui = bi * (vi - ai * tl.sum(S * ki[None, :], 1))
                    S = ai * S + ui[:, None] * ki[None, :]
                u = bt_h * (v_c - al_h * tl.sum(S * kn[None, :], 1))
                S = al_h * S + u[:, None] * kn[None, :]
                o = tl.sum(S * qn[None, :], 1)
                tile = row[:, None] * DK + cols[None, :]
                m2 = rm[:, None] & cmask[None, :]
                _ckpt_store(hi_ptr, hi_sc_ptr, tile, row, S, m2, rm, HI_FP8, INTERP)
                _ckpt_store(lo_ptr, lo_sc_ptr, tile, row, S, m2, rm, LO_FP8, INTERP)
                tl.store(o_ptr + b * sob + h * soh + rr, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rm)
                tl.store(vb_ptr + (ent * HV + h) * DV + rr, cast(v_c, vb_ptr.dtype.element_ty, INTERP), mask=rm & ok)
        else:
            # ---- output-only route (+ the non-dual fold on flush steps), chunk by chunk
            for j in tl.range(0, NJ, num_stages=LOOP_STAGES):
                hh = j // NR
                h = h0 + hh
                rs = r0 + (j % NR) * BLOCK_R
                rr = rs + ar
                rm = rr < DV
                row = (slot64 * HV + h) * DV + rr
                cn = j + PF_DIST
                if cn < NJ:
                    hn = h0 + cn // NR
                    rsn = r0 + (cn % NR) * BLOCK_R
                    if not INTERP:
                        prefetch_hint(rd_ptr, ((slot64 * HV + hn) * DV + tl.minimum(rsn + ar, DV - 1)) * DK,
                                      RD_LPR, RD_LS, PF, INTERP)
                    if not INTERP:
                        prefetch_hint(ub_ptr, tl.where(um, (e * HV + hn) * DV + rsn, (slot64 * L * HV + hn) * DV + rsn),
                                      U_LPR, 32, PF, INTERP)
                sel = hidx == hh
                w_h = tl.sum(tl.where(sel[:, None], W2, 0.0), 0)
                ec_h = tl.sum(tl.where(sel, ec2, 0.0), 0)
                al_h = tl.sum(tl.where(sel, a2, 0.0), 0)
                bt_h = tl.sum(tl.where(sel, b2, 0.0), 0)
                if RD_FP8:
                    sc_c = tl.load(rd_sc_ptr + row, mask=rm, other=1.0)
                U_c = tl.load(ub_ptr + ((e * HV + h) * DV)[None, :] + (rr if INTERP else _opaque(rr, INTERP))[:, None],
                              mask=um[None, :] & rm[:, None], other=0.0).to(tl.float32)     # [BR, BL]
                v_c = tl.load(v_ptr + b * svb + h * svh + rr, mask=rm, other=0.0).to(tl.float32)
                row0 = ((slot64 * HV + h) * DV + rs).to(tl.int32)    # the chunk's first row (TMA)
                if RD_MMA:
                    skc, sqc = _rd_dots_mma(rd_ptr, rd_desc, row, row0, rm, cols, KQ, DK, RD_KIND == 2, TMA, INTERP)
                else:
                    skc, sqc = _rd_dots(rd_ptr, rd_desc, row, row0, rm, cp, kn_0, kn_1, kn_2, kn_3, qn_0, qn_1, qn_2,
                                        qn_3, DK, PK, RD_KIND, TMA, INTERP)
                if RD_FP8:
                    skc = skc * sc_c
                    sqc = sqc * sc_c
                if PREFETCH:
                    U_c = tl.where(em[None, :], U_c, 0.0)
                bk = tl.sum(U_c * (w_h * kk_)[None, :], 1)
                bq = tl.sum(U_c * (w_h * kq_)[None, :], 1)
                u = bt_h * (v_c - al_h * (ec_h * skc + bk))
                o = al_h * (ec_h * sqc + bq) + u * kq
                if DUAL:
                    tl.store(vb_ptr + (ent * HV + h) * DV + rr, cast(v_c, vb_ptr.dtype.element_ty, INTERP),
                             mask=rm & ok)
                elif not SPLIT:
                    if do_flush:
                        # the checkpoint chunk again (just read: a cache hit), as a plain tile
                        S = tl.load(hi_ptr + row[:, None] * DK + cols[None, :], mask=rm[:, None] & cmask[None, :],
                                    other=0.0).to(tl.float32)
                        if HI_FP8:
                            S = S * sc_c[:, None]
                        S = ec_h * S
                        wrun = 1.0    # w_i = prod_{i < j < n} alpha_j, from the newest entry down
                        for ii in range(BLOCK_L):    # dynamic: an unrolled loop hoists every entry's loads
                            i = BLOCK_L - 1 - ii
                            i_ok = i < n
                            ei_ = (slot64 * L + i) * HV + h
                            ki = tl.load(kb_ptr + ((slot64 * L + i) * HK + kh) * DK + cols, mask=cmask & i_ok,
                                         other=0.0).to(tl.float32)
                            ui = tl.load(ub_ptr + ei_ * DV + rr, mask=rm & i_ok, other=0.0).to(tl.float32)
                            ci = tl.where(i_ok, wrun * tl.rsqrt(tl.sum(ki * ki, 0) + EPS), 0.0)
                            S += (ci * ui)[:, None] * ki[None, :]
                            wrun = wrun * tl.exp(tl.load(gb_ptr + ei_, mask=i_ok, other=0.0).to(tl.float32))
                        S = al_h * S + u[:, None] * kn[None, :]
                        _ckpt_store(hi_ptr, hi_sc_ptr, row[:, None] * DK + cols[None, :], row, S,
                                    rm[:, None] & cmask[None, :], rm, HI_FP8, INTERP)
                tl.store(ub_ptr + (ent * HV + h) * DV + rr, u, mask=rm & ok)
                tl.store(o_ptr + b * sob + h * soh + rr, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rm)
        # append the rest of entry n: k once per key head, g (and beta) once per head
        if r0 == 0:
            tl.store(gb_ptr + ent * HV + h0 + hidx, g2, mask=ok & (hidx < HP))
            if DUAL:
                tl.store(bb_ptr + ent * HV + h0 + hidx, b2, mask=ok & (hidx < HP))
            if hs == 0:
                tl.store(kb_ptr + (ent * HK + kh) * DK + cols, cast(k_raw.to(tl.float32), kb_ptr.dtype.element_ty,
                                                                    INTERP), mask=cmask & ok)


@triton.jit
def _stored_entry(F, wrun, i, n, slot64, h, kh, rr, rm, cols, cmask, ub_ptr, kb_ptr, gb_ptr,
                  HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
                  EPS: tl.constexpr):
    """F += w_i u_i k_i^T (k_i normalised) for entry i <= n, w_i = wrun; returns (F, wrun * alpha_i)."""
    i_ok = i <= n
    ei_ = (slot64 * L + i) * HV + h
    ki = tl.load(kb_ptr + ((slot64 * L + i) * HK + kh) * DK + cols, mask=cmask & i_ok, other=0.0).to(tl.float32)
    ui = tl.load(ub_ptr + ei_ * DV + rr, mask=rm & i_ok, other=0.0).to(tl.float32)
    F += ((wrun * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)) * ui)[:, None] * ki[None, :]
    wrun = tl.where(i_ok, wrun * tl.exp(tl.load(gb_ptr + ei_, mask=i_ok, other=0.0).to(tl.float32)), wrun)
    return F, wrun


@triton.jit
def _scan_flushing(nxt_ptr, idx_ptr, cur_ptr, batch, flush_period, w, writer, NW: tl.constexpr,
                   BLOCK_B: tl.constexpr, STALE: tl.constexpr):
    """The flushing rows of a SPLIT replay step, from nxt[b] = the cursor word row b had (-1:
    padded; this step's entry is at n = its count): rows with n + 1 >= K or a stale low copy
    (LO_STALE) flush, ranked in batch order. The programs with `writer` set (one per worker)
    write the cursors of rows b % NW == w: 0 after a flush, else n + 1. Returns (bb, nb, fl,
    rank, sl) over the BLOCK_B rows (nb: the counts, -1 padded; sl: their slots, loaded with
    the words so that a worker's row costs no further round trip) and this worker's count of
    ranks w, w + NW, ... STALE: a dual state (other states' words carry no LO_STALE bit)."""
    bb = tl.arange(0, BLOCK_B)
    word = tl.load(nxt_ptr + bb, mask=bb < batch, other=-1)
    sl = tl.load(idx_ptr + bb, mask=bb < batch, other=0)
    if STALE:
        nb = tl.where(word >= 0, word & _CUR_MASK, -1)
        fl = (nb >= 0) & ((nb + 1 >= flush_period) | ((word & _LO_STALE) != 0))
    else:
        nb = word
        fl = (nb >= 0) & (nb + 1 >= flush_period)
    rank = tl.cumsum(fl.to(tl.int32), 0) - 1
    if writer:
        mine = (nb >= 0) & (bb % NW == w)
        tl.store(cur_ptr + sl, tl.where(fl, 0, nb + 1), mask=mine)
    return bb, nb, fl, rank, sl, tl.sum((fl & (rank % NW == w)).to(tl.int32), 0)


@triton.jit
def _ranked_key(bb, nb, fl, rank, r):
    """(b << 16) | n of the flushing row of rank r (-1: none), from _scan_flushing (n < 2^16, b < 2^15)."""
    return tl.max(tl.where(fl & (rank == r), (bb << 16) | nb, -1), 0)


@triton.jit
def _ranked_slot(sl, fl, rank, r):
    """The state slot of the flushing row of rank r (-1: none), from _scan_flushing, as int32
    whatever the index dtype (int64 state indices too: the callers' loop-carried value is int32)."""
    return tl.max(tl.where(fl & (rank == r), sl, -1), 0).to(tl.int32)


@triton.jit
def _u_tile(ub_ptr, ent, h, rr, lm, HV: tl.constexpr, DV: tl.constexpr):
    """Stored u [rows rr, entries ent] (masked by lm, rows < DV) of value head h, fp32."""
    return tl.load(ub_ptr + (ent[None, :] * HV + h) * DV + rr[:, None], mask=(rr < DV)[:, None] & lm[None, :],
                   other=0.0).to(tl.float32)


@triton.jit
def _fold_keys(kb_ptr, ent, lm, kh, cols, cmask, HK: tl.constexpr, DK: tl.constexpr, EPS: tl.constexpr):
    """A folding row's raw keys kb [BL, BK] of key head kh (entries not in lm: 0), as fp32 kf,
    and rk = 1 / |k_i|: (kb, kf, rk)."""
    kb = tl.load(kb_ptr + (ent * HK + kh)[:, None] * DK + cols[None, :], mask=lm[:, None] & cmask[None, :],
                 other=0.0)
    kf = kb.to(tl.float32)
    return kb, kf, tl.rsqrt(tl.sum(kf * kf, 1) + EPS)


@triton.jit
def _fold_decays(gb_ptr, el, lm, rk):
    """A value head's decays over the folding entries (el = entry * HV + head; lm: entries
    0..n): (c [BL] the running sums of g, C_n their total, w_i = e^{C_n - c_i} / |k_i|, 0 past n)."""
    gl = tl.load(gb_ptr + el, mask=lm, other=0.0).to(tl.float32)
    cl = tl.cumsum(gl, 0)
    Cn = tl.sum(gl, 0)
    return cl, Cn, tl.where(lm, tl.exp(Cn - cl) * rk, 0.0)                     # exponents <= 0


@triton.jit
def _gdn_flush_step_kernel(
    q_ptr, o_ptr, idx_ptr, nxt_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, cur_ptr, hi_desc, lo_desc,
    sqb, sqh, sob, soh, scale, flush_period, batch,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, NR: tl.constexpr, HP: tl.constexpr,
    NW: tl.constexpr, BLOCK_B: tl.constexpr, PF: tl.constexpr, PF_DIST: tl.constexpr,
    HI_LPR: tl.constexpr, HI_LS: tl.constexpr,
    HI_FP8: tl.constexpr, LO_FP8: tl.constexpr, DUAL: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
    FOLD_MMA: tl.constexpr = False, BLOCK_L: tl.constexpr = 16, FOLD_PREC: tl.constexpr = "tf32x3",
    P_PREC: tl.constexpr = "tf32x3", SMALL_PREC: tl.constexpr = "tf32x3", GRAM_PREC: tl.constexpr = "tf32x3",
    WRITE_O: tl.constexpr = True, COMPACT: tl.constexpr = False, GDC: tl.constexpr = False,
    TMA: tl.constexpr = False, ST_TMA: tl.constexpr = False,
    LOAD_EV: tl.constexpr = _EVICT_FIRST, STORE_EV: tl.constexpr = _EVICT_FIRST,
):
    """Second launch of a SPLIT replay step: the flushes and the cursor moves. Also the
    speculative commit's fold (WRITE_O False: no output; nxt from _gdn_commit_cursor_kernel).

    nxt[b] = the cursor each batch row had (-1: padded), stored by the output-only launch,
    which also appended this step's entry at n. Rows with n + 1 >= K flush: NW workers per
    (head block, row block) share them out by rank (worker w takes the flushing rows of rank
    w, w + NW, ...; NW = cdiv(batch, K) covers a staggered batch in one round), and each folds
    entries 0..n (this step's included) into its HIGH chunks and writes them back:
      non-dual: S = e^{c_n} S_c + sum_{i<=n} e^{c_n - c_i} u_i k_i^T (stored u);
      dual: u_i recomputed in order against the high state, the low copy refreshed, and the
        output o = S q replaces the one the first launch computed from the low copy.
    The cursor of every live row is written once (worker block (0, 0)): 0 after a flush, else
    n + 1. Nothing is read that a program of this launch writes. Programs with nothing to
    fold exit after one load.
    FOLD_MMA (the default for high copies of 16 and 32 bits; the fp32 step 20 % faster on
    the H200, docs/kernels.md session 5): a worker visits only its own ranks (w, w + NW, ... <
    the number of flushing rows; one reduction each, not up to three for each of NT rank
    slots), and the fold is one matrix product per chunk, F = (U * w) Kb with U [rows, L] the
    u rows, w_i = e^{c_n - c_i} / |k_i| (0 past n) and Kb [L, dk] the raw keys (FOLD_PREC:
    since session 22 the tables' "bf16x3e" where the keys are bf16 / fp8, three bf16 terms of
    U * w against the keys as the bf16 operand, ~2^-23; else "tf32x3" ~2^-22
    for the replay step's flush, where the truncation split "tf32x2t" spilled at 32 rows x 4
    warps on sm_90 (session 5), and for the commit rows' FOLD_SPLIT mma.split_precision:
    "tf32x2t" ~2^-20 for keys exact in tf32, the fp32 side split, two passes), instead of L
    rank-1 updates that each reduce their key's norm across the program. Non-dual, U is the
    stored u. Dual, U is recomputed against the high chunk S_0 in closed form instead of entry
    by entry: with A_i = e^{c_i},
        u_j + sum_{m<j} M_mj u_m = beta_j (v_j - A_j S_0 k_j),  M_mj = beta_j e^{c_j - c_m} (k_m . k_j),
    so U = R (I + M)^-1 = R + R X with R [rows, L] from one product S_0 Kb^T (P_PREC) and
    X = (I + M)^-1 - I from the keys' Gram matrix (GRAM_PREC) once per head
    (_unit_tri_inv_minus_eye, SMALL_PREC) -- the algebra of the sequential recurrence, no
    low-copy value involved. Its rounding differs from the rank-1 fold's: on the H200
    (Qwen3.5-122B b256, three steps) the high copy agrees with the fp32 reference to 5.8e-6
    with "tf32x3" small products (rank-1: 4.5e-7; docs/kernels.md session 8), far inside the
    fp32 state tolerance. Per-head coefficients (decays, dual: M and X) are computed once per
    head and shared by its NR chunks.
    COMPACT (the commit): the cursor launch has already moved the cursors and listed the
    flushing rows, nxt[r] = (b << 16) | n for ranks r < nxt[batch] (their count); a worker
    reads only its own ranks' entries, no batch-wide scan (_gdn_commit_cursor_kernel).
    GDC: launched as a programmatic dependent (of the commit's cursor launch, or the step's
    output-only launch), it waits for the kernel ahead of it before any load, then lets a
    programmatic dependent behind it start early (the next layer's commit, in a model).
    TMA (16/32-bit high copies): the high chunks come through hi_desc, a TMA descriptor over
    the high copy as [rows, DK], block [BLOCK_R, BLOCK_K] (session 24).
    ST_TMA (with TMA, the matrix-product fold, chunks inside the head): the folded chunk goes
    out through hi_desc too and, dual with a 16-bit low copy, the low copy's through lo_desc
    (its descriptor, same block): a shared-memory write and one bulk copy per chunk instead
    of a layout conversion and a [rows, dk] tile of addresses per store.
    """
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    GROUP: tl.constexpr = HV // HK
    RP: tl.constexpr = BLOCK_R * NR
    NRS: tl.constexpr = (DV + RP - 1) // RP
    NJ: tl.constexpr = HP * NR
    NT: tl.constexpr = (BLOCK_B + NW - 1) // NW
    pid0 = tl.program_id(0)
    kh = tl.program_id(1)
    w = tl.program_id(2)
    hs = pid0 // NRS
    r0 = (pid0 % NRS) * RP
    h0 = kh * GROUP + hs * HP
    ar = tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    if COMPACT:
        n_mine = (tl.load(nxt_ptr + batch) - w + NW - 1) // NW       # this worker's ranks w, w + NW, ...
    else:   # (the rank-1 path below does not use n_mine)
        bb, nb, fl, rank, sl, n_mine = _scan_flushing(nxt_ptr, idx_ptr, cur_ptr, batch, flush_period, w,
                                                      (pid0 == 0) & (kh == 0), NW, BLOCK_B, DUAL)
    for t in range(NT):
        if COMPACT:
            key = n_mine * 0 - 1
            if t < n_mine:
                key = tl.load(nxt_ptr + w + t * NW)
            hit = key >= 0
        elif FOLD_MMA:   # past its own ranks a worker skips the reduction; one finds the row and its cursor
            key = n_mine * 0 - 1
            sk = key
            if t < n_mine:
                key = _ranked_key(bb, nb, fl, rank, w + t * NW)
                if not DUAL:    # (dual: the slots kept live cost the solve's tile a spill)
                    sk = _ranked_slot(sl, fl, rank, w + t * NW)
            hit = key >= 0
        else:
            pick = fl & (rank == w + t * NW)
            hit = tl.sum(pick.to(tl.int32), 0) > 0
        if hit:
            if FOLD_MMA or COMPACT:
                b = (key >> 16).to(tl.int64)
                n = key & 0xFFFF
            else:
                b = tl.sum(tl.where(pick, bb, 0), 0).to(tl.int64)
                n = tl.sum(tl.where(pick, nb, 0), 0)          # entries 0..n are folded
            if COMPACT or (DUAL and FOLD_MMA):
                slot64 = tl.load(idx_ptr + b).to(tl.int64)
            elif FOLD_MMA:
                slot64 = sk.to(tl.int64)
            else:
                slot64 = tl.sum(tl.where(pick, sl, 0), 0).to(tl.int64)
            if FOLD_MMA:   # per-sequence keys, shared by the chunks
                ll = tl.arange(0, BLOCK_L)
                lm = ll <= n
                ent = slot64 * L + ll
                kb, _, rk = _fold_keys(kb_ptr, ent, lm, kh, cols, cmask, HK, DK, EPS)   # mm converts kb
            if DUAL:
                if WRITE_O:
                    qn = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cmask, other=0.0).to(tl.float32)
                    qn = qn * (tl.rsqrt(tl.sum(qn * qn, 0) + EPS) * scale)
                if FOLD_MMA:   # k_m . k_j of the normalised keys [BL, BL] (rows / columns past n: 0)
                    KK = mm(kb, tl.trans(kb), GRAM_PREC, INTERP) * rk[:, None] * rk[None, :]
                    ups = (ll[:, None] < ll[None, :]) & lm[None, :]                      # m < j <= n
            for c in tl.static_range(PF_DIST):
                if c < NJ:
                    _hint_chunk(hi_ptr, slot64, h0, r0, c, ar, HV, DV, DK, NR, BLOCK_R, HI_LPR, HI_LS, PF,
                                INTERP)
            for hh in range(HP):
                h = h0 + hh
                if FOLD_MMA:   # per-head coefficients, shared by the head's NR chunks
                    el = ent * HV + h
                    cl, Cn, wl = _fold_decays(gb_ptr, el, lm, rk)
                    if DUAL:
                        bl = tl.load(bb_ptr + el, mask=lm, other=0.0).to(tl.float32)
                        M = tl.where(ups, bl[None, :] * tl.exp(tl.where(ups, cl[None, :] - cl[:, None], 0.0)) * KK,
                                     0.0)
                        X = _unit_tri_inv_minus_eye(M, BLOCK_L, SMALL_PREC, INTERP)   # (I + M)^-1 - I
                        rc = tl.exp(cl) * rk
                for jr in range(NR):
                    j = hh * NR + jr
                    rr = r0 + jr * BLOCK_R + ar
                    rm = rr < DV
                    row = (slot64 * HV + h) * DV + rr
                    cn = j + PF_DIST
                    if cn < NJ:
                        _hint_chunk(hi_ptr, slot64, h0, r0, cn, ar, HV, DV, DK, NR, BLOCK_R, HI_LPR, HI_LS, PF,
                                    INTERP)
                    tile = row[:, None] * DK + cols[None, :]
                    m2 = rm[:, None] & cmask[None, :]
                    trow = ((slot64 * HV + h) * DV + r0 + jr * BLOCK_R).to(tl.int32)   # TMA: the chunk's row
                    if TMA:
                        S = hi_desc.load([trow, 0]).to(tl.float32)
                    else:
                        S = _ckpt_load(hi_ptr, hi_sc_ptr, tile, row, m2, rm, HI_FP8, LOAD_EV)
                    if DUAL and FOLD_MMA:
                        V = tl.load(vb_ptr + el[None, :] * DV + rr[:, None], mask=rm[:, None] & lm[None, :],
                                    other=0.0).to(tl.float32)                      # [rows, BL] raw v
                        P = mm(S, tl.trans(kb), P_PREC, INTERP)                       # S_0 k_i (raw keys)
                        R_ = bl[None, :] * (V - rc[None, :] * P)
                        U = R_ + mm(R_, X, SMALL_PREC, INTERP)                     # R (I + M)^-1
                        S = tl.exp(Cn) * S + mm(U * wl[None, :], kb, FOLD_PREC, INTERP)
                        if WRITE_O:
                            o = tl.sum(S * qn[None, :], 1)
                            tl.store(o_ptr + b * sob + h * soh + rr, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rm)
                        if ST_TMA and not LO_FP8:
                            lo_desc.store([trow, 0], cast(S, lo_desc.dtype, INTERP))
                        else:
                            _ckpt_store(lo_ptr, lo_sc_ptr, tile, row, S, m2, rm, LO_FP8, INTERP)
                    elif DUAL:
                        for i in tl.static_range(L):    # unrolled: every entry's loads issue up front
                            i_ok = i <= n
                            ei_ = (slot64 * L + i) * HV + h
                            ki = tl.load(kb_ptr + ((slot64 * L + i) * HK + kh) * DK + cols, mask=cmask & i_ok,
                                         other=0.0).to(tl.float32)
                            ki = ki * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)
                            vi = tl.load(vb_ptr + ei_ * DV + rr, mask=rm & i_ok, other=0.0).to(tl.float32)
                            ai = tl.where(i_ok, tl.exp(tl.load(gb_ptr + ei_).to(tl.float32)), 1.0)
                            bi = tl.where(i_ok, tl.load(bb_ptr + ei_).to(tl.float32), 0.0)
                            ui = bi * (vi - ai * tl.sum(S * ki[None, :], 1))
                            S = ai * S + ui[:, None] * ki[None, :]
                        if WRITE_O:
                            o = tl.sum(S * qn[None, :], 1)
                            tl.store(o_ptr + b * sob + h * soh + rr, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rm)
                        _ckpt_store(lo_ptr, lo_sc_ptr, tile, row, S, m2, rm, LO_FP8, INTERP)
                    elif FOLD_MMA:
                        U = _u_tile(ub_ptr, ent, h, rr, lm, HV, DV)                    # [rows, BL] stored u
                        S = tl.exp(Cn) * S + mm(U * wl[None, :], kb, FOLD_PREC, INTERP)
                    else:
                        wrun = 1.0    # w_i = prod_{i < j <= n} alpha_j, from the newest entry down
                        F = tl.zeros([BLOCK_R, BLOCK_K], tl.float32)
                        if HI_FP8 or hi_ptr.dtype.element_ty.primitive_bitwidth < 32:   # (quantising stores need
                            # the registers: a rolled loop)
                            for ii in range(L):
                                F, wrun = _stored_entry(F, wrun, L - 1 - ii, n, slot64, h, kh, rr, rm, cols, cmask,
                                                        ub_ptr, kb_ptr, gb_ptr, HV, HK, DK, DV, L, EPS)
                        else:         # unrolled: every entry's loads issue up front
                            for ii in tl.static_range(L):
                                i = L - 1 - ii
                                i_ok = i <= n
                                ei_ = (slot64 * L + i) * HV + h
                                ki = tl.load(kb_ptr + ((slot64 * L + i) * HK + kh) * DK + cols, mask=cmask & i_ok,
                                             other=0.0).to(tl.float32)
                                ui = tl.load(ub_ptr + ei_ * DV + rr, mask=rm & i_ok, other=0.0).to(tl.float32)
                                F += ((wrun * tl.rsqrt(tl.sum(ki * ki, 0) + EPS)) * ui)[:, None] * ki[None, :]
                                wrun = tl.where(i_ok, wrun * tl.exp(tl.load(gb_ptr + ei_, mask=i_ok, other=0.0)
                                                                    .to(tl.float32)), wrun)
                        S = wrun * S + F
                    if ST_TMA:
                        hi_desc.store([trow, 0], cast(S, hi_desc.dtype, INTERP))
                    else:
                        _ckpt_store(hi_ptr, hi_sc_ptr, tile, row, S, m2, rm, HI_FP8, INTERP, STORE_EV)


@triton.jit
def _gdn_commit_cursor_kernel(idx_ptr, add_ptr, cur_ptr, nxt_ptr, batch, flush_period, BLOCK_B: tl.constexpr,
                              COMPACT: tl.constexpr, GDC: tl.constexpr = False):
    """First launch of a speculative commit, one program: with m = cursor + accepted[b],
    COMPACT: moves the cursors (0 where m >= K: the row flushes; else m) and lists the flushing
      rows for the flush step, nxt[r] = (b << 16) | (m - 1) at their ranks r, and their count
      at nxt[batch] (common.list_commit_rows);
    else: nxt[b] = m - 1, the last entry the commit keeps (-1 for a padded row, or a row with
      nothing committed: the flush step then leaves it alone), and the flush step moves the
      cursors.
    A launch of its own because the flush step's programs must all see the cursors before
    any of them moves (in the flush step, one worker block writes them).
    GDC (a programmatic dependent launch): waits for the kernel ahead of it (the verify), then
    lets the fold behind it launch, whose programs wait in turn."""
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    if COMPACT:
        list_commit_rows(idx_ptr, add_ptr, cur_ptr, nxt_ptr, batch, flush_period, BLOCK_B, True)
    else:
        bb, _, live, m = commit_counts(idx_ptr, add_ptr, cur_ptr, batch, BLOCK_B)
        tl.store(nxt_ptr + bb, tl.where(live, m - 1, -1), mask=bb < batch)


@triton.jit
def _balanced_chunk(hi_desc, hi_ptr, ub_ptr, slot64, h, c, ent, lm, ar, cols, cmask, eC, wl, kf,
                    HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr, BLOCK_R: tl.constexpr,
                    FOLD_PREC: tl.constexpr, TMA: tl.constexpr, ST_TMA: tl.constexpr, INTERP: tl.constexpr):
    """_gdn_commit_balanced_kernel's fold of chunk c of value head h: S = eC S_c + (U * w) Kb,
    the chunk loaded through hi_desc (TMA) or pointers and stored through it (ST_TMA) or pointers."""
    rr = c * BLOCK_R + ar
    rm = rr < DV
    row = (slot64 * HV + h) * DV + rr
    tile = row[:, None] * DK + cols[None, :]
    m2 = rm[:, None] & cmask[None, :]
    trow = ((slot64 * HV + h) * DV + c * BLOCK_R).to(tl.int32)
    if TMA:
        S = hi_desc.load([trow, 0]).to(tl.float32)
    else:
        S = _ckpt_load(hi_ptr, hi_ptr, tile, row, m2, rm, False)
    U = _u_tile(ub_ptr, ent, h, rr, lm, HV, DV)
    S = eC * S + mm(U * wl[None, :], kf, FOLD_PREC, INTERP)
    if ST_TMA:
        hi_desc.store([trow, 0], cast(S, hi_desc.dtype, INTERP))
    else:
        _ckpt_store(hi_ptr, hi_ptr, tile, row, S, m2, rm, False, INTERP)


@triton.jit
def _gdn_commit_balanced_kernel(
    lst_ptr, idx_ptr, hi_ptr, ub_ptr, kb_ptr, gb_ptr, hi_desc, batch,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, NSEG: tl.constexpr,
    PF: tl.constexpr, PF_DIST: tl.constexpr, HI_LPR: tl.constexpr, HI_LS: tl.constexpr,
    FOLD_PREC: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr, GDC: tl.constexpr = False,
    TMA: tl.constexpr = False, ST_TMA: tl.constexpr = False,
):
    """Fold of a speculative commit (non-dual states, a 16- or 32-bit high copy), balanced over
    a fixed grid: the second launch after _gdn_commit_cursor_kernel (COMPACT), which listed the
    flushing rows, lst[r] = (b << 16) | n for ranks r < lst[batch].

    The work is count x Hv x NC items, item (r, h, c) = chunk c (BLOCK_R rows, NC per head)
    of value head h of the row of rank r, in that order; program p of NP folds the contiguous
    items [p * total // NP, (p + 1) * total // NP), so every program gets the same number of
    chunks to within one, whatever the count. (One program per (worker, head block) leaves a
    partial last wave when the folding programs do not fill whole waves: at batch 128 and
    Qwen3.5-4B dims, 1024 half-head programs on 6 x 132 slots.) A program walks its range
    as segments of one (row, head): per segment it loads the row's keys and the head's decays
    once (w_i = e^{c_n - c_i} / |k_i|, 0 past n), then per chunk
        S = e^{c_n} S_c + (U * w) Kb      (U [rows, BLOCK_L] the stored u, Kb the raw keys)
    as _gdn_flush_step_kernel's FOLD_MMA path, the next chunks hinted (PF) PF_DIST ahead.
    Loops have constexpr trip counts (NSEG segments of at most NC chunks, guarded; the TMA
    path's chunk loop runs between bounds computed on the device), as the grid and shapes do:
    CUDA-graph safe. GDC: launched as a programmatic dependent of the
    cursor launch, it waits for it before any load, then lets a programmatic dependent behind
    it start early (the next layer's commit, in a model).
    TMA (session 25): the chunks come through hi_desc (the high copy as [rows, DK], block
    [BLOCK_R, BLOCK_K]) in a loop over the segment's own chunks, which Triton's pipeliner can
    run ahead (num_stages); ST_TMA (heads of whole chunks): the folded chunks go out through it."""
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    NC: tl.constexpr = (DV + BLOCK_R - 1) // BLOCK_R
    GROUP: tl.constexpr = HV // HK
    p = tl.program_id(0).to(tl.int64)
    np_ = tl.num_programs(0)
    total = tl.load(lst_ptr + batch).to(tl.int64) * (HV * NC)
    i0 = p * total // np_
    i1 = (p + 1) * total // np_
    ar = tl.arange(0, BLOCK_R)
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    ll = tl.arange(0, BLOCK_L)
    for sg in range(NSEG):
        sid = i0 // NC + sg                          # segment = (rank, value head)
        c_lo = tl.maximum(i0 - sid * NC, 0)
        c_hi = tl.minimum(i1 - sid * NC, NC)
        if c_lo < c_hi:
            h = (sid % HV).to(tl.int32)
            kh = h // GROUP
            key = tl.load(lst_ptr + sid // HV)
            n = key & 0xFFFF                             # entries 0..n fold
            slot64 = tl.load(idx_ptr + (key >> 16)).to(tl.int64)
            for c in tl.static_range(PF_DIST):
                if c_lo + c < c_hi:
                    _hint_chunk(hi_ptr, slot64, h, 0, c_lo + c, ar, HV, DV, DK, NC, BLOCK_R, HI_LPR, HI_LS, PF,
                                INTERP)
            lm = ll <= n
            ent = slot64 * L + ll
            _, kf, rk = _fold_keys(kb_ptr, ent, lm, kh, cols, cmask, HK, DK, EPS)
            _, Cn, wl = _fold_decays(gb_ptr, ent * HV + h, lm, rk)
            eC = tl.exp(Cn)
            if TMA and not INTERP:   # the segment's own chunks (bounds from the device: pipelinable)
                for c in range(c_lo.to(tl.int32), c_hi.to(tl.int32)):
                    _balanced_chunk(hi_desc, hi_ptr, ub_ptr, slot64, h, c, ent, lm, ar, cols, cmask, eC, wl, kf,
                                    HV, DV, DK, BLOCK_R, FOLD_PREC, TMA, ST_TMA, INTERP)
            else:   # (the interpreter takes no tensor loop bounds; its hints are no-ops)
                for c in range(NC):
                    if (c >= c_lo) & (c < c_hi):
                        if c + PF_DIST < c_hi:
                            _hint_chunk(hi_ptr, slot64, h, 0, c + PF_DIST, ar, HV, DV, DK, NC, BLOCK_R, HI_LPR, HI_LS,
                                        PF, INTERP)
                        _balanced_chunk(hi_desc, hi_ptr, ub_ptr, slot64, h, c, ent, lm, ar, cols, cmask, eC, wl, kf,
                                        HV, DV, DK, BLOCK_R, FOLD_PREC, TMA, ST_TMA, INTERP)


# ----------------------------------------------------------------------------- low-copy refresh
@triton.jit
def _gdn_refresh_lo_kernel(idx_ptr, cur_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
                           HV: tl.constexpr, DV: tl.constexpr, DK: tl.constexpr,
                           BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
                           HI_FP8: tl.constexpr, LO_FP8: tl.constexpr, INTERP: tl.constexpr):
    """Before a verify of a dual state that has taken the eager route: where the cursor word
    says the low copy is stale (LO_STALE), copy the [BLOCK_V, dk] tile of the high checkpoint
    into it (quantising). Grid (cdiv(dv, BLOCK_V), Hv, batch). The bit is cleared by the launch
    after (common.clear_lo_stale_kernel; no program here may, as another may not have read it
    yet), so the verify reads plain counts."""
    b = tl.program_id(2)
    slot = tl.load(idx_ptr + b)
    if slot >= 0:
        slot64 = slot.to(tl.int64)
        if (tl.load(cur_ptr + slot64) & _LO_STALE) != 0:
            rows = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
            rmask = rows < DV
            cols = tl.arange(0, BLOCK_K)
            row_off = (slot64 * HV + tl.program_id(1)) * DV + rows
            tile = row_off[:, None] * DK + cols[None, :]
            mask2 = rmask[:, None] & (cols < DK)[None, :]
            S = _ckpt_load(hi_ptr, hi_sc_ptr, tile, row_off, mask2, rmask, HI_FP8)
            _ckpt_store(lo_ptr, lo_sc_ptr, tile, row_off, S, mask2, rmask, LO_FP8, INTERP)


# ----------------------------------------------------------------------------- fold
@triton.jit
def _gdn_fold_kernel(
    idx_ptr, add_ptr, hi_ptr, hi_sc_ptr, lo_ptr, lo_sc_ptr,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, cur_ptr,
    threshold, nprog,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr,
    HAS_ADD: tl.constexpr, HI_FP8: tl.constexpr, LO_FP8: tl.constexpr, DUAL: tl.constexpr,
    INTERP: tl.constexpr, EPS: tl.constexpr,
):
    """Cursor move + conditional fold, per sequence, on the device.

    n = cursor (+ add[b] when HAS_ADD: commit of accepted drafts). If n >= threshold
    (flush: 1, commit: K) fold entries 0..n-1 into the high checkpoint, write it (dual:
    refresh the low copy) and set the cursor to 0; else the cursor becomes n. A flush (no
    add) also folds where the low copy is stale (LO_STALE, n = 0): the fold of no entries
    rewrites both copies. (A commit follows a verify, which has refreshed it.)
    """
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    kh = h // (HV // HK)
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    cols = tl.arange(0, BLOCK_K)
    cmask = cols < DK
    slot = tl.load(idx_ptr + b)
    if slot >= 0:
        slot64 = slot.to(tl.int64)
        # ticket read of the cursor (module docstring): low bits cursor, high bits programs so far
        old = tl.atomic_add(cur_ptr + slot64, _TICKET, sem="relaxed")
        n = old & _CUR_MASK
        last = (old >> 16) == nprog - 1
        if HAS_ADD:
            n = n + tl.load(add_ptr + b).to(tl.int32)
            do_fold = n >= threshold
        elif DUAL:
            do_fold = (n >= threshold) | ((old & _LO_STALE) != 0)
        else:
            do_fold = n >= threshold
        if last:
            tl.atomic_xchg(cur_ptr + slot64, tl.where(do_fold, 0, n), sem="relaxed")
        if do_fold:
            S, tile, row_off, mask2 = _folded_tile(hi_ptr, hi_sc_ptr, ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, slot64, h,
                                                   kh, n, rows, rmask, cols, cmask, HV, HK, DK, DV, L, HI_FP8, DUAL,
                                                   EPS)
            _ckpt_store(hi_ptr, hi_sc_ptr, tile, row_off, S, mask2, rmask, HI_FP8, INTERP)
            if DUAL:
                _ckpt_store(lo_ptr, lo_sc_ptr, tile, row_off, S, mask2, rmask, LO_FP8, INTERP)


@triton.jit
def _gdn_dual_2pass_kernel(
    lst_ptr, idx_ptr, cur_ptr, hi_ptr, lo_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, q_ptr, o_ptr,
    sqb, sqh, sob, soh, scale, flush_period, batch,
    HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_B: tl.constexpr,
    NW: tl.constexpr, NT: tl.constexpr, COMPACT: tl.constexpr, WRITE_O: tl.constexpr,
    P_PREC: tl.constexpr, GRAM_PREC: tl.constexpr, SMALL_PREC: tl.constexpr, FOLD_PREC: tl.constexpr,
    INTERP: tl.constexpr, EPS: tl.constexpr, GDC: tl.constexpr = False,
):
    """Fold of dual-mode states (fp32 high copy, 16-bit low copy) for the rows that flush; one
    program per (worker, value head, BLOCK_V rows), worker w taking the flushing rows of rank
    w, w + NW, ... The rows:
      COMPACT (the speculative commit): listed by _gdn_commit_cursor_kernel, lst[r] =
        (b << 16) | n, their count at lst[batch]; the cursors already moved;
      else (a SPLIT replay step's second launch): lst[b] = the cursor row b had (-1: padded)
        from the output-only launch, which appended this step's entry at n; rows with
        n + 1 >= K flush, and the programs of the first row tile of head 0 write the cursors
        (0 after a flush, else n + 1), as _gdn_flush_step_kernel does.
    The u of entries 0..n are recomputed against the high state S_0 in closed form (the
    algebra of _gdn_flush_step_kernel's dual FOLD_MMA path):
        U = R (I + M)^-1 = R + R X,  R[:, i] = beta_i (v_i - e^{c_i} S_0 k_i / |k_i|),
        M[m, j] = [m < j <= n] beta_j e^{c_j - c_m} (k_m . k_j) / (|k_m| |k_j|),
        S_n = e^{c_n} S_0 + (U * w) Kb,  w_i = e^{c_n - c_i} / |k_i|   (Kb the raw keys)
    in two passes over dk in BLOCK_K-column steps, as the verify kernel streams its tile:
      1. S_0 Kb^T [BV, BL] (P_PREC), the keys' Gram matrix and norms (GRAM_PREC), accumulated
         per step, so no [BV, dk] tile is ever whole in registers;
      2. the state steps again (L2 hits: the program read them just before), each
         updated by one product with its key columns (FOLD_PREC), stored to both copies;
         WRITE_O: o = S_n q (q l2-normalised, scaled) replaces the output-only launch's.
    The per-head work (M, X = (I + M)^-1 - I: _unit_tri_inv_minus_eye, SMALL_PREC) is done
    once per program. GDC: launched as a programmatic dependent (of the commit's cursor
    launch, or the step's output-only launch), it waits for the kernel ahead of it before any
    load, then lets a programmatic dependent behind it start early."""
    gdc_wait_prior(GDC)
    gdc_release(GDC)
    w = tl.program_id(0)
    pid1 = tl.program_id(1)
    NRT: tl.constexpr = (DV + BLOCK_V - 1) // BLOCK_V
    h = pid1 // NRT
    kh = h // (HV // HK)
    rows = (pid1 % NRT) * BLOCK_V + tl.arange(0, BLOCK_V)
    rm = rows < DV
    ll = tl.arange(0, BLOCK_L)
    if COMPACT:
        n_mine = (tl.load(lst_ptr + batch) - w + NW - 1) // NW
    else:
        bb, nb, fl, rank, _, n_mine = _scan_flushing(lst_ptr, idx_ptr, cur_ptr, batch, flush_period, w, pid1 == 0,
                                                     NW, BLOCK_B, True)
    for t in range(NT):
        if t < n_mine:
            if COMPACT:
                key = tl.load(lst_ptr + w + t * NW)
            else:
                key = _ranked_key(bb, nb, fl, rank, w + t * NW)
            b = (key >> 16).to(tl.int64)
            n = key & 0xFFFF
            slot64 = tl.load(idx_ptr + b).to(tl.int64)
            lm = ll <= n
            ent = slot64 * L + ll
            el = ent * HV + h
            row = (slot64 * HV + h) * DV + rows
            P = tl.zeros([BLOCK_V, BLOCK_L], tl.float32)
            KK = tl.zeros([BLOCK_L, BLOCK_L], tl.float32)
            nk = tl.zeros([BLOCK_L], tl.float32)
            nq = 0.0
            for c0 in tl.range(0, DK, BLOCK_K):
                cols = c0 + tl.arange(0, BLOCK_K)
                cm = cols < DK
                S = tl.load(hi_ptr + row[:, None] * DK + cols[None, :], mask=rm[:, None] & cm[None, :], other=0.0)
                kb = tl.load(kb_ptr + (ent * HK + kh)[:, None] * DK + cols[None, :], mask=lm[:, None] & cm[None, :],
                             other=0.0)
                kbT = tl.trans(kb)
                P = mma_acc(S, kbT, P, P_PREC, INTERP)
                KK = mma_acc(kb, kbT, KK, GRAM_PREC, INTERP)
                kf = kb.to(tl.float32)
                nk += tl.sum(kf * kf, 1)
                if WRITE_O:
                    qc = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cm, other=0.0).to(tl.float32)
                    nq += tl.sum(qc * qc, 0)
            rk = tl.rsqrt(nk + EPS)
            gl = tl.load(gb_ptr + el, mask=lm, other=0.0).to(tl.float32)
            bl = tl.load(bb_ptr + el, mask=lm, other=0.0).to(tl.float32)
            cl = tl.cumsum(gl, 0)
            Cn = tl.sum(gl, 0)
            ups = (ll[:, None] < ll[None, :]) & lm[None, :]                          # m < j <= n
            M = tl.where(ups, bl[None, :] * tl.exp(tl.where(ups, cl[None, :] - cl[:, None], 0.0))
                         * KK * rk[:, None] * rk[None, :], 0.0)                       # exponents <= 0
            X = _unit_tri_inv_minus_eye(M, BLOCK_L, SMALL_PREC, INTERP)
            V = tl.load(vb_ptr + el[None, :] * DV + rows[:, None], mask=rm[:, None] & lm[None, :],
                        other=0.0).to(tl.float32)                                  # [BV, BL] raw v
            R = bl[None, :] * (V - (tl.exp(cl) * rk)[None, :] * P)
            W = (R + mm(R, X, SMALL_PREC, INTERP)) * tl.where(lm, tl.exp(Cn - cl) * rk, 0.0)[None, :]
            eC = tl.exp(Cn)
            o = tl.zeros([BLOCK_V], tl.float32)
            for c0 in tl.range(0, DK, BLOCK_K):
                cols = c0 + tl.arange(0, BLOCK_K)
                cm = cols < DK
                tile = row[:, None] * DK + cols[None, :]
                m2 = rm[:, None] & cm[None, :]
                kb = tl.load(kb_ptr + (ent * HK + kh)[:, None] * DK + cols[None, :], mask=lm[:, None] & cm[None, :],
                             other=0.0)
                S = eC * tl.load(hi_ptr + tile, mask=m2, other=0.0, eviction_policy="evict_first") \
                    + mm(W, kb, FOLD_PREC, INTERP)
                tl.store(hi_ptr + tile, S, mask=m2)
                tl.store(lo_ptr + tile, cast(S, lo_ptr.dtype.element_ty, INTERP), mask=m2)
                if WRITE_O:
                    qc = tl.load(q_ptr + b * sqb + kh * sqh + cols, mask=cm, other=0.0).to(tl.float32)
                    o += tl.sum(S * qc[None, :], 1)
            if WRITE_O:
                o = o * (tl.rsqrt(nq + EPS) * scale)
                tl.store(o_ptr + b * sob + h * soh + rows, cast(o, o_ptr.dtype.element_ty, INTERP), mask=rm)


# ----------------------------------------------------------------------------- verify
@triton.jit
def _verify_dk_loop(rd_ptr, rd_desc, row0, row_off, lrows, k_ptr, q_ptr, kb_ptr, b, kh, ent, lm, dj, kcol, qcol,
                    skb, skt, skh, sqb, sqt, sqh,
                    BLOCK_V: tl.constexpr, BLOCK_P: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_K: tl.constexpr,
                    DK: tl.constexpr, HK: tl.constexpr, S_PREC: tl.constexpr, K_PREC: tl.constexpr,
                    TMA: tl.constexpr, INTERP: tl.constexpr):
    """Dots over dk in chunks of BLOCK_K columns (loads feed the MMAs; no tile is ever whole in
    registers), with the drafts packed as one operand P [BP, dk]: rows kcol = the raw draft keys,
    rows qcol = the raw draft queries (one MMA per product where separate k and q operands,
    each padded to 16 rows, took two). Returns SP = S P^T [BV, BP] of the state rows row_off,
    GP = Kb P^T [L, BP] (stored buffer keys), PP = P P^T [BP, BP], the squared norms nP [BP]
    and nkb [L]. TMA: the state chunks come through rd_desc (a TMA descriptor over the read
    copy as [rows, dk], block [BLOCK_V, BLOCK_K]) from row row0 (int32): one copy instruction per
    chunk instead of per-thread vector loads (rows past the head or of a null slot are read
    from wherever they point, never stored)."""
    SP = tl.zeros([BLOCK_V, BLOCK_P], tl.float32)
    GP = tl.zeros([BLOCK_L, BLOCK_P], tl.float32)
    PP = tl.zeros([BLOCK_P, BLOCK_P], tl.float32)
    nP = tl.zeros([BLOCK_P], tl.float32)
    nkb = tl.zeros([BLOCK_L], tl.float32)
    for c0 in tl.range(0, DK, BLOCK_K):
        cols = c0 + tl.arange(0, BLOCK_K)
        cmask = cols < DK
        pk = tl.load(k_ptr + b * skb + dj[:, None] * skt + kh * skh + cols[None, :],
                     mask=kcol[:, None] & cmask[None, :], other=0.0)
        pq = tl.load(q_ptr + b * sqb + dj[:, None] * sqt + kh * sqh + cols[None, :],
                     mask=qcol[:, None] & cmask[None, :], other=0.0)
        P = tl.where(kcol[:, None], pk, pq)
        PT = tl.trans(P)
        if TMA:
            S = rd_desc.load([row0, c0])
        else:
            S = tl.load(rd_ptr + row_off[:, None] * DK + cols[None, :], mask=lrows[:, None] & cmask[None, :],
                        other=0.0, eviction_policy="evict_first")
        SP = mma_acc(S, PT, SP, S_PREC, INTERP)
        kb = tl.load(kb_ptr + (ent * HK + kh)[:, None] * DK + cols[None, :], mask=lm[:, None] & cmask[None, :],
                     other=0.0)
        GP = mma_acc(kb, PT, GP, K_PREC, INTERP)
        PP = mma_acc(P, PT, PP, K_PREC, INTERP)
        pf = P.to(tl.float32)
        kbf = kb.to(tl.float32)
        nP += tl.sum(pf * pf, 1)
        nkb += tl.sum(kbf * kbf, 1)
    return SP, GP, PP, nP, nkb


@triton.jit
def _unit_tri_inv_minus_eye(M, ORDER: tl.constexpr, PREC: tl.constexpr, INTERP: tl.constexpr):
    """X = (I + M)^-1 - I for M strictly upper triangular with M^ORDER = 0 (nonzero only in its
    leading ORDER x ORDER block): (I + M)^-1 = sum_{k < ORDER} (-M)^k = (I - M)(I + M^2)(I + M^4)
    ..., the rounds while 2^e < ORDER (log2(ORDER) rounds of products instead of ORDER dependent
    substitution steps; T = 4 drafts: one round). Kept as X, one round being X' = X + P + X P
    (P the next power): each product's rounding error is relative to X P, not to the identity
    (what (I + X)(I + P) would carry), and R (I + M)^-1 = R + R X likewise. ORDER <= 64."""
    X = -M
    P = M
    for e in tl.static_range(1, 6):
        if (1 << e) < ORDER:                        # P = M^(2^e)
            P = mm(P, P, PREC, INTERP)
            X = X + P + mm(X, P, PREC, INTERP)
    return X


@triton.jit
def _verify_coefs(GP, PP, nP, nkb, gch, gp, bp, lm, pc, kcol, qcol, scale, T: tl.constexpr, EPS: tl.constexpr,
                  SMALL_PREC: tl.constexpr, INTERP: tl.constexpr):
    """Per (sequence, head) coefficients of the verify solve (see _gdn_verify_kernel), over the
    packed draft columns: r [BP] norm factors (q's with the scale), GPw = w * GP * r [L, BP]
    (rows >= n: 0), eC = e^C, eD [BP] = e^{D_j} of each column's draft j, X = (I + M)^-1 - I
    and Mq [BP, BP]."""
    r = tl.rsqrt(nP + EPS) * tl.where(qcol, scale, 1.0)
    c = tl.cumsum(gch, 0)
    Cn = tl.sum(gch, 0)
    w = tl.exp(Cn - c) * tl.rsqrt(nkb + EPS)                                   # exponents <= 0
    GPw = tl.where(lm[:, None], GP * w[:, None], 0.0) * r[None, :]             # stale rows selected away
    PPn = PP * r[:, None] * r[None, :]                                         # k.k, k.q of the normed drafts
    # D_j per column: the k columns' and the q columns' runs summed apart (the same sums)
    D = tl.where(kcol, tl.cumsum(tl.where(kcol, gp, 0.0), 0), tl.cumsum(tl.where(qcol, gp, 0.0), 0))
    ups = (pc[:, None] < pc[None, :]) & kcol[None, :]                          # m < j < T
    upq = kcol[:, None] & qcol[None, :] & (pc[:, None] + T <= pc[None, :])    # draft m <= draft j (q column)
    dec = tl.exp(tl.where(ups | upq, D[None, :] - D[:, None], -float("inf")))  # exponents <= 0
    M = tl.where(ups, bp[None, :] * dec * PPn, 0.0)
    X = _unit_tri_inv_minus_eye(M, T, SMALL_PREC, INTERP)
    Mq = tl.where(upq, dec * PPn, 0.0)
    return r, GPw, tl.exp(Cn), tl.exp(D), X, Mq


@triton.jit
def _verify_rows(SP, rows, rmask, lrows, row_off, rd_sc_ptr, ub_ptr, vb_ptr, v_ptr, o_ptr, b, h, ent, lm, pc, dj,
                 kcol, qcol, live, n, slot64, r, GPw, eC, eD, bp, X, Mq,
                 svb, svt, svh, sob, sot, soh, HV: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
                 RD_FP8: tl.constexpr, DUAL: tl.constexpr, SMALL_PREC: tl.constexpr, INTERP: tl.constexpr):
    """Outputs of one row tile from its raw state dots SP [BV, BP]: adds the buffer, solves the
    drafts, stores o and the drafts' u (dual: v) at buffer rows n..n+T-1."""
    if RD_FP8:
        rsc = tl.load(rd_sc_ptr + row_off, mask=lrows, other=1.0)
        SP = SP * rsc[:, None]
    Vd = tl.load(v_ptr + b * svb + dj[None, :] * svt + h * svh + rows[:, None], mask=lrows[:, None] & kcol[None, :],
                 other=0.0).to(tl.float32)                                     # [BV, BP], k columns
    Ut = tl.load(ub_ptr + (ent[None, :] * HV + h) * DV + rows[:, None], mask=lrows[:, None] & lm[None, :],
                 other=0.0).to(tl.float32)                                     # [BV, BL]
    SPn = eC * (SP * r[None, :]) + mm(Ut, GPw, SMALL_PREC, INTERP)            # S_{n-1} k_j | S_{n-1} q_j
    R = bp[None, :] * (Vd - eD[None, :] * SPn)                                # bp = 0 off the k columns
    Ud = R + mm(R, X, SMALL_PREC, INTERP)                                   # drafts' u = R (I + X) [BV, BP]
    O = tl.where(qcol[None, :], eD[None, :] * SPn, 0.0) + mm(Ud, Mq, SMALL_PREC, INTERP)
    tl.store(o_ptr + b * sob + dj[None, :] * sot + h * soh + rows[:, None], cast(O, o_ptr.dtype.element_ty, INTERP),
             mask=rmask[:, None] & qcol[None, :])
    pos = n + pc
    dent = slot64 * L + pos
    um = lrows[:, None] & (kcol & live & (pos < L))[None, :]
    tl.store(ub_ptr + (dent[None, :] * HV + h) * DV + rows[:, None], Ud, mask=um)
    if DUAL:
        tl.store(vb_ptr + (dent[None, :] * HV + h) * DV + rows[:, None], cast(Vd, vb_ptr.dtype.element_ty, INTERP),
                 mask=um)


@triton.jit
def _gdn_verify_kernel(
    q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, o_ptr, idx_ptr, rd_ptr, rd_sc_ptr, rd_desc,
    ub_ptr, kb_ptr, gb_ptr, vb_ptr, bb_ptr, cur_ptr,
    sqb, sqt, sqh, skb, skt, skh, svb, svt, svh, sgb, sgt, sgh, sbb, sbt, sbh, sob, sot, soh,
    scale,
    T: tl.constexpr, HV: tl.constexpr, HK: tl.constexpr, DK: tl.constexpr, DV: tl.constexpr, L: tl.constexpr,
    BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_P: tl.constexpr,
    RD_FP8: tl.constexpr, DUAL: tl.constexpr, S_PREC: tl.constexpr, K_PREC: tl.constexpr,
    EARLY_BUF: tl.constexpr, SMALL_PREC: tl.constexpr, INTERP: tl.constexpr, EPS: tl.constexpr,
    TMA: tl.constexpr = False, GDC: tl.constexpr = False,
):
    """All T draft outputs for [BLOCK_V, dk] state tiles from the read checkpoint and the
    buffer, in matrix form. The drafts are packed as columns of one operand: column j < T is
    draft j's key, column T + j its query (BLOCK_P = max(16, next_pow2(2T)) columns; every
    tile dim >= 16 for tl.dot), so each product with the state or the stored keys is one MMA.

    n = cursor (plain read, not moved); c_i = g_0 + .. + g_i over the buffer, C = c_{n-1};
    D_j = gd_0 + .. + gd_j over the drafts; k, q l2-normalised (q also scaled) by factors
    applied after the raw dots, so the Gram and state MMAs multiply stored values.
        SP = S_c P^T                                               [BV, BP]  (MMA over dk: S_PREC)
        S_{n-1} p = e^C SP + U^T (w * Kb P^T),  w_i = e^{C - c_i}     (every column p)
    Drafts: u_j = beta_j (v_j - e^{D_j} S_{n-1} k_j - sum_{m<j} e^{D_j - D_m} (k_m.k_j) u_m),
    i.e. Ud (I + M) = R with M[m, j] = [m < j < T] beta_j e^{D_j - D_m} (k_m.k_j) strictly
    upper triangular and R[:, j] = beta_j (v_j - e^{D_j} S_{n-1} k_j) (zero off the k columns);
    (I + M)^-1 = (I - M)(I + M^2)... exactly (M^T = 0).
        O[:, T + j] = e^{D_j} (S_{n-1} q_j) + (Ud Mq)[:, T + j],  Mq[m, T + j] = [m <= j] e^{D_j - D_m} (k_m.q_j)
    Grid (row tiles, Hv, batch): one tile per program, its dk loop computing the state dots and
    the (per-head) Gram matrices together, so the state loads go first. EARLY_BUF loads the
    buffer rows < BLOCK_L before the cursor arrives; rows >= n are selected away (never
    multiplied). No per-draft state; drafts written to the buffer at n..n+T-1 (u; k, g once;
    dual: v, beta). TMA: the state chunks through a TMA descriptor (_verify_dk_loop). GDC: lets
    a programmatic dependent launch behind it (the commit's cursor launch) start early.
    """
    gdc_release(GDC)
    pid_v = tl.program_id(0)
    h = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    GROUP: tl.constexpr = HV // HK
    kh = h // GROUP
    pc = tl.arange(0, BLOCK_P)
    kcol0 = pc < T
    qcol0 = (pc >= T) & (pc < 2 * T)
    dj = tl.where(kcol0, pc, pc - T)                                           # draft of each column
    ll = tl.arange(0, BLOCK_L)
    slot = tl.load(idx_ptr + b)
    live = slot >= 0
    slot64 = tl.maximum(slot, 0).to(tl.int64)
    kcol = kcol0 & live
    qcol = qcol0 & live
    ent = slot64 * L + ll
    if EARLY_BUF:
        lm = (ll < L) & live
    else:
        n = tl.load(cur_ptr + slot64, mask=live, other=0)
        lm = (ll < n) & live
    rows = pid_v * BLOCK_V + tl.arange(0, BLOCK_V)
    rmask = rows < DV
    lrows = rmask & live
    row_off = (slot64 * HV + h) * DV + rows
    row0 = ((slot64 * HV + h) * DV + pid_v * BLOCK_V).to(tl.int32)      # TMA: the tile's first row
    SP, GP, PP, nP, nkb = _verify_dk_loop(
        rd_ptr, rd_desc, row0, row_off, lrows, k_ptr, q_ptr, kb_ptr, b, kh, ent, lm, dj, kcol, qcol,
        skb, skt, skh, sqb, sqt, sqh,
        BLOCK_V, BLOCK_P, BLOCK_L, BLOCK_K, DK, HK, S_PREC, K_PREC, TMA, INTERP)
    gp = tl.load(g_ptr + b * sgb + dj * sgt + h * sgh, mask=kcol | qcol, other=0.0).to(tl.float32)
    bp = tl.load(beta_ptr + b * sbb + dj * sbt + h * sbh, mask=kcol, other=0.0).to(tl.float32)
    gch = tl.load(gb_ptr + ent * HV + h, mask=lm, other=0.0).to(tl.float32)
    if EARLY_BUF:
        n = tl.load(cur_ptr + slot64, mask=live, other=0)
        lm = (ll < n) & live
        gch = tl.where(lm, gch, 0.0)
    r, GPw, eC, eD, X, Mq = _verify_coefs(GP, PP, nP, nkb, gch, gp, bp, lm, pc, kcol, qcol, scale, T, EPS,
                                          SMALL_PREC, INTERP)
    _verify_rows(SP, rows, rmask, lrows, row_off, rd_sc_ptr, ub_ptr, vb_ptr, v_ptr, o_ptr, b, h, ent, lm, pc, dj,
                 kcol0, qcol0, live, n, slot64, r, GPw, eC, eD, bp, X, Mq,
                 svb, svt, svh, sob, sot, soh, HV, DV, L, RD_FP8, DUAL, SMALL_PREC, INTERP)

    # the drafts' g (dual: beta) once per head, raw keys once per key head (re-read: L2 hits)
    pos = n + pc
    pm = kcol & (pos < L)
    dent = slot64 * L + pos
    if pid_v == 0:
        tl.store(gb_ptr + dent * HV + h, gp, mask=pm)
        if DUAL:
            tl.store(bb_ptr + dent * HV + h, bp, mask=pm)
        if h % GROUP == 0:
            for c0 in tl.range(0, DK, BLOCK_K):
                cols = c0 + tl.arange(0, BLOCK_K)
                cm = pm[:, None] & (cols < DK)[None, :]
                kr = tl.load(k_ptr + b * skb + pc[:, None] * skt + kh * skh + cols[None, :], mask=cm, other=0.0)
                tl.store(kb_ptr + (dent * HK + kh)[:, None] * DK + cols[None, :],
                         cast(kr.to(tl.float32), kb_ptr.dtype.element_ty, INTERP), mask=cm)


# ----------------------------------------------------------------------------- host side
# Each op is planned as (kernel, grid, args, meta) and then launched; the same plan feeds
# compile_offline(), which builds the kernel for a GPU arch without a GPU (resource check).
def _rows_index(state_indices: torch.Tensor | None, batch: int, device) -> torch.Tensor:
    if state_indices is None:
        return torch.arange(batch, dtype=torch.int32, device=device)
    return state_indices


def _ckpt_args(ck):
    """(data, scale-or-dummy, is_fp8) of a state.Checkpoint."""
    if ck.scale is not None:
        return ck.data, ck.scale, True
    return ck.data, ck.data, False


def _hi_lo_args(rs: GDNReplayState):
    hi, hi_sc, hi_fp8 = _ckpt_args(rs.hi)
    lo, lo_sc, lo_fp8 = _ckpt_args(rs.lo) if rs.lo is not None else (hi, hi_sc, False)
    return [hi, hi_sc, lo, lo_sc], dict(HI_FP8=hi_fp8, LO_FP8=lo_fp8)


def _buffer_args(rs: GDNReplayState):
    """[u, k, g, v, beta] (v/beta: dummies outside dual mode), dual flag."""
    dual = rs.mode == "dual"
    return [rs.u, rs.k, rs.g, rs.v if dual else rs.u, rs.beta if dual else rs.g], dual


def _check_rs(rs: GDNReplayState, nprog: int) -> None:
    L = rs.capacity
    if L > CURSOR_MASK:
        raise ValueError(f"buffer_len {L} too large for the cursor word (<= {CURSOR_MASK})")
    if nprog >= 1 << 15:
        raise ValueError(f"{nprog} programs per sequence: too many for the ticket cursor; raise BLOCK_V")
    for t in [rs.hi.data, rs.cursor, *rs.buffers()] + ([rs.lo.data] if rs.lo is not None else []):
        if not t.is_contiguous():
            raise ValueError("ReplaySSM state tensors must be contiguous")


def _strides(*ts, dims: int):
    return [st for t in ts for st in t.stride()[:dims]]


def _common_meta(cfg: dict, **kw) -> dict:
    return dict(BLOCK_V=cfg["BLOCK_V"], BLOCK_K=cfg["BLOCK_K"], INTERP=interpreting(), EPS=L2_EPS,
                num_warps=cfg["num_warps"], **kw)


def plan_eager(state, q, k, v, g, beta, state_indices, scale, o, config=None):
    batch, Hv, dv = v.shape
    Hk, dk = k.shape[1], k.shape[2]
    assert state.is_contiguous() and tuple(state.shape[1:]) == (Hv, dv, dk), state.shape
    cfg = pick_config("eager", batch, dv, dk, 1, config, state_bytes=state.element_size())
    tiles = int(cfg.get("TILES", 1))
    if tiles not in (1, 2):
        raise ValueError(f"config TILES={tiles}: allowed 1, 2")
    grid = (triton.cdiv(dv, cfg["BLOCK_V"] * tiles), Hv, batch)
    args = [q, k, v, g, beta, o, _rows_index(state_indices, batch, v.device), state,
            *_strides(q, k, v, g, beta, o, dims=2), scale]
    meta = _common_meta(cfg, HV=Hv, HK=Hk, DK=dk, DV=dv, TILES=tiles)
    _launch_options(meta, cfg)
    _evict_options(meta, cfg)
    return _gdn_eager_kernel, grid, args, meta


def replay_meta(cfg: dict, L: int, dv: int, group: int, K: int | None = None) -> dict:
    """Resolve the replay kernel's shape options (see _gdn_replay_kernel).

    BLOCK_V = rows per chunk (BLOCK_R); NR chunks of rows per program (clamped to the head);
    HP value heads per program (the largest power of two <= HP dividing Hv/Hk); PF prefetch
    hints (0 none, 1 L2, 2 L1) PF_DIST chunks ahead; PREFETCH: cursor-independent buffer reads.
    The buffer is read as one chunk of BLOCK_L = next_pow2(min(K, L)) entries: a step sees
    n <= K - 1 committed entries (every step or commit that reaches K flushes), so with
    K < L the rows a PREFETCH read issues stay those the traffic model counts (a BLOCK_L in
    cfg is for other kernels)."""
    br = cfg["BLOCK_V"]
    nr = max(1, min(int(cfg.get("NR", 1)), triton.cdiv(dv, br)))
    hp = 1
    while hp * 2 <= int(cfg.get("HP", 1)) and group % (hp * 2) == 0:
        hp *= 2
    return dict(BLOCK_R=br, NR=nr, HP=hp, BLOCK_L=triton.next_power_of_2(min(K or L, L)),
                PREFETCH=bool(cfg.get("PREFETCH", False)),
                PF=int(cfg.get("PF", 0)), PF_DIST=max(1, int(cfg.get("PF_DIST", 1))),
                LOOP_STAGES=cfg.get("LOOP_STAGES"))


def _nxt(rs: GDNReplayState, batch: int, device) -> torch.Tensor:
    """Per-row scratch [>= batch + 1] int32 that a SPLIT replay step's two launches share, and
    a commit's (the flushing rows and their count). Kept on the state object, so one
    allocation serves every step and a captured graph: both callers ask for batch + 1, so a
    replay step and a commit at one batch size never reallocate it under each other's graphs."""
    return state_scratch(rs, "_gdn_nxt", batch + 1, device)


def plan_replay(rs: GDNReplayState, q, k, v, g, beta, state_indices, scale, o, config=None):
    """Launch plan(s) of one replay step: [replay] (fused flush, ticket cursor) or, when the
    config says SPLIT, [output-only replay, flush step] (the second a programmatic dependent
    launch of the first where the GPU has them: PDL, or the config's PDL); or, when it says
    EAGER_ROUTE, [the eager route] (_gdn_replay_eager_kernel: a flush at every step, for small
    batches)."""
    batch, Hv, dv = v.shape
    Hk, dk = k.shape[1], k.shape[2]
    L = rs.capacity
    cfg = pick_config("replay", batch, dv, dk, L, config, state_bytes=rs.read_ckpt.data.element_size(),
                      dual=rs.mode == "dual", heads=Hv)
    if cfg.get("EAGER_ROUTE"):
        return [_plan_replay_eager(rs, q, k, v, g, beta, state_indices, scale, o, cfg)]
    rm = replay_meta(cfg, L, dv, Hv // Hk, rs.flush_period)
    split = bool(cfg.get("SPLIT", False))
    nrs = triton.cdiv(dv, rm["BLOCK_R"] * rm["NR"])
    grid = ((Hv // Hk) // rm["HP"] * nrs, Hk, batch)
    nprog = grid[0] * Hk
    _check_rs(rs, nprog)
    ck, ck_meta = _hi_lo_args(rs)
    buf, dual = _buffer_args(rs)
    idx = _rows_index(state_indices, batch, v.device)
    nxt = _nxt(rs, batch, v.device) if split else rs.cursor
    rd = rs.read_ckpt.data
    kind = {torch.bfloat16: 1, torch.float16: 2, torch.float8_e4m3fn: 3}.get(rd.dtype, 0)
    pk = 4 // rd.element_size() if kind and cfg.get("PACK", True) else 1
    if dk % pk:
        pk = 1
    # TMA: the output route's state chunks through a descriptor, over the fp32 copy or the
    # 16/8-bit copy's int32 words (as _rd_dots reads them); a table row's where the state and the
    # GPU allow it, a config's TMA True raises where they do not
    # RD_MMA: a 16-bit read copy's dots as one tensor-core product per chunk (_rd_dots_mma), its
    # descriptor over the 16-bit elements; tl.dot needs every tile dim >= 16
    rd_mma = bool(cfg.get("RD_MMA")) and kind in (1, 2) and min(rm["BLOCK_R"], cfg["BLOCK_K"]) >= 16
    descs = None
    if cfg.get("TMA") and (pk > 1 or rd.dtype == torch.float32):
        asked = True if (config or {}).get("TMA") else None
        if rd_mma:
            descs = tma_rows(rd, dk, [(rm["BLOCK_R"], cfg["BLOCK_K"])], "TMA", asked)
        else:
            words = rd.view(torch.int32) if pk > 1 else rd
            descs = tma_rows(words, dk // pk, [(rm["BLOCK_R"], cfg["BLOCK_K"] // pk)], "TMA", asked)
    args = [q, k, v, g, beta, o, idx, *ck, *buf, rs.cursor, nxt, descs[0] if descs else rd,
            *_strides(q, k, v, g, beta, o, dims=2), scale, rs.flush_period, nprog]
    (rd_lpr, rd_ls), (hi_lpr, hi_ls) = cache_lines(rd, dk), cache_lines(rs.hi.data, dk)
    u_lpr = triton.next_power_of_2(triton.cdiv(rm["BLOCK_R"] * rs.u.element_size(), 128))
    meta = dict(BLOCK_K=cfg["BLOCK_K"], INTERP=interpreting(), EPS=L2_EPS, num_warps=cfg["num_warps"],
                HV=Hv, HK=Hk, DK=dk, DV=dv, L=L, DUAL=dual, SPLIT=split, PK=pk, RD_KIND=kind, RD_LPR=rd_lpr,
                RD_LS=rd_ls, HI_LPR=hi_lpr, HI_LS=hi_ls, U_LPR=u_lpr, TMA=descs is not None, RD_MMA=rd_mma, **rm,
                **ck_meta)
    _launch_options(meta, cfg)
    plans = [(_gdn_replay_kernel, grid, args, meta)]
    if split:
        fc = _flush_step_row(rs, batch, "flush_step", config)
        if fc.get("TWO_PASS") and _dual_2pass_fits(rs):     # opt-in (F_TWO_PASS; see CONFIGS)
            plans.append(_plan_dual_2pass(rs, q, o, idx, nxt, batch, scale, fc, 1, write_o=True, compact=False))
        else:
            plans.append(_plan_flush_step(rs, q, o, idx, nxt, batch, dk, scale, fc, rows_per=1))
        pdl = pdl_meta(v.device, bool(cfg.get("PDL", PDL)))     # the flush step behind the output launch
        meta["GDC"] = pdl["GDC"]
        plans[1][3].update(pdl)
    return plans


def _flush_step_row(rs: GDNReplayState, batch: int, op: str, config) -> dict:
    """The flush step's launch row: table op ("flush_step", "commit"; dual states op + "_dual";
    keyed by batch x value heads where BY_HEADS says), with the config's "F_<KEY>" entries
    overriding its keys."""
    _, hv, dv, dk = rs.hi.data.shape
    op = op + "_dual" if rs.mode == "dual" else op
    fc = pick_config(op, batch * hv if op in BY_HEADS else batch, dv, dk, rs.capacity, None,
                     state_bytes=rs.hi.data.element_size())
    fc.update({kk[2:]: vv for kk, vv in (config or {}).items() if kk.startswith("F_")})
    fc["BLOCK_V"] = min(fc["BLOCK_V"], triton.next_power_of_2(dv))
    return fc


def _plan_flush_step(rs: GDNReplayState, q, o, idx, nxt, batch: int, dk: int, scale, fc: dict, rows_per: int,
                     write_o: bool = True, compact: bool = False):
    """Plan of _gdn_flush_step_kernel over `batch` rows whose last kept entry is nxt[b] (the
    SPLIT replay step's second launch; the commit's fold with write_o False, compact: nxt
    lists the flushing rows). fc: its launch row (_flush_step_row). rows_per: the most entries
    a row gains per call (step 1, commit T), which sizes the workers per head block,
    NW = cdiv(batch * rows_per, K): a staggered batch's flushing rows in one round."""
    _, Hv, dv, _ = rs.hi.data.shape
    Hk, L, K = rs.k.shape[2], rs.capacity, max(rs.flush_period, 1)
    dual = rs.mode == "dual"
    fm = replay_meta(fc, L, dv, Hv // Hk, K)
    nw = max(1, min(batch, triton.cdiv(batch * rows_per, K) * int(fc.get("NW_MUL", 1))))
    grid = ((Hv // Hk) // fm["HP"] * triton.cdiv(dv, fm["BLOCK_R"] * fm["NR"]), Hk, nw)
    ck, ck_meta = _hi_lo_args(rs)
    buf, _ = _buffer_args(rs)
    hi_lpr, hi_ls = cache_lines(rs.hi.data, dk)
    # TMA (a row's or config's F_TMA; the matrix-product fold of 16/32-bit high copies, as timed;
    # the rank-1 fold took 202 registers with it): the high chunks through a descriptor where the
    # state and GPU allow it
    descs = lo_desc = None
    if fc.get("TMA") and _fold_mma_fits(rs, fc, fm["BLOCK_R"]):
        descs = tma_rows(rs.hi.data, dk, [(fm["BLOCK_R"], fc["BLOCK_K"])], "F_TMA", None)
    # ST_TMA: the stores too, where every chunk lies inside its head (a bulk store writes the
    # whole box: no row mask) and the low copy, if any, is a 16-bit one (fp8 stores scales too)
    st_tma = bool(fc.get("ST_TMA") and descs and dv % (fm["BLOCK_R"] * fm["NR"]) == 0)
    if st_tma and dual and rs.lo.scale is None:      # the 16-bit low copy through its own descriptor
        lo_desc = tma_rows(rs.lo.data, dk, [(fm["BLOCK_R"], fc["BLOCK_K"])], "F_ST_TMA", None)
        st_tma = lo_desc is not None
    args = [q, o, idx, nxt, *ck, *buf, rs.cursor, descs[0] if descs else rs.hi.data,
            lo_desc[0] if lo_desc else ck[2], *_strides(q, o, dims=2), scale, rs.flush_period, batch]
    meta = dict(BLOCK_K=fc["BLOCK_K"], INTERP=interpreting(), EPS=L2_EPS, num_warps=fc["num_warps"], TMA=bool(descs),
                ST_TMA=st_tma,
                HV=Hv, HK=Hk, DK=dk, DV=dv, L=L, DUAL=dual, BLOCK_R=fm["BLOCK_R"], NR=fm["NR"], HP=fm["HP"],
                NW=nw, BLOCK_B=triton.next_power_of_2(batch), PF=fm["PF"], PF_DIST=fm["PF_DIST"],
                HI_LPR=hi_lpr, HI_LS=hi_ls, WRITE_O=write_o, COMPACT=compact, **ck_meta)
    _launch_options(meta, fc)
    _evict_options(meta, fc)
    if _fold_mma_fits(rs, fc, fm["BLOCK_R"]):
        meta.update(FOLD_MMA=True, BLOCK_L=max(16, triton.next_power_of_2(L)),
                    FOLD_PREC=_fold_precision(rs, fc),
                    P_PREC=_keys_precision(rs, fc, "P_PREC"),
                    SMALL_PREC=fc.get("SMALL_PREC") or split_precision(torch.float32, torch.float32),
                    GRAM_PREC=fc.get("GRAM_PREC") or mma_precision(rs.k.dtype, rs.k.dtype, "tf32x3t"))
    return _gdn_flush_step_kernel, grid, args, meta


def _fold_mma_fits(rs: GDNReplayState, fc: dict, block_r: int) -> bool:
    """The row's FOLD_MMA applies (the flush step's matrix-product fold, see the kernel): a 16-
    or 32-bit high copy (fp8 keeps its rank-1 fold), tiles tl.dot takes (>= 16), at most 64
    entries (_unit_tri_inv_minus_eye)."""
    return (bool(fc.get("FOLD_MMA")) and rs.hi.data.dtype != torch.float8_e4m3fn
            and min(block_r, fc["BLOCK_K"]) >= 16 and rs.capacity <= 64)


def _keys_precision(rs: GDNReplayState, fc: dict, key: str, fallback: str | None = None) -> str:
    """The precision of a product of an fp32 side with the raw keys: the row's `key` where its
    premise holds for the buffer's key dtype (mma.exact_b_holds: "bf16x3e" needs bf16 or fp8
    keys), else `fallback`, by default the truncation split (mma.split_precision)."""
    prec = fc.get(key)
    if prec and exact_b_holds(prec, rs.k.dtype):
        return prec
    return fallback or split_precision(torch.float32, rs.k.dtype)


def _fold_precision(rs: GDNReplayState, fc: dict) -> str:
    """The matrix-product fold's precision (fp32 u x the raw keys): the row's FOLD_PREC where
    the keys allow it (_keys_precision), else the truncation split where it says FOLD_SPLIT,
    else mma_precision's ("tf32x3" for fp32 keys)."""
    return _keys_precision(rs, fc, "FOLD_PREC",
                           None if fc.get("FOLD_SPLIT") else mma_precision(torch.float32, rs.k.dtype, "tf32x3"))


def takes_eager_route(batch: int, dv: int, dk: int, buffer_len: int, read_bytes: int,
                      config: dict | None = None, dual: bool = False, heads: int | None = None) -> bool:
    """True when a replay step of this shape runs the small-batch route (a CONFIGS "replay" row
    or `config` with EAGER_ROUTE): the high copy alone, read every step and written every
    ROUTE_K-th (route_period). read_bytes: bytes per element of the copy the buffered route
    reads (the low copy in dual mode); heads: value heads (needed for dual states,
    DUAL_ROUTE_HEADS)."""
    cfg = pick_config("replay", batch, dv, dk, buffer_len, config, state_bytes=read_bytes, dual=dual, heads=heads)
    return bool(cfg.get("EAGER_ROUTE"))


def route_period(batch: int, dv: int, dk: int, buffer_len: int, read_bytes: int, flush_period: int,
                 config: dict | None = None, dual: bool = False, heads: int | None = None) -> int:
    """The small-batch route's period k at this shape (0: the step buffers, not routed): its
    row's ROUTE_K (default 1: a flush at every step), at most the flush period. For traffic
    models and byte counts (reference.gdn_replay_step's `route`)."""
    cfg = pick_config("replay", batch, dv, dk, buffer_len, config, state_bytes=read_bytes, dual=dual, heads=heads)
    return _route_k(cfg, flush_period) if cfg.get("EAGER_ROUTE") else 0


def _route_k(cfg: dict, flush_period: int) -> int:
    k = cfg.get("ROUTE_K", 1)
    if type(k) is not int or not 1 <= k <= 127:     # (not a bool: True is an int)
        raise ValueError(f"config ROUTE_K={k!r}: allowed an int 1..127")
    return min(k, flush_period)


def state_takes_eager_route(rs: GDNReplayState, k, v, config=None) -> bool:
    """takes_eager_route for a step of `rs` with inputs k [b, Hk, dk], v [b, Hv, dv]."""
    return takes_eager_route(v.shape[0], v.shape[2], k.shape[2], rs.capacity, rs.read_ckpt.data.element_size(),
                             config, rs.mode == "dual", v.shape[1])


def state_route_period(rs: GDNReplayState, k, v, config=None) -> int:
    """route_period for a step of `rs` with inputs k [b, Hk, dk], v [b, Hv, dv]."""
    return route_period(v.shape[0], v.shape[2], k.shape[2], rs.capacity, rs.read_ckpt.data.element_size(),
                        rs.flush_period, config, rs.mode == "dual", v.shape[1])


def _plan_replay_eager(rs: GDNReplayState, q, k, v, g, beta, state_indices, scale, o, cfg: dict):
    """Plan of the small-batch route: one [BLOCK_V, dk] tile of the high checkpoint per program,
    grid (cdiv(dv, BLOCK_V), Hv, batch). ROUTE_K 1 (default): _gdn_replay_eager_kernel, a flush
    at every step; k >= 2 (at most the flush period): _gdn_route_defer_kernel, the state written
    every k-th step."""
    batch, Hv, dv = v.shape
    Hk, dk = k.shape[1], k.shape[2]
    rk = _route_k(cfg, rs.flush_period)
    grid = (triton.cdiv(dv, cfg["BLOCK_V"]), Hv, batch)
    _check_rs(rs, grid[0] * Hv)
    ck, ck_meta = _hi_lo_args(rs)
    buf, dual = _buffer_args(rs)
    rs.routed = rs.routed or dual     # its low copies may go stale: verify refreshes them first
    rs.deferred = rs.deferred or rk > 1     # its cursor words carry epochs: verify clears them first
    idx = _rows_index(state_indices, batch, v.device)
    head = [q, k, v, g, beta, o, idx, ck[0], rs.cursor] + ([rs.route_epoch] if rk > 1 else [])
    args = [*head, *_strides(q, k, v, g, beta, o, dims=2), scale, grid[0] * Hv, ck[1], *buf]
    meta = _common_meta(cfg, HV=Hv, HK=Hk, DK=dk, DV=dv, L=rs.capacity, DUAL=dual, HI_FP8=ck_meta["HI_FP8"])
    _launch_options(meta, cfg)
    _evict_options(meta, cfg)
    if rk > 1:
        if cfg["BLOCK_V"] % EPOCH_ROWS:
            raise ValueError(f"config BLOCK_V={cfg['BLOCK_V']} with ROUTE_K={rk}: allowed multiples of "
                             f"{EPOCH_ROWS} (state.EPOCH_ROWS)")
        return _gdn_route_defer_kernel, grid, args, dict(meta, RK=rk, EP_ROWS=EPOCH_ROWS)
    return _gdn_replay_eager_kernel, grid, args, dict(meta, PENDING_CALL=bool(cfg.get("PENDING_CALL", False)))


def plan_fold(rs: GDNReplayState, idx, add, threshold: int, config=None):
    rows = idx.shape[0]
    _, Hv, dv, dk = rs.hi.data.shape
    L = rs.capacity
    cfg = pick_config("fold", rows, dv, dk, L, {**OVERRIDE.get("fold", {}), **(config or {})})
    nt = triton.cdiv(dv, cfg["BLOCK_V"])
    _check_rs(rs, nt * Hv)
    ck, ck_meta = _hi_lo_args(rs)
    buf, dual = _buffer_args(rs)
    args = [idx, idx if add is None else add, *ck, *buf, rs.cursor, threshold, nt * Hv]
    meta = _common_meta(cfg, HV=Hv, HK=rs.k.shape[2], DK=dk, DV=dv, L=L, HAS_ADD=add is not None, DUAL=dual,
                        **ck_meta)
    return _gdn_fold_kernel, (nt, Hv, rows), args, meta


def _f32_precision(a: torch.dtype, b: torch.dtype) -> str:
    """Verify MMA precision of operands stored as a (the fp32 side when one is) and b, per
    VERIFY_F32_PRECISION."""
    if VERIFY_F32_PRECISION == "split":
        return split_precision(a, b)
    return mma_precision(a, b, VERIFY_F32_PRECISION)


def plan_verify(rs: GDNReplayState, q, k, v, g, beta, state_indices, scale, o, config=None):
    """Launch plan of one verify (_gdn_verify_kernel)."""
    batch, T, Hv, dv = v.shape
    Hk, dk = k.shape[2], k.shape[3]
    L = rs.capacity
    if T > L:
        raise ValueError(f"draft window {T} exceeds buffer_len {L}")
    if T > 16:
        raise ValueError(f"draft window {T} > 16 is not supported by the verify kernel")
    ov = {**OVERRIDE.get("verify", {}), **(config or {})}
    cfg = pick_config("verify", batch, dv, dk, L, ov, state_bytes=rs.read_ckpt.data.element_size())
    block_p = max(16, triton.next_power_of_2(2 * T))
    if block_p > 16 and "WIDE_BLOCK_V" in cfg and "BLOCK_V" not in ov:
        cfg["BLOCK_V"] = min(cfg["BLOCK_V"], cfg["WIDE_BLOCK_V"])
    if T in cfg.get("MAXNREG_T", {}):
        cfg.setdefault("maxnreg", cfg["MAXNREG_T"][T])
    cfg["BLOCK_V"] = max(16, cfg["BLOCK_V"])                    # tl.dot needs every dim >= 16
    cfg["BLOCK_K"] = max(16, min(cfg.get("CHUNK_K", VERIFY_CHUNK_K), cfg["BLOCK_K"]))   # dk per MMA step
    _check_rs(rs, triton.cdiv(dv, cfg["BLOCK_V"]) * Hv)
    rd, rd_sc, rd_fp8 = _ckpt_args(rs.read_ckpt)
    buf, dual = _buffer_args(rs)
    idx = _rows_index(state_indices, batch, v.device)
    # the read copy as [rows, dk] through TMA: where the config says, else at the row's TMA_T
    asked = bool(cfg["TMA"]) if "TMA" in cfg else (None if T in cfg.get("TMA_T", ()) else False)
    descs = tma_rows(rd, dk, [(cfg["BLOCK_V"], cfg["BLOCK_K"])], "TMA", asked)
    tma = descs is not None
    args = [q, k, v, g, beta, o, idx, rd, rd_sc, descs[0] if tma else rd, *buf, rs.cursor,
            *_strides(q, k, v, g, beta, o, dims=3), scale]
    meta = _common_meta(cfg, T=T, HV=Hv, HK=Hk, DK=dk, DV=dv, L=L,
                        BLOCK_L=max(16, triton.next_power_of_2(min(rs.flush_period, L))),
                        BLOCK_P=block_p, RD_FP8=rd_fp8, DUAL=dual,
                        S_PREC=cfg.get("S_PREC") or _f32_precision(rs.read_ckpt.data.dtype, k.dtype),
                        K_PREC=_f32_precision(rs.k.dtype, k.dtype), EARLY_BUF=bool(cfg.get("EARLY_BUF", True)),
                        SMALL_PREC=cfg.get("SMALL_PREC", _f32_precision(torch.float32, torch.float32)),
                        TMA=tma, GDC=pdl_meta(v.device, bool(cfg.get("PDL", PDL)))["GDC"])
    _launch_options(meta, cfg)
    return _gdn_verify_kernel, (triton.cdiv(dv, cfg["BLOCK_V"]), Hv, batch), args, meta


def _launch_options(meta: dict, cfg: dict) -> None:
    """meta's num_stages (loop pipelining depth) and maxnreg (register budget) where the row or
    config sets them (else, or None, Triton's / ptxas's choice)."""
    for opt in ("num_stages", "maxnreg"):
        if cfg.get(opt) is not None:
            meta[opt] = int(cfg[opt])


def _evict_options(meta: dict, cfg: dict) -> None:
    """meta's LOAD_EV / STORE_EV (the state's L2 eviction policies: "evict_first", "evict_last"
    or "" for none): the row's or config's, else "evict_first". Always set, so that an offline
    compile (compile_offline) sees every constexpr of the launch."""
    for opt in ("LOAD_EV", "STORE_EV"):
        ev = cfg.get(opt, "evict_first")
        if ev not in EVICT_POLICIES:
            raise ValueError(f"config {opt}={ev!r}: allowed {', '.join(map(repr, EVICT_POLICIES))}")
        meta[opt] = ev


def _launch(plan) -> None:
    kernel, grid, args, meta = plan
    kernel[grid](*args, **meta)


def _scale(scale, dk: int) -> float:
    return dk ** -0.5 if scale is None else float(scale)


def eager_step(state, q, k, v, g, beta, state_indices=None, scale=None, out=None, config=None):
    """Eager GDN step: state [S, Hv, dv, dk] updated in place; returns o [b, Hv, dv] (v's dtype)."""
    q, k, v = last_contig(q), last_contig(k), last_contig(v)
    o = torch.empty_like(v) if out is None else out
    if v.shape[0]:
        _launch(plan_eager(state, q, k, v, g, beta, state_indices, _scale(scale, k.shape[-1]), o, config))
    return o


def replay_step(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, scale=None, out=None, config=None):
    """ReplaySSM GDN step (flush decided on the device: fused, or a second launch when the
    launch table says SPLIT); returns o [b, Hv, dv] (v's dtype)."""
    q, k, v = last_contig(q), last_contig(k), last_contig(v)
    o = torch.empty_like(v) if out is None else out
    if v.shape[0]:
        for plan in plan_replay(rs, q, k, v, g, beta, state_indices, _scale(scale, k.shape[-1]), o, config):
            _launch(plan)
    return o


def fold(rs: GDNReplayState, idx: torch.Tensor, add: torch.Tensor | None, threshold: int, config=None) -> None:
    """Per row b of idx (slot; negative = skip): n = cursor (+ add[b]); if n >= threshold fold
    entries 0..n-1 into the checkpoint and reset the cursor, else store n. Flush: add None,
    threshold 1. Commit: add = accepted, threshold K."""
    if idx.shape[0]:
        _launch(plan_fold(rs, idx, add, threshold, config))


def flush(rs: GDNReplayState, slots: torch.Tensor | None = None, config=None) -> None:
    """Fold every committed entry of `slots` (default all) whose cursor > 0; decided on the device."""
    if slots is None:
        slots = torch.arange(rs.cursor.shape[0], dtype=torch.int32, device=rs.cursor.device)
    fold(rs, slots, None, 1, config)


def plan_commit(rs: GDNReplayState, accepted: torch.Tensor, state_indices, config=None) -> list:
    """Launch plans of a speculative commit: [the cursor launch (_gdn_commit_cursor_kernel: the
    cursors moved, the flushing rows listed), then the fold]: fp32 states the flush step's
    FOLD_MMA fold (no output), or where the row's BALANCED applies (at most its max_hv value
    heads, T <= its max_t) the balanced fold (_gdn_commit_balanced_kernel); dual states with a
    16-bit low copy (TWO_PASS) the two-pass kernel (_gdn_dual_2pass_kernel). The fold is a
    programmatic dependent launch of the cursor launch, and that one of the verify, where the
    GPU has them (PDL, or the config's PDL; launch.pdl_meta). Where the row (or the
    config) says COMMIT_FOLD, or TWO_PASS cannot take the state (fp8 low copy): [the rank-1
    fold kernel, ticket cursor]."""
    batch = accepted.shape[0]
    if batch >= 1 << 15:
        raise ValueError(f"commit: batch {batch} > 32767 (the flush step packs the row index in 15 bits)")
    idx = _rows_index(state_indices, batch, accepted.device)
    config = {**OVERRIDE.get("fold", {}), **(config or {})}
    fc = _flush_step_row(rs, batch, "commit", config)
    two_pass = bool(fc.get("TWO_PASS")) and _dual_2pass_fits(rs)
    if config.get("COMMIT_FOLD", fc.get("COMMIT_FOLD")) or (fc.get("TWO_PASS") and not two_pass):
        return [plan_fold(rs, idx, accepted, rs.flush_period, config)]
    compact = two_pass or bool(fc.get("COMPACT", False))
    nxt = _nxt(rs, batch, accepted.device)            # compact: the flushing rows, then their count
    bb = triton.next_power_of_2(batch)
    pdl = pdl_meta(accepted.device, bool(config.get("PDL", PDL)))     # the fold behind the cursor launch
    snap = (_gdn_commit_cursor_kernel, (1,), [idx, accepted, rs.cursor, nxt, batch, rs.flush_period],
            dict(BLOCK_B=bb, COMPACT=compact, num_warps=4 if bb >= 256 else 1, **pdl))
    T = max(1, rs.capacity - rs.flush_period)          # the most a commit adds (capacity >= K + T)
    # no output: the buffers stand in for q and o (unread)
    if two_pass:
        fold = _plan_dual_2pass(rs, rs.k, rs.u, idx, nxt, batch, 1.0, fc, T, write_o=False, compact=True)
    elif compact and _balanced_fits(rs, fc):
        fold = _plan_commit_balanced(rs, idx, nxt, batch, fc)
    else:
        fold = _plan_flush_step(rs, rs.k, rs.u, idx, nxt, batch, rs.k.shape[3], 1.0, fc, rows_per=T,
                                write_o=False, compact=compact)
    fold[3].update(pdl)
    return [snap, fold]


def _sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device (the balanced commit's grid); for plans on
    the 'meta' device (offline sm_90 compiles) an H200's 132; 4 on the CPU (small grids for
    the interpreter)."""
    d = torch.device(device)
    if d.type == "cuda":
        return torch.cuda.get_device_properties(d).multi_processor_count
    return 132 if d.type == "meta" else 4


def _balanced_fits(rs: GDNReplayState, fc: dict) -> bool:
    """The commit row's BALANCED dict applies (_gdn_commit_balanced_kernel): non-dual, the
    matrix-product fold (_fold_mma_fits; its chunks have >= 16 rows), at most its "max_hv"
    value heads and a draft window T = capacity - K of at most its "max_t"."""
    bal = fc.get("BALANCED")
    return bool(bal) and rs.mode != "dual" and _fold_mma_fits(rs, fc, 16) \
        and rs.hi.data.shape[1] <= bal.get("max_hv", 1 << 30) \
        and rs.capacity - rs.flush_period <= bal.get("max_t", 1 << 30)


def _plan_commit_balanced(rs: GDNReplayState, idx, lst, batch: int, fc: dict):
    """Plan of _gdn_commit_balanced_kernel over the rows lst lists. fc["BALANCED"]: "per_sm"
    programs per SM, and its own launch keys ("maxnreg", "num_warps", "BLOCK_V": rows per
    chunk, "PF": prefetch hints) over the commit row's."""
    fc = {**fc, **{k: v for k, v in fc["BALANCED"].items() if k not in ("per_sm", "max_hv", "max_t")}}
    _, Hv, dv, dk = rs.hi.data.shape
    br = max(16, min(fc["BLOCK_V"], triton.next_power_of_2(dv)))
    nc = triton.cdiv(dv, br)
    nprog = _sm_count(lst.device) * int(fc["BALANCED"]["per_sm"])
    most = max(1, triton.cdiv(batch * Hv * nc, nprog))          # chunks a program folds, at most
    hi_lpr, hi_ls = cache_lines(rs.hi.data, dk)
    fm = replay_meta(fc, rs.capacity, dv, 1)
    descs = tma_rows(rs.hi.data, dk, [(br, fc["BLOCK_K"])], "F_TMA", None) if fc.get("TMA") else None
    args = [lst, idx, rs.hi.data, rs.u, rs.k, rs.g, descs[0] if descs else rs.hi.data, batch]
    meta = dict(HV=Hv, HK=rs.k.shape[2], DK=dk, DV=dv, L=rs.capacity, BLOCK_R=br, BLOCK_K=fc["BLOCK_K"],
                BLOCK_L=max(16, triton.next_power_of_2(rs.capacity)), NSEG=triton.cdiv(most - 1, nc) + 1,
                PF=fm["PF"], PF_DIST=fm["PF_DIST"], HI_LPR=hi_lpr, HI_LS=hi_ls, FOLD_PREC=_fold_precision(rs, fc),
                INTERP=interpreting(), EPS=L2_EPS, num_warps=fc["num_warps"], TMA=bool(descs),
                ST_TMA=bool(descs and fc.get("ST_TMA") and dv % br == 0))
    _launch_options(meta, fc)
    return _gdn_commit_balanced_kernel, (nprog,), args, meta


def _dual_2pass_fits(rs: GDNReplayState) -> bool:
    """_gdn_dual_2pass_kernel's case: dual mode, fp32 high copy, 16-bit low copy without
    scales (an fp8 copy's per-row scale needs the whole row at once), at most 64 entries."""
    return (rs.mode == "dual" and rs.hi.data.dtype == torch.float32 and rs.hi.scale is None
            and rs.lo.data.dtype in (torch.bfloat16, torch.float16) and rs.capacity <= 64)


def _plan_dual_2pass(rs: GDNReplayState, q, o, idx, lst, batch: int, scale, fc: dict, rows_per: int,
                     write_o: bool, compact: bool):
    """Plan of _gdn_dual_2pass_kernel: grid (workers, Hv x row tiles), workers
    NW = cdiv(batch * rows_per, K) as the flush step's. q [b, Hk, dk], o [b, Hv, dv]: the
    step's query and output (write_o; else any tensors, unread)."""
    _, Hv, dv, dk = rs.hi.data.shape
    Hk, L, K = rs.k.shape[2], rs.capacity, max(rs.flush_period, 1)
    bv = max(16, min(fc["BLOCK_V"], triton.next_power_of_2(dv)))
    ck = max(16, min(int(fc.get("CHUNK_K", VERIFY_CHUNK_K)), triton.next_power_of_2(dk)))
    nw = max(1, min(batch, triton.cdiv(batch * rows_per, K)))
    bb = triton.next_power_of_2(batch)
    grid = (nw, Hv * triton.cdiv(dv, bv))
    args = [lst, idx, rs.cursor, rs.hi.data, rs.lo.data, rs.k, rs.g, rs.v, rs.beta, q, o,
            *_strides(q, o, dims=2), scale, rs.flush_period, batch]
    meta = dict(HV=Hv, HK=Hk, DK=dk, DV=dv, L=L, BLOCK_V=bv, BLOCK_K=ck,
                BLOCK_L=max(16, triton.next_power_of_2(L)), BLOCK_B=bb, NW=nw, NT=triton.cdiv(bb, nw),
                COMPACT=compact, WRITE_O=write_o,
                P_PREC=_keys_precision(rs, fc, "P_PREC"),
                GRAM_PREC=mma_precision(rs.k.dtype, rs.k.dtype, "tf32x3t"),
                SMALL_PREC=split_precision(torch.float32, torch.float32),
                FOLD_PREC=_keys_precision(rs, fc, "FOLD_PREC"),
                INTERP=interpreting(), EPS=L2_EPS, num_warps=fc["num_warps"])
    _launch_options(meta, fc)
    return _gdn_dual_2pass_kernel, grid, args, meta


def commit(rs: GDNReplayState, accepted: torch.Tensor, state_indices=None, config=None) -> None:
    """cursor += accepted[b]; fold where the cursor reached K (on the device)."""
    if accepted.shape[0]:
        for plan in plan_commit(rs, accepted, state_indices, config):
            _launch(plan)


def verify(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, scale=None, out=None, config=None):
    """Outputs of T drafts (q/k [b,T,Hk,dk], v [b,T,Hv,dv], g/beta [b,T,Hv]) -> o [b,T,Hv,dv]."""
    q, k, v = last_contig(q), last_contig(k), last_contig(v)
    o = torch.empty_like(v) if out is None else out
    if v.shape[0]:
        if rs.mode == "dual" and rs.routed:     # low copies the eager route left stale
            for plan in plan_refresh_lo(rs, state_indices, v.shape[0]):
                _launch(plan)
        elif rs.deferred:     # the deferred route's epoch bits: the verify reads plain counts
            _launch(_plan_clear_bits(rs, _rows_index(state_indices, v.shape[0], rs.cursor.device), v.shape[0]))
        _launch(plan_verify(rs, q, k, v, g, beta, state_indices, _scale(scale, k.shape[-1]), o, config))
    return o


def plan_refresh_lo(rs: GDNReplayState, state_indices, batch: int):
    """Plans of the stale low copies' refresh over `batch` rows: _gdn_refresh_lo_kernel (16-row
    tiles, 1 warp: a rare path), then the LO_STALE bits cleared (common.clear_lo_stale_kernel)."""
    _, Hv, dv, dk = rs.hi.data.shape
    ck, ck_meta = _hi_lo_args(rs)
    block_v = min(16, triton.next_power_of_2(dv))
    idx = _rows_index(state_indices, batch, rs.cursor.device)
    meta = dict(HV=Hv, DV=dv, DK=dk, BLOCK_V=block_v, BLOCK_K=triton.next_power_of_2(dk), INTERP=interpreting(),
                num_warps=1, **ck_meta)
    return [(_gdn_refresh_lo_kernel, (triton.cdiv(dv, block_v), Hv, batch), [idx, rs.cursor, *ck], meta),
            _plan_clear_bits(rs, idx, batch)]


def _plan_clear_bits(rs: GDNReplayState, idx, batch: int):
    """Plan of common.clear_lo_stale_kernel over `batch` rows: their cursor words reduced to the
    count (the LO_STALE bit and the deferred route's epoch cleared)."""
    return (clear_lo_stale_kernel, (1,), [idx, rs.cursor, batch],
            dict(HAS_IDX=True, BLOCK_B=triton.next_power_of_2(batch), num_warps=4))


# ----------------------------------------------------------------------------- offline compile
def compile_offline(plan, arch: int = 90, asm: bool = False) -> dict:
    """A plan's kernel compiled for CUDA sm_<arch> without a GPU: offline.compile_launch's
    resource use ('regs', 'stack', 'local', spills, 'shared', 'smem'; 'asm' with asm=True). Plans may be built
    from tensors on the 'meta' device."""
    kernel, _, args, meta = plan
    return compile_launch(kernel, args, meta, arch, asm)
