"""The gpu_benchmark fixture on a machine without CUDA: a clean skip with the reason."""
import subprocess
import sys

import pytest

from conftest import subprocess_env
from replaybench import pytest_plugin

# registers the plugin where the package is not installed (installed, its entry point did)
CONFTEST = '''
def pytest_configure(config):
    if not config.pluginmanager.hasplugin("replaybench"):
        from replaybench import pytest_plugin
        config.pluginmanager.register(pytest_plugin, "replaybench")
'''

TEST = '''
def test_kernel(gpu_benchmark):
    raise AssertionError("the body of a GPU benchmark must not run without CUDA")
'''


@pytest.mark.skipif(pytest_plugin._cuda_available(), reason="this test is about machines without CUDA")
def test_skips_without_cuda_and_registers_once(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_k.py").write_text(TEST)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(tmp_path)],
                       cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "1 skipped" in r.stdout and pytest_plugin.SKIP_REASON in r.stdout
    assert "Benchmark fixture was not used" not in r.stdout


def test_machine_info_without_gpu_adds_nothing():
    if pytest_plugin._cuda_available():
        pytest.skip("a GPU is present")
    info = {"node": "x"}
    pytest_plugin.pytest_benchmark_update_machine_info(None, info)
    assert info == {"node": "x"} and pytest_plugin.gpu_facts() == {}


RECORD = '''
import os
from replaybench.pytest_plugin import record
from replaybench.timing import Timing

def test_kernel(benchmark):
    scale = float(os.environ["RB_SCALE"])
    xs = [scale * (100.0 + 0.1 * (i % 7)) for i in range(40)]
    record(benchmark, Timing(median_us=sorted(xs)[20], iqr_us=0.3, samples=40, discarded=0, mean_us=sum(xs) / 40,
                             min_us=min(xs), raw_us=xs), {"per": 1})
'''


def test_record_goes_into_pytest_benchmark_storage_and_gates(tmp_path):
    """The fixture's samples land in pytest-benchmark's storage, so its compare-fail gates them:
    a 5 % slower second run fails --benchmark-compare-fail=median:3%, an equal one passes."""
    (tmp_path / "test_r.py").write_text(RECORD)
    store = f"file://{tmp_path / 'bm'}"

    def run(scale, *args):
        return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
                               f"--benchmark-storage={store}", str(tmp_path / "test_r.py"), *args],
                              cwd=tmp_path, env=subprocess_env(RB_SCALE=str(scale)), capture_output=True,
                              text=True, timeout=300)
    r = run(1.0, "--benchmark-autosave", f"--benchmark-json={tmp_path / 'b.json'}")
    assert r.returncode == 0, r.stdout + r.stderr
    import json
    b = json.loads((tmp_path / "b.json").read_text())["benchmarks"][0]
    assert b["stats"]["rounds"] == 40 and abs(b["stats"]["median"] - 100.3e-6) < 1e-9
    assert b["extra_info"]["samples"] == 40 and b["extra_info"]["per"] == 1
    r = run(1.0, "--benchmark-compare", "--benchmark-compare-fail=median:3%")
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(1.05, "--benchmark-compare", "--benchmark-compare-fail=median:3%")
    assert r.returncode != 0 and "median" in (r.stdout + r.stderr)


class _FakeEvent:
    """A CUDA event on a fake clock: every record() is 100 us after the previous one."""
    clock = 0

    def __init__(self, enable_timing=False):
        self.t = None

    def record(self):
        _FakeEvent.clock += 1
        self.t = _FakeEvent.clock

    def elapsed_time(self, end):          # ms, as torch reports it
        return (end.t - self.t) * 0.1


class _FakeBenchmark:
    disabled = False

    def __init__(self):
        self.extra_info, self.rounds = {}, []

    def _make_stats(self, iterations):
        assert iterations == 1
        rec = self

        class Stats:
            def update(self, seconds):
                rec.rounds.append(seconds)
        return Stats()


@pytest.mark.parametrize("cold", [False, True])
def test_gpu_benchmark_flow_on_a_fake_gpu(monkeypatch, cold):
    """The fixture's measurement loop with CUDA faked: graph capture, events, the stopping
    rule, per-unit times into pytest-benchmark's stats, the facts into extra_info."""
    import types

    import torch

    from replaybench import timing
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(timing, "warm_up", lambda fn, n: fn())
    monkeypatch.setattr(timing, "capture", lambda fn: types.SimpleNamespace(replay=fn))
    calls, setups = [], []
    bm = _FakeBenchmark()
    t = pytest_plugin.GpuBenchmark(bm)(lambda: calls.append(1), per=4, min_samples=12, max_samples=30,
                                       setup=(lambda: setups.append(1)) if cold else None, batch=6)
    assert t.samples == 12 and t.median_us == pytest.approx(25.0)      # 100 us a sample, 4 units
    assert bm.rounds == [pytest.approx(25e-6)] * 12
    assert bm.extra_info["timer"] == "cuda events (CUDA graph replay)" and bm.extra_info["per"] == 4
    assert bm.extra_info["samples"] == 12 and bm.extra_info["power_capped"] is False
    assert len(setups) == (12 if cold else 0) and len(calls) >= 12
