"""Peers: vLLM 0.26.0's own SSM decode kernels, called exactly as vLLM's model layers call them.

DESIGN.md §4 "Call peers as they are served". Each adapter holds one layer's recurrent state
in vLLM's layout and takes the suite's own inputs (replayssm.inputs dicts, our int32 batch
index with negative = padding), translating them once (cached) into the tensors vLLM's layer
hands its kernel. What is called, as of the vLLM 0.26.0 wheel (paths under vllm/):

Mamba-2 (model_executor/layers/mamba/mamba_mixer2.py:957-1046, MambaMixer2 decode branch)
    model_executor/layers/mamba/ops/mamba_ssm.py:selective_state_update (Triton; the default
    'triton' backend of ops/ssu_dispatch.py, which forwards these arguments unchanged with
    enable_stochastic_rounding=False), called as
        selective_state_update(ssm_state, x[b,H,P], dt_d, A_d, B[b,G,N], C[b,G,N], D_d, dt_bias_d,
            dt_softplus=True, state_batch_indices=idx, dst_state_batch_indices=idx,
            out=out[b,H,P], num_accepted_tokens=..., cu_seqlens=..., is_blackwell=...)
    with the *tied* per-head parameters (stride 0 across head_dim / d_state), mamba_mixer2.py:1010-1018:
        A_d = A[:, None, None].expand(-1, P, N).float()     A is an fp32 parameter (l.449-453)
        dt_d = dt[:, :, None].expand(-1, -1, P)              dt: the in-projection slice, model dtype
        dt_bias_d = dt_bias[:, None].expand(-1, P)           D_d = D[:, None].expand(-1, P)
    so the kernel takes its TIE_HDIM fast path (mamba_ssm.py:627-632). z is NOT passed: the
    gate is applied later by the gated RMSNorm (mamba_mixer2.py:564). State [slots, H, P, N];
    slot 0 is the null block (NULL_BLOCK_ID = 0, v1/attention/backends/utils.py:46): padded
    rows carry it and are neither read nor written (their output is still written, garbage).
    Indices are int32 [b, 1] without speculation ([b, 1 + num_spec] with it; mamba_attn.py:146-151).
    Speculative decode (mamba_cache_mode 'none'): each request owns 1+num_spec slots (one
    block-table row, mamba_attn.py:481-489); x/dt/B/C/out are token-major [b*(1+S), ...],
    cu_seqlens = query_start_loc_d [b+1], num_accepted_tokens [b] (int32, last step's count incl.
    the bonus token); the kernel reads the initial state from column num_accepted-1 and writes
    the state after token t to column t (mamba_ssm.py:331-356, 435-447). Padded requests: NULL
    indices, num_accepted = 1 (mamba_attn.py:586-597).

GDN (Qwen3-Next / Qwen3.5: model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py)
    decode-only batches without speculation, the CUDA default (VLLM_ENABLE_FLA_PACKED_RECURRENT_DECODE=1,
    envs.py:1163): _forward_core (l.1206-1217) -> _forward_core_decode_non_spec (l.1564-1609) ->
    third_party/flash_linear_attention/ops/fused_recurrent.py:fused_recurrent_gated_delta_rule_packed_decode(
        mixed_qkv=[b, 2*Hk*dk + Hv*dv] (q | k | v packed per token), a=[b,Hv], b=[b,Hv],
        A_log=[Hv] fp32, dt_bias=[Hv], scale=dk**-0.5, initial_state=ssm_state,
        out=[b,1,Hv,dv], ssm_state_indices=int32 [b], use_qk_l2norm_in_kernel=True)
    mixed prefill/decode batches: ops/fused_sigmoid_gating.py:fused_sigmoid_gating_delta_rule_update(
        A_log, a, b, dt_bias, q=[1,b,Hk,dk], k, v=[1,b,Hv,dv], initial_state=ssm_state,
        inplace_final_state=True, cu_seqlens=[b+1], ssm_state_indices=[b], use_qk_l2norm_in_kernel=True)
    (qwen_gdn_linear_attn.py:1400-1420, 1460-1480); speculative decode: the same with
    ssm_state_indices = spec_state_indices_tensor [b, 1+S] and num_accepted_tokens
    (l.1375-1395; v1/attention/backends/gdn_attn.py:251-271), same slot semantics as Mamba-2.
    Gating in-kernel: g = -exp(A_log) * softplus(a + dt_bias) (threshold 20), beta = sigmoid(b)
    (the packed kernel rounds beta to b's dtype). State [slots, Hv, dv, dk] (o = S q), the same
    layout as our reference; slot index <= 0 = skipped (packed: output 0; sigmoid: not written).

Gating for GDN: our inputs carry g (log alpha) and beta; the adapter owns random A_log (fp32)
and dt_bias (model dtype) and *inverts* vLLM's gating to raw a/b in the model dtype
(gdn_raw_gating), then recomputes the g/beta the kernel will really use from those stored raw
values (gdn_effective_gating); the correctness check feeds *those* to our reference.

Differences from a served layer, all in vLLM's favour or neutral: slots are dense (served
ssm_state is a strided view into per-layer pages that also hold the conv state, stride(0) =
page bytes; pass slot_stride to mimic); x/B/C are contiguous (served: strided views of the conv
output); Mamba-2 runs without z unless gate=True (our eager kernel fuses the gate: it reads z).

The adapters never import vLLM at module import time; vllm_available() says whether they can run.
"""
from __future__ import annotations

