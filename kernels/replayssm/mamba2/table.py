"""The Mamba-2 launch table: which tiles each op launches, per case (common.table schema).

Ops and their case keys (all picks also get batch, heads, work = batch x heads, head_dim, dual):
  eager   state_bytes: the state's bytes per element (4: fp32/fp64, 2: 16-bit)
  fold    state_bytes: the high copy's (flush and commit)
  verify  state_bytes: the read copy's (the low copy of a dual state)
  route   state_bytes: the copy the small-batch route reads and writes (a dual state's high
          copy); a row with route "buffered" sends the step down the buffered path
  replay  state_bytes: the read copy's (the buffered step)
fp64 states count as 4. Buckets: "small" below SMALL_PROGRAMS programs' worth of batch x heads
(too few to fill 132 SMs), "large" from there; batch 1 has rows of its own.

Params: eager / fold / verify: block_p (rows per chunk, clamped to next_pow2(head_dim)),
chunks (row chunks per program; 0: the whole head), warps; verify also tma (None: read the
state through TMA descriptors where it can, False: pointer loads). replay / route: REPLAY_DEFAULTS'
keys (a row gives the ones it changes):
  block_p, warps, chunks  rows per program (one [rows, N] tile loaded with one 2-D load)
  route     "fused" (one launch; flushing sequences fold inside the step), "split" (an
            output-only step + a flush launch; slower everywhere, kept for studies), "eager"
            (the small-batch route: a flush at every route_k-th step)
  early     load the read-checkpoint tile before the cursor (its address does not depend on it)
  preload   load the buffered B and x tiles right after the cursor, before any compute
  ticket    the step moves the cursor itself (one atomic per program) instead of a cursor pass
  fold_rows / fold_cols   rows / columns per fold chunk of a flushing program (0: whole rows);
            below N, flushing programs re-read their high rows in chunks, so the rare flush path
            does not raise every program's register count (not with fp8 copies: row scales)
  evict     cache hint on the streamed state; pf: prefetch hint for the read tile (0/1 L2/2 L1)
  maxnreg   ptxas register cap per thread (None: ptxas' choice)
  bc        B_i . C from a launch ahead of the step (PRE_BC); coef: every per-head term of the
            output route there too (PRE_COEF; needs the ticket off)
  pdl       that pre-pass and the step as programmatic dependent launches (None: options.pdl)
  route_k   the small-batch route's period (1..127; >= 2 writes the state every k-th step)
  fold_wait the step's flushing programs wait for the pre-pass too
"""
from __future__ import annotations

import triton

from ..common.table import Row, Table
from ..state import EPOCH_ROWS
from .options import Mamba2Options

SMALL_PROGRAMS = 2048       # batch x heads from which a launch fills the H200's 132 SMs ("large")

KERNELS_FP32 = "h200-kernels-fp32-20261203-nvidia-h200"
SPEC = "h200-spec-20261202-nvidia-h200"
SMALL = "h200-small-batch-20261203-nvidia-h200"
SMALL_BF16 = "h200-small-batch-bf16-20261201-nvidia-h200"
EAGER_BF16 = "h200-eager-bf16-20261202-nvidia-h200"
BF16_ULTRA = "h200-bf16-ultra-20261203-nvidia-h200"
LARGE = "h200-mamba2-large-20261201-nvidia-h200"

REPLAY_DEFAULTS = dict(route="fused", early=True, preload=True, ticket=True, fold_rows=16, fold_cols=0, evict="",
                       maxnreg=None, pf=0, bc=False, pdl=None, route_k=1, coef=False, fold_wait=True, chunks=1)
# the lean buffered step: 16-row programs on 1 warp, every load after the cursor, the flush
# folded in 16 x 16 chunks (72-80 registers on sm_90 instead of 128-168: 2-3x the warps per SM)
LEAN = dict(block_p=16, warps=1, early=False, preload=False, ticket=False, fold_cols=16)
_TILE = {"block_p", "chunks", "warps"}
PARAMS = {"eager": _TILE, "fold": _TILE, "verify": _TILE | {"tma"},
          "replay": set(REPLAY_DEFAULTS) | {"block_p", "warps"}, "route": set(REPLAY_DEFAULTS) | {"block_p", "warps"}}
SMALL_W, LARGE_W = dict(max_work=SMALL_PROGRAMS - 1), dict(min_work=SMALL_PROGRAMS)


def _t(block_p, chunks, warps, **kw):
    return dict(block_p=block_p, chunks=chunks, warps=warps, **kw)


