import io
import subprocess
import sys

import pytest

from conftest import subprocess_env
from replaybench.check import run_check
from replaybench.store import RunStore


def make(tmp_path, run_id, times, device="NVIDIA H200", iqr=0.01, status=None, q=None, capped=()):
    """times: {case_id: median_us}; iqr relative to median; capped: case_ids timed under the power cap."""
    st = RunStore.create_or_resume(tmp_path / "results", run_id,
                                   {"scenario": {"sha256": run_id}, "device": {"name": device}})
    for cid, med in times.items():
        s = (status or {}).get(cid, "ok")
        row = {"case_id": cid, "method": cid.split("/")[1], "backend": "triton", "device": device,
               "median_us": med if s == "ok" else None, "iqr_us": med * iqr if s == "ok" else None,
               "status": s, "error": "RuntimeError: x" if s == "error" else None}
        if q and cid in q:
            row["q1_us"], row["q3_us"] = q[cid]
        row["power_capped"] = cid in capped
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
    assert "REGRESSION" in out and "FAIL" in out
    res, _ = check(tmp_path, threshold=0.2)                                 # tolerated
    assert res.exit_code == 0


def test_slowdown_within_noise_passes(tmp_path):
    make(tmp_path, "base", BASE, iqr=0.3)
    make(tmp_path, "new", dict(BASE, **{"m/replay/triton/b1": 9.0}), iqr=0.3)  # IQRs overlap
    res, out = check(tmp_path)
    assert res.exit_code == 0 and "slower (noise)" in out


def test_quartile_columns_used_when_present(tmp_path):
    make(tmp_path, "base", BASE, iqr=0.0, q={"m/replay/triton/b1": (7.0, 9.5)})
    make(tmp_path, "new", dict(BASE, **{"m/replay/triton/b1": 9.0}), iqr=0.0,
         q={"m/replay/triton/b1": (8.9, 9.1)})
    res, _ = check(tmp_path)
    assert res.exit_code == 0            # NEW q1 8.9 < BASE q3 9.5: overlap


def test_faster_passes(tmp_path):
    make(tmp_path, "base", BASE)
    make(tmp_path, "new", {k: v * 0.5 for k, v in BASE.items()})
    res, out = check(tmp_path)
    assert res.exit_code == 0 and res.improvements == 3


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
    assert r.returncode == 1 and "REGRESSION" in r.stdout
    r = run("base", "base")
    assert r.returncode == 0 and "PASS" in r.stdout
    r = run("base", "other")
    assert r.returncode == 2 and "devices differ" in r.stderr
    r = run("base", "missing-run")
    assert r.returncode == 2 and "missing-run" in r.stderr


def test_power_capped_cases_are_marked(tmp_path):
    make(tmp_path, "base", BASE, capped={"m/replay/triton/b4"})
    make(tmp_path, "new", {**BASE, "m/replay/triton/b4": 30.0}, capped={"m/replay/triton/b4", "m/eager/triton/b1"})
    res, out = check(tmp_path)
    assert res.exit_code == 1 and res.regressions == 1            # still compared and gated
    t = res.table.set_index("case_id")["capped"]
    assert t["m/replay/triton/b4"] == "both" and t["m/eager/triton/b1"] == "new" and t["m/replay/triton/b1"] == ""
    assert "REGRESSION  [power-capped: both]" in out and "[power-capped: new]" in out