import functools
import importlib.util

import torch

from replayssm import reference as R
from replayssm.state import dtype_of

from ..methods import METHODS, names
from . import SkipCase
from .common import layers_for, state_geometry, step_inputs, steps_per_sample

VLLM_VERSION = "0.26.0"          # the version whose calling conventions this file follows
NULL_BLOCK_ID = 0                # vllm/v1/attention/backends/utils.py:46
SOFTPLUS_THRESHOLD = 20.0
GDN_KERNELS = ("packed", "sigmoid")
STATE_DTYPES = ("float32", "bfloat16", "float16")
CHECK_TOL = {"float32": 2e-2, "bfloat16": 3e-2, "float16": 3e-2}


# ----------------------------------------------------------------------------- vLLM import
@functools.cache
def _import_kernels() -> dict:
    from vllm.model_executor.layers.mamba.ops.mamba_ssm import selective_state_update
    from vllm.third_party.flash_linear_attention.ops import (fused_recurrent_gated_delta_rule_packed_decode,
                                                             fused_sigmoid_gating_delta_rule_update)
    return {"ssu": selective_state_update, "packed": fused_recurrent_gated_delta_rule_packed_decode,
            "sigmoid": fused_sigmoid_gating_delta_rule_update}


def _kernels() -> dict:
    """vLLM's kernel functions by role (tests replace this function with emulations)."""
    return _import_kernels()


def vllm_available() -> bool:
    """True if vLLM's decode kernels can be imported here (never raises)."""
    if importlib.util.find_spec("vllm") is None:
        return False
    try:
        _import_kernels()
    except Exception:  # noqa: BLE001 - any import failure means 'not available'
        return False
    return True


def vllm_version() -> str | None:
    try:
        from importlib.metadata import version
        return version("vllm")
    except Exception:  # noqa: BLE001
        return None


# ----------------------------------------------------------------------------- pure translation
def slot_table(idx: torch.Tensor, per_row: int) -> torch.Tensor:
    """vLLM state indices for our batch rows, int32 [b, per_row], contiguous.

    Row b with idx[b] >= 0 owns slots 1 + idx[b] * per_row + j (slot 0 is vLLM's null block);
    a padded row (idx < 0) gets NULL_BLOCK_ID in every column, as vLLM pads its batches.
    """
    i = idx.to(torch.int64)
    tbl = 1 + i[:, None] * per_row + torch.arange(per_row, device=idx.device)
    tbl = torch.where(i[:, None] >= 0, tbl, torch.full_like(tbl, NULL_BLOCK_ID))
    return tbl.to(torch.int32).contiguous()


def reference_slots(tbl: torch.Tensor) -> torch.Tensor:
    """vLLM indices -> our reference's convention (int64, NULL -> -1)."""
    t = tbl.to(torch.int64)
    return torch.where(t == NULL_BLOCK_ID, torch.full_like(t, -1), t)


