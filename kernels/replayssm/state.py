"""Per-layer ReplaySSM state: checkpoint(s), input buffer, per-sequence cursors, byte accounting.

Shapes use these letters:
    S  slots (sequences the layer can hold; a batch row addresses a slot through state_indices)
    L  buffer capacity (entries since the last flush)
    K  flush period (K <= L; with speculation, L >= K + T)
    Mamba-2: H heads, P head dim, N state dim, G groups (B shared per group)
    GDN:     Hv value heads, Hk key heads, dv value dim, dk key dim

A checkpoint is a state tensor [S, heads, rows, cols] (Mamba-2: rows = P, cols = N;
GDN: rows = dv, cols = dk). In fp8 it carries one float32 scale per row ([S, heads, rows]).

Three precision modes:
    "replay"      one checkpoint in ``state_dtype``, read by both the output path and flushes;
    "dual"        a float32 high checkpoint read/written only by flushes, plus a low copy
                  (bf16 / fp16 / fp8-e4m3 with per-row scales) that the per-step output path reads;
    "shared-low"  one checkpoint in the low dtype, used for both (rounding accumulates).

The buffer is linear, not circular: a flush folds every committed entry, so the cursor
returns to 0 and new entries overwrite from the start. Drafts beyond the cursor
(speculation) are simply overwritten by the next verify: rollback is a cursor move.

The cursor word: bits 0-7 hold the entry count n (so L < 2^8), bits 8-14 the small-batch
route's epoch (below), bit 15 (LO_STALE) says that a dual state's low copy is behind its high
checkpoint; kernels add tickets above bit 15 within a launch. The small-batch route (a flush
every k-th step, 1 <= k <= K) writes only the high copy of a dual state and sets the bit. The
low copy is refreshed lazily, by the next op that needs it: a buffered step flushes that
sequence, a verify rewrites the copy and clears the bit first, a flush writes both copies
(reference.py implements the same). Any op that stores a new cursor clears the bit and the
epoch. Read the count with ``rs.entries(slots)``, never ``rs.cursor`` raw.

The route's epoch (period k >= 2, both families): one program of the route's launch moves the
cursor with a plain store while the others may still be about to read it, and no ticket says
when all have read. So every program keeps the epoch it last saw in ``route_epoch`` (one byte
per 4 rows of a head, GDN's value rows or Mamba-2's head-dim rows: a program owns whole 4-row
groups), and the word the route stores carries the next epoch (1..127, never 0). A program
reading the word then knows whether it sees the value before the launch (its epoch) or the
value a sibling of this launch stored (the next epoch; the route's transition n -> (n + 1) mod k
then gives the count before). A word any other op stored has epoch 0: the route then moves the
cursor by ticket, once, and every program relearns the epoch.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .accounting import ByteCounter  # noqa: F401 (part of this module's API: the states count into one)

FP8_MAX = 448.0  # largest finite float8_e4m3fn
LO_STALE = 1 << 15          # cursor bit: the low copy is stale (module docstring)
CURSOR_MASK = (1 << 8) - 1  # cursor bits: entries since the last flush
EPOCH_SHIFT = 8             # cursor bits 8-14: the small-batch route's epoch (module docstring)
EPOCH_ROWS = 4              # rows of a value head per route_epoch byte

DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64,
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float8_e4m3": torch.float8_e4m3fn,
}
LO_DTYPES = ("bfloat16", "float16", "float8_e4m3")
MODES = ("replay", "dual", "shared-low")


def dtype_of(name: str | torch.dtype) -> torch.dtype:
    """Torch dtype for a dtype name used in scenarios ('float32', 'float8_e4m3', ...)."""
    if isinstance(name, torch.dtype):
        return name
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; allowed: {', '.join(DTYPES)}") from None


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 if any tensor is float64 (exact reference runs), else float32."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


@dataclass
class Checkpoint:
    """One stored copy of the recurrent state.

    data:  [S, heads, rows, cols] in its storage dtype
    scale: [S, heads, rows] float32 per-row scales, only for fp8 storage (else None)
    """

    data: torch.Tensor
    scale: torch.Tensor | None = None

    @classmethod
    def zeros(cls, slots: int, heads: int, rows: int, cols: int, dtype: torch.dtype, device) -> "Checkpoint":
        data = torch.zeros(slots, heads, rows, cols, dtype=dtype, device=device)
        scale = None
        if dtype == torch.float8_e4m3fn:
            scale = torch.ones(slots, heads, rows, dtype=torch.float32, device=device)
        return cls(data, scale)

    @property
    def is_fp8(self) -> bool:
        return self.scale is not None

    def bytes_per_slot(self) -> int:
        """Bytes one sequence's copy occupies (data plus scales)."""
        n = self.data[0].numel() * self.data.element_size()
        if self.scale is not None:
            n += self.scale[0].numel() * self.scale.element_size()
        return n

    def read(self, slots: torch.Tensor, cd: torch.dtype) -> torch.Tensor:
        """Dequantised state of `slots` ([b] long) as [b, heads, rows, cols] in compute dtype cd."""
        s = self.data[slots].to(cd)
        if self.scale is not None:
            s = s * self.scale[slots].to(cd)[..., None]
        return s

    def write(self, slots: torch.Tensor, state: torch.Tensor) -> None:
        """Store `state` [b, heads, rows, cols] (any float dtype) into `slots`, quantising."""
        if self.scale is not None:
            scale = quantize_scale(state)
            self.scale[slots] = scale.to(torch.float32)
            self.data[slots] = (state / scale[..., None]).to(self.data.dtype)
        else:
            self.data[slots] = state.to(self.data.dtype)


