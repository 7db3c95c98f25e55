"""`replaybench check --revs BASE_REV NEW_REV SCENARIO` end to end on the CPU (tiny reference cases)."""
import subprocess
import sys

import pytest

from conftest import REPO, subprocess_env
from replaybench.ab import WORKTREE, export_kernels
from replaybench.store import RunStore

TINY = """
[scenario]
name = "abtiny"
runner = "kernel"

[timing]
warmup = 1
min_samples = 3
max_samples = 6
max_time_s = 0.1
rel_iqr = 0.05

[[sweep]]
model = "tiny-mamba2"
method = "eager"
backend = "reference"

[[sweep]]
model = "tiny-gdn"
method = "replay"
backend = "reference"
buffer_len = 4
"""


def _has_git() -> bool:
    r = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", "HEAD"], capture_output=True)
    return r.returncode == 0


needs_git = pytest.mark.skipif(not _has_git(), reason="needs the git history of this checkout")


def run(tmp_path, *args):
    return subprocess.run([sys.executable, "-m", "replaybench.cli", "check", *args], cwd=tmp_path,
                          env=subprocess_env(), capture_output=True, text=True, timeout=600)


@needs_git
def test_export_of_a_revision(tmp_path):
    kdir, prov = export_kernels("HEAD", tmp_path / "x")
    assert (kdir / "replayssm" / "__init__.py").is_file() and len(prov["sha"]) == 40
    kdir, prov = export_kernels(WORKTREE, tmp_path / "y")
    assert kdir == REPO / "kernels"
    assert export_kernels(str(REPO / "kernels"), tmp_path / "z")[0] == (REPO / "kernels").resolve()


@needs_git
def test_ab_two_revisions_interleaved_with_injection(tmp_path):
    scen = tmp_path / "abtiny.toml"
    scen.write_text(TINY)
    r = run(tmp_path, "--revs", "HEAD", WORKTREE, str(scen), "--device", "cpu", "--run-id", "t",
            "--threshold", "0.9", "--inject", "0.5", "--markdown", "ab.md")
    assert r.returncode in (0, 1), r.stderr[-3000:]
    md = (tmp_path / "ab.md").read_text()
    assert "replaybench A/B" in md and "validation: new+inject0.5 vs base" in md
    assert "compared 2:" in r.stdout and "threshold 90.0%" in r.stdout
    for side in ("base", "new", "new+inject0.5"):
        df = RunStore.open(f"t-{side}", tmp_path / "results").dataframe()
        assert len(df) == 2 and set(df["status"]) == {"ok"}, df[["case_id", "status", "error"]]
        assert all(len(RunStore.open(f"t-{side}", tmp_path / "results").rows()[i]["samples_us"]) > 2
                   for i in range(2))
    inj = RunStore.open("t-new+inject0.5", tmp_path / "results").dataframe()
    assert inj["inject_fraction"].astype(float).between(0.5, 0.501).all()
    # the stored runs can be re-judged by the two-run gate
    r2 = run(tmp_path, "t-base", "t-new", "--threshold", "0.9")
    assert r2.returncode in (0, 1) and "compared 2:" in r2.stdout
    # the same command resumes: nothing re-measured, the verdict from the stored rows
    r3 = run(tmp_path, "--revs", "HEAD", WORKTREE, str(scen), "--device", "cpu", "--run-id", "t",
             "--threshold", "0.9", "--inject", "0.5", "--time-budget", "0.001")
    assert r3.returncode in (0, 1) and "compared 2:" in r3.stdout and "time budget" not in r3.stderr
    assert all(len(RunStore.open(f"t-{side}", tmp_path / "results").rows()) == 2 for side in ("base", "new"))
    # a budget spent before the first case: nothing measured, and how to resume is said
    r4 = run(tmp_path, "--revs", WORKTREE, WORKTREE, str(scen), "--device", "cpu", "--run-id", "u",
             "--time-budget", "0.001")
    assert r4.returncode == 2 and "2 case(s) not measured" in r4.stderr and "--run-id u resumes" in r4.stderr


def test_ab_bad_input(tmp_path):
    scen = tmp_path / "abtiny.toml"
    scen.write_text(TINY)
    r = run(tmp_path, "--revs", "no-such-rev-xyz", WORKTREE, str(scen), "--device", "cpu")
    assert r.returncode == 2 and "no-such-rev-xyz" in r.stderr
    r = run(tmp_path, "--revs", WORKTREE, WORKTREE, str(tmp_path / "missing.toml"), "--device", "cpu")
    assert r.returncode == 2 and "missing.toml" in r.stderr
    r = run(tmp_path, "a", "b", "--revs", WORKTREE, WORKTREE, str(scen))
    assert r.returncode == 2 and "not both" in r.stderr
    r = run(tmp_path, "--revs", WORKTREE, WORKTREE, str(scen), "--inject", "2")
    assert r.returncode == 2 and "--inject" in r.stderr
    broken = tmp_path / "broken" / "replayssm"          # kernels the suite cannot run: no verdict
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("")
    r = run(tmp_path, "--revs", str(broken.parent), WORKTREE, str(scen), "--device", "cpu")
    assert r.returncode == 2 and "side base" in r.stderr


def test_validation_rates():
    from replaybench.ab import binom_upper
    assert binom_upper(0, 104) == pytest.approx(1 - 0.05 ** (1 / 104))     # the exact zero-event bound
    assert binom_upper(0, 300) < 0.01 < binom_upper(1, 300)
    assert 1 - binom_upper(0, 52) == pytest.approx(0.05 ** (1 / 52))       # 52 of 52 caught: lower bound
