"""vLLM 0.26 model classes with the ReplaySSM state layout in their state-shape / state-dtype
class methods (imports vLLM; registered lazily under vLLM's own architecture names).

vLLM plans pages (``platforms.interface._align_hybrid_block_size``) from these class methods
before any layer exists, and cuts each page into the layers' declared tensors later: both
must give the same tensors, so both start from vLLM's own (conv, ssm) and append
``layout.replay_fields``. Where the plugin is inactive they return vLLM's values unchanged.
"""
from __future__ import annotations

from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.mamba.mamba_utils import get_temporal_copy_spec

from .engine import engine_config
from .layout import extend, replay_fields


class _ReplayModel:
    FAMILY = ""

    @classmethod
    def _replay(cls, vllm_config):
        shapes = super().get_mamba_state_shape_from_config(vllm_config)
        dtypes = super().get_mamba_state_dtype_from_config(vllm_config)
        cfg = engine_config(vllm_config, cls.FAMILY)
        if cfg is None:
            return shapes, dtypes, []
        fields = replay_fields(cls.FAMILY, cfg, shapes, dtypes, vllm_config.model_config.dtype)
        return (*extend(shapes, dtypes, fields), fields)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        return cls._replay(vllm_config)[0]

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config):
        return cls._replay(vllm_config)[1]

    @classmethod
    def get_mamba_state_copy_func(cls):
        # one per tensor (vLLM's prefix-caching modes use them; the plugin refuses those modes)
        base = tuple(super().get_mamba_state_copy_func())
        fields = cls._replay(get_current_vllm_config())[2]
        return base + (get_temporal_copy_spec,) * len(fields)


def _make(base: type, family: str) -> type:
    return type(f"Replay{base.__name__}", (_ReplayModel, base),
                {"FAMILY": family, "__module__": __name__, "__doc__": f"{base.__name__} with the replay layout."})


def _nemotron_h():
    from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
    return _make(NemotronHForCausalLM, "mamba2")


def _qwen3_next():
    from vllm.model_executor.models.qwen3_next import Qwen3NextForCausalLM
    return _make(Qwen3NextForCausalLM, "gdn")


def _qwen3_5(name: str):
    from vllm.model_executor.models import qwen3_5
    return _make(getattr(qwen3_5, name), "gdn")


def __getattr__(name: str):
    """Classes built on first access, so importing this module imports only the model module
    asked for (Qwen3.5's pulls in the vision stack)."""
    makers = {"ReplayNemotronHForCausalLM": _nemotron_h, "ReplayQwen3NextForCausalLM": _qwen3_next,
              "ReplayQwen3_5ForConditionalGeneration": lambda: _qwen3_5("Qwen3_5ForConditionalGeneration"),
              "ReplayQwen3_5MoeForConditionalGeneration": lambda: _qwen3_5("Qwen3_5MoeForConditionalGeneration")}
    if name not in makers:
        raise AttributeError(name)
    cls = makers[name]()
    globals()[name] = cls
    return cls
