"""Timing of decode steps: CUDA-graph replay on a GPU, wall clock on a CPU.

GPU rule (DESIGN.md §4): the measured callable is captured once in a CUDA graph and
replayed; each replay is one sample, bracketed by CUDA events recorded back to back with
no synchronisation in between; the host synchronises once per batch of samples. The
callable itself should touch enough independent layer states that the state streams from
HBM (the runner sizes that). Stopping rule: at least `min_samples`, then stop once the
relative IQR (IQR / median) <= `rel_iqr`, or at `max_samples` / `max_time_s`.

Throttling: NVML clock-throttle reasons are read after every batch; a batch during which a
thermal/power/slowdown reason was active is discarded (and counted), as are its samples.
Exception: when *every* batch ran under the power cap alone (sw_power_cap / hw_power_brake,
no thermal or slowdown reason), the kernel itself draws the board to its power limit and
that capped rate is its sustained rate on this GPU: those samples are reported with
`power_capped=True` (the row says so) instead of failing the case. Seen on the H200 with the
MMA-heavy speculative verify kernels at batch 512.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

# NVML throttle reasons that mean the clocks were pulled down under us (not idle / app clocks)
_BAD_REASONS = {
    "sw_power_cap": 0x4, "hw_slowdown": 0x8, "sync_boost": 0x10, "sw_thermal": 0x20,
    "hw_thermal": 0x40, "hw_power_brake": 0x80,
}
_POWER_REASONS = {"sw_power_cap", "hw_power_brake"}


# a row is flagged noisy (column `noisy`) below this many samples or above this IQR / median
MIN_CLEAN_SAMPLES = 3
NOISY_REL_IQR = 0.10


@dataclass
class Timing:
    median_us: float
    iqr_us: float
    samples: int
    discarded: int
    mean_us: float
    min_us: float
    sm_clock_mhz: float | None = None
    mem_clock_mhz: float | None = None
    power_w: float | None = None
    throttle: str = ""
    raw_us: list = field(default_factory=list, repr=False)
    power_capped: bool = False     # every batch ran under the power cap: these are capped samples

    @property
    def rel_iqr(self) -> float:
        return self.iqr_us / self.median_us if self.median_us else float("inf")

    @property
    def noisy(self) -> bool:
        """Too few samples, or a spread too wide, to read the median as a clean number."""
        return self.samples < MIN_CLEAN_SAMPLES or self.rel_iqr > NOISY_REL_IQR

    def columns(self) -> dict:
        """The row columns every runner reports from a measurement (DESIGN.md §5)."""
        return {"median_us": self.median_us, "iqr_us": self.iqr_us, "samples": self.samples,
                "discarded": self.discarded, "mean_us": self.mean_us, "min_us": self.min_us,
                "rel_iqr": self.rel_iqr, "sm_clock_mhz": self.sm_clock_mhz, "mem_clock_mhz": self.mem_clock_mhz,
                "power_w": self.power_w, "throttle": self.throttle, "power_capped": self.power_capped,
                "noisy": self.noisy,
                # every kept sample (us per unit, in measured order): the gate's test needs them
                "samples_us": [round(x, 4) for x in self.raw_us]}


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[1], q[2]


class _Nvml:
    """Optional NVML probe (nvidia-ml-py); all methods return None without a GPU."""

    def __init__(self, device_index: int = 0):
        self.h = None
        try:
            import pynvml
            pynvml.nvmlInit()
            self.nv = pynvml
            self.h = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        except Exception:
            self.h = None

    def read(self) -> dict:
        if self.h is None:
            return {}
        nv, h = self.nv, self.h
        out = {}
        try:
            out["sm"] = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)
            out["mem"] = nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)
            out["power"] = nv.nvmlDeviceGetPowerUsage(h) / 1000.0
            reasons = nv.nvmlDeviceGetCurrentClocksEventReasons(h) if hasattr(
                nv, "nvmlDeviceGetCurrentClocksEventReasons") else nv.nvmlDeviceGetCurrentClocksThrottleReasons(h)
            out["bad"] = [k for k, bit in _BAD_REASONS.items() if reasons & bit]
        except Exception:
            pass
        return out


def _stop(samples: list[float], cfg, started: float) -> bool:
    """Stop at max_samples; before that never below min_samples (a time cap that cut a slow case
    to one sample left rows with no spread at all); from there at max_time_s or once the IQR is
    within rel_iqr of the median."""
    if len(samples) >= cfg.max_samples:
        return True
    if len(samples) < cfg.min_samples:
        return False
    if time.perf_counter() - started > cfg.max_time_s:
        return True
    q1, med, q3 = quartiles(samples)
    return (q3 - q1) / med <= cfg.rel_iqr


class _Batches:
    """Samples of a measurement, batch by batch, with the NVML state read after each batch:
    clean batches are kept; throttled ones are discarded and counted, and those throttled by
    the power cap alone are set aside in case no batch at all runs uncapped (module doc)."""

    def __init__(self):
        self.samples: list[float] = []
        self.capped: list[float] = []
        self.clocks: list[dict] = []
        self.capped_clocks: list[dict] = []
        self.reasons: set[str] = set()
        self.discarded = 0
        self.other_throttle = False

    def add(self, batch: list[float], state: dict) -> None:
        bad = set(state.get("bad") or ())
        if not bad:
            self.samples.extend(batch)
            self.clocks.append(state)
            return
        self.discarded += len(batch)
        self.reasons |= bad
        if bad <= _POWER_REASONS:
            self.capped.extend(batch)
            self.capped_clocks.append(state)
        else:
            self.other_throttle = True

    def summary(self, per: int) -> Timing:
        if self.samples:
            return _summary(self.samples, self.discarded, per, self.clocks, self.reasons)
        if self.capped and not self.other_throttle:
            t = _summary(self.capped, 0, per, self.capped_clocks, self.reasons)
            t.power_capped = True
            return t
        return _summary([], self.discarded, per, [], self.reasons)


def _summary(samples, discarded, per, clocks, reasons) -> Timing:
    if not samples:
        raise RuntimeError(f"no usable timing samples ({discarded} discarded; throttle: {sorted(reasons)})")
    xs = [s / per for s in samples]
    q1, med, q3 = quartiles(xs)
    avg = lambda k: statistics.fmean(c[k] for c in clocks if k in c) if any(k in c for c in clocks) else None  # noqa
    return Timing(median_us=med, iqr_us=q3 - q1, samples=len(xs), discarded=discarded, mean_us=statistics.fmean(xs),
                  min_us=min(xs), sm_clock_mhz=avg("sm"), mem_clock_mhz=avg("mem"), power_w=avg("power"),
                  throttle=",".join(sorted(reasons)), raw_us=xs)


def time_cpu(fn: Callable[[], None], cfg, per: int = 1) -> Timing:
    """Wall-clock timing on the CPU; `per` = units of work per call (result is per unit)."""
    for _ in range(cfg.warmup):
        fn()
    samples: list[float] = []
    started = time.perf_counter()
    while not _stop(samples, cfg, started):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return _summary(samples, 0, per, [], set())


def warm_up(fn: Callable[[], None], times: int) -> None:
    """Run fn `times` (>= 1) times on a side stream (compile, autotune, allocator), as a CUDA
    graph capture needs, and wait for it."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(max(times, 1)):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()


