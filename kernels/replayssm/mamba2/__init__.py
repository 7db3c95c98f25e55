"""Mamba-2 decode ops: the eager baseline and ReplaySSM. The verbs, with replayssm.gdn's
argument order and keyword rules (docs/api.md): allocate, load_state, export_state, entries,
eager_step, replay_step, flush, verify, commit (and advance_cursors).

Where things are: reference.py (the exact PyTorch oracle), eager.py / replay.py / route.py /
fold.py / spec.py (speculative verify) (one algorithm each: its Triton kernels and its planner), table.py (the
launch table: which tiles each case launches, and why), options.py (Mamba2Options: the knobs,
passed explicitly), plan.py (plan(op, ...) -> [Launch]: what a case launches, without running).

Every op takes the keyword-only ``backend="triton"`` (default) or ``backend="reference"``
(the oracle; same results, same errors), ``options=`` (Mamba2Options; None: the shipped
defaults; the Triton backend only) and ``check=`` (the debug checks, which read device data;
None: the REPLAYSSM_CHECK environment variable). Shapes, dtypes and L >= K + T are checked on
the host at every call (common/checks.py), a ValueError naming the argument. What a case
launches: ``replayssm.mamba2.plan.plan(op, ...)`` and ``explain``. Argument names and shapes
are the reference's:

    x [b, H, P], dt [b, H] (raw, before softplus and dt_bias), A / D / dt_bias [H],
    B / C [b, G, N], z [b, H, P] or None (no gate), state_indices [b] int32 (row b uses slot
    state_indices[b]; outside 0..S-1, e.g. negative = padded row: nothing read or written,
    output 0; None: row b uses slot b). Speculation adds a draft axis T after b. Ops that return an output take
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
from ..common import checks as chk
from ..common import reference as cref
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
    rows, slots = acc.live_rows(state_indices, x.shape[0], x.device, rs.cursor.shape[0])
    if len(rows) == 0:
        return
    n = rs.entries(slots)
    acc.count_step(rs, n, acc.flush_rows(rs, slots, n, route), route, acc.mamba2_io_bytes(x, dt, B, C, z),
                   x[0].numel() * x.element_size())


# ----------------------------------------------------------------------------- checks
def _step_checks(op, backend, rs, x, dt, A, B, C, D, dt_bias, z, state_indices, out, check, draft=False):
    """Host checks of a replay state's op (always) and, in debug mode, its indices; records A."""
    dims = chk.mamba2_state_dims(op, rs, backend)
    chk.mamba2_inputs(op, dims, rs.cursor.device, x, dt, A, B, C, D, dt_bias, z, state_indices, out, draft)
    chk.rows_and_window(op, rs, state_indices, x.shape[0], x.shape[1] if draft else None, check)
    rs.A = A


def _A(op, rs, A):
    """The A a flush or commit folds with: the argument, else the one the state remembers."""
    if A is not None:
        chk.Args(op, rs.cursor.device, H=rs.hi.data.shape[1]).tensor("A", A, "H")
        rs.A = A
    if rs.A is None:
        chk.fail(op, "A", "given, or remembered from a replay_step / verify / load_state / allocate(A=)", None)
    return rs.A


# ----------------------------------------------------------------------------- state
def allocate(slots: int, nheads: int, head_dim: int, d_state: int, n_groups: int, buffer_len: int,
             flush_period: int, *, spec_window: int = 0, mode: str = "replay", state_dtype="float32", lo_dtype=None,
             act_dtype=torch.bfloat16, device="cpu", counter: ByteCounter | None = None,
             A: torch.Tensor | None = None) -> Mamba2ReplayState:
    """A zeroed replay state: checkpoint(s) [slots, H, P, N], buffer of buffer_len (L) entries,
    flush period K <= L; spec_window T: the draft window verify will use (L >= K + T checked
    here). mode / state_dtype / lo_dtype: the precision mode (replayssm.state). A [H]: the
    layer's A (else remembered from the first op that takes it)."""
    return Mamba2ReplayState.allocate(slots, nheads, head_dim, d_state, n_groups, buffer_len, flush_period, mode,
                                      state_dtype, lo_dtype, act_dtype, device, counter, spec_window=spec_window, A=A)


