"""Targets section: a run's rows held against the project's own performance targets for its
kernels (replaybench/goals.toml, from issue 3), from stored rows only.

    load_goals    the targets (package data goals.toml)
    goals_table   one row per (target, model, batch, state dtype) the run measures: the measured ratio or
                  bandwidth, met / missed, the margin, and for a ratio the bound the method's
                  byte count sets (ratio at the copy ceiling) and the % of the copy ceiling the
                  method would need to meet the target
    sections      the report's table; empty when no target has rows in the run

Ratios pair as the paper-style section does (report.paper.ratios: same model, batch and state
dtype; one configuration per model and method, a bf16 low copy where the run has several). A
target that names a state dtype holds at that dtype; one that names none at each dtype the run
has, each as its own rows (a run of fp32 and bf16 states: both). The targets never hold measured
numbers: every value is computed here from the run's rows.
"""
from __future__ import annotations

import fnmatch
import math
import tomllib
from dataclasses import dataclass
from importlib import resources

import pandas as pd

from .paper import batch_rows, method_rows, paper_ok_rows, pct_copy, ratios, throttle_note

GOALS_FILE = "goals.toml"
METRICS = ("ratio", "pct_copy")
GOAL_COLS = ["target", "model", "batch", "method", "state_dtype", "baseline", "measured", "min", "status",
             "margin", "bound", "needs_pct_copy", "method_pct_copy", "throttled"]


@dataclass(frozen=True)
class Goal:
    id: str
    what: str
    metric: str
    method: str
    baseline: str
    models: tuple[str, ...]
    batches: tuple[int, ...]
    min: float
    state_dtype: str = ""

    def covers(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pat) for pat in self.models)


def load_goals(text: str | None = None, source: str = GOALS_FILE) -> list[Goal]:
    """The targets from goals.toml (the package's, or `text`); a bad entry raises ValueError
    naming the file, the entry and the field."""
    if text is None:
        text = resources.files("replaybench").joinpath(GOALS_FILE).read_text(encoding="utf-8")
    out = []
    for i, g in enumerate(tomllib.loads(text).get("goal", [])):
        where = f"{source}: goal {i + 1} ({g.get('id', '?')})"
        for field in ("id", "what", "metric", "method", "models", "batches", "min"):
            if field not in g:
                raise ValueError(f"{where}: missing field '{field}'")
        if g["metric"] not in METRICS:
            raise ValueError(f"{where}: metric {g['metric']!r} not one of {', '.join(METRICS)}")
        if g["metric"] == "ratio" and not g.get("baseline"):
            raise ValueError(f"{where}: a ratio target needs 'baseline' (the method it is over)")
        out.append(Goal(id=g["id"], what=g["what"], metric=g["metric"], method=g["method"],
                        baseline=g.get("baseline", ""), models=tuple(g["models"]),
                        batches=tuple(int(b) for b in g["batches"]), min=float(g["min"]),
                        state_dtype=g.get("state_dtype", "")))
    return out


def _row(goal: Goal, measured: float, pct: float, bound: float, needs: float, throttled: str, **keys) -> dict:
    status = "n/a" if math.isnan(measured) else ("met" if measured >= goal.min else "missed")
    return {"target": goal.id, **keys, "measured": measured, "min": goal.min,
            "status": status, "margin": f"{(measured / goal.min - 1) * 100:+.2f} %" if status != "n/a" else "",
            "bound": bound, "needs_pct_copy": needs, "method_pct_copy": pct, "throttled": throttled}


def goals_table(df, goals: list[Goal] | None = None) -> pd.DataFrame:
    """One row per (target, model, batch) with a measurement in this run (see the module doc)."""
    goals = load_goals() if goals is None else goals
    if not len(df):
        return pd.DataFrame(columns=GOAL_COLS)
    ok = paper_ok_rows(df)
    ok = ok[ok["spec_window"] == 0]
    # A target without a state dtype holds at every state dtype the run has ("for fp32 *and*
    # bf16 states"), each on its own: the rows of one dtype are the reference state there.
    dtypes = sorted(set(ok["state_dtype"]), key=lambda d: (d != "float32", d))
    out = []
    for g in goals:
        for sd in ([g.state_dtype] if g.state_dtype else dtypes):
            og = ok[ok["state_dtype"] == sd]
            models = [m for m in dict.fromkeys(og["model"]) if g.covers(m)]
            batches = g.batches or tuple(sorted(set(int(b) for b in og["batch"])))
            if g.metric == "ratio":
                for r in ratios(og, g.method, g.baseline, 0, batches, models):
                    # the % of copy at which the method's bytes would meet the target against the
                    # baseline as measured (> 100: not within its byte count; NaN with the bound)
                    needs = g.min * 100.0 / r["ratio_at_copy"]
                    out.append(_row(g, r["ratio"], r["method_pct_copy"], r["ratio_at_copy"], needs, r["throttled"],
                                    model=r["model"], batch=r["batch"], method=g.method, state_dtype=sd,
                                    baseline=g.baseline))
            else:
                for model, rep in method_rows(og, og, g.method, models):
                    for b, r in batch_rows(rep, batches):
                        pct = pct_copy(r)
                        out.append(_row(g, pct, pct, float("nan"), float("nan"), throttle_note(r, g.method),
                                        model=model, batch=int(b), method=g.method, state_dtype=sd,
                                        baseline="copy ceiling"))
    return pd.DataFrame(out, columns=GOAL_COLS)


def sections(df):
    """[(title, intro, DataFrame, columns)] for write_report (report/__init__.py): the targets table, or [] when no
    target has a measurement in the run."""
    goals = load_goals()
    table = goals_table(df, goals)
    if not len(table):
        return []
    counts = table["status"].value_counts()
    named = "; ".join(f"{g.id}: {g.what}" for g in goals if g.id in set(table["target"]))
    intro = (f"The project's targets for its kernels (replaybench/goals.toml, from issue 3) against this run: "
             f"{counts.get('met', 0)} met, {counts.get('missed', 0)} missed. Targets: {named}. "
             "measured = baseline median / "
             "method median (same run, model, batch and state dtype; one configuration per model, method and "
             "state dtype, as in the paper-style table; a target that names no state dtype holds at each of the "
             "run's), or for a bandwidth target the method's modelled bytes / time as % "
             "of the copy ceiling measured in this run; margin = measured / min - 1; bound = the ratio the "
             "method would reach moving its modelled bytes at the copy ceiling against the baseline as "
             "measured; needs_pct_copy = the % of the copy ceiling the method would have to run at to meet "
             "the target (over 100: beyond what its byte count allows); throttled = which side's timing saw "
             "an NVML throttle reason.")
    return [("Targets (goals.toml) vs this run", intro, table, GOAL_COLS)]
