"""Paper-style section (replaybench/report/paper.py): ratios over vLLM's kernels next to the published points."""
import json
import tomllib
from importlib import resources

import pytest

from replaybench.report import paper as RP
from replaybench.report import write_report
from test_report import GPU_DEVICE, make_run

STUDY = {"nemotron-3-nano-4b": "mamba2", "qwen3.5-4b": "gdn"}
# vLLM median / method median, chosen against the published ranges (Nemotron-3 1.43-1.84,
# Qwen3.5 1.43-1.64, speculative 1.8-2.1): nano replay within, qwen replay above,
# spec nano b256 below / b512 within, qwen b256 above / b512 below
VLLM_EAGER_US = 600.0
REPLAY_US = {"nemotron-3-nano-4b": 600.0 / 1.6, "qwen3.5-4b": 600.0 / 1.7}
VLLM_SPEC_US = 2000.0
SPEC_REPLAY_US = {("nemotron-3-nano-4b", 256): 2000.0 / 1.5, ("nemotron-3-nano-4b", 512): 2000.0 / 2.0,
                  ("qwen3.5-4b", 256): 2000.0 / 2.5, ("qwen3.5-4b", 512): 2000.0 / 1.2}


def paper_rows(vllm: bool = True):
    rows = []

    def add(model, method, batch, med, backend="triton", L=0, K=0, T=0, lo="none", accept="none"):
        rows.append({"run_id": "paper", "case_id": f"{model}/{method}/{backend}/b{batch}/L{L}/K{K}/T{T}/float32/{lo}",
                     "runner": "kernel", "model": model, "op": STUDY[model], "method": method, "backend": backend,
                     "batch": batch, "buffer_len": L, "flush_period": K, "spec_window": T,
                     "state_dtype": "float32", "lo_dtype": lo, "device": "NVIDIA H200", "median_us": med,
                     "iqr_us": 0.01 * med, "samples": 10, "bytes_model": 1e6 * batch, "gbps": None,
                     "pct_copy_bw": None, "status": "ok", "error": None, "accept": accept})

    for model in STUDY:
        for batch in (1, 256):
            s = batch / 256
            add(model, "eager", batch, 500.0 * s)
            add(model, "replay", batch, REPLAY_US[model] * s, L=16, K=16)
            add(model, "replay-dual", batch, 350.0 * s, L=16, K=16, lo="bfloat16")
            if vllm:
                add(model, "vllm-eager", batch, VLLM_EAGER_US * s, backend="vllm")
        for batch in (256, 512):
            add(model, "spec-replay", batch, SPEC_REPLAY_US[(model, batch)], L=20, K=16, T=4, accept="fixed:2")
            add(model, "spec-perdraft", batch, 1900.0, T=4, accept="fixed:2")
            if vllm:
                add(model, "vllm-spec", batch, VLLM_SPEC_US, backend="vllm", T=4, accept="fixed:2")
    return rows


def _paper_run(tmp_path, rows, scenario="paper", run_id="paper"):
    make_run(tmp_path, device=GPU_DEVICE, run_id=run_id, rows=rows)
    path = tmp_path / "results" / run_id / "manifest.json"
    m = json.loads(path.read_text())
    m["scenario"]["name"] = scenario
    path.write_text(json.dumps(m))
    return write_report(run_id, reports_dir=tmp_path / "reports", results_dir=tmp_path / "results")


def test_published_toml_loads_with_the_package():
    text = resources.files("replaybench").joinpath("published.toml").read_text(encoding="utf-8")
    raw = tomllib.loads(text)["point"]
    pts = RP.load_published()
    assert len(pts) == len(raw) == 3
    by = {(p.baseline, p.family): p for p in pts}
    assert (by[("vllm-eager", "Nemotron-3")].low, by[("vllm-eager", "Nemotron-3")].high) == (1.43, 1.84)
    assert (by[("vllm-eager", "Qwen3.5")].low, by[("vllm-eager", "Qwen3.5")].high) == (1.43, 1.64)
    spec = [p for p in pts if p.baseline == "vllm-spec"][0]
    assert (spec.low, spec.high, spec.spec_window, spec.batches) == (1.8, 2.1, 4, (256, 512))
    for p in pts:
        assert p.source and p.gpu and p.what
    assert by[("vllm-eager", "Nemotron-3")].covers("nemotron-3-super-120b-a12b")
    assert not by[("vllm-eager", "Nemotron-3")].covers("qwen3.5-4b")


def test_classification():
    p = RP.load_published()[0]
    assert p.classify(p.low - 1e-9) == "below"
    assert p.classify(p.low) == "within" and p.classify(p.high) == "within"
    assert p.classify(p.high + 1e-9) == "above"


def test_table_ratios_are_vllm_over_method_medians_from_rows():
    import pandas as pd
    df = pd.DataFrame(paper_rows())
    t = RP.paper_table(df)
    assert len(t) == 2 + 4           # 2 models x batch 256, 2 models x batch 256/512 speculative
    for r in t.to_dict("records"):
        sub = df[(df["model"] == r["model"]) & (df["batch"] == r["batch"])]
        meth = sub[sub["method"] == r["method"]]["median_us"].iloc[0]
        base = sub[sub["method"] == r["baseline"]]["median_us"].iloc[0]
        assert r["method_us"] == meth and r["baseline_us"] == base
        assert r["ratio"] == pytest.approx(base / meth)
    got = {(r["model"], r["method"], r["batch"]): r["vs published"] for r in t.to_dict("records")}
    assert got == {("nemotron-3-nano-4b", "replay", 256): "within",
                   ("qwen3.5-4b", "replay", 256): "above",
                   ("nemotron-3-nano-4b", "spec-replay", 256): "below",
                   ("nemotron-3-nano-4b", "spec-replay", 512): "within",
                   ("qwen3.5-4b", "spec-replay", 256): "above",
                   ("qwen3.5-4b", "spec-replay", 512): "below"}
    assert set(t["published"]) == {"1.43–1.84×", "1.43–1.64×", "1.8–2.1×"}


