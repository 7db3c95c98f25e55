"""Roofline, measured-vs-modelled traffic and the peer comparison, from stored rows only.

    fig_roofline          one point per kernel x method: arithmetic intensity (modelled FLOPs /
                          modelled bytes) vs achieved FLOP/s, under the run's measured ceilings
                          (copy and read bandwidth roofs, the matmul roof in its measured dtype)
    fig_traffic_measured  modelled vs Nsight-Compute-measured DRAM bytes per step (rows with
                          dram_bytes, from `sweep --ncu`); differences > 10 % are listed
    peer_table            per model / batch / state dtype: each method's median and its speedup
                          over vLLM's eager kernel and over our eager kernel, same run
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from ..methods import EAGER, PEER_EAGER as PEER  # noqa: E402
from .common import METHOD_COLORS, method_key, ok_rows  # noqa: E402

TRAFFIC_TOLERANCE = 0.10


def _label(r) -> str:
    lab = r["method"]
    if r.get("lo_dtype") not in (None, "none") and isinstance(r.get("lo_dtype"), str):
        lab += f" ({r['state_dtype']}+{r['lo_dtype']})"
    else:
        lab += f" ({r['state_dtype']})"
    return lab


def flop_rate(tflops: float) -> str:
    """A measured FLOP rate in a unit that shows it (a CPU's fp32 matmul is a few GFLOP/s)."""
    for unit, scale in (("TFLOP/s", 1.0), ("GFLOP/s", 1e3), ("MFLOP/s", 1e6)):
        if tflops * scale >= 1:
            return f"{tflops * scale:.3g} {unit}"
    return f"{tflops * 1e6:.3g} MFLOP/s"


def fig_roofline(df: pd.DataFrame, manifest: dict, out_dir: Path, save) -> Path | None:
    """Roofline at the largest batch of the run (None when the rows carry no FLOPs)."""
    ok = ok_rows(df)
    if "flops_model" not in ok or ok["flops_model"].isna().all() or not len(ok):
        return None
    ok = ok[ok["flops_model"].notna() & ok["bytes_model"].notna()]
    ok = ok[ok["batch"] == ok["batch"].max()]
    ceil = manifest.get("ceilings") or {}
    fig, ax = plt.subplots(figsize=(10.5, 5.5))
    ai = ok["flops_model"] / ok["bytes_model"]
    rate = ok["flops_model"] / (ok["median_us"] * 1e-6) / 1e12                 # TFLOP/s
    x = np.logspace(np.log10(max(ai.min() / 4, 1e-2)), np.log10(max(ai.max() * 1e3, 10)), 200)
    mm = ceil.get("matmul_tflops")
    for key, style, name in (("copy_gbps", "-", "copy"), ("read_gbps", "--", "read")):
        if ceil.get(key):
            roof = ceil[key] * 1e9 * x / 1e12
            if mm:
                roof = np.minimum(roof, mm)
            ax.plot(x, roof, style, color="0.3", lw=1.2, label=f"{name} roof {ceil[key]:.0f} GB/s (measured)")
    if mm:
        ax.axhline(mm, color="0.6", lw=1, ls=":", label=f"{ceil.get('matmul_dtype') or 'bfloat16'} matmul "
                   f"{flop_rate(mm)} (measured)")
    methods = sorted(ok["method"].unique(), key=method_key)
    markers = {"mamba2": "o", "gdn": "s"}
    for m in methods:     # each method in its colour of every figure (replaybench.methods)
        sub = ok[ok["method"] == m]
        for op, g in sub.groupby("op"):
            ax.scatter(ai[g.index], rate[g.index], color=METHOD_COLORS.get(m, "k"), marker=markers.get(op, "^"),
                       s=36, edgecolor="k", linewidth=0.4, label=f"{m} ({op})", zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity [FLOP / byte] (modelled)")
    ax.set_ylabel("achieved [TFLOP/s] (modelled FLOPs / measured time)")
    dev = (manifest.get("device") or {}).get("name", "")
    ax.set_title(f"Roofline, batch {int(ok['batch'].max())}, {dev}")
    ax.grid(True, which="both", alpha=0.25)
    # beside the axes: inside, the legend covered the roofs
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, frameon=False)
    fig.tight_layout()
    png, _ = save(fig, out_dir, "roofline")
    return png


def traffic_mismatches(df: pd.DataFrame) -> pd.DataFrame:
    """Rows whose measured DRAM bytes differ from the model by more than 10 %."""
    ok = ok_rows(df)
    if "dram_bytes" not in ok:
        return ok.iloc[0:0]
    ok = ok[ok["dram_bytes"].notna()]
    ratio = ok["dram_bytes"] / ok["bytes_model"]
    return ok[(ratio - 1).abs() > TRAFFIC_TOLERANCE].assign(dram_vs_model=ratio)


def fig_traffic_measured(df: pd.DataFrame, manifest: dict, out_dir: Path, save) -> Path | None:
    """Modelled vs measured bytes per step (one bar pair per case with ncu data)."""
    ok = ok_rows(df)
    if "dram_bytes" not in ok or ok["dram_bytes"].isna().all():
        return None
    ok = ok[ok["dram_bytes"].notna()].sort_values(["model", "method", "batch"])
    labels = [f"{r.model.split('-')[0][:4]}…{r.model[-8:]} {r.method} b{r.batch}" for r in ok.itertuples()]
    y = np.arange(len(ok))
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(ok) + 1.8))
    ax.barh(y - 0.2, ok["bytes_model"] / 1e6, height=0.4, label="modelled", color="#1f77b4")
    ax.barh(y + 0.2, ok["dram_bytes"] / 1e6, height=0.4, label="measured (ncu DRAM read+write)", color="#ff7f0e")
    ax.set_yticks(y, labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("MB per decode step (one layer, whole batch)")
    ax.set_title("Modelled vs measured memory traffic")
    ax.legend(fontsize=8)
    ax.grid(True, axis="x", alpha=0.3)
    fig.tight_layout()
    png, _ = save(fig, out_dir, "traffic_measured")
    return png


PEER_KEYS = ("model", "batch", "state_dtype")


def baseline_medians(ok: pd.DataFrame, method: str, keys=PEER_KEYS) -> pd.Series:
    """A baseline method's median per key (same model, batch, state dtype by default; the fastest
    where several rows share a key), from ok rows; our eager kernel from its Triton backend
    where the run has one.  peer_table and report.paper pair rows with a baseline through this."""
    b = ok[ok["method"] == method]
    if method == "eager":
        b = b[b["backend"] == "triton"] if (b["backend"] == "triton").any() else b
    return b.groupby(list(keys))["median_us"].min()


def peer_table(df: pd.DataFrame) -> pd.DataFrame:
    """Each method's median vs vLLM's eager kernel and our eager kernel (same model, batch, state dtype)."""
    ok = ok_rows(df)
    if not len(ok):
        return ok
    base = {name: baseline_medians(ok, name) for name in (EAGER, PEER)}
    rows = []
    for r in ok.itertuples():
        k = (r.model, r.batch, r.state_dtype)
        peer = base[PEER].get(k)
        ours = base[EAGER].get(k)
        rows.append({"model": r.model, "method": r.method, "backend": r.backend, "batch": r.batch,
                     "buffer_len": r.buffer_len, "flush_period": r.flush_period, "state_dtype": r.state_dtype,
                     "lo_dtype": r.lo_dtype, "median_us": r.median_us,
                     "pct_copy_bw": getattr(r, "pct_copy_bw", float("nan")),
                     "vs_vllm_eager": (peer / r.median_us) if peer else float("nan"),
                     "vs_our_eager": (ours / r.median_us) if ours else float("nan")})
    out = pd.DataFrame(rows)
    return out.sort_values(["model", "state_dtype", "method", "lo_dtype", "buffer_len", "batch"]).reset_index(drop=True)


PEER_COLS = ["model", "method", "backend", "batch", "buffer_len", "flush_period", "state_dtype", "lo_dtype",
             "median_us", "pct_copy_bw", "vs_vllm_eager", "vs_our_eager"]
MISMATCH_COLS = ["case_id", "bytes_model", "dram_bytes", "dram_vs_model"]


def sections(df: pd.DataFrame, manifest: dict, out_dir: Path, save):
    """(figures [(title, caption, png)], tables [(title, intro, DataFrame, columns)]) for write_report (report/__init__.py)."""
    figures, tables = [], []
    png = fig_roofline(df, manifest, out_dir, save)
    if png is not None:
        figures.append(("Roofline", "One point per kernel x method at the largest batch: modelled FLOPs / "
                        "modelled bytes vs modelled FLOPs / measured time, under the ceilings measured at the "
                        "start of this run. Decode kernels sit far left of the ridge: bandwidth is the game.", png))
    png = fig_traffic_measured(df, manifest, out_dir, save)
    if png is not None:
        figures.append(("Modelled vs measured memory traffic",
                        "Analytical bytes per step vs DRAM bytes read + written measured by Nsight Compute "
                        "(sweep --ncu; each kernel replayed with caches flushed).", png))
        mism = traffic_mismatches(df)
        tables.append((f"Traffic: measured differs from the model by > {TRAFFIC_TOLERANCE:.0%} ({len(mism)})",
                       "Cases whose measured DRAM bytes differ from the analytical model by more than 10 %.",
                       mism, MISMATCH_COLS))
    pt = peer_table(df)
    if len(pt) and (df["method"] == PEER).any():
        tables.append(("Against vLLM's eager kernel (same run)",
                       "vs_vllm_eager = vLLM 0.26.0 eager median / this median; vs_our_eager = our Triton eager "
                       "median / this median (same model, batch, state dtype); pct_copy_bw = modelled bytes / time "
                       "as % of the copy ceiling measured in this run.", pt, PEER_COLS))
    return figures, tables
