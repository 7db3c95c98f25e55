"""Analytical memory traffic and FLOPs of one decode step of one SSM layer.

All numbers are per step for the whole batch, averaged over a flush period (every
sequence cycles through cursor positions 0..K-1). They count unique device-memory bytes
the way the kernels touch them: the state once per read or write, a group's B (a key
head's k) once, buffer rows 0..n-1 at cursor n, layer parameters (A, D, dt_bias: a few
hundred bytes, cached) not at all.

Per sequence, with S = state bytes of the copy read, r = bytes of one buffer row
(all heads), io = step inputs + outputs:

    eager            read S + in            write S + out
    replay, n < K-1  read S_read + n r + in  write r + out               (output-only route)
    replay, n = K-1  read S_hi + n r + in    write S_hi (+ S_lo) + out   (flush step)
    average          read ((K-1) S_read + S_hi)/K + r (K-1)/2 + in
                     write r (K-1)/K + (S_hi + S_lo)/K + out
    replay, routed   the small-batch route of period k (1 <= k <= K: a flush at every k-th
                     step, the high copy alone read and written): the average above with K = k
                     and S_read = S_hi, S_lo = 0 (k = 1: read S_hi + in, write S_hi + out, eager's
                     bytes); a dual state's low copy is left stale, refreshed by the first
                     buffered step after, a one-off not in this average

Speculative (per round: verify T tokens, commit m ~ the acceptance model; see spec_traffic):

    spec-replay      read S_read + n r + T in     write T r + T out; a flush (read S_hi + folded
                     entries, write S_hi (+ S_lo)) when the cursor passes K (spec_cursor_stats)
    spec-perdraft    read S + T in               write T S + T out      (1 + T slots per request)
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .methods import METHODS, names

DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3": 1, "none": 0}
# the methods of each traffic model (replaybench.methods: Method.traffic)
REPLAY_METHODS = names(traffic="replay")
SPEC_REPLAY_METHODS = names(traffic="spec-replay")
SPEC_METHODS = names(spec=True)
EAGER_METHODS = names(traffic="eager")


@dataclass(frozen=True)
class Traffic:
    """Bytes and FLOPs of one step of one layer (whole batch)."""

    read_bytes: float
    write_bytes: float
    flops: float
    parts: dict = field(default_factory=dict, compare=False)  # named components (bytes per step)

    @property
    def total_bytes(self) -> float:
        return self.read_bytes + self.write_bytes

    @property
    def intensity(self) -> float:
        """FLOPs per byte moved."""
        return self.flops / self.total_bytes if self.total_bytes else 0.0


@dataclass(frozen=True)
class LayerBytes:
    """Per-sequence byte sizes of one layer's decode step for a method's precision mode."""

    state_hi: float     # the checkpoint flushes read and write (the only copy unless dual)
    state_lo: float     # dual mode's low copy (0 otherwise)
    row: float          # one buffer entry, all heads
    io_in: float        # step inputs
    io_out: float       # step outputs
    state_elems: int    # recurrent state elements (for FLOPs)
    eager_flops_per_elem: float
    replay_flops_per_elem: float

    @property
    def state_read(self) -> float:
        """The copy the per-step output path reads."""
        return self.state_lo or self.state_hi


def _state_bytes(elems: int, rows: int, dtype: str) -> float:
    """Bytes of one stored state copy; fp8 adds one float32 scale per row."""
    b = elems * DTYPE_BYTES[dtype]
    return b + rows * 4 if dtype == "float8_e4m3" else b


def precision_copies(method: str, state_dtype: str, lo_dtype: str) -> tuple[str, str | None]:
    """(high/only copy dtype, low copy dtype or None) for a method."""
    precision = METHODS[method].precision
    if precision == "dual":
        return state_dtype, lo_dtype
    if precision == "shared-low":
        return lo_dtype, None
    return state_dtype, None


def mamba2_layer_bytes(nheads, head_dim, d_state, n_groups, method="eager", state_dtype="float32",
                       lo_dtype="none", act_bytes=2, gate=True) -> LayerBytes:
    """Per-sequence sizes for Mamba-2 (x, z, y in activation dtype; dt float32; B/C per group)."""
    H, P, N, G = nheads, head_dim, d_state, n_groups
    elems, rows = H * P * N, H * P
    hi, lo = precision_copies(method, state_dtype, lo_dtype)
    io_in = H * P * act_bytes + H * 4 + 2 * G * N * act_bytes + (H * P * act_bytes if gate else 0)
    return LayerBytes(state_hi=_state_bytes(elems, rows, hi), state_lo=_state_bytes(elems, rows, lo) if lo else 0,
                      row=H * P * act_bytes + G * N * act_bytes + H * 4, io_in=io_in, io_out=H * P * act_bytes,
                      state_elems=elems, eager_flops_per_elem=5, replay_flops_per_elem=2)


def gdn_layer_bytes(num_k_heads, num_v_heads, head_k_dim, head_v_dim, method="eager", state_dtype="float32",
                    lo_dtype="none", act_bytes=2) -> LayerBytes:
    """Per-sequence sizes for GDN (q, k, v, o in activation dtype; g, beta float32; u float32;
    dual mode also buffers raw v and beta so a flush can recompute u against the high copy)."""
    Hk, Hv, dk, dv = num_k_heads, num_v_heads, head_k_dim, head_v_dim
    elems, rows = Hv * dv * dk, Hv * dv
    hi, lo = precision_copies(method, state_dtype, lo_dtype)
    row = Hv * dv * 4 + Hk * dk * act_bytes + Hv * 4
    if METHODS[method].precision == "dual":
        row += Hv * dv * act_bytes + Hv * 4
    return LayerBytes(state_hi=_state_bytes(elems, rows, hi), state_lo=_state_bytes(elems, rows, lo) if lo else 0,
                      row=row, io_in=2 * Hk * dk * act_bytes + Hv * dv * act_bytes + 2 * Hv * 4,
                      io_out=Hv * dv * act_bytes, state_elems=elems, eager_flops_per_elem=7, replay_flops_per_elem=4)


def eager_traffic(lb: LayerBytes, batch: int) -> Traffic:
    s = lb.state_hi
    return Traffic(read_bytes=batch * (s + lb.io_in), write_bytes=batch * (s + lb.io_out),
                   flops=batch * lb.state_elems * lb.eager_flops_per_elem,
                   parts={"state_read": batch * s, "state_write": batch * s, "buffer_read": 0.0,
                          "buffer_write": 0.0, "io": batch * (lb.io_in + lb.io_out)})


def replay_traffic(lb: LayerBytes, batch: int, flush_period: int, routed: int = 0) -> Traffic:
    """Average over a flush period K (see the module docstring); routed: the small-batch route's
    period k (0: not routed; K = k, the high copy alone read and written)."""
    K = min(int(routed), flush_period) if routed else flush_period
    state_read = lb.state_hi if routed else ((K - 1) * lb.state_read + lb.state_hi) / K
    state_write = lb.state_hi / K if routed else (lb.state_hi + lb.state_lo) / K
    buf_read, buf_write = lb.row * (K - 1) / 2, lb.row * (K - 1) / K
    # output-only steps touch each state element ~replay_flops times; the flush step folds
    # (eager-like work) once per period
    # (the small-batch route takes an eager step on the high tile at every step)
    fl = lb.state_elems * (lb.eager_flops_per_elem if routed else
                           (lb.replay_flops_per_elem * (K - 1) + lb.eager_flops_per_elem) / K)
    return Traffic(read_bytes=batch * (state_read + buf_read + lb.io_in),
                   write_bytes=batch * (state_write + buf_write + lb.io_out), flops=batch * fl,
                   parts={"state_read": batch * state_read, "state_write": batch * state_write,
                          "buffer_read": batch * buf_read, "buffer_write": batch * buf_write,
                          "io": batch * (lb.io_in + lb.io_out)})


def spec_cursor_stats(pmf, flush_period: int) -> tuple[float, float, float]:
    """Long-run (mean cursor at verify, flushes per round, entries folded per round) of one
    sequence whose commits draw m ~ pmf (P(m = k), k = 0..T) independently every round.

    The cursor n (committed entries since the last flush, < K at every verify) moves to
    n + m, or, when n + m >= K, folds those n + m entries into the checkpoint and returns
    to 0. One cycle from 0 back to 0 holds exactly one flush; v(n), the expected rounds spent
    at cursor n per cycle, follows v(0) = 1 / (1 - p0), v(n) = sum_{j<n} v(j) p(n - j) / (1 - p0).
    Fixed m: ceil(K / m) rounds per flush, m ceil(K / m) entries folded. m = 0 always: no
    flush, cursors stay where they are (staggered: mean (K - 1) / 2)."""
    K = max(int(flush_period), 1)
    pmf = [float(q) for q in pmf]
    T, p0 = len(pmf) - 1, pmf[0]
    if p0 >= 1.0:
        return (K - 1) / 2, 0.0, 0.0
    v = [0.0] * K
    v[0] = 1.0 / (1.0 - p0)
    for n in range(1, K):
        v[n] = sum(v[j] * pmf[n - j] for j in range(max(0, n - T), n)) / (1.0 - p0)
    cycle = sum(v)
    folded = sum(v[n] * pmf[m] * (n + m) for n in range(K) for m in range(1, T + 1) if n + m >= K)
    return sum(n * v[n] for n in range(K)) / cycle, 1.0 / cycle, folded / cycle


def _as_pmf(accepted, T: int) -> list[float]:
    """A pmf over 0..T from a pmf sequence, or from a mean (two-point: floor / ceil)."""
    if isinstance(accepted, (list, tuple)):
        if len(accepted) != T + 1:
            raise ValueError(f"accepted pmf needs T + 1 = {T + 1} entries, got {len(accepted)}")
        return [float(q) for q in accepted]
    m = min(max(float(accepted), 0.0), float(T))
    lo = int(m)
    pmf = [0.0] * (T + 1)
    pmf[lo] += 1.0 - (m - lo)
    if m > lo:
        pmf[lo + 1] += m - lo
    return pmf


def spec_traffic(lb: LayerBytes, batch: int, flush_period: int, spec_window: int, accepted,
                 perdraft: bool) -> Traffic:
    """One speculative round of one layer: verify T tokens, commit m of them (accepted: the
    pmf of m over 0..T, or its mean, taken as the two-point pmf floor/ceil), per round.

    ReplaySSM (spec-replay): verify reads the read checkpoint once and the n committed buffer
    rows (n = cursor), writes T draft rows and no state; commit is a cursor move, and a flush
    (read + write the checkpoint(s), read the n + m entries it folds) fires when n + m >= K.
    Cursor statistics: spec_cursor_stats.
    Per-draft baseline (spec-perdraft, vLLM's speculative path): read the start state, write
    the state after every token (T states); no buffer.
    """
    T = spec_window
    io = T * (lb.io_in + lb.io_out)
    if perdraft:
        s = lb.state_hi
        return Traffic(read_bytes=batch * (s + T * lb.io_in), write_bytes=batch * (T * s + T * lb.io_out),
                       flops=batch * T * lb.state_elems * lb.eager_flops_per_elem,
                       parts={"state_read": batch * s, "state_write": batch * T * s, "buffer_read": 0.0,
                              "buffer_write": 0.0, "io": batch * io})
    mean_cursor, flush_rate, folded = spec_cursor_stats(_as_pmf(accepted, T), flush_period)
    state_read = lb.state_read + flush_rate * lb.state_hi
    state_write = flush_rate * (lb.state_hi + lb.state_lo)
    buf_read = lb.row * (mean_cursor + folded)
    fl = lb.state_elems * (T * lb.replay_flops_per_elem + flush_rate * lb.eager_flops_per_elem)
    return Traffic(read_bytes=batch * (state_read + buf_read + T * lb.io_in),
                   write_bytes=batch * (state_write + T * lb.row + T * lb.io_out), flops=batch * fl,
                   parts={"state_read": batch * state_read, "state_write": batch * state_write,
                          "buffer_read": batch * buf_read, "buffer_write": batch * T * lb.row, "io": batch * io})


def layer_bytes_for(op: str, dims, method: str, state_dtype: str, lo_dtype: str, act_bytes: int = 2,
                    gate: bool = True) -> LayerBytes:
    """LayerBytes from an op's shape (a model's ``ssm``: replayssm.inputs.Mamba2Shape / GDNShape)."""
    if op == "mamba2":
        return mamba2_layer_bytes(dims.nheads, dims.head_dim, dims.d_state, dims.n_groups, method, state_dtype,
                                  lo_dtype, act_bytes, gate)
    if op == "gdn":
        return gdn_layer_bytes(dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim, method,
                               state_dtype, lo_dtype, act_bytes)
    raise ValueError(f"unknown op {op!r}; allowed: mamba2, gdn")


def route_period(case, model, options=None) -> int:
    """The period of the small-batch route the Triton replay step takes at this case's shape
    (0: it buffers; k: the state written every k-th step), as the kernel library's launch table
    decides (`options`: the family's options, None for what ships). The kernel runner records it
    with each replay row (`route_period`)."""
    if getattr(case, "backend", "") != "triton":
        return 0
    precision = METHODS[case.method].precision
    read = DTYPE_BYTES[case.state_dtype if precision == "single" else case.lo_dtype]  # dual: the low copy
    dual = precision == "dual"
    if model.op == "gdn":
        from replayssm.gdn import route_period as gdn_route_period   # the library's table (needs triton)
        return gdn_route_period(batch=case.batch, heads=model.ssm.num_v_heads, head_dim=model.ssm.head_v_dim,
                                key_dim=model.ssm.head_k_dim, buffer_len=case.buffer_len, read_bytes=read,
                                flush_period=case.flush_period, dual=dual, options=options)
    from replayssm.mamba2 import route_period as m2_route_period
    return m2_route_period(batch=case.batch, heads=model.ssm.nheads, head_dim=model.ssm.head_dim, read_bytes=read,
                           flush_period=case.flush_period, dual=dual, hi_bytes=DTYPE_BYTES[case.state_dtype],
                           options=options)


def step_traffic(case, model, act_bytes: int = 2, accepted=None) -> Traffic:
    """Traffic of one step of one layer for a sweep case (replaybench.scenario.Case); speculative
    methods: one round, with `accepted` (pmf over 0..T or mean) or else the case's acceptance model."""
    # vLLM's Mamba-2 layer applies the z gate in its gated RMSNorm, not in the SSM kernel
    m = METHODS.get(case.method)
    if m is None:
        raise ValueError(f"no traffic model for method {case.method!r}")
    gate = not m.vllm
    lb = layer_bytes_for(model.op, model.ssm, case.method, case.state_dtype, case.lo_dtype, act_bytes, gate)
    if m.traffic == "eager":
        return eager_traffic(lb, case.batch)
    if m.traffic == "replay":
        return replay_traffic(lb, case.batch, case.flush_period, route_period(case, model))
    if accepted is None:   # the case's acceptance model (replaybench.accept)
        from .accept import DEFAULT, accept_pmf
        acc = getattr(case, "accept", "none")
        accepted = accept_pmf(DEFAULT if acc in (None, "", "none") else acc, case.spec_window)
    return spec_traffic(lb, case.batch, case.flush_period, case.spec_window, accepted,
                        perdraft=m.traffic == "spec-perdraft")


def speedup_ceiling(eager: Traffic, other: Traffic) -> float:
    """Speedup at equal achieved bandwidth: ratio of modelled bytes."""
    return eager.total_bytes / other.total_bytes
