"""Numerical drift of the state precisions over long decodes: the computation behind the
drift runner (replaybench.runners.drift) and its tests.

Every configuration decodes the same input stream from a zero state and is compared, step by
step, with an fp64 eager decode of that stream:

    eager          state in float32 / bfloat16 / float16, read and written every step
    replay         one float32 checkpoint + input buffer (L = K = 16)
    shared-low     one low-precision checkpoint (bf16 / fp16 / fp8-e4m3 with per-row scales)
                   read by the output path and by flushes: rounding enters the recurrence
    dual           a float32 checkpoint that only flushes read and write, and a low copy
                   (bf16 / fp16 / fp8) that the per-step output path reads

Two levels, both against fp64:
  * op level: one SSM op at a model's SSM dims. Per-step relative output error of every
    (sequence, head), median and p99, pooled over the `window` steps ending at each
    measurement point; and the state's relative error at the point (a flush step of the
    replay methods when K divides it, as it does for the default points and K = 16).
  * stack level: a small random-initialised stack (embedding, `layers` decode layers of
    replayssm.layers at the model's SSM dims with pre-norm residuals, final norm, LM head)
    fed a fixed random token stream (teacher forcing, so every configuration sees the same
    tokens): KL(p_fp64 || p_config) of the next-token distributions and top-1 agreement,
    pooled the same way. Attention and MLP blocks are left out: they do not touch the SSM
    state, so they only dilute its error.

Inputs are rounded to bf16 values (the activations a served layer hands the op) and passed
in float32, so outputs come back unrounded and the only difference between configurations is
how the state is stored: the buffer keeps bf16 activations exactly. Mamba-2 runs with D = 0
(the skip term D x is computed the same way by every method and would only dilute the
state's error) and no z gate.

Decay spectra follow the published configs' initialisation ranges. Mamba-2 (NemotronH,
mamba_ssm): A = -exp(A_log) with |A| in A_init_range (1, 16); dt_bias = softplus^-1(dt0) with
dt0 log-uniform in [time_step_min, time_step_max] = [1e-3, 1e-1]. GDN (Qwen3.5 / Qwen3-Next,
flash-linear-attention): g = -exp(A_log) softplus(a + dt_bias) with exp(A_log) uniform in
(0, 16] and the same dt range. Per head the values are stratified over the range (head h gets
the h-th of H equal-probability bins, bins shuffled independently for A and dt), so even a
4-head CPU model spans it; each step adds input-dependent jitter, the pre-activation
(dt_raw, a) ~ N(0, 0.5^2). Per-step decay |A| dt then spans ~1e-3..1.6: memories from one
step to ~1,000 steps (GDN: longer, |A| down to ~0).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
# the study's methods (METHODS) are those the decode layers build: the stack level needs them
from replayssm.layers import METHODS, method_mode

# ----------------------------------------------------------------------------- configurations
LO_DTYPES = ("bfloat16", "float16", "float8_e4m3")
#: (method, state_dtype, lo_dtype) of every configuration the study compares
CONFIGS: tuple[tuple[str, str, str], ...] = (
    ("eager", "float32", "none"), ("eager", "bfloat16", "none"), ("eager", "float16", "none"),
    ("replay", "float32", "none"),
    *(("replay-shared-low", lo, lo) for lo in LO_DTYPES),
    *(("replay-dual", "float32", lo) for lo in LO_DTYPES),
)
SHORT = {"float64": "fp64", "float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float8_e4m3": "fp8"}

WINDOW = 16            # output errors pool the steps (t - WINDOW, t]: every phase of a K = 16 period
TABLE_STEPS = (128, 1024, 4096, 8192)

# published initialisation ranges (module docstring)
DT_RANGE = (1e-3, 1e-1)
A_RANGE = {"mamba2": (1.0, 16.0), "gdn": (0.0, 16.0)}
JITTER = 0.5           # std of the per-step dt / gate pre-activation around dt_bias

# the stack (stack level)
STACK_LAYERS = 2
STACK_HIDDEN = 1024    # capped at the model's hidden size
STACK_VOCAB = 4096     # capped at the model's vocabulary
LOGIT_STD = 3.0        # LM-head scale: peaked but not one-hot next-token distributions


def config_label(method: str, state_dtype: str, lo_dtype: str) -> str:
    """'eager fp32', 'shared-low bf16', 'dual fp32+fp8', ..."""
    if method == "replay-dual":
        return f"dual fp32+{SHORT[lo_dtype]}"
    if method == "replay-shared-low":
        return f"shared-low {SHORT[lo_dtype]}"
    return f"{method} {SHORT[state_dtype]}"


def measure_points(n: int, window: int = WINDOW) -> list[int]:
    """Log-spaced measurement steps (1 and 1.5 times powers of two, times `window`) from
    2 x `window` (the first window whose checkpoint is not the zero start) up to n, each a
    multiple of `window`; n itself when it is one."""
    pts = set()
    k = 1
    while window * 2 ** k <= n:
        for m in (1.0, 1.5):
            t = int(window * m * 2 ** k)
            if t <= n and t % window == 0:
                pts.add(t)
        k += 1
    if n >= 2 * window and n % window == 0:
        pts.add(n)
    return sorted(pts)


# ----------------------------------------------------------------------------- decay spectra
def inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def _stratified(n: int, gen: torch.Generator) -> torch.Tensor:
    """n values in [0, 1), one per equal bin, bins in random order (float64)."""
    u = (torch.arange(n, dtype=torch.float64) + torch.rand(n, generator=gen, dtype=torch.float64)) / n
    return u[torch.randperm(n, generator=gen)]


def decay_params(op: str, heads: int, seed: int = 0) -> dict:
    """Per-head decay parameters (float32 values, module docstring). Mamba-2: A (< 0), dt_bias;
    GDN: A_log, dt_bias. Plus 'dt0' and 'rate' = |A| dt0 (float64) for the record."""
    if op not in A_RANGE:
        raise ValueError(f"unknown op {op!r}; allowed: mamba2, gdn")
    gen = torch.Generator().manual_seed(1_000_003 + seed)
    lo, hi = math.log(DT_RANGE[0]), math.log(DT_RANGE[1])
    dt0 = torch.exp(lo + (hi - lo) * _stratified(heads, gen))
    a_lo, a_hi = A_RANGE[op]
    absA = a_lo + (a_hi - a_lo) * _stratified(heads, gen)
    absA = absA.clamp_min(1e-2 if op == "gdn" else a_lo)     # U(0, 16]: keep log finite
    dt_bias = inv_softplus(dt0).float()
    out = {"dt_bias": dt_bias, "dt0": dt0, "rate": absA * dt0}
    if op == "mamba2":
        out["A"] = (-absA).float()
    else:
        out["A_log"] = torch.log(absA).float()
    return out


LONG_FRACTION = 0.1


def long_heads(params: dict) -> torch.Tensor:
    """[H] bool: the LONG_FRACTION of heads (at least one) with the longest memory 1 / (|A| dt0)."""
    rate = params["rate"]
    k = max(1, int(round(LONG_FRACTION * rate.numel())))
    mask = torch.zeros(rate.numel(), dtype=torch.bool)
    mask[torch.argsort(rate)[:k]] = True
    return mask


def spectrum_summary(params: dict) -> dict:
    """Memory range (1 / per-step decay rate at dt0) of the heads, in steps."""
    mem = 1.0 / params["rate"]
    return {"memory_min_steps": float(mem.min()), "memory_median_steps": float(mem.median()),
            "memory_max_steps": float(mem.max())}


# ----------------------------------------------------------------------------- op-level inputs
def _bf16(t: torch.Tensor) -> torch.Tensor:
    """Round to bf16 values, keep float32 storage."""
    return t.to(torch.bfloat16).to(torch.float32)


class InputStream:
    """Deterministic per-step op inputs for `batch` sequences: `next()` returns (inp32, inp64),
    the same values as float32 (the configurations) and float64 (the reference)."""

    def __init__(self, op: str, dims, batch: int, params: dict, device, seed: int = 0):
        self.op, self.dims, self.batch, self.device = op, dims, batch, torch.device(device)
        self.gen = torch.Generator(device=self.device).manual_seed(7919 + seed)
        self.params = params
        if op == "gdn":
            self.A = torch.exp(params["A_log"].double()).to(self.device)
            self.dt_bias = params["dt_bias"].double().to(self.device)

    def _n(self, *shape):
        return torch.randn(self.batch, *shape, generator=self.gen, device=self.device)

    def next(self) -> tuple[dict, dict]:
        d = self.dims
        if self.op == "mamba2":
            inp = {"x": _bf16(self._n(d.nheads, d.head_dim)), "dt": _bf16(JITTER * self._n(d.nheads)),
                   "B": _bf16(self._n(d.n_groups, d.d_state)), "C": _bf16(self._n(d.n_groups, d.d_state))}
            return inp, {k: v.double() for k, v in inp.items()}
        q = _bf16(self._n(d.num_k_heads, d.head_k_dim))
        k = _bf16(self._n(d.num_k_heads, d.head_k_dim))
        v = _bf16(self._n(d.num_v_heads, d.head_v_dim))
        a = JITTER * self._n(d.num_v_heads).double()
        b = self._n(d.num_v_heads).double()
        g = -self.A * F.softplus(a + self.dt_bias)
        beta = torch.sigmoid(b)
        g32, beta32 = g.float(), beta.float()
        inp = {"q": q, "k": k, "v": v, "g": g32, "beta": beta32}
        # the reference takes the float32 gates too: their rounding is the layer's, not the state's
        return inp, {"q": q.double(), "k": k.double(), "v": v.double(), "g": g32.double(), "beta": beta32.double()}


def _ops(op: str):
    if op == "mamba2":
        from replayssm import mamba2 as m
    else:
        from replayssm import gdn as m
    return m


def heads(op: str, dims) -> int:
    """State heads of an op (Mamba-2 heads, GDN value heads)."""
    return _geometry(op, dims)[0]


def _geometry(op: str, dims) -> tuple[int, int, int]:
    """(heads, rows, cols) of one sequence's state."""
    if op == "mamba2":
        return dims.nheads, dims.head_dim, dims.d_state
    return dims.num_v_heads, dims.head_v_dim, dims.head_k_dim


