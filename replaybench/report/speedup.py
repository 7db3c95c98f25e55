"""Speedups over eager from rows of the same run (never stored): the table and one heat map per
model over buffer length x flush period."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from matplotlib import colors as mcolors

from .. import methods
from .common import (REPLAY_FAMILY, device_suffix, file_slug, fmt_ratio, grid_shape, method_key, ok_rows, plt,
                     ratio_ticks, save_figure)


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
                          key=lambda k: (method_key(k[0]), k[1], k[2] != "float32", str(k[2]), str(k[3]), k[4]))
        states = {m: set(s[s["method"] == m]["state_dtype"]) for m in set(s["method"])}
        nr, nc = grid_shape(len(variants), 3)
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
                        ax.text(j, i, fmt_ratio(c) + ("*" if star[i, j] else ""), ha="center", va="center",
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
                     f"{device_suffix(manifest, cpu)}", fontsize=11)
        fig.tight_layout(rect=(0, 0, 0.9, 0.93))
        cax = fig.add_axes((0.92, 0.12, 0.018, 0.7))
        cb = fig.colorbar(im, cax=cax)
        cb.set_ticks(ratio_ticks(hi))
        cb.set_ticklabels([f"{t:.3g}×" for t in ratio_ticks(hi)])
        cb.minorticks_off()
        cb.set_label("speedup (×, log scale); >1 faster than eager")
        png, svg = save_figure(fig, out_dir, f"speedup_{file_slug(model)}")
        figs.append((model, png, svg))
    return figs
