"""Mamba-2 decode ops: the eager baseline and ReplaySSM (step, flush, verify, commit).

Where things are: reference.py (the exact PyTorch oracle), eager.py / replay.py / route.py /
fold.py / spec.py (speculative verify) (one algorithm each: its Triton kernels and its planner), table.py (the
launch table: which tiles each case launches, and why), options.py (Mamba2Options: the knobs,
passed explicitly), plan.py (plan(op, ...) -> [Launch]: what a case launches, without running).

Every op takes ``backend="triton"`` (default) or ``backend="reference"`` (the oracle), and
``options=`` (Mamba2Options; None: the shipped defaults; the Triton backend only). What a case
launches: ``replayssm.mamba2.plan.plan(op, ...)`` and ``explain``. Argument names and shapes
are the reference's:

    x [b, H, P], dt [b, H] (raw, before softplus and dt_bias), A / D / dt_bias [H],
    B / C [b, G, N], z [b, H, P] or None (no gate), state_indices [b] int32 (row b uses slot
    state_indices[b]; negative = padded row: nothing read or written, output 0; None: row b
    uses slot b). Speculation adds a draft axis T after b. Ops that return an output take
``out=`` (a preallocated tensor shaped like x, e.g. a static CUDA-graph buffer).

The Triton path is CUDA-graph capturable (fixed grids, per-sequence flush decisions made
on the device, no host sync) unless byte counting is on: a ByteCounter (``counter=`` for
eager, ``rs.counter`` for replay) needs the cursors on the host, so counting syncs.
"""
from __future__ import annotations

import importlib

import torch

from .. import accounting as acc
from . import reference as ref
from ..common.backends import BACKENDS, check_backend, into  # noqa: F401 (BACKENDS: part of this module's API)
from ..state import ByteCounter, Mamba2ReplayState
from .options import Mamba2Options


def _k():
    """The planners (plan.py), imported on first use (so TRITON_INTERPRET set by the caller
    before the first call still applies)."""
    return importlib.import_module(f"{__name__}.plan")


def route_period(*, batch: int, heads: int, head_dim: int, read_bytes: int, flush_period: int, dual: bool = False,
                 hi_bytes: int = 4, options: Mamba2Options | None = None) -> int:
    """The small-batch route's period k the Triton replay step takes at this case (0: it
    buffers; k >= 1: the state written every k-th step), at most flush_period. read_bytes:
    bytes per element of the copy the step reads (a dual state's low copy); hi_bytes: a dual
    state's high copy's."""
    return _k().route_period(batch=batch, heads=heads, head_dim=head_dim, read_bytes=read_bytes,
                             flush_period=flush_period, dual=dual, hi_bytes=hi_bytes, options=options)



# ----------------------------------------------------------------------------- byte counting (host side)
def _count_replay(rs: Mamba2ReplayState, x, dt, B, C, z, state_indices, route: int) -> None:
    """Same accounting as reference.mamba2_replay_step (route: the small-batch route's period,
    0: none); call before the kernel (reads cursors)."""
    rows, slots = acc.live_rows(state_indices, x.shape[0], x.device)
    if len(rows) == 0:
        return
    n = rs.entries(slots)
    acc.count_step(rs, n, acc.flush_rows(rs, slots, n, route), route, acc.mamba2_io_bytes(x, dt, B, C, z),
                   x[0].numel() * x.element_size())


# ----------------------------------------------------------------------------- ops
def eager_step(state: torch.Tensor, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None,
               counter: ByteCounter | None = None, backend: str = "triton", out=None,
               options: Mamba2Options | None = None) -> torch.Tensor:
    """One eager decode step; reads and writes the state (the tuned baseline).

    state [S, H, P, N] fp32 / bf16 / fp16 (updated in place). Returns y [b, H, P] in x's dtype.
    """
    check_backend(backend)
    if backend == "reference":
        return into(out, ref.mamba2_eager_step(state, x, dt, A, B, C, D, dt_bias, z, state_indices, counter))
    if counter is not None:
        rows, _ = acc.live_rows(state_indices, x.shape[0], x.device)
        acc.count_eager(counter, state, len(rows), acc.mamba2_io_bytes(x, dt, B, C, z), x[0].numel() * x.element_size())
    k = _k()
    launches, y = k.plan_eager(state, x, dt, A, B, C, D, dt_bias, z, state_indices, out, options=options)
    k.run(launches)
    return y


