"""Exact PyTorch recurrences for Mamba-2 and Gated DeltaNet decode: the oracle.

Every op works on a batch whose row b addresses state slot ``state_indices[b]``; a
negative index is a padded row: nothing is read or written for it and its output is 0.
Computation runs in float64 when the inputs are float64 (exact runs), else float32;
stored state is rounded to its storage dtype on write, as a kernel would.

Mamba-2, per head (P = head dim, N = state dim, B/C shared per group):
    dt = softplus(dt_raw + dt_bias),  a = exp(dt * A)
    S_t = a_t S_{t-1} + dt_t x_t B_t^T,   y_t = S_t C_t + D x_t   (then * silu(z) if gated)
GDN, per value head (dk key dim, dv value dim; value head h uses key head h // (Hv/Hk)):
    q, k l2-normalised, q scaled by dk^-0.5;  alpha = exp(g)
    u_t = beta_t (v_t - alpha_t S_{t-1} k_t),  S_t = alpha_t S_{t-1} + u_t k_t^T,  o_t = S_t q_t

ReplaySSM keeps a checkpoint S_c and the buffer of entries since it. With cumulative
log-decays c_e = sum_{j<=e} log a_j, the state after entries 0..e is
    S_e = exp(c_e) S_c + sum_{i<=e} exp(c_e - c_i) (update_i)
and outputs use it only through matrix-vector products, so S_e is never materialised
(the "output-only route"). A flush folds the committed entries into the checkpoint.

Step semantics shared with the Triton kernels (replay_step): the new entry is appended
at the sequence's cursor n; if n + 1 reaches the flush period K the step is a flush step:
the state after all n + 1 entries is formed from the *high* checkpoint, written back
(and the low copy refreshed in dual mode), the output comes from that state, and the
cursor returns to 0. Otherwise the output comes from the read checkpoint (the low copy
in dual mode) and the buffer, and the cursor advances. A dual state whose low copy is
stale (state.LO_STALE, left by the small-batch route: `route=True`) flushes at its next step.

The small-batch route (`route` = its period k >= 1; True = 1): a flush where n + 1 >= k, so
k = 1 flushes at every step. It reads and writes the high checkpoint alone: a step that does not
flush takes its output from the high checkpoint and the buffer and appends; a dual state's low
copy is marked stale by every route step (GDN takes k >= 2; Mamba-2 k = 1).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .state import CURSOR_MASK, LO_STALE, ByteCounter, GDNReplayState, Mamba2ReplayState, compute_dtype

L2_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0


# ----------------------------------------------------------------------------- helpers
def softplus(v: torch.Tensor) -> torch.Tensor:
    """softplus with the usual linear branch above 20 (the kernels use the same rule)."""
    return torch.where(v > SOFTPLUS_THRESHOLD, v, torch.log1p(torch.exp(torch.clamp(v, max=SOFTPLUS_THRESHOLD))))


def l2norm(v: torch.Tensor) -> torch.Tensor:
    """v / sqrt(sum(v^2) + 1e-6) over the last dim."""
    return v * torch.rsqrt((v * v).sum(-1, keepdim=True) + L2_EPS)


def live_rows(state_indices: torch.Tensor | None, batch: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, slots): batch rows that are not padding and the slots they address."""
    if state_indices is None:
        rows = torch.arange(batch, device=device)
        return rows, rows
    idx = state_indices.to(device=device, dtype=torch.long)
    rows = torch.nonzero(idx >= 0).flatten()
    return rows, idx[rows]


