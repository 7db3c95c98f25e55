#!/usr/bin/env python3
"""Tune the speculative-decoding verify + commit kernels on one GPU, in one process.

What is measured is the spec runner's round (replaybench.runners.spec.run: verify T tokens +
commit m of them, the case's acceptance model; layers chosen so the state streams from HBM;
checked against the reference, check_spec, before it is timed; CUDA-graph timing, median per
round per layer), for:
  spec-replay    ReplaySSM verify + commit, once per kernel variant (MAMBA2_VARIANTS /
                 GDN_VARIANTS below; a variant = the verify launch's OVERRIDE["verify"] dict of
                 replayssm.triton.mamba2 / .gdn, "default" = {} = the shipped tables);
  spec-perdraft  our per-draft-state baseline (vLLM's speculative path with our kernels), once;
  vllm-spec      vLLM 0.26.0's own speculative kernels (replaybench.runners.peers, through the
                 kernel stub in .vllm-stub when present), once, when importable.
In order (no new measurement starts after --deadline seconds; rows print as they finish):
  1. the copy ceiling (replaybench.hardware.measure_ceilings: torch.add(x, 0, out=y), 1 GiB fp32 each);
  2. compilation: spawned workers run every planned (case, variant)'s correctness check at
     batch 2 (2 rounds), filling Triton's on-disk cache with the keys the timed launches use;
     timing starts once they are done (or after --deadline / 3 s);
  3. cases in priority order:
       p0  T = 4, batch 256 (--batch), fp32 state: Super, Qwen3.5-122B, Nano, Qwen3.5-4B
           (the two big models first, so a short run still covers both families);
       p1  dual bf16 (fp32 checkpoint + bf16 read copy), the same models, batch 256 (--batch),
           T = 4, the variants without their state-tile precision (s_prec / S_PREC: the
           read copy is bf16, its exact MMA is "bf16"; equal ones once), method
           spec-replay-dual; the baselines of the fp32 case at the same model, batch and T are
           the ratios' denominators;
       p2  T = 4, batch 32, fp32 state: Super, Qwen3.5-122B and Nano.
     (--prio keeps some of the three groups.)
     Per case: spec-perdraft, vllm-spec, then the variants. K = 16, L = K + T and the default
     acceptance (fixed floor(T/2)) as scenarios/h200-spec.toml.
One row per measurement: model, batch, T, state, method, variant, the launch it resolved to,
us per round per layer, GB/s (modelled bytes of replaybench.traffic / time), % of the copy
ceiling measured here, x_perdraft = perdraft us / us and x_vllm = vllm-spec us / us (same
model, batch, T, measured in this run). A summary of the best variant per case follows, and a
CSV (--csv, default $OUT/tune_spec.csv when OUT is set) gets one line per measurement.

A variant's dict goes into the family module's OVERRIDE["verify"] as given (a "fold" key into
OVERRIDE["fold"]). Each spec-replay row shows the launch its variant resolved to
(launch_desc; Mamba-2: P<rows> n<cols per MMA> w<warps> <state-tile precision>
x:<x precision> early|late; GDN: V<rows> w<warps> k<dk per MMA> <precision> early|late
[s<stages>] [r<register budget>]); a
variant resolving to the launch of an earlier one of the same case (a key the kernel plan does
not read, or clamping) is flagged SAME LAUNCH and still timed (a repeat: the run's noise).

--cpu-smoke: the same flow on the CPU under TRITON_INTERPRET=1 (set by the script) with
tiny-mamba2 / tiny-gdn, batch 2 (3 for p2), T = 2, K = 2, L = 4, one sample per timing, the
dual and p2 cases with two / one variants, two compile jobs through the worker pool (under the
interpreter the kernels compute every dot in fp32, whatever its precision). It tests
the script, not the kernels' speed. Takes about 1-2 minutes on 2 cores.

usage:  python3 tools/tune_spec.py [--deadline 420] [--models super,q122b,nano,q4b] [--variants a,b] [--csv PATH]
        TRITON_INTERPRET=1 python3 tools/tune_spec.py --cpu-smoke   (script check on a CPU, tiny models)
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for _p in (ROOT / ".vllm-stub", ROOT / "kernels", ROOT):       # the working tree's code first
    if _p.is_dir() and str(_p) not in sys.path:
        sys.path.insert(0, str(_p))
if "--cpu-smoke" in sys.argv:          # before triton is imported anywhere
    os.environ["TRITON_INTERPRET"] = "1"

T0 = time.time()
import torch  # noqa: E402

GiB = 1 << 30
K = 16                                  # flush period (scenarios/h200-spec.toml)
T_SPEC = 4
MODELS = {"super": "nemotron-3-super-120b-a12b", "nano": "nemotron-3-nano-4b", "q122b": "qwen3.5-122b-a10b",
          "q4b": "qwen3.5-4b", "tm2": "tiny-mamba2", "tgdn": "tiny-gdn"}
SHORT = {v: k for k, v in MODELS.items()}
STUDY = ("super", "q122b", "nano", "q4b")     # --models (the smoke run takes tm2, tgdn)

# ----------------------------------------------------------------------------- variants
# OVERRIDE["verify"] of replayssm.triton.mamba2: block_p (rows per program, power of 2 >= 16,
# clamped to the head), whole (True: the head in one program, a tail tile after block_p rows;
# False: block_p-row programs; unset: the table's), warps, early_buf (buffer tiles loaded
# before the cursor arrives), s_prec (tl.dot precision of the fp32 state tile: "bf16x2",
# "bf16x3", "tf32x3", "split3"), chunk_n (state columns per MMA step), x_prec; a "fold" key
# goes to OVERRIDE["fold"] (block_p, chunks, warps, list) of the commit's fold; maxnreg (ptxas's
# register cap). Keys plan_verify does not read do nothing.
MAMBA2_VARIANTS: dict[str, dict] = {
    "default": {},
    "b32w2-tf32x3": dict(block_p=32, warps=2, s_prec="tf32x3", whole=False),
    "b64w2": dict(block_p=64, warps=2, whole=False),
    "b32w2": dict(block_p=32, warps=2, whole=False),     # Nano: session 10's tiles (rows 80-95 masked)
    "b16w1": dict(block_p=16, warps=1, whole=False),
    "b32w2-late": dict(block_p=32, warps=2, early_buf=False, whole=False),
    "b32w2-fold1": dict(block_p=32, warps=2, whole=False, fold=dict(chunks=1)),
    # Nano (80-row heads): one program per head (rows past 80 masked) instead of three
    "b128w4": dict(block_p=128, warps=4, whole=False),
    "b128w2": dict(block_p=128, warps=2, whole=False),
    # fp32 state x C in two tf32 passes of a truncation split (mma.py "tf32x2t") instead of bf16x3
    # (Super: 154 registers, no spill, vs 128 + 8 bytes of stack)
    "s-t2": dict(s_prec="tf32x2t"),
    # session 11: the default became "bf16x2" (two bf16 passes against the bf16 C); Triton's
    # "bf16x3" (session 10's default: a third pass against C's zero low part) beside it
    "s-b3": dict(s_prec="bf16x3"),
    "b32w2-n64": dict(block_p=32, warps=2, chunk_n=64, whole=False),
    "b32w2-n16": dict(block_p=32, warps=2, chunk_n=16, whole=False),
    "b16w1-n64": dict(block_p=16, warps=1, chunk_n=64, whole=False),
    # a whole head per program as a 64-row tile and a tail tile (Nano: 64 + 16 rows, none masked;
    # the Gram matrices and weights once per head, not once per 32-row tile)
    "whole": dict(block_p=64, warps=2, whole=True),
    "whole-w4": dict(block_p=64, warps=4, whole=True),
    "whole-n16": dict(block_p=64, warps=2, whole=True, chunk_n=16),
    "whole-w4-n16": dict(block_p=64, warps=4, whole=True, chunk_n=16),
    "whole-b3": dict(block_p=64, warps=2, whole=True, s_prec="bf16x3"),
    # prepared in session 11, timed in session 12 (Nano b128, tune_spec_s12a.txt; both slower): Nano's
    # dual bf16 whole-head verify compiles to 128 registers with a 12-byte spill (ptxas's choice),
    # spill-free at 160 (6 programs per SM, not 8): 218.2 vs 194.5 us; the commit's fold at batch
    # 128 in one 16-row chunk per program (more, shorter programs: GDN's commit gained from
    # half-head programs at batch 128): 277.3 vs 246.6
    "whole-r160": dict(maxnreg=160),
    "fold-c1": dict(fold=dict(chunks=1)),
    # session 12: the commit's folding rows listed first and folded by NW workers per head (the
    # default, COMMIT_LIST) vs one fold program per (row, head) as before
    "commit-per-row": dict(fold=dict(list=False)),
    # the commit's fold (session 10; the table: 16 rows x 4 warps, the whole head per program)
    "fold-w2": dict(fold=dict(warps=2)),
    "fold-w1": dict(fold=dict(warps=1)),
    "fold-b32w4": dict(fold=dict(block_p=32, warps=4)),
    "fold-b32w2": dict(fold=dict(block_p=32, warps=2)),
    # session 13: the verify's state chunks through TMA descriptors (plan_verify's "tma"): one
    # copy per chunk (and one per tail chunk) instead of per-thread vector loads
    "tma": dict(tma=True),
    "no-tma": dict(tma=False),         # the table's VERIFY_TMA (fp32 read copies, large bucket) off
    # session 15: the round's launches as programmatic dependents (mamba2.PDL) off
    "no-pdl": dict(pdl=False, fold=dict(pdl=False)),
    # session 19: the Gram matrices once per group in a launch ahead of the verify (PRE_GRAM),
    # the verify its programmatic dependent (gram-nopdl: not)
    "gram": dict(gram=True),
    "gram-nopdl": dict(gram=True, pdl=False),
    # session 20: the default where VERIFY_PRE_GRAM's rule runs the pre-pass (fp32 Super from b128), without it
    "no-gram": dict(gram=False),
}
# OVERRIDE["verify"] of replayssm.triton.gdn, passed on as given. The module's hook reads BLOCK_V (rows
# per program), num_warps, S_PREC, EARLY_BUF, CHUNK_K, SMALL_PREC; a "fold" key goes to
# OVERRIDE["fold"] of the commit (COMMIT_FOLD: the rank-1 fold kernel; F_<key>: the flush step's
# "commit" / "commit_dual" table row).
# the table's balanced commit fold, as variants start from it
from replayssm.triton.gdn import _BALANCED_COMMIT as _BAL  # noqa: E402
GDN_VARIANTS: dict[str, dict] = {
    "default": {},
    # the packed [k | q] draft operand (session 9) freed registers (sm_90, Qwen3.5-122B T4: fp32 64x2w
    # 160 vs 208 before; dual bf16 141 vs 214): larger tiles and more warps per program again
    "bv32w2": dict(BLOCK_V=32, num_warps=2),
    "bv64w4": dict(BLOCK_V=64, num_warps=4),
    "bv128w4": dict(BLOCK_V=128, num_warps=4),
    "bv128w8": dict(BLOCK_V=128, num_warps=8),
    "bv64w2-k64": dict(CHUNK_K=64),
    "bv64w2-k16": dict(CHUNK_K=16),
    "bv64w2-late": dict(EARLY_BUF=False),
    "bv64w2-s2": dict(num_stages=2),
    "bv64w2-s3": dict(num_stages=3),
    # ptxas caps dual fp8 at 128 registers with a 16-byte spill; a register budget instead
    "bv64w2-r168": dict(maxnreg=168),
    # the small products' precision: Triton's "tf32x3" (rounding splits) vs the default truncation
    # split "tf32x3t"; the state tile's "tf32x2t" vs "tf32x3"
    "sm-tf32x3": dict(SMALL_PREC="tf32x3"),
    "old-tf32x3": dict(S_PREC="tf32x3", SMALL_PREC="tf32x3"),
    # the commit (session 9: a cursor snapshot + the flush step's matrix-product fold for fp32 states,
    # the "commit" row: 32 rows x 4 warps x 4 chunks; dual states keep the rank-1 fold kernel): the
    # other route, and flush-step tiles around the row (tune_spec_commit*.txt in device-logs-20261130-s9)
    "commit-fold": {"fold": dict(COMMIT_FOLD=True)},
    "commit-step": {"fold": dict(COMMIT_FOLD=False, F_TWO_PASS=False)},
    "commit-v16-nr2": {"fold": dict(F_BLOCK_V=16, F_NR=2)},
    "commit-v16-nr8": {"fold": dict(F_BLOCK_V=16, F_NR=8)},
    "commit-v32-nr1": {"fold": dict(F_NR=1)},
    "commit-hp4": {"fold": dict(F_HP=4)},            # all value heads of a key head per program
    # session 10: the cursor launch lists the flushing rows (COMPACT, the row's default) vs each
    # flush-step program scanning the batch; the fold product's fp32 side split by truncation
    # ("tf32x2t", the keys are exact in tf32) instead of Triton's "tf32x3"; tiles again with it
    "commit-scan": {"fold": dict(F_COMPACT=False)},
    "commit-x2t": {"fold": dict(F_FOLD_PREC="tf32x2t")},
    "commit-x2t-v16-nr8": {"fold": dict(F_FOLD_PREC="tf32x2t", F_BLOCK_V=16, F_NR=8)},
    "commit-x2t-v16w2-nr8": {"fold": dict(F_FOLD_PREC="tf32x2t", F_BLOCK_V=16, F_NR=8, F_num_warps=2)},
    "commit-x2t-v64w8": {"fold": dict(F_FOLD_PREC="tf32x2t", F_BLOCK_V=64, F_NR=2, F_num_warps=8)},
    "commit-step-list": {"fold": dict(COMMIT_FOLD=False, F_COMPACT=True, F_TWO_PASS=False)},   # dual: flush step
    "commit-x3": {"fold": dict(F_FOLD_PREC="tf32x3")},
    # the verify launch's register budget (ptxas: 160 at 64 rows x 2 warps; 128 = 8 programs per SM,
    # no spill on sm_90), pipelining depth with it, and 128 rows on 2 warps in 16-column steps
    "bv64w2-r128": dict(maxnreg=128),
    "bv64w2-r144": dict(maxnreg=144),
    "bv64w2-r128-s2": dict(maxnreg=128, num_stages=2),
    "bv64w2-r128-s4": dict(maxnreg=128, num_stages=4),
    "bv128w2-k16": dict(BLOCK_V=128, num_warps=2, CHUNK_K=16),
    # around it (session 10): a whole 128-row head per program, its per-head work (the Gram and
    # coefficient products) done once, not once per row tile
    "bv128w2-k16-r144": dict(BLOCK_V=128, num_warps=2, CHUNK_K=16, maxnreg=144),
    "bv128w2-k16-s2": dict(BLOCK_V=128, num_warps=2, CHUNK_K=16, num_stages=2),
    "bv128w2-k16-s4": dict(BLOCK_V=128, num_warps=2, CHUNK_K=16, num_stages=4),
    "bv128w2": dict(BLOCK_V=128, num_warps=2),
    "bv128w4-k16": dict(BLOCK_V=128, num_warps=4, CHUNK_K=16),
    "bv128w1-k16": dict(BLOCK_V=128, num_warps=1, CHUNK_K=16),
    # session 11, batch 128 (Qwen3.5-4B's 3x miss): session 9's 64-row tile, the commit's
    # tiles (fp32 commits; in dual cases the F_ keys resize the two-pass kernel instead)
    "bv64w2": dict(BLOCK_V=64, num_warps=2),
    "commit-v32w4-nr4": {"fold": dict(F_BLOCK_V=32, F_num_warps=4, F_NR=4)},
    "commit-v16w2-nr4": {"fold": dict(F_BLOCK_V=16, F_num_warps=2, F_NR=4)},
    "commit-v16w2-nr2": {"fold": dict(F_BLOCK_V=16, F_num_warps=2, F_NR=2)},
    "commit-v16w2-nr1": {"fold": dict(F_BLOCK_V=16, F_num_warps=2, F_NR=1)},
    "bv128w2-r200": dict(maxnreg=200),
    "bv128w2-r255": dict(maxnreg=255),    # no budget below ptxas's own limit (dual's table sets 168)
    "bv128w2-r168": dict(maxnreg=168),
    # session 12: shared memory (Triton's 3 stages: 43 KiB, with the registers 4 programs per SM at
    # 128 rows); all slower (tune_spec_s12b.txt, _s12c.txt)
    "bv128w2-s1": dict(num_stages=1),
    "bv128w2-s2": dict(num_stages=2),
    "bv128w2-k16-s3": dict(CHUNK_K=16, num_stages=3),
    # the dual commit (u recomputed against the high copy; the table's is the two-pass kernel since
    # session 10): the rank-1 fold kernel's tiles (fp8 low copies), the flush step's rank-1 path
    # (FOLD_MMA off) over the listed rows (the dfold variants route fp32 commits to the fold kernel too)
    "dfold-v16w2": {"fold": dict(COMMIT_FOLD=True, BLOCK_V=16, num_warps=2)},
    "dfold-v64w4": {"fold": dict(COMMIT_FOLD=True, BLOCK_V=64, num_warps=4)},
    "dfold-v32w2": {"fold": dict(COMMIT_FOLD=True, BLOCK_V=32, num_warps=2)},
    "dstep-r1-v32w4": {"fold": dict(COMMIT_FOLD=False, F_TWO_PASS=False, F_COMPACT=True, F_FOLD_MMA=False,
                                    F_BLOCK_V=32, F_num_warps=4, F_NR=1)},
    "dstep-r1-v32w4-nr4": {"fold": dict(COMMIT_FOLD=False, F_TWO_PASS=False, F_COMPACT=True, F_FOLD_MMA=False,
                                        F_BLOCK_V=32, F_num_warps=4, F_NR=4)},
    "dstep-r1-v16w2": {"fold": dict(COMMIT_FOLD=False, F_TWO_PASS=False, F_COMPACT=True, F_FOLD_MMA=False,
                                    F_BLOCK_V=16, F_num_warps=2, F_NR=1)},
    # the two-pass dual commit kernel (_gdn_dual_2pass_kernel): rows per program, warps, dk step
    "d2p-v64w4": {"fold": dict(COMMIT_FOLD=False, F_TWO_PASS=True, F_BLOCK_V=64, F_num_warps=4)},
    "d2p-v128w8": {"fold": dict(COMMIT_FOLD=False, F_TWO_PASS=True, F_BLOCK_V=128, F_num_warps=8)},
    "d2p-v32w4": {"fold": dict(COMMIT_FOLD=False, F_TWO_PASS=True, F_BLOCK_V=32, F_num_warps=4)},
    "d2p-v64w4-k16": {"fold": dict(COMMIT_FOLD=False, F_TWO_PASS=True, F_BLOCK_V=64, F_num_warps=4, F_CHUNK_K=16)},
    "d2p-v128w4-k16": {"fold": dict(COMMIT_FOLD=False, F_TWO_PASS=True, F_BLOCK_V=128, F_num_warps=4,
                                    F_CHUNK_K=16)},
    # session 13: the state chunks through a TMA descriptor (one copy per chunk; sm_90: fp32 210
    # registers instead of 235, 198 under a 200 budget = 5 programs per SM with its 43 KiB)
    "tma": dict(TMA=True),
    "tma-r200": dict(TMA=True, maxnreg=200),
    "tma-r184": dict(TMA=True, maxnreg=184),
    "no-tma": dict(TMA=False),           # the table's TMA_T (16-bit read copies at T 2, 4, 6) off
    # session 14, the fp32 commit: the flush step's register budget (sm_90, Qwen3.5-4B b128: 164
    # registers = 6 two-warp programs per SM; 125 under 128, no spill, but 28 KiB of shared memory
    # allow 7) on the flush step (BALANCED off: the Qwen3.5-4B rows take the balanced fold);
    # "commit-s13": session 13's commit (no budget, no balanced fold), side by side
    "commit-s13": {"fold": dict(F_BALANCED=None, F_maxnreg=None)},
    "commit-r128": {"fold": dict(F_BALANCED=None, F_maxnreg=128)},
    "commit-r144": {"fold": dict(F_BALANCED=None, F_maxnreg=144)},
    "commit-r160": {"fold": dict(F_BALANCED=None, F_maxnreg=160)},
    "commit-r144-pf0": {"fold": dict(F_BALANCED=None, F_maxnreg=144, F_PF=0)},
    # the fold balanced over a fixed grid (_gdn_commit_balanced_kernel: per_sm programs per SM,
    # each folding an equal share of the listed rows' 16-row chunks; "maxnreg" None: ptxas's
    # choice, 214), at any number of value heads
    "bal6-r168": {"fold": dict(F_BALANCED={"per_sm": 6, "maxnreg": 168})},
    "bal7-r144": {"fold": dict(F_BALANCED={"per_sm": 7, "maxnreg": 144})},
    "bal8-r128": {"fold": dict(F_BALANCED={"per_sm": 8, "maxnreg": 128})},
    "bal12-r168": {"fold": dict(F_BALANCED={"per_sm": 12, "maxnreg": 168})},
    "bal6-r168-pf0": {"fold": dict(F_BALANCED={"per_sm": 6, "maxnreg": 168, "PF": 0})},
    "bal6-r168-pf1": {"fold": dict(F_BALANCED={"per_sm": 6, "maxnreg": 168, "PF": 1})},
    "bal3-v32w4-r168": {"fold": dict(F_BALANCED={"per_sm": 3, "BLOCK_V": 32, "num_warps": 4, "maxnreg": 168})},
    "bal4-pf0": {"fold": dict(F_BALANCED={"per_sm": 4, "PF": 0, "maxnreg": None})},
    # prepared in session 24, untimed: the commit's flush step reading its high chunks through TMA
    # (F_TMA, as the replay step's since c275939; sm_90 at b128 under the row's 160-register budget:
    # 160 with an 8-byte spill, 146 without TMA), and at <= 32 value heads instead of the balanced fold
    "commit-tma": {"fold": dict(F_TMA=True)},
    "commit-tma-nobal": {"fold": dict(F_TMA=True, F_BALANCED=None)},
    # session 25: and its stores through TMA too (F_ST_TMA; sm_90 at b128 under the 160 budget: 157
    # registers, no spill), pipelined at depth 2 (the table's rows: Triton's default, 3)
    "commit-tma-st": {"fold": dict(F_TMA=True, F_ST_TMA=True)},
    "commit-tma-st-nobal": {"fold": dict(F_TMA=True, F_ST_TMA=True, F_BALANCED=None)},
    "commit-tma-st2": {"fold": dict(F_TMA=True, F_ST_TMA=True, F_num_stages=2)},
    # tune_spec_s25a.txt: no gain at Qwen3.5-4B b128, which takes the balanced fold (the variants
    # above reached only the flush step). The balanced fold through TMA (its loop over a segment's
    # own chunks, which the pipeliner can run ahead; sm_90: 165-166 registers under its 168 budget,
    # 16-29 KiB of shared memory), with the stores through TMA, at depths 3 (Triton's default) / 2
    "bal-tma": {"fold": dict(F_BALANCED=dict(_BAL, TMA=True))},
    "bal-tma-st": {"fold": dict(F_BALANCED=dict(_BAL, TMA=True, ST_TMA=True))},
    "bal-tma-st2": {"fold": dict(F_BALANCED=dict(_BAL, TMA=True, ST_TMA=True, num_stages=2))},
    "bal-tma-st-any": {"fold": dict(F_BALANCED=dict(_BAL, TMA=True, ST_TMA=True, max_hv=64))},   # Qwen3.5-122B too
    # (tune_spec_s25b/c: 1 % faster T4 rounds at b128-256; since d8dc968 the table's commit rows
    # carry TMA and ST_TMA, so commit-tma, commit-tma-st, bal-tma and bal-tma-st repeat them)
    "bal5-r192-pf0": {"fold": dict(F_BALANCED={"per_sm": 5, "maxnreg": 192, "PF": 0})},
    "bal-any-t": {"fold": dict(F_BALANCED={"per_sm": 6, "maxnreg": 168, "PF": 0, "max_hv": 32})},   # T > 4 too
    # session 15: the round's launches as programmatic dependents (gdn.PDL): off, side by side
    "no-pdl": {"PDL": False, "fold": dict(PDL=False)},
    # session 21: the replay step's output launch ran faster with its hints one chunk ahead instead
    # of two (tune_gdn_s21b.txt); the commit's fold (hints two ahead) and the balanced fold (none)
    # with hints one ahead
    "commit-pfd1": {"fold": dict(F_PF_DIST=1)},
    "bal6-pf2d1": {"fold": dict(F_BALANCED={"per_sm": 6, "maxnreg": 168, "PF": 2, "PF_DIST": 1})},
    "bal6-pf1d1": {"fold": dict(F_BALANCED={"per_sm": 6, "maxnreg": 168, "PF": 1, "PF_DIST": 1})},
    # session 22: products of an fp32 side and raw bf16 keys / drafts as three bf16 terms of the fp32
    # side (mma "bf16x3e": bf16 MMAs, ~2^-23 per product) instead of the truncation split "tf32x2t"
    # (~2^-20): in the verify's state x drafts product (fp32 read copies), the commit's fold, the
    # dual commit's two-pass kernel (state x keys and fold). tune_spec_s22b.txt: slower in the
    # verify; faster in the commits' folds (the tables' above batch 64 since then)
    "x3e": dict(S_PREC="bf16x3e"),
    "commit-x3e": {"fold": dict(F_FOLD_PREC="bf16x3e")},
    "x3e-commit-x3e": dict(S_PREC="bf16x3e", fold=dict(F_FOLD_PREC="bf16x3e")),
    "dcommit-x3e": {"fold": dict(F_P_PREC="bf16x3e", F_FOLD_PREC="bf16x3e")},
    # the commits' fold before session 22 ("tf32x2t", still the table's at batch <= 64), side by
    # side with the shipped "bf16x3e"
    "commit-t2x": {"fold": dict(F_FOLD_PREC="tf32x2t")},
    # the balanced fold with "bf16x3e" (the table's since session 22) at more programs per SM, and
    # without software pipelining
    "bal6-s1": {"fold": dict(F_BALANCED={"per_sm": 6, "maxnreg": 168, "PF": 0, "num_stages": 1})},
    "bal8-r128-s1": {"fold": dict(F_BALANCED={"per_sm": 8, "maxnreg": 128, "PF": 0, "num_stages": 1})},
}
# the smoke run's dual and small-batch groups take only these (the p0 groups take all)
SMOKE_FEW = {"mamba2": ["default", "b32w2-late"], "gdn": ["default", "bv64w2-late"]}
PREC_KEYS = ("s_prec", "S_PREC")     # the fp32 state tile's dot precision: not for a bf16 read copy
PREC_NAMES = ("bf16x3", "bf16x2", "tf32x3", "split3", "ieee", "b3", "t2", "x3e")


def variants_of(op: str, lo: str = "none", names=None) -> dict[str, dict]:
    """{name: OVERRIDE["verify"] dict} of a case. Dual cases (a bf16 read copy, whose exact
    MMA precision is "bf16") drop the state-tile precision key and its token from the name;
    variants that become equal are measured once."""
    src = MAMBA2_VARIANTS if op == "mamba2" else GDN_VARIANTS
    out: dict[str, dict] = {}
    for name, ov in src.items():
        if names is not None and name not in names:
            continue
        if lo != "none":
            ov = {k: v for k, v in ov.items() if k not in PREC_KEYS}
            name = "-".join(t for t in name.split("-") if t not in PREC_NAMES)
            if ov in out.values():
                continue
        out.setdefault(name, ov)
    return out


# ----------------------------------------------------------------------------- output
NOTES: list[str] = []


def log(msg: str) -> None:
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def note(msg: str) -> None:
    NOTES.append(msg)
    log("NOTE " + msg)


# ----------------------------------------------------------------------------- variant hooks
def _module(op: str):
    """The Triton kernel module of a family (imported on first use)."""
    if op == "mamba2":
        from replayssm.triton import mamba2 as mod
    else:
        from replayssm.triton import gdn as mod
    return mod


def verify_override_dict(op: str) -> dict:
    """The module's OVERRIDE["verify"] dict."""
    return _module(op).OVERRIDE.setdefault("verify", {})


