import io
import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import subprocess_env
from replaybench.check import run_check
from replaybench.store import RunStore


def make(tmp_path, run_id, times, device="NVIDIA H200", iqr=0.01, status=None, q=None, capped=(),
         samples=None, throttled=(), scenario_text=None):
    """times: {case_id: median_us}; iqr relative to median; capped: case_ids timed under the power cap;
    samples: {case_id: list of per-sample times} stored as the runners store them (samples_us);
    throttled: case_ids that lost batches to a thermal throttle."""
    st = RunStore.create_or_resume(tmp_path / "results", run_id,
                                   {"scenario": {"sha256": run_id, "text": scenario_text},
                                    "device": {"name": device}})
    for cid, med in times.items():
        s = (status or {}).get(cid, "ok")
        row = {"case_id": cid, "method": cid.split("/")[1], "backend": "triton", "device": device,
               "median_us": med if s == "ok" else None, "iqr_us": med * iqr if s == "ok" else None,
               "status": s, "error": "RuntimeError: x" if s == "error" else None}
        if q and cid in q:
            row["q1_us"], row["q3_us"] = q[cid]
        row["power_capped"] = cid in capped
        row["throttle"] = "sw_power_cap" if cid in capped else ("hw_thermal" if cid in throttled else "")
        if samples and cid in samples:
            row["samples_us"] = list(samples[cid])
            row["samples"] = len(samples[cid])
        st.append(row)
    st.unlock()
    return st


BASE = {"m/eager/triton/b1": 10.0, "m/replay/triton/b1": 8.0, "m/replay/triton/b4": 20.0}


def check(tmp_path, **kw):
    out = io.StringIO()
    res = run_check("base", "new", results_dir=tmp_path / "results", out=out, **kw)
    return res, out.getvalue()


def test_identical_passes(tmp_path):
    make(tmp_path, "base", BASE)
    make(tmp_path, "new", BASE)
    res, out = check(tmp_path)
    assert res.exit_code == 0 and res.compared == 3 and res.regressions == 0
    assert "PASS" in out and "m/replay/triton/b4" in out and res.geomean_ratio == pytest.approx(1.0)


def test_slowdown_beyond_threshold_fails(tmp_path):
    make(tmp_path, "base", BASE)
    make(tmp_path, "new", dict(BASE, **{"m/replay/triton/b1": 9.0}))       # +12.5 %
    res, out = check(tmp_path)
    assert res.exit_code == 1 and res.regressions == 1
    assert "SLOWER" in out and "FAIL" in out
    res, _ = check(tmp_path, threshold=0.2)                                 # tolerated
    assert res.exit_code == 0


def test_slowdown_within_noise_is_ambiguous_and_passes(tmp_path):
    make(tmp_path, "base", BASE, iqr=0.3)
    make(tmp_path, "new", dict(BASE, **{"m/replay/triton/b1": 9.0}), iqr=0.3)  # wide spread
    res, out = check(tmp_path)
    assert res.exit_code == 0 and "AMBIGUOUS" in out and res.counts["AMBIGUOUS"] == 3   # too wide to tell


def test_faster_passes(tmp_path):
    make(tmp_path, "base", BASE)
    make(tmp_path, "new", {k: v * 0.5 for k, v in BASE.items()})
    res, out = check(tmp_path)
    assert res.exit_code == 0 and res.improvements == 3 and "FASTER" in out


def test_new_error_fails_and_missing_is_reported(tmp_path):
    make(tmp_path, "base", BASE)
    new = dict(BASE)
    new.pop("m/replay/triton/b4")
    make(tmp_path, "new", new, status={"m/eager/triton/b1": "error"})
    res, out = check(tmp_path)
    assert res.exit_code == 1 and res.new_errors == 1 and res.missing == 1
    assert "NEW ERROR" in out


def test_device_mismatch(tmp_path):
    make(tmp_path, "base", BASE)
    make(tmp_path, "new", BASE, device="NVIDIA H100")
    res, _ = check(tmp_path)
    assert res.exit_code == 2
    res, _ = check(tmp_path, allow_device_mismatch=True)
    assert res.exit_code == 0


def test_cli_exit_codes(tmp_path):
    make(tmp_path, "base", BASE)
    make(tmp_path, "new", dict(BASE, **{"m/eager/triton/b1": 20.0}))
    make(tmp_path, "other", BASE, device="cpu")
    cmd = [sys.executable, "-m", "replaybench.cli", "check"]
    env = subprocess_env()

    def run(*args):
        return subprocess.run(cmd + list(args), cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=60)
    r = run("base", "new")
    assert r.returncode == 1 and "SLOWER" in r.stdout
    r = run("base", "base")
    assert r.returncode == 0 and "PASS" in r.stdout
    r = run("base", "other")
    assert r.returncode == 2 and "devices differ" in r.stderr
    r = run("base", "missing-run")
    assert r.returncode == 2 and "missing-run" in r.stderr
    r = run("base")
    assert r.returncode == 2 and "need BASE and NEW" in r.stderr
    r = run("base", "new", "--threshold", "-1")
    assert r.returncode == 2 and "--threshold" in r.stderr
    r = run("base", "base", "--markdown", "pr.md")
    assert r.returncode == 0 and "PASS" in (tmp_path / "pr.md").read_text()


