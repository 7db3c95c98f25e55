"""Argument checks of the public ops (replayssm.mamba2, replayssm.gdn, replayssm.perdraft),
one module for both families and both backends.

Two levels:

- **Host checks** (always on): shapes, dtypes, devices, strides and the buffer/window
  arithmetic (L >= K + T), from tensor metadata only: no device read, no sync, so they are
  free on the hot path and run when an op is called or a CUDA graph is captured. A failure is
  one ``ValueError`` naming the op, the argument, what was expected and what was received.
- **Debug checks** (``check=True`` on an op, or ``REPLAYSSM_CHECK=1`` in the environment):
  what needs device data: state indices in range and not duplicated, ``accepted`` within
  0..T and within the buffer, per-draft slot tables in range. They read device tensors (a
  sync): not for graph capture or timing.

In normal mode an index outside ``0 <= idx < S`` (S the slots of the state pool; negative is
how padding is written, e.g. vLLM's PAD_SLOT_ID = -1) is a no-op row on both backends:
nothing read or written for it, its output 0.
"""
from __future__ import annotations

import os

import torch

from .backends import check_backend  # noqa: F401 (re-exported: every op checks its backend here)

FLOATS = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
INTS = (torch.int32, torch.int64)
_LETTERS: dict[str, tuple[str, ...]] = {}
ENV = "REPLAYSSM_CHECK"


def read_env() -> bool:
    """(Re)read REPLAYSSM_CHECK (read once at import; call after changing it in-process)."""
    global _ENV_ON
    _ENV_ON = os.environ.get(ENV, "0").strip().lower() not in ("", "0", "false", "no", "off")
    return _ENV_ON


_ENV_ON = False
read_env()


def debug(check: bool | None) -> bool:
    """Whether the debug checks run: the op's `check` argument, else REPLAYSSM_CHECK."""
    return _ENV_ON if check is None else bool(check)


def options_of(op: str, options, cls) -> None:
    """options: None or the family's options class (a TypeError, as the planners raise)."""
    if options is not None and not isinstance(options, cls):
        raise TypeError(f"{op}: options must be a {cls.__module__.rsplit('.', 1)[0]}.{cls.__name__} or None; "
                        f"got {type(options).__name__}")


def fail(op: str, arg: str, expected: str, got) -> None:
    raise ValueError(f"{op}: {arg} must be {expected}; got {got}")


def _names(t: torch.Tensor) -> str:
    return f"{list(t.shape)} {str(t.dtype).replace('torch.', '')} on {t.device}"