def apply_variant(op: str, ov: dict) -> None:
    """Clear the module's OVERRIDE["verify"] and fill it with the variant's dict."""
    d = verify_override_dict(op)
    d.clear()
    ov = dict(ov)
    fold = ov.pop("fold", {})
    _module(op).OVERRIDE["fold"] = dict(fold)
    d.update(ov)


def clear_variants() -> None:
    for op in ("mamba2", "gdn"):
        try:
            apply_variant(op, {})
        except Exception:  # noqa: BLE001 - a module that does not import: nothing to clear
            pass


# ----------------------------------------------------------------------------- cases
def mk_case(model: str, method: str, batch: int, T: int, K_: int, lo: str = "none", device: str = ""):
    """A replaybench.scenario.Case as the sweep builds it for scenarios/h200-spec.toml
    (L = K + T for spec-replay; no buffer axes for the others; default acceptance)."""
    from replaybench.accept import DEFAULT, resolve_accept
    from replaybench.models import get_model
    from replaybench.scenario import Case, make_case_id
    if method == "spec-replay" and lo != "none":
        method = "spec-replay-dual"
    L, KK = (K_ + T, K_) if method.startswith("spec-replay") else (0, 0)
    backend = "vllm" if method == "vllm-spec" else "triton"
    acc = resolve_accept(DEFAULT, T)
    return Case(case_id=make_case_id(model, method, backend, batch, L, KK, T, "float32", lo, 0, acc), runner="kernel",
                model=model, op=get_model(model).op, method=method, backend=backend, batch=batch, buffer_len=L,
                flush_period=KK, spec_window=T, state_dtype="float32", lo_dtype=lo, device=device, accept=acc)