def load_state(rs: Mamba2ReplayState, state: torch.Tensor, slots: torch.Tensor | None = None, *,
               A: torch.Tensor | None = None, backend: str = "triton", check: bool | None = None) -> None:
    """Set the recurrent state of `slots` [b] (None: slot b for row b) to `state` [b, H, P, N]
    (any float dtype; quantised to the checkpoint's storage, both copies in dual mode) and drop
    their buffered entries (cursor 0). A negative or out-of-range slot skips its row. Same
    on both backends (plain tensor writes)."""
    chk.slot_op("load_state", backend, rs, slots, check, state)
    if A is not None:
        _A("load_state", rs, A)
    cref.load_state(rs, state, slots)


def export_state(rs: Mamba2ReplayState, slots: torch.Tensor | None = None, *, backend: str = "triton"
                 ) -> torch.Tensor:
    """The recurrent state of `slots` [b] (None: all slots) after every committed entry, as an
    eager step would hold it: [b, H, P, N] float32 (float64 for a float64 state), the buffer
    folded into the high checkpoint, nothing written. Negative / out-of-range slots give 0.
    Reads entries on the host (not for graph capture)."""
    chk.slot_op("export_state", backend, rs, slots)
    return ref.mamba2_export_state(rs, rs.A, slots)


def entries(rs: Mamba2ReplayState, slots: torch.Tensor | None = None) -> torch.Tensor:
    """Committed entries since the last flush [len(slots)] (long) of `slots` (None: all); the
    cursor word decoded (replayssm.state)."""
    return rs.entries(slots)


# ----------------------------------------------------------------------------- ops
def eager_step(state: torch.Tensor, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, *,
               counter: ByteCounter | None = None, backend: str = "triton", out=None,
               options: Mamba2Options | None = None, check: bool | None = None) -> torch.Tensor:
    """One eager decode step; reads and writes the state (the tuned baseline).

    state [S, H, P, N] fp32 / bf16 / fp16 (updated in place); x [b, H, P], dt [b, H], A / D /
    dt_bias [H], B / C [b, G, N], z [b, H, P] or None, state_indices [b] or None. Returns
    y [b, H, P] in x's dtype.
    """
    chk.check_backend(backend)
    chk.options_of("eager_step", options, Mamba2Options)
    dims = chk.eager_state("eager_step", state, "S H P N", backend)
    chk.mamba2_inputs("eager_step", dims, state.device, x, dt, A, B, C, D, dt_bias, z, state_indices, out)
    if chk.debug(check):
        chk.slots_in_pool("eager_step", "state_indices", state_indices, dims["S"])
    if backend == "reference":
        return into(out, ref.mamba2_eager_step(state, x, dt, A, B, C, D, dt_bias, z, state_indices, counter))
    if counter is not None:
        rows, _ = acc.live_rows(state_indices, x.shape[0], x.device, state.shape[0])
        acc.count_eager(counter, state, len(rows), acc.mamba2_io_bytes(x, dt, B, C, z), x[0].numel() * x.element_size())
    k = _k()
    launches, y = k.plan_eager(state, x, dt, A, B, C, D, dt_bias, z, state_indices, out, options=options)
    k.run(launches)
    return y


def replay_step(rs: Mamba2ReplayState, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, *,
                advance_cursor: bool = True, backend: str = "triton", out=None,
                options: Mamba2Options | None = None, check: bool | None = None) -> torch.Tensor:
    """One ReplaySSM decode step: output-only route from checkpoint + buffer and append, or,
    for sequences whose cursor n has n + 1 >= K, a fused flush (fold, write checkpoint(s),
    cursor back to 0). Decided per sequence on the device. Shapes as eager_step (the state:
    rs, made by allocate). Returns y [b, H, P].

    advance_cursor=False (Triton only) skips the cursor pass, for callers whose layers
    share one cursor tensor and advance it once per step (advance_cursors).
    """
    chk.check_backend(backend)
    chk.options_of("replay_step", options, Mamba2Options)
    _step_checks("replay_step", backend, rs, x, dt, A, B, C, D, dt_bias, z, state_indices, out, check)
    if backend == "reference":
        if not advance_cursor:
            raise ValueError("replay_step: advance_cursor=False needs backend='triton'")
        return into(out, ref.mamba2_replay_step(rs, x, dt, A, B, C, D, dt_bias, z, state_indices))
    k = _k()
    if rs.counter is not None:   # the small-batch route flushes every k-th step
        _count_replay(rs, x, dt, B, C, z, state_indices, k.state_route_period(rs, x, options) if advance_cursor else 0)
    launches, y = k.plan_replay(rs, x, dt, A, B, C, D, dt_bias, z, state_indices, advance_cursor, out, options=options)
    k.run(launches)
    return y


