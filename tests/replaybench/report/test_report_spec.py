"""The report's speculative-decoding and memory sections (replaybench.report.spec)."""
import pytest
from test_report import make_run    # a sibling module: pytest puts this folder on sys.path

from replaybench.report import write_report
from replaybench.report.spec import memory_params, spec_table


def _spec_rows():
    rows = []
    for model, op in (("tiny-mamba2", "mamba2"), ("qwen3.5-4b", "gdn")):
        for batch in (4, 16):
            for method, med in (("spec-replay", 10.0), ("spec-perdraft", 35.0), ("vllm-spec", 40.0)):
                L, K = (20, 16) if method == "spec-replay" else (0, 0)
                rows.append({"run_id": "spec", "case_id": f"{model}/{method}/b{batch}", "runner": "kernel",
                             "model": model, "op": op, "method": method,
                             "backend": "vllm" if method == "vllm-spec" else "triton", "batch": batch,
                             "buffer_len": L, "flush_period": K, "spec_window": 4, "state_dtype": "float32",
                             "lo_dtype": "none", "accept": "fixed:2", "device": "cpu", "median_us": med * batch,
                             "iqr_us": 0.1, "samples": 3, "bytes_model": 1e6, "gbps": None, "pct_copy_bw": None,
                             "status": "ok", "error": None})
    return rows


def test_report_spec_and_memory_sections(tmp_path):
    make_run(tmp_path, run_id="spec", rows=_spec_rows())
    out = write_report("spec", reports_dir=tmp_path / "reports", results_dir=tmp_path / "results")
    md = (out / "report.md").read_text()
    assert (out / "memory.png").exists() and (out / "spec_speedup.png").exists()
    assert "## SSM-state memory and max concurrency" in md and "## Speculative decoding (same run)" in md
    assert "T = 4, L = 20, K = 16" in md and "| qwen3.5-4b | spec-perdraft | 1 + T = 5 states (float32) |" in md
    assert "3.5" in md                                       # 35 / 10: spec-replay over per-draft
    html = (out / "report.html").read_text()
    assert "SSM-state memory and max concurrency" in html and html.count("data:image/png;base64") >= 4


def test_spec_speedup_figure_has_one_legend_below_the_panels():
    """One figure-level legend (each line and the goal once), none inside a panel, where it
    would cover lines."""
    import matplotlib.pyplot as plt
    import pandas as pd
    from replaybench.report.spec import spec_speedup_figure
    fig = spec_speedup_figure(spec_table(pd.DataFrame(_spec_rows())))
    try:
        assert all(ax.get_legend() is None for ax in fig.axes)
        (legend,) = fig.legends
        labels = [t.get_text() for t in legend.get_texts()]
        assert len(labels) == len(set(labels)) and any(lb.startswith("goal") for lb in labels)
        assert any(lb.startswith("spec-replay/triton T=4") for lb in labels), labels
    finally:
        plt.close(fig)
    assert spec_speedup_figure(spec_table(pd.DataFrame(_spec_rows())).iloc[0:0]) is None


def test_spec_table_and_memory_params():
    import pandas as pd
    df = pd.DataFrame(_spec_rows())
    st = spec_table(df)
    r = st[(st["method"] == "spec-replay") & (st["batch"] == 16) & (st["model"] == "qwen3.5-4b")].iloc[0]
    assert r["vs_perdraft"] == pytest.approx(3.5)
    assert r["verified_tokens_per_s"] == pytest.approx(16 * 4 / 160e-6)
    assert r["committed_tokens_per_s"] == pytest.approx(16 * 2 / 160e-6)          # fixed:2
    v = st[(st["method"] == "vllm-spec") & (st["batch"] == 4)].iloc[0]
    assert v["vs_perdraft"] == pytest.approx(35 / 40)
    assert memory_params(df) == {"spec_window": 4, "flush_period": 16, "buffer_len": 20}
    assert memory_params(df.iloc[0:0]) == {"spec_window": 4, "flush_period": 16, "buffer_len": 20}
    assert spec_table(df[df["method"] == "eager"]).empty
