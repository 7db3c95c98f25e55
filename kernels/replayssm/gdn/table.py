"""GDN launch table: one `Row` (common.table) per condition, picked first-match per op.

Ops: "eager", "replay" (the step's first launch: small-batch route or output launch),
"flush_step" (the SPLIT step's fold, keyed by work = batch x value heads), "commit" (the
speculative commit's fold), "fold" (standalone flush), "verify". Case keys: batch, heads,
state_bytes (bytes per element of the copy the launch streams), dual, route (small-batch routing
on: GDNOptions.small_batch_route) and dual_route_heads (GDNOptions). Params: BLOCK_V (rows per
chunk, clamped to dv), num_warps and the planner's keys (plan.py; docs/gdn.md explains each).
Rows were chosen on an H200 at Qwen3.5 dims (dk = dv = 128); `run` names the committed baseline.
"""
from __future__ import annotations

from ..common.table import Row, Table

FP32 = "h200-kernels-fp32-20261203-nvidia-h200"
SPEC = "h200-spec-20261202-nvidia-h200"
SMALL = "h200-small-batch-20261203-nvidia-h200"
SMALL16 = "h200-small-batch-bf16-20261201-nvidia-h200"
EAGER16 = "h200-eager-bf16-20261202-nvidia-h200"

# 16/8-bit read copies above the small batches: one chunk of whole heads through TMA, SPLIT
_BIG_READ = {"NR": 1, "HP": 4, "PF": 2, "PF_DIST": 1, "SPLIT": True}
_BIG_TMA = dict(_BIG_READ, PF=0, TMA=True)
# the fp32 commit's fold balanced over a fixed grid (gdn_commit_balanced_kernel)
_BALANCED_COMMIT = {"max_hv": 32, "max_t": 4, "per_sm": 6, "maxnreg": 168, "PF": 0}
_FLUSH_STEP = {"HP": 1, "PF": 2, "PF_DIST": 2, "FOLD_MMA": True, "FOLD_PREC": "bf16x3e", "TMA": True}
_DUAL_FLUSH = {"HP": 1, "PF": 2, "PF_DIST": 2, "FOLD_MMA": True, "SMALL_PREC": "tf32x3"}
# the dual flush step: raw-key products as three bf16 terms, stores through TMA, the chunk loop
# pipelined at depth 3, the small fp32 products as six bf16 MMAs ("bf16x6")
_DUAL_FLUSH_S6 = dict(_DUAL_FLUSH, P_PREC="bf16x3e", FOLD_PREC="bf16x3e", num_stages=3, TMA=True, ST_TMA=True,
                      PF=0, SMALL_PREC="bf16x6")
_SPLIT_SMALL = {"NR": 2, "HP": 2, "PF": 2, "PF_DIST": 2, "SPLIT": True, "PREFETCH": True}
_COMMIT_BIG = {"NR": 4, "HP": 1, "PF": 2, "PF_DIST": 2, "FOLD_MMA": True, "COMPACT": True, "FOLD_SPLIT": True,
               "FOLD_PREC": "bf16x3e", "maxnreg": 160, "BALANCED": _BALANCED_COMMIT, "TMA": True, "ST_TMA": True}


def _p(block_v: int, num_warps: int, **kw) -> dict:
    return {"BLOCK_V": block_v, "num_warps": num_warps, **kw}


def _dual_routes(case) -> bool:
    """A dual state's step takes the high copy's route while batch x heads is small."""
    return case.work <= case.dual_route_heads


ROUTE = {"route": True}

