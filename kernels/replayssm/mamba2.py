"""Public Mamba-2 decode ops: eager baseline and ReplaySSM (step, flush, verify, commit).

Every op takes ``backend="triton"`` (default; the kernels in replayssm.triton.mamba2) or
``backend="reference"`` (the exact PyTorch oracle in replayssm.reference). Argument names
and shapes are the reference's:

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

import torch

from . import reference as ref
from .common.backends import BACKENDS, check_backend, into  # noqa: F401 (BACKENDS: part of this module's API)
from .state import ByteCounter, Mamba2ReplayState



def _tk():
    """The Triton kernel module, imported on first use (so TRITON_INTERPRET set by the
    caller before the first call still applies)."""
    from .triton import mamba2 as tk
    return tk




# ----------------------------------------------------------------------------- byte counting (host side)
def _live_slots(state_indices, batch, device):
    return ref.live_rows(state_indices, batch, device)


def _count_eager(counter: ByteCounter, state, x, dt, B, C, z, state_indices) -> None:
    rows, _ = _live_slots(state_indices, x.shape[0], x.device)
    n, sb = len(rows), state[0].numel() * state.element_size()
    counter.ckpt_read += n * sb
    counter.ckpt_write += n * sb
    counter.io_read += n * ref._mamba2_io_bytes(x, dt, B, C, z)
    counter.io_write += n * x[0].numel() * x.element_size()
    counter.steps += 1


def _count_replay(rs: Mamba2ReplayState, x, dt, B, C, z, state_indices, route: int) -> None:
    """Same accounting as reference.mamba2_replay_step (route: the small-batch route's period,
    0: none); call before the kernel (reads cursors)."""
    rows, slots = _live_slots(state_indices, x.shape[0], x.device)
    if len(rows) == 0:
        return
    n = rs.entries(slots)
    ref.count_step(rs, n, ref._flush_rows(rs, slots, n, route), route, ref._mamba2_io_bytes(x, dt, B, C, z),
                   x[0].numel() * x.element_size())


def _count_fold(rs: Mamba2ReplayState, n: torch.Tensor) -> None:
    """n: entries folded per flushed sequence ([f])."""
    if len(n):
        rs.count(ckpt_read=len(n) * rs.hi.bytes_per_slot(), buf_read=int(n.sum()) * rs.buffer_row_bytes(),
                 ckpt_write=len(n) * rs.state_bytes_per_slot())


# ----------------------------------------------------------------------------- ops
def eager_step(state: torch.Tensor, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None,
               counter: ByteCounter | None = None, backend: str = "triton", out=None) -> torch.Tensor:
    """One eager decode step; reads and writes the state (the tuned baseline).

    state [S, H, P, N] fp32 / bf16 / fp16 (updated in place). Returns y [b, H, P] in x's dtype.
    """
    check_backend(backend)
    if backend == "reference":
        return into(out, ref.mamba2_eager_step(state, x, dt, A, B, C, D, dt_bias, z, state_indices, counter))
    if counter is not None:
        _count_eager(counter, state, x, dt, B, C, z, state_indices)
    return _tk().eager_step(state, x, dt, A, B, C, D, dt_bias, z, state_indices, out=out)


def replay_step(rs: Mamba2ReplayState, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None,
                backend: str = "triton", advance_cursor: bool = True, out=None) -> torch.Tensor:
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
    if rs.counter is not None:   # the small-batch route flushes every k-th step
        _count_replay(rs, x, dt, B, C, z, state_indices, _tk().state_route_period(rs, x) if advance_cursor else 0)
    return _tk().replay_step(rs, x, dt, A, B, C, D, dt_bias, z, state_indices, advance=advance_cursor, out=out)


def advance_cursors(rs: Mamba2ReplayState, batch: int, state_indices=None) -> None:
    """The per-step cursor move (n + 1 >= K ? 0 : n + 1) of `batch` rows, for callers that
    ran replay_step(..., advance_cursor=False)."""
    _tk().advance_cursor(rs, state_indices, batch, 0)


def flush(rs: Mamba2ReplayState, A, slots: torch.Tensor | None = None, backend: str = "triton") -> None:
    """Fold every committed entry of `slots` (default: all slots; Triton: negative = skip)
    into the checkpoint (and refresh the low copy); their cursors return to 0. Sequences
    with cursor 0 are untouched."""
    check_backend(backend)
    if backend == "reference":
        return ref.mamba2_flush(rs, A, slots)
    if rs.counter is not None:
        s = None if slots is None else slots[slots >= 0]
        _count_fold(rs, rs.entries(ref._flush_slots(rs, s)))
    _tk().flush(rs, A, slots)


def verify(rs: Mamba2ReplayState, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None,
           backend: str = "triton", out=None) -> torch.Tensor:
    """Speculative verification of T drafts, all outputs from checkpoint + buffer, no
    per-draft state. x [b, T, H, P], dt [b, T, H], B/C [b, T, G, N], z [b, T, H, P] or None.
    Drafts are written at buffer rows cursor..cursor+T-1 (capacity must allow it: L >= K + T);
    the cursor does not move (commit moves it). Returns y [b, T, H, P]."""
    check_backend(backend)
    if backend == "reference":
        return into(out, ref.mamba2_verify(rs, x, dt, A, B, C, D, dt_bias, z, state_indices))
    if rs.counter is not None:
        rows, slots = _live_slots(state_indices, x.shape[0], x.device)
        rb, T = rs.buffer_row_bytes(), x.shape[1]
        ref.count_refresh(rs, int(rs.lo_stale(slots).sum()))
        rs.count(ckpt_read=len(rows) * rs.read_ckpt.bytes_per_slot(),
                 buf_read=int(rs.entries(slots).sum()) * rb, buf_write=len(rows) * T * rb,
                 io_read=len(rows) * ref._mamba2_io_bytes(x, dt, B, C, z),
                 io_write=len(rows) * x[0].numel() * x.element_size())
    return _tk().verify(rs, x, dt, A, B, C, D, dt_bias, z, state_indices, out=out)


def commit(rs: Mamba2ReplayState, A, accepted: torch.Tensor, state_indices=None, backend: str = "triton") -> None:
    """Accept accepted[b] (0..T, a device tensor) drafts per row: a cursor move; sequences
    whose cursor reaches K fold all their committed entries into the checkpoint (on the
    device) and return to cursor 0."""
    check_backend(backend)
    if backend == "reference":
        return ref.mamba2_commit(rs, A, accepted, state_indices)
    if rs.counter is not None:
        rows, slots = _live_slots(state_indices, accepted.shape[0], accepted.device)
        n = rs.entries(slots) + accepted[rows].long()
        due = n >= rs.flush_period
        _count_fold(rs, n[due])
    _tk().commit(rs, A, accepted, state_indices)
