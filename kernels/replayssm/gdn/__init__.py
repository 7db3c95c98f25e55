"""Public Gated DeltaNet decode ops: the eager baseline and ReplaySSM. The verbs, with
replayssm.mamba2's argument order and keyword rules (docs/api.md): allocate, load_state,
export_state, entries, eager_step, replay_step, flush, verify, commit.

Every op takes the keyword-only ``backend="triton"`` (default: the kernels of this package) or
``backend="reference"`` (the exact PyTorch oracle, reference.py here); both have the
semantics documented in reference.py (same results, same errors), with the same argument
names and shapes. ``check=``: the debug checks (device data; None: REPLAYSSM_CHECK). Shapes,
dtypes and L >= K + T are checked on the host at every call (common/checks.py):

    q, k [b, Hk, dk]; v [b, Hv, dv]; g [b, Hv] (log alpha); beta [b, Hv]
    state [S, Hv, dv, dk]; state_indices [b] int32 (outside 0..S-1, e.g. negative = padded
    row: output 0, no I/O); scale (keyword): q's scale, default dk^-0.5
    verify: q/k [b, T, Hk, dk], v [b, T, Hv, dv], g/beta [b, T, Hv]; accepted [b] (0..T)

Triton ops are CUDA-graph capturable: fixed grids, every per-sequence decision (flush or not,
cursor moves, commit flushes) is made on the device, no host sync. Exception: when a
ByteCounter is attached (``rs.counter`` / ``counter=``) the triton path reads the cursors on
the host to count bytes like the reference does; do not attach one while capturing.
``out`` (optional) receives the output (every element is written, padded rows get 0).
``options`` (triton only): a GDNOptions (knobs, and per-op overrides of the launch table for
tuning); None = the defaults. replayssm.gdn.plan.plan(op, ...) lists the launches an op makes.

Files: eager.py, route.py (small-batch route), replay.py, flush_step.py, fold.py (flush,
commit), verify_kernel.py (a verify.py would shadow the verify op): the kernels; jit.py their
shared helpers; table.py the launch table; options.py the knobs; plan.py which launches an op
makes. The oracle: replayssm.reference.
"""
from __future__ import annotations

import importlib

import torch

from .. import accounting as acc
from ..common import checks as chk
from ..common import reference as cref
from ..common.backends import BACKENDS, check_backend, into  # noqa: F401 (BACKENDS: part of this module's API)
from ..state import ByteCounter, GDNReplayState
from . import reference as ref
from .options import GDNOptions

__all__ = ["allocate", "load_state", "export_state", "entries", "eager_step", "replay_step", "flush", "verify",
           "commit", "route_period", "GDNOptions"]


def _kernels():
    return importlib.import_module(".plan", __name__)   # lazily: the reference backend needs no triton


def route_period(*, batch: int, heads: int, head_dim: int, read_bytes: int, flush_period: int, dual: bool = False,
                 key_dim: int, buffer_len: int, options: GDNOptions | None = None) -> int:
    """The triton replay step's small-batch route period at this shape (0: it buffers; k: the
    state is written every k-th step); heads / head_dim / key_dim: Hv / dv / dk; read_bytes: the
    read copy's bytes per element (dual: the low copy)."""
    return _kernels().route_period(batch=batch, heads=heads, head_dim=head_dim, read_bytes=read_bytes,
                                   flush_period=flush_period, dual=dual, key_dim=key_dim, buffer_len=buffer_len,
                                   options=options)


def _live(state_indices, batch, device, pool=None):
    rows, slots = acc.live_rows(state_indices, batch, device, pool)
    return rows, slots


def _step_checks(op, backend, rs, q, k, v, g, beta, state_indices, scale, out, check, draft=False):
    """Host checks of a replay state's op (always) and, in debug mode, its indices."""
    dims = chk.gdn_state_dims(op, rs, backend)
    chk.gdn_inputs(op, dims, rs.cursor.device, q, k, v, g, beta, state_indices, scale, out, draft)
    chk.rows_and_window(op, rs, state_indices, v.shape[0], v.shape[1] if draft else None, check)


