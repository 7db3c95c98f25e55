"""Mamba-2 oracle: exact PyTorch recurrences for the eager step and ReplaySSM (step, flush,
verify, commit); see replayssm.reference for the shared semantics.

Per head (P = head dim, N = state dim, B/C shared per group):
    dt = softplus(dt_raw + dt_bias),  a = exp(dt * A)
    S_t = a_t S_{t-1} + dt_t x_t B_t^T,   y_t = S_t C_t + D x_t   (then * silu(z) if gated)
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..accounting import count_step, flush_rows, flush_slots, live_rows, mamba2_io_bytes
from ..common.reference import (advance, commit, decay_weights, expand_groups, export_state, refresh_stale, softplus,
                                write_flushed)
from ..state import ByteCounter, Mamba2ReplayState, compute_dtype


def mamba2_eager_step(state: torch.Tensor, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None,
                      counter: ByteCounter | None = None) -> torch.Tensor:
    """One eager decode step; reads and writes the state.

    state [S, H, P, N] (updated in place), x [b, H, P], dt [b, H] (raw), A [H], B/C [b, G, N],
    D [H], dt_bias [H], z [b, H, P] or None, state_indices [b] (negative = padding).
    Returns y [b, H, P] in x's dtype.
    """
    cd = compute_dtype(state, x)
    rows, slots = live_rows(state_indices, x.shape[0], x.device, state.shape[0])
    H = x.shape[1]
    xs, Bh, Ch = x[rows].to(cd), expand_groups(B[rows].to(cd), H, 1), expand_groups(C[rows].to(cd), H, 1)
    dtv = softplus(dt[rows].to(cd) + dt_bias.to(cd))
    a = torch.exp(dtv * A.to(cd))
    S = state[slots].to(cd)
    S = a[..., None, None] * S + (dtv[..., None] * xs)[..., None] * Bh[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", S, Ch) + D.to(cd)[:, None] * xs
    if z is not None:
        y = y * F.silu(z[rows].to(cd))
    state[slots] = S.to(state.dtype)
    out = torch.zeros_like(x)
    out[rows] = y.to(x.dtype)
    if counter is not None:
        n = len(rows)
        sb = state[0].numel() * state.element_size()
        counter.ckpt_read += n * sb
        counter.ckpt_write += n * sb
        counter.io_read += n * mamba2_io_bytes(x, dt, B, C, z)
        counter.io_write += n * x[0].numel() * x.element_size()
        counter.steps += 1
    return out


def _mamba2_buffer(rs: Mamba2ReplayState, slots, cd, H):
    X = rs.x[slots].to(cd)                                  # [b, L, H, P]
    Bb = expand_groups(rs.B[slots].to(cd), H, 2)           # [b, L, H, N]
    dtb = rs.dt[slots].to(cd)                               # [b, L, H]
    return X, Bb, dtb


def _mamba2_outputs(S, X, Bb, dtb, A, Ch, end):
    """y without D/z for targets over entries 0..end: S [b,H,P,N] checkpoint (dequantised),
    X [b,L,H,P], Bb [b,L,H,N], dtb [b,L,H], Ch [b,T,H,N], end [b,T] -> [b,T,H,P]."""
    total, rel = decay_weights(dtb * A, end)              # [b,T,H], [b,T,L,H]
    w = rel * dtb[:, None]                                  # dt_i * prod_{i<j<=e} a_j
    bc = torch.einsum("blhn,bthn->btlh", Bb, Ch)
    return total[..., None] * torch.einsum("bhpn,bthn->bthp", S, Ch) + torch.einsum("btlh,blhp->bthp", w * bc, X)


def _mamba2_fold(S, X, Bb, dtb, A, end):
    """State after entries 0..end ([b]) from checkpoint S [b,H,P,N]."""
    total, rel = decay_weights(dtb * A, end[:, None])
    w = (rel * dtb[:, None])[:, 0]                          # [b, L, H]
    return total[:, 0, :, None, None] * S + torch.einsum("blh,blhp,blhn->bhpn", w, X, Bb)


def mamba2_replay_step(rs: Mamba2ReplayState, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None,
                       route: int = 0):
    """One ReplaySSM decode step (output-only route; fused flush when the cursor reaches K or
    the low copy is stale). route: the small-batch route's semantics (flush_rows).

    Same tensor shapes as mamba2_eager_step. Appends (x, B, softplus(dt + dt_bias)) at each
    sequence's cursor. Returns y [b, H, P].
    """
    cd = compute_dtype(rs.hi.data, x)
    rows, slots = live_rows(state_indices, x.shape[0], x.device, rs.cursor.shape[0])
    out = torch.zeros_like(x)
    if len(rows) == 0:
        return out
    H = x.shape[1]
    n = rs.entries(slots)
    if int(n.max()) >= rs.capacity:
        raise RuntimeError("buffer overflow: cursor reached capacity without a flush")
    xs, Ch = x[rows].to(cd), expand_groups(C[rows].to(cd), H, 1)
    dtv = softplus(dt[rows].to(cd) + dt_bias.to(cd))
    rs.x[slots, n], rs.B[slots, n] = x[rows].to(rs.x.dtype), B[rows].to(rs.B.dtype)
    rs.dt[slots, n] = dtv.to(rs.dt.dtype)
    X, Bb, dtb = _mamba2_buffer(rs, slots, cd, H)
    Acd = A.to(cd)
    flush = flush_rows(rs, slots, n, route)
    y = torch.empty(len(rows), H, x.shape[2], dtype=cd, device=x.device)
    f, nf = torch.nonzero(flush).flatten(), torch.nonzero(~flush).flatten()
    if len(nf):
        S = (rs.hi if route else rs.read_ckpt).read(slots[nf], cd)
        y[nf] = _mamba2_outputs(S, X[nf], Bb[nf], dtb[nf], Acd, Ch[nf, None], n[nf, None])[:, 0]
        advance(rs, slots[nf], n[nf], route)
    if len(f):
        S = _mamba2_fold(rs.hi.read(slots[f], cd), X[f], Bb[f], dtb[f], Acd, n[f])
        y[f] = torch.einsum("bhpn,bhn->bhp", S, Ch[f])
        write_flushed(rs, slots[f], S, route)
    y = y + D.to(cd)[:, None] * xs
    if z is not None:
        y = y * F.silu(z[rows].to(cd))
    out[rows] = y.to(x.dtype)
    count_step(rs, n, flush, route, mamba2_io_bytes(x, dt, B, C, z), x[0].numel() * x.element_size())
    return out


def mamba2_flush(rs: Mamba2ReplayState, A, slots: torch.Tensor | None = None) -> None:
    """Fold every committed entry of `slots` (default: all slots with entries, or with a
    stale low copy, which is refreshed) into the checkpoint."""
    slots = flush_slots(rs, slots)
    if len(slots) == 0:
        return
    cd = compute_dtype(rs.hi.data, rs.x)
    X, Bb, dtb = _mamba2_buffer(rs, slots, cd, rs.x.shape[2])
    n = rs.entries(slots)
    S = _mamba2_fold(rs.hi.read(slots, cd), X, Bb, dtb, A.to(cd), n - 1)
    rs.count(ckpt_read=len(slots) * rs.hi.bytes_per_slot(), buf_read=int(n.sum()) * rs.buffer_row_bytes(),
             ckpt_write=len(slots) * rs.state_bytes_per_slot())
    write_flushed(rs, slots, S)


def mamba2_export_state(rs: Mamba2ReplayState, A, slots=None) -> torch.Tensor:
    """The state after every committed entry of `slots` (None: all): the high checkpoint with
    the buffer folded in ([b, H, P, N], fp32 / fp64; 0 for slots outside the pool). Writes
    nothing. A [H] may be None when no slot has entries."""
    H = rs.x.shape[2]

    def fold(r, sl, cd, end):
        if A is None and len(end) and int(end.max()) >= 0:
            raise ValueError("export_state: A (the layer's) is needed to fold buffered entries")
        a = torch.zeros(H, device=r.cursor.device) if A is None else A
        return _mamba2_fold(r.hi.read(sl, cd), *_mamba2_buffer(r, sl, cd, H), a.to(cd), end)
    return export_state(rs, slots, fold)


def mamba2_verify(rs: Mamba2ReplayState, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None):
    """Speculative verification of T drafts: all T outputs from checkpoint + buffer.

    x [b, T, H, P], dt [b, T, H], B/C [b, T, G, N], z [b, T, H, P] or None.
    Drafts are written at buffer positions cursor..cursor+T-1; the cursor does not move
    (mamba2_commit moves it). No per-draft state. Returns y [b, T, H, P].
    """
    cd = compute_dtype(rs.hi.data, x)
    rows, slots = live_rows(state_indices, x.shape[0], x.device, rs.cursor.shape[0])
    out = torch.zeros_like(x)
    if len(rows) == 0:
        return out
    T, H = x.shape[1], x.shape[2]
    refresh_stale(rs, slots, cd)
    n = rs.entries(slots)
    if int(n.max()) + T > rs.capacity:
        raise RuntimeError(f"draft window of {T} does not fit: cursor {int(n.max())}, capacity {rs.capacity}")
    pos = n[:, None] + torch.arange(T, device=x.device)     # [b, T]
    dtv = softplus(dt[rows].to(cd) + dt_bias.to(cd))        # [b, T, H]
    rs.x[slots[:, None], pos], rs.B[slots[:, None], pos] = x[rows].to(rs.x.dtype), B[rows].to(rs.B.dtype)
    rs.dt[slots[:, None], pos] = dtv.to(rs.dt.dtype)
    X, Bb, dtb = _mamba2_buffer(rs, slots, cd, H)
    Ch = expand_groups(C[rows].to(cd), H, 2)
    y = _mamba2_outputs(rs.read_ckpt.read(slots, cd), X, Bb, dtb, A.to(cd), Ch, pos)
    xs = x[rows].to(cd)
    y = y + D.to(cd)[:, None] * xs
    if z is not None:
        y = y * F.silu(z[rows].to(cd))
    out[rows] = y.to(x.dtype)
    rs.count(ckpt_read=len(rows) * rs.read_ckpt.bytes_per_slot(),
             buf_read=int(n.sum()) * rs.buffer_row_bytes(), buf_write=len(rows) * T * rs.buffer_row_bytes(),
             io_read=len(rows) * mamba2_io_bytes(x, dt, B, C, z),
             io_write=len(rows) * x[0].numel() * x.element_size())
    return out


def mamba2_commit(rs: Mamba2ReplayState, A, accepted, state_indices=None) -> None:
    """Commit accepted drafts (see commit) and flush where due."""
    commit(rs, accepted, state_indices, lambda r, s: mamba2_flush(r, A, s))
