"""Elementwise @triton.jit helpers shared by the kernel modules (triton/mamba2.py, gdn.py,
perdraft.py): the dt softplus and SiLU of the reference, and stores that round exactly like
the GPU also under Triton's CPU interpreter."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def softplus(v):
    """softplus with the linear branch above 20 (same rule as reference.softplus);
    log1p(e) via log(1+e) * e / ((1+e) - 1), accurate where 1 + e loses digits."""
    e = tl.exp(tl.minimum(v, 20.0))
    u = 1.0 + e
    d = tl.where(u == 1.0, 1.0, u - 1.0)
    lp = tl.where(u == 1.0, e, tl.log(u) * (e / d))
    return tl.where(v > 20.0, v, lp)


@triton.jit
def silu(z):
    return z / (1.0 + tl.exp(-z))


@triton.jit
def round_bf16_rne(v):
    """fp32 -> nearest-even bf16 value (still fp32), by bit arithmetic."""
    bits = v.to(tl.uint32, bitcast=True)
    r = bits + 0x7FFF + ((bits >> 16) & 1)
    r = (r >> 16) << 16
    return r.to(tl.float32, bitcast=True)


@triton.jit
def round_e4m3_rne(v):
    """fp32 -> nearest-even float8_e4m3fn value (still fp32), saturating at 448."""
    a = tl.minimum(tl.abs(v), 448.0)
    bits = a.to(tl.int32, bitcast=True)
    qe = tl.maximum((bits >> 23) - 127, -6) - 3                # exponent of one quantum (3 mantissa bits)
    q = ((qe + 127) << 23).to(tl.float32, bitcast=True)
    r = ((a / q + 8388608.0) - 8388608.0) * q                  # round-half-even to a multiple of q
    return tl.where(v < 0, -r, r)


@triton.jit
def cast(v, dtype: tl.constexpr, EXACT: tl.constexpr):
    """Round float32 v to a storage dtype. On the GPU (EXACT False) this is the hardware
    conversion (round-to-nearest-even; fp8 saturating). Triton's CPU interpreter truncates
    fp32 -> bf16 and mis-rounds fp8 at binade edges, so under the interpreter (EXACT True)
    values are first rounded exactly with integer arithmetic; the final .to() is then exact."""
    if EXACT:
        if dtype == tl.bfloat16:
            v = round_bf16_rne(v)
        elif dtype == tl.float8e4nv:
            v = round_e4m3_rne(v)
    return v.to(dtype)


@triton.jit
def prefetch_hint(base, starts, LPR: tl.constexpr, LS: tl.constexpr, PF: tl.constexpr, INTERP: tl.constexpr):
    """Prefetch hint for rows beginning at element offsets `starts` [R] of `base`, LPR 128-byte
    lines (LS elements) each. PF 1: into L2, 2: into L1; no registers held, never faults.
    No-op when interpreting or PF 0."""
    if not INTERP:
        if PF == 1 or PF == 2:
            ptrs = base + starts[:, None] + (tl.arange(0, LPR) * LS)[None, :]
            if PF == 1:
                tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                                          dtype=tl.int32, is_pure=False, pack=1)
            else:
                tl.inline_asm_elementwise("prefetch.global.L1 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                                          dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def commit_rows(idx_ptr, add_ptr, cur_ptr, tk_ptr, batch, K, w, NW, BLOCK_B: tl.constexpr):
    """The rows of a one-launch speculative commit (ONE_LAUNCH: no cursor launch before the
    fold), found by every program of the fold: row b (slot idx[b], < 0: padded) keeps
    m = cursor + add[b] entries and flushes where m >= K; flushing rows are ranked in batch
    order and worker w of NW takes ranks w, w + NW, ... Then the program draws a ticket from
    the grid-wide counter tk[0]: whoever draws the last one knows every program has read the
    cursors (each reduced its reads across the program and synchronised before its acq_rel
    draw), so it moves them (0 after a flush, else m) and zeroes the counter for the next
    launch. One L2 atomic per program instead of a launch (and its gap).
    Returns bb [BLOCK_B] (row numbers), m, fl (flushes), rank, and n_mine (this worker's count)."""
    bb = tl.arange(0, BLOCK_B)
    slot = tl.load(idx_ptr + bb, mask=bb < batch, other=-1)
    live = slot >= 0
    m = tl.load(cur_ptr + tl.maximum(slot, 0), mask=live, other=0)
    m += tl.load(add_ptr + bb, mask=live, other=0).to(tl.int32)
    fl = live & (m >= K)
    rank = tl.cumsum(fl.to(tl.int32), 0) - 1
    n_mine = tl.sum((fl & (rank % NW == w)).to(tl.int32), 0)
    tl.debug_barrier()
    nprog = tl.num_programs(0) * tl.num_programs(1) * tl.num_programs(2)
    if tl.atomic_add(tk_ptr, 1, sem="acq_rel") == nprog - 1:
        tl.store(cur_ptr + slot, tl.where(fl, 0, m), mask=live)
        tl.atomic_xchg(tk_ptr, 0, sem="relaxed")
    return bb, m, fl, rank, n_mine


@triton.jit
def ranked_key(bb, val, fl, rank, r):
    """(b << 16) | val[b] of the flushing row b of rank r (-1: none); val < 2^16, b < 2^15."""
    return tl.max(tl.where(fl & (rank == r), (bb << 16) | val, -1), 0)