class OpDecoder:
    """One configuration of one SSM op, decoding from a zero state. step(inp) -> output
    (float32, or float64 for the fp64 reference); state() -> the state the recurrence carries
    (float64; replay methods: their high checkpoint, current at flush steps); lo_state(): a
    dual state's low copy (None otherwise)."""

    def __init__(self, op: str, dims, method: str, state_dtype: str, lo_dtype: str, batch: int, params: dict,
                 backend: str, device, buffer_len: int = 16, flush_period: int = 16):
        from replayssm.state import GDNReplayState, Mamba2ReplayState, dtype_of
        self.op, self.method, self.backend = op, method, backend
        self.ops = _ops(op)
        self.device = torch.device(device)
        exact = state_dtype == "float64"
        cd = torch.float64 if exact else torch.float32
        self.slots = torch.arange(batch, device=self.device)
        heads, rows, cols = _geometry(op, dims)
        if op == "mamba2":
            self.args = {"A": params["A"].to(self.device, cd), "dt_bias": params["dt_bias"].to(self.device, cd),
                         "D": torch.zeros(heads, device=self.device, dtype=cd)}
        else:
            self.args = {}
        lo = None if lo_dtype in (None, "none") else lo_dtype
        # the buffer holds float32 activations: the inputs are bf16 values, so it keeps them
        # exactly, and the ops want the inputs' dtype there (outputs come back unrounded)
        act = torch.float64 if exact else torch.float32
        if method == "eager":
            self.state_t = torch.zeros(batch, heads, rows, cols, dtype=dtype_of(state_dtype), device=self.device)
            self.rs = None
        else:
            mode = method_mode(method)
            if op == "mamba2":
                self.rs = Mamba2ReplayState.allocate(batch, dims.nheads, dims.head_dim, dims.d_state,
                                                     dims.n_groups, buffer_len, flush_period, mode, state_dtype,
                                                     lo, act, self.device)
            else:
                self.rs = GDNReplayState.allocate(batch, dims.num_k_heads, dims.num_v_heads, dims.head_k_dim,
                                                  dims.head_v_dim, buffer_len, flush_period, mode, state_dtype,
                                                  lo, act, self.device)
            self.state_t = None

    def step(self, inp: dict) -> torch.Tensor:
        if self.rs is None:
            return self.ops.eager_step(self.state_t, **inp, **self.args, backend=self.backend)
        return self.ops.replay_step(self.rs, **inp, **self.args, backend=self.backend)

    def state(self) -> torch.Tensor:
        if self.rs is None:
            return self.state_t.double()
        return self.rs.hi.read(self.slots, torch.float64)

    def lo_state(self) -> torch.Tensor | None:
        if self.rs is None or self.rs.lo is None:
            return None
        return self.rs.lo.read(self.slots, torch.float64)


