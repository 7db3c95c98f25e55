"""Reports from stored rows only: ``reports/<run-id>/`` with report.md, report.html
(self-contained, PNGs inlined as base64) and figures as PNG + SVG.

Figures:
  time_vs_batch      time per decode step vs batch, one line per method (x backend), facets per model
  bytes_per_step     modelled bytes per decode step (rows' bytes_model), bars per method variant
  speedup_<model>    replay-family speedup vs eager over buffer_len x flush_period at the largest batch
                     (none for a 1x1 grid of a model the model_size figure shows)
  model_size         with scaled variants (<model>@d<depth>w<width>): speedup vs eager vs state size
                     (report_size.py)
  paper_style        paper-scenario runs: ratios over vLLM's kernels next to the authors' published
                     points (report_paper.py, published.toml)
  spread             with --compare OTHER: run-to-run spread against a repeat (report_spread.py)

Tables beside them: speedups vs eager, the roofline and vLLM comparisons (report_roofline.py),
the paper reference points (report_paper.py), the project's targets held against the run
(report_goals.py, goals.toml), speculative decoding and SSM-state memory (report_spec.py).

Speedups are computed here from rows of the same run; they are never stored.
A report never runs a kernel.
"""

from __future__ import annotations

import base64
import html
import math
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "replaybench"   # SVG ids from content: regenerating changes no byte
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib import colors as mcolors  # noqa: E402

from . import methods  # noqa: E402
from .store import RunStore  # noqa: E402

METHOD_ORDER = list(methods.METHODS)
REPLAY_FAMILY = methods.names(vs_eager=True)     # compared against eager in speedup figures
METHOD_COLORS = methods.colors()                 # one fixed colour per method (replaybench.methods)
BACKEND_STYLES = {"triton": ("-", "o"), "reference": ("--", "s"), "vllm": (":", "^")}
FIG_PATTERNS = ("time_vs_batch.*", "bytes_per_step.*", "speedup_*.png", "speedup_*.svg", "spec_speedup.*",
                "memory.*", "roofline.*", "traffic_measured.*", "spread.*", "model_size.*",
                "paper_style.*")

from .schema import TABLE_COLUMNS  # noqa: E402  (the "All rows" table's columns)


# ----------------------------------------------------------------------------- helpers

def throttle_table(df):
    """ok rows with a throttle reason: case_id, method, throttle, discarded, samples, power_capped."""
    import pandas as pd
    cols = ["case_id", "method", "throttle", "discarded", "samples", "power_capped"]
    if not len(df) or "throttle" not in df.columns:
        return pd.DataFrame(columns=cols)
    t = df[(df["status"] == "ok") & df["throttle"].fillna("").astype(str).ne("")].copy()
    if "power_capped" not in t.columns:
        t["power_capped"] = False
    t["power_capped"] = t["power_capped"].fillna(False).astype(bool)
    return t[[c for c in cols if c in t.columns]].sort_values("case_id").reset_index(drop=True)


def _slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s)


def _method_key(m: str) -> int:
    return methods.order(m)


def is_cpu_run(manifest: dict, df=None) -> bool:
    dev = manifest.get("device") or {}
    if dev.get("kind"):
        return dev["kind"] == "cpu"
    if df is not None and len(df):
        return bool((df["device"].astype(str) == "cpu").all())
    return False


def ok_rows(df):
    return df[(df["status"] == "ok") & df["median_us"].notna() & (df["median_us"] > 0)].copy()


def _pick(rows, col: str, prefer=None, how: str = "first"):
    """Filter rows to one value of col: prefer a value if present, else max / most common."""
    vals = [v for v in rows[col].dropna().unique()]
    if not vals:
        return rows
    if prefer is not None and prefer in vals:
        v = prefer
    elif how == "max":
        v = max(vals)
    else:
        v = rows[col].value_counts().index[0]
    return rows[rows[col] == v]


def _has_low_copy(method: str) -> bool:
    """A method whose state dtype is its own (a low copy): its rows are not picked by the model's
    reference state dtype."""
    m = methods.METHODS.get(method)
    return bool(m and m.lo)


def representative(rows, ref_state: str | None):
    """One configuration (state dtype, lo dtype, L, K, T) of one model x method."""
    r = rows
    if len(r) and not _has_low_copy(r["method"].iloc[0]):
        r = _pick(r, "state_dtype", prefer=ref_state)
    r = _pick(r, "lo_dtype", prefer="bfloat16")
    r = _pick(r, "buffer_len", how="max")
    if len(r):
        L = r["buffer_len"].max()
        r = _pick(r, "flush_period", prefer=L, how="max")
    r = _pick(r, "spec_window", how="max")
    return r


