"""Paper-style section: this run's ratios over vLLM's own kernels next to the ReplaySSM authors'
published reference points (replaybench/published.toml, from MODELS.md), from stored rows only.

    load_published    the published points (package data published.toml)
    paper_table       one row per (published point, study model, batch): the point's baseline
                      median (vLLM) / the method's median, same run, same model, batch and state
                      dtype (speculative: same window T and acceptance), and whether that is
                      below / within / above the published range; which side, if any, was
                      timed under an NVML throttle reason (marked † in the figure)
    fig_paper_style   left: standard decode at the points' batch, vllm-eager / eager, replay,
                      replay-dual per model; right: speculative decoding, vllm-spec / spec-replay,
                      spec-perdraft per model and batch; the published range as a band behind a
                      model's bars; panels without data in the run are left out

Only runs of the paper scenario (scenarios/paper.toml) get the section, and only with vLLM rows
to pair: other runs that happen to hold vLLM rows keep their reports as they are.  Our numbers
never come from published.toml: every ratio is computed here from the run's rows.
"""
from __future__ import annotations

import fnmatch
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..methods import names
from ..models import STUDY_MODELS, get_model
from .common import (METHOD_COLORS, config_label, device_suffix, ok_rows, pick_one, plt, reference_state,
                     representative, save_figure)
from .roofline import PEER_KEYS, baseline_medians

PUBLISHED_FILE = "published.toml"
PAPER_SCENARIOS = ("paper",)
# methods drawn per baseline (the published point's method among them); the order is the bar order
FIG_METHODS = {b: names(paper_baseline=b) for b in names(peer="vllm")}
BAND_LABEL = "published (authors, other GPU)"
PAPER_COLS = ["point", "family", "model", "batch", "method", "baseline", "baseline_us", "method_us",
              "ratio", "method_pct_copy", "ratio_at_copy", "published", "published GPU", "vs published", "throttled"]
THROTTLE_MARK = "†"     # on a bar whose ratio pairs a row timed under an NVML throttle reason
_BATCH_HATCH = ["", "///", "xx", ".."]


@dataclass(frozen=True)
class Point:
    id: str
    what: str
    family: str
    models: tuple[str, ...]
    method: str
    baseline: str
    spec_window: int
    batches: tuple[int, ...]
    low: float
    high: float
    gpu: str
    source: str

    def covers(self, model: str) -> bool:
        return any(fnmatch.fnmatchcase(model, pat) for pat in self.models)

    @property
    def range_text(self) -> str:
        return f"{self.low:g}–{self.high:g}×"

    def classify(self, ratio: float) -> str:
        if ratio < self.low:
            return "below"
        if ratio > self.high:
            return "above"
        return "within"


def load_published() -> list[Point]:
    """The published reference points, from the package's published.toml."""
    text = resources.files("replaybench").joinpath(PUBLISHED_FILE).read_text(encoding="utf-8")
    out = []
    for p in tomllib.loads(text)["point"]:
        out.append(Point(id=p["id"], what=p["what"], family=p["family"], models=tuple(p["models"]),
                         method=p["method"], baseline=p["baseline"], spec_window=int(p["spec_window"]),
                         batches=tuple(int(b) for b in p["batches"]), low=float(p["low"]),
                         high=float(p["high"]), gpu=p["gpu"], source=p["source"]))
    return out


def paper_ok_rows(df) -> pd.DataFrame:
    ok = ok_rows(df)
    ok["spec_window"] = ok["spec_window"].fillna(0).astype(int)
    ok["accept"] = ok["accept"].fillna("none").astype(str) if "accept" in ok else "none"
    return ok


def _keys(spec_window: int) -> tuple[str, ...]:
    return PEER_KEYS + (("spec_window", "accept") if spec_window else ())


