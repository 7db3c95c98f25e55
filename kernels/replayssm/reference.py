"""Exact PyTorch recurrences for Mamba-2 and Gated DeltaNet decode: the oracle (one public
namespace: the families' parts live in replayssm.mamba2.reference, replayssm.gdn.reference and
replayssm.perdraft.reference, the shared helpers in replayssm.common.reference, byte counting
in replayssm.accounting).

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

from .accounting import (count_flush_write, count_perdraft, count_refresh, count_step, flush_rows,  # noqa: F401
                         flush_slots, gdn_io_bytes, live_rows, mamba2_io_bytes, perdraft_columns, perdraft_rows)
from .common.reference import (L2_EPS, SOFTPLUS_THRESHOLD, advance, commit, decay_weights,  # noqa: F401
                               expand_groups, l2norm, load_state, refresh_stale, softplus, write_flushed)
from .mamba2.reference import (mamba2_commit, mamba2_eager_step, mamba2_export_state, mamba2_flush,  # noqa: F401
                               mamba2_replay_step, mamba2_verify)
from .gdn.reference import (gdn_commit, gdn_eager_step, gdn_export_state, gdn_flush, gdn_prep,  # noqa: F401
                            gdn_rederive_u, gdn_replay_step, gdn_scale, gdn_verify)
from .perdraft.reference import gdn_verify_perdraft, mamba2_verify_perdraft, perdraft_advance  # noqa: F401
