"""Shared helpers for the replaybench suite tests (CPU only, no kernels needed)."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
if str(HERE) not in sys.path:          # rb_fake_runner importable in-process too
    sys.path.insert(0, str(HERE))

FAKE_RUNNER = "rb_fake_runner:FakeRunner"


def subprocess_env(**extra: str) -> dict:
    """Environment for `python -m replaybench.cli` subprocesses: repo + fake runner importable."""
    env = dict(os.environ)
    paths = [str(REPO), str(REPO / "kernels"), str(HERE)]
    if env.get("PYTHONPATH"):
        paths.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(paths)
    env.pop("TRITON_INTERPRET", None)
    env.update(extra)
    return env


def scenario_text(body: str, name: str = "t", runner: str = FAKE_RUNNER, timing: str = "") -> str:
    head = f'[scenario]\nname = "{name}"\nrunner = "{runner}"\n'
    return head + textwrap.dedent(timing) + "\n" + textwrap.dedent(body)


@pytest.fixture
def write_scenario(tmp_path):
    def _write(body: str, fname: str = "s.toml", **kw) -> Path:
        p = tmp_path / fname
        p.write_text(scenario_text(body, **kw))
        return p
    return _write
