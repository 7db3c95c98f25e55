"""Gated DeltaNet oracle: exact PyTorch recurrences of the GDN ops (eager step, ReplaySSM replay
step, flush, verify, commit); the semantics the kernels are tested against (replayssm.reference
documents them and re-exports these functions)."""
from __future__ import annotations

import torch

from ..accounting import count_step, flush_rows, flush_slots, gdn_io_bytes, live_rows
from ..common.reference import (advance, commit, decay_weights, expand_groups, export_state, l2norm, refresh_stale,
                                write_flushed)
from ..state import ByteCounter, GDNReplayState, compute_dtype


def gdn_prep(q, k, cd, Hv, scale):
    """Normalise and expand q/k [b, (T,) Hk, dk] -> [b, (T,) Hv, dk] (q also scaled)."""
    kn = expand_groups(l2norm(k.to(cd)), Hv, k.dim() - 2)
    qn = expand_groups(l2norm(q.to(cd)), Hv, q.dim() - 2) * scale
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
    rows, slots = live_rows(state_indices, v.shape[0], v.device, state.shape[0])
    Hv, dk = v.shape[1], q.shape[2]
    scale = gdn_scale(dk) if scale is None else scale
    qn, kn = gdn_prep(q[rows], k[rows], cd, Hv, scale)
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
        counter.io_read += len(rows) * gdn_io_bytes(q, k, v, g, beta)
        counter.io_write += len(rows) * v[0].numel() * v.element_size()
        counter.steps += 1
    return out


def _gdn_apply(S, U, Kn, G, vec, end):
    """(S_e vec) for targets over entries 0..end, without forming S_e.

    S [b,Hv,dv,dk] checkpoint (dequantised), U [b,L,Hv,dv], Kn [b,L,Hv,dk] (normalised),
    G [b,L,Hv] log decays, vec [b,T,Hv,dk], end [b,T] -> [b,T,Hv,dv].
    """
    total, rel = decay_weights(G, end)
    kv = torch.einsum("blhk,bthk->btlh", Kn, vec)
    return total[..., None] * torch.einsum("bhvk,bthk->bthv", S, vec) + torch.einsum("btlh,blhv->bthv", rel * kv, U)


def _gdn_buffer(rs: GDNReplayState, slots, cd):
    Hv = rs.u.shape[2]
    return rs.u[slots].to(cd), expand_groups(l2norm(rs.k[slots].to(cd)), Hv, 2), rs.g[slots].to(cd)


