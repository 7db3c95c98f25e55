"""Run-to-run spread of two runs of the same scenario, from stored rows only:
``replaybench report RUN --compare OTHER`` adds it to ``reports/RUN/``.

Cases are matched exactly as ``replaybench check RUN OTHER`` matches them (check.compare:
rows with status 'ok' in both runs, by case_id, method and backend). Per case the relative
difference of the medians is OTHER/RUN - 1 (check's ratio - 1); the spread is its absolute
value, in %.

    spread_table(run_df, other_df)  per-case table, largest spread first (also spread.csv)
    summarise(table)                cases compared, median / max spread, cases over the target
    fig_spread(...)                 spread.png / spread.svg: sorted per-case spread with the
                                    target, median and max marked; signed difference vs time
    section(...)                    everything report.write_report renders (SpreadSection)
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..check import compare, device_of  # noqa: E402
from ..store import RunStore, StoreError  # noqa: E402
from .common import plain_log_ticks  # noqa: E402

TARGET_PCT = 1.0        # run-to-run target (issue 5): repeated runs agree within 1 % per case
WORST_N = 5
STEM = "spread"
TABLE_COLS = ["case_id", "method", "backend", "model", "batch", "run_us", "other_us", "rel_diff", "abs_pct"]
# spread = |Δ|; no '|' in a header (Markdown tables)
SUMMARY_COLS = ["RUN", "OTHER", "cases compared", "median spread [%]", "max spread [%]",
                f"cases over {TARGET_PCT:g} %", "geomean OTHER/RUN"]
WORST_COLS = ["case_id", "RUN [µs]", "OTHER [µs]", "Δ [%]", "spread [%]"]


def fmt_pct(v: float) -> str:
    """A spread in % as every place of the report writes it."""
    return f"{v:.3f}"


def spread_table(run_df, other_df) -> pd.DataFrame:
    """Cases ok in both runs (check.compare's matching) with run_us, other_us,
    rel_diff = other/run - 1 and abs_pct = |rel_diff| * 100; largest spread first."""
    m = compare(run_df, other_df)
    m = m.rename(columns={"base_us": "run_us", "new_us": "other_us"})
    m = m[np.isfinite(m["ratio"].astype(float)) & (m["run_us"].astype(float) > 0)].copy()
    m["rel_diff"] = m["ratio"].astype(float) - 1.0
    m["abs_pct"] = m["rel_diff"].abs() * 100.0
    m = m.sort_values(["abs_pct", "case_id"], ascending=[False, True], kind="stable")
    return m[TABLE_COLS].reset_index(drop=True)


@dataclass
class SpreadSummary:
    n: int
    median_pct: float | None
    max_pct: float | None
    over_target: int
    geomean_ratio: float | None
    worst_case: str | None


def summarise(t: pd.DataFrame) -> SpreadSummary:
    if not len(t):
        return SpreadSummary(0, None, None, 0, None, None)
    a = t["abs_pct"].to_numpy(dtype=float)
    ratios = 1.0 + t["rel_diff"].to_numpy(dtype=float)
    geo = float(np.exp(np.mean(np.log(ratios)))) if (ratios > 0).all() else None
    return SpreadSummary(n=len(t), median_pct=float(np.median(a)), max_pct=float(a.max()),
                         over_target=int((a > TARGET_PCT).sum()), geomean_ratio=geo,
                         worst_case=str(t["case_id"].iloc[0]))


def fig_spread(t: pd.DataFrame, s: SpreadSummary, run_id: str, other_id: str, title_suffix: str,
               out_dir: Path, save, method_colors: dict) -> Path:
    """Left: per-case |Δ| in %, sorted, with the target, median and max marked. Right: the
    signed difference against the case's time per step (is the spread a short-kernel effect?)."""
    title = f"Run-to-run spread of the median time per step: {run_id} (RUN) vs {other_id} (OTHER)"
    if not s.n:
        fig, ax = plt.subplots(figsize=(6.4, 2.4))
        ax.axis("off")
        ax.set_title(title)
        ax.text(0.5, 0.5, "no case is ok in both runs", ha="center", va="center", fontsize=11,
                color="#555555", transform=ax.transAxes)
        png, _ = save(fig, out_dir, STEM)
        return png
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12.0, 4.4), gridspec_kw={"width_ratios": [1.55, 1]})
    asc = t.sort_values("abs_pct", kind="stable").reset_index(drop=True)
    x = np.arange(1, len(asc) + 1)
    y = asc["abs_pct"].to_numpy(dtype=float)
    ax.plot(x, y, color="0.75", linewidth=1.0, zorder=1)
    methods = list(dict.fromkeys(sorted(asc["method"], key=lambda m: list(method_colors).index(m)
                                        if m in method_colors else len(method_colors))))
    for m in methods:
        sel = (asc["method"] == m).to_numpy()
        ax.scatter(x[sel], y[sel], s=22, color=method_colors.get(m, "k"), edgecolor="black",
                   linewidth=0.3, zorder=3, label=m)
    top = max(TARGET_PCT * 1.6, s.max_pct * 1.3)   # room for the legend above the target
    ax.axhline(TARGET_PCT, color="#d62728", linestyle="--", linewidth=1.0, zorder=2)
    ax.text(1, TARGET_PCT, f" target {TARGET_PCT:g} %", color="#d62728", fontsize=8, va="bottom", ha="left")
    ax.axhline(s.median_pct, color="0.3", linestyle=":", linewidth=1.0, zorder=2)
    ax.annotate(f"median {fmt_pct(s.median_pct)} %", (1, s.median_pct), xytext=(2, 3),
                textcoords="offset points", fontsize=8, color="0.2", va="bottom")
    ax.annotate(f"max {fmt_pct(s.max_pct)} %\n{s.worst_case}", (x[-1], y[-1]), xytext=(-6, 8),
                textcoords="offset points", fontsize=7, ha="right", va="bottom", color="0.2",
                arrowprops=dict(arrowstyle="-", color="0.4", linewidth=0.6))
    ax.set_xlim(0, len(asc) + 1)
    ax.set_ylim(0, top)
    ax.set_xlabel(f"case, sorted by spread ({s.n} cases ok in both runs)")
    ax.set_ylabel("|OTHER / RUN − 1| of the median [%]")
    ax.set_title("per-case spread, sorted", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, frameon=False, loc="upper left", title="method", title_fontsize=7)

    xs = t["run_us"].to_numpy(dtype=float)
    ys = t["rel_diff"].to_numpy(dtype=float) * 100.0
    lim = max(TARGET_PCT * 1.3, float(np.abs(ys).max()) * 1.3)
    bx.axhspan(-TARGET_PCT, TARGET_PCT, color="#d62728", alpha=0.06, zorder=0)
    for sgn in (-1, 1):
        bx.axhline(sgn * TARGET_PCT, color="#d62728", linestyle="--", linewidth=1.0)
    bx.axhline(0, color="black", linewidth=0.6)
    for m in methods:
        sel = (t["method"] == m).to_numpy()
        bx.scatter(xs[sel], ys[sel], s=22, color=method_colors.get(m, "k"), edgecolor="black",
                   linewidth=0.3, zorder=3)
    bx.set_xscale("log")
    plain_log_ticks(bx.xaxis, xs)
    bx.set_ylim(-lim, lim)
    bx.set_xlabel("RUN median time per step [µs]")
    bx.set_ylabel("OTHER / RUN − 1 [%]")
    bx.set_title("signed difference vs kernel time", fontsize=10)
    bx.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"{title}\n{title_suffix}" if title_suffix else title, fontsize=11)
    fig.tight_layout()
    png, _ = save(fig, out_dir, STEM)
    return png


