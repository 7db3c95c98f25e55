"""The speculative runner (runners/spec.py) on the tiny CPU models: reference backend for both
methods and families, the Triton kernels (interpreted) on small cases, routing from the
kernel runner, the correctness check catching a wrong kernel, and the modelled bytes against
the ops' own byte accounting over the timed schedule."""
import pytest
import torch

from replaybench.models import get_model
from replaybench.runners import RunContext, SkipCase
from replaybench.runners import kernel as kernel_runner
from replaybench.runners import spec as spec_runner
from replaybench.scenario import Case, TimingConfig, make_case_id

TIMING = TimingConfig(warmup=0, min_samples=1, max_samples=1, max_time_s=0.01, rel_iqr=1.0)
CTX = RunContext(device="cpu", timing=TIMING)


def case(model, method, backend="reference", batch=4, T=2, K=4, accept="fixed:1", state="float32", lo="none"):
    m = get_model(model)
    L, K = (K + T, K) if method.startswith("spec-replay") else (0, 0)
    return Case(case_id=make_case_id(model, method, backend, batch, L, K, T, state, lo, 0, accept), runner="kernel",
                model=model, op=m.op, method=method, backend=backend, batch=batch, buffer_len=L, flush_period=K,
                spec_window=T, state_dtype=state, lo_dtype=lo, device="cpu", accept=accept)


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
@pytest.mark.parametrize("method", ["spec-replay", "spec-perdraft"])
def test_reference_rows(model, method):
    c = case(model, method, batch=8, T=3, accept="fixed:2")
    r = kernel_runner.run(c, CTX)                       # routed to runners/spec.py
    assert r["median_us"] > 0 and r["samples"] == 1 and r["layers"] == 1
    assert r["rounds_per_sample"] == max(c.flush_period, 2)
    assert r["mean_accepted"] == r["mean_accepted_drawn"] == 2.0
    per_s = 1e6 / r["median_us"]
    assert r["verified_tokens_per_s"] == pytest.approx(8 * 3 * per_s)
    assert r["committed_tokens_per_s"] == pytest.approx(8 * 2 * per_s)
    # the modelled bytes (long run) vs the ops' own accounting over the first sample's rounds
    # (8 staggered sequences, m = 2, K = 4; odd cursors 1, 3 fold 5 entries once before they
    # settle on the cycle 0, 2: a ~1 % transient)
    assert r["counted_vs_model"] == pytest.approx(1.0, rel=0.02)
    assert r["slots_per_request"] == (4 if method == "spec-perdraft" else 1)


def test_random_acceptance_bytes_close_to_model():
    r = spec_runner.run(case("tiny-gdn", "spec-replay", batch=64, T=4, K=8, accept="uniform"), CTX)
    assert 0 < r["mean_accepted_drawn"] < 4 and r["mean_accepted"] == 2.0
    assert r["counted_vs_model"] == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("model,method", [("tiny-mamba2", "spec-replay"), ("tiny-mamba2", "spec-perdraft"),
                                          ("tiny-gdn", "spec-perdraft")])
def test_triton_interpreted(model, method):
    c = case(model, method, backend="triton", batch=2, T=2, K=2, accept="uniform")
    r = spec_runner.run(c, CTX)
    assert r["check_rel_err"] < 1e-4 and r["median_us"] > 0
    assert r["bytes_counted"] is None                   # skipped for interpreted kernels


def test_check_catches_a_wrong_kernel(monkeypatch):
    real = spec_runner.PD.mamba2_verify

    def wrong(*a, backend="triton", **kw):
        y = real(*a, backend="reference", **kw)
        return y * 1.1 if backend == "triton" else y
    monkeypatch.setattr(spec_runner.PD, "mamba2_verify", wrong)
    with pytest.raises(AssertionError, match="differs from the reference"):
        spec_runner.check_spec(case("tiny-mamba2", "spec-perdraft", backend="triton", batch=3), get_model("tiny-mamba2"),
                               "cpu")


def test_skips():
    with pytest.raises(SkipCase, match="not measured by the speculative runner"):
        spec_runner.run(case("tiny-gdn", "spec-replay").__class__(**{**case("tiny-gdn", "spec-replay").params(),
                                                                     "method": "replay"}), CTX)
    with pytest.raises(SkipCase, match="backend"):
        spec_runner.run(Case(**{**case("tiny-gdn", "spec-perdraft").params(), "backend": "vllm"}), CTX)


@pytest.mark.parametrize("model", ["tiny-mamba2", "tiny-gdn"])
@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_dual_spec_replay(model, backend):
    """spec-replay-dual: the runner builds dual states (fp32 + bf16 low copy) for ours and the
    reference, checks, times, and its bytes follow the dual traffic model (the read copy is
    bf16: fewer bytes than spec-replay's fp32 checkpoint)."""
    kw = dict(batch=4 if backend == "reference" else 2, T=2, K=2 if backend == "triton" else 4, accept="fixed:1")
    d = spec_runner.run(case(model, "spec-replay-dual", backend, lo="bfloat16", **kw), CTX)
    r = spec_runner.run(case(model, "spec-replay", backend, **kw), CTX)
    assert d["median_us"] > 0 and d["bytes_model"] < r["bytes_model"]
    assert d["ssm_bytes_per_request_layer"] > r["ssm_bytes_per_request_layer"]   # two checkpoint copies
    if backend == "reference":
        assert d["counted_vs_model"] == pytest.approx(1.0, rel=0.02)
    else:
        assert d["check_rel_err"] < 3e-2
