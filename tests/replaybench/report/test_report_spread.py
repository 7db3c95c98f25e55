"""Run-to-run spread (``replaybench report RUN --compare OTHER``): synthetic runs with known spreads."""
import re

import numpy as np
import pandas as pd
import pytest

from replaybench import cli
from replaybench.check import compare
from replaybench.report import write_report
from replaybench.report.spread import TARGET_PCT, fmt_pct, spread_table, summarise
from replaybench.store import RunStore

from rb_runs import store_run, syn_manifest

H200 = {"kind": "cuda", "name": "NVIDIA H200", "label": "NVIDIA H200"}

# case -> (RUN median, relative difference of OTHER, in %); the spreads are |these|
KNOWN = {
    ("tiny-gdn", "eager", 1): (10.0, +0.4),
    ("tiny-gdn", "eager", 32): (80.0, -0.1),
    ("tiny-gdn", "replay", 1): (8.0, +2.5),       # over the 1 % target
    ("tiny-gdn", "replay", 32): (50.0, 0.0),
    ("tiny-mamba2", "eager", 1): (12.0, -1.5),    # over the 1 % target
    ("tiny-mamba2", "eager", 32): (90.0, +0.2),
    ("tiny-mamba2", "replay", 1): (9.0, -0.05),
    ("tiny-mamba2", "replay", 32): (60.0, +0.7),
    ("tiny-mamba2", "replay-dual", 32): (55.0, -4.0),   # the worst
}


def cid(model, method, batch):
    L = 0 if method == "eager" else 16
    lo = "bfloat16" if method == "replay-dual" else "none"
    return f"{model}/{method}/triton/b{batch}/L{L}/K{L}/T0/float32/{lo}"


def row(run_id, model, method, batch, med, status="ok", device="NVIDIA H200"):
    L = 0 if method == "eager" else 16
    return {"run_id": run_id, "case_id": cid(model, method, batch), "runner": "kernel", "model": model,
            "op": "gdn" if model == "tiny-gdn" else "mamba2", "method": method, "backend": "triton",
            "batch": batch, "buffer_len": L, "flush_period": L, "spec_window": 0, "state_dtype": "float32",
            "lo_dtype": "bfloat16" if method == "replay-dual" else "none", "device": device,
            "median_us": med if status == "ok" else None, "iqr_us": 0.01 * med if status == "ok" else None,
            "samples": 10, "bytes_model": 1000.0 * batch, "gbps": None, "pct_copy_bw": None,
            "status": status, "error": "RuntimeError: x" if status == "error" else None}


def store(tmp_path, run_id, rows, device=H200):
    return store_run(tmp_path, run_id, syn_manifest(run_id, device, f"2026-11-30T00:00:0{len(run_id) % 10}+00:00"),
                     rows)


def make_pair(tmp_path):
    a = [row("a", m, meth, b, med) for (m, meth, b), (med, _) in KNOWN.items()]
    b = [row("b", m, meth, bb, med * (1 + d / 100)) for (m, meth, bb), (med, d) in KNOWN.items()]
    a.append(row("a", "tiny-gdn", "replay", 128, 100.0))                     # only in RUN
    b.append(row("b", "tiny-gdn", "eager", 128, 100.0))                      # only in OTHER
    a.append(row("a", "tiny-mamba2", "eager", 128, 100.0))                   # error in OTHER: not compared
    b.append(row("b", "tiny-mamba2", "eager", 128, 100.0, status="error"))
    store(tmp_path, "a", a)
    store(tmp_path, "b", b)


def expected():
    spreads = {cid(*k): abs(d) for k, (_, d) in KNOWN.items()}
    v = np.array(list(spreads.values()))
    worst = sorted(spreads, key=lambda c: (-spreads[c], c))
    return spreads, float(np.median(v)), float(v.max()), int((v > TARGET_PCT).sum()), worst


def test_spread_table_uses_checks_matching_and_known_spreads(tmp_path):
    make_pair(tmp_path)
    adf = RunStore.open("a", tmp_path / "results").dataframe()
    bdf = RunStore.open("b", tmp_path / "results").dataframe()
    t = spread_table(adf, bdf)
    spreads, med, mx, over, worst = expected()
    assert list(t["case_id"]) == worst                                      # largest first
    assert dict(zip(t["case_id"], t["abs_pct"])) == pytest.approx(spreads)
    # the same cases and ratios as `replaybench check a b`
    c = compare(adf, bdf)
    assert set(c["case_id"]) == set(t["case_id"])
    ratio = dict(zip(c["case_id"], c["ratio"]))
    assert all(r == pytest.approx(ratio[k] - 1) for k, r in zip(t["case_id"], t["rel_diff"]))
    s = summarise(t)
    assert (s.n, s.over_target, s.worst_case) == (len(KNOWN), over, worst[0])
    assert s.median_pct == pytest.approx(med) and s.max_pct == pytest.approx(mx)