@dataclass
class SpreadSection:
    title: str
    png: Path
    csv: Path
    caption: str
    intro: str
    command: str
    summary: pd.DataFrame
    worst: pd.DataFrame
    table: pd.DataFrame
    stats: SpreadSummary


def open_other(other: str | Path, results_dir: str | Path, run_store: RunStore, run_manifest: dict,
               run_df) -> tuple[RunStore, dict, object]:
    """The run to compare against; StoreError when it is missing, is RUN itself, or ran on
    another device (times of two devices say nothing about run-to-run spread)."""
    os_ = RunStore.open(other, results_dir)
    if os_.run_dir.resolve() == run_store.run_dir.resolve():
        raise StoreError(f"--compare {str(other)!r} is the run itself; give a repeat of it")
    om, odf = os_.manifest(), os_.dataframe()
    rdev, odev = device_of(run_manifest, run_df), device_of(om, odf)
    if rdev != odev:
        raise StoreError(f"devices differ: {run_manifest.get('run_id') or run_store.run_id} ran on "
                         f"{rdev!r}, {om.get('run_id') or os_.run_id} on {odev!r}; run-to-run spread "
                         f"needs two runs on one device")
    return os_, om, odf


def command(run_id: str, other_id: str, results_dir, reports_dir) -> str:
    cmd = f"replaybench report {run_id} --compare {other_id}"
    if str(results_dir) != "results":
        cmd += f" --results-dir {results_dir}"
    if str(reports_dir) != "reports":
        cmd += f" --reports-dir {reports_dir}"
    return cmd


