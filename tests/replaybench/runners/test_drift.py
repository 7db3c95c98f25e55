"""The drift study and runner (replaybench.drift_study, replaybench.runners.drift) on the CPU
reference: small N, tiny dims. The claims the GPU run reports are checked here in miniature."""
import json
from pathlib import Path

import pytest
import torch

from replaybench import drift_study as D
from replaybench.report.drift import drift_goals, drift_long, drift_section, drift_table
from replaybench.runners import RunContext, SkipCase
from replaybench.runners import drift
from replaybench.scenario import TimingConfig, load_scenario, parse_scenario
from replayssm.inputs import GDNShape, Mamba2Shape

ROOT = Path(__file__).resolve().parents[3]
M2 = Mamba2Shape(4, 16, 16, 2)
GDN = GDNShape(2, 4, 16, 16)


@pytest.fixture(autouse=True)
def one_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)      # tiny tensors: thread hand-offs dominate on a shared CPU
    yield
    torch.set_num_threads(n)


def long_memory(op, heads=4):
    """Every head at |A| dt = 1e-3 (a 1,000-step memory): where shared-low rounding compounds."""
    p = {"dt_bias": D.inv_softplus(torch.full((heads,), 1e-3, dtype=torch.float64)).float(),
         "rate": torch.full((heads,), 1e-3, dtype=torch.float64)}
    if op == "mamba2":
        p["A"] = -torch.ones(heads)
    else:
        p["A_log"] = torch.zeros(heads)
    return p


def test_long_heads_are_the_longest_memories():
    p = D.decay_params("mamba2", 40)
    long = D.long_heads(p)
    assert long.sum() == 4 and p["rate"][long].max() <= p["rate"][~long].min()
    assert D.long_heads(D.decay_params("gdn", 4)).sum() == 1


def test_measure_points_log_spaced_multiples_of_the_window():
    assert D.measure_points(8192) == [32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072,
                                      4096, 6144, 8192]
    assert D.measure_points(100) == [32, 48, 64, 96]
    assert all(t in D.measure_points(8192) for t in D.TABLE_STEPS)


@pytest.mark.parametrize("op", ["mamba2", "gdn"])
def test_decay_spectrum_spans_the_published_ranges(op):
    p = D.decay_params(op, 128, seed=0)
    dt0 = p["dt0"]
    assert dt0.min() >= D.DT_RANGE[0] and dt0.max() <= D.DT_RANGE[1]
    assert dt0.max() / dt0.min() > 50                       # stratified: the whole log range is covered
    s = D.spectrum_summary(p)
    assert s["memory_min_steps"] < 2 and s["memory_max_steps"] > 200
    # the stored float32 dt_bias reproduces dt0 through softplus
    assert torch.allclose(torch.nn.functional.softplus(p["dt_bias"].double()), dt0, rtol=1e-5)


@pytest.mark.parametrize("op,dims", [("mamba2", M2), ("gdn", GDN)])
def test_fp64_reference_is_self_consistent(op, dims):
    """fp64 replay (checkpoint + buffer, flushes) reproduces the fp64 eager reference: the
    oracle every row is measured against does not depend on how the state is carried."""
    p = D.decay_params(op, 4, seed=3)
    ref = D.op_reference(op, dims, 3, p, "cpu", 64, seed=3)
    dec = D.OpDecoder(op, dims, "replay", "float64", "none", 3, p, "reference", "cpu")
    stream = D.InputStream(op, dims, 3, p, "cpu", seed=3)
    worst = 0.0
    for t in range(1, 65):
        _, inp64 = stream.next()
        y = dec.step(inp64)
        if t in ref.outputs:
            worst = max(worst, float(D.rel_err_rows(y, ref.outputs[t]).max()))
        if t in ref.states:
            worst = max(worst, float(D.rel_err_rows(dec.state(), ref.states[t]).max()))
    assert worst < 1e-11


def test_fp64_stack_reference_is_self_consistent():
    from replaybench.models import get_model
    m = get_model("tiny-gdn")
    ref = D.stack_reference(m, 2, "cpu", 48, seed=1)
    st = D.Stack(m, "replay", "float64", "none", 2, "reference", "cpu", torch.float64, seed=1)
    toks = D._tokens(2, D.stack_dims(m)[1], 48, "cpu", 1)
    for t in range(1, 49):
        lp = st.step(toks[t - 1])
        if t in ref.logp:
            assert float((ref.logp[t].exp() * (ref.logp[t] - lp)).sum(-1).abs().max()) < 1e-12