def plan(args) -> list[dict]:
    """Groups (one case: model, batch, T, lo) in priority order, each with its methods/variants."""
    def g(prio, key, batch, lo, baselines, variants=None):
        model = MODELS[key]
        from replaybench.models import get_model
        op = get_model(model).op
        return dict(prio=prio, model=model, op=op, batch=batch, T=args.T, K=args.K, lo=lo, baselines=baselines,
                    variants=variants_of(op, lo, variants))

    if args.cpu_smoke:
        few = lambda key: SMOKE_FEW["mamba2" if key == "tm2" else "gdn"]  # noqa: E731
        return ([g(0, k, 2, "none", True) for k in ("tm2", "tgdn")]
                + [g(1, k, 2, "bfloat16", False, few(k)) for k in ("tm2", "tgdn")]
                + [g(2, k, 3, "none", True, few(k)[:1]) for k in ("tm2", "tgdn")])
    prios = {p.strip() for p in args.prio.split(",") if p.strip()}
    if not prios <= {"0", "1", "2"}:
        raise SystemExit(f"--prio: {args.prio!r}; allowed: a comma list of 0, 1, 2")
    names = [n for n in args.models.split(",") if n]
    for n in names:
        if n not in STUDY:
            raise SystemExit(f"--models: unknown {n!r}; allowed: {', '.join(STUDY)}")
    keep = None
    if args.variants:
        keep = ["default"] + [v for v in args.variants.split(",") if v]
        unknown = [v for v in keep if v not in MAMBA2_VARIANTS and v not in GDN_VARIANTS]
        if unknown:
            raise SystemExit(f"--variants: unknown {', '.join(unknown)}; allowed: "
                             f"{', '.join(sorted(set(MAMBA2_VARIANTS) | set(GDN_VARIANTS)))}")
    out = [g(0, k, args.batch, "none", True, keep) for k in ("super", "q122b", "nano", "q4b") if k in names]
    out += [g(1, k, args.batch, "bfloat16", False, keep) for k in ("super", "q122b", "nano", "q4b") if k in names]
    out += [g(2, k, 32, "none", True, keep) for k in ("super", "q122b", "nano") if k in names]
    return [grp for grp in out if str(grp["prio"]) in prios]