def _expand_groups(t: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """Repeat grouped tensors (B/C per group, k/q per key head) up to `heads` along `dim`."""
    return t.repeat_interleave(heads // t.shape[dim], dim=dim)


def _decay_weights(logdecay: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights of buffer entries for targets that include entries 0..end.

    logdecay: [b, L, H]  log of each entry's decay (log a_i or g_i); entries past a
                         sequence's valid range may hold anything
    end:      [b, T]     last entry index included for each target (-1: none)
    returns   total [b, T, H] = exp(c_end)  (decay applied to the checkpoint)
              rel   [b, T, L, H] = exp(c_end - c_i) for i <= end, else 0
    """
    b, L, H = logdecay.shape
    pos = torch.arange(L, device=logdecay.device)
    valid = pos[None, :] <= end.max(dim=1).values[:, None]             # [b, L] entries any target uses
    c = torch.cumsum(torch.where(valid[..., None], logdecay, torch.zeros_like(logdecay)), dim=1)
    c_end = torch.gather(c, 1, end.clamp(min=0)[..., None].expand(b, end.shape[1], H))  # [b, T, H]
    c_end = torch.where(end[..., None] >= 0, c_end, torch.zeros_like(c_end))
    mask = pos[None, None, :] <= end[..., None]                         # [b, T, L]
    diff = c_end[:, :, None, :] - c[:, None, :, :]                      # [b, T, L, H]
    rel = torch.where(mask[..., None], torch.exp(torch.where(mask[..., None], diff, torch.zeros_like(diff))),
                      torch.zeros_like(diff))
    return torch.exp(c_end), rel


# ----------------------------------------------------------------------------- Mamba-2
def mamba2_eager_step(state: torch.Tensor, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None,
                      counter: ByteCounter | None = None) -> torch.Tensor:
    """One eager decode step; reads and writes the state.

    state [S, H, P, N] (updated in place), x [b, H, P], dt [b, H] (raw), A [H], B/C [b, G, N],
    D [H], dt_bias [H], z [b, H, P] or None, state_indices [b] (negative = padding).
    Returns y [b, H, P] in x's dtype.
    """
    cd = compute_dtype(state, x)
    rows, slots = live_rows(state_indices, x.shape[0], x.device)
    H = x.shape[1]
    xs, Bh, Ch = x[rows].to(cd), _expand_groups(B[rows].to(cd), H, 1), _expand_groups(C[rows].to(cd), H, 1)
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
        counter.io_read += n * _mamba2_io_bytes(x, dt, B, C, z)
        counter.io_write += n * x[0].numel() * x.element_size()
        counter.steps += 1
    return out


def _mamba2_io_bytes(x, dt, B, C, z) -> int:
    """Per-sequence input bytes of one Mamba-2 step (x, dt, B, C, z)."""
    n = x[0].numel() * x.element_size() + dt[0].numel() * dt.element_size()
    n += B[0].numel() * B.element_size() + C[0].numel() * C.element_size()
    if z is not None:
        n += z[0].numel() * z.element_size()
    return n


def _mamba2_buffer(rs: Mamba2ReplayState, slots, cd, H):
    X = rs.x[slots].to(cd)                                  # [b, L, H, P]
    Bb = _expand_groups(rs.B[slots].to(cd), H, 2)           # [b, L, H, N]
    dtb = rs.dt[slots].to(cd)                               # [b, L, H]
    return X, Bb, dtb


def _mamba2_outputs(S, X, Bb, dtb, A, Ch, end):
    """y without D/z for targets over entries 0..end: S [b,H,P,N] checkpoint (dequantised),
    X [b,L,H,P], Bb [b,L,H,N], dtb [b,L,H], Ch [b,T,H,N], end [b,T] -> [b,T,H,P]."""
    total, rel = _decay_weights(dtb * A, end)              # [b,T,H], [b,T,L,H]
    w = rel * dtb[:, None]                                  # dt_i * prod_{i<j<=e} a_j
    bc = torch.einsum("blhn,bthn->btlh", Bb, Ch)
    return total[..., None] * torch.einsum("bhpn,bthn->bthp", S, Ch) + torch.einsum("btlh,blhp->bthp", w * bc, X)


def _mamba2_fold(S, X, Bb, dtb, A, end):
    """State after entries 0..end ([b]) from checkpoint S [b,H,P,N]."""
    total, rel = _decay_weights(dtb * A, end[:, None])
    w = (rel * dtb[:, None])[:, 0]                          # [b, L, H]
    return total[:, 0, :, None, None] * S + torch.einsum("blh,blhp,blhn->bhpn", w, X, Bb)


def _mamba2_row_bytes(rs: Mamba2ReplayState) -> int:
    return rs.buffer_row_bytes()


def mamba2_replay_step(rs: Mamba2ReplayState, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None,
                       route: int = 0):
    """One ReplaySSM decode step (output-only route; fused flush when the cursor reaches K or
    the low copy is stale). route: the small-batch route's semantics (_flush_rows).

    Same tensor shapes as mamba2_eager_step. Appends (x, B, softplus(dt + dt_bias)) at each
    sequence's cursor. Returns y [b, H, P].
    """
    cd = compute_dtype(rs.hi.data, x)
    rows, slots = live_rows(state_indices, x.shape[0], x.device)
    out = torch.zeros_like(x)
    if len(rows) == 0:
        return out
    H = x.shape[1]
    n = rs.entries(slots)
    if int(n.max()) >= rs.capacity:
        raise RuntimeError("buffer overflow: cursor reached capacity without a flush")
    xs, Ch = x[rows].to(cd), _expand_groups(C[rows].to(cd), H, 1)
    dtv = softplus(dt[rows].to(cd) + dt_bias.to(cd))
    rs.x[slots, n], rs.B[slots, n], rs.dt[slots, n] = x[rows], B[rows], dtv.to(rs.dt.dtype)
    X, Bb, dtb = _mamba2_buffer(rs, slots, cd, H)
    Acd = A.to(cd)
    flush = _flush_rows(rs, slots, n, route)
    y = torch.empty(len(rows), H, x.shape[2], dtype=cd, device=x.device)
    f, nf = torch.nonzero(flush).flatten(), torch.nonzero(~flush).flatten()
    if len(nf):
        S = (rs.hi if route else rs.read_ckpt).read(slots[nf], cd)
        y[nf] = _mamba2_outputs(S, X[nf], Bb[nf], dtb[nf], Acd, Ch[nf, None], n[nf, None])[:, 0]
        _advance(rs, slots[nf], n[nf], route)
    if len(f):
        S = _mamba2_fold(rs.hi.read(slots[f], cd), X[f], Bb[f], dtb[f], Acd, n[f])
        y[f] = torch.einsum("bhpn,bhn->bhp", S, Ch[f])
        _write_flushed(rs, slots[f], S, route)
    y = y + D.to(cd)[:, None] * xs
    if z is not None:
        y = y * F.silu(z[rows].to(cd))
    out[rows] = y.to(x.dtype)
    count_step(rs, n, flush, route, _mamba2_io_bytes(x, dt, B, C, z), x[0].numel() * x.element_size())
    return out


def count_step(rs, n, flush, route: int, io_read: int, io_write: int) -> None:
    """Bytes of one replay step over live rows with entries n [b] and flush decisions
    flush [b] (_flush_rows); io_read / io_write: input / output bytes per row; route: the
    small-batch route's period (0: not routed; its steps read the high copy)."""
    nflush = int(flush.sum())
    nn = len(n) - nflush
    rb = rs.buffer_row_bytes()
    read = rs.hi if route else rs.read_ckpt
    rs.count(ckpt_read=nn * read.bytes_per_slot() + nflush * rs.hi.bytes_per_slot(),
             buf_read=int(n.sum()) * rb, buf_write=nn * rb, io_read=len(n) * io_read, io_write=len(n) * io_write)
    _count_flush_write(rs, nflush, route)


def _flush_rows(rs, slots, n, route: int) -> torch.Tensor:
    """[b] bool: the step flushes the sequence. Its cursor reaches K, or a stale low copy
    (LO_STALE) would be read: the step folds and refreshes it instead. route (the small-batch
    route's period k, which the Triton kernels take by batch size): the cursor reaches
    min(k, K) (k = 1: every sequence flushes); the low copy is not read."""
    if route:
        return n + 1 >= min(int(route), rs.flush_period)
    return (n + 1 >= rs.flush_period) | rs.lo_stale(slots)


def _advance(rs, slots, n, route: int) -> None:
    """Cursors of sequences that appended without flushing: n + 1; the small-batch route
    (route >= 1) marks a dual state's low copy stale (module docstring)."""
    c = (n + 1).to(torch.int32)
    if route and rs.mode == "dual":
        c = c | LO_STALE
        rs.routed = True
    rs.cursor[slots] = c


def _write_flushed(rs, slots, S, route: int = 0) -> None:
    """Write a folded state to the high checkpoint, refresh the low copy, reset cursors.
    route (dual): the high copy only; the low copy is left stale (the cursor word LO_STALE)."""
    rs.hi.write(slots, S)
    if route and rs.mode == "dual":
        rs.cursor[slots] = LO_STALE
        rs.routed = True
        return
    if rs.lo is not None:
        rs.lo.write(slots, S)
    rs.cursor[slots] = 0


def _count_flush_write(rs, nflush: int, route: int = 0) -> None:
    per = rs.hi.bytes_per_slot() if route and rs.mode == "dual" else rs.state_bytes_per_slot()
    rs.count(ckpt_write=nflush * per)
    if rs.counter is not None:
        rs.counter.steps += 1


def _refresh_stale(rs, slots, cd) -> None:
    """Write the low copy of `slots` whose copy is stale (LO_STALE) from the high checkpoint,
    before a verify reads it, and clear the bit."""
    st = slots[rs.lo_stale(slots)]
    if len(st):
        rs.lo.write(st, rs.hi.read(st, cd))
        rs.cursor[st] = rs.cursor[st] & CURSOR_MASK
    count_refresh(rs, len(st))


def count_refresh(rs, nstale: int) -> None:
    """Bytes of refreshing `nstale` stale low copies (read high, write low)."""
    if nstale:
        rs.count(ckpt_read=nstale * rs.hi.bytes_per_slot(), ckpt_write=nstale * rs.lo.bytes_per_slot())


def mamba2_flush(rs: Mamba2ReplayState, A, slots: torch.Tensor | None = None) -> None:
    """Fold every committed entry of `slots` (default: all slots with entries, or with a
    stale low copy, which is refreshed) into the checkpoint."""
    slots = _flush_slots(rs, slots)
    if len(slots) == 0:
        return
    cd = compute_dtype(rs.hi.data, rs.x)
    X, Bb, dtb = _mamba2_buffer(rs, slots, cd, rs.x.shape[2])
    n = rs.entries(slots)
    S = _mamba2_fold(rs.hi.read(slots, cd), X, Bb, dtb, A.to(cd), n - 1)
    rs.count(ckpt_read=len(slots) * rs.hi.bytes_per_slot(), buf_read=int(n.sum()) * rs.buffer_row_bytes(),
             ckpt_write=len(slots) * rs.state_bytes_per_slot())
    _write_flushed(rs, slots, S)


def _flush_slots(rs, slots):
    """The slots a flush folds: entries pending, or a stale low copy to refresh."""
    if slots is None:
        slots = torch.arange(rs.cursor.shape[0], device=rs.cursor.device)
    slots = slots.to(torch.long)
    return slots[rs.cursor[slots] != 0]


def mamba2_verify(rs: Mamba2ReplayState, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None):
    """Speculative verification of T drafts: all T outputs from checkpoint + buffer.

    x [b, T, H, P], dt [b, T, H], B/C [b, T, G, N], z [b, T, H, P] or None.
    Drafts are written at buffer positions cursor..cursor+T-1; the cursor does not move
    (mamba2_commit moves it). No per-draft state. Returns y [b, T, H, P].
    """
    cd = compute_dtype(rs.hi.data, x)
    rows, slots = live_rows(state_indices, x.shape[0], x.device)
    out = torch.zeros_like(x)
    if len(rows) == 0:
        return out
    T, H = x.shape[1], x.shape[2]
    _refresh_stale(rs, slots, cd)
    n = rs.entries(slots)
    if int(n.max()) + T > rs.capacity:
        raise RuntimeError(f"draft window of {T} does not fit: cursor {int(n.max())}, capacity {rs.capacity}")
    pos = n[:, None] + torch.arange(T, device=x.device)     # [b, T]
    dtv = softplus(dt[rows].to(cd) + dt_bias.to(cd))        # [b, T, H]
    rs.x[slots[:, None], pos], rs.B[slots[:, None], pos] = x[rows], B[rows]
    rs.dt[slots[:, None], pos] = dtv.to(rs.dt.dtype)
    X, Bb, dtb = _mamba2_buffer(rs, slots, cd, H)
    Ch = _expand_groups(C[rows].to(cd), H, 2)
    y = _mamba2_outputs(rs.read_ckpt.read(slots, cd), X, Bb, dtb, A.to(cd), Ch, pos)
    xs = x[rows].to(cd)
    y = y + D.to(cd)[:, None] * xs
    if z is not None:
        y = y * F.silu(z[rows].to(cd))
    out[rows] = y.to(x.dtype)
    rs.count(ckpt_read=len(rows) * rs.read_ckpt.bytes_per_slot(),
             buf_read=int(n.sum()) * rs.buffer_row_bytes(), buf_write=len(rows) * T * rs.buffer_row_bytes(),
             io_read=len(rows) * _mamba2_io_bytes(x, dt, B, C, z),
             io_write=len(rows) * x[0].numel() * x.element_size())
    return out


def commit(rs, accepted: torch.Tensor, state_indices=None, flush=None) -> None:
    """Accept `accepted[b]` (0..T) drafts per row: a cursor move; then flush sequences whose
    cursor reached the flush period. `flush(rs, slots)` folds entries (family-specific)."""
    rows, slots = live_rows(state_indices, accepted.shape[0], accepted.device)
    rs.cursor[slots] = (rs.entries(slots) + accepted[rows].long()).to(torch.int32)
    due = slots[rs.cursor[slots] >= rs.flush_period]
    if len(due):
        flush(rs, due)


def mamba2_commit(rs: Mamba2ReplayState, A, accepted, state_indices=None) -> None:
    """Commit accepted drafts (see commit) and flush where due."""
    commit(rs, accepted, state_indices, lambda r, s: mamba2_flush(r, A, s))


# ----------------------------------------------------------------------------- GDN
def _gdn_prep(q, k, cd, Hv, scale):
    """Normalise and expand q/k [b, (T,) Hk, dk] -> [b, (T,) Hv, dk] (q also scaled)."""
    kn = _expand_groups(l2norm(k.to(cd)), Hv, k.dim() - 2)
    qn = _expand_groups(l2norm(q.to(cd)), Hv, q.dim() - 2) * scale
    return qn, kn


def gdn_scale(head_k_dim: int) -> float:
    return head_k_dim ** -0.5


def gdn_eager_step(state: torch.Tensor, q, k, v, g, beta, state_indices=None, scale=None,
                   counter: ByteCounter | None = None) -> torch.Tensor:
    """One eager GDN decode step; reads and writes the state.

    state [S, Hv, dv, dk] (in place), q/k [b, Hk, dk], v [b, Hv, dv], g [b, Hv] (log alpha),
    beta [b, Hv]. Returns o [b, Hv, dv] in v's dtype.
    """
    cd = compute_dtype(state, v)
    rows, slots = live_rows(state_indices, v.shape[0], v.device)
    Hv, dk = v.shape[1], q.shape[2]
    scale = gdn_scale(dk) if scale is None else scale
    qn, kn = _gdn_prep(q[rows], k[rows], cd, Hv, scale)
    alpha, b_ = torch.exp(g[rows].to(cd)), beta[rows].to(cd)
    S = state[slots].to(cd)
    u = b_[..., None] * (v[rows].to(cd) - alpha[..., None] * torch.einsum("bhvk,bhk->bhv", S, kn))
    S = alpha[..., None, None] * S + u[..., None] * kn[:, :, None, :]
    o = torch.einsum("bhvk,bhk->bhv", S, qn)
    state[slots] = S.to(state.dtype)
    out = torch.zeros_like(v)
    out[rows] = o.to(v.dtype)
    if counter is not None:
        sb = state[0].numel() * state.element_size()
        counter.ckpt_read += len(rows) * sb
        counter.ckpt_write += len(rows) * sb
        counter.io_read += len(rows) * _gdn_io_bytes(q, k, v, g, beta)
        counter.io_write += len(rows) * v[0].numel() * v.element_size()
        counter.steps += 1
    return out


def _gdn_io_bytes(q, k, v, g, beta) -> int:
    return sum(t[0].numel() * t.element_size() for t in (q, k, v, g, beta))


def _gdn_apply(S, U, Kn, G, vec, end):
    """(S_e vec) for targets over entries 0..end, without forming S_e.

    S [b,Hv,dv,dk] checkpoint (dequantised), U [b,L,Hv,dv], Kn [b,L,Hv,dk] (normalised),
    G [b,L,Hv] log decays, vec [b,T,Hv,dk], end [b,T] -> [b,T,Hv,dv].
    """
    total, rel = _decay_weights(G, end)
    kv = torch.einsum("blhk,bthk->btlh", Kn, vec)
    return total[..., None] * torch.einsum("bhvk,bthk->bthv", S, vec) + torch.einsum("btlh,blhv->bthv", rel * kv, U)


def _gdn_buffer(rs: GDNReplayState, slots, cd):
    Hv = rs.u.shape[2]
    return rs.u[slots].to(cd), _expand_groups(l2norm(rs.k[slots].to(cd)), Hv, 2), rs.g[slots].to(cd)


def _gdn_fold_stored(S, U, Kn, G, end):
    """State after entries 0..end ([b]) by folding the stored u."""
    total, rel = _decay_weights(G, end[:, None])
    return total[:, 0, :, None, None] * S + torch.einsum("blh,blhv,blhk->bhvk", rel[:, 0], U, Kn)


def _gdn_fold_recompute(S, V, Kn, G, Beta, end, u_out=None):
    """State after entries 0..end ([b]) by eager stepping from the high checkpoint S,
    recomputing every u against it (dual mode: no low-precision u enters the state).
    u_out [b, L, Hv, dv]: receives the recomputed u of entries 0..end (others untouched)."""
    S = S.clone()
    for i in range(int(end.max()) + 1):
        live = (end >= i)[:, None, None, None]
        alpha = torch.exp(G[:, i])[..., None]
        u = Beta[:, i, :, None] * (V[:, i] - alpha * torch.einsum("bhvk,bhk->bhv", S, Kn[:, i]))
        if u_out is not None:
            u_out[:, i] = torch.where(live[..., 0], u.to(u_out.dtype), u_out[:, i])
        S = torch.where(live, alpha[..., None] * S + u[..., None] * Kn[:, i, :, None, :], S)
    return S


def _gdn_fold(rs: GDNReplayState, slots, cd, end):
    """Fold entries 0..end of `slots` into the high checkpoint (not written)."""
    U, Kn, G = _gdn_buffer(rs, slots, cd)
    S = rs.hi.read(slots, cd)
    if rs.mode == "dual":
        return _gdn_fold_recompute(S, rs.v[slots].to(cd), Kn, G, rs.beta[slots].to(cd), end)
    return _gdn_fold_stored(S, U, Kn, G, end)


def gdn_rederive_u(rs: GDNReplayState) -> None:
    """Dual mode: rewrite every slot's stored u rows 0..L-1 as appends on the high checkpoint
    would have stored them, u_i = beta_i (v_i - alpha_i S_{i-1} k_i) with S stepped eagerly from
    the checkpoint (up to the low copy's rounding, which real appends see). For states whose
    buffers were filled at random (benchmarks, checks): there the stored u (read by buffered
    steps) and the v, beta a dual flush recomputes u from would otherwise disagree."""
    if rs.mode != "dual":
        raise ValueError(f"gdn_rederive_u: mode {rs.mode!r} stores no v / beta to derive u from; allowed: dual")
    slots = torch.arange(rs.cursor.shape[0], device=rs.cursor.device)
    cd = compute_dtype(rs.hi.data, rs.v)
    _, Kn, G = _gdn_buffer(rs, slots, cd)
    every_entry = torch.full_like(slots, rs.capacity - 1)
    _gdn_fold_recompute(rs.hi.read(slots, cd), rs.v[slots].to(cd), Kn, G, rs.beta[slots].to(cd), every_entry,
                        u_out=rs.u)


def gdn_replay_step(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, scale=None, route: int = 0):
    """One ReplaySSM GDN decode step (fused flush when the cursor reaches K or the low copy is
    stale). route: the small-batch route's period k (module docstring; _flush_rows).

    Shapes as gdn_eager_step. Computes S_{t-1} k_t and S_t q_t from checkpoint + buffer,
    u_t = beta (v - alpha S_{t-1} k_t), appends (u_t, k_t, g_t [, v_t, beta_t]). Returns o [b, Hv, dv].
    """
    cd = compute_dtype(rs.hi.data, v)
    rows, slots = live_rows(state_indices, v.shape[0], v.device)
    out = torch.zeros_like(v)
    if len(rows) == 0:
        return out
    Hv, dk = v.shape[1], q.shape[2]
    scale = gdn_scale(dk) if scale is None else scale
    n = rs.entries(slots)
    if int(n.max()) >= rs.capacity:
        raise RuntimeError("buffer overflow: cursor reached capacity without a flush")
    qn, kn = _gdn_prep(q[rows], k[rows], cd, Hv, scale)
    gs, bs, vs = g[rows].to(cd), beta[rows].to(cd), v[rows].to(cd)
    rs.k[slots, n], rs.g[slots, n] = k[rows], g[rows].to(rs.g.dtype)
    if rs.v is not None:
        rs.v[slots, n], rs.beta[slots, n] = v[rows], beta[rows].to(rs.beta.dtype)
    flush = _flush_rows(rs, slots, n, route)
    o = torch.empty(len(rows), Hv, v.shape[2], dtype=cd, device=v.device)
    f, nf = torch.nonzero(flush).flatten(), torch.nonzero(~flush).flatten()
    if len(nf) and route:
        # the small-batch route's step without a flush: the state after entries 0..n-1 formed
        # from the high checkpoint (dual: u recomputed against it, as a flush does), this step
        # taken on it, its u appended
        S = _gdn_fold(rs, slots[nf], cd, n[nf] - 1)
        a = torch.exp(gs[nf])[..., None]
        u = bs[nf, :, None] * (vs[nf] - a * torch.einsum("bhvk,bhk->bhv", S, kn[nf]))
        rs.u[slots[nf], n[nf]] = u.to(rs.u.dtype)
        S = a[..., None] * S + u[..., None] * kn[nf, :, None, :]
        o[nf] = torch.einsum("bhvk,bhk->bhv", S, qn[nf])
        _advance(rs, slots[nf], n[nf], route)
    elif len(nf):
        U, Kn, G = _gdn_buffer(rs, slots[nf], cd)
        S = rs.read_ckpt.read(slots[nf], cd)
        sk = _gdn_apply(S, U, Kn, G, kn[nf, None], n[nf, None] - 1)[:, 0]
        u = bs[nf, :, None] * (vs[nf] - torch.exp(gs[nf])[..., None] * sk)
        rs.u[slots[nf], n[nf]] = u.to(rs.u.dtype)
        U = rs.u[slots[nf]].to(cd)
        o[nf] = _gdn_apply(S, U, Kn, G, qn[nf, None], n[nf, None])[:, 0]
        _advance(rs, slots[nf], n[nf], route)
    if len(f):
        if rs.mode != "dual":  # the new entry's u is needed to fold the stored u's
            U, Kn, G = _gdn_buffer(rs, slots[f], cd)
            S = rs.hi.read(slots[f], cd)
            sk = _gdn_apply(S, U, Kn, G, kn[f, None], n[f, None] - 1)[:, 0]
            rs.u[slots[f], n[f]] = (bs[f, :, None] * (vs[f] - torch.exp(gs[f])[..., None] * sk)).to(rs.u.dtype)
        S = _gdn_fold(rs, slots[f], cd, n[f])
        o[f] = torch.einsum("bhvk,bhk->bhv", S, qn[f])
        _write_flushed(rs, slots[f], S, route)
    out[rows] = o.to(v.dtype)
    count_step(rs, n, flush, route, _gdn_io_bytes(q, k, v, g, beta), v[0].numel() * v.element_size())
    return out


def gdn_flush(rs: GDNReplayState, slots: torch.Tensor | None = None) -> None:
    """Fold every committed entry of `slots` (default: all slots with entries, or with a
    stale low copy, which is refreshed) into the checkpoint."""
    slots = _flush_slots(rs, slots)
    if len(slots) == 0:
        return
    cd = compute_dtype(rs.hi.data, rs.u)
    n = rs.entries(slots)
    S = _gdn_fold(rs, slots, cd, n - 1)
    rs.count(ckpt_read=len(slots) * rs.hi.bytes_per_slot(), buf_read=int(n.sum()) * rs.buffer_row_bytes(),
             ckpt_write=len(slots) * rs.state_bytes_per_slot())
    _write_flushed(rs, slots, S)


def gdn_verify(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, scale=None):
    """Speculative verification of T drafts from checkpoint + buffer, no per-draft state.

    q/k [b, T, Hk, dk], v [b, T, Hv, dv], g/beta [b, T, Hv]. The drafts' u solve the
    lower-triangular system u_j = beta_j (v_j - alpha_j S_{n+j-1} k_j) by forward
    substitution; drafts are written at cursor..cursor+T-1; the cursor does not move.
    Returns o [b, T, Hv, dv].
    """
    cd = compute_dtype(rs.hi.data, v)
    rows, slots = live_rows(state_indices, v.shape[0], v.device)
    out = torch.zeros_like(v)
    if len(rows) == 0:
        return out
    T, Hv, dk = v.shape[1], v.shape[2], q.shape[3]
    scale = gdn_scale(dk) if scale is None else scale
    _refresh_stale(rs, slots, cd)
    n = rs.entries(slots)
    if int(n.max()) + T > rs.capacity:
        raise RuntimeError(f"draft window of {T} does not fit: cursor {int(n.max())}, capacity {rs.capacity}")
    pos = n[:, None] + torch.arange(T, device=v.device)
    qn, kn = _gdn_prep(q[rows], k[rows], cd, Hv, scale)      # [b, T, Hv, dk]
    gs, bs, vs = g[rows].to(cd), beta[rows].to(cd), v[rows].to(cd)
    rs.k[slots[:, None], pos], rs.g[slots[:, None], pos] = k[rows], g[rows].to(rs.g.dtype)
    if rs.v is not None:
        rs.v[slots[:, None], pos], rs.beta[slots[:, None], pos] = v[rows], beta[rows].to(rs.beta.dtype)
    S = rs.read_ckpt.read(slots, cd)
    _, Kn, G = _gdn_buffer(rs, slots, cd)
    for j in range(T):  # forward substitution: draft j needs the u of drafts < j
        U = rs.u[slots].to(cd)
        sk = _gdn_apply(S, U, Kn, G, kn[:, j:j + 1], pos[:, j:j + 1] - 1)[:, 0]
        u = bs[:, j, :, None] * (vs[:, j] - torch.exp(gs[:, j])[..., None] * sk)
        rs.u[slots, pos[:, j]] = u.to(rs.u.dtype)
    o = _gdn_apply(S, rs.u[slots].to(cd), Kn, G, qn, pos)
    out[rows] = o.to(v.dtype)
    rb = rs.buffer_row_bytes()
    rs.count(ckpt_read=len(rows) * rs.read_ckpt.bytes_per_slot(), buf_read=int(n.sum()) * rb,
             buf_write=len(rows) * T * rb, io_read=len(rows) * _gdn_io_bytes(q, k, v, g, beta),
             io_write=len(rows) * v[0].numel() * v.element_size())
    return out


def gdn_commit(rs: GDNReplayState, accepted, state_indices=None) -> None:
    """Commit accepted drafts (a cursor move) and flush where due."""
    commit(rs, accepted, state_indices, gdn_flush)


# ----------------------------------------------------------------------------- per-draft baseline
# vLLM's speculative path (0.26.0, mamba_cache_mode 'none'; see replaybench/runners/peers.py):
# verification steps the recurrence eagerly over the T tokens of a round and stores the FULL
# state after every token, each into its own state slot; the next round starts from the slot
# of the last accepted token (vLLM selects it with num_accepted_tokens).
#
# Here each request owns 1 + T slots, one row of a slot table [b, 1 + T] used as a ring:
# start[b] (0..T) is the column holding the state to start from (the accepted slot; vLLM's
# num_accepted_tokens - 1), and the state after token t (t = 0..T-1) is written to column
# (start + 1 + t) mod (1 + T). The start slot is read first and never written in the round,
# so accepting m = 0..T tokens (m = 0 included, which vLLM's 1 + S slots for 1 + S tokens
# cannot express) is one move, perdraft_advance: start <- (start + m) mod (1 + T). The
# traffic is vLLM's: one state read and T state writes per request and round.
# A row whose start slot is negative is padding (output 0, nothing read or written); a
# negative destination slot is skipped. Live rows must own distinct slots.
def perdraft_columns(start: torch.Tensor, T: int) -> torch.Tensor:
    """[b, T] slot-table columns the states after tokens 0..T-1 go to: (start + 1 + t) mod (1 + T)."""
    return (start.to(torch.long)[:, None] + 1 + torch.arange(T, device=start.device)) % (T + 1)


def perdraft_advance(start: torch.Tensor, accepted: torch.Tensor, T: int) -> torch.Tensor:
    """Commit for the per-draft baseline: start <- (start + accepted) mod (1 + T), in place."""
    start.copy_(((start.to(torch.long) + accepted.to(device=start.device, dtype=torch.long)) % (T + 1))
                .to(start.dtype))
    return start


def _perdraft_rows(slot_table: torch.Tensor, start: torch.Tensor):
    """(live rows, their start slots, destination slots [rows, T]) of a per-draft round."""
    T = slot_table.shape[1] - 1
    tbl = slot_table.to(torch.long)
    st = start.to(device=tbl.device, dtype=torch.long)
    if st.numel() and (int(st.min()) < 0 or int(st.max()) > T):
        raise ValueError(f"start columns must be in 0..{T}")
    src = tbl.gather(1, st[:, None])[:, 0]
    rows = torch.nonzero(src >= 0).flatten()
    dst = tbl.gather(1, perdraft_columns(st, T))
    return rows, src[rows], dst[rows]


def _count_perdraft(counter, states, n_rows, n_writes, io_read, io_write) -> None:
    if counter is None:
        return
    sb = states[0].numel() * states.element_size()
    counter.ckpt_read += n_rows * sb
    counter.ckpt_write += n_writes * sb
    counter.io_read += io_read
    counter.io_write += io_write
    counter.steps += 1


def mamba2_verify_perdraft(states: torch.Tensor, slot_table: torch.Tensor, start: torch.Tensor, x, dt, A, B, C, D,
                           dt_bias, z=None, counter: ByteCounter | None = None) -> torch.Tensor:
    """Per-draft verification of T tokens (vLLM's speculative path), Mamba-2.

    states [S, H, P, N] (written in place), slot_table [b, 1 + T] int, start [b] int (column
    of the state to start from), x [b, T, H, P], dt [b, T, H] (raw), B/C [b, T, G, N],
    z [b, T, H, P] or None; A / D / dt_bias [H]. Steps eagerly over the T tokens from the start
    state (kept in compute precision across tokens, as a kernel keeps it in registers) and
    stores the state after token t, rounded to the storage dtype, in slot
    slot_table[b, (start + 1 + t) mod (1 + T)]. Returns y [b, T, H, P] in x's dtype.
    """
    cd = compute_dtype(states, x)
    T, H = x.shape[1], x.shape[2]
    if slot_table.shape != (x.shape[0], T + 1):
        raise ValueError(f"slot_table must be [batch, 1 + T] = [{x.shape[0]}, {T + 1}], got {tuple(slot_table.shape)}")
    rows, src, dst = _perdraft_rows(slot_table, start)
    out = torch.zeros_like(x)
    writes = 0
    if len(rows):
        S = states[src].to(cd)
        Acd, Dcd, dtb = A.to(cd), D.to(cd), dt_bias.to(cd)
        for t in range(T):
            xs = x[rows, t].to(cd)
            Bh, Ch = _expand_groups(B[rows, t].to(cd), H, 1), _expand_groups(C[rows, t].to(cd), H, 1)
            dtv = softplus(dt[rows, t].to(cd) + dtb)
            a = torch.exp(dtv * Acd)
            S = a[..., None, None] * S + (dtv[..., None] * xs)[..., None] * Bh[:, :, None, :]
            y = torch.einsum("bhpn,bhn->bhp", S, Ch) + Dcd[:, None] * xs
            if z is not None:
                y = y * F.silu(z[rows, t].to(cd))
            out[rows, t] = y.to(x.dtype)
            ok = dst[:, t] >= 0
            states[dst[ok, t]] = S[ok].to(states.dtype)
            writes += int(ok.sum())
    _count_perdraft(counter, states, len(rows), writes, len(rows) * _mamba2_io_bytes(x, dt, B, C, z),
                    len(rows) * x[0].numel() * x.element_size())
    return out


def gdn_verify_perdraft(states: torch.Tensor, slot_table: torch.Tensor, start: torch.Tensor, q, k, v, g, beta,
                        scale=None, counter: ByteCounter | None = None) -> torch.Tensor:
    """Per-draft verification of T tokens (vLLM's speculative path), GDN.

    states [S, Hv, dv, dk] (written in place), slot_table [b, 1 + T], start [b] (as
    mamba2_verify_perdraft), q/k [b, T, Hk, dk], v [b, T, Hv, dv], g/beta [b, T, Hv].
    Eager steps u = beta (v - alpha S k), S = alpha S + u k^T, o = S q from the start state;
    the state after token t goes to slot_table[b, (start + 1 + t) mod (1 + T)].
    Returns o [b, T, Hv, dv] in v's dtype.
    """
    cd = compute_dtype(states, v)
    T, Hv, dk = v.shape[1], v.shape[2], q.shape[3]
    if slot_table.shape != (v.shape[0], T + 1):
        raise ValueError(f"slot_table must be [batch, 1 + T] = [{v.shape[0]}, {T + 1}], got {tuple(slot_table.shape)}")
    scale = gdn_scale(dk) if scale is None else scale
    rows, src, dst = _perdraft_rows(slot_table, start)
    out = torch.zeros_like(v)
    writes = 0
    if len(rows):
        S = states[src].to(cd)
        qn, kn = _gdn_prep(q[rows], k[rows], cd, Hv, scale)      # [b, T, Hv, dk]
        for t in range(T):
            alpha, b_ = torch.exp(g[rows, t].to(cd)), beta[rows, t].to(cd)
            u = b_[..., None] * (v[rows, t].to(cd) - alpha[..., None] * torch.einsum("bhvk,bhk->bhv", S, kn[:, t]))
            S = alpha[..., None, None] * S + u[..., None] * kn[:, t, :, None, :]
            out[rows, t] = torch.einsum("bhvk,bhk->bhv", S, qn[:, t]).to(v.dtype)
            ok = dst[:, t] >= 0
            states[dst[ok, t]] = S[ok].to(states.dtype)
            writes += int(ok.sum())
    _count_perdraft(counter, states, len(rows), writes, len(rows) * _gdn_io_bytes(q, k, v, g, beta),
                    len(rows) * v[0].numel() * v.element_size())
    return out
