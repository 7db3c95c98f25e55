"""Drift section of a report (report/drift.py), from the drift runner's rows only (replaybench.runners.drift).

    drift_long       one row per (case, measurement step): the rows' `drift_series` expanded
    drift_table      per model and configuration: median (p99) per-step output error at 128 /
                     1,024 / 4,096 / 8,192 steps (those the run reached), the state's error and
                     KL / top-1 at the last step
    drift_goals      per model and low dtype: dual's growth from 128 steps to the last, and
                     shared-low / dual at 4,096 steps (goal: flat and >= 5x); whether an fp8 low
                     copy is fine for the output path
    drift_section    markdown with the tables and one figure per model (error vs step, log-log:
                     output median and p99, state at flushes, KL of the stack's next token)
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from ..drift_study import CONFIGS, TABLE_STEPS, config_label  # noqa: E402

ID_COLS = ["model", "config", "method", "state_dtype", "lo_dtype", "backend", "batch", "steps", "device"]
POINT_COLS = ["step", "out_med", "out_p99", "long_med", "long_p99", "state_med", "state_p99", "lo_med", "lo_p99",
              "kl_mean", "kl_p99", "top1"]
ORDER = [config_label(*c) for c in CONFIGS]
GOAL_STEP = 4096
GOAL_RATIO = 5.0
FLAT = 1.5              # "flat": the median output error grows by at most this factor from 128 steps
FP8_MAX_ERR = 1e-2      # an output path is too coarse above 1 % median per-step error ...
FP8_MIN_TOP1 = 0.99     # ... or below 99 % top-1 agreement with fp64
_STYLE = {"eager": ("-", "o"), "replay": ("-", "x"), "shared-low": ("--", "s"), "dual": (":", "^")}
_COLOR = {"fp32": "#1f77b4", "bf16": "#d62728", "fp16": "#2ca02c", "fp8": "#9467bd",
          "fp32+bf16": "#d62728", "fp32+fp16": "#2ca02c", "fp32+fp8": "#9467bd"}


def drift_rows(df: pd.DataFrame) -> pd.DataFrame:
    if df is None or df.empty or "drift_series" not in df.columns:
        return pd.DataFrame()
    ok = df[(df.get("runner") == "drift") & (df.get("status") == "ok") & df["drift_series"].notna()]
    return ok


def drift_long(df: pd.DataFrame) -> pd.DataFrame:
    """The drift rows' series as long rows: ID_COLS + POINT_COLS."""
    rows = drift_rows(df)
    out = []
    for r in rows.to_dict("records"):
        ident = {c: r.get(c) for c in ID_COLS}
        if not ident.get("config"):
            ident["config"] = config_label(r["method"], r["state_dtype"], r["lo_dtype"])
        series = r["drift_series"]
        for p in (json.loads(series) if isinstance(series, str) else series):
            out.append({**ident, **{c: p.get(c) for c in POINT_COLS}})
    long = pd.DataFrame(out, columns=ID_COLS + POINT_COLS)
    for c in POINT_COLS:
        long[c] = pd.to_numeric(long[c], errors="coerce")
    return long


def _at(g: pd.DataFrame, step: int) -> pd.Series | None:
    hit = g[g["step"] == step]
    return None if hit.empty else hit.iloc[0]


