"""pytest plugin (entry point ``pytest11: replaybench``): the ``gpu_benchmark`` fixture.

Kernel benchmarks written as ordinary tests, timed as the suite times them and stored by
pytest-benchmark, so its own options gate them::

    def test_replay_step(gpu_benchmark):
        state, inputs = make_case(...)                         # on the GPU
        gpu_benchmark(lambda: replay_step(state, **inputs), per=1)

    pytest tests/bench --benchmark-autosave                    # baseline (.benchmarks/)
    pytest tests/bench --benchmark-compare --benchmark-compare-fail=median:3%

``gpu_benchmark(fn, ...)`` warms ``fn`` up on a side stream, captures it in a CUDA graph
(falls back to plain launches if the capture fails, and says so in extra_info), then takes
samples: each sample is one replay bracketed by CUDA events, the host synchronises once per
batch, NVML's throttle reasons are read after each batch and throttled batches are treated as
replaybench.timing treats them (discarded; a case that only ever ran at the power cap is
reported with ``power_capped``). It stops by the suite's rule (at least ``min_samples``, then
once IQR / median <= ``rel_iqr``, or at ``max_samples`` / ``max_time_s``). Cold state where
asked: ``flush_l2=True`` overwrites a buffer of twice the L2 size before every sample and
``setup`` runs before every sample, both outside the timed events. Each sample's time per
unit of work (``per``) goes into pytest-benchmark's stats, in seconds; the suite's facts
(median_us, power_capped, throttle, discarded, clocks) go into the benchmark's extra_info and
static NVML facts of the GPU into the run's machine_info.

Without CUDA the fixture skips the test at set-up (before the test body allocates anything),
with the reason. With pytest-benchmark disabled (``--benchmark-disable``, or under xdist) it
runs ``fn`` once, as pytest-benchmark does, and returns None; otherwise it returns the
replaybench.timing.Timing of the measurement.
"""
from __future__ import annotations

import time
from typing import Any, Callable

import pytest

SKIP_REASON = ("gpu_benchmark: no CUDA device (torch.cuda.is_available() is False); "
               "GPU kernel benchmarks run on a GPU runner")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