class Args:
    """Checks one op's tensor arguments against named dimensions.

    ``Args(op, device, H=4, P=8)`` starts with the sizes the state fixes; ``tensor(name, t,
    "b H P")`` checks t's rank, binds letters not yet known (the first tensor to name ``b``
    fixes the batch) and compares the others, its dtype (floating by default) and device."""

    def __init__(self, op: str, device: torch.device, **dims: int):
        self.op, self.device, self.dims = op, device, dict(dims)
        self.src = {d: "the state" for d in dims}     # where each size came from (for the message)

    def tensor(self, name: str, t, dims: str, dtypes=FLOATS, optional: bool = False, contiguous: bool = False):
        # the hot path: a few attribute reads and compares per tensor; messages only on failure
        letters = _LETTERS.get(dims) or _LETTERS.setdefault(dims, tuple(dims.split()))
        if not isinstance(t, torch.Tensor):
            if t is None and optional:
                return
            fail(self.op, name, f"a tensor [{', '.join(letters)}]", None if t is None else type(t).__name__)
        shape, known = t.shape, self.dims
        if len(shape) != len(letters):
            self._shape(name, t, letters)
        for d, s in zip(letters, shape):
            w = known.get(d)
            if w is None:
                known[d], self.src[d] = s, name
            elif w != s:
                self._shape(name, t, letters)
        if t.dtype not in dtypes:
            fail(self.op, name, f"of dtype {' / '.join(str(d).replace('torch.', '') for d in dtypes)}",
                 str(t.dtype).replace("torch.", ""))
        if t.device != self.device:
            fail(self.op, name, f"on the state's device {self.device}", t.device)
        if contiguous and not t.is_contiguous():
            fail(self.op, name, "contiguous", f"strides {t.stride()}")

    def _shape(self, name, t, letters):
        bound = [d for d in letters if d in self.dims and self.src[d] != name]
        exp = ", ".join(f"{d}={self.dims[d]}" if d in bound else d for d in letters)
        src = sorted({self.src[d] for d in bound})
        fail(self.op, name, f"shaped [{exp}]" + (f" (sizes from {', '.join(src)})" if src else ""), list(t.shape))

    def divides(self, small: str, big: str, what: str) -> None:
        if self.dims[big] % self.dims[small]:
            fail(self.op, what, f"a divisor of {big}={self.dims[big]}", f"{small}={self.dims[small]}")

    def indices(self, name: str, t, dims: str = "b", optional: bool = True):
        self.tensor(name, t, dims, INTS, optional)

    def out(self, out, like: torch.Tensor, name: str = "out"):
        if out is None:
            return
        if not isinstance(out, torch.Tensor) or out.shape != like.shape or out.dtype != like.dtype:
            fail(self.op, name, f"a tensor like the output ({_names(like)})",
                 _names(out) if isinstance(out, torch.Tensor) else type(out).__name__)
        if out.device != like.device or not out.is_contiguous():
            fail(self.op, name, f"contiguous on {like.device}", f"strides {out.stride()} on {out.device}")


def state_tensors(op: str, rs, backend: str = "reference") -> None:
    """Every tensor of a replay state [S, ...] on the cursor's device, cursor int32 [S]; for the
    Triton backend also contiguous (the kernels address slots as a contiguous [S, ...] tensor;
    the reference takes any strides, e.g. vLLM's page views)."""
    S = rs.hi.data.shape[0]
    if rs.cursor.dtype != torch.int32 or rs.cursor.shape != (S,):
        fail(op, "rs.cursor", f"int32 [{S}]", _names(rs.cursor))
    parts = [("rs.hi", rs.hi.data), ("rs.lo", rs.lo.data if rs.lo is not None else None)]
    parts += [(f"rs.{n}", getattr(rs, n, None)) for n in ("x", "B", "dt", "u", "k", "g", "v", "beta", "route_epoch")]
    for name, t in parts:
        if t is None:
            continue
        if backend == "triton" and not t.is_contiguous():
            fail(op, name, "contiguous for backend='triton' (the reference takes any strides)", f"strides {t.stride()}")
        if t.device != rs.cursor.device or t.shape[0] != S:
            fail(op, name, f"[{S}, ...] on {rs.cursor.device}", _names(t))


def window(op: str, rs, T: int) -> None:
    """A draft window of T tokens fits the buffer behind any committed cursor (< K): L >= K + T."""
    L, K = rs.capacity, rs.flush_period
    if T < 1:
        fail(op, "the draft axis T (dim 1 of the inputs)", ">= 1", T)
    if L < K + T:
        fail(op, "the draft window T", f"<= buffer_len - flush_period = {L} - {K} = {L - K} (L >= K + T)", T)


def rows_and_window(op: str, rs, state_indices, batch: int, T: int | None, check) -> None:
    """A replay op's rows: verify's window on the host (T; None: a step), and in debug mode
    the indices (in the pool, distinct) and the window's fit behind every cursor."""
    if T is not None:
        window(op, rs, T)
    if debug(check):
        slots_in_pool(op, "state_indices", state_indices, rs.cursor.shape[0])
        if T is not None:
            window_fits(op, rs, state_indices, batch, T)


def batch_fits(op: str, batch: int, S: int, state_indices) -> None:
    """Without state_indices row b uses slot b, so the batch must fit the pool."""
    if state_indices is None and batch > S:
        fail(op, "the batch (without state_indices: row b uses slot b)", f"<= the {S} slots of the state", batch)