def mamba2_tied_params(A, D, dt_bias, head_dim: int, d_state: int, param_dtype=torch.bfloat16):
    """(A_d, D_d, dt_bias_d) as MambaMixer2 builds them for decode: per-head values expanded with
    stride 0 across head_dim (and d_state for A). A is fp32 (vLLM keeps it fp32), D and dt_bias
    are in the model dtype (vLLM creates them under the model's default dtype)."""
    A_d = A.to(torch.float32)[:, None, None].expand(-1, head_dim, d_state)
    D_d = D.to(param_dtype)[:, None].expand(-1, head_dim)
    dt_bias_d = dt_bias.to(param_dtype)[:, None].expand(-1, head_dim)
    return A_d, D_d, dt_bias_d


def mamba2_tied_dt(dt: torch.Tensor, head_dim: int, act_dtype=torch.bfloat16) -> torch.Tensor:
    """dt [tokens, H] (raw, model dtype) -> [tokens, H, P] with stride 0 on P (mamba_mixer2.py:1016)."""
    return dt.to(act_dtype)[:, :, None].expand(-1, -1, head_dim)


def is_tied(A_d, dt_d, dt_bias_d) -> bool:
    """selective_state_update's TIE_HDIM predicate (mamba_ssm.py:627-632)."""
    return A_d.stride(-1) == 0 and A_d.stride(-2) == 0 and dt_d.stride(-1) == 0 and dt_bias_d.stride(-1) == 0


def softplus_inverse(y: torch.Tensor) -> torch.Tensor:
    """x with softplus(x) = y (y > 0), stable for small y."""
    return y + torch.log(-torch.expm1(-y))


def gdn_raw_gating(g, beta, A_log, dt_bias, dtype=torch.bfloat16):
    """Raw gate inputs (a, b) in `dtype` for which vLLM's in-kernel gating
    g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b) reproduces our g (< 0) and beta
    up to the rounding of a and b to `dtype` (use gdn_effective_gating for the exact values)."""
    y = (-g.double() * torch.exp(-A_log.double())).clamp_min(1e-30)
    a = softplus_inverse(y) - dt_bias.double()
    bd = beta.double().clamp(1e-6, 1 - 1e-6)
    b = torch.log(bd) - torch.log1p(-bd)
    return a.to(dtype), b.to(dtype)


def gdn_effective_gating(A_log, a, dt_bias, b, kernel: str = "packed"):
    """(g, beta) in float64 exactly as vLLM's kernel derives them from the stored raw inputs."""
    x = a.double() + dt_bias.double()
    sp = torch.where(x <= SOFTPLUS_THRESHOLD, torch.log1p(torch.exp(x.clamp(max=SOFTPLUS_THRESHOLD))), x)
    g = -torch.exp(A_log.double()) * sp
    beta = torch.sigmoid(b.double())
    if kernel == "packed":   # fused_recurrent.py:320: sigmoid(b).to(b.dtype)
        beta = beta.to(b.dtype).double()
    return g, beta


def pack_qkv(q, k, v, out: torch.Tensor) -> torch.Tensor:
    """Write q [n,Hk,dk], k, v [n,Hv,dv] into vLLM's packed mixed_qkv rows [n, 2*Hk*dk + Hv*dv]."""
    n, qd, vd = q.shape[0], q[0].numel(), v[0].numel()
    out[:, :qd].view(n, *q.shape[1:]).copy_(q)
    out[:, qd:2 * qd].view(n, *k.shape[1:]).copy_(k)
    out[:, 2 * qd:2 * qd + vd].view(n, *v.shape[1:]).copy_(v)
    return out


class _Memo:
    """Identity-keyed memo of one translation: a hit while every source is the same object at the
    same version counter. Sources are held, so their memory cannot be reused by another tensor
    while the memo stands. In-place changes to a source re-translate on the next eager call; a
    captured CUDA graph replays whatever translation was current at capture (none on a hit)."""

    def __init__(self):
        self.src, self.ver, self.val = None, None, None

    def get(self, srcs: tuple, build):
        ver = tuple(t._version if isinstance(t, torch.Tensor) else None for t in srcs)
        if (self.src is not None and len(srcs) == len(self.src) and ver == self.ver
                and all(a is b for a, b in zip(srcs, self.src))):
            return self.val
        self.val = build()
        self.src, self.ver = tuple(srcs), ver
        return self.val


