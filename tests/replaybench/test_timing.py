"""replaybench.timing: stopping rule on the CPU, and the per-batch throttle accounting of the
GPU path (_Batches), fed with the NVML states a throttled GPU reports."""
import pytest

from replaybench import timing
from replaybench.scenario import TimingConfig

CLEAN = {"sm": 1980.0, "mem": 3201.0, "power": 500.0, "bad": []}
CAPPED = {"sm": 1600.0, "mem": 3201.0, "power": 700.0, "bad": ["sw_power_cap"]}
THERMAL = {"sm": 1400.0, "mem": 3201.0, "power": 650.0, "bad": ["hw_thermal"]}


def test_cpu_timing_per_unit_and_stopping_rule():
    cfg = TimingConfig(warmup=1, min_samples=5, max_samples=7, max_time_s=5.0, rel_iqr=0.0)
    calls = []
    t = timing.time_cpu(lambda: calls.append(1), cfg, per=4)
    assert t.samples == 7 and len(calls) == 8          # warm-up + max_samples (rel_iqr 0 never met)
    assert t.median_us * 4 == pytest.approx(sorted(x * 4 for x in t.raw_us)[3])
    assert not t.power_capped and t.discarded == 0


def test_throttled_batches_are_discarded_and_counted():
    acc = timing._Batches()
    acc.add([10.0, 11.0], CLEAN)
    acc.add([30.0, 31.0], CAPPED)
    acc.add([50.0, 51.0], THERMAL)
    acc.add([12.0, 13.0], CLEAN)
    t = acc.summary(per=1)
    assert t.raw_us == [10.0, 11.0, 12.0, 13.0]
    assert t.discarded == 4 and t.throttle == "hw_thermal,sw_power_cap"
    assert not t.power_capped
    assert t.sm_clock_mhz == pytest.approx(1980.0)


def test_all_batches_power_capped_reports_the_capped_rate():
    acc = timing._Batches()
    for x in (30.0, 32.0, 31.0):
        acc.add([x, x + 1.0], CAPPED)
    t = acc.summary(per=2)
    assert t.power_capped and t.samples == 6 and t.discarded == 0
    assert t.median_us == pytest.approx(15.75)        # per = 2: median of 30..33 is 31.5
    assert t.throttle == "sw_power_cap" and t.sm_clock_mhz == pytest.approx(1600.0)


def test_thermal_throttling_is_never_reported():
    acc = timing._Batches()
    acc.add([30.0], CAPPED)
    acc.add([50.0], THERMAL)
    with pytest.raises(RuntimeError, match="no usable timing samples .2 discarded"):
        acc.summary(per=1)


def test_row_columns():
    acc = timing._Batches()
    acc.add([10.0, 12.0], CLEAN)
    cols = acc.summary(per=1).columns()
    assert cols["median_us"] == pytest.approx(11.0) and cols["samples"] == 2 and cols["discarded"] == 0
    assert cols["power_capped"] is False and cols["throttle"] == "" and cols["power_w"] == pytest.approx(500.0)
    assert set(cols) >= {"iqr_us", "mean_us", "min_us", "rel_iqr", "sm_clock_mhz", "mem_clock_mhz"}


def test_min_samples_hold_even_past_the_time_cap():
    import time as _time

    from replaybench.scenario import TimingConfig
    cfg = TimingConfig(warmup=0, min_samples=3, max_samples=5, max_time_s=1e-6, rel_iqr=0.05)
    t = timing.time_cpu(lambda: _time.sleep(0.002), cfg)
    assert t.samples == 3


def test_noisy_flag():
    from replaybench.timing import Timing
    clean = Timing(median_us=10.0, iqr_us=0.5, samples=10, discarded=0, mean_us=10.0, min_us=9.5)
    assert not clean.noisy and clean.columns()["noisy"] is False
    assert Timing(median_us=10.0, iqr_us=2.0, samples=10, discarded=0, mean_us=10.0, min_us=9.0).noisy
    assert Timing(median_us=10.0, iqr_us=0.0, samples=1, discarded=0, mean_us=10.0, min_us=10.0).noisy