def _section(md: str) -> str:
    m = re.search(r"^## Run-to-run spread.*?(?=^## )", md, flags=re.S | re.M)
    assert m, "no spread section"
    return m.group(0)


def test_report_compare_writes_figure_csv_and_section(tmp_path):
    make_pair(tmp_path)
    res, rep = tmp_path / "results", tmp_path / "reports"
    out = write_report("a", reports_dir=rep, results_dir=res, compare="b")
    for ext in ("png", "svg"):
        f = out / f"spread.{ext}"
        assert f.exists() and f.stat().st_size > 5000, f
    assert (out / "spread.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    spreads, med, mx, over, worst = expected()
    csv = pd.read_csv(out / "spread.csv")
    assert list(csv["case_id"]) == worst
    assert dict(zip(csv["case_id"], csv["abs_pct"])) == pytest.approx(spreads)

    md = (out / "report.md").read_text()
    sec = _section(md)
    assert "## Run-to-run spread: a vs b" in sec and "![" in sec and "(spread.png)" in sec
    assert f"Reproduce: `replaybench report a --compare b --results-dir {res} --reports-dir {rep}`" in sec
    assert "2 case(s) ok only in RUN and 1 only in OTHER" in sec   # one of them an error in OTHER
    # summary row: the numbers computed here from the rows
    summary = [ln for ln in sec.splitlines() if ln.startswith("| a | b |")]
    assert len(summary) == 1
    cells = [c.strip() for c in summary[0].strip("|").split("|")]
    assert cells[2:6] == [str(len(KNOWN)), fmt_pct(med), fmt_pct(mx), str(over)]
    assert fmt_pct(med) == "0.400" and fmt_pct(mx) == "4.000"            # guard the formatter too
    # worst 5, in order, with their spreads
    rows5 = [ln for ln in sec.splitlines() if ln.startswith("| tiny-")]
    assert [r.split("|")[1].strip() for r in rows5] == worst[:5]
    assert [r.rstrip(" |").split("|")[-1].strip() for r in rows5] == [fmt_pct(spreads[c]) for c in worst[:5]]
    assert "| tiny-mamba2/replay-dual/triton/b32/L16/K16/T0/float32/bfloat16 | 55.000 | 52.800 | -4.000 | 4.000 |" in sec

    html = (out / "report.html").read_text()
    assert "Run-to-run spread: a vs b" in html and f"<td>{fmt_pct(mx)}</td>" in html
    assert f"<td>{fmt_pct(med)}</td>" in html and "<code>replaybench report a --compare b" in html
    imgs = re.findall(r"<img[^>]*src='([^']*)'", html)
    assert sum(s.startswith("data:image/png;base64,") for s in imgs) == len(imgs) >= 2

    # regenerating gives the same bytes (deterministic SVG), then without --compare drops the section
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_report("a", reports_dir=rep, results_dir=res, compare="b")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    write_report("a", reports_dir=rep, results_dir=res)
    assert not list(out.glob("spread.*"))
    assert "Run-to-run spread" not in (out / "report.md").read_text()


def test_cli_compare_and_bad_input_writes_nothing(tmp_path, capsys):
    make_pair(tmp_path)
    store(tmp_path, "cpu", [row("cpu", "tiny-gdn", "eager", 1, 10.0, device="cpu")],
          device={"kind": "cpu", "name": "Test CPU", "label": "cpu"})
    res, rep = str(tmp_path / "results"), str(tmp_path / "reports")
    base = ["--results-dir", res, "--reports-dir", rep]
    for other, msg in (("nope", "no run 'nope'"), ("a", "is the run itself"), ("cpu", "devices differ")):
        assert cli.main(["report", "a", "--compare", other] + base) == 2
        assert msg in capsys.readouterr().err
        assert not (tmp_path / "reports").exists()
    assert cli.main(["report", "a", "--compare", "b"] + base) == 0
    assert (tmp_path / "reports" / "a" / "spread.png").exists()


def test_no_common_case_gives_empty_figure_and_zero_count(tmp_path):
    store(tmp_path, "a", [row("a", "tiny-gdn", "eager", 1, 10.0)])
    store(tmp_path, "b", [row("b", "tiny-gdn", "eager", 2, 10.0)])
    out = write_report("a", reports_dir=tmp_path / "reports", results_dir=tmp_path / "results", compare="b")
    assert (out / "spread.png").exists() and (out / "spread.svg").exists()
    sec = _section((out / "report.md").read_text())
    assert "| a | b | 0 |  |  | 0 |  |" in sec
