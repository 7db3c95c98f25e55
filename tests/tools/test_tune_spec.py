"""tools/tune_spec.py's case plan: --models, --prio and --variants pick the groups and variants
(the tuning itself needs a GPU; `--cpu-smoke` runs its flow under the interpreter)."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import tune_spec as ts  # noqa: E402


def args(**kw) -> argparse.Namespace:
    base = dict(cpu_smoke=False, models="nano,q4b", variants="", batch=128, T=4, K=16, prio="0,1,2")
    return argparse.Namespace(**{**base, **kw})


def test_prio_keeps_the_named_groups():
    every = [(g["prio"], g["model"], g["batch"], g["lo"]) for g in ts.plan(args())]
    assert every == [(0, "nemotron-3-nano-4b", 128, "none"), (0, "qwen3.5-4b", 128, "none"),
                     (1, "nemotron-3-nano-4b", 128, "bfloat16"), (1, "qwen3.5-4b", 128, "bfloat16"),
                     (2, "nemotron-3-nano-4b", 32, "none")]
    assert [(g["prio"], g["model"]) for g in ts.plan(args(prio=" 2, 0"))] == [
        (0, "nemotron-3-nano-4b"), (0, "qwen3.5-4b"), (2, "nemotron-3-nano-4b")]


@pytest.mark.parametrize("bad,what", [(dict(prio="3"), "--prio"), (dict(prio="x"), "--prio"),
                                      (dict(models="nano,ultra"), "--models"),
                                      (dict(variants="no-such"), "--variants")])
def test_bad_arguments_name_the_option_and_the_allowed_values(bad, what):
    with pytest.raises(SystemExit, match=what):
        ts.plan(args(**bad))


def test_variants_keep_default_and_the_named_ones():
    groups = ts.plan(args(models="nano", prio="0", variants="commit-per-row"))
    assert list(groups[0]["variants"]) == ["default", "commit-per-row"]
