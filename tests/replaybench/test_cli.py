import json
import subprocess
import sys

import pytest

from conftest import FAKE_RUNNER, REPO, scenario_text, subprocess_env
from replaybench import cli

CMD = [sys.executable, "-m", "replaybench.cli"]


def run_cli(args, cwd, **env):
    return subprocess.run(CMD + list(args), cwd=cwd, env=subprocess_env(**env), capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize("body,parts", [
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="replai"\n',
     ["bad.toml", "sweep[0].method", "'replai'", "allowed: eager, replay"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="replay"\nbuffer_len=8\nflush_period=16\n',
     ["bad.toml", "sweep[0].flush_period", "flush_period <= buffer_len"]),
    ('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\nfoo=1\n',
     ["bad.toml", "sweep[0].foo", "unknown key", "allowed: model, method"]),
    ('[[sweep]\nmodel="tiny-gdn"\n', ["bad.toml", "line 5", "malformed TOML"]),
])
def test_bad_scenario_exits_2_and_writes_nothing(tmp_path, body, parts):
    (tmp_path / "bad.toml").write_text(scenario_text(body))
    r = run_cli(["sweep", "bad.toml", "--results-dir", "res", "--reports-dir", "rep"], tmp_path)
    assert r.returncode == 2, (r.stdout, r.stderr)
    for p in parts:
        assert p in r.stderr, (p, r.stderr)
    assert not (tmp_path / "res").exists() and not (tmp_path / "rep").exists()
    assert not (tmp_path / "results").exists() and not (tmp_path / "reports").exists()


def test_missing_scenario_file_exits_2(tmp_path):
    r = run_cli(["sweep", "nope.toml"], tmp_path)
    assert r.returncode == 2 and "nope.toml" in r.stderr and not (tmp_path / "results").exists()


def test_unavailable_runner_exits_2_and_writes_nothing(tmp_path):
    (tmp_path / "s.toml").write_text(scenario_text('[[sweep]]\nmodel="tiny-gdn"\nmethod="eager"\n',
                                                   runner="no_such_module_xyz:Runner"))
    r = run_cli(["sweep", "s.toml", "--no-ceilings", "--device", "cpu"], tmp_path)
    assert r.returncode == 2 and "no_such_module_xyz" in r.stderr and "does not exist" in r.stderr
    assert not (tmp_path / "results").exists()


def test_full_sweep_via_cli_then_resume_and_report(tmp_path, monkeypatch, capsys):
    (tmp_path / "s.toml").write_text(scenario_text("""
        [[sweep]]
        model = "tiny-gdn"
        method = ["eager", "replay"]
        batch = [1, 3]
        buffer_len = [8, 16]
        flush_period = [8, 16]
        invalid = "skip"
    """, name="clitest"))
    r = run_cli(["sweep", "s.toml", "--device", "cpu", "--no-ceilings"], tmp_path)
    assert r.returncode == 1, r.stderr           # error rows: exit 1, saying how many
    assert "4 case(s) ended in an error" in r.stderr
    runs = list((tmp_path / "results").iterdir())
    assert len(runs) == 1 and runs[0].name.startswith("clitest-cpu-")
    run_dir = runs[0]
    for f in ("manifest.json", "rows.jsonl", "rows.parquet", "rows.csv"):
        assert (run_dir / f).exists()
    rep = tmp_path / "reports" / run_dir.name
    for f in ("report.md", "report.html", "time_vs_batch.png", "time_vs_batch.svg",
              "bytes_per_step.png", "speedup_tiny-gdn.svg"):
        assert (rep / f).exists(), f
    m = json.loads((run_dir / "manifest.json").read_text())
    assert m["argv"][:3] == ["replaybench", "sweep", "s.toml"]
    # replay with K16 > L8 at 2 batches is skipped; batch 3 fails in the fake runner
    assert m["scenario"]["n_skipped_combos"] == 2 and m["counts"] == \
        {"ok": 4, "error": 4, "skipped": 0, "rows": 8, "cases": 8}
    assert "4 ok, 4 error" in r.stdout and f"-> results/{run_dir.name}" in r.stdout
    # same command again (in-process) resumes the same run and does nothing; the error rows
    # still exit 1, unless --keep-going-ok
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", "s.toml", "--device", "cpu", "--no-report", "--no-progress"]) == 1
    capsys.readouterr()
    assert cli.main(["sweep", "s.toml", "--device", "cpu", "--no-report", "--no-progress",
                     "--keep-going-ok"]) == 0
    out = capsys.readouterr().out
    assert "0 run now, 8 already done" in out and run_dir.name in out
    assert len(list((tmp_path / "results").iterdir())) == 1
    # report regenerated from stored rows only (path form)
    (rep / "report.md").unlink()
    assert cli.main(["report", str(run_dir)]) == 0
    assert (rep / "report.md").exists()


def test_dry_run_prints_plan_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(scenario_text("""
        [[sweep]]
        model = "tiny-mamba2"
        method = ["eager", "replay"]
        buffer_len = [8]
        flush_period = [4, 16]
        invalid = "skip"
    """, runner=FAKE_RUNNER))
    assert cli.main(["sweep", "s.toml", "--dry-run", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "2 case(s), 1 skipped" in out
    assert "tiny-mamba2/replay/reference/b1/L8/K4/T0/float32/none" in out
    assert "flush_period 16 > buffer_len 8" in out and "run id: t-cpu-" in out
    assert list(tmp_path.iterdir()) == [tmp_path / "s.toml"]


def test_default_scenario_is_smoke_without_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)                       # falls back to the repo's scenarios/
    assert cli.default_scenario().resolve() == (REPO / "scenarios" / "smoke.toml").resolve()
    assert cli.locate("smoke").resolve() == (REPO / "scenarios" / "smoke.toml").resolve()
    assert cli.main(["sweep", "--dry-run", "--device", "cpu"]) == 0
    assert "scenario 'smoke'" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_bad_run_id_exits_2(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["sweep", "smoke", "--dry-run", "--device", "cpu", "--run-id", "../x"]) == 2
    assert "invalid run id" in capsys.readouterr().err


def test_models_env_report(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["models"]) == 0
    out = capsys.readouterr().out
    assert "nemotron-3-nano-4b" in out and "78.75 MiB" in out and "tiny-gdn (tiny)" in out
    assert cli.main(["models", "qwen3.5-4b@d0.5w2"]) == 0
    assert "qwen3.5-4b@d0.5w2" in capsys.readouterr().out
    assert cli.main(["models", "nope"]) == 2
    assert cli.main(["env", "--json", "--device", "cpu"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["device"]["kind"] == "cpu" and info["versions"]["torch"]
    assert cli.main(["report", "no-such-run"]) == 2
    assert "no-such-run" in capsys.readouterr().err


def test_env_ceilings_and_missing_nvml(monkeypatch, capsys):
    import time

    from replaybench import hardware
    t0 = time.perf_counter()
    assert cli.main(["env", "--json", "--device", "cpu", "--ceilings"]) == 0
    assert time.perf_counter() - t0 < 10        # < 3 s on an idle machine
    c = json.loads(capsys.readouterr().out)["ceilings"]
    assert c["copy_gbps"] > 0 and c["read_gbps"] > 0 and c["matmul_tflops"] > 0
    assert c["buffer_bytes"] == 256 << 20 and c["matmul_dtype"] == "float32"
    monkeypatch.setitem(sys.modules, "pynvml", None)       # nvidia-ml-py not importable
    info = hardware._nvml_info(0)
    assert "nvml_error" in info


def test_help_describes_the_tool_commands_examples_and_exit_codes(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "benchmark and roofline suite" in out
    for cmd in ("sweep", "report", "check", "models", "memory", "env"):
        assert f"    {cmd} " in out
    assert "examples:" in out and "exit codes:" in out and "130" in out


def test_every_argument_has_help():
    import argparse
    parser = cli.build_parser()
    subs = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"{name} {a.dest}" for name, p in subs.choices.items() for a in p._actions
               if not a.help and not isinstance(a, argparse._HelpAction)]
    assert not missing, missing


def test_gpu_scenario_without_gpu_is_refused_unless_device_cpu(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tmp_path / "g.toml").write_text(scenario_text("""
        [[sweep]]
        model = "tiny-mamba2"
        method = "eager"
    """, runner=FAKE_RUNNER).replace('[scenario]\n', '[scenario]\ndevice = "gpu"\n'), encoding="utf-8")
    assert cli.main(["sweep", "g.toml", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "is for a GPU" in err and "--device cpu" in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == [tmp_path / "g.toml"]
    assert cli.main(["sweep", "g.toml", "--dry-run", "--device", "cpu"]) == 0
    assert "for GPU" in capsys.readouterr().out


def test_unwritable_results_dir_exits_2_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(scenario_text("""
        [[sweep]]
        model = "tiny-mamba2"
        method = "eager"
    """, runner=FAKE_RUNNER), encoding="utf-8")
    (tmp_path / "afile").write_text("x", encoding="utf-8")
    for flag in ("--results-dir", "--reports-dir"):
        assert cli.main(["sweep", "s.toml", "--device", "cpu", "--no-progress", "--no-ceilings",
                         flag, "afile/sub"]) == 2
        err = capsys.readouterr().err
        assert "cannot write the" in err and "afile" in err and len(err.strip().splitlines()) == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "s.toml"]


def test_sweep_says_where_it_writes_and_leaves_no_lock(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.toml").write_text(scenario_text("""
        [[sweep]]
        model = "tiny-mamba2"
        method = "eager"
    """, runner=FAKE_RUNNER), encoding="utf-8")
    assert cli.main(["sweep", "s.toml", "--device", "cpu", "--no-progress", "--no-ceilings", "--no-report"]) == 0
    err = capsys.readouterr().err
    (run_dir,) = list((tmp_path / "results").iterdir())
    assert f"results: {run_dir.absolute()}" in err
    assert not (run_dir / ".lock").exists()