def test_ratio_at_copy_is_the_bound_the_method_bytes_set(tmp_path):
    # a method row at 80 % of the run's copy ceiling reaches ratio / 0.8 at the ceiling; rows
    # without a ceiling (pct_copy_bw empty) leave both columns empty
    import math

    import pandas as pd
    rows = paper_rows()
    for r in rows:
        if (r["model"], r["method"], r["batch"]) == ("nemotron-3-nano-4b", "replay", 256):
            r["pct_copy_bw"] = 80.0
    t = RP.paper_table(pd.DataFrame(rows))
    got = {(r["model"], r["method"], r["batch"]): r for r in t.to_dict("records")}
    nano = got.pop(("nemotron-3-nano-4b", "replay", 256))
    assert nano["method_pct_copy"] == 80.0
    assert nano["ratio_at_copy"] == pytest.approx(600.0 / REPLAY_US["nemotron-3-nano-4b"] / 0.8)
    assert all(math.isnan(r["method_pct_copy"]) and math.isnan(r["ratio_at_copy"]) for r in got.values())
    md = (_paper_run(tmp_path, rows) / "report.md").read_text()
    assert "| ratio | method_pct_copy | ratio_at_copy |" in md and "| 1.6 | 80 | 2 |" in md


def test_throttled_rows_are_named_beside_their_ratios(tmp_path):
    # a power-capped method row and a throttled baseline row: the table says which side and at
    # what clock, the figure marks the bar; unthrottled pairs stay unmarked
    import pandas as pd
    rows = paper_rows()
    for r in rows:
        if (r["model"], r["method"], r["batch"]) == ("nemotron-3-nano-4b", "replay", 256):
            r.update(throttle="sw_power_cap", power_capped=True, sm_clock_mhz=1755.0)
        elif (r["model"], r["method"], r["batch"]) == ("qwen3.5-4b", "vllm-spec", 512):
            r.update(throttle="hw_slowdown", power_capped=False, sm_clock_mhz=1410.0)
    t = RP.paper_table(pd.DataFrame(rows))
    got = {(r["model"], r["method"], r["batch"]): r["throttled"] for r in t.to_dict("records")}
    assert got.pop(("nemotron-3-nano-4b", "replay", 256)) == "replay: sw_power_cap (power-capped), SM 1755 MHz"
    assert got.pop(("qwen3.5-4b", "spec-replay", 512)) == "vllm-spec: hw_slowdown, SM 1410 MHz"
    assert set(got.values()) == {""}
    from replaybench.report.common import plt
    fig, ax = plt.subplots()
    RP._draw_panel(ax, RP._panels(RP.paper_ok_rows(pd.DataFrame(rows)), RP.load_published())[0])     # standard decode
    labels = [x.get_text() for x in ax.texts]
    plt.close(fig)
    assert f"{600.0 / REPLAY_US['nemotron-3-nano-4b']:.2f}{RP.THROTTLE_MARK}" in labels
    assert sum(lab.endswith(RP.THROTTLE_MARK) for lab in labels) == 1
    md = (_paper_run(tmp_path, rows) / "report.md").read_text()
    assert "replay: sw_power_cap (power-capped), SM 1755 MHz" in md and RP.THROTTLE_MARK in md


def test_non_study_models_are_left_out():
    import pandas as pd
    rows = paper_rows()
    for r in rows:
        if r["model"] == "qwen3.5-4b":
            r["model"] = "qwen3.5-4b@d1w0.5"
    t = RP.paper_table(pd.DataFrame(rows))
    assert set(t["model"]) == {"nemotron-3-nano-4b"}


def test_section_in_report(tmp_path):
    out = _paper_run(tmp_path, paper_rows())
    md = (out / "report.md").read_text()
    for ext in ("png", "svg"):
        assert (out / f"paper_style.{ext}").stat().st_size > 5000
    assert "## Paper-style: against vLLM's kernels vs the published reference points" in md
    assert "## Paper reference points vs this run" in md
    assert "Kernel level at batch 256: Nemotron-3 1.43–1.84×, Qwen3.5 1.43–1.64×." in md
    assert "paper_style.png" in md and "<h2>Paper reference points vs this run</h2>" in (out / "report.html").read_text()
    # byte-reproducible
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    write_report("paper", reports_dir=tmp_path / "reports", results_dir=tmp_path / "results")
    assert first == {p.name: p.read_bytes() for p in out.iterdir()}


def test_only_spec_panel_without_vllm_eager(tmp_path):
    rows = [r for r in paper_rows() if r["method"] != "vllm-eager"]
    out = _paper_run(tmp_path, rows)
    md = (out / "report.md").read_text()
    assert (out / "paper_style.png").exists()
    table = md.split("## Paper reference points vs this run")[1].split("\n## ")[0]
    assert "spec-replay" in table and "| replay |" not in table


def test_section_absent_without_vllm_rows(tmp_path):
    out = _paper_run(tmp_path, paper_rows(vllm=False))
    md = (out / "report.md").read_text()
    assert not (out / "paper_style.png").exists() and not (out / "paper_style.svg").exists()
    assert "Paper-style" not in md and "Paper reference points" not in md


def test_section_absent_for_other_scenarios(tmp_path):
    out = _paper_run(tmp_path, paper_rows(), scenario="h200-kernels", run_id="kernels")
    md = (out / "report.md").read_text()
    assert not (out / "paper_style.png").exists() and "Paper reference points" not in md