ROWS = [
    # ---------------------------------------------------------------- eager
    Row("eager-bf16-b2", "eager", _p(4, 1), state_bytes=2, max_batch=2,
        why="bf16 eager at batch <= 2: 4-row tiles, the fewest instructions per launch", run=SMALL16),
    Row("eager-bf16-b256", "eager", _p(8, 1), state_bytes=2, max_batch=256,
        why="bf16 eager: 8-row tiles on one warp, ~94 % of a copy's bandwidth", run=SMALL16),
    Row("eager-bf16-big", "eager", _p(8, 1, TILES=2, LOAD_EV="", STORE_EV=""), state_bytes=2,
        why="above batch 256 two tiles per program (both loads in flight), the state unhinted", run=EAGER16),
    Row("eager-b256", "eager", _p(4, 1), max_batch=256,
        why="fp32 eager: 4-row tiles on one warp at every batch; evict-first hints win to batch 256", run=FP32),
    Row("eager-big", "eager", _p(4, 1, LOAD_EV="", STORE_EV=""),
        why="above batch 256 the state's loads and stores unhinted (GBs of state per layer)", run=FP32),
    # ---------------------------------------------------------------- replay: dual states
    Row("replay-dual-route", "replay", _p(4, 1, EAGER_ROUTE=True, maxnreg=56), dual=True, match=ROUTE,
        when=_dual_routes,
        why="small dual steps take the high copy's route (low copy marked stale): fp32 eager's bytes", run=SMALL),
    Row("replay-dual16-b4", "replay", _p(8, 1, PREFETCH=True), dual=True, state_bytes=2, max_batch=4,
        why="dual, routing off, batch <= 4: one 8-row tile per program, buffer read early", run=SMALL),
    Row("replay-dual16-b8", "replay", _p(32, 4, **_SPLIT_SMALL), dual=True, state_bytes=2, max_batch=8,
        why="dual batch 5-8: 2 heads x 2 chunks of 32 rows per program", run=SMALL),
    Row("replay-dual16-b16", "replay", _p(64, 4, **dict(_BIG_TMA, HP=2, NR=2, RD_MMA=True, num_stages=1)),
        dual=True, state_bytes=2, max_batch=16,
        why="dual batch 9-16: 64-row chunks through TMA, the read copy's dots as one MMA per chunk", run=SMALL),
    Row("replay-dual16-b32", "replay", _p(128, 4, **dict(_BIG_TMA, HP=2, RD_MMA=True, num_stages=1)),
        dual=True, state_bytes=2, max_batch=32,
        why="dual batch 17-32: whole 128-row heads through TMA, 2 heads per program", run=FP32),
    Row("replay-dual16-b128", "replay", _p(128, 4, **dict(_BIG_TMA, RD_MMA=True, num_stages=1)),
        dual=True, state_bytes=2, max_batch=128,
        why="dual batch 33-128: whole heads through TMA, 4 heads per program", run=FP32),
    Row("replay-dual16-big", "replay", _p(64, 4, **dict(_BIG_TMA, NR=2, RD_MMA=True, num_stages=1, maxnreg=80)),
        dual=True, state_bytes=2,
        why="dual above 128: 64-row chunks under an 80-register budget, 6 programs per SM", run=FP32),
    # ---------------------------------------------------------------- replay: 8-bit read copies
    Row("replay-fp8-b4", "replay", _p(8, 1, PREFETCH=True), state_bytes=1, max_batch=4,
        why="fp8 read copy, batch <= 4: one 8-row tile per program (no committed run covers fp8)"),
    Row("replay-fp8-b8", "replay", _p(32, 4, **_SPLIT_SMALL), state_bytes=1, max_batch=8,
        why="fp8 read copy, batch 5-8: 2 heads x 2 chunks of 32 rows"),
    Row("replay-fp8-b64", "replay", _p(128, 4, **dict(_BIG_TMA, PREFETCH=True)), state_bytes=1, max_batch=64,
        why="fp8 read copy, batch 9-64: whole heads through TMA, buffer read early"),
    Row("replay-fp8-big", "replay", _p(128, 4, **dict(_BIG_READ, TMA=True)), state_bytes=1,
        why="fp8 read copy above 64: whole heads through TMA with L1 prefetch hints"),
    # ---------------------------------------------------------------- replay: bf16 states
    Row("replay-bf16-route-b4", "replay", _p(4, 1, EAGER_ROUTE=True), dual=False, state_bytes=2, max_batch=4,
        match=ROUTE, why="bf16 state, batch <= 4: the route (a flush every step) on 4-row tiles", run=SMALL16),
    Row("replay-bf16-route-b32", "replay", _p(8, 1, EAGER_ROUTE=True, PENDING_CALL=True), dual=False,
        state_bytes=2, max_batch=32, match=ROUTE,
        why="bf16 state, batch <= 32: the route on 8-row tiles, its rare path a call (fewer registers)",
        run=SMALL16),
    Row("replay-bf16-b4", "replay", _p(8, 1, PREFETCH=True), dual=False, state_bytes=2, max_batch=4,
        why="bf16 state, routing off, batch <= 4: one 8-row tile per program", run=SMALL16),
    Row("replay-bf16-b8", "replay", _p(32, 4, **_SPLIT_SMALL), dual=False, state_bytes=2, max_batch=8,
        why="bf16 state batch 5-8: 2 heads x 2 chunks of 32 rows", run=SMALL16),
    Row("replay-bf16-b32", "replay", _p(128, 4, **dict(_BIG_TMA, HP=2)), dual=False, state_bytes=2, max_batch=32,
        why="bf16 state batch 9-32: whole heads through TMA, 2 per program", run=SMALL16),
    Row("replay-bf16-big", "replay", _p(128, 4, **_BIG_TMA), dual=False, state_bytes=2,
        why="bf16 state above 32: whole heads through TMA, 4 per program (no committed run covers it)"),
    # ---------------------------------------------------------------- replay: fp32 states
    Row("replay-route-b4", "replay", _p(4, 1, EAGER_ROUTE=True, maxnreg=56), dual=False, max_batch=4, match=ROUTE,
        why="batch <= 4: the route (a flush every step, eager's traffic) beats buffering", run=SMALL),
    Row("replay-defer-b16", "replay", _p(4, 1, EAGER_ROUTE=True, ROUTE_K=2), dual=False, max_batch=16, match=ROUTE,
        why="batch 5-16: the deferred route, the state written every other step", run=SMALL),
    Row("replay-b4", "replay", _p(8, 1, PREFETCH=True), max_batch=4,
        why="routing off, batch <= 4: one 8-row tile per program, buffer read early", run=SMALL),
    Row("replay-split", "replay", _p(64, 4, NR=2, HP=2, PF=0, SPLIT=True, TMA=True),
        why="64-row chunks through TMA, 2 chunks x 2 heads per program, flush in a second launch", run=FP32),
    # ---------------------------------------------------------------- flush step (work = batch x heads)
    Row("flush-dual-w1024", "flush_step", _p(16, 2, **dict(_DUAL_FLUSH_S6, NR=1)), dual=True, max_work=1024,
        why="dual flush step, few flushing rows: one 16-row chunk per program", run=FP32),
    Row("flush-dual-w2048", "flush_step", _p(16, 2, **dict(_DUAL_FLUSH_S6, NR=2)), dual=True, max_work=2048,
        why="dual flush step: two chunks per program from 1025 head-rows", run=FP32),
    Row("flush-dual-w4096", "flush_step", _p(16, 2, **dict(_DUAL_FLUSH_S6, NR=4)), dual=True, max_work=4096,
        why="dual flush step: half a head per program from 2049 head-rows", run=FP32),
    Row("flush-dual-big", "flush_step", _p(16, 2, **dict(_DUAL_FLUSH_S6, NR=8)), dual=True,
        why="dual flush step: a whole head per program from 4097 head-rows", run=FP32),
    Row("flush-bf16-w2048", "flush_step", _p(32, 4, **dict(_FLUSH_STEP, NR=1)), state_bytes=2, max_work=2048,
        why="bf16 flush step: one 32-row chunk per program", run=SMALL16),
    Row("flush-bf16-w4096", "flush_step", _p(32, 4, **dict(_FLUSH_STEP, NR=2)), state_bytes=2, max_work=4096,
        why="bf16 flush step: two chunks per program (no committed run covers it)"),
    Row("flush-bf16-big", "flush_step", _p(32, 4, **dict(_FLUSH_STEP, NR=4)), state_bytes=2,
        why="bf16 flush step: four chunks per program (no committed run covers it)"),
    Row("flush-w2048", "flush_step", _p(32, 4, **dict(_FLUSH_STEP, NR=1)), max_work=2048,
        why="fp32 flush step (matrix-product fold): one 32-row chunk per program", run=FP32),
    Row("flush-big", "flush_step", _p(32, 4, **dict(_FLUSH_STEP, NR=2)),
        why="fp32 flush step: two chunks per program", run=FP32),
    # ---------------------------------------------------------------- speculative commit
    Row("commit-dual", "commit", _p(128, 4, **dict(_DUAL_FLUSH, NR=1, TWO_PASS=True, CHUNK_K=16,
                                                     FOLD_PREC="bf16x3e")), dual=True,
        why="dual commit: the two-pass kernel, a whole head per program (fp8 low copies: the rank-1 fold)",
        run=SPEC),
    Row("commit-b64", "commit", _p(32, 4, NR=4, HP=1, PF=2, PF_DIST=2, FOLD_MMA=True, COMPACT=True,
                                   FOLD_SPLIT=True), max_batch=64,
        why="commit fold over the listed rows, 32-row chunks x 4 on 4 warps", run=SPEC),
    Row("commit-b128", "commit", _p(16, 2, **_COMMIT_BIG), max_batch=128,
        why="commit fold, half a head per program through TMA; the balanced fold at <= 32 heads", run=SPEC),
    Row("commit-big", "commit", _p(16, 2, **dict(_COMMIT_BIG, NR=8)),
        why="commit fold, a whole head per program through TMA; the balanced fold at <= 32 heads", run=SPEC),
    # ---------------------------------------------------------------- standalone fold (flush)
    Row("fold", "fold", _p(32, 4), why="the standalone flush: rare (off the decode path), untuned"),
    # ---------------------------------------------------------------- verify
    Row("verify-16-b4", "verify", _p(16, 1), state_bytes=2, max_batch=4,
        why="16-bit read copy, batch <= 4: 16-row tiles on one warp", run=SPEC),
    Row("verify-16", "verify", _p(128, 2, WIDE_BLOCK_V=64, MAXNREG_T={4: 168, 6: 168}, TMA_T=(2, 4, 6)),
        state_bytes=2,
        why="a whole head per program; T 4 / 6 under 168 registers (6 programs per SM), chunks via TMA",
        run=SPEC),
    Row("verify-b4", "verify", _p(16, 1), max_batch=4,
        why="batch <= 4: 16-row tiles on one warp", run=SPEC),
    Row("verify", "verify", _p(128, 2, WIDE_BLOCK_V=64),
        why="a whole 128-row head per program on 2 warps: the per-head work done once", run=SPEC),
    # ---------------------------------------------------------------- bookkeeping launches
    Row("cursor-b128", "cursor", {"num_warps": 1}, max_batch=128,
        why="the commit's cursor launch: one program over the batch", run=SPEC),
    Row("cursor-big", "cursor", {"num_warps": 4}, why="the commit's cursor launch above 128 rows", run=SPEC),
    Row("refresh-lo", "refresh_lo", {"BLOCK_V": 16, "num_warps": 1},
        why="stale low copies refreshed before a verify (after a routed step): a rare path"),
    Row("clear-bits", "clear_bits", {"num_warps": 4},
        why="cursor words reduced to the count (stale bit, route epoch) before a verify"),
]