def advance_cursors(rs: Mamba2ReplayState, batch: int, state_indices=None, *,
                    options: Mamba2Options | None = None) -> None:
    """The per-step cursor move (n + 1 >= K ? 0 : n + 1) of `batch` rows, for callers that
    ran replay_step(..., advance_cursor=False)."""
    chk.state_tensors("advance_cursors", rs, "triton")
    a = chk.Args("advance_cursors", rs.cursor.device, b=batch)
    a.indices("state_indices", state_indices)
    chk.batch_fits("advance_cursors", batch, rs.cursor.shape[0], state_indices)
    k = _k()
    k.run(k.plan_cursor(rs, state_indices, batch, 0, options=options))


def flush(rs: Mamba2ReplayState, slots: torch.Tensor | None = None, *, A: torch.Tensor | None = None,
          backend: str = "triton", options: Mamba2Options | None = None, check: bool | None = None) -> None:
    """Fold every committed entry of `slots` [n] (None: all slots; negative or out-of-range:
    skipped) into the checkpoint (and refresh the low copy); their cursors return to 0.
    Sequences with cursor 0 are untouched. A [H]: default the one the state remembers."""
    chk.check_backend(backend)
    chk.options_of("flush", options, Mamba2Options)
    chk.mamba2_state_dims("flush", rs, backend)
    chk.flush_args("flush", rs, slots)
    A = _A("flush", rs, A)
    if chk.debug(check):
        chk.slots_in_pool("flush", "slots", slots, rs.cursor.shape[0])
    if backend == "reference":
        return ref.mamba2_flush(rs, A, slots)
    if rs.counter is not None:
        acc.count_fold(rs, rs.entries(acc.flush_slots(rs, slots)))
    k = _k()
    k.run(k.plan_flush(rs, A, slots, options=options))


def verify(rs: Mamba2ReplayState, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, *,
           backend: str = "triton", out=None, options: Mamba2Options | None = None,
           check: bool | None = None) -> torch.Tensor:
    """Speculative verification of T drafts, all outputs from checkpoint + buffer, no
    per-draft state. x [b, T, H, P], dt [b, T, H], B/C [b, T, G, N], z [b, T, H, P] or None.
    Drafts are written at buffer rows cursor..cursor+T-1 (L >= K + T, checked); the cursor
    does not move (commit moves it). Returns y [b, T, H, P]."""
    chk.check_backend(backend)
    chk.options_of("verify", options, Mamba2Options)
    _step_checks("verify", backend, rs, x, dt, A, B, C, D, dt_bias, z, state_indices, out, check, draft=True)
    rs.draft_window = x.shape[1]
    if backend == "reference":
        return into(out, ref.mamba2_verify(rs, x, dt, A, B, C, D, dt_bias, z, state_indices))
    if rs.counter is not None:
        rows, slots = acc.live_rows(state_indices, x.shape[0], x.device, rs.cursor.shape[0])
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


def commit(rs: Mamba2ReplayState, accepted: torch.Tensor, state_indices=None, *, A: torch.Tensor | None = None,
           backend: str = "triton", options: Mamba2Options | None = None, check: bool | None = None) -> None:
    """Accept accepted[b] (0..T, an int device tensor) drafts per row: a cursor move;
    sequences whose cursor reaches K fold all their committed entries into the checkpoint (on
    the device) and return to cursor 0. A [H]: default the one the state remembers."""
    chk.check_backend(backend)
    chk.options_of("commit", options, Mamba2Options)
    chk.mamba2_state_dims("commit", rs, backend)
    chk.commit_args("commit", rs, accepted, state_indices)
    A = _A("commit", rs, A)
    if chk.debug(check):
        chk.slots_in_pool("commit", "state_indices", state_indices, rs.cursor.shape[0])
        chk.accepted_counts("commit", rs, accepted, state_indices)
    if backend == "reference":
        return ref.mamba2_commit(rs, A, accepted, state_indices)
    if rs.counter is not None:
        rows, slots = acc.live_rows(state_indices, accepted.shape[0], accepted.device, rs.cursor.shape[0])
        n = rs.entries(slots) + accepted[rows].long()
        acc.count_fold(rs, n[n >= rs.flush_period])
    k = _k()
    k.run(k.plan_commit(rs, A, accepted, state_indices, options=options))
