import re

import pytest

from replaybench.report import speedup_table, write_report

from rb_runs import store_run

CPU_DEVICE = {"kind": "cpu", "name": "Test CPU 9000", "label": "cpu", "torch_threads": 2}
GPU_DEVICE = {"kind": "cuda", "name": "NVIDIA H200", "label": "NVIDIA H200", "uuid": "GPU-1234",
              "driver": "999.1", "cuda_driver_version": "13.0", "power_limit_w": 700.0,
              "sm_clock_mhz": 1980, "max_sm_clock_mhz": 1980, "mem_clock_mhz": 3201,
              "max_mem_clock_mhz": 3201, "compute_capability": "9.0", "multiprocessors": 132}


def make_run(tmp_path, device=CPU_DEVICE, run_id="synthetic", rows=None):
    manifest = {"run_id": run_id, "created": "2026-01-01T00:00:00+00:00",
                "scenario": {"name": "syn", "path": "syn.toml", "sha256": "f" * 64, "runner": "kernel",
                             "n_cases": 0},
                "device": device, "versions": {"python": "3.11", "torch": "2.13", "triton": "3.6",
                                               "vllm": None},
                "env": {"TRITON_INTERPRET": "1" if device["kind"] == "cpu" else None},
                "ceilings": {"copy_gbps": 20.0, "read_gbps": 21.0, "matmul_tflops": 0.1,
                             "matmul_dtype": "float32"},
                "git": {"sha": "deadbeef", "dirty": True}, "sessions": []}
    return store_run(tmp_path, run_id, manifest, rows if rows is not None else synthetic_rows(device["label"]))


def synthetic_rows(device="cpu"):
    rows = []
    for model, op in (("tiny-mamba2", "mamba2"), ("tiny-gdn", "gdn")):
        for backend in ("reference", "triton"):
            for batch in (1, 4, 16):
                def add(method, L, K, state, lo, med, status="ok", error=None):
                    cid = f"{model}/{method}/{backend}/b{batch}/L{L}/K{K}/T0/{state}/{lo}"
                    rows.append({"run_id": "synthetic", "case_id": cid, "runner": "kernel",
                                 "model": model, "op": op, "method": method, "backend": backend,
                                 "batch": batch, "buffer_len": L, "flush_period": K, "spec_window": 0,
                                 "state_dtype": state, "lo_dtype": lo, "device": device,
                                 "median_us": med if status == "ok" else None,
                                 "iqr_us": 0.02 * med if status == "ok" else None,
                                 "samples": 10, "bytes_model": 1000.0 * batch * (2 if method == "eager" else 1.1),
                                 "gbps": None, "pct_copy_bw": None, "status": status, "error": error})
                eager = 10.0 * batch
                add("eager", 0, 0, "float32", "none", eager)
                for L, K in ((8, 8), (16, 8), (16, 16)):
                    add("replay", L, K, "float32", "none", eager / (1.2 + 0.01 * K))
                    add("replay-dual", L, K, "float32", "bfloat16", eager / 1.5)
                    add("replay-shared-low", L, K, "bfloat16", "bfloat16", eager / 1.6,
                        status="error" if (batch == 1 and L == 8 and backend == "triton") else "ok",
                        error="CompilationError: boom <b>|pipe" if (batch == 1 and L == 8 and backend == "triton") else None)
    return rows


def test_report_files_and_content(tmp_path):
    st = make_run(tmp_path)
    out = write_report("synthetic", reports_dir=tmp_path / "reports", results_dir=tmp_path / "results")
    assert out == tmp_path / "reports" / "synthetic"
    for stem in ("time_vs_batch", "bytes_per_step", "speedup_tiny-mamba2", "speedup_tiny-gdn", "memory"):
        for ext in ("png", "svg"):
            f = out / f"{stem}.{ext}"
            assert f.exists() and f.stat().st_size > 5000, f
        assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    # CPU runs are labelled as such, with the CPU name
    assert "CPU run" in md and "NOT GPU performance" in md and "Test CPU 9000" in md
    assert "CPU run" in html and "Test CPU 9000" in html
    # self-contained html: every image inlined
    imgs = re.findall(r"<img[^>]*src='([^']*)'", html)
    assert len(imgs) == 5 and all(s.startswith("data:image/png;base64,") for s in imgs)
    assert "## SSM-state memory and max concurrency" in md     # for the run's models (no spec rows: T = 4)
    # all rows are in the tables, errors with their (escaped) message
    n = len(synthetic_rows())
    assert f"All rows ({n})" in md and f"All rows ({n})" in html
    assert "Errors (2)" in md
    assert "CompilationError: boom <b>\\|pipe" in md
    assert "CompilationError: boom &lt;b&gt;|pipe" in html
    assert "deadbeef (dirty)" in md and "copy 20 GB/s" in md
    # parquet / csv re-materialised from the jsonl log by report
    assert st.parquet_path.exists() and st.csv_path.exists()


