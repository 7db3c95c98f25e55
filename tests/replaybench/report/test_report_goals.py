"""Targets section (replaybench/report/goals.py): a run's rows against goals.toml."""
import math
import tomllib
from importlib import resources

import pytest

from replaybench.report import goals as RG
from test_report_paper import _paper_run, paper_rows

STUDY = {"nemotron-3-nano-4b": "mamba2", "qwen3.5-4b": "gdn"}


def rows(pct=None, vllm=True):
    """eager / replay / replay-dual / vLLM rows at batch 1 and 256 (medians below), pct_copy_bw
    per method from `pct` (None: not measured)."""
    med = {"eager": 500.0, "replay": 300.0, "replay-dual": 200.0, "vllm-eager": 540.0}
    out = []
    for model, op in STUDY.items():
        for batch in (1, 256):
            for method, m in med.items():
                if method == "vllm-eager" and not vllm:
                    continue
                L = 16 if method.startswith("replay") else 0
                lo = "bfloat16" if method == "replay-dual" else "none"
                backend = "vllm" if method.startswith("vllm") else "triton"
                s = batch / 256
                out.append({"run_id": "goals", "case_id": f"{model}/{method}/{backend}/b{batch}/L{L}/K{L}/T0/float32/{lo}",
                            "runner": "kernel", "model": model, "op": op, "method": method, "backend": backend,
                            "batch": batch, "buffer_len": L, "flush_period": L, "spec_window": 0,
                            "state_dtype": "float32", "lo_dtype": lo, "device": "NVIDIA H200", "median_us": m * s,
                            "iqr_us": 0.01 * m * s, "samples": 10, "bytes_model": 1e6 * batch, "gbps": None,
                            "pct_copy_bw": (pct or {}).get(method), "status": "ok", "error": None})
    return out


def _df(r):
    import pandas as pd
    return pd.DataFrame(r)


def test_goals_toml_holds_the_issues_targets():
    raw = tomllib.loads(resources.files("replaybench").joinpath("goals.toml").read_text(encoding="utf-8"))["goal"]
    goals = RG.load_goals()
    assert len(goals) == len(raw) and len({g.id for g in goals}) == len(goals)
    by = {g.id: g for g in goals}
    assert (by["replay-b256"].min, by["replay-b256"].batches) == (1.78, (256,))
    assert by["replay-b256"].covers("qwen3.5-122b-a10b") and not by["replay-b256"].covers("nemotron-3-nano-4b")
    assert by["replay-b256-nano"].min == 2.4 and by["replay-b256-nano"].covers("nemotron-3-nano-4b")
    assert by["dual-b256-mamba2"].min == 2.7 and by["dual-b256-gdn"].min == 2.5
    assert by["eager-vs-vllm"].min == 0.97 and by["eager-vs-vllm"].batches == ()
    assert by["replay-small-batch"].batches == (1, 32) and by["replay-small-batch"].baseline == "eager"
    assert (by["bw-eager"].metric, by["bw-eager"].min, by["bw-replay"].min) == ("pct_copy", 92.0, 90.0)


@pytest.mark.parametrize("text,msg", [
    ('[[goal]]\nid = "x"\nwhat = "w"\nmetric = "ratio"\nmethod = "replay"\nmodels = ["*"]\nbatches = []\n',
     "goal 1 (x): missing field 'min'"),
    ('[[goal]]\nid = "x"\nwhat = "w"\nmetric = "speed"\nmethod = "replay"\nmodels = ["*"]\nbatches = []\nmin = 1\n',
     "metric 'speed' not one of ratio, pct_copy"),
    ('[[goal]]\nid = "x"\nwhat = "w"\nmetric = "ratio"\nmethod = "replay"\nmodels = ["*"]\nbatches = []\nmin = 1\n',
     "needs 'baseline'"),
])
def test_bad_goals_name_file_entry_and_field(text, msg):
    with pytest.raises(ValueError, match="goals.toml: goal 1") as e:
        RG.load_goals(text)
    assert msg in str(e.value)


def test_ratios_and_status_from_the_rows():
    t = RG.goals_table(_df(rows()))
    r = t.set_index(["target", "model", "batch"])
    # vLLM 540 / replay 300 = 1.8: met against 1.78 (Qwen3.5), missed against 2.4 (Nano)
    assert r.loc[("replay-b256", "qwen3.5-4b", 256), "measured"] == pytest.approx(1.8)
    assert r.loc[("replay-b256", "qwen3.5-4b", 256), "status"] == "met"
    assert r.loc[("replay-b256-nano", "nemotron-3-nano-4b", 256), "status"] == "missed"
    assert r.loc[("replay-b256-nano", "nemotron-3-nano-4b", 256), "margin"] == "-25.00 %"
    assert ("replay-b256", "nemotron-3-nano-4b", 256) not in r.index          # not a model it covers
    # 540 / 200 = 2.7: met at exactly the Mamba-2 dual target (>=), and above GDN's 2.5
    assert r.loc[("dual-b256-mamba2", "nemotron-3-nano-4b", 256), "status"] == "met"
    assert r.loc[("dual-b256-gdn", "qwen3.5-4b", 256), "status"] == "met"
    # our eager / replay at batch 1 (500 / 300) and vLLM / eager at every batch of the run
    assert r.loc[("replay-small-batch", "qwen3.5-4b", 1), "measured"] == pytest.approx(500 / 300)
    assert ("replay-small-batch", "qwen3.5-4b", 32) not in r.index            # batch 32 not measured
    assert set(r.loc["eager-vs-vllm"].index.get_level_values("batch")) == {1, 256}
    # no bandwidth measured: n/a, and no bound
    assert r.loc[("bw-replay", "qwen3.5-4b", 256), "status"] == "n/a"
    assert math.isnan(r.loc[("replay-b256", "qwen3.5-4b", 256), "bound"])