@pytest.mark.parametrize("op,dims", [("mamba2", M2), ("gdn", GDN)])
def test_precision_order_and_fp32_floor(op, dims):
    p = D.decay_params(op, 4, seed=0)
    ref = D.op_reference(op, dims, 4, p, "cpu", 64)
    err = {cfg: D.op_drift(op, dims, *cfg, 4, p, "reference", "cpu", 64, ref)[-1]["out_med"]
           for cfg in [("eager", "float32", "none"), ("eager", "float16", "none"), ("eager", "bfloat16", "none"),
                       ("replay", "float32", "none")]}
    e32, e16, ebf, r32 = err.values()
    assert e32 < 1e-5 and r32 < 1e-5
    assert e32 < e16 < ebf


def test_dual_stays_flat_where_shared_low_grows():
    """Long memories: shared-low rounding enters the recurrence at every flush and compounds;
    dual's low copy is re-rounded from the float32 checkpoint, so its error does not grow."""
    op, dims, n = "mamba2", M2, 256
    p = long_memory(op)
    ref = D.op_reference(op, dims, 4, p, "cpu", n)
    run = lambda *cfg: D.op_drift(op, dims, *cfg, 4, p, "reference", "cpu", n, ref)  # noqa: E731
    dual = run("replay-dual", "float32", "bfloat16")
    shared = run("replay-shared-low", "bfloat16", "bfloat16")
    growth = lambda recs: recs[-1]["out_med"] / recs[0]["out_med"]  # noqa: E731
    assert growth(dual) < 1.5
    assert growth(shared) > 2.0
    assert shared[-1]["out_med"] > 2.0 * dual[-1]["out_med"]
    # the float32 checkpoint under dual carries no low-precision rounding; the shared one does
    assert dual[-1]["state_med"] < 1e-5 < shared[-1]["state_med"]
    assert dual[-1]["lo_med"] < 1e-2                    # the low copy: one bf16 rounding of it


def test_gdn_dual_stays_flat():
    op, dims, n = "gdn", GDN, 192
    p = long_memory(op)
    ref = D.op_reference(op, dims, 4, p, "cpu", n)
    dual = D.op_drift(op, dims, "replay-dual", "float32", "bfloat16", 4, p, "reference", "cpu", n, ref)
    shared = D.op_drift(op, dims, "replay-shared-low", "bfloat16", "bfloat16", 4, p, "reference", "cpu", n, ref)
    assert dual[-1]["out_med"] / dual[0]["out_med"] < 1.5
    assert shared[-1]["out_med"] > dual[-1]["out_med"]
    assert dual[-1]["state_med"] < 1e-5 < shared[-1]["state_med"]


def _case(method, state, lo, model="tiny-mamba2", steps=48, batch=2):
    sc = parse_scenario(f"""
[scenario]
name = "t"
runner = "drift"
[[sweep]]
model = ["{model}"]
method = ["{method}"]
batch = [{batch}]
buffer_len = [16]
state_dtype = ["{state}"]
lo_dtype = ["{lo}"]
steps = [{steps}]
""")
    return sc.cases[0]


CTX = RunContext(device="cpu", timing=TimingConfig())


def test_runner_row_and_series():
    row = drift.run(_case("replay-dual", "float32", "bfloat16"), CTX)
    assert row["config"] == "dual fp32+bf16" and row["steps"] == 48 and row["step"] == 48
    series = json.loads(row["drift_series"])
    assert [r["step"] for r in series] == [32, 48]
    for r in series:
        assert r["out_med"] <= r["out_p99"] and 0 <= r["kl_mean"] and 0 <= r["top1"] <= 1
        assert r["long_med"] <= r["long_p99"]
    assert row["rel_err"] == series[-1]["out_med"] and row["kl"] == series[-1]["kl_mean"]
    assert row["state_rel_err"] < 1e-5                 # the float32 high checkpoint
    assert row["memory_max_steps"] > row["memory_min_steps"] > 0
    from replaybench import schema
    assert set(row) <= set(schema.BY_NAME)             # every column is described in the row schema