def _geometry(op, dims):
    """(heads, rows, cols) of one slot's state in vLLM's layout (== ours)."""
    rows, cols, heads = state_geometry(op, dims)
    return heads, rows, cols


def _dev_generator(device, gen):
    seed = int(torch.randint(0, 2 ** 62, (1,), generator=gen))
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


# ----------------------------------------------------------------------------- layers
class VllmEagerLayer:
    """One SSM layer's decode step through vLLM's own kernel, as vLLM's layer calls it.

    op 'mamba2' | 'gdn'; dims replayssm.inputs.Mamba2Shape | GDNShape; state_dtype 'float32'|'bfloat16'|'float16'
    (vLLM's mamba_ssm_cache_dtype); act_dtype: the model dtype (activations, D, dt_bias, a/b).
    gdn_kernel: 'packed' (vLLM's default decode-only path) or 'sigmoid' (its mixed-batch path).
    gate (Mamba-2 only): pass z into the kernel (vLLM does not; for like-for-like with a
    z-fused kernel). slot_stride: elements between slots (default dense) to mimic vLLM's pages.

    state: [1 + batch*T, heads, rows, cols]; slot 0 is the null block; row i of our batch
    (idx[i] = s >= 0) owns slots 1 + s*T .. 1 + s*T + T-1 (T = 1 here).
    """

    spec = False

    def __init__(self, op, dims, batch, state_dtype, device, gen=None, act_dtype=torch.bfloat16,
                 gdn_kernel="packed", gate=False, slot_stride=None, T: int = 1):
        if isinstance(state_dtype, str) and state_dtype not in STATE_DTYPES:
            raise ValueError(f"vLLM peer state_dtype {state_dtype!r} not supported; allowed: {', '.join(STATE_DTYPES)}")
        if gdn_kernel not in GDN_KERNELS:
            raise ValueError(f"gdn_kernel {gdn_kernel!r}; allowed: {', '.join(GDN_KERNELS)}")
        if self.spec and op == "gdn":
            gdn_kernel = "sigmoid"        # vLLM's only speculative GDN decode kernel
        gen = gen if gen is not None else torch.Generator().manual_seed(0)
        self.op, self.dims, self.batch, self.T = op, dims, int(batch), int(T)
        self.device = torch.device(device)
        self.state_dtype, self.act_dtype = dtype_of(state_dtype), act_dtype
        self.gdn_kernel, self.gate = gdn_kernel, bool(gate) and op == "mamba2"
        k = _kernels()
        self._ssu, self._packed, self._sigmoid = k["ssu"], k["packed"], k["sigmoid"]
        self.is_blackwell = (self.device.type == "cuda"
                             and torch.cuda.get_device_capability(self.device)[0] == 10)
        heads, rows, cols = _geometry(op, dims)
        nslots = 1 + self.batch * self.T
        per = heads * rows * cols
        stride = per if slot_stride is None else int(slot_stride)
        if stride < per:
            raise ValueError(f"slot_stride {stride} < state elements per slot {per}")
        dg = _dev_generator(self.device, gen)
        raw = (torch.randn(nslots * stride, generator=dg, device=self.device, dtype=torch.float32) * 0.5)
        self._raw = raw.to(self.state_dtype)          # never zeros: random, like our runner's state
        self.state = torch.as_strided(self._raw, (nslots, heads, rows, cols), (stride, rows * cols, cols, 1))
        n = self.batch * self.T                        # tokens per step
        # vLLM's per-step metadata (built once per forward by its metadata builder, not per layer)
        self.cu_seqlens = torch.arange(0, (self.batch + 1) * self.T, self.T, dtype=torch.int32,
                                       device=self.device) if (self.spec or gdn_kernel == "sigmoid") else None
        self.accepted = None
        if self.spec:
            self.accepted = ((torch.arange(self.batch, device=self.device) % self.T) + 1).to(torch.int32)
        if op == "mamba2":
            self.out = torch.empty(n, dims.nheads, dims.head_dim, dtype=act_dtype, device=self.device)
        else:
            Hk, Hv, dk, dv = dims.num_k_heads, dims.num_v_heads, dims.head_k_dim, dims.head_v_dim
            self.scale = dk ** -0.5
            r = lambda *s: torch.rand(*s, generator=gen, dtype=torch.float64)  # noqa: E731
            # layer parameters: A_log fp32 (qwen_gdn_linear_attn.py:442-447), dt_bias model dtype
            self.A_log = torch.log(0.5 + 3.5 * r(Hv)).to(device=self.device, dtype=torch.float32)
            self.dt_bias = (2 * r(Hv) - 1).to(device=self.device, dtype=act_dtype)
            self.a_buf = torch.empty(n, Hv, dtype=act_dtype, device=self.device)
            self.b_buf = torch.empty(n, Hv, dtype=act_dtype, device=self.device)
            if gdn_kernel == "packed":
                self.mixed = torch.empty(n, 2 * Hk * dk + Hv * dv, dtype=act_dtype, device=self.device)
                self.out = torch.zeros(n, 1, Hv, dv, dtype=act_dtype, device=self.device)
        self._m_idx, self._m_par, self._m_inp, self._m_gate = _Memo(), _Memo(), _Memo(), _Memo()

    # -- translation (memoised: a step after the first with the same tensors allocates nothing)
    def _slots(self, idx):
        def build():
            i = torch.arange(self.batch, dtype=torch.int32, device=self.device) if idx is None else idx
            if i.shape != (self.batch,):
                raise ValueError(f"idx must have shape ({self.batch},), got {tuple(i.shape)}")
            if int(i.max()) >= self.batch:
                raise ValueError(f"idx addresses slot {int(i.max())} but the layer holds {self.batch}")
            tbl = slot_table(i.to(self.device), self.T)
            return tbl, tbl[:, 0]        # [b, T] (2-D, vLLM's state_indices) and [b] (GDN non-spec)
        return self._m_idx.get((idx,), build)

    def _mamba2_params(self, params):
        d = self.dims
        return self._m_par.get((params["A"], params["D"], params["dt_bias"]), lambda: mamba2_tied_params(
            params["A"], params["D"], params["dt_bias"], d.head_dim, d.d_state, self.act_dtype))

    def _mamba2_inputs(self, inp):
        d, n = self.dims, self.batch * self.T
        z = inp.get("z") if self.gate else None

        def build():
            x = inp["x"].reshape(n, d.nheads, d.head_dim)
            dt = mamba2_tied_dt(inp["dt"].reshape(n, d.nheads), d.head_dim, self.act_dtype)
            B = inp["B"].reshape(n, d.n_groups, d.d_state)
            C = inp["C"].reshape(n, d.n_groups, d.d_state)
            return x, dt, B, C, (z.reshape(n, d.nheads, d.head_dim) if z is not None else None)
        return self._m_inp.get((inp["x"], inp["dt"], inp["B"], inp["C"], z), build)

    def _gdn_gating(self, inp):
        n, Hv = self.batch * self.T, self.dims.num_v_heads

        def build():
            a, b = gdn_raw_gating(inp["g"].reshape(n, Hv), inp["beta"].reshape(n, Hv), self.A_log, self.dt_bias,
                                  self.act_dtype)
            self.a_buf.copy_(a)
            self.b_buf.copy_(b)
            return self.a_buf, self.b_buf
        return self._m_gate.get((inp["g"], inp["beta"]), build)

    def _gdn_inputs(self, inp):
        d, n = self.dims, self.batch * self.T

        def build():
            q = inp["q"].reshape(n, d.num_k_heads, d.head_k_dim)
            k = inp["k"].reshape(n, d.num_k_heads, d.head_k_dim)
            v = inp["v"].reshape(n, d.num_v_heads, d.head_v_dim)
            if self.gdn_kernel == "packed":
                return (pack_qkv(q.to(self.act_dtype), k.to(self.act_dtype), v.to(self.act_dtype), self.mixed),)
            # vLLM's rearrange_mixed_qkv hands the kernel contiguous [1, tokens, heads, dim]
            return tuple(t.to(self.act_dtype).contiguous()[None] for t in (q, k, v))
        return self._m_inp.get((inp["q"], inp["k"], inp["v"]), build)

    # -- the step
    def step(self, inp: dict, params: dict | None = None, idx: torch.Tensor | None = None) -> torch.Tensor:
        """One decode step (T tokens per row for the speculative layer) on our inputs; returns the
        kernel's output [b, H, P] / [b, Hv, dv] ([b, T, ...] when speculative). Rows of padding
        (idx < 0) hold whatever vLLM leaves there."""
        tbl, ind = self._slots(idx)
        spec = {"num_accepted_tokens": self.accepted, "cu_seqlens": self.cu_seqlens} if self.spec else {}
        if self.op == "mamba2":
            A_d, D_d, dtb_d = self._mamba2_params(params)
            x, dt, B, C, z = self._mamba2_inputs(inp)
            self._ssu(self.state, x, dt, A_d, B, C, D=D_d, z=z, dt_bias=dtb_d, dt_softplus=True,
                      state_batch_indices=tbl, dst_state_batch_indices=tbl, out=self.out,
                      is_blackwell=self.is_blackwell, **spec)
            return self.out.view(self.batch, self.T, *self.out.shape[1:]) if self.spec else self.out
        a, b = self._gdn_gating(inp)
        if self.gdn_kernel == "packed":
            (mixed,) = self._gdn_inputs(inp)
            self._packed(mixed_qkv=mixed, a=a, b=b, A_log=self.A_log, dt_bias=self.dt_bias, scale=self.scale,
                         initial_state=self.state, out=self.out, ssm_state_indices=ind,
                         use_qk_l2norm_in_kernel=True)
            return self.out[:, 0]
        q, k, v = self._gdn_inputs(inp)
        o, _ = self._sigmoid(A_log=self.A_log, a=a, b=b, dt_bias=self.dt_bias, q=q, k=k, v=v,
                             initial_state=self.state, inplace_final_state=True, cu_seqlens=self.cu_seqlens,
                             ssm_state_indices=tbl if self.spec else ind, use_qk_l2norm_in_kernel=True, **(
                                 {"num_accepted_tokens": self.accepted} if self.spec else {}))
        o = o[0]
        return o.view(self.batch, self.T, *o.shape[1:]) if self.spec else o

    __call__ = step

    # -- for the suite and the check
    def random_inputs(self, gen=None):
        """Our-format (inputs, params) for this layer's shape ([b, T, ...] when speculative)."""
        T = self.T if self.spec else None
        return step_inputs(self.op, self.dims, self.batch, self.device, gen, T=T, act=self.act_dtype)

    def reference_inputs(self, inp: dict, params: dict | None = None) -> tuple[dict, dict]:
        """Our-format (inputs, params) holding exactly the values vLLM's kernel sees (dt, D,
        dt_bias rounded to the model dtype; no z unless gated; GDN: the effective g/beta)."""
        if self.op == "mamba2":
            ri = {"x": inp["x"], "dt": inp["dt"].to(self.act_dtype).float(), "B": inp["B"], "C": inp["C"],
                  "z": inp.get("z") if self.gate else None}
            rp = {"A": params["A"].float(), "D": params["D"].to(self.act_dtype).float(),
                  "dt_bias": params["dt_bias"].to(self.act_dtype).float()}
            return ri, rp
        a, b = self._gdn_gating(inp)
        g, beta = gdn_effective_gating(self.A_log, a, self.dt_bias, b, self.gdn_kernel)
        shp = inp["g"].shape
        return {"q": inp["q"].to(self.act_dtype), "k": inp["k"].to(self.act_dtype),
                "v": inp["v"].to(self.act_dtype), "g": g.float().reshape(shp),
                "beta": beta.float().reshape(shp)}, {}

    def owned_slots(self, idx: torch.Tensor) -> torch.Tensor:
        """bool [nslots]: slots the live rows of idx own (everything else must stay untouched)."""
        tbl, _ = self._slots(idx)
        m = torch.zeros(self.state.shape[0], dtype=torch.bool, device=self.device)
        m[tbl.flatten().long()] = True
        m[NULL_BLOCK_ID] = False
        return m

    def state_bytes(self) -> int:
        return self.state[0].numel() * self.state.element_size()