def quantize_scale(state: torch.Tensor) -> torch.Tensor:
    """Per-row fp8 scale [.., rows] = amax(|row|) / 448 (1 for an all-zero row)."""
    amax = state.abs().amax(dim=-1)
    return torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))


def make_checkpoints(mode: str, state_dtype, lo_dtype, slots, heads, rows, cols, device):
    """(hi, lo) checkpoints for a precision mode. lo is None except in dual mode."""
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}; allowed: {', '.join(MODES)}")
    if mode == "replay":
        return Checkpoint.zeros(slots, heads, rows, cols, dtype_of(state_dtype), device), None
    if lo_dtype is None or (not isinstance(lo_dtype, torch.dtype) and lo_dtype not in LO_DTYPES):
        raise ValueError(f"mode {mode!r} needs lo_dtype in {', '.join(LO_DTYPES)}; got {lo_dtype!r}")
    lo = Checkpoint.zeros(slots, heads, rows, cols, dtype_of(lo_dtype), device)
    if mode == "shared-low":
        return lo, None
    hi_dtype = dtype_of(state_dtype)
    if hi_dtype not in (torch.float32, torch.float64):
        raise ValueError(f"dual mode keeps a float32 (or float64) high checkpoint; got state_dtype {state_dtype!r}")
    return Checkpoint.zeros(slots, heads, rows, cols, hi_dtype, device), lo