class GpuBenchmark:
    """Callable bound to one test's pytest-benchmark fixture; see the module doc."""

    def __init__(self, benchmark):
        self.benchmark = benchmark
        self.timing = None

    def __call__(self, fn: Callable[[], Any], *, per: int = 1, graph: bool = True, flush_l2: bool = False,
                 setup: Callable[[], Any] | None = None, warmup: int = 3, min_samples: int = 10,
                 max_samples: int = 200, max_time_s: float = 1.0, rel_iqr: float = 0.005, batch: int = 10):
        import torch

        from .scenario import TimingConfig
        from .timing import NvmlProbe, SampleBatches, capture, event_batch, stop_rule, warm_up
        bm = self.benchmark
        if per < 1 or batch < 1:
            raise ValueError(f"gpu_benchmark: per and batch must be >= 1 (per={per}, batch={batch})")
        cfg = TimingConfig(warmup=warmup, min_samples=min_samples, max_samples=max_samples,
                           max_time_s=max_time_s, rel_iqr=rel_iqr)
        if getattr(bm, "disabled", False):
            if setup:
                setup()
            fn()
            torch.cuda.synchronize()
            return None
        warm_up(fn, cfg.warmup)
        run, graphed, why = fn, False, ""
        if graph:
            try:
                g = capture(fn)
                run, graphed = g.replay, True
            except Exception as e:  # noqa: BLE001 - not capturable (host sync, allocation): time launches
                why = f"{type(e).__name__}: {e}"[:300]
                torch.cuda.synchronize()
        scratch = None
        if flush_l2:
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            l2 = getattr(props, "L2_cache_size", 0) or (64 << 20)
            scratch = torch.empty(2 * l2 // 4, dtype=torch.float32, device="cuda")
        run()
        torch.cuda.synchronize()
        nvml = NvmlProbe(torch.cuda.current_device())
        acc = SampleBatches()
        cold = flush_l2 or setup is not None
        started = time.perf_counter()
        while not stop_rule(acc.samples, cfg, started):
            if cold:                 # per-sample events: the flush / setup between samples is not timed
                start = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
                end = [torch.cuda.Event(enable_timing=True) for _ in range(batch)]
                for i in range(batch):
                    if setup:
                        setup()
                    if scratch is not None:
                        scratch.fill_(float(i))
                    start[i].record()
                    run()
                    end[i].record()
                torch.cuda.synchronize()
                xs = [start[i].elapsed_time(end[i]) * 1e3 for i in range(batch)]
            else:                    # back-to-back events, as replaybench.timing
                xs = event_batch(run, batch)
            acc.add(xs, nvml.read())
        t = acc.summary(per)
        self.timing = t
        record(bm, t, {"timer": "cuda events" + (" (CUDA graph replay)" if graphed else " (direct launches)"),
                       "graph_error": why or None, "per": per, "flush_l2": flush_l2, "setup": setup is not None})
        return t


def record(benchmark, t, extra: dict | None = None) -> None:
    """Store a replaybench.timing.Timing in a pytest-benchmark fixture as its measurement: one
    round per sample (seconds per unit), the suite's facts in extra_info. The fixture cannot be
    used again in the same test, as after benchmark(...)."""
    stats = benchmark._make_stats(1)
    for us in t.raw_us:
        stats.update(us * 1e-6)
    benchmark._mode = "gpu_benchmark(...)"
    benchmark.extra_info.update(extra or {})
    benchmark.extra_info.update({
        "median_us": t.median_us, "iqr_us": t.iqr_us, "samples": t.samples, "discarded": t.discarded,
        "power_capped": t.power_capped, "throttle": t.throttle, "sm_clock_mhz": t.sm_clock_mhz,
        "mem_clock_mhz": t.mem_clock_mhz, "power_w": t.power_w})


@pytest.fixture
def gpu_benchmark(request):
    """Time a CUDA callable the way replaybench times kernels, into pytest-benchmark's storage."""
    if not _cuda_available():
        pytest.skip(SKIP_REASON)
    # pytest-benchmark's fixture only now: a skipped test leaves no unused-fixture warning
    return GpuBenchmark(request.getfixturevalue("benchmark"))


def gpu_facts() -> dict:
    """Static facts of the current GPU (NVML, torch): what makes two benchmark runs comparable.
    Empty without a GPU."""
    out: dict[str, Any] = {}
    try:
        import torch
        if not torch.cuda.is_available():
            return out
        idx = torch.cuda.current_device()
        p = torch.cuda.get_device_properties(idx)
        out.update(name=p.name, compute_capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count,
                   memory_total_bytes=p.total_memory, torch=torch.__version__, cuda_runtime=torch.version.cuda)
        try:
            import triton
            out["triton"] = triton.__version__
        except ImportError:
            pass
        import pynvml as nv
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(idx)
        for key, f in [("uuid", lambda: nv.nvmlDeviceGetUUID(h)),
                       ("driver", lambda: nv.nvmlSystemGetDriverVersion()),
                       ("enforced_power_limit_w", lambda: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000.0),
                       ("max_sm_clock_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)),
                       ("max_mem_clock_mhz", lambda: nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)),
                       ("app_sm_clock_mhz", lambda: nv.nvmlDeviceGetApplicationsClock(h, nv.NVML_CLOCK_SM)),
                       ("persistence_mode", lambda: nv.nvmlDeviceGetPersistenceMode(h))]:
            try:
                v = f()
                out[key] = v.decode() if isinstance(v, bytes) else v
            except Exception:  # noqa: BLE001 - a fact this driver does not give
                pass
    except Exception:  # noqa: BLE001 - no NVML: the torch facts only
        pass
    return out


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_machine_info(config, machine_info):
    facts = gpu_facts()
    if facts:
        machine_info["gpu"] = facts
