"""Roofline / measured-traffic / vs-vLLM report views from synthetic rows."""
import pandas as pd
import pytest

from replaybench.report import roofline as RR
from replaybench.report.common import save_figure


def rows():
    base = dict(model="m", op="mamba2", backend="triton", batch=256, buffer_len=0, flush_period=0,
                state_dtype="float32", lo_dtype="none", status="ok", case_id="x", pct_copy_bw=90.0)
    return pd.DataFrame([
        {**base, "method": "eager", "median_us": 500.0, "bytes_model": 2e9, "flops_model": 1e9, "dram_bytes": 2.05e9},
        {**base, "method": "vllm-eager", "backend": "vllm", "median_us": 600.0, "bytes_model": 2e9,
         "flops_model": 1e9, "dram_bytes": None},
        {**base, "method": "replay", "buffer_len": 16, "flush_period": 16, "median_us": 300.0, "bytes_model": 1.1e9,
         "flops_model": 0.5e9, "dram_bytes": 1.5e9, "case_id": "y"},
        {**base, "method": "replay", "status": "error", "median_us": None, "bytes_model": None, "flops_model": None,
         "dram_bytes": None, "case_id": "z"},
    ])


def test_peer_table_ratios():
    t = RR.peer_table(rows())
    rep = t[t["method"] == "replay"].iloc[0]
    assert rep["vs_vllm_eager"] == pytest.approx(2.0) and rep["vs_our_eager"] == pytest.approx(500 / 300)
    assert len(t) == 3  # the error row is left out


def test_traffic_mismatch_flags_only_beyond_10_percent():
    mism = RR.traffic_mismatches(rows())
    assert list(mism["case_id"]) == ["y"]
    assert mism["dram_vs_model"].iloc[0] == pytest.approx(1.5 / 1.1)


def test_sections_write_figures(tmp_path):
    manifest = {"ceilings": {"copy_gbps": 4000.0, "read_gbps": 4200.0, "matmul_tflops": 780.0},
                "device": {"name": "GPU"}}
    figs, tables = RR.sections(rows(), manifest, tmp_path, save_figure)
    names = {p.name for _, _, p in figs}
    assert names == {"roofline.png", "traffic_measured.png"}
    assert (tmp_path / "roofline.svg").exists()
    assert [t[0].split(":")[0] for t in tables] == ["Traffic", "Against vLLM's eager kernel (same run)"]