TABLE = Table([
    # ------------------------------------------------------------------ eager (the tuned baseline)
    Row("eager.fp32.small", "eager", _t(32, 1, 8), state_bytes=4, **SMALL_W, run=KERNELS_FP32,
        why="32-row programs on 8 warps: batch 1 Super 4.44 us vs 4.99 in 16 x 4 (vLLM 4.58)"),
    Row("eager.fp32.large", "eager", _t(32, 1, 8), state_bytes=4, **LARGE_W, run=KERNELS_FP32,
        why="97 % of the copy ceiling at batch 256 (16 rows x 4 warps: 93 %)"),
    Row("eager.16bit.small", "eager", _t(8, 1, 1), state_bytes=2, **SMALL_W, run=EAGER_BF16,
        why="8 rows x 1 warp: faster than 16 x 4 at batch 1-16 on Nano and Super"),
    Row("eager.16bit.large", "eager", _t(16, 1, 1), state_bytes=2, **LARGE_W, run=EAGER_BF16,
        why="16 rows x 1 warp: 95 % of copy at batch 256, 3 % faster than whole 64-row heads on 8 warps"),
    # ------------------------------------------------------------------ fold (flush, commit)
    Row("fold.fp32.small", "fold", _t(16, 1, 4), state_bytes=4, **SMALL_W, run=SPEC,
        why="16-row chunks on 4 warps: enough programs for a small batch's folds"),
    Row("fold.fp32.large", "fold", _t(16, 0, 2), state_bytes=4, **LARGE_W, run=SPEC,
        why="whole-head programs on 2 warps: a commit's mostly idle grid is 1/4 the size (Super T4 b256 -3 %)"),
    Row("fold.16bit.small", "fold", _t(16, 1, 4), state_bytes=2, **SMALL_W, run=SPEC,
        why="as the fp32 row"),
    Row("fold.16bit.large", "fold", _t(16, 0, 4), state_bytes=2, **LARGE_W, run=SPEC,
        why="whole-head programs: a commit's mostly idle grid is 1/4 the size"),
    Row("fold.8bit.small", "fold", _t(16, 1, 4), state_bytes=1, **SMALL_W, run="",
        why="not measured: as the 16-bit row"),
    Row("fold.8bit.large", "fold", _t(16, 0, 4), state_bytes=1, **LARGE_W, run="",
        why="not measured: as the 16-bit row"),
    # ------------------------------------------------------------------ verify (speculation)
    # 16-32 rows per warp (the MMA's M); 4-8 warps per program ran at a third of the rate
    Row("verify.fp32.small.p64", "verify", _t(64, 1, 2, tma=False), state_bytes=4, **SMALL_W, p_mod=64, run=SPEC,
        why="64-row tiles on 2 warps where the head is a multiple of 64"),
    Row("verify.fp32.small", "verify", _t(32, 1, 2, tma=False), state_bytes=4, **SMALL_W, run=SPEC,
        why="32-row tiles on 2 warps otherwise"),
    Row("verify.fp32.large.p64", "verify", _t(64, 1, 2, tma=None), state_bytes=4, **LARGE_W, p_mod=64, run=SPEC,
        why="Super T4 b256 64x2w 487 us vs 32x2w 557; TMA reads of fp32 tiles: b256 443 vs 456 us"),
    Row("verify.fp32.large", "verify", _t(64, 0, 2, tma=None), state_bytes=4, **LARGE_W, run=SPEC,
        why="heads of 64k + r rows (Nano 80): the whole head per program (64-row + tail tile), 465 vs 628 us"),
    Row("verify.16bit.small.p64", "verify", _t(64, 1, 2, tma=False), state_bytes=2, **SMALL_W, p_mod=64, run=SPEC,
        why="as fp32"),
    Row("verify.16bit.small", "verify", _t(32, 1, 2, tma=False), state_bytes=2, **SMALL_W, run=SPEC,
        why="as fp32"),
    Row("verify.16bit.large.p64", "verify", _t(64, 1, 2, tma=False), state_bytes=2, **LARGE_W, p_mod=64, run=SPEC,
        why="dual bf16 Super 385 us vs 483 in 32x2w; TMA reads of bf16 tiles lose (208 vs 198 us at b128)"),
    Row("verify.16bit.large", "verify", _t(64, 0, 2, tma=False), state_bytes=2, **LARGE_W, run=SPEC,
        why="Nano dual bf16: whole heads 364 us vs 497 in 32x2w and 453 in two 64-row programs"),
    Row("verify.8bit.small.p64", "verify", _t(64, 1, 2, tma=False), state_bytes=1, **SMALL_W, p_mod=64, run="",
        why="not measured: as 16-bit"),
    Row("verify.8bit.small", "verify", _t(32, 1, 2, tma=False), state_bytes=1, **SMALL_W, run="",
        why="not measured: as 16-bit"),
    Row("verify.8bit.large.p64", "verify", _t(64, 1, 2, tma=False), state_bytes=1, **LARGE_W, p_mod=64, run="",
        why="not measured: as 16-bit"),
    Row("verify.8bit.large", "verify", _t(32, 1, 2, tma=False), state_bytes=1, **LARGE_W, run="",
        why="not measured: 32-row tiles"),
    # ------------------------------------------------------------------ small-batch route (replay step)
    # fp32 copies: batch 1-2 are latency-bound, the route costs eager's time; up to batch 4 only
    # where the deferred route (state written every other step) wins
    Row("route.fp32.p32", "route", dict(route="eager", block_p=32, warps=8), state_bytes=4, p_mod=32, max_batch=2,
        run=SMALL, why="head dims of 32k rows, batch 1-2: Super b1 4.49 us vs eager 4.43 (buffered 5.6-7.8)"),
    Row("route.fp32.p32.buffered", "route", dict(route="buffered"), state_bytes=4, p_mod=32, max_batch=4, run=SMALL,
        why="the deferred route lost at 32 x 8 tiles (116 registers) and in 16 x 4: these buffer from batch 3"),
    Row("route.fp32.dual", "route", dict(route="eager", block_p=8, warps=1), state_bytes=4, dual=True, max_batch=2,
        run=SMALL, why="dual states route on their high copy (the low copy marked stale), 8 rows x 1 warp"),
    Row("route.fp32.dual.buffered", "route", dict(route="buffered"), state_bytes=4, dual=True, max_batch=4,
        run=SMALL, why="the deferred route lost for dual states (Nano b4 9.43 us vs buffered 8.72)"),
    Row("route.fp32.defer", "route", dict(route="eager", block_p=8, warps=1, route_k=2), state_bytes=4, max_batch=4,
        run=SMALL, why="Nano's 80-row heads, batch 1-4: deferred k 2 in 8 x 1 tiles, b4 9.43 us vs buffered 9.86"),
    Row("route.16bit", "route", dict(route="eager", block_p=8, warps=1), state_bytes=2, max_batch=16,
        run=SMALL_BF16, why="16-bit copies: the lean buffered step loses to the route up to batch 16, wins at 32"),
    Row("route.buffered", "route", dict(route="buffered"), run=SMALL,
        why="larger batches (and fp8 reads) buffer"),
    # ------------------------------------------------------------------ buffered replay step
    Row("replay.fp32.one", "replay", dict(block_p=16, warps=2), state_bytes=4, max_batch=1, run=SMALL,
        why="batch 1 buffered (no route): 5.2 us"),
    Row("replay.fp32.small", "replay", dict(LEAN, ticket=True), state_bytes=4, min_batch=2, **SMALL_W, run=SMALL,
        why="the lean step; the ticket (one launch) saves ~1 us at b4-b16 where the atomics do not queue"),
    Row("replay.fp32.large.coef", "replay", dict(LEAN, bc=True, coef=True), state_bytes=4, min_batch=2,
        min_work=12288, run=KERNELS_FP32,
        why="per-head terms from a pre-pass: b256 Super 293 us vs 308, Nano 277 vs 291; a loss below b96"),
    Row("replay.fp32.large", "replay", dict(LEAN), state_bytes=4, min_batch=2, **LARGE_W, run=KERNELS_FP32,
        why="the lean step, the cursor moved by a separate pass (the ticket's atomics queue at large batches)"),
    Row("replay.16bit.one", "replay", dict(block_p=16, warps=4), state_bytes=2, max_batch=1, run=SMALL_BF16,
        why="dual bf16 batch 1: 4.9 us"),
    Row("replay.16bit.small", "replay", dict(LEAN, ticket=True), state_bytes=2, min_batch=2, **SMALL_W,
        run=SMALL_BF16, why="the lean step with the ticket (Super dual b8 13.75 us vs 21.61 with a cursor pass)"),
    Row("replay.16bit.large.dual32", "replay",
        dict(LEAN, block_p=32, bc=True, coef=True, fold_cols=32, maxnreg=96), state_bytes=2, min_batch=2,
        min_work=16384, p_mod=32, dual=True, run=KERNELS_FP32,
        why="dual: 32-row programs, 32-column fold chunks, 96 registers: Super b512 410 us vs 424 uncapped"),
    Row("replay.16bit.large.single32", "replay", dict(LEAN, block_p=32, bc=True, coef=True, maxnreg=72),
        state_bytes=2, min_batch=2, min_work=12288, dual=False, run=BF16_ULTRA,
        why="bf16 states: 32-row programs under 72 registers run the per-program work fewer times (Super b256 -9 %)"),
    Row("replay.16bit.large.dual16", "replay", dict(LEAN, early=True, preload=True, bc=True, coef=True, maxnreg=72),
        state_bytes=2, min_batch=2, min_work=6144, dual=True, run=KERNELS_FP32,
        why="dual: the state tile loaded first, 72 registers (28 programs an SM): Nano b256 207 us vs 217"),
    Row("replay.16bit.large.early16", "replay", dict(LEAN, early=True, preload=True, bc=True, maxnreg=64),
        state_bytes=2, min_batch=2, min_work=6144, run=BF16_ULTRA,
        why="bf16 states from batch x heads 6144: the state tile loaded first under 64 registers (Nano b128 -5 %)"),
    Row("replay.16bit.large", "replay", dict(LEAN), state_bytes=2, min_batch=2, **LARGE_W, run=KERNELS_FP32,
        why="the lean step below the pre-pass' break-even"),
    Row("replay.8bit.one", "replay", dict(block_p=16, warps=4), state_bytes=1, max_batch=1, run="",
        why="not measured: as 16-bit"),
    Row("replay.8bit.small", "replay", dict(block_p=16, warps=4), state_bytes=1, min_batch=2, **SMALL_W, run="",
        why="not measured: as the 16-bit batch-1 row"),
    Row("replay.8bit.large.coef", "replay", dict(LEAN, block_p=32, bc=True, coef=True), state_bytes=1, min_batch=2,
        min_work=24576, run=LARGE, why="dual fp8 b256: 32-row lean programs with the pre-pass, Super 263 us vs 315"),
    Row("replay.8bit.large.p64", "replay", dict(block_p=64, warps=2), state_bytes=1, min_batch=2, **LARGE_W,
        p_mod=64, run=LARGE, why="dual fp8 Super below batch 192: 64 x 2 programs (318 us at b256)"),
    Row("replay.8bit.large", "replay", dict(block_p=16, warps=1), state_bytes=1, min_batch=2, **LARGE_W, run=LARGE,
        why="dual fp8 Nano below batch 256: 16 x 1 programs (349 us at b256)"),
], params_of=PARAMS)