# ----------------------------------------------------------------------------- state
def allocate(slots: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int, buffer_len: int,
             flush_period: int, *, spec_window: int = 0, mode: str = "replay", state_dtype="float32", lo_dtype=None,
             act_dtype=torch.bfloat16, device="cpu", counter: ByteCounter | None = None) -> GDNReplayState:
    """A zeroed replay state: checkpoint(s) [slots, Hv, dv, dk], buffer of buffer_len (L)
    entries, flush period K <= L; spec_window T: the draft window verify will use (L >= K + T
    checked here). mode / state_dtype / lo_dtype: the precision mode (replayssm.state)."""
    return GDNReplayState.allocate(slots, num_k_heads, num_v_heads, head_k_dim, head_v_dim, buffer_len, flush_period,
                                   mode, state_dtype, lo_dtype, act_dtype, device, counter, spec_window=spec_window)


def load_state(rs: GDNReplayState, state: torch.Tensor, slots: torch.Tensor | None = None, *,
               backend: str = "triton", check: bool | None = None) -> None:
    """Set the recurrent state of `slots` [b] (None: slot b for row b) to `state` [b, Hv, dv, dk]
    (any float dtype; quantised to the checkpoint's storage, both copies in dual mode) and drop
    their buffered entries (cursor 0). A negative or out-of-range slot skips its row. Same on
    both backends (plain tensor writes)."""
    chk.slot_op("load_state", backend, rs, slots, check, state)
    cref.load_state(rs, state, slots)


def export_state(rs: GDNReplayState, slots: torch.Tensor | None = None, *, backend: str = "triton") -> torch.Tensor:
    """The recurrent state of `slots` [b] (None: all slots) after every committed entry, as an
    eager step would hold it: [b, Hv, dv, dk] float32 (float64 for a float64 state), the buffer
    folded into the high checkpoint, nothing written. Negative / out-of-range slots give 0.
    Reads entries on the host (not for graph capture)."""
    chk.slot_op("export_state", backend, rs, slots)
    return ref.gdn_export_state(rs, slots)


def entries(rs: GDNReplayState, slots: torch.Tensor | None = None) -> torch.Tensor:
    """Committed entries since the last flush [len(slots)] (long) of `slots` (None: all); the
    cursor word decoded (replayssm.state)."""
    return rs.entries(slots)


# ----------------------------------------------------------------------------- ops
def eager_step(state: torch.Tensor, q, k, v, g, beta, state_indices=None, *, scale=None,
               counter: ByteCounter | None = None, backend: str = "triton", out=None, options=None,
               check: bool | None = None):
    """One eager step: reads and writes state [S, Hv, dv, dk] in place. q / k [b, Hk, dk],
    v [b, Hv, dv], g / beta [b, Hv], state_indices [b] or None; scale: q's scale (None:
    dk^-0.5). Returns o [b, Hv, dv] in v's dtype."""
    chk.check_backend(backend)
    chk.options_of("eager_step", options, GDNOptions)
    dims = chk.eager_state("eager_step", state, "S Hv dv dk", backend)
    chk.gdn_inputs("eager_step", dims, state.device, q, k, v, g, beta, state_indices, scale, out)
    if chk.debug(check):
        chk.slots_in_pool("eager_step", "state_indices", state_indices, dims["S"])
    if backend == "reference":
        return into(out, ref.gdn_eager_step(state, q, k, v, g, beta, state_indices, scale, counter))
    o = _kernels().eager_step(state, q, k, v, g, beta, state_indices, scale, out, options)
    if counter is not None:
        acc.count_eager(counter, state, len(_live(state_indices, v.shape[0], v.device, state.shape[0])[0]),
                        acc.gdn_io_bytes(q, k, v, g, beta), v[0].numel() * v.element_size())
    return o


def replay_step(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, *, scale=None,
                backend: str = "triton", out=None, options=None, check: bool | None = None):
    """One ReplaySSM step (output-only route; fused flush where cursor + 1 >= K; or, where the
    kernel table says so (small batches), the small-batch route on the high copy: a flush every
    k-th step, reference.gdn_replay_step's `route`). Shapes as eager_step (the state: rs, made
    by allocate). Returns o [b, Hv, dv]."""
    chk.check_backend(backend)
    chk.options_of("replay_step", options, GDNOptions)
    _step_checks("replay_step", backend, rs, q, k, v, g, beta, state_indices, scale, out, check)
    if backend == "reference":
        return into(out, ref.gdn_replay_step(rs, q, k, v, g, beta, state_indices, scale))
    if rs.counter is not None:   # the small-batch route flushes every k-th step
        _count_replay(rs, q, k, v, g, beta, state_indices, _kernels().state_route_period(rs, k, v, options))
    return _kernels().replay_step(rs, q, k, v, g, beta, state_indices, scale, out, options)