# ----------------------------------------------------------------------------- error metrics
def rel_err_rows(y: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Relative error of every (sequence, head) of y [b, H, ...] vs ref: ||y - ref|| / ||ref||
    over the trailing dims -> [b * H] float64."""
    y, ref = y.double().flatten(2), ref.double().flatten(2)
    num = (y - ref).norm(dim=-1)
    den = ref.norm(dim=-1)
    return (num / den.clamp_min(1e-300)).flatten()


def stats(errs: torch.Tensor) -> tuple[float, float]:
    """(median, p99) of a 1-D tensor (NaN when empty)."""
    if errs.numel() == 0:
        return float("nan"), float("nan")
    e = errs.double().cpu()
    return float(e.median()), float(torch.quantile(e, 0.99))


def window_steps(points: list[int], window: int = WINDOW) -> set[int]:
    return {s for t in points for s in range(max(1, t - window + 1), t + 1)}


# ----------------------------------------------------------------------------- CUDA graphs
GRAPH_CHECK_STEPS = 24     # graph replay checked against an eager twin over these (a flush included)


def _map(x, f):
    return {k: f(v) for k, v in x.items()} if isinstance(x, dict) else f(x)


class _Graphed:
    """One captured decode step of `dec`: copy the input into static tensors, replay, return
    the static output (overwritten by the next call)."""

    def __init__(self, dec, example):
        self.static = _map(example, torch.clone)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = dec.step(self.static)

    def __call__(self, x):
        if isinstance(x, dict):
            for k, v in x.items():
                self.static[k].copy_(v)
        else:
            self.static.copy_(x)
        self.graph.replay()
        return self.out


def use_graph(backend: str, device) -> bool:
    """Replay steps as CUDA graphs: the Triton kernels on a GPU (the reference syncs with the host)."""
    return backend == "triton" and torch.device(device).type == "cuda"


class Stepper:
    """step(x) of a decoder built by make(): on a GPU with the Triton backend, one step captured
    in a CUDA graph and replayed (the per-step launch overhead of thousands of steps is most of
    the run otherwise); elsewhere, or when capture fails, the plain step. A graphed decoder
    runs beside an eager twin for the first GRAPH_CHECK_STEPS steps; any difference and the
    twin, which holds the same state, takes over. `dec` is the decoder whose state is current;
    `graphed` says which ran."""

    def __init__(self, make, example, use_graph: bool, warm_steps: int = 17):
        self.graphed = False
        self.twin = None
        self.t = 0
        if not use_graph:
            self.dec = make()
            self.step = self.dec.step
            return
        try:
            warm = make()                   # compiles every kernel (a flush included) before capture
            for _ in range(warm_steps):
                warm.step(example)
            del warm
            self.dec = make()
            self.step = _Graphed(self.dec, example)
            self.twin = make()
            self.graphed = True
        except Exception:   # noqa: BLE001 - capture is an optimisation; the eager step is the method
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.dec = make()
            self.step = self.dec.step
            self.twin = None

    def __call__(self, x):
        y = self.step(x)
        if self.twin is not None:
            self.t += 1
            y2 = self.twin.step(x)
            # the same kernels on the same state: equal up to the order of a reduction
            if float((y - y2).abs().max()) > 1e-6 * float(y2.abs().max()):
                self.dec, self.step, self.graphed = self.twin, self.twin.step, False
                y = y2
            if self.t >= GRAPH_CHECK_STEPS or not self.graphed:
                self.twin = None
        return y


# ----------------------------------------------------------------------------- op level
@dataclass
class OpReference:
    """fp64 eager outputs at the window steps and states at the points."""
    points: list[int]
    outputs: dict = field(default_factory=dict)
    states: dict = field(default_factory=dict)


def op_reference(op: str, dims, batch: int, params: dict, device, n: int, seed: int = 0,
                 window: int = WINDOW) -> OpReference:
    points = measure_points(n, window)
    need = window_steps(points, window)
    dec = OpDecoder(op, dims, "eager", "float64", "none", batch, params, "reference", device)
    stream = InputStream(op, dims, batch, params, device, seed)
    ref = OpReference(points)
    for t in range(1, n + 1):
        _, inp64 = stream.next()
        y = dec.step(inp64)
        if t in need:
            ref.outputs[t] = y.clone()
        if t in ref.points:
            ref.states[t] = dec.state().clone()
    return ref


def op_drift(op: str, dims, method: str, state_dtype: str, lo_dtype: str, batch: int, params: dict,
             backend: str, device, n: int, ref: OpReference, seed: int = 0, buffer_len: int = 16,
             flush_period: int = 16, window: int = WINDOW) -> list[dict]:
    """Decode n steps in one configuration; one record per measurement point: out_med /
    out_p99 (output error pooled over the window), state_med / state_p99 (the carried state:
    for replay methods only where the point is a flush step), lo_med / lo_p99 (dual: the low
    copy); long_med / long_p99: the output error of the longest-memory heads alone (the
    LONG_FRACTION of heads with the smallest |A| dt0: where rounding has the most steps to
    compound)."""
    def make():
        return OpDecoder(op, dims, method, state_dtype, lo_dtype, batch, params, backend, device,
                         buffer_len, flush_period)

    example, _ = InputStream(op, dims, batch, params, device, seed + 1).next()
    stepper = Stepper(make, example, use_graph(backend, device))
    stream = InputStream(op, dims, batch, params, device, seed)
    need = window_steps(ref.points, window)
    long = long_heads(params).to(torch.device(device))
    errs: dict[int, torch.Tensor] = {}
    out = []
    for t in range(1, n + 1):
        inp32, _ = stream.next()
        y = stepper(inp32)
        dec = stepper.dec
        if t in need:
            errs[t] = rel_err_rows(y, ref.outputs[t]).view(batch, -1)     # [b, H]
        if t in ref.points:
            pooled = torch.cat([errs.pop(s) for s in sorted(errs) if s > t - window])
            errs.clear()
            rec = {"step": t}
            rec["out_med"], rec["out_p99"] = stats(pooled.flatten())
            rec["long_med"], rec["long_p99"] = stats(pooled[:, long].flatten())
            flushed = method == "eager" or t % flush_period == 0
            if flushed:
                rec["state_med"], rec["state_p99"] = stats(rel_err_rows(dec.state(), ref.states[t]))
            else:
                rec["state_med"] = rec["state_p99"] = float("nan")
            lo = dec.lo_state() if flushed else None
            if lo is not None:
                rec["lo_med"], rec["lo_p99"] = stats(rel_err_rows(lo, ref.states[t]))
            rec["graph"] = stepper.graphed
            out.append(rec)
    return out


# ----------------------------------------------------------------------------- stack level
def stack_dims(model) -> tuple[int, int]:
    """(hidden, vocab) of the drift stack for a model."""
    return min(model.hidden, STACK_HIDDEN), min(model.vocab, STACK_VOCAB)


def _rms(h: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)


class Stack:
    """Embedding -> `layers` x (h + layer(rmsnorm(h))) -> rmsnorm -> LM head, decode layers of
    replayssm.layers at the model's SSM dims. The same `seed` gives the same weights at every
    dtype (drawn in float32); the layers' decay parameters are replaced by decay_params."""

    def __init__(self, model, method: str, state_dtype: str, lo_dtype: str, batch: int, backend: str, device,
                 dtype=torch.float32, seed: int = 0, layers: int = STACK_LAYERS, buffer_len: int = 16,
                 flush_period: int = 16):
        from replayssm.layers import decode_layer
        self.device = torch.device(device)
        self.dtype = dtype
        hidden, vocab = stack_dims(model)
        gen = torch.Generator(device=self.device).manual_seed(104729 + seed)
        self.embed = torch.randn(vocab, hidden, generator=gen, device=self.device).to(dtype)
        self.head = (torch.randn(vocab, hidden, generator=gen, device=self.device) * LOGIT_STD
                     * hidden ** -0.5).to(dtype)
        self.layers = []
        for i in range(layers):
            layer = decode_layer(model.op, hidden, model.ssm, method=method, backend=backend, batch=batch,
                                 buffer_len=buffer_len, flush_period=flush_period, state_dtype=state_dtype,
                                 lo_dtype=lo_dtype, device=self.device, dtype=dtype, seed=seed * 101 + i)
            p = decay_params(model.op, heads(model.op, model.ssm), seed * 101 + i)
            cd = layer.cd
            if model.op == "mamba2":
                layer.A = p["A"].to(self.device, cd)
                layer.dt_bias = p["dt_bias"].to(self.device, cd)
                layer.D = layer.D.float().to(cd)      # the same D at every dtype (dt_raw is ~ N(0, 1/4) already)
            else:
                layer.A_log = p["A_log"].to(self.device, cd)
                layer.dt_bias = p["dt_bias"].to(self.device, cd)
                layer.w_in[-model.ssm.num_v_heads:] *= JITTER          # gate pre-activation a ~ N(0, 1/4)
            self.layers.append(layer)

    def step(self, tokens: torch.Tensor) -> torch.Tensor:
        """Next-token log-probabilities [b, vocab] (float64) after feeding `tokens` [b]."""
        h = self.embed[tokens]
        for layer in self.layers:
            h = h + layer.step(_rms(h))
        logits = F.linear(_rms(h), self.head)
        return F.log_softmax(logits.double(), dim=-1)


@dataclass
class StackReference:
    points: list[int]
    logp: dict = field(default_factory=dict)
    entropy: float = float("nan")


def _tokens(batch: int, vocab: int, n: int, device, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(15485863 + seed)
    return torch.randint(vocab, (n, batch), generator=gen).to(device)


def stack_reference(model, batch: int, device, n: int, seed: int = 0, window: int = WINDOW) -> StackReference:
    points = measure_points(n, window)
    need = window_steps(points, window)
    st = Stack(model, "eager", "float64", "none", batch, "reference", device, torch.float64, seed)
    toks = _tokens(batch, stack_dims(model)[1], n, device, seed)
    ref = StackReference(points)
    ent = []
    for t in range(1, n + 1):
        lp = st.step(toks[t - 1])
        if t in need:
            ref.logp[t] = lp.clone()
            ent.append(-(lp.exp() * lp).sum(-1))
    if ent:
        ref.entropy = float(torch.cat(ent).mean())
    return ref


def stack_drift(model, method: str, state_dtype: str, lo_dtype: str, batch: int, backend: str, device, n: int,
                ref: StackReference, seed: int = 0, buffer_len: int = 16, flush_period: int = 16,
                window: int = WINDOW) -> list[dict]:
    """One record per point: kl_mean / kl_p99 (KL(p_fp64 || p) per sequence and step, nats,
    pooled over the window) and top1 (fraction of those where the argmax agrees)."""
    def make():
        return Stack(model, method, state_dtype, lo_dtype, batch, backend, device, torch.float32, seed,
                     buffer_len=buffer_len, flush_period=flush_period)

    toks = _tokens(batch, stack_dims(model)[1], n, device, seed)
    stepper = Stepper(make, toks[0], use_graph(backend, device))
    need = window_steps(ref.points, window)
    kls, agree = {}, {}
    out = []
    for t in range(1, n + 1):
        lp = stepper(toks[t - 1])
        if t in need:
            r = ref.logp[t]
            kls[t] = (r.exp() * (r - lp)).sum(-1).clamp_min(0)
            agree[t] = (r.argmax(-1) == lp.argmax(-1)).double()
        if t in ref.points:
            keys = [s for s in sorted(kls) if s > t - window]
            kl = torch.cat([kls[s] for s in keys]).cpu()
            ag = torch.cat([agree[s] for s in keys]).cpu()
            kls.clear()
            agree.clear()
            out.append({"step": t, "kl_mean": float(kl.mean()), "kl_p99": float(torch.quantile(kl, 0.99)),
                        "top1": float(ag.mean()), "stack_graph": stepper.graphed})
    return out
