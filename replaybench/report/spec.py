"""Report sections for speculative decoding and SSM-state memory, from stored rows only.

    spec_table        spec rows (spec-replay, spec-perdraft, vllm-spec): time per round, verified
                      and committed tokens/s, and each method's speedup over the per-draft
                      baseline (same model, batch, T, state dtype, acceptance; same run)
    fig_spec_speedup  spec-replay / spec-perdraft (and vllm-spec / spec-perdraft) vs batch, per model
    memory            replaybench.memory's table and figure for the run's models, at the run's
                      T, L, K (defaults T = 4, K = 16, L = K + T), budget 80 GB
"""
from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from .. import memory  # noqa: E402
from ..accept import mean_accepted  # noqa: E402
from ..methods import METHODS, SPEC_BASELINE as BASELINE, names  # noqa: E402

SPEC_METHODS = names(spec=True)
GOAL = 3.0            # issue 4: spec-replay / spec-perdraft >= 3x at T = 4
SPEC_COLS = ["model", "method", "backend", "batch", "spec_window", "accept", "state_dtype", "median_us",
             "verified_tokens_per_s", "committed_tokens_per_s", "vs_perdraft"]
MEMORY_COLS = ["model", "method", "layout", "MiB/layer", "SSM layers", "MiB/request", "max batch", "vs per-draft"]
MEMORY_BUDGET_GB = 80.0


def _num(v):
    try:
        f = float(v)
    except (TypeError, ValueError):
        return math.nan
    return f


def _mean_acc(accept, T) -> float:
    try:
        return mean_accepted(accept, int(T))
    except (ValueError, TypeError):
        return math.nan


def spec_table(df) -> pd.DataFrame:
    """One row per ok spec row, with tokens/s and the speedup over spec-perdraft (triton
    preferred as the baseline's backend) at the same model, batch, T, state dtype, acceptance."""
    if not len(df) or "method" not in df:
        return pd.DataFrame(columns=SPEC_COLS)
    ok = df[(df["status"] == "ok") & df["method"].isin(SPEC_METHODS) & df["median_us"].notna()
            & (df["median_us"] > 0)].copy()
    if ok.empty:
        return pd.DataFrame(columns=SPEC_COLS)
    if "accept" not in ok:
        ok["accept"] = "none"
    out = []
    base = {}
    for r in ok[ok["method"] == BASELINE].sort_values("backend", key=lambda s: s != "triton").to_dict("records"):
        key = (r["model"], int(r["batch"]), int(r["spec_window"]), r["state_dtype"])
        base.setdefault(key + (r["accept"],), float(r["median_us"]))
        base.setdefault(key, float(r["median_us"]))      # fallback: the baseline at another acceptance
    for r in ok.to_dict("records"):
        T, b, med = int(r["spec_window"]), int(r["batch"]), float(r["median_us"])
        ver = _num(r.get("verified_tokens_per_s"))
        com = _num(r.get("committed_tokens_per_s"))
        if math.isnan(ver):
            ver = b * T / med * 1e6
        if math.isnan(com):
            com = b * _mean_acc(r.get("accept"), T) / med * 1e6
        key = (r["model"], b, T, r["state_dtype"])
        bl = base.get(key + (r["accept"],), base.get(key))
        out.append({"model": r["model"], "method": r["method"], "backend": r["backend"], "batch": b,
                    "spec_window": T, "accept": r.get("accept"), "state_dtype": r["state_dtype"], "median_us": med,
                    "verified_tokens_per_s": ver, "committed_tokens_per_s": com,
                    "vs_perdraft": (bl / med) if bl else math.nan})
    t = pd.DataFrame(out)
    order = {m: i for i, m in enumerate(SPEC_METHODS)}
    t["_m"] = t["method"].map(order)
    return t.sort_values(["model", "spec_window", "batch", "_m", "backend"]).drop(columns="_m").reset_index(drop=True)