class VllmSpecLayer(VllmEagerLayer):
    """vLLM's speculative-decode call: T tokens per request (vLLM: 1 + num_speculative_tokens),
    each request owning T state slots (one per draft position); the kernel reads the initial
    state from slot column accepted-1 and writes the state after token t to column t.
    `accepted` (int32 [b], 1..T: the previous step's accepted count incl. the bonus token)
    defaults to (row mod T) + 1; set it with set_accepted (an in-place copy, graph-safe).
    GDN always uses fused_sigmoid_gating_delta_rule_update (vLLM's only spec decode kernel)."""

    spec = True

    def __init__(self, op, dims, batch, T, state_dtype, device, gen=None, act_dtype=torch.bfloat16, gate=False,
                 slot_stride=None):
        if not 1 <= int(T) <= 16:
            raise ValueError(f"T (tokens per request) must be in 1..16, got {T}")
        super().__init__(op, dims, batch, state_dtype, device, gen, act_dtype, "sigmoid", gate, slot_stride, T=T)

    def set_accepted(self, accepted: torch.Tensor) -> None:
        self.accepted.copy_(accepted.to(device=self.device, dtype=torch.int32))


def reference_view(layer: VllmEagerLayer) -> torch.Tensor:
    """The layer's state in our reference's layout, addressed by vLLM slot number (a view:
    clone it before running the reference). Slot 0 is vLLM's null block."""
    return layer.state