def jobs_of(groups) -> list[tuple]:
    """(case, op, variant name, variant dict) of every planned measurement, in order."""
    jobs = []
    for grp in groups:
        if grp["baselines"]:
            jobs.append((mk_case(grp["model"], "spec-perdraft", grp["batch"], grp["T"], grp["K"]), grp["op"], "-", {}))
            jobs.append((mk_case(grp["model"], "vllm-spec", grp["batch"], grp["T"], grp["K"]), grp["op"], "-", {}))
        for v, ov in grp["variants"].items():
            jobs.append((mk_case(grp["model"], "spec-replay", grp["batch"], grp["T"], grp["K"], grp["lo"]), grp["op"], v,
                         ov))
    return jobs


# ----------------------------------------------------------------------------- helpers
def copy_ceiling(dev: str) -> float:
    """GB/s of the suite's copy ceiling (replaybench.hardware.measure_ceilings: torch.add(x, 0,
    out=y), 1 GiB fp32 each on a GPU), as every sweep manifest records it."""
    from replaybench.hardware import measure_ceilings
    return measure_ceilings(dev)["copy_gbps"]


def launch_desc(case, model) -> str:
    """The verify launch the current OVERRIDE resolves to at the case's dims (planned on the
    'meta' device, nothing runs): Mamba-2 'P<rows>[+<tail rows>] n<state cols per MMA> w<warps> <s_prec>[ M]
    x:<x_prec> early|late [r<maxnreg>] [tma] [gram] [nopdl]', GDN 'V<rows> w<warps> k<dk per MMA> <s_prec>
    early|late' (+ other *PREC constexprs, s<stages>, r<maxnreg>, tma)."""
    from replaybench.runners.spec import spec_inputs
    from replayssm.state import GDNReplayState, Mamba2ReplayState
    d, T, L = model.ssm, case.spec_window, case.buffer_len
    mode, lo = ("dual", case.lo_dtype) if case.lo_dtype != "none" else ("replay", None)
    b = case.batch                      # launch tables depend on the batch
    gen = torch.Generator().manual_seed(0)
    inp, params = spec_inputs(model.op, d, 1, T, "cpu", gen)
    meta = lambda t, first: (torch.empty((first,) + tuple(t.shape[1:]), dtype=t.dtype, device="meta")  # noqa: E731
                             if isinstance(t, torch.Tensor) else t)
    inp = {k: meta(v, b) for k, v in inp.items()}
    params = {k: (v.to("meta") if isinstance(v, torch.Tensor) else v) for k, v in params.items()}
    idx = torch.zeros(b, dtype=torch.int32, device="meta")
    if model.op == "mamba2":
        from replayssm.triton import mamba2 as tk
        rs = Mamba2ReplayState.allocate(b, d.nheads, d.head_dim, d.d_state, d.n_groups, L, case.flush_period, mode,
                                        "float32", lo, torch.bfloat16, "meta")
        las = tk.plan_verify(rs, **inp, **params, state_indices=idx)[0]
        m = las[-1].meta
        return (f"P{m['BLOCK_P']}{'+' + str(m['TAIL_P']) if m.get('TAIL_P') else ''} n{m['BLOCK_N']}"
                f" w{m['num_warps']} {m['S_PREC']}"
                f"{' x:' + str(m['X_PREC']) if 'X_PREC' in m else ''} {'early' if m.get('EARLY_BUF') else 'late'}"
                f"{' r' + str(m['maxnreg']) if m.get('maxnreg') else ''}"
                f"{' tma' if m.get('TMA') else ''}{' gram' if len(las) > 1 else ''}"
                # PDL is resolved per device (none on 'meta'): the override's own word
                f"{' nopdl' if tk.OVERRIDE.get('verify', {}).get('pdl') is False else ''}")
    gk = _module("gdn")
    rs = GDNReplayState.allocate(b, d.num_k_heads, d.num_v_heads, d.head_k_dim, d.head_v_dim, L, case.flush_period,
                                 mode, "float32", lo, torch.bfloat16, "meta")
    o = torch.empty(inp["v"].shape, dtype=inp["v"].dtype, device="meta")
    _, _, _, m = gk.plan_verify(rs, inp["q"], inp["k"], inp["v"], inp["g"], inp["beta"], idx,
                                d.head_k_dim ** -0.5, o)
    out = f"V{m['BLOCK_V']} w{m['num_warps']} k{m['BLOCK_K']}"
    if "S_PREC" in m:
        out += f" {m['S_PREC']}"
    if "EARLY_BUF" in m:
        out += " early" if m["EARLY_BUF"] else " late"
    extra = [f"{k.split('_')[0].lower()[:2]}:{v}" for k, v in m.items()
             if "PREC" in k and k not in ("S_PREC", "K_PREC")]
    if "num_stages" in m:
        extra.append(f"s{m['num_stages']}")
    if "maxnreg" in m:
        extra.append(f"r{m['maxnreg']}")
    if m.get("TMA"):
        extra.append("tma")
    return " ".join([out] + extra)