def fig_spec_speedup(st: pd.DataFrame, out_dir: Path, title_suffix: str = "") -> Path | None:
    """Speedup over spec-perdraft vs batch, one panel per model: a line per (method, T);
    spec_speedup.png / .svg in out_dir (None: nothing to plot)."""
    fig = spec_speedup_figure(st, title_suffix)
    if fig is None:
        return None
    png = Path(out_dir) / "spec_speedup.png"
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(Path(out_dir) / "spec_speedup.svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return png


def spec_speedup_figure(st: pd.DataFrame, title_suffix: str = ""):
    """fig_spec_speedup's figure (matplotlib Figure), or None when no row has a ratio."""
    st = st[(st["method"] != BASELINE) & st["vs_perdraft"].notna()]
    if st.empty:
        return None
    models = list(dict.fromkeys(st["model"]))
    cols = min(len(models), 2)
    nrows = (len(models) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(5.6 * cols, 3.8 * nrows), squeeze=False)
    windows = sorted(st["spec_window"].unique())
    cmap = plt.get_cmap("viridis")
    handles = {}      # one legend for the figure, below the panels (it would cover lines inside them)
    for ax, model in zip(axes.flat, models):
        s = st[st["model"] == model]
        for (method, backend, T, acc), g in s.groupby(["method", "backend", "spec_window", "accept"], dropna=False):
            g = g.sort_values("batch")
            c = cmap(windows.index(T) / max(len(windows) - 1, 1) * 0.85)
            style = _line_style(method)
            ax.plot(g["batch"], g["vs_perdraft"], marker=style[0], linestyle=style[1], color=c,
                    label=f"{method}/{backend} T={T} ({acc})")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(GOAL, color="#d62728", linewidth=0.8, linestyle="--", label=f"goal {GOAL:g}× (T=4)")
        ax.set_xscale("log", base=2)
        bs = sorted(s["batch"].unique())
        ax.set_xticks(bs)
        ax.set_xticklabels([str(int(b)) for b in bs])
        ax.set_xlabel("batch (sequences)")
        ax.set_ylabel("speedup over per-draft slots (×)")
        ax.set_title(model, fontsize=10)
        ax.grid(True, alpha=0.3)
        for h, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, h)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    fig.suptitle("Speculative round time: per-draft baseline / method (same run)" + title_suffix, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.legend(list(handles.values()), list(handles.keys()), loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(3, len(handles)), fontsize=8, frameon=False)
    return fig


def _line_style(method: str) -> tuple[str, str]:
    """(marker, line style): ReplaySSM solid circles, its dual variant dashed squares, others dotted."""
    m = METHODS.get(method)
    if m is None or m.traffic != "spec-replay":
        return "^", ":"
    return ("s", "--") if m.lo else ("o", "-")


def memory_params(df) -> dict:
    """T, L, K for the memory table: the run's speculative rows, else T = 4, K = 16, L = K + T."""
    T, K, L = 4, 16, None
    if len(df) and "method" in df:
        spec = df[df["method"].isin(SPEC_METHODS) & (df["spec_window"].fillna(0) > 0)]
        if len(spec):
            T = int(spec["spec_window"].max())
        rep = df[df["method"] == "spec-replay"]
        if len(rep):
            K = int(rep["flush_period"].mode().iloc[0])
            L = int(rep["buffer_len"].max())
    return {"spec_window": T, "flush_period": K, "buffer_len": max(L or 0, K + T)}


def memory_frame(rows) -> pd.DataFrame:
    return pd.DataFrame([{"model": r.model, "method": r.method, "layout": r.layout,
                          "MiB/layer": f"{r.per_layer / memory.MiB:.2f}", "SSM layers": r.n_ssm_layers,
                          "MiB/request": f"{r.bytes_per_request / memory.MiB:.2f}", "max batch": r.max_batch,
                          "vs per-draft": f"{r.vs_perdraft:.2f}×"} for r in rows], columns=MEMORY_COLS)


def sections(df, out_dir: Path, cpu: bool = False):
    """(figures [(title, caption, png)], tables [(title, intro, DataFrame, columns)]) for write_report (report/__init__.py)."""
    figures, tables = [], []
    st = spec_table(df)
    if len(st):
        png = fig_spec_speedup(st, out_dir, " - CPU, not GPU performance" if cpu else "")
        if png is not None:
            figures.append(("Speculative decoding: speedup over per-draft slots",
                            "Per-draft median / method median per verify+commit round of one layer (same model, "
                            "batch, window T, state dtype); the per-draft baseline writes the state after every "
                            "draft into 1 + T slots (vLLM's speculative path).", png))
        tables.append(("Speculative decoding (same run)",
                       "median_us per round per layer; verified = batch*T per round, committed = batch*accepted; "
                       "vs_perdraft = spec-perdraft median / this median.", st, SPEC_COLS))
    models = [m for m in dict.fromkeys(df["model"].dropna())] if len(df) else []
    if models:
        p = memory_params(df)
        try:
            rows = memory.memory_table(models, MEMORY_BUDGET_GB, p["spec_window"], p["buffer_len"], p["flush_period"])
        except ValueError:
            rows = []
        if rows:
            png = memory.fig_memory(rows, out_dir, MEMORY_BUDGET_GB)
            intro = (f"Analytical, per request: T = {p['spec_window']}, L = {p['buffer_len']}, K = {p['flush_period']}, "
                     f"budget {MEMORY_BUDGET_GB:g} GB. " + memory.EXCLUDED)
            figures.append(("SSM-state memory per request and max concurrency",
                            intro + " Numbers on the bars: the largest batch whose SSM state fits the budget.", png))
            tables.append(("SSM-state memory and max concurrency", intro, memory_frame(rows), MEMORY_COLS))
    return figures, tables