def test_runner_skips_what_it_does_not_measure():
    with pytest.raises(SkipCase):
        drift.run(_case("eager", "float64", "none"), CTX)
    with pytest.raises(ValueError, match="steps"):
        drift.run(_case("eager", "float32", "none", steps=20), CTX)


def test_report_section(tmp_path):
    import pandas as pd
    rows = []
    for cfg in [("replay-dual", "float32", "float8_e4m3"), ("replay-shared-low", "float32", "float8_e4m3"),
                ("eager", "float32", "none")]:
        c = _case(*cfg, model="tiny-gdn", steps=64)
        rows.append({**c.params(), **drift.run(c, CTX), "status": "ok", "runner": "drift", "device": "cpu"})
    df = pd.DataFrame(rows)
    long = drift_long(df)
    assert set(long["step"]) == {32, 48, 64} and len(long) == 9
    tab = drift_table(long)
    assert list(tab["config"]) == ["eager fp32", "shared-low fp8", "dual fp32+fp8"]
    goals = drift_goals(long)
    assert list(goals["low dtype"]) == ["fp8"] and goals["fp8 output path"].iloc[0]
    md = drift_section(df, tmp_path)
    assert "## Numerical drift vs fp64" in md and "drift-tiny-gdn.png" in md
    assert (tmp_path / "drift-tiny-gdn.png").stat().st_size > 0
    assert drift_section(df.iloc[0:0], tmp_path) == ""
    # and in a report written from the stored rows
    from replaybench.report import write_report
    from replaybench.store import RunStore
    st = RunStore.create_or_resume(tmp_path / "results", "d", {"scenario": {"name": "drift", "sha256": "x"}})
    for r in rows:
        st.append(r)
    st.unlock()
    out = write_report(st.run_dir, reports_dir=tmp_path / "reports")
    assert "## Numerical drift vs fp64" in (out / "report.md").read_text(encoding="utf-8")
    assert "Numerical drift vs fp64" in (out / "report.html").read_text(encoding="utf-8")
    assert (out / "drift-tiny-gdn.png").exists()


def test_scenarios_parse():
    smoke = load_scenario(ROOT / "scenarios" / "drift-smoke.toml")
    assert smoke.runner == "drift" and len(smoke.cases) == 20
    assert {c.steps for c in smoke.cases} == {96} and {c.backend for c in smoke.cases} == {"reference"}
    gpu = load_scenario(ROOT / "scenarios" / "h200-drift.toml")
    assert len(gpu.cases) == 40 and {c.steps for c in gpu.cases} == {8192}
    assert {c.backend for c in gpu.cases} == {"triton"} and {c.batch for c in gpu.cases} == {64}
    labels = {D.config_label(c.method, c.state_dtype, c.lo_dtype) for c in gpu.cases}
    assert labels == {D.config_label(*cfg) for cfg in D.CONFIGS}


class _Replay:
    """Stands in for a captured step on the CPU: the decoder's own step, optionally wrong
    from call `bad` on (what a graph that froze a host-side decision would do)."""
    bad = None

    def __init__(self, dec, example):
        self.dec, self.calls = dec, 0

    def __call__(self, x):
        self.calls += 1
        y = self.dec.step(x)
        return y * 1.5 if self.bad is not None and self.calls >= self.bad else y


@pytest.mark.parametrize("bad", [None, 17, D.GRAPH_CHECK_STEPS])
def test_graph_replay_is_checked_against_an_eager_twin(monkeypatch, bad):
    """A replay that differs from the eager twin within the check steps hands over to the twin
    (whose state is the decode's); one that agrees runs alone after them."""
    monkeypatch.setattr(D, "_Graphed", type("R", (_Replay,), {"bad": bad}))
    p = D.decay_params("mamba2", 4)
    make = lambda: D.OpDecoder("mamba2", M2, "replay-dual", "float32", "bfloat16", 2, p, "reference", "cpu")  # noqa: E731
    stream = D.InputStream("mamba2", M2, 2, p, "cpu", seed=5)
    ref = make()
    st = D.Stepper(make, stream.next()[0], use_graph=True, warm_steps=2)
    assert st.graphed and st.twin is not None
    for _ in range(32):
        x, _ = stream.next()
        assert torch.equal(st(x), ref.step(x))
    assert st.twin is None and st.graphed == (bad is None)
    assert torch.equal(st.dec.state(), ref.state()) and torch.equal(st.dec.lo_state(), ref.lo_state())