def ratios(ok: pd.DataFrame, method: str, baseline: str, spec_window: int, batches, models) -> list[dict]:
    """baseline median / method median per (model, batch), paired through report.roofline's
    baseline_medians (same model, batch, state dtype; speculative: + T, acceptance); one
    configuration per model x method (common.representative, triton preferred)."""
    keys = _keys(spec_window)
    same_t = ok[ok["spec_window"] == spec_window]
    base = baseline_medians(same_t, baseline, keys)
    out = []
    for model, rep in method_rows(ok, same_t, method, models):
        for b, r in batch_rows(rep, batches):
            k = tuple(r[c] for c in keys)
            bu = base.get(k) if k in base.index else None
            if bu is None or not bu > 0:
                continue
            brow = _baseline_row(same_t, baseline, keys, k, bu)
            ratio = float(bu) / float(r["median_us"])
            pct = pct_copy(r)
            out.append({"model": model, "batch": int(b), "method": method, "baseline": baseline,
                        "state_dtype": r["state_dtype"], "config": config_label(rep.iloc[[0]]),
                        "baseline_us": float(bu), "method_us": float(r["median_us"]), "ratio": ratio,
                        "method_pct_copy": pct, "ratio_at_copy": ratio * 100.0 / pct if pct > 0 else float("nan"),
                        "throttled": "; ".join(n for n in (throttle_note(r, method),
                                                           throttle_note(brow, baseline)) if n)})
    return out


def method_rows(ok: pd.DataFrame, rows: pd.DataFrame, method: str, models):
    """(model, its rows of `method` at one configuration) for each of `models` with such rows:
    common.representative's configuration (the model's reference state dtype, a bf16 low copy,
    the longest buffer), triton preferred. ok: every ok row of the run (the reference state);
    rows: those to pick from."""
    rows = rows[(rows["method"] == method) & rows["model"].isin(list(models))]
    for model in [m for m in models if m in set(rows["model"])]:
        g = rows[rows["model"] == model]
        yield model, pick_one(representative(g, reference_state(ok[ok["model"] == model])), "backend", prefer="triton")


def batch_rows(rep: pd.DataFrame, batches):
    """(batch, its fastest row of `rep`) for each of `batches` that rep has rows at."""
    for b in batches:
        r = rep[rep["batch"] == b]
        if not r.empty:
            yield b, r.sort_values("median_us").iloc[0]


def pct_copy(row) -> float:
    """The row's modelled bytes / time as % of the run's copy ceiling (NaN when not measured).
    A ratio x 100 / this is what the method would reach at the copy ceiling with its modelled
    bytes: the bound its byte count sets against the baseline as measured."""
    v = row.get("pct_copy_bw")
    return float(v) if v is not None and not pd.isna(v) else float("nan")


def _baseline_row(rows: pd.DataFrame, baseline: str, keys, k: tuple, median: float):
    """The baseline's row whose median baseline_medians chose for key k (None if not found)."""
    b = rows[(rows["method"] == baseline) & (rows["median_us"] == median)]
    for r in b.to_dict(orient="records"):
        if tuple(r[c] for c in keys) == k:
            return r
    return None


def throttle_note(row, method: str) -> str:
    """'method: reasons, power-capped, SM clock MHz' when the row's timing saw an NVML throttle
    reason (replaybench.timing: throttled batches are discarded, but a power-capped row is timed
    at the capped clock), else ''."""
    if row is None:
        return ""
    why = row.get("throttle")
    if why is None or pd.isna(why) or not str(why):
        return ""
    capped = bool(row.get("power_capped")) and not pd.isna(row.get("power_capped"))
    clock = row.get("sm_clock_mhz")
    mhz = f", SM {float(clock):.0f} MHz" if clock is not None and not pd.isna(clock) else ""
    return f"{method}: {why}{' (power-capped)' if capped else ''}{mhz}"


def _study_models(ok: pd.DataFrame) -> list[str]:
    present = set(ok["model"])
    return [m for m in STUDY_MODELS if m in present]


def paper_table(df, points: list[Point] | None = None) -> pd.DataFrame:
    """One row per (published point, study model in the run, batch) with a ratio in this run."""
    points = load_published() if points is None else points
    if not len(df):
        return pd.DataFrame(columns=PAPER_COLS)
    ok = paper_ok_rows(df)
    out = []
    for p in points:
        models = [m for m in _study_models(ok) if p.covers(m)]
        for r in ratios(ok, p.method, p.baseline, p.spec_window, p.batches, models):
            out.append({"point": p.what, "point_id": p.id, "family": p.family, **r,
                        "low": p.low, "high": p.high, "published": p.range_text, "published GPU": p.gpu,
                        "vs published": p.classify(r["ratio"])})
    return pd.DataFrame(out, columns=PAPER_COLS + ["point_id", "low", "high", "state_dtype", "config"])


def _model_label(name: str) -> str:
    try:
        fam = get_model(name).family
    except (KeyError, ValueError):
        fam = ""
    if fam and name.startswith(fam + "-"):
        return f"{fam}\n{name[len(fam) + 1:]}"
    return name