@dataclass
class ReplayStateBase:
    """Fields shared by both families. Subclasses add the buffer tensors."""

    hi: Checkpoint            # flush path; in 'replay' and 'shared-low' mode the only copy
    lo: Checkpoint | None     # output path in 'dual' mode
    cursor: torch.Tensor      # [S] int32: committed entries since the last flush (| LO_STALE)
    flush_period: int
    mode: str
    counter: ByteCounter | None = field(default=None)
    # a small-batch route step has run on this dual state, so low copies may be stale (LO_STALE):
    # the Triton verify then refreshes them first (host-side: graph-safe, set before capture)
    routed: bool = field(default=False)
    # a deferred small-batch route step (period >= 2) has run: cursor words may carry its epoch
    # bits, which the Triton verify does not mask: it clears them first (host-side, as routed)
    deferred: bool = field(default=False)
    # the draft window T the state was allocated for (0: no speculation; L >= K + T checked
    # at allocate) and the T of the last verify (commit's debug check: accepted <= T)
    spec_window: int = field(default=0)
    draft_window: int = field(default=0)

    def entries(self, slots=None) -> torch.Tensor:
        """Committed entries n [len(slots)] (long) of `slots` (default: all), the LO_STALE bit masked."""
        c = self.cursor if slots is None else self.cursor[slots]
        return (c & CURSOR_MASK).long()

    def lo_stale(self, slots=None) -> torch.Tensor:
        """[len(slots)] bool: the slot's low copy is behind its high checkpoint (dual only)."""
        c = self.cursor if slots is None else self.cursor[slots]
        return (c & LO_STALE) != 0

    @property
    def read_ckpt(self) -> Checkpoint:
        """The copy the per-step output path reads."""
        return self.lo if self.lo is not None else self.hi

    @property
    def capacity(self) -> int:
        raise NotImplementedError

    def count(self, **kw: int) -> None:
        if self.counter is not None:
            for k, v in kw.items():
                setattr(self.counter, k, getattr(self.counter, k) + int(v))

    def state_bytes_per_slot(self) -> int:
        """Checkpoint bytes one sequence holds (both copies in dual mode)."""
        n = self.hi.bytes_per_slot()
        if self.lo is not None:
            n += self.lo.bytes_per_slot()
        return n

    def buffer_bytes_per_slot(self) -> int:
        return sum(t[0].numel() * t.element_size() for t in self.buffers())

    def buffer_row_bytes(self) -> int:
        """Bytes one buffer entry occupies for one sequence (all heads)."""
        return sum(t[0, 0].numel() * t.element_size() for t in self.buffers())

    def buffers(self) -> list[torch.Tensor]:
        raise NotImplementedError


