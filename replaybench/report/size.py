"""Model-size section, for runs that sweep depth/width-scaled variants of a model
(``<base>@d<depth>w<width>``, replaybench.models.scaled_model), from stored rows only.

    size_table       one row per (base model, scaled variant, method, batch) of the replay family:
                     the variant's SSM state bytes per layer and sequence, the method's and the
                     matching eager median (same run, variant, batch, state dtype, backend), their
                     ratio and the method's % of the copy bandwidth
    fig_size_speedup speedup over eager vs the variant's SSM state bytes per layer, one panel per
                     base model, one line per (method, batch)

A base model takes part only with >= 2 of its variants in the run (the unscaled model counts
as the variant x1); without any, the section is absent.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..models import get_model
from ..traffic import DTYPE_BYTES
from .common import (METHOD_COLORS, config_label, device_suffix, fmt_bytes, grid_shape, method_key, pick_one, plt,
                     reference_state, representative, save_figure)
from .speedup import speedup_table

SIZE_COLS = ["base model", "depth", "width", "state/layer", "method", "backend", "config", "batch",
             "median_us", "eager_us", "speedup", "pct_copy_bw"]
# largest batch solid: the batch that matters for serving reads first
_BATCH_STYLES = [("-", "o"), ("--", "s"), (":", "^"), ("-.", "D")]


def size_table(df, sp=None) -> pd.DataFrame:
    """Replay-family speedups (speedup_table: eager median / method median, same run; `sp` when
    the caller has it) of the scaled variants of every base model with >= 2 variants in the run,
    one configuration per method (common.representative, triton preferred), sorted by base
    model, size, method, batch."""
    sp = speedup_table(df) if sp is None else sp
    if len(sp):
        sp = sp[sp["spec_window"] == 0]     # a speculative round is T tokens, not one decode step
    if sp.empty or not sp["model"].str.contains("@").any():
        return pd.DataFrame(columns=["model"] + SIZE_COLS)
    spec = {m: _model(m) for m in sp["model"].unique()}
    sp = sp[sp["model"].map(spec).notna()]
    sp["base model"] = sp["model"].map(lambda m: spec[m].base or spec[m].name)
    fams = sp.groupby("base model")["model"].nunique()
    sp = sp[sp["base model"].isin(fams[fams >= 2].index)]
    out = []
    # one x per variant: its state at the family's state dtype, whatever a method's own dtype
    ref = {base: reference_state(g) for base, g in sp.groupby("base model")}
    for (base, model, method), g in sp.groupby(["base model", "model", "method"], sort=False):
        rep = pick_one(representative(g, reference_state(g)), "backend", prefer="triton")
        m = spec[model]
        state = m.state_bytes_per_layer(DTYPE_BYTES[ref[base]])
        for r in rep.sort_values("batch").to_dict("records"):
            out.append({"base model": base, "model": model, "depth": m.depth, "width": m.width,
                        "state_bytes": state, "state_dtype": ref[base], "n_ssm_layers": m.n_ssm_layers,
                        "state/layer": fmt_bytes(state), "method": method, "backend": r["backend"],
                        "config": config_label(rep),
                        "batch": r["batch"], "median_us": r["median_us"], "eager_us": r["eager_us"],
                        "speedup": r["speedup"], "pct_copy_bw": r["pct_copy_bw"]})
    if not out:
        return pd.DataFrame(columns=["model"] + SIZE_COLS)
    t = pd.DataFrame(out)
    t["_m"] = t["method"].map(method_key)
    return (t.sort_values(["base model", "width", "depth", "_m", "batch"], kind="stable")
             .drop(columns="_m").reset_index(drop=True))


def _model(name: str):
    try:
        return get_model(name)
    except ValueError:      # a model this checkout does not know (an old run's): not part of a family
        return None


def _varies(t: pd.DataFrame) -> str:
    """Which scale factor differs between the variants of t: width, depth or both."""
    w, d = t["width"].nunique() > 1, t["depth"].nunique() > 1
    return "width and depth" if w and d else ("depth" if d else "width")


def fig_size_speedup(t: pd.DataFrame, out_dir: Path, device: str) -> Path:
    """Speedup over eager vs the variant's SSM state bytes per layer and sequence (log x, ticks
    also naming the scale factor), one panel per base model, a line per (method, batch):
    colour = method (common.METHOD_COLORS), line style / marker = batch; dashed line at 1."""
    bases = list(dict.fromkeys(t["base model"]))
    batches = sorted(t["batch"].unique(), reverse=True)
    nr, nc = grid_shape(len(bases), 2)
    fig, axes = plt.subplots(nr, nc, figsize=(5.8 * nc, 4.0 * nr), squeeze=False)
    # one y range for all panels, so families compare at a glance
    ys = t["speedup"].tolist() + [1.0]
    pad = 0.08 * max(max(ys) - min(ys), 0.1)
    handles: dict[str, object] = {}
    for ax, base in zip(axes.flat, bases):
        f = t[t["base model"] == base].copy()
        per_seq = _per_seq(f)
        f["x"] = f["state_bytes"] * (f["n_ssm_layers"] if per_seq else 1)
        for method in sorted(f["method"].unique(), key=method_key):
            for b in batches:
                g = f[(f["method"] == method) & (f["batch"] == b)].sort_values("x")
                if g.empty:
                    continue
                ls, mk = _BATCH_STYLES[batches.index(b) % len(_BATCH_STYLES)]
                label = f"{method}, batch {int(b)}"
                h, = ax.plot(g["x"], g["speedup"], color=METHOD_COLORS.get(method, "k"), linestyle=ls,
                             marker=mk, markersize=5, linewidth=1.6, label=label)
                handles.setdefault(label, h)
        ax.axhline(1.0, color="black", linestyle="--", linewidth=0.9)
        ax.set_xscale("log", base=2)
        ticks = f.drop_duplicates("x").sort_values("x")
        ax.set_xticks(ticks["x"].tolist())
        ax.set_xticklabels([_scale_label(r, per_seq) + f"\n{fmt_bytes(r['x'])}" for _, r in ticks.iterrows()],
                           fontsize=8)
        ax.minorticks_off()
        lo, hi = ticks["x"].min(), ticks["x"].max()
        ax.set_xlim(lo / 1.4, hi * 1.4)
        ax.set_ylim(min(ys) - pad, max(ys) + pad)
        what = "of all SSM layers" if per_seq else "per layer"
        ax.set_xlabel(f"SSM state {what}, one sequence ({f['state_dtype'].iloc[0]}); "
                      f"top line: {'depth' if per_seq else 'width'} factor")
        ax.set_ylabel("speedup vs eager (eager / method)")
        ax.set_title(f"{base} ({get_model(base).op})", fontsize=10)
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(bases):]:
        ax.axis("off")
    fig.suptitle(f"Speedup vs model {_varies(t)} (eager median / method median, same run)\n{device}",
                 fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    # below the panels: never on top of a line
    fig.legend(list(handles.values()), list(handles.keys()), loc="upper center", bbox_to_anchor=(0.5, 0.0),
               ncol=min(len(handles), 2 * nc), fontsize=8, frameon=False,
               title="colour = method, line style / marker = batch", title_fontsize=8)
    png, _ = save_figure(fig, Path(out_dir), "model_size")
    return png


def _per_seq(f: pd.DataFrame) -> bool:
    # depth alone leaves a layer's state unchanged: then the x axis is the whole sequence's state
    return _varies(f) == "depth"


def _scale_label(r, per_seq: bool) -> str:
    if per_seq:
        return f"d×{r['depth']:g}"
    return f"×{r['width']:g}" + (f" d×{r['depth']:g}" if r["depth"] != 1 else "")


def sections(df, manifest: dict, out_dir: Path, cpu: bool = False, table=None):
    """(figures [(title, caption, png)], tables [(title, intro, DataFrame, columns)]) for write_report (report/__init__.py);
    both empty when the run has no base model with >= 2 scaled variants. `table`: size_table(df)
    when the caller has it (write_report also needs its models: their 1x1 heat maps are dropped)."""
    t = size_table(df) if table is None else table
    if t.empty:
        return [], []
    png = fig_size_speedup(t, out_dir, device_suffix(manifest, cpu))
    kind = "CPU" if cpu else "GPU"
    x = "per layer and sequence"
    if any(_per_seq(f) for _, f in t.groupby("base model")):
        x += " (of all SSM layers where only depth varies)"
    methods = ", ".join(sorted(t["method"].unique(), key=method_key))
    caption = (f"Speedup over eager of {methods} for the {_varies(t)}-scaled variants of "
               f"{', '.join(dict.fromkeys(t['base model']))}: eager median / method median per decode step of "
               f"one SSM layer (same variant, batch, state dtype and backend), one configuration per method "
               f"(in the table below), against the variant's SSM state bytes {x}; tick labels "
               f"name the scale factor (×1 = the published model). Both medians of every ratio were "
               f"measured in the same run on the same {kind}; above the dashed line at 1.0 the method is "
               f"faster than eager.")
    intro = ("One row per base model, variant, method and batch, at one configuration per method (config): "
             "state/layer = the variant's SSM state per layer and sequence; median_us = the method's median per "
             "decode step, eager_us = the matching eager median of the same run; speedup = eager_us / median_us; "
             "pct_copy_bw = the method's modelled bytes / time as % of the copy ceiling measured in this run.")
    return ([(f"Speedup vs model {_varies(t)}", caption, png)],
            [("Model size: speedup vs eager (same run)", intro, t, SIZE_COLS)])
