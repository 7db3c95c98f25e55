"""The report's first two figures: time per decode step vs batch, and modelled bytes per step;
and the table of rows timed under an NVML throttle reason."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from .common import (BACKEND_STYLES, METHOD_COLORS, bytes_unit, config_label, device_suffix, empty_figure,
                     fmt_bytes, grid_shape, method_key, ok_rows, pick_one, plain_log_ticks, plt, reference_state,
                     representative, save_figure, has_low_copy)


def fig_time_vs_batch(df, manifest: dict, out_dir: Path, cpu: bool) -> tuple[Path, Path]:
    ok = ok_rows(df)
    title = f"Time per decode step vs batch\n{device_suffix(manifest, cpu)}"
    if ok.empty:
        return save_figure(empty_figure(title, "no successful rows to plot"), out_dir, "time_vs_batch")
    models = list(dict.fromkeys(ok["model"]))
    nr, nc = grid_shape(len(models))
    fig, axes = plt.subplots(nr, nc, figsize=(5.2 * nc, 4.0 * nr), squeeze=False)
    handles: dict[str, Any] = {}
    for ax, model in zip(axes.flat, models):
        mrows = ok[ok["model"] == model]
        ref = reference_state(mrows)
        for method in sorted(mrows["method"].unique(), key=method_key):
            rep = representative(mrows[mrows["method"] == method], ref)
            cfg = config_label(rep)
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
        plain_log_ticks(ax.yaxis, mrows["median_us"])
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
    return save_figure(fig, out_dir, "time_vs_batch")


def fig_bytes_per_step(df, manifest: dict, out_dir: Path) -> tuple[Path, Path]:
    rows = df[df["bytes_model"].notna()]
    title = "Modelled bytes moved per decode step (analytical traffic model, one layer, whole batch)"
    if rows.empty:
        return save_figure(empty_figure(title, "no bytes_model in the rows of this run"),
                     out_dir, "bytes_per_step")
    models = list(dict.fromkeys(rows["model"]))
    panels = []
    for model in models:
        mrows = rows[rows["model"] == model]
        bmax = mrows["batch"].max()
        mrows = mrows[mrows["batch"] == bmax]
        ref = reference_state(mrows)
        labels, values, cols = [], [], []
        for method in sorted(mrows["method"].unique(), key=method_key):
            r = mrows[mrows["method"] == method]
            if not has_low_copy(method):
                r = pick_one(r, "state_dtype", prefer=ref)
            keys = ["buffer_len", "flush_period", "spec_window", "lo_dtype", "state_dtype"]
            groups = sorted(r.groupby(keys, dropna=False),
                            key=lambda kv: (str(kv[0][3]), str(kv[0][4]), int(kv[0][2] or 0),
                                            int(kv[0][0] or 0), int(kv[0][1] or 0)))
            for _, g in groups:
                cfg = config_label(g)
                labels.append(method + (f"  {cfg}" if cfg else ""))
                values.append(float(g["bytes_model"].iloc[0]))
                cols.append(METHOD_COLORS.get(method, "k"))
        panels.append((model, bmax, ref, labels, values, cols))
    nbars = max(len(p[3]) for p in panels)
    nr, nc = grid_shape(len(panels), 2)
    fig, axes = plt.subplots(nr, nc, figsize=(7.2 * nc, (1.2 + 0.28 * nbars) * nr), squeeze=False)
    for ax, (model, bmax, ref, labels, values, cols) in zip(axes.flat, panels):
        unit, div = bytes_unit(max(values))
        y = list(range(len(values)))
        bars = ax.barh(y, [v / div for v in values], color=cols, edgecolor="black", linewidth=0.4)
        for b, v in zip(bars, values):
            ax.annotate(fmt_bytes(v), (b.get_width(), b.get_y() + b.get_height() / 2),
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
    return save_figure(fig, out_dir, "bytes_per_step")


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