# ----------------------------------------------------------------------------- debug checks (device reads)
def slots_in_pool(op: str, name: str, idx, S: int, unique: bool = True) -> None:
    """Debug: every index < S (negative: padding) and, with `unique`, no slot twice."""
    if idx is None:
        return
    i = idx.detach().to("cpu", torch.long).flatten()
    bad = i[i >= S]
    if len(bad):
        fail(op, name, f"< {S} (the slots of the state; negative = padding)", f"{bad.tolist()[:8]}")
    live = i[i >= 0]
    if unique and len(torch.unique(live)) != len(live):
        u, c = torch.unique(live, return_counts=True)
        fail(op, name, "distinct slots (a slot twice in one batch)", f"slots {u[c > 1].tolist()[:8]} repeated")


def accepted_counts(op: str, rs, accepted, state_indices) -> None:
    """Debug: accepted[b] in 0..T (T: the last verify's window) and cursor + accepted <= L."""
    a = accepted.detach().to("cpu", torch.long)
    T = rs.draft_window or (rs.capacity - rs.flush_period)
    bad = a[(a < 0) | (a > T)]
    if len(bad):
        fail(op, "accepted", f"in 0..{T} (the draft window)", f"{bad.tolist()[:8]}")
    S = rs.cursor.shape[0]
    idx = (torch.arange(len(a)) if state_indices is None else state_indices.detach().to("cpu", torch.long))
    live = (idx >= 0) & (idx < S)
    n = rs.entries(idx[live].to(rs.cursor.device)).cpu() + a[live]
    if len(n) and int(n.max()) > rs.capacity:
        fail(op, "accepted", f"<= buffer_len - cursor (buffer_len {rs.capacity})",
             f"cursor + accepted = {int(n.max())}")


def window_fits(op: str, rs, state_indices, batch: int, T: int) -> None:
    """Debug: cursor + T <= L for every live row of a verify (a cursor corrupted by a bad commit)."""
    S = rs.cursor.shape[0]
    idx = torch.arange(batch) if state_indices is None else state_indices.detach().to("cpu", torch.long)
    idx = idx[(idx >= 0) & (idx < S)]
    if len(idx) and int(rs.entries(idx.to(rs.cursor.device)).max()) + T > rs.capacity:
        fail(op, "the draft window", f"cursor + T <= buffer_len {rs.capacity}",
             f"cursor {int(rs.entries(idx.to(rs.cursor.device)).max())} + T {T}")


# ----------------------------------------------------------------------------- the families' op arguments
def mamba2_inputs(op: str, dims: dict, device, x, dt, A, B, C, D, dt_bias, z, state_indices, out=None,
                  draft: bool = False) -> Args:
    """x [b, (T,) H, P], dt [b, (T,) H], A / D / dt_bias [H], B / C [b, (T,) G, N] (G divides H),
    z like x or None, state_indices [b] int32 / int64 or None, out like x. `dims`: the sizes the
    state fixes (S, H, P, N and, for a replay state, G)."""
    a = Args(op, device, **{k: v for k, v in dims.items() if k != "S"})
    t = "b T " if draft else "b "
    a.tensor("x", x, t + "H P")
    a.tensor("dt", dt, t + "H")
    for name, v in (("A", A), ("D", D), ("dt_bias", dt_bias)):
        a.tensor(name, v, "H")
    a.tensor("B", B, t + "G N")
    a.tensor("C", C, t + "G N")
    a.divides("G", "H", "the groups G of B / C")
    a.tensor("z", z, t + "H P", optional=True)
    a.indices("state_indices", state_indices)
    batch_fits(op, a.dims["b"], dims["S"], state_indices)
    a.out(out, x)
    return a