def section(run_id: str, run_manifest: dict, run_df, other_id: str, other_manifest: dict, other_df,
            out_dir: Path, save, method_colors: dict, title_suffix: str, cmd: str) -> SpreadSection:
    t = spread_table(run_df, other_df)
    s = summarise(t)
    t.to_csv(out_dir / f"{STEM}.csv", index=False)
    png = fig_spread(t, s, run_id, other_id, title_suffix, out_dir, save, method_colors)
    run_ok = set(run_df.loc[run_df["status"] == "ok", "case_id"]) if len(run_df) else set()
    oth_ok = set(other_df.loc[other_df["status"] == "ok", "case_id"]) if len(other_df) else set()

    def when(m):
        sc = (m.get("scenario") or {}).get("name", "")
        return f"scenario {sc}, created {m.get('created', '?')}" if sc else f"created {m.get('created', '?')}"

    intro = (f"RUN = {run_id} ({when(run_manifest)}); OTHER = {other_id} ({when(other_manifest)}). "
             f"Cases ok in both runs are matched as `replaybench check {run_id} {other_id}` matches them "
             f"(case_id, method, backend); per case Δ = OTHER median / RUN median − 1, spread = |Δ|. "
             f"{len(run_ok - oth_ok)} case(s) ok only in RUN and {len(oth_ok - run_ok)} only in OTHER "
             f"are not compared. Target: spread <= {TARGET_PCT:g} % per case.")
    summary = pd.DataFrame([{
        "RUN": run_id, "OTHER": other_id, "cases compared": str(s.n),
        "median spread [%]": fmt_pct(s.median_pct) if s.n else "",
        "max spread [%]": fmt_pct(s.max_pct) if s.n else "",
        f"cases over {TARGET_PCT:g} %": str(s.over_target),
        "geomean OTHER/RUN": f"{s.geomean_ratio:.4f}" if s.geomean_ratio else ""}], columns=SUMMARY_COLS)
    w = t.head(WORST_N)
    worst = pd.DataFrame({"case_id": w["case_id"], "RUN [µs]": [f"{v:.3f}" for v in w["run_us"]],
                          "OTHER [µs]": [f"{v:.3f}" for v in w["other_us"]],
                          "Δ [%]": [f"{100 * v:+.3f}" for v in w["rel_diff"]],
                          "spread [%]": [fmt_pct(v) for v in w["abs_pct"]]}, columns=WORST_COLS)
    caption = (f"Left: |OTHER / RUN − 1| of the median time per step for each of the {s.n} cases ok in "
               f"both runs, sorted; dashed: the {TARGET_PCT:g} % target; dotted: the median. Right: the "
               f"signed difference against the case's time per step; the band is ±{TARGET_PCT:g} %.")
    return SpreadSection(title=f"Run-to-run spread: {run_id} vs {other_id}", png=png,
                         csv=out_dir / f"{STEM}.csv", caption=caption, intro=intro, command=cmd,
                         summary=summary, worst=worst, table=t, stats=s)