def _config_label(r) -> str:
    row = r.iloc[0]
    parts = []
    if int(row["buffer_len"] or 0):
        parts.append(f"L{int(row['buffer_len'])} K{int(row['flush_period'])}")
    if int(row["spec_window"] or 0):
        parts.append(f"T{int(row['spec_window'])}")
    if row["lo_dtype"] not in (None, "none"):
        parts.append(f"lo {row['lo_dtype']}")
    return ", ".join(parts)


def _ref_state(rows) -> str | None:
    e = rows[rows["method"] == "eager"]
    src = e if len(e) else rows
    vals = list(src["state_dtype"].dropna().unique())
    if not vals:
        return None
    return "float32" if "float32" in vals else src["state_dtype"].value_counts().index[0]


def _fmt_bytes(b: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b:.0f} B"


def _bytes_unit(maxv: float) -> tuple[str, float]:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if maxv >= div:
            return unit, div
    return "B", 1.0


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None:
        return ""
    try:
        if isinstance(v, float) and math.isnan(v):
            return ""
    except TypeError:
        pass
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1e6 or abs(v) < 1e-3:
            return f"{v:.{digits - 1}e}"
        return f"{v:.{digits}g}"
    try:
        import pandas as pd
        if v is pd.NA:
            return ""
    except ImportError:
        pass
    return str(v)