def test_bandwidth_targets_bound_and_needed_copy():
    t = RG.goals_table(_df(rows(pct={"eager": 95.0, "replay": 88.0, "replay-dual": 91.0, "vllm-eager": 96.0})))
    r = t.set_index(["target", "model", "batch"])
    assert r.loc[("bw-eager", "qwen3.5-4b", 256), "status"] == "met"
    assert r.loc[("bw-replay", "qwen3.5-4b", 256), "status"] == "missed"
    assert r.loc[("bw-dual", "nemotron-3-nano-4b", 256), "status"] == "met"
    assert ("bw-replay", "qwen3.5-4b", 1) not in r.index                        # held at batch 128-512 only
    # bound = ratio at the copy ceiling; needs = the % of copy that would meet the target
    row = r.loc[("replay-b256-nano", "nemotron-3-nano-4b", 256)]
    assert row["bound"] == pytest.approx(1.8 * 100 / 88.0)
    assert row["needs_pct_copy"] == pytest.approx(2.4 * 88.0 / 1.8)            # > 100: beyond its bytes


def test_a_goal_list_decides_what_is_checked():
    g = RG.Goal(id="t", what="w", metric="ratio", method="replay", baseline="vllm-eager",
                models=("qwen3.5-*",), batches=(256,), min=1.9)
    t = RG.goals_table(_df(rows()), [g])
    assert list(t["status"]) == ["missed"] and list(t["model"]) == ["qwen3.5-4b"]
    assert RG.goals_table(_df(rows(vllm=False)), [g]).empty                    # nothing to pair with


def test_report_carries_the_targets_section(tmp_path):
    out = _paper_run(tmp_path, paper_rows())
    md = (out / "report.md").read_text()
    assert "## Targets (goals.toml) vs this run" in md and "replay-b256-nano" in md
    assert "Targets (goals.toml)" in (out / "report.html").read_text()


def test_ratio_targets_hold_fp32_states_only():
    bf16 = _df(rows()).assign(state_dtype="bfloat16")                            # a bf16-state run
    t = RG.goals_table(bf16)
    # no fp32 ratio paired on bf16 states, but "eager >= 0.97x vLLM everywhere" holds at any state
    assert set(t["target"]) == {"eager-vs-vllm", "bw-eager", "bw-replay", "bw-dual"}
    assert RG.load_goals()[1].state_dtype == "float32" and RG.load_goals()[0].state_dtype == ""


def test_targets_without_a_dtype_hold_at_each_of_the_runs():
    """A run of fp32 and bf16 states: the bandwidth targets and eager-vs-vLLM (no state dtype in
    goals.toml) get a row per dtype, each measured on that dtype's rows; the fp32 ratio targets
    stay on fp32 rows."""
    pct32 = {"eager": 95.0, "replay": 91.0, "replay-dual": 91.0, "vllm-eager": 96.0}
    bf16 = [dict(r, state_dtype="bfloat16", median_us=r["median_us"] / 2, pct_copy_bw={"eager": 94.0, "replay": 70.0,
                                                                                       "vllm-eager": 90.0}[r["method"]])
            for r in rows() if r["method"] != "replay-dual"]
    t = RG.goals_table(_df(rows(pct=pct32) + bf16))
    r = t.set_index(["target", "model", "batch", "state_dtype"])
    assert r.loc[("bw-replay", "qwen3.5-4b", 256, "float32"), "status"] == "met"
    assert r.loc[("bw-replay", "qwen3.5-4b", 256, "bfloat16"), "measured"] == pytest.approx(70.0)
    assert r.loc[("bw-replay", "qwen3.5-4b", 256, "bfloat16"), "status"] == "missed"
    assert r.loc[("eager-vs-vllm", "qwen3.5-4b", 256, "bfloat16"), "measured"] == pytest.approx(540 / 500)
    assert set(t[t["target"] == "bw-dual"]["state_dtype"]) == {"float32"}          # no bf16 dual rows
    assert set(t[t["target"] == "replay-b256"]["state_dtype"]) == {"float32"}      # an fp32 target
    assert not r.index.duplicated().any()


def test_no_section_without_a_covered_model():
    tiny = _df(rows()).assign(model="tiny-mamba2")                               # a CPU smoke run's model
    assert RG.sections(tiny) == [] and RG.goals_table(tiny).empty