def short_err(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    s = f"{type(e).__name__}: {s[0] if s else ''}"
    return s if len(s) <= 300 else s[:297] + "..."


# ----------------------------------------------------------------------------- background compile
def _warm_job(job) -> str:
    """Worker: the job's correctness check at batch 2, 2 rounds (compiles and runs every kernel
    of the round once; fills Triton's on-disk cache). '' or what failed."""
    case, op, vname, ov = job
    try:
        from replaybench.models import get_model
        from replaybench.runners import peers
        from replaybench.runners.spec import check_spec
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        model = get_model(case.model)
        if case.method == "vllm-spec":
            if dev != "cuda" or not peers.vllm_available():
                return ""
            peers.check_vllm_spec_layer(op, model.ssm, 2, case.spec_window, case.state_dtype, dev, steps=1)
            return ""
        apply_variant(op, ov)
        c = dataclasses.replace(case, batch=2, device=dev)
        check_spec(c, model, dev, rounds=2)
        return ""
    except Exception as e:  # noqa: BLE001 - the main process runs it again and reports
        return f"{SHORT.get(case.model, case.model)} {case.method} {case.lo_dtype} {vname}: {short_err(e)}"


def precompile(jobs, workers: int, timeout: float) -> None:
    import multiprocessing as mp
    todo, seen = [], set()
    for j in jobs:
        c = j[0]
        key = (c.model, c.method, c.lo_dtype, c.spec_window, j[2])     # batch is not part of a kernel's key
        if key not in seen:
            seen.add(key)
            todo.append(j)
    pool = None
    try:
        pool = mp.get_context("spawn").Pool(workers)
        res = pool.map_async(_warm_job, todo, chunksize=1)
        log(f"compiling: {len(todo)} jobs on {workers} worker processes (waiting <= {timeout:.0f} s)")
        errs = [e for e in res.get(timeout=timeout) if e]
        log(f"compile done ({len(errs)} failed)" + "".join(f"\n    {e}" for e in errs[:8]))
        pool.close()
        pool.join()
    except Exception as e:  # noqa: BLE001 - the main process compiles what is missing
        log(f"background compile: {short_err(e)} (the main process compiles the rest)")
        if pool is not None:
            pool.terminate()


# ----------------------------------------------------------------------------- measure
ROWS: list[dict] = []
BASE: dict = {}         # (model, batch, T, method) -> us
LAUNCHES: dict = {}     # case_id -> {launch description: first variant that resolved to it}
COLUMNS = ["model", "model_full", "op", "batch", "T", "state", "method", "variant", "launch", "us", "iqr_us",
           "samples", "layers", "gbps", "pct_copy", "x_perdraft", "x_vllm", "bytes_model", "bytes_counted",
           "counted_vs_model", "check_rel_err", "verified_tok_s", "committed_tok_s", "copy_gbps", "elapsed_s",
           "error"]
HEADER = (f"{'model':6} {'batch':>5} {'T':>2} {'state':9} {'method':13} {'variant':15} {'launch':44} "
          f"{'us':>9} {'GB/s':>7} {'%copy':>6} {'xPD':>6} {'xvLLM':>6} {'iqr%':>5} {'lay':>4} {'n':>4}")


def state_label(lo: str) -> str:
    return "fp32" if lo == "none" else f"dual-{'bf16' if lo == 'bfloat16' else lo}"


def _n(v, width: int, prec: int | None = None) -> str:
    """v right-aligned in width ('-' for None / NaN); prec None: an integer."""
    if v is None or (isinstance(v, float) and v != v):
        return f"{'-':>{width}}"
    return f"{v:{width}.{prec}f}" if prec is not None else f"{int(v):{width}d}"


def fmt(r) -> str:
    iqr = 100 * r["iqr_us"] / r["us"] if r.get("iqr_us") is not None and r["us"] else None
    return (f"{r['model']:6} {r['batch']:5d} {r['T']:2d} {r['state']:9} {r['method']:13} {r['variant']:15} "
            f"{r['launch'][:44]:44} {_n(r['us'], 9, 2)} {_n(r['gbps'], 7, 0)} {_n(r['pct_copy'], 6, 1)} "
            f"{_n(r['x_perdraft'], 6, 3)} {_n(r['x_vllm'], 6, 3)} {_n(iqr, 5, 1)} {_n(r['layers'], 4)} "
            f"{_n(r['samples'], 4)}")


class Output:
    def __init__(self, path: str | None):
        self.path, self.f, self.w = path, None, None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self.f = open(path, "w", newline="", encoding="utf-8")
            self.w = csv.DictWriter(self.f, fieldnames=COLUMNS, extrasaction="ignore")
            self.w.writeheader()
            self.f.flush()

    def row(self, r: dict) -> None:
        ROWS.append(r)
        if not r.get("error"):
            print(fmt(r), flush=True)
        if self.w is not None:
            self.w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in COLUMNS})
            self.f.flush()