def capture(fn: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """fn's launches captured in a CUDA graph (warm fn up first: warm_up)."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def time_cuda_graph(fn: Callable[[], None], cfg, per: int = 1, batch: int = 10, use_graph: bool = True) -> Timing:
    """CUDA-graph replay timing; `fn` launches the work of one sample (e.g. all layers x K steps)."""
    warm_up(fn, cfg.warmup)
    run = capture(fn).replay if use_graph else fn
    for _ in range(2):
        run()
    torch.cuda.synchronize()
    nvml = _Nvml(torch.cuda.current_device())
    acc = _Batches()
    started = time.perf_counter()
    while not _stop(acc.samples, cfg, started):
        acc.add(event_batch(run, batch), nvml.read())
    return acc.summary(per)


def event_batch(run: Callable[[], None], n: int) -> list[float]:
    """`n` calls of `run` back to back on the current stream, each timed between two CUDA events
    (one event between consecutive calls, so no gap is added): their times in us."""
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(n + 1)]
    ev[0].record()
    for i in range(n):
        run()
        ev[i + 1].record()
    torch.cuda.synchronize()
    return [ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(n)]


def measure(fn: Callable[[], None], device: str, cfg, per: int = 1) -> Timing:
    """Time `fn` (one sample's work, `per` units) on `device` ('cpu' or 'cuda')."""
    if device.startswith("cuda"):
        return time_cuda_graph(fn, cfg, per)
    return time_cpu(fn, cfg, per)


# The interleaved A/B timer (replaybench.ab) and the pytest fixture (replaybench.pytest_plugin)
# take samples batch by batch themselves, under the same NVML rule and stopping rule.
NvmlProbe = _Nvml
SampleBatches = _Batches
stop_rule = _stop