def test_power_capped_cases_are_marked_and_do_not_gate_unless_strict(tmp_path):
    make(tmp_path, "base", BASE, capped={"m/replay/triton/b4"})
    make(tmp_path, "new", {**BASE, "m/replay/triton/b4": 30.0}, capped={"m/replay/triton/b4", "m/eager/triton/b1"})
    res, out = check(tmp_path)
    assert res.exit_code == 0 and res.regressions == 0 and res.counts["SLOWER"] == 1 and res.clock_excused == 1
    t = res.table.set_index("case_id")
    assert t.loc["m/replay/triton/b4", "capped"] == "both" and t.loc["m/eager/triton/b1", "capped"] == "new"
    assert t.loc["m/replay/triton/b1", "capped"] == "" and t.loc["m/replay/triton/b4", "clock"] == "capped: both"
    assert "SLOWER (not gating)  [clock: capped: both]" in out and "[clock: capped: new]" in out
    res, out = check(tmp_path, strict=True)
    assert res.exit_code == 1 and res.regressions == 1


# samples of known answer, stored in the rows as the runners store them
RNG = np.random.default_rng(7)


def noisy(median, n=40, rel_sd=0.004):
    return list(median * (1 + RNG.normal(0, rel_sd, n)))


def test_samples_three_percent_slower_fails(tmp_path):
    cid = "m/replay/triton/b4"
    make(tmp_path, "base", BASE, samples={cid: noisy(20.0)})
    make(tmp_path, "new", BASE, samples={cid: noisy(20.6)})
    res, out = check(tmp_path, threshold=0.015)
    row = res.table.set_index("case_id").loc[cid]
    assert row["test"] == "mann-whitney" and row["verdict"] == "SLOWER" and row["lo"] > 1.0
    assert res.exit_code == 1 and res.regressions == 1


def test_samples_aa_passes_and_throttled_side_does_not_gate(tmp_path):
    cid = "m/replay/triton/b4"
    make(tmp_path, "base", BASE, samples={c: noisy(v) for c, v in BASE.items()})
    make(tmp_path, "new", BASE, samples={c: noisy(v) for c, v in BASE.items()})
    res, _ = check(tmp_path, threshold=0.015)
    assert res.exit_code == 0 and res.counts["SAME"] == 3
    make(tmp_path, "thr", BASE, samples={cid: noisy(24.0)}, throttled={cid})
    out = io.StringIO()
    res = run_check("base", "thr", results_dir=tmp_path / "results", out=out, threshold=0.015)
    assert res.exit_code == 0 and res.clock_excused == 1 and "[clock: throttled: new]" in out.getvalue()
    res = run_check("base", "thr", results_dir=tmp_path / "results", out=io.StringIO(), threshold=0.015,
                    strict=True)
    assert res.exit_code == 1


def test_thresholds_from_the_scenario_of_base(tmp_path):
    text = ('[scenario]\nname = "t"\n[check]\nthreshold = 0.2\nstrict = true\n'
            '[check.cases]\n"m/replay/*" = 0.01\n')
    slower = {k: v * 1.1 for k, v in BASE.items()}                 # +10 % everywhere
    make(tmp_path, "base", BASE, iqr=0.001, scenario_text=text)
    make(tmp_path, "new", slower, iqr=0.001)
    res, out = check(tmp_path)
    t = res.table.set_index("case_id")
    assert t.loc["m/eager/triton/b1", "verdict"] == "SAME" and t.loc["m/eager/triton/b1", "threshold"] == 0.2
    assert t.loc["m/replay/triton/b1", "verdict"] == "SLOWER" and t.loc["m/replay/triton/b1", "threshold"] == 0.01
    assert res.exit_code == 1 and res.regressions == 2 and "strict" in out
    res, _ = check(tmp_path, threshold=0.5)          # --threshold replaces the scenario's; per-case still apply
    assert res.table.set_index("case_id").loc["m/eager/triton/b1", "threshold"] == 0.5 and res.regressions == 2
    (tmp_path / "bad.toml").write_text('[check]\nthreshold = "x"\n')
    res, _ = check(tmp_path, scenario=tmp_path / "bad.toml")
    assert res.exit_code == 2


def test_markdown_summary(tmp_path):
    make(tmp_path, "base", BASE)
    make(tmp_path, "new", dict(BASE, **{"m/replay/triton/b1": 9.0}), status={"m/eager/triton/b1": "error"})
    md = tmp_path / "pr.md"
    res, _ = check(tmp_path, markdown=md)
    text = md.read_text()
    assert res.exit_code == 1 and "**FAIL**" in text and "`m/replay/triton/b1`" in text
    assert "| SLOWER |" in text and "Errors in NEW" in text and "<details>" in text
    assert json.dumps(text)                          # plain text, one file