def measure_one(case, op, vname, ov, ctx, args, out: Output) -> bool:
    """One measurement (check + timing through the runners); False if the GPU is unusable after it."""
    from replaybench.models import get_model
    from replaybench.runners import SkipCase, peers
    from replaybench.runners import spec as sp
    model = get_model(case.model)
    short = SHORT.get(case.model, case.model)
    key = (case.model, case.batch, case.spec_window)
    base = dict(model=short, model_full=case.model, op=op, batch=case.batch, T=case.spec_window,
                state=state_label(case.lo_dtype), method=case.method, variant=vname, launch="", us=float("nan"),
                iqr_us=None, samples=None, layers=None, gbps=float("nan"), pct_copy=float("nan"),
                x_perdraft=float("nan"), x_vllm=float("nan"), copy_gbps=args.copy, error="")
    t0 = time.time()
    try:
        if case.method.startswith("spec-replay"):
            seen = LAUNCHES.setdefault(case.case_id, {})
            if not seen:
                apply_variant(op, {})
                try:
                    seen[launch_desc(case, model)] = "default"
                except Exception:  # noqa: BLE001 - informational only
                    pass
            apply_variant(op, ov)
            try:
                base["launch"] = launch_desc(case, model)
            except Exception as e:  # noqa: BLE001 - informational only
                base["launch"] = f"? {short_err(e)}"
            first = seen.setdefault(base["launch"], vname)
            if first != vname and not base["launch"].startswith("?"):
                note(f"SAME LAUNCH: {short} b{case.batch} {base['state']}: variant {vname} resolves to the launch of "
                     f"{first} ({base['launch']}){'; tiny dims clamp the blocks' if model.tiny else ''}")
            m = sp.run(case, ctx)
        elif case.method == "spec-perdraft":
            clear_variants()
            m = sp.run(case, ctx)
        else:
            clear_variants()
            m = peers.run(case, ctx)
    except SkipCase as e:
        log(f"skip {short} b{case.batch} T{case.spec_window} {case.method}: {e}")
        return True
    except AssertionError as e:
        log(f"CHECK FAILED {short} b{case.batch} T{case.spec_window} {base['state']} {case.method} {vname}: "
            f"{short_err(e)}")
        out.row(dict(base, error="check: " + short_err(e), elapsed_s=time.time() - t0))
        return True
    except Exception as e:  # noqa: BLE001 - a failing variant is reported, the run goes on
        msg = short_err(e)
        log(f"ERROR {short} b{case.batch} T{case.spec_window} {base['state']} {case.method} {vname}: {msg}")
        if args.verbose:
            traceback.print_exc()
        out.row(dict(base, error=msg, elapsed_s=time.time() - t0))
        dead = "illegal" in msg.lower() or ("CUDA error" in msg and "out of memory" not in msg)
        return not dead
    finally:
        clear_variants()
        if args.dev == "cuda":
            torch.cuda.empty_cache()
    us = m["median_us"]
    nbytes = m["bytes_model"]
    gbps = nbytes / us * 1e-3
    if case.method in ("spec-perdraft", "vllm-spec"):
        BASE[key + (case.method,)] = us
    pd, vl = BASE.get(key + ("spec-perdraft",)), BASE.get(key + ("vllm-spec",))
    cnt = m.get("bytes_counted")
    out.row(dict(base, us=us, iqr_us=m.get("iqr_us"), samples=m.get("samples"), layers=m.get("layers"), gbps=gbps,
                 pct_copy=100 * gbps / args.copy, x_perdraft=pd / us if pd else float("nan"),
                 x_vllm=vl / us if vl else float("nan"), bytes_model=nbytes, bytes_counted=cnt,
                 counted_vs_model=(cnt / nbytes if cnt else None), check_rel_err=m.get("check_rel_err"),
                 verified_tok_s=m.get("verified_tokens_per_s"), committed_tok_s=m.get("committed_tokens_per_s"),
                 elapsed_s=time.time() - t0))
    return True