def replay_step(rs: Mamba2ReplayState, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None,
                backend: str = "triton", advance_cursor: bool = True, out=None,
                options: Mamba2Options | None = None) -> torch.Tensor:
    """One ReplaySSM decode step: output-only route from checkpoint + buffer and append, or,
    for sequences whose cursor n has n + 1 >= K, a fused flush (fold, write checkpoint(s),
    cursor back to 0). Decided per sequence on the device. Returns y [b, H, P].

    advance_cursor=False (Triton only) skips the cursor pass, for callers whose layers
    share one cursor tensor and advance it once per step (advance_cursors).
    """
    check_backend(backend)
    if backend == "reference":
        if not advance_cursor:
            raise ValueError("advance_cursor=False needs backend='triton'")
        return into(out, ref.mamba2_replay_step(rs, x, dt, A, B, C, D, dt_bias, z, state_indices))
    k = _k()
    if rs.counter is not None:   # the small-batch route flushes every k-th step
        _count_replay(rs, x, dt, B, C, z, state_indices, k.state_route_period(rs, x, options) if advance_cursor else 0)
    launches, y = k.plan_replay(rs, x, dt, A, B, C, D, dt_bias, z, state_indices, advance_cursor, out, options=options)
    k.run(launches)
    return y


def advance_cursors(rs: Mamba2ReplayState, batch: int, state_indices=None,
                    options: Mamba2Options | None = None) -> None:
    """The per-step cursor move (n + 1 >= K ? 0 : n + 1) of `batch` rows, for callers that
    ran replay_step(..., advance_cursor=False)."""
    k = _k()
    k.run(k.plan_cursor(rs, state_indices, batch, 0, options=options))


def flush(rs: Mamba2ReplayState, A, slots: torch.Tensor | None = None, backend: str = "triton",
          options: Mamba2Options | None = None) -> None:
    """Fold every committed entry of `slots` (default: all slots; Triton: negative = skip)
    into the checkpoint (and refresh the low copy); their cursors return to 0. Sequences
    with cursor 0 are untouched."""
    check_backend(backend)
    if backend == "reference":
        return ref.mamba2_flush(rs, A, slots)
    if rs.counter is not None:
        s = None if slots is None else slots[slots >= 0]
        acc.count_fold(rs, rs.entries(acc.flush_slots(rs, s)))
    k = _k()
    k.run(k.plan_flush(rs, A, slots, options=options))


def verify(rs: Mamba2ReplayState, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None,
           backend: str = "triton", out=None, options: Mamba2Options | None = None) -> torch.Tensor:
    """Speculative verification of T drafts, all outputs from checkpoint + buffer, no
    per-draft state. x [b, T, H, P], dt [b, T, H], B/C [b, T, G, N], z [b, T, H, P] or None.
    Drafts are written at buffer rows cursor..cursor+T-1 (capacity must allow it: L >= K + T);
    the cursor does not move (commit moves it). Returns y [b, T, H, P]."""
    check_backend(backend)
    if backend == "reference":
        return into(out, ref.mamba2_verify(rs, x, dt, A, B, C, D, dt_bias, z, state_indices))
    if rs.counter is not None:
        rows, slots = acc.live_rows(state_indices, x.shape[0], x.device)
        rb, T = rs.buffer_row_bytes(), x.shape[1]
        acc.count_refresh(rs, int(rs.lo_stale(slots).sum()))
        rs.count(ckpt_read=len(rows) * rs.read_ckpt.bytes_per_slot(),
                 buf_read=int(rs.entries(slots).sum()) * rb, buf_write=len(rows) * T * rb,
                 io_read=len(rows) * acc.mamba2_io_bytes(x, dt, B, C, z),
                 io_write=len(rows) * x[0].numel() * x.element_size())
    k = _k()
    launches, y = k.plan_verify(rs, x, dt, A, B, C, D, dt_bias, z, state_indices, out, options=options)
    k.run(launches)
    return y


def commit(rs: Mamba2ReplayState, A, accepted: torch.Tensor, state_indices=None, backend: str = "triton",
           options: Mamba2Options | None = None) -> None:
    """Accept accepted[b] (0..T, a device tensor) drafts per row: a cursor move; sequences
    whose cursor reaches K fold all their committed entries into the checkpoint (on the
    device) and return to cursor 0."""
    check_backend(backend)
    if backend == "reference":
        return ref.mamba2_commit(rs, A, accepted, state_indices)
    if rs.counter is not None:
        rows, slots = acc.live_rows(state_indices, accepted.shape[0], accepted.device)
        n = rs.entries(slots) + accepted[rows].long()
        acc.count_fold(rs, n[n >= rs.flush_period])
    k = _k()
    k.run(k.plan_commit(rs, A, accepted, state_indices, options=options))