def test_speedups_from_same_run_rows(tmp_path):
    st = make_run(tmp_path)
    sp = speedup_table(st.dataframe())
    r = sp[(sp.model == "tiny-gdn") & (sp.method == "replay") & (sp.backend == "triton")
           & (sp.batch == 16) & (sp.buffer_len == 16) & (sp.flush_period == 16)]
    assert len(r) == 1 and r["speedup"].iloc[0] == pytest.approx(1.2 + 0.16)
    d = sp[(sp.method == "replay-dual")]
    assert d["speedup"].round(9).unique().tolist() == [1.5]
    # shared-low (bfloat16 state) falls back to eager float32, labelled
    s = sp[sp.method == "replay-shared-low"]
    assert set(s["eager_state_dtype"]) == {"float32"} and len(s) == 2 * 2 * 3 * 3 - 2
    assert s["speedup"].round(9).unique().tolist() == [1.6]


def test_speedups_name_the_replay_steps_route(tmp_path):
    from replaybench.report import route_label
    assert [route_label(k) for k in (0, 1, 2, None, float("nan"))] == \
        ["buffered", "state written every step (eager-shaped)", "state written every 2 steps", "", ""]
    rows = [r for r in synthetic_rows() if r["model"] == "tiny-gdn" and r["backend"] == "triton"]
    for r in rows:
        if r["method"] != "eager":
            r["route_period"] = 1 if r["batch"] <= 1 else 0
    st = make_run(tmp_path, rows=rows)
    sp = speedup_table(st.dataframe())
    assert set(sp["route"]) == {"buffered", "state written every step (eager-shaped)"}
    out = write_report("synthetic", reports_dir=tmp_path / "reports", results_dir=tmp_path / "results")
    assert "| speedup | route |" in (out / "report.md").read_text()


def test_gpu_header_and_rerun_removes_stale_figures(tmp_path):
    rows = [r for r in synthetic_rows("NVIDIA H200") if r["model"] == "tiny-gdn"
            and r["backend"] == "triton" and r["method"] in ("eager", "replay")]
    make_run(tmp_path, device=GPU_DEVICE, run_id="gpu", rows=rows)
    out = tmp_path / "reports" / "gpu"
    out.mkdir(parents=True)
    (out / "speedup_old-model.png").write_bytes(b"x")
    write_report(tmp_path / "results" / "gpu", reports_dir=tmp_path / "reports")
    md = (out / "report.md").read_text()
    assert "CPU run" not in md and "NVIDIA H200" in md and "GPU-1234" in md
    assert "999.1" in md and "700.0 W" in md and "1980" in md
    assert not (out / "speedup_old-model.png").exists()


def test_report_with_only_errors_or_no_rows(tmp_path):
    rows = [r for r in synthetic_rows() if r["status"] == "error"]
    make_run(tmp_path, run_id="errs", rows=rows)
    out = write_report("errs", reports_dir=tmp_path / "reports", results_dir=tmp_path / "results")
    assert (out / "report.html").exists() and not (out / "time_vs_batch.png").exists()  # nothing timed
    md = (out / "report.md").read_text()
    assert "Errors (2)" in md and "Speedups vs eager" not in md
    make_run(tmp_path, run_id="empty", rows=[])
    out = write_report("empty", reports_dir=tmp_path / "reports", results_dir=tmp_path / "results")
    assert "All rows (0)" in (out / "report.md").read_text()


def test_throttle_table_lists_throttled_and_power_capped_rows():
    import pandas as pd

    from replaybench.report.overview import throttle_table
    df = pd.DataFrame([
        {"case_id": "a", "method": "replay", "status": "ok", "throttle": "", "discarded": 0, "samples": 10,
         "power_capped": False},
        {"case_id": "b", "method": "spec-replay", "status": "ok", "throttle": "sw_power_cap", "discarded": 0,
         "samples": 40, "power_capped": True},
        {"case_id": "c", "method": "eager", "status": "ok", "throttle": "hw_thermal", "discarded": 10,
         "samples": 20, "power_capped": False},
        {"case_id": "d", "method": "eager", "status": "error", "throttle": "hw_thermal", "discarded": 50,
         "samples": 0, "power_capped": False},
    ])
    t = throttle_table(df)
    assert list(t["case_id"]) == ["b", "c"]
    assert list(t["power_capped"]) == [True, False]
    assert throttle_table(df.drop(columns=["power_capped"]))["power_capped"].tolist() == [False, False]