# ----------------------------------------------------------------------------- summary
def summary() -> None:
    ok = [r for r in ROWS if not r.get("error") and r["us"] == r["us"]]
    print("\n=== best spec-replay variant per case (xPD: spec-perdraft us / us; xvLLM: vllm-spec us / us; "
          "same model, batch, T, this run; 'vs default': default us / best us)", flush=True)
    cases: dict = {}
    for r in ok:
        if r["method"].startswith("spec-replay"):
            cases.setdefault((r["model"], r["batch"], r["T"], r["state"]), []).append(r)
    print(HEADER + f" {'vs default':>10} {'default us':>10}", flush=True)
    for k, rs in cases.items():
        best = min(rs, key=lambda r: r["us"])
        dflt = next((r["us"] for r in rs if r["variant"] == "default"), float("nan"))
        pd = BASE.get((best["model_full"], best["batch"], best["T"], "spec-perdraft"))
        vl = BASE.get((best["model_full"], best["batch"], best["T"], "vllm-spec"))
        b = dict(best, x_perdraft=pd / best["us"] if pd else float("nan"),
                 x_vllm=vl / best["us"] if vl else float("nan"))
        print(fmt(b) + f" {dflt / best['us']:10.3f} {dflt:10.2f}", flush=True)
    print("\n=== baselines (us per round per layer)", flush=True)
    for (model, batch, T, method), us in BASE.items():
        print(f"{SHORT.get(model, model):6} {batch:5d} {T:2d} {method:13} {us:9.2f}", flush=True)
    for r in ROWS:
        if r.get("error"):
            print(f"FAILED: {r['model']} b{r['batch']} T{r['T']} {r['state']} {r['method']} {r['variant']}: "
                  f"{r['error']}", flush=True)
    for n in NOTES:
        print(f"NOTE: {n}", flush=True)


