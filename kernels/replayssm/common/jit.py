"""@triton.jit helpers shared by the kernel modules (mamba2, gdn, perdraft):
the dt softplus and SiLU of the reference, stores that round exactly like the GPU also under
Triton's CPU interpreter, prefetch hints, the programmatic-dependent-launch waits and releases,
a speculative commit's cursor move, and the deferred small-batch route's cursor word."""
from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from ..state import CURSOR_MASK, EPOCH_SHIFT, LO_STALE

_CURSOR_MASK = tl.constexpr(CURSOR_MASK)
_EPOCH_SHIFT = tl.constexpr(EPOCH_SHIFT)
_STALE_BIT = tl.constexpr(LO_STALE)
_EPOCH_ONE = tl.constexpr(1 << EPOCH_SHIFT)     # the route's word after a ticket: epoch 1, count 0
_EPOCH_ONE_STALE = tl.constexpr((1 << EPOCH_SHIFT) | LO_STALE)

# A scalar compare that joins a block mask is written `tl.where(c, True, False)` (an "i1 scalar"):
# Triton's interpreter tags a compare with its operands' dtype, so `offs < N` & a plain `slot >= 0`
# is an int block there, which Triton 3.9 rejects as a mask; on the GPU the select folds away.


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
def gdc_wait_prior(GDC: tl.constexpr):
    """With GDC (the kernel was launched as a programmatic dependent, launch.pdl_meta): wait
    until the kernel ahead of it in the stream has finished and its writes are visible. Call
    it before the first load or store."""
    if GDC:
        gdc_wait()


@triton.jit
def gdc_release(GDC: tl.constexpr):
    """With GDC: let the programmatic dependent launch behind this kernel start (its programs
    wait in gdc_wait_prior until this kernel has finished). No effect on other launches."""
    if GDC:
        gdc_launch_dependents()


@triton.jit
def clear_lo_stale_kernel(idx_ptr, n_slots, cur_ptr, batch, HAS_IDX: tl.constexpr, BLOCK_B: tl.constexpr):
    """One program: clear the LO_STALE bit (replayssm.state) of the cursor words of batch rows
    b < batch (slot idx[b], negative: padded; without HAS_IDX slot b), after a refresh launch
    has rewritten their stale low copies (a launch apart: no program of that one may store the
    word another has yet to read)."""
    bb = tl.arange(0, BLOCK_B)
    if HAS_IDX:
        slot = tl.load(idx_ptr + bb, mask=bb < batch, other=-1)
    else:
        slot = tl.where(bb < batch, bb, -1)
    live = (slot >= 0) & (slot < n_slots)
    ptr = cur_ptr + tl.where(live, slot, 0)
    tl.store(ptr, tl.load(ptr, mask=live, other=0) & _CURSOR_MASK, mask=live)


@triton.jit
def commit_counts(idx_ptr, n_slots, add_ptr, cur_ptr, batch, max_add, BLOCK_B: tl.constexpr):
    """Per batch row b < BLOCK_B of a commit: (b, slot = idx[b] (-1 past batch), live =
    0 <= slot < n_slots (else a no-op row), m = cursor[slot] + add[b], 0 for rows not live).
    add[b] is clamped to 0..max_add (L - K: a cursor below K then stays below L, whatever a
    caller passes). The cursor word's LO_STALE bit
    (replayssm.state) is masked off (the verify before a commit has cleared it, refreshing the
    low copy)."""
    bb = tl.arange(0, BLOCK_B)
    slot = tl.load(idx_ptr + bb, mask=bb < batch, other=-1)
    live = (slot >= 0) & (slot < n_slots)
    slot = tl.where(live, slot, 0)
    m = tl.load(cur_ptr + slot, mask=live, other=0) & _CURSOR_MASK
    m += tl.minimum(tl.maximum(tl.load(add_ptr + bb, mask=live, other=0).to(tl.int32), 0), max_add)
    return bb, slot, live, m


@triton.jit
def list_commit_rows(idx_ptr, n_slots, add_ptr, cur_ptr, lst_ptr, batch, K, max_add, BLOCK_B: tl.constexpr,
                     LAST: tl.constexpr):
    """A speculative commit's cursor move, in one program over the batch (the commit's first
    launch): m = cursor[idx[b]] + add[b] for every live row (idx[b] >= 0, b < batch); the
    cursor becomes 0 where m >= K (the row folds its entries 0..m-1) and m elsewhere; the
    folding rows are listed as lst[rank] = (b << 16) | (m - 1 if LAST else m) at ranks
    0, 1, ... (m <= L < 2^16, b < 2^15) and their count stored at lst[batch]."""
    bb, slot, live, m = commit_counts(idx_ptr, n_slots, add_ptr, cur_ptr, batch, max_add, BLOCK_B)
    fl = live & (m >= K)
    tl.store(cur_ptr + slot, tl.where(fl, 0, m), mask=live)
    rank = tl.cumsum(fl.to(tl.int32), 0) - 1
    tl.store(lst_ptr + rank, (bb << 16) | (m - 1 if LAST else m), mask=fl)
    tl.store(lst_ptr + batch, tl.sum(fl.to(tl.int32), 0))


# ----------------------------------------------------------------------------- the deferred route's word
@triton.jit
def route_word(word, ep, RK: tl.constexpr):
    """A deferred small-batch route program's reading of its sequence's cursor word (state.py,
    "the route's epoch"; period RK >= 2). word: as loaded at the top of the launch; ep: the
    epoch this program last saw (its route_epoch byte). Returns (fast, n, nw, e_next):
    e_next = ep % 127 + 1, the epoch this launch stores; nw, the word's count; fast: the word is
    the route's own, either from before the launch (its epoch is ep and nw < RK) or the one a
    sibling of this launch has already stored (epoch e_next: n = the count before it, as the
    route moves n -> (n + 1) mod RK), and n the count this step is taken at; else (epoch 0:
    another op stored the word; or a stale epoch) the rare path, which takes tickets."""
    e = (word >> _EPOCH_SHIFT) & 127
    nw = word & _CURSOR_MASK
    e_next = ep % 127 + 1
    late = e == e_next
    fast = late | ((e != 0) & (e == ep) & (nw < RK))
    n = tl.where(late, (nw + RK - 1) % RK, tl.minimum(nw, RK - 1))
    return fast, n, nw, e_next


@triton.jit
def route_next_word(n, e_next, RK: tl.constexpr, DUAL: tl.constexpr):
    """The word the fast path's one storing program writes after a step taken at count n:
    epoch e_next, count (n + 1) mod RK, and LO_STALE for dual states (the route writes the high
    copy alone)."""
    w = (e_next << _EPOCH_SHIFT) | tl.where(n + 1 >= RK, 0, n + 1)
    if DUAL:
        w = w | _STALE_BIT
    return w


@triton.jit
def route_ticket(ptr, nprog, nw, RK: tl.constexpr, DUAL: tl.constexpr):
    """The rare path's cursor move at ptr (the sequence's word), after a step taken at count
    nw: a ticket each (ptr's bits 16 and up); the program drawing the last of nprog stores
    epoch 1 with count nw + 1 (0 where nw + 1 >= RK: the step wrote the state) and LO_STALE
    for dual states. Every program read the word before its ticket, so all took this path."""
    old = tl.atomic_add(ptr, 1 << 16, sem="relaxed")
    if (old >> 16) == nprog - 1:
        first = (_EPOCH_ONE_STALE if DUAL else _EPOCH_ONE) + tl.where(nw + 1 >= RK, 0, nw + 1)
        tl.atomic_xchg(ptr, first, sem="relaxed")
