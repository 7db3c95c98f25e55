"""Build a minimal importable `vllm` package holding only vLLM 0.26.0's SSM decode kernels.

Why: the device machine has no network, and carrying the whole vLLM 0.26.0 install costs
about 5 device-minutes per session (three 58 MiB parts, ../shared/device/VLLM.md). For
kernel-level peers we need only vLLM's own Triton decode kernels — `selective_state_update`
(Mamba-2) and the fused recurrent gated-delta-rule decode kernels (GDN) — so this script
extracts exactly those source files, unmodified, from the official wheel, and writes small
import shims (our own) for the few vLLM modules they import (platform, logger, env). Rows
measured through it report vllm_version '0.26.0+stub'. Nothing from vLLM is committed.

usage: python tools/vllm_kernel_stub.py WHEEL OUTDIR      (e.g. OUTDIR = .vllm-stub, git-ignored)
The wheel: pip download --no-deps vllm==0.26.0 (or ../shared/device/vllm-parts.sh's cache).
"""
from __future__ import annotations

import sys
import zipfile
from pathlib import Path

# unmodified files taken from the wheel
FROM_WHEEL = (
    "vllm/model_executor/layers/mamba/ops/mamba_ssm.py",
    "vllm/model_executor/layers/mamba/ops/triton_helpers.py",
    "vllm/third_party/flash_linear_attention/ops/fused_recurrent.py",
    "vllm/third_party/flash_linear_attention/ops/fused_sigmoid_gating.py",
    "vllm/third_party/flash_linear_attention/ops/op.py",
)
FROM_WHEEL_DIRS = ("vllm/model_executor/layers/mamba/ops/configs/selective_state_update/",)

# our shims for what those files import
SHIMS = {
    "vllm/__init__.py": '__version__ = "0.26.0+stub"\n',
    "vllm/envs.py": "VLLM_TUNED_CONFIG_FOLDER = None\n",
    "vllm/_custom_ops.py": "",
    "vllm/utils/__init__.py": "",
    "vllm/utils/platform_utils.py": (
        "import re\n"
        "def get_device_name_as_file_name(device_id: int = 0) -> str:\n"
        "    from vllm.platforms import current_platform\n"
        "    return re.sub(r'[\\s/]+', '_', current_platform.get_device_name(device_id))\n"),
    "vllm/logger.py": (
        "import logging\n"
        "class _Logger(logging.LoggerAdapter):\n"
        "    def info_once(self, msg, *a, **k): self.info(msg, *a)\n"
        "    def warning_once(self, msg, *a, **k): self.warning(msg, *a)\n"
        "    def debug_once(self, msg, *a, **k): self.debug(msg, *a)\n"
        "def init_logger(name): return _Logger(logging.getLogger(name), {})\n"),
    "vllm/platforms/__init__.py": (
        "import torch\n"
        "class _Platform:\n"
        "    def is_xpu(self): return False\n"
        "    def is_cuda_alike(self): return True\n"
        "    def is_cuda(self): return True\n"
        "    def is_rocm(self): return False\n"
        "    def get_device_name(self, device_id=0): return torch.cuda.get_device_name(device_id)\n"
        "    def is_device_capability_family(self, cap):\n"
        "        major = torch.cuda.get_device_capability()[0]\n"
        "        return major == cap // 10\n"
        "current_platform = _Platform()\n"),
    "vllm/triton_utils/__init__.py": (
        "import triton\nimport triton.language as tl\nimport triton.language.extra.libdevice as tldevice\n"
        "HAS_TRITON = True\nLOG2E = 1.4426950408889634\nLOGE2 = 0.6931471805599453\n"),
    "vllm/v1/__init__.py": "", "vllm/v1/attention/__init__.py": "", "vllm/v1/attention/backends/__init__.py": "",
    "vllm/v1/attention/backends/utils.py": "PAD_SLOT_ID = -1\nNULL_BLOCK_ID = 0\n",
    "vllm/model_executor/__init__.py": "", "vllm/model_executor/layers/__init__.py": "",
    "vllm/model_executor/layers/mamba/__init__.py": "", "vllm/model_executor/layers/mamba/ops/__init__.py": "",
    "vllm/third_party/__init__.py": "", "vllm/third_party/flash_linear_attention/__init__.py": "",
    "vllm/third_party/flash_linear_attention/ops/__init__.py": (
        "from .fused_recurrent import fused_recurrent_gated_delta_rule, "
        "fused_recurrent_gated_delta_rule_packed_decode\n"
        "from .fused_sigmoid_gating import fused_sigmoid_gating_delta_rule_update\n"),
    "vllm/third_party/flash_linear_attention/ops/utils.py": (
        "from vllm.triton_utils import triton\nis_gather_supported = hasattr(triton.language, 'gather')\n"),
}


def build(wheel: str, out: str) -> list[str]:
    root = Path(out)
    written = []
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        wanted = [n for n in names if n in FROM_WHEEL or any(n.startswith(d) for d in FROM_WHEEL_DIRS)]
        missing = set(FROM_WHEEL) - set(wanted)
        if missing:
            raise SystemExit(f"{wheel}: missing {sorted(missing)} (is this vllm 0.26.0?)")
        for n in wanted:
            (root / n).parent.mkdir(parents=True, exist_ok=True)
            (root / n).write_bytes(zf.read(n))
            written.append(n)
    for rel, text in SHIMS.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
        written.append(rel)
    return written


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    files = build(sys.argv[1], sys.argv[2])
    print(f"wrote {len(files)} files under {sys.argv[2]}")