# ----------------------------------------------------------------------------- main
def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deadline", type=float, default=420.0, help="seconds after start: no new measurement")
    ap.add_argument("--models", default=",".join(STUDY), help="of: " + ", ".join(STUDY))
    ap.add_argument("--variants", default="", help="comma list of variant names to measure (plus default; "
                    "a family measures the ones it has); default: all")
    ap.add_argument("--T", type=int, default=T_SPEC, help="draft window (default 4)")
    ap.add_argument("--batch", type=int, default=256, help="batch of the p0 and p1 cases (default 256)")
    ap.add_argument("--prio", default="0,1,2", help="case groups to run, of 0 (fp32), 1 (dual bf16), 2 (batch 32)")
    ap.add_argument("--K", type=int, default=K, help="flush period (default 16; buffer_len = K + T)")
    ap.add_argument("--max-time", type=float, default=0.5, help="timing: max seconds of samples per measurement")
    ap.add_argument("--workers", type=int, default=12, help="background compile processes (0: none)")
    ap.add_argument("--no-vllm", action="store_true", help="skip vllm-spec")
    ap.add_argument("--csv", default=None, help="CSV path (default $OUT/tune_spec.csv when OUT is set)")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny models on the CPU (TRITON_INTERPRET=1)")
    ap.add_argument("--verbose", action="store_true", help="tracebacks of failures")
    args = ap.parse_args()

    from replaybench.runners import RunContext
    from replaybench.scenario import TimingConfig
    if args.cpu_smoke:
        args.dev = "cpu"
        args.T, args.K = 2, 2                    # buffer_len 4: a flush every round or two
        timing = TimingConfig(warmup=0, min_samples=1, max_samples=1, max_time_s=0.01, rel_iqr=1.0)
    else:
        if not torch.cuda.is_available():
            raise SystemExit("no CUDA device: use --cpu-smoke (with TRITON_INTERPRET=1) on a CPU")
        args.dev = "cuda"
        timing = TimingConfig(warmup=2, min_samples=10, max_samples=60, max_time_s=args.max_time, rel_iqr=0.005)
    csv_path = args.csv or (os.path.join(os.environ["OUT"], "tune_spec.csv") if os.environ.get("OUT") else None)

    import triton
    sha = (ROOT / ".git-sha").read_text().strip() if (ROOT / ".git-sha").is_file() else "?"
    name = torch.cuda.get_device_name() if args.dev == "cuda" else "cpu (Triton interpreter)"
    log(f"{name}; torch {torch.__version__}, triton {triton.__version__}; git {sha}; "
        f"TRITON_INTERPRET={os.environ.get('TRITON_INTERPRET', '')}")
    from replaybench.runners import peers
    vllm_ok = (not args.no_vllm) and args.dev == "cuda" and peers.vllm_available()
    if args.dev == "cuda" and not vllm_ok and not args.no_vllm:
        note("vLLM's kernels are not importable here (.vllm-stub missing?): no vllm-spec rows")

    groups = plan(args)
    jobs = [j for j in jobs_of(groups) if vllm_ok or j[0].method != "vllm-spec" or args.cpu_smoke]
    log(f"plan: {len(groups)} cases, {len(jobs)} measurements; K {args.K}, T {args.T}, L {args.K + args.T}, "
        f"accept {jobs[0][0].accept if jobs else '-'}; timing {timing}; deadline {args.deadline:.0f} s; "
        f"csv {csv_path or '(none: set OUT or --csv)'}")

    args.copy = copy_ceiling(args.dev)
    log(f"copy ceiling {args.copy:.0f} GB/s (torch.add(x, 0, out=y), 2 x {'1 GiB' if args.dev == 'cuda' else '256 MiB'}"
        f" fp32)")
    ctx = RunContext(device=args.dev, timing=timing, ceilings={"copy_gbps": args.copy}, device_name=name)

    if args.workers > 0:
        if args.dev == "cuda":
            precompile(jobs, args.workers, timeout=max(10.0, args.deadline / 3))
        else:   # the smoke run checks the worker path on two jobs
            precompile([j for j in jobs if j[0].method.startswith("spec-replay")][:2], min(args.workers, 2), timeout=120.0)

    out = Output(csv_path)
    print(HEADER, flush=True)
    try:
        alive = True
        for case, op, vname, ov in jobs:
            if not alive:
                break
            if time.time() - T0 > args.deadline:
                log(f"deadline: {SHORT.get(case.model)} b{case.batch} {state_label(case.lo_dtype)} {case.method} "
                    f"{vname} not measured")
                continue
            case = dataclasses.replace(case, device=args.dev)
            alive = measure_one(case, op, vname, ov, ctx, args, out)
        if not alive:
            log("the GPU is unusable after the last error: stopping")
    finally:
        summary()
        log(f"done ({len(ROWS)} rows" + (f", {csv_path}" if csv_path else "") + ")")
        if out.f is not None:
            out.f.close()
    return 0


if __name__ == "__main__":
    rc = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)        # do not wait for compile workers still running
