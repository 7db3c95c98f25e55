"""The plugin's settings: where they come from, their defaults, and the engine-start refusals.

Settings come from vLLM's additional config (``additional_config={"replayssm": {...}}``), or,
where that has no "replayssm" entry, from environment variables:

    REPLAYBENCH_VLLM              replay | replay-dual (unset or "off": the plugin is inactive)
    REPLAYBENCH_VLLM_BUFFER_LEN   buffer capacity L (default: flush period + draft window)
    REPLAYBENCH_VLLM_FLUSH_PERIOD flush period K (default 16)
    REPLAYBENCH_VLLM_LO_DTYPE     the low copy of replay-dual (bfloat16 | float16 | float8_e4m3)
    REPLAYBENCH_VLLM_BACKEND      reference | triton (default: triton on CUDA, else reference)

No vLLM import here: the tests and the suite read these without vLLM installed.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ..state import CURSOR_MASK, LO_DTYPES

ENV = "REPLAYBENCH_VLLM"
MODES = ("replay", "replay-dual")
BACKENDS = ("reference", "triton")
DEFAULT_FLUSH_PERIOD = 16
CONFIG_KEY = "replayssm"          # key in vLLM's additional_config

# Architectures whose Mamba-2 / GDN layers and model class the plugin gives the replay layout.
SUPPORTED_ARCHITECTURES = {
    "NemotronHForCausalLM": "mamba2",
    "Qwen3_5ForConditionalGeneration": "gdn",
    "Qwen3_5MoeForConditionalGeneration": "gdn",
    "Qwen3NextForCausalLM": "gdn",
}


class ReplayConfigError(ValueError):
    """A configuration the plugin refuses at engine start; the message names the option."""


@dataclass(frozen=True)
class ReplayConfig:
    mode: str                   # "replay" | "replay-dual"
    flush_period: int
    buffer_len: int | None      # None: flush_period + draft window, fixed by resolve()
    lo_dtype: str = "bfloat16"  # replay-dual only
    backend: str | None = None  # None: triton on CUDA, else reference

    @property
    def dual(self) -> bool:
        return self.mode == "replay-dual"

    @property
    def state_mode(self) -> str:
        """replayssm.state's precision mode."""
        return "dual" if self.dual else "replay"

    def resolve(self, num_spec: int) -> "ReplayConfig":
        """Buffer length and backend made concrete, and the periods checked against the draft
        window (1 + num_spec tokens per verify under speculative decoding)."""
        window = 1 + num_spec if num_spec else 0
        L = self.buffer_len if self.buffer_len is not None else self.flush_period + max(window, 1)
        if L > CURSOR_MASK:
            raise ReplayConfigError(f"replayssm buffer_len ({L}) must be <= {CURSOR_MASK} (the cursor's count bits)")
        if self.flush_period < 1 or self.flush_period > L:
            raise ReplayConfigError(f"replayssm flush_period ({self.flush_period}) must be in 1..buffer_len ({L})")
        if window and L < self.flush_period + window:
            raise ReplayConfigError(
                f"replayssm buffer_len ({L}) does not fit a draft window: speculative decoding with "
                f"num_speculative_tokens={num_spec} needs buffer_len >= flush_period + 1 + num_speculative_tokens "
                f"({self.flush_period} + {window})")
        backend = self.backend
        if backend is None:
            import torch
            backend = "triton" if torch.cuda.is_available() else "reference"
        return ReplayConfig(self.mode, self.flush_period, L, self.lo_dtype, backend)


def _int(value, name: str) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ReplayConfigError(f"replayssm {name} must be an integer; got {value!r}") from None


def parse(settings: dict) -> ReplayConfig | None:
    """A ReplayConfig from a settings dict (keys: mode, buffer_len, flush_period, lo_dtype,
    backend), None where mode is missing or "off"."""
    unknown = set(settings) - {"mode", "buffer_len", "flush_period", "lo_dtype", "backend"}
    if unknown:
        raise ReplayConfigError(f"unknown replayssm option(s) {sorted(unknown)}; allowed: mode, buffer_len, "
                                "flush_period, lo_dtype, backend")
    mode = settings.get("mode")
    if mode in (None, "", "off", "stock"):
        return None
    if mode not in MODES:
        raise ReplayConfigError(f"replayssm mode {mode!r} (REPLAYBENCH_VLLM) not supported; allowed: "
                                f"{', '.join(MODES)} or off")
    lo = settings.get("lo_dtype") or "bfloat16"
    if lo not in LO_DTYPES:
        raise ReplayConfigError(f"replayssm lo_dtype {lo!r} not supported; allowed: {', '.join(LO_DTYPES)}")
    backend = settings.get("backend") or None
    if backend is not None and backend not in BACKENDS:
        raise ReplayConfigError(f"replayssm backend {backend!r} not supported; allowed: {', '.join(BACKENDS)}")
    L = settings.get("buffer_len")
    K = _int(settings.get("flush_period", DEFAULT_FLUSH_PERIOD), "flush_period")
    return ReplayConfig(mode=mode, flush_period=K,
                        buffer_len=None if L in (None, "") else _int(L, "buffer_len"), lo_dtype=lo, backend=backend)


def from_env(environ=os.environ) -> ReplayConfig | None:
    return parse({"mode": environ.get(ENV), "buffer_len": environ.get(f"{ENV}_BUFFER_LEN"),
                  "flush_period": environ.get(f"{ENV}_FLUSH_PERIOD", DEFAULT_FLUSH_PERIOD),
                  "lo_dtype": environ.get(f"{ENV}_LO_DTYPE"), "backend": environ.get(f"{ENV}_BACKEND")})


def from_vllm_config(vllm_config, environ=os.environ) -> ReplayConfig | None:
    """The active configuration of an engine: its additional_config["replayssm"] if present,
    else the environment. None: the plugin is inactive for this engine (stock behaviour)."""
    extra = getattr(vllm_config, "additional_config", None) or {}
    if isinstance(extra, dict) and CONFIG_KEY in extra:
        return parse(dict(extra[CONFIG_KEY]))
    return from_env(environ)