def _np2(v: int) -> int:
    return triton.next_power_of_2(max(int(v), 1))


def _case(state_bytes: int, head_dim: int, batch: int, heads: int, dual: bool = False) -> dict:
    return dict(state_bytes=state_bytes, head_dim=head_dim, batch=batch, heads=heads, work=batch * heads,
                dual=bool(dual))


def tile_params(op: str, *, head_dim: int, state_bytes: int, batch: int, heads: int,
                options: Mamba2Options) -> tuple[int, int, int, str]:
    """(block_p, chunks, warps, row name) of the eager, fold or verify launch at a case (with
    options.override(op, ...)), clamped to the head: chunks 0 becomes the head's chunk count,
    otherwise the nearest divisor of it (so no program carries an all-masked chunk)."""
    key = min(state_bytes, 4)
    if op == "eager":
        key = max(key, 2)
    row = TABLE.pick(op, **_case(key, head_dim, batch, heads))
    ov = options.overrides_for(op)
    block_p, chunks, warps = (ov.get(k, row.params[k]) for k in ("block_p", "chunks", "warps"))
    block_p = min(block_p, _np2(head_dim))
    tiles = triton.cdiv(head_dim, block_p)
    if chunks <= 0:
        chunks = tiles
    else:   # nearest divisor of `tiles` (ties: the smaller, for more programs)
        chunks = min((d for d in range(1, tiles + 1) if tiles % d == 0), key=lambda d: (abs(d - chunks), d))
    return block_p, chunks, warps, row.name