@dataclass
class Mamba2ReplayState(ReplayStateBase):
    """Mamba-2 ReplaySSM state of one layer.

    x:  [S, L, H, P]  activation dtype: buffered inputs
    B:  [S, L, G, N]  activation dtype: buffered input projections (per group)
    dt: [S, L, H]     float32 (float64 in exact runs): softplus(dt_raw + dt_bias) of each entry
    route_epoch: [S, H, ceil(P / EPOCH_ROWS)] int8: the small-batch route's epochs (module
                  docstring), one per 4-row group of a head; 0 = none seen
    """

    x: torch.Tensor = None
    B: torch.Tensor = None
    dt: torch.Tensor = None
    route_epoch: torch.Tensor | None = None
    # the layer's A [H], remembered from the last replay_step / verify / load_state (or given
    # to allocate) so that flush and commit need no model parameter, as GDN's do not
    A: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.x.shape[1]

    def buffers(self) -> list[torch.Tensor]:
        return [self.x, self.B, self.dt]

    @classmethod
    def allocate(cls, slots: int, nheads: int, head_dim: int, d_state: int, n_groups: int,
                 buffer_len: int, flush_period: int, mode: str = "replay", state_dtype="float32",
                 lo_dtype=None, act_dtype=torch.bfloat16, device="cpu", counter=None, *, spec_window: int = 0,
                 A: torch.Tensor | None = None) -> "Mamba2ReplayState":
        """A zeroed state of `slots` sequences. spec_window: the draft window T verify will
        use (0: none); buffer_len >= flush_period + spec_window is checked here."""
        check_periods(buffer_len, flush_period, spec_window)
        hi, lo = make_checkpoints(mode, state_dtype, lo_dtype, slots, nheads, head_dim, d_state, device)
        act = dtype_of(act_dtype)
        dt_dtype = torch.float64 if act == torch.float64 else torch.float32
        return cls(hi=hi, lo=lo, cursor=torch.zeros(slots, dtype=torch.int32, device=device),
                   flush_period=flush_period, mode=mode, counter=counter,
                   x=torch.zeros(slots, buffer_len, nheads, head_dim, dtype=act, device=device),
                   B=torch.zeros(slots, buffer_len, n_groups, d_state, dtype=act, device=device),
                   dt=torch.zeros(slots, buffer_len, nheads, dtype=dt_dtype, device=device),
                   route_epoch=torch.zeros(slots, nheads, -(-head_dim // EPOCH_ROWS), dtype=torch.int8,
                                           device=device), spec_window=spec_window, A=A)


@dataclass
class GDNReplayState(ReplayStateBase):
    """Gated DeltaNet ReplaySSM state of one layer.

    u:    [S, L, Hv, dv]  float32 (float64 exact): u_i = beta_i (v_i - alpha_i S_{i-1} k_i)
    k:    [S, L, Hk, dk]  activation dtype: raw keys (normalised on use, so the stored
                          value is the exact input)
    g:    [S, L, Hv]      float32: log alpha_i
    v:    [S, L, Hv, dv]  activation dtype, dual mode only: raw values, so a flush can
                          recompute u against the high checkpoint
    beta: [S, L, Hv]      float32, dual mode only
    route_epoch: [S, Hv, ceil(dv / EPOCH_ROWS)] int8: the small-batch route's epochs (module
                          docstring), one per 4-row group of a head; 0 = none seen
    """

    u: torch.Tensor = None
    k: torch.Tensor = None
    g: torch.Tensor = None
    v: torch.Tensor | None = None
    beta: torch.Tensor | None = None
    route_epoch: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.u.shape[1]

    def buffers(self) -> list[torch.Tensor]:
        return [t for t in (self.u, self.k, self.g, self.v, self.beta) if t is not None]

    @classmethod
    def allocate(cls, slots: int, num_k_heads: int, num_v_heads: int, head_k_dim: int, head_v_dim: int,
                 buffer_len: int, flush_period: int, mode: str = "replay", state_dtype="float32",
                 lo_dtype=None, act_dtype=torch.bfloat16, device="cpu", counter=None, *,
                 spec_window: int = 0) -> "GDNReplayState":
        """A zeroed state of `slots` sequences. spec_window: the draft window T verify will
        use (0: none); buffer_len >= flush_period + spec_window is checked here."""
        check_periods(buffer_len, flush_period, spec_window)
        if num_v_heads % num_k_heads:
            raise ValueError(f"num_v_heads ({num_v_heads}) must be a multiple of num_k_heads ({num_k_heads})")
        hi, lo = make_checkpoints(mode, state_dtype, lo_dtype, slots, num_v_heads, head_v_dim, head_k_dim, device)
        act = dtype_of(act_dtype)
        f = torch.float64 if act == torch.float64 else torch.float32
        dual = mode == "dual"
        z = lambda *shape, dtype: torch.zeros(*shape, dtype=dtype, device=device)  # noqa: E731
        return cls(hi=hi, lo=lo, cursor=z(slots, dtype=torch.int32), flush_period=flush_period, mode=mode,
                   counter=counter,
                   u=z(slots, buffer_len, num_v_heads, head_v_dim, dtype=f),
                   k=z(slots, buffer_len, num_k_heads, head_k_dim, dtype=act),
                   g=z(slots, buffer_len, num_v_heads, dtype=f),
                   v=z(slots, buffer_len, num_v_heads, head_v_dim, dtype=act) if dual else None,
                   beta=z(slots, buffer_len, num_v_heads, dtype=f) if dual else None,
                   route_epoch=z(slots, num_v_heads, -(-head_v_dim // EPOCH_ROWS), dtype=torch.int8),
                   spec_window=spec_window)


def check_periods(buffer_len: int, flush_period: int, spec_window: int = 0) -> None:
    """Validate K <= L (and K + T <= L when speculating)."""
    if spec_window < 0:
        raise ValueError(f"spec_window must be >= 0; got {spec_window}")
    if buffer_len < 1 or flush_period < 1:
        raise ValueError(f"buffer_len ({buffer_len}) and flush_period ({flush_period}) must be >= 1")
    if buffer_len > CURSOR_MASK:
        raise ValueError(f"buffer_len ({buffer_len}) must be <= {CURSOR_MASK} (the cursor word's count bits)")
    if flush_period > buffer_len:
        raise ValueError(f"flush_period ({flush_period}) must be <= buffer_len ({buffer_len})")
    if spec_window and buffer_len < flush_period + spec_window:
        raise ValueError(f"speculation needs buffer_len >= flush_period + spec_window "
                         f"({flush_period} + {spec_window}); got {buffer_len}")