def gdn_inputs(op: str, dims: dict, device, q, k, v, g, beta, state_indices, scale=None, out=None,
               draft: bool = False) -> Args:
    """q / k [b, (T,) Hk, dk], v [b, (T,) Hv, dv] (Hk divides Hv), g / beta [b, (T,) Hv],
    state_indices [b] int or None, scale a number or None, out like v."""
    a = Args(op, device, **{k_: v_ for k_, v_ in dims.items() if k_ != "S"})
    t = "b T " if draft else "b "
    a.tensor("v", v, t + "Hv dv")
    a.tensor("q", q, t + "Hk dk")
    a.tensor("k", k, t + "Hk dk")
    a.divides("Hk", "Hv", "the key heads Hk of q / k")
    a.tensor("g", g, t + "Hv")
    a.tensor("beta", beta, t + "Hv")
    a.indices("state_indices", state_indices)
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        fail(op, "scale", "a Python number or None", type(scale).__name__)
    batch_fits(op, a.dims["b"], dims["S"], state_indices)
    a.out(out, v)
    return a


# a replay state's checkpoint letters and buffers (name, the letters after [S, L])
_REPLAY = {"mamba2": ("S H P N", (("x", "H P"), ("B", "G N"), ("dt", "H"))),
           "gdn": ("S Hv dv dk", (("u", "Hv dv"), ("k", "Hk dk"), ("g", "Hv")))}


def replay_state_dims(op: str, rs, backend: str, family: str) -> dict:
    """The sizes a replay state fixes (S and the family's letters; its buffers agree with its
    checkpoint), after state_tensors."""
    state_tensors(op, rs, backend)
    letters, buffers = _REPLAY[family]
    a = Args(op, rs.cursor.device, **dict(zip(letters.split(), rs.hi.data.shape)))
    for name, dims in buffers:
        a.tensor(f"rs.{name}", getattr(rs, name), "S L " + dims)
    return a.dims


def mamba2_state_dims(op: str, rs, backend: str) -> dict:
    return replay_state_dims(op, rs, backend, "mamba2")


def gdn_state_dims(op: str, rs, backend: str) -> dict:
    return replay_state_dims(op, rs, backend, "gdn")


def eager_state(op: str, state, letters: str, backend: str) -> dict:
    """An eager state tensor [S, heads, rows, cols]: floating (Triton: contiguous)."""
    if not isinstance(state, torch.Tensor) or state.dim() != 4:
        fail(op, "state", f"a tensor [{letters}]", _names(state) if isinstance(state, torch.Tensor) else state)
    if state.dtype not in FLOATS:
        fail(op, "state", "float32 / bfloat16 / float16 / float64", str(state.dtype).replace("torch.", ""))
    if backend == "triton" and not state.is_contiguous():
        fail(op, "state", "contiguous for backend='triton'", f"strides {state.stride()}")
    return dict(zip(letters.replace(",", " ").split(), state.shape))


def commit_args(op: str, rs, accepted, state_indices) -> None:
    a = Args(op, rs.cursor.device)
    a.indices("accepted", accepted, "b", optional=False)
    a.indices("state_indices", state_indices)
    batch_fits(op, a.dims["b"], rs.cursor.shape[0], state_indices)


def flush_args(op: str, rs, slots) -> None:
    Args(op, rs.cursor.device).indices("slots", slots, "n")


def slot_op(op: str, backend: str, rs, slots, check=None, state=None) -> None:
    """load_state (state given) / export_state: the backend, the state's tensors, slots [b]
    (a load: b = state's rows) and, in debug mode, the slots in the pool."""
    check_backend(backend)
    state_tensors(op, rs)
    if state is not None:
        load_args(op, rs, state, slots)
    else:
        flush_args(op, rs, slots)
    if debug(check):
        slots_in_pool(op, "slots", slots, rs.cursor.shape[0])


def load_args(op: str, rs, state, slots) -> Args:
    S, H, R, Cc = rs.hi.data.shape
    a = Args(op, rs.cursor.device, H=H, rows=R, cols=Cc)
    a.tensor("state", state, "b H rows cols")
    a.indices("slots", slots)
    batch_fits(op, a.dims["b"], S, slots)
    return a
