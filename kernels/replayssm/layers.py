"""Decode layers at real model dims: projections, causal conv, SSM op, gated norm, out-projection.

One token per sequence per step. Weights and activations are in the layer's ``dtype``
(bfloat16 by default; float64 for exact reference runs), the recurrent state in
``state_dtype``. Row b of a batch addresses sequence slot ``state_indices[b]``; a negative
index is a padded row: no state (conv or SSM) is read or written for it and its output is 0.

Mamba2DecodeLayer (Mamba-2 mixer as NemotronH uses it):
    zxbcdt = hidden @ W_in^T          -> z [H*P], xBC = [x [H*P], B [G*N], C [G*N]], dt [H]
    xBC    = silu(causal_conv1d_update(xBC; conv state [slots, H*P + 2*G*N, K-1], weight, bias))
    y      = SSM(x, dt, A, B, C, D, dt_bias, z)   gate y * silu(z) fused into the SSM op
    y      = RMSNorm_grouped(y) * w_norm          n_groups norm groups (norm_before_gate=False)
    out    = y @ W_out^T
GDNDecodeLayer (Gated DeltaNet as Qwen3.5 uses it):
    proj = hidden @ W_in^T            -> q [Hk*dk], k [Hk*dk], v [Hv*dv], z [Hv*dv], b [Hv], a [Hv]
    qkv  = silu(causal_conv1d_update(qkv; conv state [slots, 2*Hk*dk + Hv*dv, K-1], weight))
    g    = -exp(A_log) * softplus(a + dt_bias),   beta = sigmoid(b)     (float32)
    o    = GDN(q, k, v, g, beta)                  (q, k l2-normalised inside the op)
    o    = RMSNorm_per_head(o) * w_norm * silu(z)
    out  = o @ W_out^T

The SSM op is dispatched by ``backend``: 'reference' -> replayssm.reference, 'triton' ->
the public ops replayssm.mamba2 / replayssm.gdn (imported on first use). ``method`` picks
eager (state read + written every step) or ReplaySSM ('replay', 'replay-dual',
'replay-shared-low'); the replay methods keep a state container from replayssm.state.

For timing the SSM op alone inside the layer: ``inp = layer.ssm_inputs(h, idx)`` runs the
projection and conv once (it advances the conv state), then ``layer.ssm_only(inp, idx)``
is exactly the SSM call that ``step`` makes. ``step`` = ssm_inputs -> ssm_only -> finish.
``flush()`` folds every buffer into its checkpoint; ``ssm_state()`` returns the (flushed)
recurrent state of every slot; ``randomize_state(seed, fill_buffer)`` gives a deterministic
non-zero start (and, for benchmarks, random buffers with staggered cursors). Byte helpers:
weight_bytes, conv_state_bytes_per_seq, ssm_state_bytes_per_seq (checkpoint(s) + buffer),
activation_bytes_per_seq, non_ssm_step_bytes, matmul_flops.

Everything but the SSM op is plain PyTorch without host synchronisation, so a step is
CUDA-graph capturable whenever the SSM op is (the Triton backend). Padded rows' conv
windows go to a scratch slot (index ``slots``), so no data-dependent indexing is needed.

A layer built with ``dtype=torch.float64`` and backend 'reference' is the exact reference
of the whole step: with the same ``seed`` and initial state an eager and a replay layer
agree to ~1e-12 (they differ only in how the SSM output is computed).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import reference as R
from .common.backends import BACKENDS, check_backend
from .inputs import GDNShape, Mamba2Shape, mamba2_params, random_state
from .state import GDNReplayState, Mamba2ReplayState, dtype_of

METHOD_MODES = {"replay": "replay", "replay-dual": "dual", "replay-shared-low": "shared-low"}
METHODS = ("eager",) + tuple(METHOD_MODES)


def method_mode(method: str) -> str | None:
    """ReplaySSM precision mode of a method (None for eager). Raises ValueError."""
    if method == "eager":
        return None
    try:
        return METHOD_MODES[method]
    except KeyError:
        raise ValueError(f"unknown layer method {method!r}; allowed: {', '.join(METHODS)}") from None


def _elem_bytes(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class DecodeLayer:
    """Shared machinery: weights init, conv state + update, state init, padding, bytes.

    Subclasses define ``op``, ``WEIGHTS`` (parameter attribute names), ``_dims``, ``_init_weights``,
    ``ssm_inputs``, ``ssm_only``, ``finish`` and the per-sequence activation bytes.

    ``weights_from``: another layer of the same class and dims whose parameters this one
    shares instead of drawing its own (extra SSM-state copies for timing the SSM op alone).
    ``options``: the family's options (replayssm.mamba2.Mamba2Options / replayssm.gdn.GDNOptions)
    handed to the ops on the Triton backend (None: the shipped defaults)."""

    op = ""
    WEIGHTS: tuple[str, ...] = ()

    def __init__(self, hidden: int, dims, method: str = "eager", backend: str = "reference", batch: int = 1,
                 buffer_len: int = 16, flush_period: int | None = None, state_dtype="float32", lo_dtype=None,
                 device="cpu", *, dtype=torch.bfloat16, seed: int = 0, slots: int | None = None,
                 conv_kernel: int | None = None, eps: float | None = None, weights_from: "DecodeLayer | None" = None,
                 options=None):
        check_backend(backend)
        self.options = options
        self.hidden, self.dims, self.method, self.backend = hidden, dims, method, backend
        self.mode = method_mode(method)
        self.batch = batch
        self.slots = slots if slots is not None else batch
        if self.slots < batch:
            raise ValueError(f"slots ({self.slots}) must be >= batch ({batch})")
        self.buffer_len = buffer_len
        self.flush_period = flush_period if flush_period else buffer_len
        self.state_dtype = state_dtype
        self.lo_dtype = None if lo_dtype in (None, "none") else lo_dtype
        self.device = torch.device(device)
        self.dtype = dtype_of(dtype)
        self.cd = torch.float64 if self.dtype == torch.float64 else torch.float32   # compute dtype
        self.conv_kernel = conv_kernel if conv_kernel is not None else getattr(dims, "conv_kernel", 4)
        if self.conv_kernel < 2:
            raise ValueError(f"conv_kernel must be >= 2, got {self.conv_kernel}")
        self.seed = seed
        self._gen = torch.Generator(device=self.device).manual_seed(seed)
        self._ops = None
        if backend == "triton":     # lazy: the kernel modules load only when asked for
            self._ops = self._triton_module()
        self._dims(eps)
        if weights_from is None:
            self._init_weights()
        else:
            self._share_weights(weights_from)
        self._make_ssm_state()
        # compute-dtype copies of the small parameters the glue reads (saves a cast per step)
        self._conv_w_cd = self.conv_w.to(self.cd)
        self._conv_b_cd = None if self.conv_b is None else self.conv_b.to(self.cd)
        self._norm_w_cd = self.norm_w.to(self.cd)
        self._rows = torch.arange(self.slots, device=self.device)
        # last slot is scratch for padded rows (never read for a live row)
        self.conv_state = torch.zeros(self.slots + 1, self.conv_dim, self.conv_kernel - 1, dtype=self.dtype,
                                      device=self.device)

    # ------------------------------------------------------------------ construction helpers
    def _randn(self, *shape, std: float = 1.0) -> torch.Tensor:
        """Weights drawn in float32 on the layer's device (the same draws for every dtype)."""
        w = torch.randn(*shape, generator=self._gen, device=self.device, dtype=torch.float32)
        return (w * std).to(self.dtype)

    def _rand(self, *shape) -> torch.Tensor:
        return torch.rand(*shape, generator=self._gen, device=self.device, dtype=torch.float32)

    def _param_dtype(self) -> torch.dtype:
        """A, D, dt_bias, A_log are kept in float32 (float64 in exact runs)."""
        return self.cd

    def _triton_module(self):
        raise NotImplementedError

    def _dims(self, eps):
        raise NotImplementedError

    def _init_weights(self):
        raise NotImplementedError

    def _share_weights(self, other: "DecodeLayer") -> None:
        same = (type(other) is type(self) and other.hidden == self.hidden and other.dims == self.dims
                and other.conv_kernel == self.conv_kernel and other.dtype == self.dtype and other.device == self.device)
        if not same:
            raise ValueError("weights_from must be a layer of the same class, dims, dtype and device")
        for name in self.WEIGHTS:
            setattr(self, name, getattr(other, name))

    def _alloc_replay(self):
        raise NotImplementedError

    # ------------------------------------------------------------------ state
    @property
    def state_geometry(self) -> tuple[int, int, int]:
        """(heads, rows, cols) of one sequence's recurrent state."""
        raise NotImplementedError

    def _make_ssm_state(self) -> None:
        heads, rows, cols = self.state_geometry
        if self.mode is None:
            self.state = torch.zeros(self.slots, heads, rows, cols, dtype=dtype_of(self.state_dtype),
                                     device=self.device)
            self.rs = None
        else:
            self.state = None
            self.rs = self._alloc_replay()

    def set_state(self, ssm_state: torch.Tensor | None = None, conv_state: torch.Tensor | None = None) -> None:
        """Set every slot's state: ssm_state [slots, heads, rows, cols] (eager: the state;
        replay: the checkpoint(s), cursors to 0), conv_state [slots, conv_dim, K-1]."""
        if ssm_state is not None:
            if self.rs is None:
                self.state.copy_(ssm_state.to(self.state.dtype))
            else:
                self._triton_module().load_state(self.rs, ssm_state, self._rows)   # (plain tensor writes)
        if conv_state is not None:
            self.conv_state[:self.slots] = conv_state.to(self.dtype)

    def randomize_state(self, seed: int = 0, fill_buffer: bool = False, scale: float = 0.5) -> None:
        """Deterministic non-zero state from `seed` (the same for every method and dtype on one
        device). fill_buffer (replay only): random buffer rows and staggered cursors (slot i at
        cursor i mod K), as in serving and the benchmarks; an eager layer has no buffer, so
        then the two no longer hold the same sequence state."""
        g = torch.Generator(device=self.device).manual_seed(seed)
        heads, rows, cols = self.state_geometry
        s = random_state(self.slots, heads, rows, cols, torch.float32, self.device, g, scale)  # same draws at any dtype
        conv = torch.randn(self.slots, self.conv_dim, self.conv_kernel - 1, generator=g, device=self.device,
                           dtype=torch.float32)
        self.set_state(s, conv)
        if fill_buffer and self.rs is not None:
            self._fill_buffer(g)
            K = max(self.flush_period, 1)
            self.rs.cursor.copy_((self._rows % K).to(torch.int32))

    def flush(self) -> None:
        """Fold every sequence's buffered entries into its checkpoint (replay; no-op for eager)."""
        if self.rs is None:
            return
        if self._ops is None:
            self._ref_flush()
        else:
            self._ops_flush()

    def ssm_state(self) -> torch.Tensor:
        """Every slot's recurrent state [slots, heads, rows, cols] in compute dtype (replay:
        after a flush, from the high checkpoint)."""
        if self.rs is None:
            return self.state.to(self.cd)
        self.flush()
        return self.rs.hi.read(self._rows, self.cd)

    def _ref_flush(self):
        raise NotImplementedError

    def _ops_flush(self):
        raise NotImplementedError

    def _fill_buffer(self, g: torch.Generator) -> None:
        rnd = lambda t: torch.randn(t.shape, generator=g, device=self.device, dtype=torch.float32)  # noqa: E731
        for buf in self.rs.buffers():       # never time on zeros
            buf.copy_(rnd(buf) * 0.3)
        self._fill_buffer_gates(g)

    def _fill_buffer_gates(self, g) -> None:
        pass

    # ------------------------------------------------------------------ step pieces
    def _conv_update(self, xbc: torch.Tensor, state_indices) -> torch.Tensor:
        """Causal depthwise conv1d update of [b, conv_dim] over the conv state, then SiLU."""
        b = xbc.shape[0]
        if state_indices is None:
            slot = self._rows[:b]
        else:
            slot = torch.where(state_indices >= 0, state_indices, self.slots)
        win = torch.cat([self.conv_state[slot], xbc.unsqueeze(-1)], dim=-1)      # [b, C, K]
        self.conv_state[slot] = win[..., 1:]
        out = (win.to(self.cd) * self._conv_w_cd).sum(-1)
        if self._conv_b_cd is not None:
            out = out + self._conv_b_cd
        return F.silu(out).to(self.dtype)

    def _mask(self, out: torch.Tensor, state_indices) -> torch.Tensor:
        """Padded rows' outputs to 0 (in place; their hidden states may hold anything)."""
        if state_indices is None:
            return out
        return out.masked_fill_((state_indices < 0)[:, None], 0)

    def step(self, hidden_states: torch.Tensor, state_indices: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step: hidden_states [b, hidden] -> [b, hidden] (layer dtype)."""
        inp = self.ssm_inputs(hidden_states, state_indices)
        y = self.ssm_only(inp, state_indices)
        return self.finish(y, inp, state_indices)

    __call__ = step

    def ssm_inputs(self, hidden_states, state_indices=None) -> dict:
        """In-projection + conv update (+ gates): the SSM op's inputs (advances the conv state)."""
        raise NotImplementedError

    def ssm_only(self, inp: dict, state_indices=None) -> torch.Tensor:
        """The SSM op alone on inputs from ssm_inputs (updates the SSM state as step does)."""
        raise NotImplementedError

    def finish(self, y, inp: dict, state_indices=None) -> torch.Tensor:
        """Gated norm + out-projection of the SSM output."""
        raise NotImplementedError

    # ------------------------------------------------------------------ bytes
    def weights(self) -> list[torch.Tensor]:
        raise NotImplementedError

    def weight_bytes(self) -> int:
        """Bytes of every parameter the step reads (projections, conv, norm, A/D/dt_bias)."""
        return _nbytes(*self.weights())

    def conv_state_bytes_per_seq(self) -> int:
        return self.conv_dim * (self.conv_kernel - 1) * _elem_bytes(self.dtype)

    def ssm_checkpoint_bytes_per_seq(self) -> int:
        """Recurrent-state bytes one sequence holds (eager: the state; replay: the
        checkpoint, both copies in dual mode, fp8 scales included)."""
        if self.rs is None:
            return self.state[0].numel() * self.state.element_size()
        return self.rs.state_bytes_per_slot()

    def ssm_buffer_bytes_per_seq(self) -> int:
        return 0 if self.rs is None else self.rs.buffer_bytes_per_slot()

    def ssm_state_bytes_per_seq(self) -> int:
        """All SSM memory one sequence holds: checkpoint(s) + input buffer (eager: the state)."""
        return self.ssm_checkpoint_bytes_per_seq() + self.ssm_buffer_bytes_per_seq()

    def activation_bytes_per_seq(self) -> int:
        """Activation bytes the non-SSM stages read and write per sequence and step, unfused:
        every stage reads its inputs and writes its outputs once. The SSM op's own inputs
        and outputs are not included (the traffic model of the op counts them)."""
        raise NotImplementedError

    def non_ssm_step_bytes(self, batch: int | None = None) -> dict:
        """Modelled bytes of one step outside the SSM op, whole batch: weights read once,
        conv state read + written, activations."""
        b = self.batch if batch is None else batch
        return {"weights": self.weight_bytes(), "conv_state": 2 * b * self.conv_state_bytes_per_seq(),
                "activations": b * self.activation_bytes_per_seq()}

    def matmul_flops(self, batch: int | None = None) -> int:
        """FLOPs of the two projections for a batch."""
        b = self.batch if batch is None else batch
        return 2 * b * self.hidden * (self.d_proj + self.d_inner)


# ============================================================================ Mamba-2
class Mamba2DecodeLayer(DecodeLayer):
    """Mamba-2 decode layer. dims: nheads, head_dim, d_state, n_groups (+ conv_kernel);
    replayssm.inputs.Mamba2Shape or any object with those attributes."""

    op = "mamba2"

    def _triton_module(self):
        from . import mamba2
        return mamba2

    WEIGHTS = ("w_in", "conv_w", "conv_b", "norm_w", "w_out", "A", "D", "dt_bias")

    def _dims(self, eps):
        d = self.dims
        H, P, N, G = d.nheads, d.head_dim, d.d_state, d.n_groups
        if H % G:
            raise ValueError(f"nheads ({H}) must be a multiple of n_groups ({G})")
        self.H, self.P, self.N, self.G = H, P, N, G
        self.eps = 1e-5 if eps is None else eps
        self.d_inner = H * P
        self.conv_dim = H * P + 2 * G * N
        self.d_proj = 2 * H * P + 2 * G * N + H

    def _init_weights(self):
        hid, H, P, N, G = self.hidden, self.H, self.P, self.N, self.G
        w_in = self._randn(self.d_proj, hid, std=hid ** -0.5)
        w_in[-H:] *= 0.5                     # dt_raw ~ N(0, 1/4), as replayssm.inputs draws it
        self.w_in = w_in
        self.conv_w = self._randn(self.conv_dim, self.conv_kernel, std=self.conv_kernel ** -0.5)
        self.conv_b = self._randn(self.conv_dim, std=0.1)
        self.norm_w = (1 + 0.1 * self._randn(self.d_inner).to(torch.float32)).to(self.dtype)
        self.w_out = self._randn(hid, self.d_inner, std=self.d_inner ** -0.5)
        p = mamba2_params(Mamba2Shape(H, P, N, G), device=self.device, dtype=torch.float64,
                          gen=torch.Generator().manual_seed(self.seed + 1))
        self.A, self.D, self.dt_bias = (p[k].to(self._param_dtype()) for k in ("A", "D", "dt_bias"))

    @property
    def state_geometry(self):
        return self.H, self.P, self.N

    def _alloc_replay(self):
        return Mamba2ReplayState.allocate(self.slots, self.H, self.P, self.N, self.G, self.buffer_len,
                                          self.flush_period, self.mode, self.state_dtype, self.lo_dtype,
                                          self.dtype, self.device)

    def _ref_flush(self):
        R.mamba2_flush(self.rs, self.A)

    def _ops_flush(self):
        self._ops.flush(self.rs, A=self.A, backend=self.backend, options=self.options)

    def _fill_buffer_gates(self, g):
        self.rs.dt.copy_(0.01 + 0.2 * torch.rand(self.rs.dt.shape, generator=g, device=self.device))

    def weights(self):
        return [getattr(self, n) for n in self.WEIGHTS]

    def ssm_inputs(self, hidden_states, state_indices=None) -> dict:
        b = hidden_states.shape[0]
        H, P, N, G, HP = self.H, self.P, self.N, self.G, self.d_inner
        zxbcdt = F.linear(hidden_states.to(self.dtype), self.w_in)                 # [b, d_proj]
        xbc = self._conv_update(zxbcdt[:, HP:HP + self.conv_dim], state_indices)  # [b, conv_dim]
        return {"x": xbc[:, :HP].view(b, H, P),
                "B": xbc[:, HP:HP + G * N].view(b, G, N),
                "C": xbc[:, HP + G * N:].view(b, G, N),
                "dt": zxbcdt[:, HP + self.conv_dim:],
                "z": zxbcdt[:, :HP].view(b, H, P)}

    def ssm_only(self, inp, state_indices=None):
        args = dict(x=inp["x"], dt=inp["dt"], A=self.A, B=inp["B"], C=inp["C"], D=self.D, dt_bias=self.dt_bias,
                    z=inp["z"], state_indices=state_indices)
        if self._ops is None:
            if self.rs is None:
                return R.mamba2_eager_step(self.state, **args)
            return R.mamba2_replay_step(self.rs, **args)
        if self.rs is None:
            return self._ops.eager_step(self.state, **args, backend=self.backend, options=self.options)
        return self._ops.replay_step(self.rs, **args, backend=self.backend, options=self.options)

    def finish(self, y, inp, state_indices=None):
        b = y.shape[0]
        yg = y.reshape(b, self.G, self.d_inner // self.G).to(self.cd)          # already gated by silu(z)
        yg = yg * torch.rsqrt(yg.pow(2).mean(-1, keepdim=True) + self.eps)
        yn = (yg.reshape(b, self.d_inner) * self._norm_w_cd).to(self.dtype)
        return self._mask(F.linear(yn, self.w_out), state_indices)

    def activation_bytes_per_seq(self) -> int:
        e = _elem_bytes(self.dtype)
        in_proj = self.hidden + self.d_proj            # read hidden, write zxbcdt
        conv = 2 * self.conv_dim                       # read xBC, write conv output
        norm = 2 * self.d_inner                        # read y, write normalised y
        out_proj = self.d_inner + self.hidden          # read normalised y, write output
        return e * (in_proj + conv + norm + out_proj)


# ============================================================================ GDN
class GDNDecodeLayer(DecodeLayer):
    """Gated DeltaNet decode layer. dims: num_k_heads, num_v_heads, head_k_dim, head_v_dim
    (+ conv_kernel); replayssm.inputs.GDNShape or any object with those attributes."""

    op = "gdn"

    def _triton_module(self):
        from . import gdn
        return gdn

    WEIGHTS = ("w_in", "conv_w", "conv_b", "norm_w", "w_out", "A_log", "dt_bias")

    def _dims(self, eps):
        d = self.dims
        Hk, Hv, dk, dv = d.num_k_heads, d.num_v_heads, d.head_k_dim, d.head_v_dim
        if Hv % Hk:
            raise ValueError(f"num_v_heads ({Hv}) must be a multiple of num_k_heads ({Hk})")
        self.Hk, self.Hv, self.dk, self.dv = Hk, Hv, dk, dv
        self.eps = 1e-6 if eps is None else eps
        self.d_inner = Hv * dv
        self.conv_dim = 2 * Hk * dk + Hv * dv
        self.d_proj = 2 * Hk * dk + 2 * Hv * dv + 2 * Hv

    def _init_weights(self):
        hid, Hv, dv = self.hidden, self.Hv, self.dv
        self.w_in = self._randn(self.d_proj, hid, std=hid ** -0.5)
        self.conv_w = self._randn(self.conv_dim, self.conv_kernel, std=self.conv_kernel ** -0.5)
        self.conv_b = None                      # Qwen3.5's GDN conv has no bias
        self.norm_w = (1 + 0.1 * self._randn(dv).to(torch.float32)).to(self.dtype)
        self.w_out = self._randn(hid, self.d_inner, std=self.d_inner ** -0.5)
        # decode-like gates: exp(A_log) in [0.02, 0.2], dt_bias in [-1, 0] -> alpha ~ 0.87..0.99
        self.A_log = torch.log(0.02 + 0.18 * self._rand(Hv)).to(self._param_dtype())
        self.dt_bias = (-self._rand(Hv)).to(self._param_dtype())

    @property
    def state_geometry(self):
        return self.Hv, self.dv, self.dk

    def _alloc_replay(self):
        return GDNReplayState.allocate(self.slots, self.Hk, self.Hv, self.dk, self.dv, self.buffer_len,
                                       self.flush_period, self.mode, self.state_dtype, self.lo_dtype, self.dtype,
                                       self.device)

    def _ref_flush(self):
        R.gdn_flush(self.rs)

    def _ops_flush(self):
        self._ops.flush(self.rs, backend=self.backend, options=self.options)

    def _fill_buffer_gates(self, g):
        uni = lambda t: torch.rand(t.shape, generator=g, device=self.device)  # noqa: E731
        self.rs.g.copy_(torch.log(0.9 + 0.1 * uni(self.rs.g)))
        if self.rs.beta is not None:
            self.rs.beta.copy_(0.05 + 0.9 * uni(self.rs.beta))

    def weights(self):
        return [getattr(self, n) for n in self.WEIGHTS]

    def ssm_inputs(self, hidden_states, state_indices=None) -> dict:
        b = hidden_states.shape[0]
        Hk, Hv, dk, dv = self.Hk, self.Hv, self.dk, self.dv
        qk, vd = Hk * dk, Hv * dv
        proj = F.linear(hidden_states.to(self.dtype), self.w_in)                   # [b, d_proj]
        qkv = self._conv_update(proj[:, :self.conv_dim], state_indices)
        o = self.conv_dim
        z, braw, araw = proj[:, o:o + vd], proj[:, o + vd:o + vd + Hv], proj[:, o + vd + Hv:]
        g = -torch.exp(self.A_log) * R.softplus(araw.to(self.cd) + self.dt_bias)
        beta = torch.sigmoid(braw.to(self.cd))
        return {"q": qkv[:, :qk].view(b, Hk, dk), "k": qkv[:, qk:2 * qk].view(b, Hk, dk),
                "v": qkv[:, 2 * qk:].view(b, Hv, dv), "g": g, "beta": beta, "z": z.view(b, Hv, dv)}

    def ssm_only(self, inp, state_indices=None):
        args = dict(q=inp["q"], k=inp["k"], v=inp["v"], g=inp["g"], beta=inp["beta"], state_indices=state_indices)
        if self._ops is None:
            if self.rs is None:
                return R.gdn_eager_step(self.state, **args)
            return R.gdn_replay_step(self.rs, **args)
        if self.rs is None:
            return self._ops.eager_step(self.state, **args, backend=self.backend, options=self.options)
        return self._ops.replay_step(self.rs, **args, backend=self.backend, options=self.options)

    def finish(self, o, inp, state_indices=None):
        b = o.shape[0]
        of = o.to(self.cd)
        of = of * torch.rsqrt(of.pow(2).mean(-1, keepdim=True) + self.eps) * self._norm_w_cd
        of = of * F.silu(inp["z"].to(self.cd))
        return self._mask(F.linear(of.reshape(b, self.d_inner).to(self.dtype), self.w_out), state_indices)

    def activation_bytes_per_seq(self) -> int:
        e = _elem_bytes(self.dtype)
        in_proj = (self.hidden + self.d_proj) * e      # read hidden, write q k v z b a
        conv = 2 * self.conv_dim * e                   # read qkv, write conv output
        gates = 2 * self.Hv * e + 2 * self.Hv * _elem_bytes(self.cd)   # read a, b; write g, beta
        norm = 3 * self.d_inner * e                    # read o and z, write gated norm
        out_proj = (self.d_inner + self.hidden) * e    # read normed o, write output
        return in_proj + conv + gates + norm + out_proj


def decode_layer(op: str, hidden: int, dims, **kw) -> DecodeLayer:
    """Mamba2DecodeLayer or GDNDecodeLayer by op name ('mamba2' | 'gdn')."""
    if op == "mamba2":
        return Mamba2DecodeLayer(hidden, dims, **kw)
    if op == "gdn":
        return GDNDecodeLayer(hidden, dims, **kw)
    raise ValueError(f"unknown op {op!r}; allowed: mamba2, gdn")


__all__ = ["DecodeLayer", "Mamba2DecodeLayer", "GDNDecodeLayer", "decode_layer", "method_mode", "METHODS",
           "BACKENDS", "Mamba2Shape", "GDNShape"]