def _panels(ok: pd.DataFrame, points: list[Point]) -> list[dict]:
    """One panel per baseline of the points (published order) that has bars in the run."""
    panels = []
    for baseline in dict.fromkeys(p.baseline for p in points):
        pts = [p for p in points if p.baseline == baseline]
        T = pts[0].spec_window
        batches = sorted({b for p in pts for b in p.batches})
        models = [m for m in _study_models(ok) if any(p.covers(m) for p in pts)]
        methods = FIG_METHODS.get(baseline, tuple(dict.fromkeys(p.method for p in pts)))
        bars = [r for m in methods for r in ratios(ok, m, baseline, T, batches, models)]
        if bars:
            panels.append({"baseline": baseline, "points": pts, "spec_window": T, "batches": batches,
                           "methods": [m for m in methods if any(r["method"] == m for r in bars)],
                           "models": [m for m in models if any(r["model"] == m for r in bars)], "bars": bars})
    return panels


def _draw_panel(ax, panel: dict) -> None:
    models, methods, batches = panel["models"], panel["methods"], panel["batches"]
    slots = [(m, b) for m in methods for b in batches]          # bar order inside a model's group
    width = min(0.8 / len(slots), 0.28)
    bars = {(r["model"], r["method"], r["batch"]): r["ratio"] for r in panel["bars"]}
    marked = {(r["model"], r["method"], r["batch"]) for r in panel["bars"] if r.get("throttled")}
    top = 1.0
    minor_x, minor_lab = [], []
    for i, model in enumerate(models):
        offs = [(j - (len(slots) - 1) / 2) * width for j in range(len(slots))]
        lo_x, hi_x = i + offs[0] - width * 0.75, i + offs[-1] + width * 0.75
        pt = next((p for p in panel["points"] if p.covers(model)), None)
        if pt is not None:
            ax.fill_between([lo_x, hi_x], pt.low, pt.high, color="#f2c14e", alpha=0.35, lw=0, zorder=0)
            for y in (pt.low, pt.high):
                ax.plot([lo_x, hi_x], [y, y], color="#c8961e", lw=0.8, zorder=0.5)
            top = max(top, pt.high)
        for (method, batch), dx in zip(slots, offs):
            v = bars.get((model, method, batch))
            if len(batches) > 1:
                minor_x.append(i + dx)
                minor_lab.append(str(batch))
            if v is None:
                continue
            ax.bar(i + dx, v, width * 0.92, color=METHOD_COLORS.get(method, "k"), edgecolor="white",
                   hatch=_BATCH_HATCH[batches.index(batch) % len(_BATCH_HATCH)], lw=0.5, zorder=2)
            mark = THROTTLE_MARK if (model, method, batch) in marked else ""
            ax.text(i + dx, v + 0.02, f"{v:.2f}{mark}", ha="center", va="bottom", fontsize=7, zorder=3,
                    bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.3, "alpha": 0.8})
            top = max(top, v)
    ax.axhline(1.0, color="0.25", ls="--", lw=1, zorder=1)
    ax.set_xlim(-0.6, len(models) - 0.4)
    ax.set_ylim(0, top * 1.14)
    ax.set_xticks(range(len(models)), [_model_label(m) for m in models], fontsize=8)
    if minor_x:
        ax.set_xticks(minor_x, minor_lab, minor=True, fontsize=6.5)
        ax.tick_params(axis="x", which="major", pad=14, length=0)
        ax.tick_params(axis="x", which="minor", length=2)
    ax.grid(True, axis="y", alpha=0.3, zorder=0)
    ax.set_axisbelow(True)
    base = panel["baseline"]
    bt = " / ".join(str(b) for b in batches)
    if panel["spec_window"]:
        ax.set_title(f"Speculative decoding, T = {panel['spec_window']}, batch {bt}\n"
                     f"{base} median ÷ method median", fontsize=10)
    else:
        ax.set_title(f"Standard decode, batch {bt}\n{base} median ÷ method median", fontsize=10)
    ax.set_ylabel(f"{base} / method  [×]  (> 1: faster than vLLM)", fontsize=9)