# ----------------------------------------------------------------------------- correctness check
def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def reference_step(layer: VllmEagerLayer, ref_state: torch.Tensor, ri: dict, rp: dict, idx: torch.Tensor,
                   accepted: torch.Tensor | None = None) -> torch.Tensor:
    """Our reference doing what vLLM's call should do, on a copy of the vLLM-layout state."""
    tbl, _ = layer._slots(idx)
    rs = reference_slots(tbl)                                  # [b, T], -1 = padding
    f = R.mamba2_eager_step if layer.op == "mamba2" else R.gdn_eager_step
    kw = rp if layer.op == "mamba2" else {"scale": layer.scale}
    if not layer.spec:
        return f(ref_state, **ri, **kw, state_indices=rs[:, 0])
    live = torch.nonzero(rs[:, 0] >= 0).flatten()
    acc = accepted.to(device=rs.device, dtype=torch.int64)
    # the kernel loads the state once and keeps it in fp32 across the T tokens, rounding only
    # the copies it stores per token: step a float32 working copy, store rounded copies
    work = ref_state.to(torch.float64 if ref_state.dtype == torch.float64 else torch.float32)
    outs = []
    for j in range(layer.T):
        src = rs[live, acc[live] - 1] if j == 0 else rs[live, j - 1]
        dst = rs[live, j]
        work[dst] = work[src]                                   # token j starts from the previous state
        outs.append(f(work, **{k: (v[:, j] if v is not None else None) for k, v in ri.items()}, **kw,
                      state_indices=rs[:, j]))
        ref_state[dst] = work[dst].to(ref_state.dtype)
    return torch.stack(outs, dim=1)