def _save(fig, out_dir: Path, stem: str) -> tuple[Path, Path]:
    png, svg = out_dir / f"{stem}.png", out_dir / f"{stem}.svg"
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(svg, bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return png, svg


def _fmt_ratio(c: float) -> str:
    if c >= 10:
        return f"{c:.0f}×"
    if c >= 0.1:
        return f"{c:.2f}×"
    return f"{c:.2g}×"


def _ratio_ticks(hi: float) -> list[float]:
    """Colorbar ticks for a symmetric log ratio scale [1/hi, hi], spaced evenly enough in
    log space that their labels never collide (at most ~9)."""
    ups = [1.1, 1.25, 1.5, 2, 3, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000]
    gap = 2 * math.log(hi) / 8
    keep, last = [], 1.0
    for u in ups:
        if u <= hi * 1.0001 and math.log(u) - math.log(last) >= gap * 0.999:
            keep.append(u)
            last = u
    return sorted([1 / u for u in keep] + [1.0] + keep)


def _fmt_axis_number(v: float) -> str:
    if v >= 1e5:
        return f"{v:.0e}".replace("e+0", "e").replace("e+", "e")
    return f"{v:g}"


def _plain_log_ticks(axis, values) -> None:
    """Plain numbers (not 4x10^1) on a log axis; label minor ticks when the range is short."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    fmt = FuncFormatter(lambda v, _: _fmt_axis_number(v))
    axis.set_major_formatter(fmt)
    v = [float(x) for x in values if x and x > 0]
    if v and math.log10(max(v) / min(v)) < 1.5:
        axis.set_minor_locator(LogLocator(subs=(2.0, 3.0, 5.0)))
        axis.set_minor_formatter(fmt)
    else:
        axis.set_minor_formatter(NullFormatter())


def _grid(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(n, max_cols)
    return (n + cols - 1) // cols, cols


def _empty_figure(title: str, msg: str):
    fig, ax = plt.subplots(figsize=(6.4, 2.4))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, msg, ha="center", va="center", fontsize=11, color="#555555",
            transform=ax.transAxes)
    return fig


def _device_suffix(manifest: dict, cpu: bool) -> str:
    name = (manifest.get("device") or {}).get("name") or manifest.get("device_name") or ""
    return f"CPU ({name}) - not GPU performance" if cpu else name


# ----------------------------------------------------------------------------- figures

def fig_time_vs_batch(df, manifest: dict, out_dir: Path, cpu: bool) -> tuple[Path, Path]:
    ok = ok_rows(df)
    title = f"Time per decode step vs batch\n{_device_suffix(manifest, cpu)}"
    if ok.empty:
        return _save(_empty_figure(title, "no successful rows to plot"), out_dir, "time_vs_batch")
    models = list(dict.fromkeys(ok["model"]))
    nr, nc = _grid(len(models))
    fig, axes = plt.subplots(nr, nc, figsize=(5.2 * nc, 4.0 * nr), squeeze=False)
    handles: dict[str, Any] = {}
    for ax, model in zip(axes.flat, models):
        mrows = ok[ok["model"] == model]
        ref = _ref_state(mrows)
        for method in sorted(mrows["method"].unique(), key=_method_key):
            rep = representative(mrows[mrows["method"] == method], ref)
            cfg = _config_label(rep)
            for backend in sorted(rep["backend"].unique()):
                r = rep[rep["backend"] == backend].sort_values("batch")
                ls, mk = BACKEND_STYLES.get(backend, ("-.", "D"))
                label = f"{method} / {backend}" + (f" ({cfg})" if cfg else "")
                x = r["batch"].astype(float).to_numpy()
                y = r["median_us"].to_numpy(dtype=float)
                iqr = r["iqr_us"].fillna(0).to_numpy(dtype=float) / 2
                h = ax.errorbar(x, y, yerr=[iqr, iqr], color=METHOD_COLORS.get(method, "k"),
                                linestyle=ls, marker=mk, markersize=5, capsize=2, linewidth=1.6,
                                label=label)
                handles.setdefault(label, h)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        batches = sorted(mrows["batch"].dropna().unique())
        ax.set_xticks([float(b) for b in batches])
        ax.set_xticklabels([str(int(b)) for b in batches])
        if len(batches) == 1:
            b = float(batches[0])
            ax.set_xlim(b / 1.6, b * 1.6)
        _plain_log_ticks(ax.yaxis, mrows["median_us"])
        ax.set_title(f"{model}  (state {ref})", fontsize=10)
        ax.set_xlabel("batch size (sequences)")
        ax.set_ylabel("time per step [µs]")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(models):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=12)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    ncol = min(3, max(1, len(handles)))
    fig.legend(list(handles.values()), list(handles.keys()), loc="upper center",
               bbox_to_anchor=(0.5, 0.0), ncol=ncol, fontsize=8, frameon=False,
               title="method / backend (config): solid = triton, dashed = reference, dotted = vllm",
               title_fontsize=8)
    return _save(fig, out_dir, "time_vs_batch")


def fig_bytes_per_step(df, manifest: dict, out_dir: Path) -> tuple[Path, Path]:
    rows = df[df["bytes_model"].notna()]
    title = "Modelled bytes moved per decode step (analytical traffic model, one layer, whole batch)"
    if rows.empty:
        return _save(_empty_figure(title, "no bytes_model in the rows of this run"),
                     out_dir, "bytes_per_step")
    models = list(dict.fromkeys(rows["model"]))
    panels = []
    for model in models:
        mrows = rows[rows["model"] == model]
        bmax = mrows["batch"].max()
        mrows = mrows[mrows["batch"] == bmax]
        ref = _ref_state(mrows)
        labels, values, cols = [], [], []
        for method in sorted(mrows["method"].unique(), key=_method_key):
            r = mrows[mrows["method"] == method]
            if not _has_low_copy(method):
                r = _pick(r, "state_dtype", prefer=ref)
            keys = ["buffer_len", "flush_period", "spec_window", "lo_dtype", "state_dtype"]
            groups = sorted(r.groupby(keys, dropna=False),
                            key=lambda kv: (str(kv[0][3]), str(kv[0][4]), int(kv[0][2] or 0),
                                            int(kv[0][0] or 0), int(kv[0][1] or 0)))
            for _, g in groups:
                cfg = _config_label(g)
                labels.append(method + (f"  {cfg}" if cfg else ""))
                values.append(float(g["bytes_model"].iloc[0]))
                cols.append(METHOD_COLORS.get(method, "k"))
        panels.append((model, bmax, ref, labels, values, cols))
    nbars = max(len(p[3]) for p in panels)
    nr, nc = _grid(len(panels), 2)
    fig, axes = plt.subplots(nr, nc, figsize=(7.2 * nc, (1.2 + 0.28 * nbars) * nr), squeeze=False)
    for ax, (model, bmax, ref, labels, values, cols) in zip(axes.flat, panels):
        unit, div = _bytes_unit(max(values))
        y = list(range(len(values)))
        bars = ax.barh(y, [v / div for v in values], color=cols, edgecolor="black", linewidth=0.4)
        for b, v in zip(bars, values):
            ax.annotate(_fmt_bytes(v), (b.get_width(), b.get_y() + b.get_height() / 2),
                        ha="left", va="center", fontsize=7, xytext=(3, 0),
                        textcoords="offset points")
        ax.set_yticks(y)
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel(f"bytes per step [{unit}]")
        ax.set_xlim(0, max(values) / div * 1.25)
        ax.set_title(f"{model}  (batch {int(bmax)}, state {ref})", fontsize=10)
        ax.grid(True, axis="x", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    return _save(fig, out_dir, "bytes_per_step")


def row_sessions(df, manifest: dict):
    """Per row, the index into manifest['sessions'] of the sweep invocation that measured it: the
    row's 'session' column (sweeps write it), else the last session started before the row
    finished (rows of older runs); None where neither is known."""
    import pandas as pd
    sess = manifest.get("sessions") or []
    own = df["session"] if "session" in df.columns else pd.Series([None] * len(df), index=df.index)
    if len(sess) <= 1:
        return own.where(own.notna(), 0 if sess else None)
    starts = pd.to_datetime(pd.Series([x.get("started") for x in sess]), utc=True, errors="coerce")
    fin = pd.to_datetime(df["finished"], utc=True, errors="coerce") if "finished" in df.columns else None
    out = []
    for i, v in enumerate(own.tolist()):
        if v is not None and v == v:
            out.append(int(v))
            continue
        t = fin.iloc[i] if fin is not None else pd.NaT
        k = [j for j, st in enumerate(starts) if not pd.isna(t) and not pd.isna(st) and st <= t]
        out.append(k[-1] if k else None)
    return pd.Series(out, index=df.index, dtype=object)


def _eager_index(ok) -> dict:
    e = ok[ok["method"] == "eager"]
    idx: dict = {}
    for model, batch, state, backend, med in zip(e["model"], e["batch"], e["state_dtype"],
                                                  e["backend"], e["median_us"]):
        idx.setdefault((model, int(batch), state, backend), float(med))
    return idx


def eager_baseline(eager_idx: dict, model: str, batch: int, state_dtype: str, backend: str,
                   method: str) -> tuple[float | None, str]:
    """Median of the matching eager row (same model, batch, state dtype, backend).

    replay-shared-low stores its low dtype as state_dtype; when no eager row of
    that dtype exists it is compared against eager float32 (labelled)."""
    key = (model, int(batch), state_dtype, backend)
    if key in eager_idx:
        return eager_idx[key], state_dtype
    if method in methods.METHODS and methods.METHODS[method].shared_low:
        key = (model, int(batch), "float32", backend)
        if key in eager_idx:
            return eager_idx[key], "float32"
    return None, state_dtype


def speedup_table(df):
    """Rows of the replay family with speedup = eager median / method median (same run)."""
    import pandas as pd
    ok = ok_rows(df)
    idx = _eager_index(ok)
    e = ok[ok["method"] == "eager"]
    # the session (row_sessions, set by write_report) that measured each eager row
    e_sess = ({} if "session" not in ok.columns else
              {k: v for k, v in zip(zip(e["model"], e["batch"].astype(int), e["state_dtype"], e["backend"]),
                                    e["session"])})
    out = []
    fam = ok[ok["method"].isin(REPLAY_FAMILY)]
    for r in fam.to_dict(orient="records"):
        base, base_dtype = eager_baseline(idx, r["model"], r["batch"], r["state_dtype"],
                                          r["backend"], r["method"])
        if base is None:
            continue
        es = e_sess.get((r["model"], int(r["batch"]), base_dtype, r["backend"]))
        ms = r.get("session")
        cross = es is not None and ms is not None and es == es and ms == ms and int(es) != int(ms)
        out.append({"model": r["model"], "method": r["method"], "backend": r["backend"],
                    "batch": int(r["batch"]), "buffer_len": int(r["buffer_len"]),
                    "flush_period": int(r["flush_period"]), "spec_window": int(r["spec_window"]),
                    "state_dtype": r["state_dtype"], "lo_dtype": r["lo_dtype"],
                    "eager_state_dtype": base_dtype, "eager_us": base,
                    "median_us": float(r["median_us"]), "speedup": base / float(r["median_us"]),
                    "pct_copy_bw": r.get("pct_copy_bw"), "cross_session": bool(cross),
                    "route": route_label(r.get("route_period"))})
    return pd.DataFrame(out)


def route_label(period) -> str:
    """A replay row's route (its `route_period` column: 0 buffered, k >= 1 the small-batch route
    writing the state every k-th step); "" where the run did not record it."""
    if period is None or period != period:
        return ""
    k = int(period)
    return "buffered" if k == 0 else ("state written every step (eager-shaped)" if k == 1
                                      else f"state written every {k} steps")


def fig_speedup_heatmaps(df, manifest: dict, out_dir: Path, cpu: bool,
                         sp=None, covered=()) -> list[tuple[str, Path, Path]]:
    """One heat map per model; none for a model in ``covered`` (the model-size section's) that
    has a single (buffer_len, flush_period) cell."""
    sp = speedup_table(df) if sp is None else sp
    figs = []
    if sp.empty:
        return figs
    for model in dict.fromkeys(sp["model"]):
        s = sp[sp["model"] == model]
        bmax = s["batch"].max()
        s = s[s["batch"] == bmax]
        Ls = sorted(s["buffer_len"].unique())
        Ks = sorted(s["flush_period"].unique())
        if len(Ls) * len(Ks) == 1 and model in covered:
            continue    # a 1x1 grid says less than the model-size figure, which shows these ratios
        # one panel per state precision too: a run with fp32 and bf16 states of one method
        # would otherwise draw both into one cell, the later row hiding the other
        variants = sorted(s.groupby(["method", "backend", "state_dtype", "lo_dtype", "spec_window"]).groups,
                          key=lambda k: (_method_key(k[0]), k[1], k[2] != "float32", str(k[2]), str(k[3]), k[4]))
        states = {m: set(s[s["method"] == m]["state_dtype"]) for m in set(s["method"])}
        nr, nc = _grid(len(variants), 3)
        fig, axes = plt.subplots(nr, nc, figsize=(1.2 + 1.05 * max(3, len(Ks)) * nc,
                                                  1.3 + 0.8 * max(2, len(Ls)) * nr),
                                 squeeze=False)
        vals = s["speedup"].to_numpy(dtype=float)
        # log scale symmetric around 1: a 2x slowdown is as dark as a 2x speedup
        hi = min(max(float(vals.max()), 1.0 / float(vals.min()), 1.1), 1e4)
        norm = mcolors.LogNorm(vmin=1.0 / hi, vmax=hi)
        cmap = plt.get_cmap("RdBu").with_extremes(bad="#e6e6e6")
        im = None
        for ax, (method, backend, sdt, lo_dt, T) in zip(axes.flat, variants):
            v = s[(s["method"] == method) & (s["backend"] == backend) & (s["state_dtype"] == sdt)
                  & (s["lo_dtype"] == lo_dt) & (s["spec_window"] == T)]
            grid = np.full((len(Ls), len(Ks)), np.nan)
            star = np.zeros((len(Ls), len(Ks)), dtype=bool)
            for _, r in v.iterrows():
                grid[Ls.index(r["buffer_len"]), Ks.index(r["flush_period"])] = r["speedup"]
                star[Ls.index(r["buffer_len"]), Ks.index(r["flush_period"])] = bool(r.get("cross_session"))
            im = ax.imshow(np.ma.masked_invalid(grid), cmap=cmap, norm=norm, origin="lower",
                           aspect="auto")
            for i in range(len(Ls)):
                for j in range(len(Ks)):
                    if not math.isnan(grid[i, j]):
                        c = grid[i, j]
                        dark = abs(float(norm(c)) - 0.5) > 0.3
                        ax.text(j, i, _fmt_ratio(c) + ("*" if star[i, j] else ""), ha="center", va="center",
                                fontsize=9,
                                color="white" if dark else "black")
                    else:
                        ax.text(j, i, "n/a", ha="center", va="center", fontsize=7, color="#888888")
            ax.set_xticks(range(len(Ks)))
            ax.set_xticklabels([str(k) for k in Ks])
            ax.set_yticks(range(len(Ls)))
            ax.set_yticklabels([str(L) for L in Ls])
            ax.set_xlabel("flush period K (steps)")
            ax.set_ylabel("buffer length L (steps)")
            sub = f"{method} / {backend}"
            if len(states[method]) > 1:
                sub += f", state {sdt}"
            if lo_dt not in (None, "none"):
                sub += f"\nlo {lo_dt}"
            if T:
                sub += f", T{T}"
            base_dt = set(v["eager_state_dtype"])
            if v["state_dtype"].iloc[0] not in base_dt:
                sub += f" (vs eager {', '.join(sorted(base_dt))})"
            ax.set_title(sub, fontsize=9)
        for ax in list(axes.flat)[len(variants):]:
            ax.axis("off")
        fig.suptitle(f"Speedup vs eager (eager time / method time), {model}, batch {int(bmax)}\n"
                     f"{_device_suffix(manifest, cpu)}", fontsize=11)
        fig.tight_layout(rect=(0, 0, 0.9, 0.93))
        cax = fig.add_axes((0.92, 0.12, 0.018, 0.7))
        cb = fig.colorbar(im, cax=cax)
        cb.set_ticks(_ratio_ticks(hi))
        cb.set_ticklabels([f"{t:.3g}×" for t in _ratio_ticks(hi)])
        cb.minorticks_off()
        cb.set_label("speedup (×, log scale); >1 faster than eager")
        png, svg = _save(fig, out_dir, f"speedup_{_slug(model)}")
        figs.append((model, png, svg))
    return figs


# ----------------------------------------------------------------------------- text

def header_lines(manifest: dict, df, cpu: bool) -> list[tuple[str, str]]:
    dev = manifest.get("device") or {}
    ver = manifest.get("versions") or {}
    git = manifest.get("git") or {}
    sc = manifest.get("scenario") or {}
    ceil = manifest.get("ceilings") or {}
    env = manifest.get("env") or {}
    items: list[tuple[str, str]] = [
        ("run", str(manifest.get("run_id", ""))),
        ("scenario", f"{sc.get('name', '')} ({sc.get('path', '')}, sha256 {str(sc.get('sha256', ''))[:12]})"),
        ("runner", str(sc.get("runner", ""))),
        ("created / updated", f"{manifest.get('created', '')} / {manifest.get('updated', '')}"),
        ("git", f"{git.get('sha') or 'unknown'}{' (dirty)' if git.get('dirty') else ''}"),
        ("host", str(manifest.get("hostname", ""))),
    ]
    if cpu:
        items += [("device", f"CPU: {dev.get('name') or dev.get('cpu_model', '')} "
                             f"({dev.get('torch_threads', '?')} torch threads)"),
                  ("TRITON_INTERPRET", str(env.get("TRITON_INTERPRET")))]
    else:
        clocks = (f"SM {dev.get('sm_clock_mhz')} / {dev.get('max_sm_clock_mhz')} MHz, "
                  f"memory {dev.get('mem_clock_mhz')} / {dev.get('max_mem_clock_mhz')} MHz "
                  f"(current / max at start)")
        items += [("device", f"GPU: {dev.get('name', '')} (cc {dev.get('compute_capability', '?')}, "
                             f"{dev.get('multiprocessors', '?')} SMs)"),
                  ("GPU UUID", str(dev.get("uuid"))),
                  ("driver / CUDA", f"{dev.get('driver')} / driver CUDA {dev.get('cuda_driver_version')}, "
                                    f"torch CUDA {ver.get('torch_cuda')}"),
                  ("power limit", f"{dev.get('power_limit_w')} W"),
                  ("clocks", clocks)]
    items.append(("versions", ", ".join(f"{k} {ver.get(k)}" for k in
                                        ("python", "torch", "triton", "vllm") if k in ver)))
    if ceil:
        items.append(("measured ceilings",
                      f"copy {_fmt(ceil.get('copy_gbps'))} GB/s (torch.add out=), "
                      f"read {_fmt(ceil.get('read_gbps'))} GB/s (torch.sum), "
                      f"matmul {_fmt(ceil.get('matmul_tflops'))} TFLOP/s ({ceil.get('matmul_dtype')})"))
    else:
        items.append(("measured ceilings", "not measured (pct_copy_bw empty)"))
    sess = manifest.get("sessions") or []
    if len(sess) > 1:   # a resumed run: rows of different invocations (maybe other GPUs / commits)
        per = row_sessions(df, manifest).value_counts().to_dict() if len(df) else {}
        items.append(("sessions", f"{len(sess)} (resumed run; ceilings from the first): " + "; ".join(
            f"#{i} {x.get('started', '?')}, git {str(x.get('git_sha') or '?')[:10]}"
            f"{' dirty' if x.get('git_dirty') else ''}, GPU {x.get('gpu_uuid') or 'uuid not recorded'}, "
            f"{per.get(i, 0)} rows" for i, x in enumerate(sess))))
    counts = df["status"].value_counts().to_dict() if len(df) else {}
    ncases = (manifest.get("counts") or {}).get("cases") or sc.get("n_cases")
    items.append(("rows", f"{len(df)} of {ncases} cases: " + ", ".join(
        f"{counts.get(s, 0)} {s}" for s in ("ok", "error", "skipped"))))
    return items


CPU_BANNER = ("CPU run: every number below was measured on a CPU ({name}), with the Triton "
              "kernels running under the Triton interpreter (TRITON_INTERPRET=1). These times "
              "are NOT GPU performance and say nothing about it; only the modelled bytes "
              "(analytical traffic model) carry over to a GPU.")


def _md_escape(s: str) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def _md_table(df, cols: list[str]) -> str:
    if df.empty:
        return "_(none)_\n"
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.to_dict(orient="records"):
        lines.append("| " + " | ".join(_md_escape(_fmt(r.get(c))) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _html_table(df, cols: list[str]) -> str:
    if df.empty:
        return "<p><em>(none)</em></p>"
    out = ["<table><thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr></thead><tbody>"]
    for r in df.to_dict(orient="records"):
        cls = f' class="{html.escape(str(r.get("status")))}"' if "status" in cols else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(_fmt(r.get(c)))}</td>" for c in cols) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _html_code(text: str) -> str:
    """Escape text for HTML, rendering Markdown `code` spans as <code>."""
    parts = str(text).split("`")
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def _sorted_rows(df):
    d = df.copy()
    d["_m"] = d["method"].map(_method_key)
    d = d.sort_values(["model", "_m", "backend", "state_dtype", "lo_dtype", "buffer_len",
                       "flush_period", "spec_window", "batch"], kind="stable")
    return d.drop(columns="_m")


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1200px;color:#222;padding:0 1em}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:2em;border-bottom:1px solid #ddd}
.banner{background:#fff3cd;border:1px solid #e0b400;padding:.8em 1em;border-radius:6px;font-weight:600}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}dl.meta dt{font-weight:600}dl.meta dd{margin:0}
table{border-collapse:collapse;font-size:12px;margin:.5em 0}th,td{border:1px solid #ccc;padding:2px 6px;text-align:left}
th{background:#f3f3f3;position:sticky;top:0}tr.error td{background:#fde2e2}tr.skipped td{background:#eeeeee}
img{max-width:100%;border:1px solid #eee}figure{margin:1em 0}figcaption{font-size:.9em;color:#555}
"""


def write_report(run: str | Path, reports_dir: str | Path = "reports",
                 results_dir: str | Path = "results", compare: str | Path | None = None) -> Path:
    """Regenerate ``reports_dir/<run-id>/`` from the stored rows of ``run`` (id or path).

    ``compare``: another run (a repeat of this one, same device) whose run-to-run spread
    against this run becomes a figure (spread.png/.svg, per-case spread.csv) and a section;
    a missing run, the run itself or another device raises StoreError before anything is
    written. Re-materialises rows.parquet / rows.csv from rows.jsonl only where they lag it
    (committed results stay byte-identical).  Returns the report dir.
    """
    store = RunStore.open(run, results_dir)
    manifest = store.manifest()
    df = store.dataframe()
    if len(df):
        df["session"] = row_sessions(df, manifest)     # pairs across sessions get marked
    run_id = manifest.get("run_id") or store.run_id
    other = None
    if compare is not None:
        from .report_spread import open_other
        ostore, omanifest, odf = open_other(compare, results_dir, store, manifest, df)
        other = (omanifest.get("run_id") or ostore.run_id, omanifest, odf)
    if store.rows_path.exists() and not store.tables_current():
        store.materialise()
    out_dir = Path(reports_dir) / run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    for pat in FIG_PATTERNS:
        for old in out_dir.glob(pat):
            old.unlink()
    cpu = is_cpu_run(manifest, df)

    figures: list[tuple[str, str, Path]] = []   # (title, caption, png)
    png, _ = fig_time_vs_batch(df, manifest, out_dir, cpu)
    figures.append(("Time per decode step vs batch",
                    "Median time per decode step of one SSM layer for the whole batch; error bars "
                    "span the IQR. One line per method and backend at one configuration per method "
                    "(named in the legend).", png))
    png, _ = fig_bytes_per_step(df, manifest, out_dir)
    figures.append(("Modelled bytes per decode step",
                    "Bytes read + written per decode step from the analytical traffic model "
                    "(bytes_model column), averaged over a flush period, at the largest batch.", png))
    sp = speedup_table(df)
    cross = ("; * = the eager and method medians come from different sessions of this resumed run "
             "(see 'sessions' above: possibly another GPU or commit)"
             if len(sp) and sp["cross_session"].any() else "")
    from .report_size import sections as size_sections, size_table   # width/depth-scaled variants
    size_t = size_table(df, sp)
    for model, png, _ in fig_speedup_heatmaps(df, manifest, out_dir, cpu, sp, covered=set(size_t["model"])):
        figures.append((f"Speedup vs eager: {model}",
                        "Eager median / method median, same run, same model, batch, state dtype "
                        f"and backend, at the largest batch; n/a = not measured or invalid (K > L){cross}.",
                        png))
    size_figures, size_tables = size_sections(df, manifest, out_dir, cpu, size_t)
    figures += size_figures
    from .report_spec import sections as spec_sections   # speculative decoding, SSM-state memory
    extra_figures, extra_tables = spec_sections(df, out_dir, cpu)
    figures += extra_figures
    from .report_roofline import sections as roofline_sections  # roofline, measured traffic, vs vLLM
    roof_figures, roof_tables = roofline_sections(df, manifest, out_dir, _save)
    figures += roof_figures
    from .report_paper import sections as paper_sections  # paper scenario: vs vLLM next to published points
    paper_figures, paper_tables = paper_sections(df, manifest, out_dir, cpu)
    figures += paper_figures
    from .report_goals import sections as goal_sections  # the project's targets (goals.toml)
    extra_tables = size_tables + roof_tables + paper_tables + goal_sections(df) + extra_tables
    thr = throttle_table(df)
    if len(thr):
        extra_tables.append(("Throttled measurements",
                             "Rows whose timing saw NVML throttle reasons (replaybench.timing): throttled "
                             "batches are discarded and counted; power_capped = every batch ran under the "
                             "power cap alone, so the median is the kernel's power-capped rate.",
                             thr, list(thr.columns)))
    spread = None
    if other is not None:
        from .report_spread import command, section
        oid, omanifest, odf = other
        spread = section(run_id, manifest, df, oid, omanifest, odf, out_dir, _save, METHOD_COLORS,
                         _device_suffix(manifest, cpu), command(run_id, oid, results_dir, reports_dir))

    rows_sorted = _sorted_rows(df) if len(df) else df
    errors = rows_sorted[rows_sorted["status"] == "error"] if len(df) else df
    header = header_lines(manifest, df, cpu)
    dev_name = (manifest.get("device") or {}).get("name", "")
    banner = CPU_BANNER.format(name=dev_name) if cpu else None
    sp_cols = ["model", "method", "backend", "batch", "buffer_len", "flush_period", "spec_window",
               "state_dtype", "lo_dtype", "eager_us", "median_us", "speedup"]
    if len(sp) and (sp["route"] != "").any():   # runs since session 30 record the replay step's route
        sp_cols.append("route")
    title = f"replaybench report: {run_id}" + (" [CPU run]" if cpu else "")

    # markdown
    md = [f"# {title}", ""]
    if banner:
        md += [f"> **{banner}**", ""]
    md += [f"- **{k}**: {_md_escape(v)}" for k, v in header] + [""]
    for t, cap, p in figures:
        md += [f"## {t}", "", f"![{t}]({p.name})", "", f"_{cap}_ (vector: [{p.stem}.svg]({p.stem}.svg))", ""]
    if spread is not None:
        p = spread.png
        md += [f"## {spread.title}", "", f"![{spread.title}]({p.name})", "",
               f"_{spread.caption}_ (vector: [{p.stem}.svg]({p.stem}.svg); every case: "
               f"[{spread.csv.name}]({spread.csv.name}))", "", spread.intro, "",
               f"Reproduce: `{spread.command}`", "", _md_table(spread.summary, list(spread.summary.columns)),
               f"Worst {len(spread.worst)} case(s):", "", _md_table(spread.worst, list(spread.worst.columns))]
    md += ["## Speedups vs eager (same run)", "", _md_table(sp, sp_cols)]
    for t, intro, tdf, cols in extra_tables:
        md += [f"## {t}", "", intro, "", _md_table(tdf, cols)]
    md += [f"## Errors ({len(errors)})", "", _md_table(errors, ["case_id", "error"])]
    md += [f"## All rows ({len(df)})", "", _md_table(rows_sorted, TABLE_COLUMNS)]
    (out_dir / "report.md").write_text("\n".join(md), encoding="utf-8")

    # html (self-contained)
    h = ["<!DOCTYPE html><html><head><meta charset='utf-8'>",
         f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
         f"<h1>{html.escape(title)}</h1>"]
    if banner:
        h.append(f"<p class='banner'>{html.escape(banner)}</p>")
    h.append("<dl class='meta'>" + "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(v)}</dd>"
                                           for k, v in header) + "</dl>")
    for t, cap, p in figures:
        b64 = base64.b64encode(p.read_bytes()).decode("ascii")
        h.append(f"<h2>{html.escape(t)}</h2><figure><img alt='{html.escape(t)}' "
                 f"src='data:image/png;base64,{b64}'><figcaption>{html.escape(cap)}</figcaption></figure>")
    if spread is not None:
        b64 = base64.b64encode(spread.png.read_bytes()).decode("ascii")
        t = html.escape(spread.title)
        h.append(f"<h2>{t}</h2><figure><img alt='{t}' src='data:image/png;base64,{b64}'>"
                 f"<figcaption>{html.escape(spread.caption)}</figcaption></figure>"
                 f"<p>{_html_code(spread.intro)}</p><p>Reproduce: <code>{html.escape(spread.command)}</code></p>"
                 + _html_table(spread.summary, list(spread.summary.columns))
                 + f"<p>Worst {len(spread.worst)} case(s):</p>"
                 + _html_table(spread.worst, list(spread.worst.columns)))
    h.append("<h2>Speedups vs eager (same run)</h2>" + _html_table(sp, sp_cols))
    for t, intro, tdf, cols in extra_tables:
        h.append(f"<h2>{html.escape(t)}</h2><p>{html.escape(intro)}</p>" + _html_table(tdf, cols))
    h.append(f"<h2>Errors ({len(errors)})</h2>" + _html_table(errors, ["case_id", "error"]))
    h.append(f"<h2>All rows ({len(df)})</h2>" + _html_table(rows_sorted, TABLE_COLUMNS))
    h.append("</body></html>")
    (out_dir / "report.html").write_text("\n".join(h), encoding="utf-8")
    return out_dir
