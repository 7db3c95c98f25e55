"""The reference helpers both families' oracles share (replayssm.mamba2.reference,
replayssm.reference's GDN part): activations, group expansion, buffer decay weights, and the
cursor moves of a step, a flush and a commit."""
from __future__ import annotations

import torch

from ..accounting import count_refresh, live_rows
from ..state import CURSOR_MASK, LO_STALE

L2_EPS = 1e-6
SOFTPLUS_THRESHOLD = 20.0


def softplus(v: torch.Tensor) -> torch.Tensor:
    """softplus with the usual linear branch above 20 (the kernels use the same rule)."""
    return torch.where(v > SOFTPLUS_THRESHOLD, v, torch.log1p(torch.exp(torch.clamp(v, max=SOFTPLUS_THRESHOLD))))


def l2norm(v: torch.Tensor) -> torch.Tensor:
    """v / sqrt(sum(v^2) + 1e-6) over the last dim."""
    return v * torch.rsqrt((v * v).sum(-1, keepdim=True) + L2_EPS)


def expand_groups(t: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
    """Repeat grouped tensors (B/C per group, k/q per key head) up to `heads` along `dim`."""
    return t.repeat_interleave(heads // t.shape[dim], dim=dim)


def decay_weights(logdecay: torch.Tensor, end: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
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


def advance(rs, slots, n, route: int) -> None:
    """Cursors of sequences that appended without flushing: n + 1; the small-batch route
    (route >= 1) marks a dual state's low copy stale (module docstring)."""
    c = (n + 1).to(torch.int32)
    if route and rs.mode == "dual":
        c = c | LO_STALE
        rs.routed = True
    rs.cursor[slots] = c


def write_flushed(rs, slots, S, route: int = 0) -> None:
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


def refresh_stale(rs, slots, cd) -> None:
    """Write the low copy of `slots` whose copy is stale (LO_STALE) from the high checkpoint,
    before a verify reads it, and clear the bit."""
    st = slots[rs.lo_stale(slots)]
    if len(st):
        rs.lo.write(st, rs.hi.read(st, cd))
        rs.cursor[st] = rs.cursor[st] & CURSOR_MASK
    count_refresh(rs, len(st))


def commit(rs, accepted: torch.Tensor, state_indices=None, flush=None) -> None:
    """Accept `accepted[b]` (0..T) drafts per row: a cursor move; then flush sequences whose
    cursor reached the flush period. `flush(rs, slots)` folds entries (family-specific)."""
    rows, slots = live_rows(state_indices, accepted.shape[0], accepted.device, rs.cursor.shape[0])
    add = accepted[rows].long().clamp(0, rs.capacity - rs.flush_period)   # as the kernels: the cursor stays < L
    rs.cursor[slots] = (rs.entries(slots) + add).to(torch.int32)
    due = slots[rs.cursor[slots] >= rs.flush_period]
    if len(due):
        flush(rs, due)


def load_state(rs, state: torch.Tensor, slots=None) -> None:
    """Write `state` [b, heads, rows, cols] (any float dtype) as the checkpoint of `slots` [b]
    (None: slot b for row b; negative or past the pool: row skipped), both copies in dual
    mode, quantised to their storage; the slots' buffered entries are dropped (cursor 0)."""
    rows, sl = live_rows(slots, state.shape[0], rs.cursor.device, rs.cursor.shape[0])
    if len(rows) == 0:
        return
    st = state.to(rs.cursor.device)[rows]
    rs.hi.write(sl, st)
    if rs.lo is not None:
        rs.lo.write(sl, st)
    rs.cursor[sl] = 0


def export_state(rs, slots, fold) -> torch.Tensor:
    """The recurrent state of `slots` [b] (None: every slot) after every committed entry:
    the high checkpoint with the buffer folded in (`fold(rs, slots, cd, end)`, nothing
    written), [b, heads, rows, cols] in float32 (float64 for a float64 state); rows whose slot
    is negative or past the pool are 0."""
    S = rs.cursor.shape[0]
    idx = torch.arange(S, device=rs.cursor.device) if slots is None else slots
    rows, sl = live_rows(idx, idx.shape[0], rs.cursor.device, S)
    cd = torch.float64 if rs.hi.data.dtype == torch.float64 else torch.float32
    out = torch.zeros(idx.shape[0], *rs.hi.data.shape[1:], dtype=cd, device=rs.cursor.device)
    if len(rows):
        out[rows] = fold(rs, sl, cd, rs.entries(sl) - 1)
    return out