# the params each op's rows (and GDNOptions.override) may set
_LAUNCH = {"BLOCK_V", "BLOCK_L", "num_warps", "num_stages", "maxnreg"}
_EVICT = {"LOAD_EV", "STORE_EV"}
FLUSH_PARAMS = _LAUNCH | _EVICT | {"NR", "HP", "PF", "PF_DIST", "FOLD_MMA", "FOLD_PREC", "FOLD_SPLIT", "P_PREC",
                                   "SMALL_PREC", "GRAM_PREC", "TMA", "ST_TMA", "TWO_PASS", "CHUNK_K", "NW_MUL",
                                   "COMPACT", "BALANCED", "COMMIT_FOLD"}
PARAMS = {
    "eager": _LAUNCH | _EVICT | {"TILES"},
    "replay": _LAUNCH | _EVICT | {"EAGER_ROUTE", "ROUTE_K", "PENDING_CALL", "NR", "HP", "PF", "PF_DIST", "PREFETCH",
                                  "SPLIT", "TMA", "RD_MMA", "PACK", "LOOP_STAGES", "PDL"},
    "flush_step": FLUSH_PARAMS,
    "commit": FLUSH_PARAMS,
    "fold": _LAUNCH,
    "cursor": {"num_warps"},
    "refresh_lo": {"BLOCK_V", "num_warps"},
    "clear_bits": {"num_warps"},
    "verify": _LAUNCH | {"WIDE_BLOCK_V", "MAXNREG_T", "TMA_T", "TMA", "S_PREC", "SMALL_PREC", "EARLY_BUF", "CHUNK_K",
                         "PDL"},
}

TABLE = Table(ROWS, PARAMS)