def flush(rs: GDNReplayState, slots: torch.Tensor | None = None, *, backend: str = "triton", options=None,
          check: bool | None = None) -> None:
    """Fold every committed entry of `slots` [n] (None: all slots; negative or out-of-range:
    skipped; those with cursor 0 are left alone) into the checkpoint."""
    chk.check_backend(backend)
    chk.options_of("flush", options, GDNOptions)
    chk.gdn_state_dims("flush", rs, backend)
    chk.flush_args("flush", rs, slots)
    if chk.debug(check):
        chk.slots_in_pool("flush", "slots", slots, rs.cursor.shape[0])
    if backend == "reference":
        return ref.gdn_flush(rs, slots)
    if rs.counter is not None:
        acc.count_fold(rs, rs.entries(acc.flush_slots(rs, slots)))
    if slots is not None:
        slots = slots.to(device=rs.cursor.device, dtype=torch.int32)
    _kernels().flush(rs, slots, options)


def verify(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, *, scale=None,
           backend: str = "triton", out=None, options=None, check: bool | None = None):
    """Outputs of T drafts from checkpoint + buffer, no per-draft state: q / k [b, T, Hk, dk],
    v [b, T, Hv, dv], g / beta [b, T, Hv]. Drafts are written at cursor..cursor+T-1 (L >= K + T,
    checked); the cursor does not move (commit moves it). Returns o [b, T, Hv, dv]."""
    chk.check_backend(backend)
    chk.options_of("verify", options, GDNOptions)
    _step_checks("verify", backend, rs, q, k, v, g, beta, state_indices, scale, out, check, draft=True)
    rs.draft_window = v.shape[1]
    if backend == "reference":
        return into(out, ref.gdn_verify(rs, q, k, v, g, beta, state_indices, scale))
    if rs.counter is not None:
        rows, slots = _live(state_indices, v.shape[0], v.device, rs.cursor.shape[0])
        n = rs.entries(slots)
        acc.count_refresh(rs, int(rs.lo_stale(slots).sum()))
        rb = rs.buffer_row_bytes()
        rs.count(ckpt_read=len(rows) * rs.read_ckpt.bytes_per_slot(), buf_read=int(n.sum()) * rb,
                 buf_write=len(rows) * v.shape[1] * rb, io_read=len(rows) * acc.gdn_io_bytes(q, k, v, g, beta),
                 io_write=len(rows) * v[0].numel() * v.element_size())
    return _kernels().verify(rs, q, k, v, g, beta, state_indices, scale, out, options)


def commit(rs: GDNReplayState, accepted: torch.Tensor, state_indices=None, *, backend: str = "triton",
           options=None, check: bool | None = None) -> None:
    """Accept `accepted[b]` (0..T, an int device tensor) drafts per row (a cursor move) and
    flush sequences whose cursor reached the flush period; on the triton backend the decision
    is made on the device."""
    chk.check_backend(backend)
    chk.options_of("commit", options, GDNOptions)
    chk.gdn_state_dims("commit", rs, backend)
    chk.commit_args("commit", rs, accepted, state_indices)
    if chk.debug(check):
        chk.slots_in_pool("commit", "state_indices", state_indices, rs.cursor.shape[0])
        chk.accepted_counts("commit", rs, accepted, state_indices)
    if backend == "reference":
        return ref.gdn_commit(rs, accepted, state_indices)
    if rs.counter is not None:
        rows, slots = _live(state_indices, accepted.shape[0], accepted.device, rs.cursor.shape[0])
        n = rs.entries(slots) + accepted[rows].long()
        due = n >= rs.flush_period
        rs.count(ckpt_read=int(due.sum()) * rs.hi.bytes_per_slot(),
                 buf_read=int(n[due].sum()) * rs.buffer_row_bytes(),
                 ckpt_write=int(due.sum()) * rs.state_bytes_per_slot())
    _kernels().commit(rs, accepted, state_indices, options)


def _count_replay(rs: GDNReplayState, q, k, v, g, beta, state_indices, route: int) -> None:
    """Same byte accounting as reference.gdn_replay_step (route: the small-batch route's period; host
    sync: not for graph capture)."""
    rows, slots = _live(state_indices, v.shape[0], v.device, rs.cursor.shape[0])
    if len(rows) == 0:
        return
    n = rs.entries(slots)
    acc.count_step(rs, n, acc.flush_rows(rs, slots, n, route), route, acc.gdn_io_bytes(q, k, v, g, beta),
                   v[0].numel() * v.element_size())
