"""ReplaySSM inside stock vLLM 0.26: a general plugin (entry point ``vllm.general_plugins`` ->
``replayssm.vllm:register``), installed with ``pip install -e ".[vllm]"``. docs/vllm.md.

Active for an engine where ``REPLAYBENCH_VLLM=replay|replay-dual`` is set or its
``additional_config`` has a "replayssm" entry (config.py); otherwise the registered classes
behave exactly as vLLM's. ``REPLAYBENCH_VLLM=off`` skips registration altogether.

Modules: config (settings, no vLLM), layout (the state tensors, no vLLM), decode (the SSM
step on replayssm's ops, no vLLM), engine (engine-start refusals), layers / models (the vLLM
subclasses).
"""
from __future__ import annotations

import os

from .config import ENV, SUPPORTED_ARCHITECTURES, ReplayConfig, ReplayConfigError  # noqa: F401

MODEL_CLASSES = {arch: f"replayssm.vllm.models:Replay{arch}" for arch in SUPPORTED_ARCHITECTURES}


def register() -> None:
    """vLLM's general-plugin hook (runs in every vLLM process, possibly more than once)."""
    if os.environ.get(ENV, "").strip().lower() == "off":
        return
    from vllm import ModelRegistry

    from .layers import install
    install()
    for arch, target in MODEL_CLASSES.items():
        ModelRegistry.register_model(arch, target)