def replay_params(*, head_dim: int, read_bytes: int, batch: int, heads: int, dual: bool = False, hi_bytes: int = 4,
                  options: Mamba2Options) -> dict:
    """The replay step's launch choice at a case: the route row (where options.small_batch_route
    and the row routes) or else the buffered replay row, over REPLAY_DEFAULTS, then
    options.override("replay", ...). Rows per program: next_pow2(block_p * chunks) (chunks 0:
    the whole head), at most next_pow2(head_dim). Dual states take the route as a state of their
    high copy (hi_bytes per element) would. The result's "row" names the table row."""
    v = dict(REPLAY_DEFAULTS)
    rb = min(hi_bytes, 4) if dual else min(read_bytes, 4)     # the copy the route reads and writes
    row = TABLE.pick("route", **_case(rb, head_dim, batch, heads, dual)) if options.small_batch_route else None
    if row is None or row.params["route"] == "buffered":
        row = TABLE.pick("replay", **_case(min(read_bytes, 4), head_dim, batch, heads, dual))
    v.update(row.params)
    v.update(options.overrides_for("replay"))
    chunks = v["chunks"] if v["chunks"] > 0 else triton.cdiv(head_dim, v["block_p"])
    rows = min(_np2(v["block_p"] * chunks), _np2(head_dim))
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
            "pdl": options.pdl if v["pdl"] is None else bool(v["pdl"]), "route_k": rk, "coef": bool(v["coef"]),
            "fold_wait": bool(v["fold_wait"]), "row": row.name}
