"""Public Gated DeltaNet decode ops: eager baseline and ReplaySSM (replay, flush, verify, commit).

Every op takes ``backend="triton"`` (default: the kernels of this package) or
``backend="reference"`` (the exact PyTorch oracle, reference.py here); both have the
semantics documented in reference.py, with the same argument names and shapes:

    q, k [b, Hk, dk]; v [b, Hv, dv]; g [b, Hv] (log alpha); beta [b, Hv]
    state [S, Hv, dv, dk]; state_indices [b] int32 (negative = padded row: output 0, no I/O)
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
from ..common.backends import BACKENDS, check_backend, into  # noqa: F401 (BACKENDS: part of this module's API)
from ..state import ByteCounter, GDNReplayState
from . import reference as ref
from .options import GDNOptions

__all__ = ["eager_step", "replay_step", "flush", "verify", "commit", "route_period", "GDNOptions"]


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


def _live(state_indices, batch, device):
    rows, slots = acc.live_rows(state_indices, batch, device)
    return rows, slots


def eager_step(state: torch.Tensor, q, k, v, g, beta, state_indices=None, scale=None,
               counter: ByteCounter | None = None, backend: str = "triton", out=None, options=None):
    """One eager step: reads and writes state [S, Hv, dv, dk] in place. Returns o [b, Hv, dv]."""
    check_backend(backend)
    if backend == "reference":
        return into(out, ref.gdn_eager_step(state, q, k, v, g, beta, state_indices, scale, counter))
    o = _kernels().eager_step(state, q, k, v, g, beta, state_indices, scale, out, options)
    if counter is not None:
        acc.count_eager(counter, state, len(_live(state_indices, v.shape[0], v.device)[0]),
                        acc.gdn_io_bytes(q, k, v, g, beta), v[0].numel() * v.element_size())
    return o


def replay_step(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, scale=None,
                backend: str = "triton", out=None, options=None):
    """One ReplaySSM step (output-only route; fused flush where cursor + 1 >= K; or, where the
    kernel table says so (small batches), the small-batch route on the high copy: a flush every
    k-th step, reference.gdn_replay_step's `route`). Returns o [b, Hv, dv]."""
    check_backend(backend)
    if backend == "reference":
        return into(out, ref.gdn_replay_step(rs, q, k, v, g, beta, state_indices, scale))
    if rs.counter is not None:   # the small-batch route flushes every k-th step
        _count_replay(rs, q, k, v, g, beta, state_indices, _kernels().state_route_period(rs, k, v, options))
    return _kernels().replay_step(rs, q, k, v, g, beta, state_indices, scale, out, options)


def flush(rs: GDNReplayState, slots: torch.Tensor | None = None, backend: str = "triton", options=None) -> None:
    """Fold every committed entry of `slots` (default: all slots; those with cursor 0 are left alone)."""
    check_backend(backend)
    if backend == "reference":
        return ref.gdn_flush(rs, slots)
    if rs.counter is not None:
        acc.count_fold(rs, rs.entries(acc.flush_slots(rs, slots)))
    if slots is not None:
        slots = slots.to(device=rs.cursor.device, dtype=torch.int32)
    _kernels().flush(rs, slots, options)


def verify(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, scale=None,
           backend: str = "triton", out=None, options=None):
    """Outputs of T drafts from checkpoint + buffer, no per-draft state; drafts are written at
    cursor..cursor+T-1, the cursor does not move. Returns o [b, T, Hv, dv]."""
    check_backend(backend)
    if backend == "reference":
        return into(out, ref.gdn_verify(rs, q, k, v, g, beta, state_indices, scale))
    if rs.counter is not None:
        rows, slots = _live(state_indices, v.shape[0], v.device)
        n = rs.entries(slots)
        acc.count_refresh(rs, int(rs.lo_stale(slots).sum()))
        rb = rs.buffer_row_bytes()
        rs.count(ckpt_read=len(rows) * rs.read_ckpt.bytes_per_slot(), buf_read=int(n.sum()) * rb,
                 buf_write=len(rows) * v.shape[1] * rb, io_read=len(rows) * acc.gdn_io_bytes(q, k, v, g, beta),
                 io_write=len(rows) * v[0].numel() * v.element_size())
    return _kernels().verify(rs, q, k, v, g, beta, state_indices, scale, out, options)


def commit(rs: GDNReplayState, accepted: torch.Tensor, state_indices=None, backend: str = "triton",
           options=None) -> None:
    """Accept `accepted[b]` drafts per row (a cursor move) and flush sequences whose cursor
    reached the flush period; on the triton backend the decision is made on the device."""
    check_backend(backend)
    if backend == "reference":
        return ref.gdn_commit(rs, accepted, state_indices)
    if rs.counter is not None:
        rows, slots = _live(state_indices, accepted.shape[0], accepted.device)
        n = rs.entries(slots) + accepted[rows].long()
        due = n >= rs.flush_period
        rs.count(ckpt_read=int(due.sum()) * rs.hi.bytes_per_slot(),
                 buf_read=int(n[due].sum()) * rs.buffer_row_bytes(),
                 ckpt_write=int(due.sum()) * rs.state_bytes_per_slot())
    _kernels().commit(rs, accepted, state_indices, options)


def _count_replay(rs: GDNReplayState, q, k, v, g, beta, state_indices, route: int) -> None:
    """Same byte accounting as reference.gdn_replay_step (route: the small-batch route's period; host
    sync: not for graph capture)."""
    rows, slots = _live(state_indices, v.shape[0], v.device)
    if len(rows) == 0:
        return
    n = rs.entries(slots)
    acc.count_step(rs, n, acc.flush_rows(rs, slots, n, route), route, acc.gdn_io_bytes(q, k, v, g, beta),
                   v[0].numel() * v.element_size())