def _check(layer: VllmEagerLayer, steps: int, gen) -> float:
    b = layer.batch
    idx = torch.arange(b, dtype=torch.int32, device=layer.device)
    if b > 1:
        idx[-1] = -1                                            # a padded row too
    live = idx >= 0
    init = layer.state.clone()
    ref_state = layer.state.clone()
    worst = 0.0
    for _ in range(steps):
        inp, params = layer.random_inputs(gen)
        acc = None
        if layer.spec:
            acc = torch.randint(1, layer.T + 1, (b,), generator=gen).to(torch.int32)
            layer.set_accepted(acc)
        y = layer.step(inp, params, idx).clone()
        ri, rp = layer.reference_inputs(inp, params)
        y_ref = reference_step(layer, ref_state, ri, rp, idx, acc)
        if not torch.isfinite(y[live]).all():
            raise AssertionError("non-finite output from vLLM's kernel")
        worst = max(worst, _rel(y[live], y_ref[live]))
    owned = layer.owned_slots(idx)
    if not torch.equal(layer.state[~owned], init[~owned]):
        raise AssertionError("vLLM's kernel wrote a slot it does not own (null block or padded row)")
    worst = max(worst, _rel(layer.state[owned], ref_state[owned]))
    return worst


def check_vllm_layer(op, dims, batch, state_dtype, device, steps: int = 3, seed: int = 0,
                     gdn_kernel: str = "packed", gate: bool = False, act_dtype=torch.bfloat16) -> float:
    """Max relative error (outputs of live rows, and the final state) of vLLM's eager decode
    call through VllmEagerLayer vs our reference, from the same initial state and inputs.
    Raises AssertionError if vLLM wrote outside the live rows' slots or produced non-finite output."""
    gen = torch.Generator().manual_seed(seed)
    layer = VllmEagerLayer(op, dims, batch, state_dtype, device, gen, act_dtype, gdn_kernel, gate)
    return _check(layer, steps, gen)


