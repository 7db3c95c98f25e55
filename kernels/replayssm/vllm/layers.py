"""vLLM 0.26 layer subclasses with the ReplaySSM state layout (imports vLLM).

ReplayMambaMixer2 (NemotronH's mixer) and ReplayQwenGatedDeltaNetAttention (Qwen3.5 /
Qwen3-Next) subclass vLLM's layers and replace them through ``PluggableLayer.register_oot``.
Where the plugin is inactive for an engine (no REPLAYBENCH_VLLM, no additional_config
"replayssm") they behave exactly as vLLM's layers.

What they change:
- ``get_state_shape`` / ``get_state_dtype``: vLLM's (conv, ssm) tensors, then the replay
  fields (layout.py); the model classes (models.py) declare the same for the page plan.
- ``get_kv_cache_spec``: ``num_speculative_blocks=0``: no per-draft state slot.
- the decode step: vLLM's own forward runs (projections, conv window, prefill, gating,
  norms, output projection); only its recurrent decode call (Mamba-2:
  ``selective_state_update``; GDN: ``fused_sigmoid_gating_delta_rule_update``) is routed to
  decode.py while a replay layer's step is running. The routing is a module-level name
  swap in vLLM's layer modules that passes every other caller through unchanged.
- prefill: vLLM's prefill writes the checkpoint (tensor [1]); first the buffered entries of
  a continued sequence are folded, afterwards its buffer is emptied (decode.after_prefill).
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading

import torch
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba import mamba_mixer2 as _m2
from vllm.model_executor.layers.mamba.gdn import qwen_gdn_linear_attn as _gdn
from vllm.model_executor.layers.mamba.gdn.qwen_gdn_linear_attn import QwenGatedDeltaNetAttention
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2

from . import decode
from .engine import engine_config
from .layout import extend, gdn_state, mamba2_state, replay_fields

_running = threading.local()     # .layer: the replay layer whose step is inside vLLM's forward


@contextlib.contextmanager
def running(layer):
    """While vLLM's forward of `layer` runs, its routed decode call goes to the replay ops."""
    _running.layer = layer
    try:
        yield
    finally:
        _running.layer = None


def running_layer():
    """The replay layer whose vLLM forward is running (None outside one)."""
    return getattr(_running, "layer", None)


class _ReplayLayer:
    """Shared by both layer subclasses: the layout and the state views over kv_cache."""

    FAMILY = ""

    def _replay_init(self) -> None:
        vc = get_current_vllm_config()
        self.replay = engine_config(vc, self.FAMILY)
        self._views_key = None
        if self.replay is not None:
            base_s, base_d = self._vllm_shapes(), self._vllm_dtypes()
            self.replay_fields = replay_fields(self.FAMILY, self.replay, base_s, base_d, vc.model_config.dtype)
            self.replay_shapes, self.replay_dtypes = extend(base_s, base_d, self.replay_fields)

    # The mixin stands first in the layer classes' bases, so super() is vLLM's layer class: its
    # own shapes and dtypes, which the replay layout extends.
    def _vllm_shapes(self):
        return super().get_state_shape()

    def _vllm_dtypes(self):
        return super().get_state_dtype()

    def get_state_shape(self):
        return self._vllm_shapes() if self.replay is None else self.replay_shapes

    def get_state_dtype(self):
        return self._vllm_dtypes() if self.replay is None else self.replay_dtypes

    def get_kv_cache_spec(self, vllm_config):
        return self._spec(super().get_kv_cache_spec(vllm_config))

    def replay_state(self):
        """(state, pending) views over the bound kv_cache (rebuilt when vLLM rebinds it)."""
        key = tuple(t.data_ptr() for t in self.kv_cache)
        if key != self._views_key:
            make = mamba2_state if self.FAMILY == "mamba2" else gdn_state
            self._views = make(self.kv_cache, self.replay_fields, self.replay)
            self._views_key = key
        return self._views

    def _spec(self, spec):
        return spec if self.replay is None else dataclasses.replace(spec, num_speculative_blocks=0)

    def _run_vllm(self, raw: dict, md, indices_field: str, forward, *args):
        """vLLM's own forward of this layer, with the decode call routed to the replay ops.
        With one page per request vLLM's eager path gets a one-column block table where its
        conv kernel reads the window length from the column count (1 + num_spec): widen it
        (every column is the request's one block) for this layer's call."""
        t = getattr(md, indices_field, None)
        if self.num_spec and t is not None and t.dim() == 2 and t.shape[1] != 1 + self.num_spec:
            raw[self.prefix] = dataclasses.replace(md, **{indices_field: t[:, :1].expand(-1, 1 + self.num_spec)})
        try:
            with running(self):
                return forward(*args)
        finally:
            raw[self.prefix] = md


