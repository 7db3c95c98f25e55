"""What the report's sections share: method colours and order, the row filters that pick one
configuration per model and method, number formats, and figure saving."""
from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
matplotlib.rcParams["svg.hashsalt"] = "replaybench"   # SVG ids from content: regenerating changes no byte
import matplotlib.pyplot as plt  # noqa: E402

from .. import methods  # noqa: E402


METHOD_ORDER = list(methods.METHODS)


REPLAY_FAMILY = methods.names(vs_eager=True)     # compared against eager in speedup figures


METHOD_COLORS = methods.colors()                 # one fixed colour per method (replaybench.methods)


BACKEND_STYLES = {"triton": ("-", "o"), "reference": ("--", "s"), "vllm": (":", "^")}


def file_slug(s: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", s)


def method_key(m: str) -> int:
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


def pick_one(rows, col: str, prefer=None, how: str = "first"):
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


def has_low_copy(method: str) -> bool:
    """A method whose state dtype is its own (a low copy): its rows are not picked by the model's
    reference state dtype."""
    m = methods.METHODS.get(method)
    return bool(m and m.lo)


def representative(rows, ref_state: str | None):
    """One configuration (state dtype, lo dtype, L, K, T) of one model x method."""
    r = rows
    if len(r) and not has_low_copy(r["method"].iloc[0]):
        r = pick_one(r, "state_dtype", prefer=ref_state)
    r = pick_one(r, "lo_dtype", prefer="bfloat16")
    r = pick_one(r, "buffer_len", how="max")
    if len(r):
        L = r["buffer_len"].max()
        r = pick_one(r, "flush_period", prefer=L, how="max")
    r = pick_one(r, "spec_window", how="max")
    return r


def config_label(r) -> str:
    row = r.iloc[0]
    parts = []
    if int(row["buffer_len"] or 0):
        parts.append(f"L{int(row['buffer_len'])} K{int(row['flush_period'])}")
    if int(row["spec_window"] or 0):
        parts.append(f"T{int(row['spec_window'])}")
    if row["lo_dtype"] not in (None, "none"):
        parts.append(f"lo {row['lo_dtype']}")
    return ", ".join(parts)


def reference_state(rows) -> str | None:
    e = rows[rows["method"] == "eager"]
    src = e if len(e) else rows
    vals = list(src["state_dtype"].dropna().unique())
    if not vals:
        return None
    return "float32" if "float32" in vals else src["state_dtype"].value_counts().index[0]


def fmt_bytes(b: float) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= div:
            return f"{b / div:.3g} {unit}"
    return f"{b:.0f} B"


def bytes_unit(maxv: float) -> tuple[str, float]:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if maxv >= div:
            return unit, div
    return "B", 1.0


def fmt_value(v: Any, digits: int = 4) -> str:
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


def save_figure(fig, out_dir: Path, stem: str) -> tuple[Path, Path]:
    png, svg = out_dir / f"{stem}.png", out_dir / f"{stem}.svg"
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(svg, bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return png, svg


def fmt_ratio(c: float) -> str:
    if c >= 10:
        return f"{c:.0f}×"
    if c >= 0.1:
        return f"{c:.2f}×"
    return f"{c:.2g}×"


def ratio_ticks(hi: float) -> list[float]:
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


def fmt_axis_number(v: float) -> str:
    if v >= 1e5:
        return f"{v:.0e}".replace("e+0", "e").replace("e+", "e")
    return f"{v:g}"


def plain_log_ticks(axis, values) -> None:
    """Plain numbers (not 4x10^1) on a log axis; label minor ticks when the range is short."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    fmt = FuncFormatter(lambda v, _: fmt_axis_number(v))
    axis.set_major_formatter(fmt)
    v = [float(x) for x in values if x and x > 0]
    if v and math.log10(max(v) / min(v)) < 1.5:
        axis.set_minor_locator(LogLocator(subs=(2.0, 3.0, 5.0)))
        axis.set_minor_formatter(fmt)
    else:
        axis.set_minor_formatter(NullFormatter())


def grid_shape(n: int, max_cols: int = 3) -> tuple[int, int]:
    cols = min(n, max_cols)
    return (n + cols - 1) // cols, cols


def empty_figure(title: str, msg: str):
    fig, ax = plt.subplots(figsize=(6.4, 2.4))
    ax.axis("off")
    ax.set_title(title)
    ax.text(0.5, 0.5, msg, ha="center", va="center", fontsize=11, color="#555555",
            transform=ax.transAxes)
    return fig


def device_suffix(manifest: dict, cpu: bool) -> str:
    name = (manifest.get("device") or {}).get("name") or manifest.get("device_name") or ""
    return f"CPU ({name}) - not GPU performance" if cpu else name
