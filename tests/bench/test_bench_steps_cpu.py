"""The example benchmarks' bodies run (tiny models, a stand-in for gpu_benchmark that calls
the callable once): on a CPU under the Triton interpreter, so the examples follow the kernels'
public API even where no GPU runs them."""
import types

import pytest

import test_bench_steps as ex


@pytest.fixture
def tiny(monkeypatch):
    import torch
    monkeypatch.setattr(ex, "DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
    monkeypatch.setattr(ex, "MAX_LAYERS", 2)
    monkeypatch.setattr(ex, "K", 4)
    calls = []

    def once(fn, per=1, **kw):
        fn()
        calls.append(per)
        return types.SimpleNamespace(median_us=1.0)
    return once, calls


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
def test_example_bodies(tiny, model):
    once, calls = tiny
    ex.test_replay_step(once, model, 2)
    ex.test_eager_step_cold_l2(once, model)
    assert calls[0] == ex.K * 2 and calls[1] == 1       # two layers (MAX_LAYERS) x K steps; one eager step
