"""The SSM part of a replay layer's step, in vLLM's terms (token-major inputs, block ids,
vLLM's accepted-token counts), on replayssm's public ops. No vLLM import.

Block id 0 is vLLM's null block (padded batch rows): it becomes state index -1, which the
ops skip. Speculative decoding: vLLM sends each decode row 1 + s tokens (the token sampled
last step, then s drafts) and, for the row's previous window, ``num_accepted_tokens`` (1..1+s:
the tokens of that window that stand). A step is then

    commit(min(num_accepted, pending))   the last window's standing tokens: a cursor move
    verify(this window)                  outputs of every token from checkpoint + buffer, no
                                         per-draft state; the window is appended past the cursor
    pending = tokens in this window

``pending`` is 0 after a prefill, so the first window after it commits nothing.
"""
from __future__ import annotations

import torch

from .. import gdn, mamba2


def state_indices(block_ids: torch.Tensor) -> torch.Tensor:
    """vLLM block ids [b] -> replayssm state indices (int32; null block 0 -> -1)."""
    return torch.where(block_ids > 0, block_ids, -1).to(torch.int32)


def _window(cu_seqlens: torch.Tensor, n: int, T: int):
    """Token positions [n, T] of each row's window and their validity (rows may carry fewer
    than T tokens); invalid positions repeat the row's last token (never accepted, and a
    verify output depends only on earlier positions)."""
    start, end = cu_seqlens[:n, None].long(), cu_seqlens[1:n + 1, None].long()
    pos = start + torch.arange(T, device=cu_seqlens.device)
    valid = pos < end
    return torch.where(valid, pos, (end - 1).clamp(min=0)), valid, (end - start).squeeze(1)


def _scatter(out: torch.Tensor, y: torch.Tensor, pos: torch.Tensor, valid: torch.Tensor) -> None:
    """out[pos[valid]] = y[valid] without a host sync (invalid positions go to a spare row)."""
    ntok = out.shape[0]
    tmp = out.new_empty((ntok + 1, *out.shape[1:]))
    tmp[:ntok] = out
    tmp.index_copy_(0, torch.where(valid, pos, ntok).flatten(), y.flatten(0, 1).to(out.dtype))
    out.copy_(tmp[:ntok])


def _commit_and_mark(commit, pending, idx, num_accepted, lengths):
    live = idx >= 0
    safe = torch.where(live, idx, 0).long()
    accepted = torch.minimum(num_accepted.to(torch.int32), pending[safe])
    commit(torch.where(live, accepted, 0))
    return safe, live


def _set_pending(pending, safe, live, lengths):
    pending[safe] = torch.where(live, lengths.to(torch.int32), pending[safe])


# ----------------------------------------------------------------------------- Mamba-2
def mamba2_decode(rs, pending, x, dt, A, B, C, D, dt_bias, block_ids, out, *, backend: str,
                  num_accepted=None, cu_seqlens=None, window: int = 1) -> None:
    """One decode step of a Mamba-2 layer. x [ntok, H, P], dt [ntok, H] raw, B/C [ntok, G, N],
    A/D/dt_bias [H]; block_ids [n] (column 0 of vLLM's decode state indices); out [ntok, H, P].
    Without num_accepted: one token per row (replay_step). With it: windows of `window` tokens
    delimited by cu_seqlens (verify/commit)."""
    idx = state_indices(block_ids)
    if num_accepted is None:
        mamba2.replay_step(rs, x, dt, A, B, C, D, dt_bias, None, idx, backend=backend, out=out)
        return
    n, T = idx.shape[0], window
    pos, valid, lengths = _window(cu_seqlens, n, T)
    safe, live = _commit_and_mark(lambda acc: mamba2.commit(rs, acc, idx, A=A, backend=backend),
                                  pending, idx, num_accepted, lengths)
    y = mamba2.verify(rs, x[pos], dt[pos], A, B[pos], C[pos], D, dt_bias, None, idx, backend=backend)
    _set_pending(pending, safe, live, lengths)
    _scatter(out, y, pos, valid)


def _continued(rs, block_ids, has_initial) -> torch.Tensor:
    """Slots of prefilling sequences that continue (chunked prefill: vLLM's prefill starts from
    their checkpoint). The others are new to their block, whose page may hold another layer
    group's bytes: their cursor is reset before anything reads it."""
    idx = state_indices(block_ids)
    live = idx >= 0
    cont = torch.zeros_like(live) if has_initial is None else \
        live & has_initial.to(device=live.device, dtype=torch.bool)
    rs.cursor[idx[live & ~cont].long()] = 0
    return idx[cont]


def mamba2_before_prefill(rs, A, block_ids, has_initial, *, backend: str) -> None:
    """Fold the committed entries of sequences whose prefill continues (a chunked prefill), so
    the checkpoint vLLM's prefill starts from is their current state. has_initial: vLLM's
    [num_prefills] bool (None: no prefill continues)."""
    mamba2.flush(rs, _continued(rs, block_ids, has_initial), A=A, backend=backend)


# ----------------------------------------------------------------------------- GDN
def gdn_gates(A_log, a, b, dt_bias):
    """vLLM's GDN gating: g = -exp(A_log) softplus(a + dt_bias) (log alpha), beta = sigmoid(b)."""
    g = -torch.exp(A_log.float()) * torch.nn.functional.softplus(a.float() + dt_bias.float(), threshold=20.0)
    return g, torch.sigmoid(b.float())


def gdn_decode(rs, pending, q, k, v, g, beta, block_ids, out, *, backend: str, scale=None,
               num_accepted=None, cu_seqlens=None, window: int = 1) -> None:
    """One decode step of a GDN layer. q/k [ntok, Hk, dk], v [ntok, Hv, dv], g/beta [ntok, Hv];
    out [ntok, Hv, dv]. Same modes as mamba2_decode."""
    idx = state_indices(block_ids)
    if num_accepted is None:
        gdn.replay_step(rs, q, k, v, g, beta, idx, scale=scale, backend=backend, out=out)
        return
    n, T = idx.shape[0], window
    pos, valid, lengths = _window(cu_seqlens, n, T)
    safe, live = _commit_and_mark(lambda acc: gdn.commit(rs, acc, idx, backend=backend),
                                  pending, idx, num_accepted, lengths)
    y = gdn.verify(rs, q[pos], k[pos], v[pos], g[pos], beta[pos], idx, scale=scale, backend=backend)
    _set_pending(pending, safe, live, lengths)
    _scatter(out, y, pos, valid)


def gdn_before_prefill(rs, block_ids, has_initial, *, backend: str) -> None:
    gdn.flush(rs, _continued(rs, block_ids, has_initial), backend=backend)


# ----------------------------------------------------------------------------- both
def after_prefill(rs, pending, block_ids) -> None:
    """vLLM's prefill has written the checkpoint of these slots: empty buffer, nothing pending,
    and (dual) the low copy refreshed from the new checkpoint."""
    idx = block_ids[block_ids > 0].long()
    rs.cursor[idx] = 0
    pending[idx] = 0
    rs.route_epoch[idx] = 0
    if rs.lo is not None:
        rs.lo.write(idx, rs.hi.read(idx, torch.float32))
