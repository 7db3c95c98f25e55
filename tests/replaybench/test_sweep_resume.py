import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

import rb_fake_runner
from conftest import FAKE_RUNNER, REPO, subprocess_env
from replaybench import runners
from replaybench.runners import RunnerError, SkipCase
from replaybench.scenario import load_scenario
from replaybench.store import RunStore, StoreError
from replaybench.sweep import make_row, run_sweep

SMALL = """
[[sweep]]
model = "tiny-mamba2"
method = ["eager", "replay"]
backend = ["reference", "triton"]
batch = [1, 2, 3, 4]
buffer_len = 8
"""


def sweep(sc, tmp_path, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("report", False)
    kw.setdefault("progress", False)
    kw.setdefault("measure_ceilings", False)
    return run_sweep(sc, results_dir=tmp_path / "results", reports_dir=tmp_path / "reports", **kw)


class Recorder:
    """In-process runner: records every call; optional hook per call index."""

    def __init__(self, hook=None):
        self.calls = []
        self.hook = hook

    def run(self, case, ctx):
        self.calls.append(case.case_id)
        if self.hook:
            out = self.hook(len(self.calls), case, ctx)
            if out is not None:
                return out
        return rb_fake_runner.fake_metrics(case)


@pytest.fixture
def registered():
    names = []

    def _reg(name, runner):
        runners.register(name, runner)
        names.append(name)
        return runner
    yield _reg
    for n in names:
        runners.unregister(n)


def test_smoke_pipeline_with_registered_fake_kernel_runner(tmp_path, registered, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rec = registered("kernel", Recorder())
    sc = load_scenario(REPO / "scenarios" / "smoke.toml")
    res = sweep(sc, tmp_path)
    assert os.environ["TRITON_INTERPRET"] == "1"
    assert res.counts["ok"] == len(sc.cases) == res.ran and res.already_done == 0
    assert sorted(rec.calls) == sorted(c.case_id for c in sc.cases)
    df = RunStore(res.run_dir).dataframe()
    assert len(df) == len(sc.cases) and df["case_id"].is_unique
    assert set(df["device"]) == {"cpu"} and set(df["torch_device"]) == {"cpu"}
    assert set(df["runner"]) == {"kernel"} and set(df["run_id"]) == {res.run_id}
    ok = df.dropna(subset=["bytes_model"])
    assert ((ok["gbps"] - ok["bytes_model"] / ok["median_us"] * 1e-3).abs() < 1e-12).all()
    assert df["pct_copy_bw"].isna().all()          # ceilings not measured here
    assert "check_rel_err" in df.columns           # runner's extra metric column kept
    assert (res.run_dir / "rows.parquet").exists() and (res.run_dir / "rows.csv").exists()
    m = RunStore(res.run_dir).manifest()
    assert m["complete"] is True and m["counts"]["ok"] == len(sc.cases)
    assert m["scenario"]["sha256"] == sc.sha256 and m["scenario"]["text"] == sc.text
    assert m["env"]["TRITON_INTERPRET"] == "1" and m["device"]["kind"] == "cpu"
    assert {"python", "torch", "triton", "vllm"} <= set(m["versions"])
    assert "sha" in m["git"] and "dirty" in m["git"]
    # same call again: nothing to do
    res2 = sweep(sc, tmp_path)
    assert res2.run_id == res.run_id and res2.ran == 0 and res2.already_done == len(sc.cases)


def test_errors_skips_and_bad_returns_become_rows(tmp_path, write_scenario):
    def hook(i, case, ctx):
        if case.batch == 2 and case.method == "eager":
            raise SkipCase("not here")
        if case.batch == 4 and case.method == "replay":
            return ["not", "a", "dict"]
        return None
    runners.register("rec", Recorder(hook))
    try:
        sc = load_scenario(write_scenario(SMALL, runner="rec"))
        res = sweep(sc, tmp_path)
    finally:
        runners.unregister("rec")
    df = RunStore(res.run_dir).dataframe().set_index("case_id")
    assert res.counts == {"ok": 12, "error": 2, "skipped": 2, "rows": 16}
    err = df[df["status"] == "error"]
    assert all(e.startswith("TypeError: runner returned list") for e in err["error"])
    sk = df[df["status"] == "skipped"]
    assert set(sk["error"]) == {"not here"} and sk["median_us"].isna().all()
    assert (res.run_dir / "errors.log").read_text().count("Traceback") == 2


def test_exception_row_is_short_and_sweep_goes_on(tmp_path, write_scenario):
    sc = load_scenario(write_scenario(SMALL, runner=FAKE_RUNNER))
    res = sweep(sc, tmp_path)
    df = RunStore(res.run_dir).dataframe()
    err = df[df["status"] == "error"]
    assert len(err) == 4 and set(err["batch"]) == {3}           # FakeRunner fails batch 3
    assert set(err["error"]) == {"RuntimeError: fake failure for batch 3"}
    assert err["median_us"].isna().all() and err["gbps"].isna().all()
    assert (df["status"] == "ok").sum() == len(sc.cases) - 4
    log = (res.run_dir / "errors.log").read_text()
    assert "second line" in log and "Traceback" in log


def test_ceilings_pct_and_reuse_on_resume(tmp_path, write_scenario, monkeypatch):
    import replaybench.hardware as hw
    calls = []

    def fake_measure(dev):
        calls.append(dev)
        return {"copy_gbps": 10.0, "read_gbps": 11.0, "matmul_tflops": 0.1}
    monkeypatch.setattr(hw, "measure_ceilings", fake_measure)
    sc = load_scenario(write_scenario(SMALL, runner=FAKE_RUNNER))
    res = sweep(sc, tmp_path, measure_ceilings=True, retry_errors=False)
    df = RunStore(res.run_dir).dataframe()
    ok = df[df["status"] == "ok"]
    assert ((ok["pct_copy_bw"] - 100 * ok["gbps"] / 10.0).abs() < 1e-9).all()
    assert RunStore(res.run_dir).manifest()["ceilings"]["copy_gbps"] == 10.0
    # resume (retrying the error rows): stored ceilings are reused, not re-measured
    monkeypatch.setattr(hw, "measure_ceilings", lambda dev: pytest.fail("re-measured"))
    res2 = sweep(sc, tmp_path, measure_ceilings=True, retry_errors=True)
    assert calls == ["cpu"] and res2.ran == 4


def test_interrupt_then_resume_in_process(tmp_path, write_scenario):
    def stop_at_5(i, case, ctx):
        if i == 5:
            raise KeyboardInterrupt
    first = Recorder(stop_at_5)
    runners.register("rec", first)
    try:
        sc = load_scenario(write_scenario(SMALL, runner="rec"))
        with pytest.raises(KeyboardInterrupt):
            sweep(sc, tmp_path)
        st = RunStore(next((tmp_path / "results").iterdir()))
        assert len(st.raw_rows()) == 4 and st.manifest()["complete"] is False
        second = Recorder()
        runners.register("rec", second)
        res = sweep(sc, tmp_path)
    finally:
        runners.unregister("rec")
    assert res.already_done == 4 and res.ran == len(sc.cases) - 4
    assert set(second.calls).isdisjoint(first.calls[:4])
    assert first.calls[4] in second.calls                      # the interrupted case is redone
    ids = Counter(r["case_id"] for r in RunStore(res.run_dir).raw_rows())
    assert set(ids) == {c.case_id for c in sc.cases} and set(ids.values()) == {1}
    assert len(RunStore(res.run_dir).manifest()["sessions"]) == 2
    # every row says which invocation measured it (the report marks ratios across sessions)
    sess = Counter(r["session"] for r in RunStore(res.run_dir).raw_rows())
    assert sess == {0: 4, 1: len(sc.cases) - 4}


def test_retry_errors_replaces_error_rows(tmp_path, write_scenario):
    sc = load_scenario(write_scenario(SMALL, runner=FAKE_RUNNER))
    res = sweep(sc, tmp_path)
    assert res.counts["error"] == 4
    runners.register(FAKE_RUNNER, Recorder())           # now batch 3 succeeds
    try:
        res2 = sweep(sc, tmp_path, retry_errors=True)
    finally:
        runners.unregister(FAKE_RUNNER)
    assert res2.ran == 4 and res2.counts == {"ok": 16, "error": 0, "skipped": 0, "rows": 16}
    assert len(RunStore(res.run_dir).dataframe()) == 16


def test_runner_not_available_writes_nothing(tmp_path, write_scenario, monkeypatch):
    monkeypatch.setitem(runners.BUILTIN_RUNNERS, "ghost", "replaybench.runners.ghost_runner_xyz")
    with pytest.raises(RunnerError) as e:
        runners.get("ghost")
    assert "does not exist" in str(e.value) and "replaybench.runners.ghost_runner_xyz" in str(e.value)
    sc = load_scenario(write_scenario(SMALL, runner="no_such_module_xyz:Runner"))
    with pytest.raises(RunnerError):
        sweep(sc, tmp_path)
    assert not (tmp_path / "results").exists()
    with pytest.raises(RunnerError) as e:
        runners.get("bogus")
    assert "kernel" in str(e.value) and "module:Attr" in str(e.value)
    with pytest.raises(RunnerError):
        runners.get("rb_fake_runner:NoSuchThing")


def test_entry_point_function_and_class():
    r = runners.get("rb_fake_runner:fake_metrics")          # a function is wrapped as run()
    assert callable(r.run)
    assert runners.get(FAKE_RUNNER).run.__self__.__class__.__name__ == "FakeRunner"


def test_scenario_change_under_same_run_id(tmp_path, write_scenario):
    sc = load_scenario(write_scenario(SMALL, runner=FAKE_RUNNER))
    sweep(sc, tmp_path, run_id="fixed")
    sc2 = load_scenario(write_scenario(SMALL.replace("[1, 2, 3, 4]", "[1]"), runner=FAKE_RUNNER,
                                       fname="s2.toml"))
    with pytest.raises(StoreError) as e:
        sweep(sc2, tmp_path, run_id="fixed")
    assert "--new" in str(e.value)
    res = sweep(sc2, tmp_path, new=True)
    assert res.run_id != "fixed" and res.counts["rows"] == 4


def test_identity_columns_not_overridable(tmp_path):
    from replaybench.scenario import parse_scenario
    sc = parse_scenario('[scenario]\nname="x"\n[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\n')
    case = sc.cases[0]
    r = make_row(case, {"status": "bad", "model": "zzz", "median_us": 2.0, "bytes_model": 4000.0,
                        "gbps": 123.0}, run_id="r", device_label="cpu", ceilings={"copy_gbps": 4.0})
    assert r["status"] == "ok" and r["model"] == "tiny-gdn"
    assert r["gbps"] == pytest.approx(2.0) and r["pct_copy_bw"] == pytest.approx(50.0)


# ----------------------------------------------------------------------------- real kill -9

def _ids_in(rows_path: Path) -> list[str]:
    import json
    out = []
    if rows_path.exists():
        for line in rows_path.read_bytes().split(b"\n"):
            try:
                out.append(json.loads(line)["case_id"])
            except Exception:
                pass
    return out


def test_resume_after_kill_9(tmp_path, write_scenario):
    scen = write_scenario("""
        [[sweep]]
        model = "tiny-mamba2"
        method = ["eager", "replay"]
        backend = ["reference", "triton"]
        batch = [1, 2, 4, 8]
        buffer_len = 8
    """, runner=FAKE_RUNNER)
    log = tmp_path / "calls.log"
    cmd = [sys.executable, "-m", "replaybench.cli", "sweep", str(scen), "--no-report",
           "--no-ceilings", "--no-progress", "--device", "cpu"]
    env = subprocess_env(RB_FAKE_LOG=str(log), RB_FAKE_SLEEP="0.2")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 40
        rows_path = None
        while time.monotonic() < deadline:
            found = list((tmp_path / "results").glob("*/rows.jsonl"))
            if found and len(_ids_in(found[0])) >= 4:
                rows_path = found[0]
                break
            if proc.poll() is not None:
                pytest.fail(f"sweep ended early: {proc.communicate()}")
            time.sleep(0.02)
        assert rows_path is not None, "no rows appeared"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL
    before = _ids_in(rows_path)
    assert 4 <= len(before) < 16
    first_pid = {ln.split()[0] for ln in log.read_text().splitlines()}
    with open(rows_path, "ab") as f:       # as if the kill had also torn a line mid-write
        f.write(b'{"case_id": "tiny-mamba2/replay/tri')

    r = subprocess.run(cmd, cwd=tmp_path, env=subprocess_env(RB_FAKE_LOG=str(log)),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"{len(before)} already done" in r.stdout
    after = Counter(_ids_in(rows_path))
    sc = load_scenario(scen)
    assert set(after) == {c.case_id for c in sc.cases}
    assert set(after.values()) == {1}, "a case appears more than once"
    assert rows_path.read_bytes().endswith(b"\n")
    calls = [ln.split() for ln in log.read_text().splitlines()]
    second = [cid for pid, cid in calls if pid not in first_pid]
    assert set(second).isdisjoint(before), "finished cases were redone"
    assert set(second) | set(before) == set(after)
    import pandas as pd
    pq = pd.read_parquet(rows_path.parent / "rows.parquet")
    assert len(pq) == 16 and pq["case_id"].is_unique