def _gdn_fold_stored(S, U, Kn, G, end):
    """State after entries 0..end ([b]) by folding the stored u."""
    total, rel = decay_weights(G, end[:, None])
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
    stale). route: the small-batch route's period k (module docstring; flush_rows).

    Shapes as gdn_eager_step. Computes S_{t-1} k_t and S_t q_t from checkpoint + buffer,
    u_t = beta (v - alpha S_{t-1} k_t), appends (u_t, k_t, g_t [, v_t, beta_t]). Returns o [b, Hv, dv].
    """
    cd = compute_dtype(rs.hi.data, v)
    rows, slots = live_rows(state_indices, v.shape[0], v.device, rs.cursor.shape[0])
    out = torch.zeros_like(v)
    if len(rows) == 0:
        return out
    Hv, dk = v.shape[1], q.shape[2]
    scale = gdn_scale(dk) if scale is None else scale
    n = rs.entries(slots)
    if int(n.max()) >= rs.capacity:
        raise RuntimeError("buffer overflow: cursor reached capacity without a flush")
    qn, kn = gdn_prep(q[rows], k[rows], cd, Hv, scale)
    gs, bs, vs = g[rows].to(cd), beta[rows].to(cd), v[rows].to(cd)
    rs.k[slots, n], rs.g[slots, n] = k[rows].to(rs.k.dtype), g[rows].to(rs.g.dtype)
    if rs.v is not None:
        rs.v[slots, n], rs.beta[slots, n] = v[rows].to(rs.v.dtype), beta[rows].to(rs.beta.dtype)
    flush = flush_rows(rs, slots, n, route)
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
        advance(rs, slots[nf], n[nf], route)
    elif len(nf):
        U, Kn, G = _gdn_buffer(rs, slots[nf], cd)
        S = rs.read_ckpt.read(slots[nf], cd)
        sk = _gdn_apply(S, U, Kn, G, kn[nf, None], n[nf, None] - 1)[:, 0]
        u = bs[nf, :, None] * (vs[nf] - torch.exp(gs[nf])[..., None] * sk)
        rs.u[slots[nf], n[nf]] = u.to(rs.u.dtype)
        U = rs.u[slots[nf]].to(cd)
        o[nf] = _gdn_apply(S, U, Kn, G, qn[nf, None], n[nf, None])[:, 0]
        advance(rs, slots[nf], n[nf], route)
    if len(f):
        if rs.mode != "dual":  # the new entry's u is needed to fold the stored u's
            U, Kn, G = _gdn_buffer(rs, slots[f], cd)
            S = rs.hi.read(slots[f], cd)
            sk = _gdn_apply(S, U, Kn, G, kn[f, None], n[f, None] - 1)[:, 0]
            rs.u[slots[f], n[f]] = (bs[f, :, None] * (vs[f] - torch.exp(gs[f])[..., None] * sk)).to(rs.u.dtype)
        S = _gdn_fold(rs, slots[f], cd, n[f])
        o[f] = torch.einsum("bhvk,bhk->bhv", S, qn[f])
        write_flushed(rs, slots[f], S, route)
    out[rows] = o.to(v.dtype)
    count_step(rs, n, flush, route, gdn_io_bytes(q, k, v, g, beta), v[0].numel() * v.element_size())
    return out


def gdn_flush(rs: GDNReplayState, slots: torch.Tensor | None = None) -> None:
    """Fold every committed entry of `slots` (default: all slots with entries, or with a
    stale low copy, which is refreshed) into the checkpoint."""
    slots = flush_slots(rs, slots)
    if len(slots) == 0:
        return
    cd = compute_dtype(rs.hi.data, rs.u)
    n = rs.entries(slots)
    S = _gdn_fold(rs, slots, cd, n - 1)
    rs.count(ckpt_read=len(slots) * rs.hi.bytes_per_slot(), buf_read=int(n.sum()) * rs.buffer_row_bytes(),
             ckpt_write=len(slots) * rs.state_bytes_per_slot())
    write_flushed(rs, slots, S)


def gdn_export_state(rs: GDNReplayState, slots=None) -> torch.Tensor:
    """The state after every committed entry of `slots` (None: all): the high checkpoint with
    the buffer folded in ([b, Hv, dv, dk], fp32 / fp64; 0 for slots outside the pool). Writes
    nothing."""
    return export_state(rs, slots, _gdn_fold)


def gdn_verify(rs: GDNReplayState, q, k, v, g, beta, state_indices=None, scale=None):
    """Speculative verification of T drafts from checkpoint + buffer, no per-draft state.

    q/k [b, T, Hk, dk], v [b, T, Hv, dv], g/beta [b, T, Hv]. The drafts' u solve the
    lower-triangular system u_j = beta_j (v_j - alpha_j S_{n+j-1} k_j) by forward
    substitution; drafts are written at cursor..cursor+T-1; the cursor does not move.
    Returns o [b, T, Hv, dv].
    """
    cd = compute_dtype(rs.hi.data, v)
    rows, slots = live_rows(state_indices, v.shape[0], v.device, rs.cursor.shape[0])
    out = torch.zeros_like(v)
    if len(rows) == 0:
        return out
    T, Hv, dk = v.shape[1], v.shape[2], q.shape[3]
    scale = gdn_scale(dk) if scale is None else scale
    refresh_stale(rs, slots, cd)
    n = rs.entries(slots)
    if int(n.max()) + T > rs.capacity:
        raise RuntimeError(f"draft window of {T} does not fit: cursor {int(n.max())}, capacity {rs.capacity}")
    pos = n[:, None] + torch.arange(T, device=v.device)
    qn, kn = gdn_prep(q[rows], k[rows], cd, Hv, scale)      # [b, T, Hv, dk]
    gs, bs, vs = g[rows].to(cd), beta[rows].to(cd), v[rows].to(cd)
    rs.k[slots[:, None], pos], rs.g[slots[:, None], pos] = k[rows].to(rs.k.dtype), g[rows].to(rs.g.dtype)
    if rs.v is not None:
        rs.v[slots[:, None], pos], rs.beta[slots[:, None], pos] = v[rows].to(rs.v.dtype), beta[rows].to(rs.beta.dtype)
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
             buf_write=len(rows) * T * rb, io_read=len(rows) * gdn_io_bytes(q, k, v, g, beta),
             io_write=len(rows) * v[0].numel() * v.element_size())
    return out


def gdn_commit(rs: GDNReplayState, accepted, state_indices=None) -> None:
    """Commit accepted drafts (a cursor move) and flush where due."""
    commit(rs, accepted, state_indices, gdn_flush)