class ReplayMambaMixer2(_ReplayLayer, MambaMixer2):
    FAMILY = "mamba2"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._replay_init()

    def conv_ssm_forward(self, projected_states: torch.Tensor, output: torch.Tensor):
        raw = get_forward_context().attn_metadata
        if self.replay is None or raw is None:      # inactive, or vLLM's profile run
            return super().conv_ssm_forward(projected_states, output)
        md = raw[self.prefix]
        rs, pending = self.replay_state()
        if md.num_prefills > 0:
            decode.mamba2_before_prefill(rs, self.A, md.state_indices_tensor_p, md.has_initial_states_p,
                                         backend=self.replay.backend)
        self._run_vllm(raw, md, "state_indices_tensor_d", super().conv_ssm_forward, projected_states, output)
        if md.num_prefills > 0:
            decode.after_prefill(rs, pending, md.state_indices_tensor_p)

    def replay_ssu(self, state, x, dt, A, B, C, D=None, dt_bias=None, z=None, dt_softplus=False,
                   state_batch_indices=None, dst_state_batch_indices=None, out=None,
                   num_accepted_tokens=None, cu_seqlens=None, **_):
        """vLLM's selective_state_update call of this layer's decode, on the replay state. vLLM
        passes A [H, P, N], dt [ntok, H, P], D / dt_bias [H, P] broadcast from per-head values."""
        if z is not None or not dt_softplus:
            raise ValueError("replayssm's Mamba-2 decode expects vLLM's call: z=None, dt_softplus=True")
        rs, pending = self.replay_state()
        idx = state_batch_indices
        # the window is 1 + num_spec tokens: the block table has one column (no per-draft slots)
        decode.mamba2_decode(rs, pending, x, dt[..., 0], A[:, 0, 0], B, C, D[:, 0], dt_bias[:, 0],
                             idx[:, 0] if idx.dim() == 2 else idx, out, backend=self.replay.backend,
                             num_accepted=num_accepted_tokens, cu_seqlens=cu_seqlens, window=1 + self.num_spec)


class ReplayQwenGatedDeltaNetAttention(_ReplayLayer, QwenGatedDeltaNetAttention):
    FAMILY = "gdn"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._replay_init()
        if self.replay is not None:
            # every decode through fused_sigmoid_gating_delta_rule_update (the routed call)
            self.enable_packed_recurrent_decode = False

    def _forward_core(self, mixed_qkv, b, a, core_attn_out):
        raw = get_forward_context().attn_metadata
        if self.replay is None or raw is None:
            return super()._forward_core(mixed_qkv, b, a, core_attn_out)
        md = raw[self.prefix]
        rs, pending = self.replay_state()
        prefill_idx = getattr(md, "prefill_state_indices", None) if md.num_prefills > 0 else None
        if prefill_idx is not None:
            decode.gdn_before_prefill(rs, prefill_idx, md.prefill_has_initial_state, backend=self.replay.backend)
        self._run_vllm(raw, md, "spec_state_indices_tensor", super()._forward_core, mixed_qkv, b, a, core_attn_out)
        if prefill_idx is not None:
            decode.after_prefill(rs, pending, prefill_idx)

    def replay_recurrent(self, A_log, a, b, dt_bias, q, k, v, beta=1.0, threshold=20.0, scale=None,
                         initial_state=None, inplace_final_state=True, cu_seqlens=None,
                         ssm_state_indices=None, num_accepted_tokens=None, use_qk_l2norm_in_kernel=False,
                         is_kda=False, **_):
        """vLLM's fused_sigmoid_gating_delta_rule_update call of this layer's decode (q/k/v
        [1, ntok, heads, dim], a/b [ntok, Hv]), on the replay state. Returns (o, state) as vLLM's."""
        if beta != 1.0 or threshold != 20.0 or not use_qk_l2norm_in_kernel or is_kda:
            raise ValueError("replayssm's GDN decode expects vLLM's Qwen call (softplus beta 1, threshold 20, "
                             "q/k l2-normalised in the kernel)")
        rs, pending = self.replay_state()
        g, bt = decode.gdn_gates(A_log, a, b, dt_bias)
        idx = ssm_state_indices
        out = torch.empty_like(v[0])
        # vLLM passes num_accepted_tokens only on its spec-decode call: windows of 1 + num_spec
        decode.gdn_decode(rs, pending, q[0], k[0], v[0], g, bt, idx[:, 0] if idx.dim() == 2 else idx, out,
                          backend=self.replay.backend, scale=scale, num_accepted=num_accepted_tokens,
                          cu_seqlens=cu_seqlens, window=1 + self.num_spec)
        return out.unsqueeze(0), initial_state


# ----------------------------------------------------------------------------- routing
def _route(name: str, module, method: str, kind: type):
    """Replace `module.name` by a function that sends the call to the running replay layer's
    `method` when one of `kind` is running, else to the original."""
    original = getattr(module, name)
    if getattr(original, "replayssm_original", None) is not None:
        return                                     # already routed (register() runs repeatedly)

    def routed(*args, **kwargs):
        layer = running_layer()
        if isinstance(layer, kind):
            return getattr(layer, method)(*args, **kwargs)
        return original(*args, **kwargs)

    routed.replayssm_original = original
    routed.__name__ = routed.__qualname__ = name
    setattr(module, name, routed)


def install() -> None:
    """Register the layer subclasses and route the decode calls (idempotent)."""
    from vllm.model_executor.custom_op import op_registry_oot
    if op_registry_oot.get("MambaMixer2") is not ReplayMambaMixer2:
        if "MambaMixer2" not in op_registry_oot:
            MambaMixer2.register_oot(ReplayMambaMixer2)
    if op_registry_oot.get("QwenGatedDeltaNetAttention") is not ReplayQwenGatedDeltaNetAttention:
        if "QwenGatedDeltaNetAttention" not in op_registry_oot:
            QwenGatedDeltaNetAttention.register_oot(ReplayQwenGatedDeltaNetAttention)
    _route("selective_state_update", _m2, "replay_ssu", ReplayMambaMixer2)
    _route("fused_sigmoid_gating_delta_rule_update", _gdn, "replay_recurrent", ReplayQwenGatedDeltaNetAttention)