def test_every_method_has_its_own_stable_colour():
    from replaybench.report import METHOD_COLORS
    from replaybench.scenario import METHODS
    assert set(METHODS) <= set(METHOD_COLORS)
    assert len({METHOD_COLORS[m] for m in METHODS}) == len(METHODS)
    # colours of the committed reports' methods do not move when methods are added
    assert (METHOD_COLORS["eager"], METHOD_COLORS["replay"], METHOD_COLORS["vllm-eager"]) == \
        ("#1f77b4", "#d62728", "#7f7f7f")


def test_resumed_run_marks_ratios_across_sessions(tmp_path):
    # a run resumed on another machine: rows are attributed to sessions (their own 'session'
    # column, else by finish time) and eager/method pairs from different sessions are starred
    from replaybench.report import header_lines, row_sessions
    rows = [r for r in synthetic_rows("NVIDIA H200") if r["model"] == "tiny-mamba2" and r["backend"] == "triton"
            and r["status"] == "ok"]
    for r in rows:    # eager measured in session 0, the rest in session 1 (old rows: finish time only)
        r["finished"] = "2026-01-01T00:05:00+00:00" if r["method"] == "eager" else "2026-01-02T00:05:00+00:00"
    rows[-1]["session"] = 0                     # a row that says where it was measured wins
    st = make_run(tmp_path, device=GPU_DEVICE, rows=rows)
    m = st.manifest()
    m["sessions"] = [{"started": "2026-01-01T00:00:00+00:00", "git_sha": "aaa", "gpu_uuid": "GPU-1"},
                     {"started": "2026-01-02T00:00:00+00:00", "git_sha": "bbb", "gpu_uuid": "GPU-2"}]
    st.write_manifest(m)
    df = st.dataframe()
    sess = row_sessions(df, m)
    assert sess.tolist() == [0 if r["method"] == "eager" else 1 for r in rows[:-1]] + [0]
    df["session"] = sess
    sp = speedup_table(df)
    last = rows[-1]
    mine = (sp["method"] == last["method"]) & (sp["batch"] == last["batch"]) & \
           (sp["buffer_len"] == last["buffer_len"]) & (sp["flush_period"] == last["flush_period"])
    assert not sp[mine]["cross_session"].any() and sp[~mine]["cross_session"].all()
    head = dict(header_lines(m, df, cpu=False))
    assert "GPU-1" in head["sessions"] and "GPU-2" in head["sessions"] and "2 (resumed run" in head["sessions"]
    out = write_report("synthetic", reports_dir=tmp_path / "reports", results_dir=tmp_path / "results")
    assert "different sessions of this resumed run" in (out / "report.md").read_text()


def test_speedup_heatmap_has_a_panel_per_state_precision(tmp_path, monkeypatch):
    # replay with fp32 and bf16 states in one run: each against the eager row of its own state
    # dtype, in its own panel (one shared panel drew both into one cell, the later hiding the other)
    import replaybench.report.speedup as rep
    rows = []
    for r in synthetic_rows("NVIDIA H200"):
        if r["model"] == "tiny-mamba2" and r["backend"] == "triton" and r["method"] in ("eager", "replay"):
            rows.append(r)
            rows.append(dict(r, state_dtype="bfloat16", case_id=r["case_id"].replace("float32", "bfloat16"),
                             median_us=r["median_us"] / (2.0 if r["method"] == "eager" else 1.5)))
    st = make_run(tmp_path, device=GPU_DEVICE, rows=rows)
    saved = []
    monkeypatch.setattr(rep, "save_figure", lambda fig, out_dir, name: saved.append(fig) or (tmp_path / "a.png",
                                                                                       tmp_path / "a.svg"))
    rep.fig_speedup_heatmaps(st.dataframe(), st.manifest(), tmp_path, cpu=False)
    (fig,) = saved
    titles = sorted(ax.get_title() for ax in fig.axes if ax.get_title())
    assert titles == ["replay / triton, state bfloat16", "replay / triton, state float32"]
    texts = {ax.get_title(): sorted(t.get_text() for t in ax.texts) for ax in fig.axes if ax.get_title()}
    # batch 16, L/K 16/16: fp32 eager 160 / replay 160 / 1.36; bf16 eager 80 / replay 160 / 1.36 / 1.5
    assert texts["replay / triton, state float32"] == ["1.28×", "1.28×", "1.36×", "n/a"]
    assert texts["replay / triton, state bfloat16"] == ["0.96×", "0.96×", "1.02×", "n/a"]


def test_header_counts_noisy_rows():
    import pandas as pd

    from replaybench.report import header_lines
    df = pd.DataFrame({"status": ["ok", "ok", "error"], "noisy": [True, False, None]})
    items = dict(header_lines({"run_id": "r", "device": {"kind": "cpu"}}, df, cpu=True))
    assert items["noisy rows"].startswith("1 ok row(s)")
    assert "noisy rows" not in dict(header_lines({"run_id": "r"}, df.drop(columns="noisy"), cpu=True))
