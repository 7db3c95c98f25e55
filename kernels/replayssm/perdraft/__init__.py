"""Public ops of the per-draft speculative baseline: what vLLM's speculative path does.

Verification steps the recurrence eagerly over a round's T tokens and writes the full state
after every token into its own slot; each request owns 1 + T slots (a row of a slot table
[b, 1 + T], int32) used as a ring:

    start[b]   (device tensor, 0..T) column of the state the round starts from (the accepted
               slot; vLLM's num_accepted_tokens - 1)
    token t    its state goes to column (start + 1 + t) mod (1 + T); the start slot is not written
    commit m   advance(start, accepted, T): start <- (start + m) mod (1 + T), m in 0..T

Per request and round: one state read and T state writes, and 1 + T states of memory, against
ReplaySSM's one checkpoint read (no state write) and one checkpoint plus an input buffer.

    mamba2_verify(states [S,H,P,N], slot_table, start, x [b,T,H,P], dt [b,T,H], A, B/C [b,T,G,N],
                  D, dt_bias, z=None, *, backend, out=None, counter=None, options=None) -> y [b,T,H,P]
    gdn_verify(states [S,Hv,dv,dk], slot_table, start, q/k [b,T,Hk,dk], v [b,T,Hv,dv],
               g/beta [b,T,Hv], scale=None, *, backend, ...) -> o [b,T,Hv,dv]
    advance(start, accepted, T)         the commit (in place, on the device)
    slot_table(idx, T)                  [b, 1 + T] table: row i owns slots i*(1+T) .. i*(1+T)+T

A row whose start slot is negative is padding (output 0, no state read or written); a negative
destination slot is skipped. backend="triton" (kernels.py, planned by plan.py from table.py;
CUDA-graph capturable: fixed grid, start and slot table read on the device) or "reference"
(replayssm.reference). options (triton): a PerdraftOptions (launch-table overrides). A
ByteCounter (counter=) reads the table on the host: not while capturing.
"""
from __future__ import annotations

import torch

import importlib

from .. import accounting as acc
from ..common import checks as chk
from ..common.backends import BACKENDS, check_backend, into  # noqa: F401 (BACKENDS: part of this module's API)
from ..state import ByteCounter
from . import reference as ref
from .options import PerdraftOptions

__all__ = ["slot_table", "advance", "mamba2_verify", "gdn_verify", "PerdraftOptions"]


def _tk():
    return importlib.import_module(".plan", __name__)   # lazily: TRITON_INTERPRET set by the caller first applies


def slot_table(idx: torch.Tensor, T: int, base: int = 0) -> torch.Tensor:
    """int32 [b, 1 + T]: row i with idx[i] = s >= 0 owns slots base + s*(1+T) + j, j = 0..T;
    a padded row (idx < 0) gets -1 everywhere. States need base + max(idx+1)*(1+T) slots."""
    i = idx.to(torch.int64)
    tbl = base + i[:, None] * (T + 1) + torch.arange(T + 1, device=idx.device)
    return torch.where(i[:, None] >= 0, tbl, torch.full_like(tbl, -1)).to(torch.int32).contiguous()


def advance(start: torch.Tensor, accepted: torch.Tensor, T: int) -> torch.Tensor:
    """Commit m = accepted[b] (0..T) tokens: start <- (start + m) mod (1 + T), in place on the
    device (two elementwise kernels, graph-capturable). Returns start."""
    start.add_(accepted.to(start.dtype)).remainder_(T + 1)
    return start


def _count(counter, states, slot_table, start, io_read, io_write) -> None:
    """Host-side byte accounting, same as the reference's (syncs)."""
    rows, _, dst = acc.perdraft_rows(slot_table, start, states.shape[0])
    acc.count_perdraft(counter, states, len(rows), int((dst >= 0).sum()), len(rows) * io_read,
                        len(rows) * io_write)


def _checks(op, states, slot_table, start, T, check) -> None:
    """slot_table [b, 1 + T] int, start [b] int (host); debug: slots < S, starts in 0..T."""
    a = chk.Args(op, states.device, T1=T + 1)
    a.indices("slot_table", slot_table, "b T1", optional=False)
    a.indices("start", start, "b", optional=False)
    if chk.debug(check):
        chk.slots_in_pool(op, "slot_table", slot_table, states.shape[0], unique=False)
        st = start.detach().to("cpu", torch.long)
        if len(st) and (int(st.min()) < 0 or int(st.max()) > T):
            chk.fail(op, "start", f"in 0..{T}", st[(st < 0) | (st > T)].tolist()[:8])


def mamba2_verify(states, slot_table, start, x, dt, A, B, C, D, dt_bias, z=None, *, backend: str = "triton",
                  out=None, counter: ByteCounter | None = None, options=None,
                  check: bool | None = None) -> torch.Tensor:
    """Per-draft verification of T tokens (Mamba-2); see the module docstring."""
    check_backend(backend)
    dims = chk.eager_state("perdraft.mamba2_verify", states, "S H P N", backend)
    a = chk.mamba2_inputs("perdraft.mamba2_verify", dims, states.device, x, dt, A, B, C, D, dt_bias, z, None, out,
                          draft=True)
    _checks("perdraft.mamba2_verify", states, slot_table, start, a.dims["T"], check)
    if backend == "reference":
        return into(out, ref.mamba2_verify_perdraft(states, slot_table, start, x, dt, A, B, C, D, dt_bias, z,
                                                     counter))
    if counter is not None:
        _count(counter, states, slot_table, start, acc.mamba2_io_bytes(x, dt, B, C, z), x[0].numel() * x.element_size())
    return _tk().verify_mamba2(states, slot_table, start, x, dt, A, B, C, D, dt_bias, z, out, options)


def gdn_verify(states, slot_table, start, q, k, v, g, beta, scale=None, *, backend: str = "triton", out=None,
               counter: ByteCounter | None = None, options=None, check: bool | None = None) -> torch.Tensor:
    """Per-draft verification of T tokens (GDN); see the module docstring."""
    check_backend(backend)
    dims = chk.eager_state("perdraft.gdn_verify", states, "S Hv dv dk", backend)
    a = chk.gdn_inputs("perdraft.gdn_verify", dims, states.device, q, k, v, g, beta, None, scale, out, draft=True)
    _checks("perdraft.gdn_verify", states, slot_table, start, a.dims["T"], check)
    if backend == "reference":
        return into(out, ref.gdn_verify_perdraft(states, slot_table, start, q, k, v, g, beta, scale, counter))
    if counter is not None:
        _count(counter, states, slot_table, start, acc.gdn_io_bytes(q, k, v, g, beta), v[0].numel() * v.element_size())
    return _tk().verify_gdn(states, slot_table, start, q, k, v, g, beta, scale, out, options)
