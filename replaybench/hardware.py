"""Device facts (NVML when a GPU is present, CPU info otherwise) and measured ceilings.

Ceilings are measured, never hard-coded (DESIGN.md section 4):
  copy_gbps      bytes read + written per second by ``torch.add(x, 0, out=y)``
  read_gbps      bytes read per second by ``torch.sum(x)``
  matmul_tflops  dense matmul rate (bf16 on GPU, fp32 on CPU)
"""

from __future__ import annotations

import os
import platform
import re
import socket
import statistics
import sys
import time
from typing import Any

GiB = 1 << 30
MiB = 1 << 20


def resolve_device(device: str = "auto") -> str:
    """'auto' -> 'cuda' if available else 'cpu'; validates 'cuda'."""
    import torch
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {device!r} requested but torch.cuda.is_available() is False")
    return device


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def slugify(s: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", s.lower()).strip("-") or "device"


def _nvml_info(index: int) -> dict:
    """GPU facts from NVML; an empty-ish dict with 'nvml_error' if NVML is unusable."""
    out: dict[str, Any] = {}
    try:
        import pynvml as nv
    except Exception as e:  # nvidia-ml-py missing
        return {"nvml_error": f"{type(e).__name__}: {e}"}
    try:
        nv.nvmlInit()
    except Exception as e:
        return {"nvml_error": f"{type(e).__name__}: {e}"}
    try:
        h = nv.nvmlDeviceGetHandleByIndex(index)

        def q(key, fn, *args, conv=lambda v: v):
            try:
                v = fn(*args)
                if isinstance(v, bytes):
                    v = v.decode()
                out[key] = conv(v)
            except Exception:
                out[key] = None

        q("nvml_name", nv.nvmlDeviceGetName, h)
        q("uuid", nv.nvmlDeviceGetUUID, h)
        q("driver", nv.nvmlSystemGetDriverVersion)
        q("cuda_driver_version", nv.nvmlSystemGetCudaDriverVersion,
          conv=lambda v: f"{v // 1000}.{(v % 1000) // 10}")
        q("power_limit_w", nv.nvmlDeviceGetPowerManagementLimit, h, conv=lambda v: v / 1000)
        q("enforced_power_limit_w", nv.nvmlDeviceGetEnforcedPowerLimit, h, conv=lambda v: v / 1000)
        q("sm_clock_mhz", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        q("mem_clock_mhz", nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        q("max_sm_clock_mhz", nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
        q("max_mem_clock_mhz", nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_MEM)
        q("app_sm_clock_mhz", nv.nvmlDeviceGetApplicationsClock, h, nv.NVML_CLOCK_SM)
        q("app_mem_clock_mhz", nv.nvmlDeviceGetApplicationsClock, h, nv.NVML_CLOCK_MEM)
        q("temperature_c", nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        q("memory_total_bytes", nv.nvmlDeviceGetMemoryInfo, h, conv=lambda v: v.total)
        q("persistence_mode", nv.nvmlDeviceGetPersistenceMode, h)
        q("mig_mode", nv.nvmlDeviceGetMigMode, h, conv=lambda v: list(v))
        q("clocks_event_reasons", getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons",
                                          getattr(nv, "nvmlDeviceGetCurrentClocksThrottleReasons", None)), h)
    except Exception as e:
        out["nvml_error"] = f"{type(e).__name__}: {e}"
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass
    return out


def device_info(device: str = "auto") -> dict:
    """Facts about the device the sweep runs on.  Never raises for missing NVML.

    Keys always present: kind ('cuda'|'cpu'), torch_device, name (GPU name or CPU
    model), label (row 'device' column: GPU name, or 'cpu'), slug, hostname, cpu_model.
    """
    info: dict[str, Any] = {"hostname": socket.gethostname(), "cpu_model": cpu_model(),
                            "cpu_count": os.cpu_count(), "platform": platform.platform()}
    try:
        import torch
        dev = resolve_device(device)
    except Exception as e:
        info.update(kind="cpu", torch_device="cpu", name=info["cpu_model"], label="cpu",
                    slug="cpu", error=f"{type(e).__name__}: {e}")
        return info
    if dev.startswith("cuda"):
        idx = torch.device(dev).index
        idx = torch.cuda.current_device() if idx is None else idx
        props = torch.cuda.get_device_properties(idx)
        name = props.name
        info.update(kind="cuda", torch_device=dev, index=idx, name=name, label=name,
                    slug=slugify(name.replace("NVIDIA ", "nvidia-")),
                    compute_capability=f"{props.major}.{props.minor}",
                    multiprocessors=props.multi_processor_count,
                    memory_total_bytes=props.total_memory,
                    cuda_runtime=torch.version.cuda)
        info.update(_nvml_info(idx))
    else:
        info.update(kind="cpu", torch_device="cpu", name=info["cpu_model"], label="cpu",
                    slug="cpu", torch_threads=torch.get_num_threads())
    return info


def gpu_clocks(index: int = 0) -> dict:
    """Current SM/memory clocks (MHz) via NVML; {} when unavailable."""
    info = _nvml_info(index)
    return {k: info.get(k) for k in ("sm_clock_mhz", "mem_clock_mhz") if info.get(k) is not None}


def versions() -> dict:
    """python/torch/triton/vllm/... versions (None where not installed).

    Read from the installed distributions' metadata so that nothing heavy (vllm,
    triton) is imported just to learn its version."""
    import importlib.metadata as md
    import importlib.util
    out: dict[str, Any] = {"python": platform.python_version()}
    for mod in ("torch", "triton", "vllm", "numpy", "pandas", "pyarrow", "matplotlib",
                "nvidia-ml-py"):
        try:
            out[mod] = md.version(mod)
        except md.PackageNotFoundError:
            out[mod] = None
    if out["vllm"] is not None and importlib.util.find_spec("vllm") is None:
        out["vllm"] = None
    elif out["vllm"] is None and importlib.util.find_spec("vllm") is not None:
        # an import without distribution metadata: the kernels-only stub of
        # tools/vllm_kernel_stub.py, whose __init__ only sets __version__ ('0.26.0+stub')
        import vllm
        out["vllm"] = getattr(vllm, "__version__", "unknown")
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch"] = getattr(torch, "__version__", out["torch"])
        out["torch_cuda"] = torch.version.cuda
    else:
        out["torch_cuda"] = None
    from . import __version__
    out["replaybench"] = __version__
    return out


# ----------------------------------------------------------------------------- ceilings

def achieved_gbps(nbytes, median_us) -> float | None:
    """Bytes per step / time per step in GB/s (1e9 bytes); None without a positive time or bytes."""
    try:
        b, t = float(nbytes), float(median_us)
    except (TypeError, ValueError):
        return None
    if not (t > 0) or b != b:
        return None
    return b / t * 1e-3


def pct_of_copy(gbps, ceilings: dict | None) -> float | None:
    """An achieved bandwidth as % of the copy ceiling measured at the run's start (the one
    definition of pct_copy_bw); None when either is unknown."""
    try:
        copy = float((ceilings or {}).get("copy_gbps"))
        g = float(gbps)
    except (TypeError, ValueError):
        return None
    if not (copy > 0) or g != g:
        return None
    return 100.0 * g / copy


def _time_cpu(fn, reps: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def _time_cuda(fn, reps: int, inner: int, warmup: int = 3) -> float:
    import torch
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(inner):
            fn()
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end) / 1e3 / inner)
    return statistics.median(ts)


def measure_ceilings(device: str = "auto") -> dict:
    """Measured copy / read bandwidth (GB/s, 1e9) and matmul rate (TFLOP/s).

    GPU: 1 GiB fp32 buffers, bf16 8192^3 matmul, CUDA-event timing.
    CPU: 256 MiB buffers, fp32 512^3 matmul, perf_counter timing (< 3 s total).
    """
    import torch
    dev = resolve_device(device)
    cuda = dev.startswith("cuda")
    nbytes = GiB if cuda else 256 * MiB
    n = nbytes // 4
    t_start = time.perf_counter()
    x = torch.ones(n, dtype=torch.float32, device=dev)
    y = torch.empty_like(x)
    if cuda:
        t_copy = _time_cuda(lambda: torch.add(x, 0, out=y), reps=7, inner=10)
        t_read = _time_cuda(lambda: torch.sum(x), reps=7, inner=10)
    else:
        t_copy = _time_cpu(lambda: torch.add(x, 0, out=y), reps=5)
        t_read = _time_cpu(lambda: torch.sum(x), reps=5)
    del x, y
    if cuda:
        m = 8192
        a = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
        b = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
        t_mm = _time_cuda(lambda: a @ b, reps=7, inner=5)
        mm_dtype = "bfloat16"
        torch.cuda.empty_cache()
    else:
        m = 512
        a = torch.randn(m, m, dtype=torch.float32)
        b = torch.randn(m, m, dtype=torch.float32)
        t_mm = _time_cpu(lambda: a @ b, reps=7, warmup=2)
        mm_dtype = "float32"
    del a, b
    return {
        "copy_gbps": 2 * nbytes / t_copy / 1e9,
        "read_gbps": nbytes / t_read / 1e9,
        "matmul_tflops": 2 * m ** 3 / t_mm / 1e12,
        "copy_method": "torch.add(x, 0, out=y), fp32",
        "read_method": "torch.sum(x), fp32",
        "buffer_bytes": nbytes,
        "matmul_shape": [m, m, m],
        "matmul_dtype": mm_dtype,
        "device": dev,
        "measure_s": time.perf_counter() - t_start,
    }
