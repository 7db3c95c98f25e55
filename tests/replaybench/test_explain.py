"""replaybench explain: a case's launches, planned on the meta device, name real table rows."""
from __future__ import annotations

import pytest

from replaybench.cli import main
from replaybench.explain import explain, plan_case
from replaybench.scenario import load_scenario, locate

FP32 = "scenarios/h200-kernels-fp32.toml"


@pytest.fixture(scope="module")
def cases():
    return {c.case_id: c for c in load_scenario(locate(FP32)).cases}


def _table(op):
    if op == "mamba2":
        from replayssm.mamba2.table import TABLE
    else:
        from replayssm.gdn.table import TABLE
    return TABLE


@pytest.mark.parametrize("cid", [
    "nemotron-3-super-120b-a12b/replay/triton/b256/L16/K16/T0/float32/none",
    "qwen3.5-4b/replay-dual/triton/b128/L16/K16/T0/float32/bfloat16",
    "nemotron-3-nano-4b/eager/triton/b1/L0/K0/T0/float32/none",
])
def test_real_dims_plan_names_rows(cases, cid):
    case = cases[cid]
    launches, note = plan_case(case)
    assert launches and not note
    table = _table(case.op)
    named = [launch.row for launch in launches if launch.row]
    assert named, "at least the main launch names its table row"
    for row in named:
        assert table.row(row).why          # every named row exists and says why
    text = explain([case])
    assert cid in text and launches[0].name in text


def test_peer_and_unknown_case(cases, capsys):
    vllm = next(c for c in cases.values() if c.method == "vllm-eager")
    assert "not planned by replayssm" in explain([vllm])
    assert main(["explain", FP32, "--case", "no/such/case"]) == 2
    assert "no such case" in capsys.readouterr().err
