"""SSM-state memory per request / max concurrency (replaybench.memory), the `memory` CLI
subcommand, and the report's speculative-decoding and memory sections."""
import pytest
import torch

from replaybench import memory as MEM
from replaybench.cli import main
from replaybench.models import get_model
from replaybench.report import write_report
from replaybench.report.spec import memory_params, spec_table
from replayssm.state import GDNReplayState, Mamba2ReplayState

MiB = 1 << 20


def test_nano4b_by_hand():
    nano = get_model("nemotron-3-nano-4b")          # 21 Mamba-2 layers, 96 heads x 80 x 128
    assert MEM.bytes_per_request(nano, "eager") == 78.75 * MiB                    # 3.75 MiB x 21
    assert MEM.bytes_per_request(nano, "spec-perdraft", spec_window=4) == 5 * 78.75 * MiB
    row = 96 * 80 * 2 + 8 * 128 * 2 + 96 * 4                                      # x + B (bf16) + dt (fp32)
    assert row == 17792
    replay = 21 * (3.75 * MiB + 20 * row)                                          # 85.88 MiB
    assert MEM.bytes_per_request(nano, "spec-replay", buffer_len=20) == replay
    dual = 21 * (3.75 * MiB + 1.875 * MiB + 20 * row)                              # fp32 + bf16 copies
    assert MEM.bytes_per_request(nano, "spec-replay-dual", buffer_len=20) == dual
    rows = {r.method: r for r in MEM.memory_table(["nemotron-3-nano-4b"], 80, 4, 20, 16)}
    assert rows["eager"].max_batch == int(80e9 // (78.75 * MiB)) == 968
    assert rows["spec-perdraft"].max_batch == 193
    assert rows["spec-replay"].max_batch == int(80e9 // replay) == 888
    assert rows["spec-replay"].vs_perdraft == pytest.approx(5 * 78.75 * MiB / replay)   # ~4.6x
    assert rows["spec-perdraft"].vs_perdraft == 1.0


def test_qwen122b_gdn_by_hand():
    q = get_model("qwen3.5-122b-a10b")              # 36 GDN layers, 16 k / 64 v heads, 128 x 128
    row = 64 * 128 * 4 + 16 * 128 * 2 + 64 * 4                                     # u fp32 + k bf16 + g
    assert MEM.bytes_per_request(q, "eager") == 144 * MiB
    assert MEM.bytes_per_request(q, "spec-replay", buffer_len=22) == 36 * (4 * MiB + 22 * row)
    dual_row = row + 64 * 128 * 2 + 64 * 4                                         # + raw v, beta
    assert MEM.bytes_per_request(q, "spec-replay-dual", buffer_len=20, lo_dtype="float8_e4m3") == \
        36 * (4 * MiB + 1 * MiB + 64 * 128 * 4 + 20 * dual_row)                    # fp8 copy + row scales


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("mode", ["replay", "dual"])
def test_matches_allocated_state(family, mode):
    """The table counts what ReplaySSM state really allocates per slot (checkpoints + buffer)."""
    L, K = 9, 6
    if family == "mamba2":
        model = get_model("tiny-mamba2")
        d = model.ssm
        rs = Mamba2ReplayState.allocate(1, d.nheads, d.head_dim, d.d_state, d.n_groups, L, K, mode,
                                        lo_dtype="bfloat16" if mode == "dual" else None, device="meta")
    else:
        model = get_model("tiny-gdn")
        d = model.ssm
        rs = GDNReplayState.allocate(1, d.num_k_heads, d.num_v_heads, d.head_k_dim, d.head_v_dim, L, K, mode,
                                     lo_dtype="bfloat16" if mode == "dual" else None, device="meta")
    method = "spec-replay" if mode == "replay" else "spec-replay-dual"
    st, buf, _ = MEM.layer_memory(model, method, 3, L)
    assert st == rs.state_bytes_per_slot() and buf == rs.buffer_bytes_per_slot()
    pd, _, _ = MEM.layer_memory(model, "spec-perdraft", 3, L)
    assert pd == 4 * rs.hi.data[0].numel() * 4


def test_validation():
    with pytest.raises(ValueError, match="L >= K \\+ T"):
        MEM.memory_table(budget_gb=80, spec_window=4, buffer_len=18, flush_period=16)
    with pytest.raises(ValueError, match="budget"):
        MEM.memory_table(budget_gb=0)
    with pytest.raises(ValueError, match="unknown method"):
        MEM.layer_memory(get_model("tiny-gdn"), "eagerly")


def test_cli_memory(capsys):
    assert main(["memory", "--budget-gb", "40", "--spec-window", "2", "--buffer-len", "18",
                 "--flush-period", "16"]) == 0
    out = capsys.readouterr().out
    assert "budget 40 GB" in out and "excluded" in out and "KV cache" in out
    line = next(ln for ln in out.splitlines() if ln.startswith("nemotron-3-nano-4b") and " eager " in ln)
    assert "78.75" in line and str(int(40e9 // (78.75 * MiB))) in line
    assert all(m in out for m in ("qwen3.5-4b", "qwen3.5-122b-a10b", "nemotron-3-super-120b-a12b"))
    assert main(["memory", "qwen3.5-4b"]) == 0
    assert "nemotron" not in capsys.readouterr().out
    assert main(["memory", "--buffer-len", "10"]) == 2
    assert "L >= K + T" in capsys.readouterr().err
    assert main(["memory", "no-such-model"]) == 2


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
    from test_report import make_run    # tests/replaybench is on sys.path (conftest)
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