def fig_paper_style(df, manifest: dict, out_dir: Path, cpu: bool = False,
                    points: list[Point] | None = None) -> Path | None:
    """The two-panel figure (None when the run has no pair with a vLLM row)."""
    points = load_published() if points is None else points
    if not len(df):
        return None
    panels = _panels(paper_ok_rows(df), points)
    if not panels:
        return None
    widths = [max(2.0, len(p["models"]) * (0.6 + 0.35 * len(p["methods"]) * len(p["batches"])))
              for p in panels]
    fig, axes = plt.subplots(1, len(panels), figsize=(sum(widths) + 1.2 * len(panels), 5.4),
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    for ax, panel in zip(axes[0], panels):
        _draw_panel(ax, panel)
    handles = []
    for panel in panels:
        for m in panel["methods"]:
            lab = f"{panel['baseline']} ÷ {m}" + (" (our baseline)" if m == "eager" else "")
            handles.append(Patch(facecolor=METHOD_COLORS.get(m, "k"), label=lab))
    multi = [b for p in panels if len(p["batches"]) > 1 for b in p["batches"]]
    for j, b in enumerate(dict.fromkeys(multi)):
        if j:
            handles.append(Patch(facecolor="white", edgecolor="0.3", hatch=_BATCH_HATCH[j % len(_BATCH_HATCH)],
                                 label=f"batch {b} (hatched)"))
    handles.append(Patch(facecolor="#f2c14e", alpha=0.5, edgecolor="#c8961e", label=BAND_LABEL))
    handles.append(Line2D([], [], color="0.25", ls="--", lw=1, label="1.0 = vLLM's kernel"))
    ncol = min(4, len(handles))
    fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 0.0))
    fig.suptitle("Against vLLM's own kernels (this run) vs the ReplaySSM authors' published points\n"
                 + device_suffix(manifest, cpu), fontsize=11)
    fig.tight_layout(rect=(0, 0.01 + 0.035 * -(-len(handles) // ncol), 1, 1))
    png, _ = save_figure(fig, out_dir, "paper_style")
    return png


def _quotes(points: list[Point]) -> str:
    return "; ".join(f"'{s}'" for s in dict.fromkeys(p.source for p in points))


def sections(df, manifest: dict, out_dir: Path, cpu: bool = False):
    """(figures [(title, caption, png)], tables [(title, intro, DataFrame, columns)]) for write_report (report/__init__.py):
    empty unless the run is of the paper scenario and has rows to pair with vLLM's."""
    scen = (manifest.get("scenario") or {}).get("name")
    if scen not in PAPER_SCENARIOS or not len(df):
        return [], []
    points = load_published()
    png = fig_paper_style(df, manifest, out_dir, cpu, points)
    if png is None:
        return [], []
    dev = device_suffix(manifest, cpu)
    gpus = "; ".join(dict.fromkeys(p.gpu for p in points))
    cap = ("Bars: vLLM's median / our method's median (> 1: ours faster), medians measured in this run on "
           f"the same GPU ({dev}), paired at the same model, batch and state dtype (speculative: same window "
           "T and acceptance). Left: standard decode, vllm-eager over our eager (our baseline against vLLM's), "
           "replay and replay-dual; right: speculative decoding, vllm-spec over spec-replay and, for "
           "reference, spec-perdraft. Shaded band behind a model's bars: the ReplaySSM authors' published "
           "range for its family, an anchor and not a target: the published ratios are over the authors' own "
           f"vLLM baseline, on their GPU (published GPU: {gpus}), which may differ from ours. Source "
           f"(MODELS.md): {_quotes(points)}. {THROTTLE_MARK} after a value: one of the two medians was "
           "timed under an NVML throttle reason (the table's 'throttled' column says which and at what "
           "clock).")
    table = paper_table(df, points)
    intro = ("One row per published point x study model x batch: ratio = baseline median / method median "
             "from this run's rows (paired as in the figure); published = the authors' range (their baseline, "
             "their GPU); method_pct_copy = the method's modelled bytes / time as % of the copy ceiling "
             "measured in this run; ratio_at_copy = ratio x 100 / method_pct_copy, the ratio the method would "
             "reach moving its modelled bytes at that ceiling against the baseline as measured (the bound its "
             "byte count sets); vs published = ours below / within / above it; throttled = which side's timing "
             "saw an NVML throttle reason (a power-capped row is timed at the capped clock: its ratio is "
             "that GPU's, not the kernel's at full clock). Source (MODELS.md): "
             f"{_quotes(points)}.")
    return ([("Paper-style: against vLLM's kernels vs the published reference points", cap, png)],
            [("Paper reference points vs this run", intro, table, PAPER_COLS)])
