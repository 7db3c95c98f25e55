"""Per-draft speculative baseline oracle (Mamba-2 and GDN): each draft token's state written to
its own slot of the request's slot table (replayssm.perdraft documents the layout)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..accounting import count_perdraft, gdn_io_bytes, mamba2_io_bytes, perdraft_rows
from ..common.reference import expand_groups, softplus
from ..state import ByteCounter, compute_dtype
from ..gdn.reference import gdn_prep, gdn_scale


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
def perdraft_advance(start: torch.Tensor, accepted: torch.Tensor, T: int) -> torch.Tensor:
    """Commit for the per-draft baseline: start <- (start + accepted) mod (1 + T), in place."""
    start.copy_(((start.to(torch.long) + accepted.to(device=start.device, dtype=torch.long)) % (T + 1))
                .to(start.dtype))
    return start


def _check_table(slot_table: torch.Tensor, batch: int, T: int) -> None:
    if slot_table.shape != (batch, T + 1):
        raise ValueError(f"slot_table must be [batch, 1 + T] = [{batch}, {T + 1}], got {tuple(slot_table.shape)}")


def _store(states: torch.Tensor, S: torch.Tensor, dst_t: torch.Tensor) -> int:
    """Write the state after a token to each live row's destination slot (negative: skipped);
    returns the number of states written."""
    ok = dst_t >= 0
    states[dst_t[ok]] = S[ok].to(states.dtype)
    return int(ok.sum())


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
    _check_table(slot_table, x.shape[0], T)
    rows, src, dst = perdraft_rows(slot_table, start, states.shape[0])
    out = torch.zeros_like(x)
    writes = 0
    if len(rows):
        S = states[src].to(cd)
        Acd, Dcd, dtb = A.to(cd), D.to(cd), dt_bias.to(cd)
        for t in range(T):
            xs = x[rows, t].to(cd)
            Bh, Ch = expand_groups(B[rows, t].to(cd), H, 1), expand_groups(C[rows, t].to(cd), H, 1)
            dtv = softplus(dt[rows, t].to(cd) + dtb)
            a = torch.exp(dtv * Acd)
            S = a[..., None, None] * S + (dtv[..., None] * xs)[..., None] * Bh[:, :, None, :]
            y = torch.einsum("bhpn,bhn->bhp", S, Ch) + Dcd[:, None] * xs
            if z is not None:
                y = y * F.silu(z[rows, t].to(cd))
            out[rows, t] = y.to(x.dtype)
            writes += _store(states, S, dst[:, t])
    count_perdraft(counter, states, len(rows), writes, len(rows) * mamba2_io_bytes(x, dt, B, C, z),
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
    _check_table(slot_table, v.shape[0], T)
    scale = gdn_scale(dk) if scale is None else scale
    rows, src, dst = perdraft_rows(slot_table, start, states.shape[0])
    out = torch.zeros_like(v)
    writes = 0
    if len(rows):
        S = states[src].to(cd)
        qn, kn = gdn_prep(q[rows], k[rows], cd, Hv, scale)      # [b, T, Hv, dk]
        for t in range(T):
            alpha, b_ = torch.exp(g[rows, t].to(cd)), beta[rows, t].to(cd)
            u = b_[..., None] * (v[rows, t].to(cd) - alpha[..., None] * torch.einsum("bhvk,bhk->bhv", S, kn[:, t]))
            S = alpha[..., None, None] * S + u[..., None] * kn[:, t, :, None, :]
            out[rows, t] = torch.einsum("bhvk,bhk->bhv", S, qn[:, t]).to(v.dtype)
            writes += _store(states, S, dst[:, t])
    count_perdraft(counter, states, len(rows), writes, len(rows) * gdn_io_bytes(q, k, v, g, beta),
                    len(rows) * v[0].numel() * v.element_size())
    return out
