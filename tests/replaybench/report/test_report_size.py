"""Model-size section (replaybench/report/size.py): synthetic runs of width/depth-scaled tiny models."""
import pytest

from replaybench.models import get_model
from replaybench.report import write_report
from replaybench.report.size import sections, size_table
from replaybench.store import RunStore

from rb_runs import store_run, syn_manifest

H200 = {"kind": "cuda", "name": "NVIDIA H200", "label": "NVIDIA H200"}
EAGER_US = {"tiny-mamba2@d1w0.5": 10.0, "tiny-mamba2": 20.0, "tiny-mamba2@d1w2": 40.0, "tiny-gdn": 30.0,
            "tiny-mamba2@d0.5w1": 20.0}
SPEEDUP = {"replay": 1.25, "replay-dual": 1.6}     # eager / method, the same at every size and batch


def row(model, method, batch, med, L=16, K=16):
    L, K = (0, 0) if method == "eager" else (L, K)
    lo = "bfloat16" if method == "replay-dual" else "none"
    return {"run_id": "syn", "case_id": f"{model}/{method}/triton/b{batch}/L{L}/K{K}/T0/float32/{lo}",
            "runner": "kernel", "model": model, "op": get_model(model).op, "method": method,
            "backend": "triton", "batch": batch, "buffer_len": L, "flush_period": K, "spec_window": 0,
            "state_dtype": "float32", "lo_dtype": lo, "device": "NVIDIA H200", "median_us": med,
            "iqr_us": 0.01 * med, "samples": 10, "bytes_model": 1000.0 * batch, "gbps": None,
            "pct_copy_bw": 50.0 + batch / 100, "status": "ok", "error": None}


def rows_for(models, batches=(4, 16)):
    out = []
    for model in models:
        for b in batches:
            eager = EAGER_US[model] * b
            out.append(row(model, "eager", b, eager))
            for method, s in SPEEDUP.items():
                out.append(row(model, method, b, eager / s))
    return out


def make_run(tmp_path, rows, run_id="syn"):
    store_run(tmp_path, run_id, syn_manifest(run_id, H200), rows)
    return write_report(run_id, reports_dir=tmp_path / "reports", results_dir=tmp_path / "results")


def test_section_with_width_variants_has_speedups_from_the_rows(tmp_path):
    widths = ["tiny-mamba2@d1w0.5", "tiny-mamba2", "tiny-mamba2@d1w2"]
    rows = rows_for(widths + ["tiny-gdn"])
    out = make_run(tmp_path, rows)
    md, html = (out / "report.md").read_text(), (out / "report.html").read_text()
    assert "## Speedup vs model width" in md and "![Speedup vs model width](model_size.png)" in md
    assert "same run on the same GPU" in md
    assert "## Model size: speedup vs eager (same run)" in md and "Speedup vs model width" in html
    assert (out / "model_size.png").stat().st_size > 5000 and (out / "model_size.svg").exists()

    t = size_table(RunStore.open("syn", tmp_path / "results").dataframe())
    # one row per (variant, method, batch); tiny-gdn has no variants and is not in the section
    assert len(t) == 3 * 2 * 2 and set(t["base model"]) == {"tiny-mamba2"}
    assert list(dict.fromkeys(t["width"])) == [0.5, 1.0, 2.0]
    med = {(r["model"], r["method"], r["batch"]): r["median_us"] for r in rows}
    for r in t.to_dict("records"):
        eager = med[(r["model"], "eager", r["batch"])]
        assert r["eager_us"] == eager and r["median_us"] == med[(r["model"], r["method"], r["batch"])]
        assert r["speedup"] == pytest.approx(eager / r["median_us"]) == pytest.approx(SPEEDUP[r["method"]])
        assert r["state_bytes"] == get_model(r["model"]).state_bytes_per_layer(4)
        assert r["pct_copy_bw"] == 50.0 + r["batch"] / 100
    # tiny-mamba2 x0.5: 2 heads x 16 x 16 fp32 = 2 KiB per layer and sequence; the md table row says so
    assert ("| tiny-mamba2 | 1 | 0.5 | 2 KiB | replay-dual | triton | L16 K16, lo bfloat16 | 16 | 100 | 160 | 1.6 "
            "| 50.16 |") in md


def test_one_cell_heat_maps_skipped_only_for_models_the_section_shows(tmp_path):
    rows = rows_for(["tiny-mamba2@d1w0.5", "tiny-mamba2@d1w2", "tiny-gdn"])
    # the x1 model gets a second (L, K) cell: a 2-cell heat map, kept
    rows += rows_for(["tiny-mamba2"])
    rows += [row("tiny-mamba2", "replay", b, 20.0 * b / 1.1, L=16, K=8) for b in (4, 16)]
    out = make_run(tmp_path, rows)
    assert not (out / "speedup_tiny-mamba2_d1w0.5.png").exists()
    assert not (out / "speedup_tiny-mamba2_d1w2.png").exists()
    assert (out / "speedup_tiny-mamba2.png").exists()
    assert (out / "speedup_tiny-gdn.png").exists()            # one cell, but no variants: kept
    md = (out / "report.md").read_text()
    assert "Speedup vs eager: tiny-mamba2@d1w2" not in md and "Speedup vs eager: tiny-gdn" in md


@pytest.mark.parametrize("models", [["tiny-mamba2", "tiny-gdn"], ["tiny-mamba2@d1w2", "tiny-gdn"]])
def test_section_absent_without_two_variants_of_a_model(tmp_path, models):
    out = make_run(tmp_path, rows_for(models))
    md = (out / "report.md").read_text()
    assert "model_size" not in md and "Model size" not in md and not (out / "model_size.png").exists()
    assert all((out / f"speedup_{m.replace('@', '_')}.png").exists() for m in models)   # 1-cell heat maps kept


def test_depth_variants_plot_the_whole_sequence_state(tmp_path):
    rows = rows_for(["tiny-mamba2", "tiny-mamba2@d0.5w1"])
    make_run(tmp_path, rows)
    figures, tables = sections(RunStore.open("syn", tmp_path / "results").dataframe(), {"device": H200},
                               tmp_path, cpu=False)
    assert [f[0] for f in figures] == ["Speedup vs model depth"] and (tmp_path / "model_size.png").exists()
    assert tables[0][2]["depth"].tolist()[:2] == [0.5, 0.5]