def _sci(v, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return "–"
    return f"{v:.{digits}g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.{digits}e}".replace("e-0", "e-")


def _order(labels) -> list[str]:
    return sorted(labels, key=lambda c: ORDER.index(c) if c in ORDER else len(ORDER))


def drift_table(long: pd.DataFrame) -> pd.DataFrame:
    out = []
    for model, gm in long.groupby("model", sort=False):
        steps = [s for s in TABLE_STEPS if (gm["step"] == s).any()]
        last_step = int(gm["step"].max())
        if last_step not in steps:          # a run that stops short of (or between) the table's steps
            steps.append(last_step)
        for cfg in _order(gm["config"].unique()):
            g = gm[gm["config"] == cfg].sort_values("step")
            row = {"model": model, "config": cfg}
            for s in steps:
                p = _at(g, s)
                row[f"err@{s}"] = "–" if p is None else f"{_sci(p['out_med'])} ({_sci(p['out_p99'])})"
            last = g.iloc[-1]
            flushed = g[g["state_med"].notna()]
            row["state err (last flush)"] = _sci(flushed.iloc[-1]["state_med"]) if len(flushed) else "–"
            row["last step"] = int(last["step"])
            row["KL (nats)"] = _sci(last["kl_mean"])
            row["top-1"] = "–" if pd.isna(last["top1"]) else f"{last['top1']:.4f}"
            out.append(row)
    return pd.DataFrame(out)


def drift_goals(long: pd.DataFrame) -> pd.DataFrame:
    """Per model and low dtype, on the median and on the p99 per-step output error (and the
    median of the longest-memory heads alone, drift_study.long_heads): dual's
    growth (last step / 128 steps), shared-low / dual at GOAL_STEP (or the largest step <= it in
    the run) and the verdicts; for fp8, whether the low copy is fine for the output path."""
    out = []
    for model, gm in long.groupby("model", sort=False):
        for lo in ("bf16", "fp16", "fp8"):
            dual = gm[gm["config"] == f"dual fp32+{lo}"].sort_values("step")
            shared = gm[gm["config"] == f"shared-low {lo}"].sort_values("step")
            if dual.empty:
                continue
            # from 128 steps when the run goes past it, else from its first point
            base = 128 if dual["step"].max() > 128 else dual["step"].min()
            first, last = _at(dual, base), dual.iloc[-1]
            at = dual[dual["step"] <= GOAL_STEP]["step"].max()
            d, s = _at(dual, at), (None if shared.empty else _at(shared, at))
            row = {"model": model, "low dtype": lo, "steps": f"{int(first['step'])}->{int(last['step'])}",
                   "at step": int(at)}
            for q, col in (("med", "out_med"), ("p99", "out_p99"), ("long heads", "long_med")):
                growth = last[col] / first[col] if first[col] else float("nan")
                ratio = s[col] / d[col] if s is not None and d[col] else float("nan")
                met = growth <= FLAT and ratio >= GOAL_RATIO
                row[f"dual growth ({q})"] = f"{growth:.2f}x"
                row[f"shared-low / dual ({q})"] = f"{ratio:.2f}x" if math.isfinite(ratio) else "–"
                row[f"goal ({q})"] = "met" if met else "missed"
            if lo == "fp8":
                coarse = last["out_med"] > FP8_MAX_ERR or (pd.notna(last["top1"]) and last["top1"] < FP8_MIN_TOP1)
                verdict = "too coarse" if coarse else "adequate"
                row["fp8 output path"] = (f"{verdict} ({_sci(last['out_med'])} median per step, p99 "
                                          f"{_sci(last['out_p99'])}, top-1 {last['top1']:.3f})")
            out.append(row)
    return pd.DataFrame(out).fillna("")


def _style(cfg: str):
    kind, _, dt = cfg.partition(" ")
    ls, mk = _STYLE.get(kind, ("-", "."))
    return dict(ls=ls, marker=mk, color=_COLOR.get(dt, "#333333"), ms=3, lw=1.2)


def fig_drift(long: pd.DataFrame, model: str, outdir: Path) -> Path:
    g = long[long["model"] == model]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), sharex=True)
    panels = [("out_med", "output rel. error, median"), ("out_p99", "output rel. error, p99"),
              ("state_med", "state rel. error at flushes, median"), ("kl_mean", "stack KL(fp64 || config), nats")]
    for ax, (col, title) in zip(axes.flat, panels):
        for cfg in _order(g["config"].unique()):
            s = g[(g["config"] == cfg) & g[col].notna() & (g[col] > 0)].sort_values("step")
            if len(s):
                ax.plot(s["step"], s[col], label=cfg, **_style(cfg))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("decode step")
    h, lab = axes[0, 0].get_legend_handles_labels()
    fig.legend(h, lab, loc="lower center", ncol=5, fontsize=8, frameon=False)
    dev = g["device"].dropna().iloc[0] if g["device"].notna().any() else ""
    fig.suptitle(f"Drift vs fp64: {model} (batch {int(g['batch'].iloc[0])}, {dev})", fontsize=11)
    fig.tight_layout(rect=(0, 0.07, 1, 0.97))
    path = Path(outdir) / f"drift-{_slug(model)}.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def _slug(s: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in s)


def _md(df: pd.DataFrame) -> str:
    if df.empty:
        return ""
    cols = list(df.columns)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        lines.append("| " + " | ".join("" if v is None else str(v) for v in r) + " |")
    return "\n".join(lines)


def drift_section(df: pd.DataFrame, outdir) -> str:
    """Markdown of the drift section ('' without drift rows); writes one PNG per model into outdir."""
    long = drift_long(df)
    if long.empty:
        return ""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    parts = ["## Numerical drift vs fp64",
             "Every configuration decodes the same bf16-valued inputs from a zero state; errors are "
             "relative to an fp64 eager decode. Output error: per (sequence, head), pooled over the 16 "
             "steps ending at the step shown, median (p99). State error: the carried state (replay: the "
             "high checkpoint) at the last flush. KL / top-1: next-token distributions of a two-layer stack "
             "with an LM head vs the same stack in fp64 (docs/drift.md).",
             "", _md(drift_table(long)), "", "### Goal: dual flat, and >= 5x below shared-low at 4,096 steps",
             f"Judged on the median and on the p99 per-step output error, and on the median of the 10 % of heads "
             f"with the longest memory ('long heads'). 'flat': dual's error grows "
             f"<= {FLAT}x from 128 steps to the last; an fp8 output "
             f"path is 'too coarse' above {FP8_MAX_ERR:g} median per-step error or below "
             f"{FP8_MIN_TOP1:g} top-1 agreement.", "", _md(drift_goals(long)), ""]
    for model in long["model"].unique():
        path = fig_drift(long, model, outdir)
        parts += [f"![drift {model}]({path.name})", ""]
    return "\n".join(parts)