def check_vllm_spec_layer(op, dims, batch, T, state_dtype, device, steps: int = 3, seed: int = 0,
                          gate: bool = False, act_dtype=torch.bfloat16) -> float:
    """As check_vllm_layer for the speculative call (T tokens, random accepted counts)."""
    gen = torch.Generator().manual_seed(seed)
    layer = VllmSpecLayer(op, dims, batch, T, state_dtype, device, gen, act_dtype, gate)
    return _check(layer, steps, gen)


# ----------------------------------------------------------------------------- runner
def run(case, ctx) -> dict:
    """Time vLLM's decode kernel for a vllm-eager / vllm-spec case (kernel-runner conventions:
    many independent layers so that state streams from HBM; median_us per step per layer)."""
    from ..models import get_model
    from ..timing import measure
    from ..traffic import step_traffic

    if case.method not in names(peer="vllm"):
        raise SkipCase(f"method {case.method!r} is not a vLLM peer; allowed: {', '.join(names(peer='vllm'))}")
    if not str(ctx.device).startswith("cuda"):
        raise SkipCase("vLLM's kernels need a CUDA device")
    if not vllm_available():
        raise SkipCase("vLLM is not importable here")
    model = get_model(case.model)
    op, dims, device = model.op, model.ssm, ctx.device
    spec = METHODS[case.method].spec
    T = case.spec_window if spec else 1
    b_chk = min(case.batch, 8)
    check = (check_vllm_spec_layer(op, dims, b_chk, T, case.state_dtype, device, seed=case.seed) if spec
             else check_vllm_layer(op, dims, b_chk, case.state_dtype, device, seed=case.seed))
    tol = CHECK_TOL.get(case.state_dtype, 3e-2)
    if not check <= tol:
        raise AssertionError(f"vLLM peer differs from the reference: rel err {check:.3g} > {tol}")
    traffic = step_traffic(case, model)
    gen = torch.Generator().manual_seed(case.seed)
    heads, rows, cols = _geometry(op, dims)
    per_layer = case.batch * T * heads * rows * cols * dtype_of(case.state_dtype).itemsize
    nl = layers_for(per_layer, device)
    mk = (lambda: VllmSpecLayer(op, dims, case.batch, T, case.state_dtype, device, gen)) if spec else (
        lambda: VllmEagerLayer(op, dims, case.batch, case.state_dtype, device, gen))
    layers = [mk() for _ in range(nl)]
    inp, params = layers[0].random_inputs(gen)
    idx = torch.arange(case.batch, dtype=torch.int32, device=device)
    for layer in layers:                 # translate once, outside the timed region
        layer.step(inp, params, idx)
    steps = steps_per_sample(case.flush_period, nl, device)

    def sample():
        for _ in range(steps):
            for layer in layers:
                layer.step(inp, params, idx)

    t = measure(sample, device, ctx.timing, per=steps * nl)
    return {
        **t.columns(),
        "bytes_model": traffic.total_bytes, "read_bytes_model": traffic.read_bytes,
        "write_bytes_model": traffic.write_bytes, "flops_model": traffic.flops, "intensity": traffic.intensity,
        "check_rel_err": check, "layers": nl, "steps_per_sample": steps,
        "heads": heads, "state_rows": rows, "state_cols": cols,
        "vllm_version": vllm_version(), "vllm_kernel": ("selective_state_update" if op == "mamba2" else
                                                        "fused_sigmoid_gating_delta_rule_update" if spec else
                                                        "fused_recurrent_gated_delta_rule_packed_decode"),
    }
