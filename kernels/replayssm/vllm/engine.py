"""Engine-start checks: the active ReplayConfig of a vLLM engine, or a refusal naming the
option. Reads vLLM config objects by attribute only (no vLLM import), so it runs first in
every hook: the model class's state-shape class method (config time, before the page plan)
and the layers' constructors (model construction)."""
from __future__ import annotations

import torch

from .config import SUPPORTED_ARCHITECTURES, ReplayConfig, ReplayConfigError, from_vllm_config

# The Triton ops take a slot stride per buffer tensor but assume contiguous checkpoints,
# cursors and epochs [S, ...]; vLLM's page views have a slot stride of one page for every
# tensor (docs/vllm.md lists what the kernels must accept). Flip once they accept it.
KERNELS_ACCEPT_PAGE_STRIDES = False


def num_spec_tokens(vllm_config) -> int:
    spec = getattr(vllm_config, "speculative_config", None)
    return int(spec.num_speculative_tokens) if spec is not None else 0


def _cudagraphs_on(vllm_config) -> bool:
    mc = getattr(vllm_config, "model_config", None)
    if mc is not None and getattr(mc, "enforce_eager", False):
        return False
    mode = getattr(getattr(vllm_config, "compilation_config", None), "cudagraph_mode", None)
    return mode is not None and getattr(mode, "name", str(mode)) != "NONE"


def engine_config(vllm_config, family: str | None = None) -> ReplayConfig | None:
    """The plugin's resolved configuration for this engine, None where the plugin is inactive.
    Raises ReplayConfigError (naming the option) for what it does not support."""
    cfg = from_vllm_config(vllm_config)
    if cfg is None:
        return None
    mc = vllm_config.model_config
    arch = mc.architecture if mc is not None else None
    want = SUPPORTED_ARCHITECTURES.get(arch)
    if want is None or (family is not None and want != family):
        raise ReplayConfigError(
            f"replayssm mode {cfg.mode!r} supports the architectures {', '.join(SUPPORTED_ARCHITECTURES)}; "
            f"model architecture {arch!r} is not supported (unset REPLAYBENCH_VLLM or "
            "additional_config['replayssm'] for this model)")
    cache_mode = getattr(vllm_config.cache_config, "mamba_cache_mode", "none")
    if cache_mode != "none":
        raise ReplayConfigError(
            f"replayssm does not support prefix caching of Mamba state (mamba_cache_mode={cache_mode!r}, "
            "from enable_prefix_caching): set enable_prefix_caching=False / mamba_cache_mode='none'")
    cfg = cfg.resolve(num_spec_tokens(vllm_config))
    if cfg.backend == "triton" and not KERNELS_ACCEPT_PAGE_STRIDES:
        raise ReplayConfigError(
            "replayssm backend='triton' needs Triton kernels that take a slot stride per state tensor "
            "(vLLM's page views, docs/vllm.md); until they do, use backend='reference' "
            "(REPLAYBENCH_VLLM_BACKEND=reference) with enforce_eager=True")
    if cfg.backend == "reference" and torch.cuda.is_available() and _cudagraphs_on(vllm_config):
        raise ReplayConfigError(
            "replayssm backend='reference' syncs with the host and cannot be captured in CUDA graphs: "
            "set enforce_eager=True")
    return cfg
