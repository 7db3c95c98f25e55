"""SSM-state memory per request and the largest batch whose SSM state fits a budget.

Per SSM layer and request, for a speculation window of T draft tokens:

    eager              1 state                              (no speculation)
    spec-perdraft      1 + T states                         vLLM's speculative path: one slot per
                                                            draft position plus the accepted one
    spec-replay        1 checkpoint + buffer of L entries   ReplaySSM, capacity L >= K + T
    spec-replay-dual   fp32 checkpoint + low copy + buffer  ReplaySSM with dual precision

summed over all SSM layers of the model (replaybench.models). A buffer entry is what the kernels
store (replaybench.traffic.LayerBytes.row): Mamba-2 x (activation dtype), the group's B, dt
(fp32); GDN u (fp32), k, g (fp32), plus raw v and beta in dual mode. The budget counts SSM state
only: model weights, the attention layers' KV cache, the convolution state, activations and the
per-request cursors / slot tables are excluded. GB = 1e9 bytes, MiB = 2^20 bytes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from .methods import METHODS as REGISTRY, names
from .models import STUDY_MODELS, HybridModel, get_model
from .traffic import layer_bytes_for

GB = 1e9
MiB = float(1 << 20)
# the table's default methods: those with a memory label (replaybench.methods), the baselines'
# layouts first (no speculation, per-draft slots), then ReplaySSM's
METHODS = tuple(m.name for m in sorted((m for m in REGISTRY.values() if m.memory_label),
                                       key=lambda m: (m.spec, m.traffic != "spec-perdraft", m.lo)))
LABELS = {m: REGISTRY[m].memory_label for m in METHODS}
EXCLUDED = ("SSM state only: model weights, KV cache of the attention layers, conv state, activations "
            "and per-request cursors / slot tables are excluded. GB = 1e9 bytes, MiB = 2^20 bytes.")


@dataclass(frozen=True)
class MemoryRow:
    model: str
    op: str
    method: str
    layout: str                 # what one request holds per layer
    state_per_layer: float      # bytes of state copies per layer and request
    buffer_per_layer: float     # bytes of input buffer per layer and request
    n_ssm_layers: int
    bytes_per_request: float    # all SSM layers
    max_batch: int              # floor(budget / bytes_per_request)
    vs_perdraft: float          # per-draft bytes per request / this method's

    @property
    def per_layer(self) -> float:
        return self.state_per_layer + self.buffer_per_layer


def layer_memory(model: HybridModel, method: str, spec_window: int = 4, buffer_len: int = 20,
                 state_dtype: str = "float32", lo_dtype: str = "bfloat16", act_bytes: int = 2
                 ) -> tuple[float, float, str]:
    """(state bytes, buffer bytes, layout) of one SSM layer for one request."""
    T, L = int(spec_window), int(buffer_len)
    op, dims = model.op, model.ssm
    m = REGISTRY.get(method)
    if m is None or m.precision == "shared-low":
        allowed = names(precision=("single", "dual"))
        raise ValueError(f"unknown method {method!r}; allowed: {', '.join(allowed)}")
    if m.traffic == "eager":
        return layer_bytes_for(op, dims, method, state_dtype, "none", act_bytes).state_hi, 0.0, f"1 state ({state_dtype})"
    if m.traffic == "spec-perdraft":
        s = layer_bytes_for(op, dims, method, state_dtype, "none", act_bytes).state_hi
        return (1 + T) * s, 0.0, f"1 + T = {1 + T} states ({state_dtype})"
    if m.precision == "single":
        lb = layer_bytes_for(op, dims, method, state_dtype, "none", act_bytes)
        return lb.state_hi, L * lb.row, f"checkpoint ({state_dtype}) + {L}-entry buffer"
    lb = layer_bytes_for(op, dims, method, "float32", lo_dtype, act_bytes)
    return lb.state_hi + lb.state_lo, L * lb.row, f"float32 + {lo_dtype} checkpoints + {L}-entry buffer"


def bytes_per_request(model: HybridModel | str, method: str, **kw) -> float:
    """SSM-state bytes one request holds over all SSM layers (kw: see layer_memory)."""
    m = get_model(model) if isinstance(model, str) else model
    s, b, _ = layer_memory(m, method, **kw)
    return m.n_ssm_layers * (s + b)


def check_params(spec_window: int, buffer_len: int, flush_period: int, budget_gb: float) -> None:
    if not 1 <= spec_window <= 64:
        raise ValueError(f"spec window {spec_window}: allowed 1..64")
    if flush_period < 1:
        raise ValueError(f"flush period {flush_period}: allowed >= 1")
    if buffer_len < flush_period + spec_window:
        raise ValueError(f"buffer length {buffer_len} < flush period {flush_period} + spec window {spec_window}: "
                         f"a full draft window must fit (L >= K + T)")
    if not budget_gb > 0:
        raise ValueError(f"budget {budget_gb} GB: allowed > 0")


def memory_table(models=None, budget_gb: float = 80.0, spec_window: int = 4, buffer_len: int = 20,
                 flush_period: int = 16, state_dtype: str = "float32", lo_dtype: str = "bfloat16",
                 methods=METHODS) -> list[MemoryRow]:
    """One row per model and method (models default: the four study models)."""
    check_params(spec_window, buffer_len, flush_period, budget_gb)
    rows = []
    for name in (models or STUDY_MODELS):
        m = get_model(name)
        per = {}
        for meth in methods:
            s, b, layout = layer_memory(m, meth, spec_window, buffer_len, state_dtype, lo_dtype)
            per[meth] = (s, b, layout, m.n_ssm_layers * (s + b))
        pd_bytes = m.n_ssm_layers * layer_memory(m, "spec-perdraft", spec_window, buffer_len, state_dtype)[0]
        for meth, (s, b, layout, req) in per.items():
            rows.append(MemoryRow(model=m.name, op=m.op, method=meth, layout=layout, state_per_layer=s,
                                  buffer_per_layer=b, n_ssm_layers=m.n_ssm_layers, bytes_per_request=req,
                                  max_batch=int(math.floor(budget_gb * GB / req)), vs_perdraft=pd_bytes / req))
    return rows


def _mib(b: float) -> str:
    return f"{b / MiB:.2f}"


def _header(budget_gb, spec_window, buffer_len, flush_period) -> str:
    return (f"SSM-state memory per request and max concurrency: spec window T = {spec_window}, "
            f"buffer L = {buffer_len} (flush period K = {flush_period}), budget {budget_gb:g} GB")


def format_table(rows: list[MemoryRow], budget_gb: float = 80.0, spec_window: int = 4, buffer_len: int = 20,
                 flush_period: int = 16) -> str:
    """Fixed-width text table (replaybench memory)."""
    head = ["model", "method", "per request holds (each SSM layer)", "MiB/layer", "SSM layers", "MiB/request",
            f"max batch @ {budget_gb:g} GB", "vs per-draft"]
    body = [[r.model, r.method, r.layout, _mib(r.per_layer), str(r.n_ssm_layers), _mib(r.bytes_per_request),
             str(r.max_batch), f"{r.vs_perdraft:.2f}x"] for r in rows]
    w = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    lines = [_header(budget_gb, spec_window, buffer_len, flush_period), EXCLUDED, "",
             "  ".join(h.ljust(x) for h, x in zip(head, w)), "  ".join("-" * x for x in w)]
    lines += ["  ".join(c.ljust(x) for c, x in zip(b, w)) for b in body]
    return "\n".join(lines)


def markdown_table(rows: list[MemoryRow], budget_gb: float = 80.0) -> str:
    head = ["model", "method", "per request holds (each SSM layer)", "MiB / layer", "SSM layers", "MiB / request",
            f"max batch ({budget_gb:g} GB)", "vs per-draft"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        out.append(f"| {r.model} | {r.method} | {r.layout} | {_mib(r.per_layer)} | {r.n_ssm_layers} | "
                   f"{_mib(r.bytes_per_request)} | {r.max_batch} | {r.vs_perdraft:.2f}× |")
    return "\n".join(out) + "\n"


def fig_memory(rows: list[MemoryRow], out_dir: Path, budget_gb: float = 80.0, stem: str = "memory"):
    """Bars: MiB of SSM state per request, per model and method, each annotated with the max
    batch under the budget. Writes <stem>.png and .svg; returns the png path."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r.model for r in rows))
    methods = list(dict.fromkeys(r.method for r in rows))
    colors = {m: REGISTRY[m].color for m in methods if m in REGISTRY}
    fig, ax = plt.subplots(figsize=(1.6 + 1.9 * len(models), 4.2))
    width = 0.8 / max(len(methods), 1)
    top = max(r.bytes_per_request for r in rows) / MiB
    for j, meth in enumerate(methods):
        for i, model in enumerate(models):
            r = next((r for r in rows if r.model == model and r.method == meth), None)
            if r is None:
                continue
            x = i + (j - (len(methods) - 1) / 2) * width
            v = r.bytes_per_request / MiB
            ax.bar(x, v, width, color=colors.get(meth, "#8c564b"), edgecolor="black", linewidth=0.4,
                   label=LABELS.get(meth, meth) if i == 0 else None)
            ax.annotate(f"{r.max_batch}", (x, v), ha="center", va="bottom", fontsize=7, rotation=90,
                        xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(models)))
    ax.set_xticklabels(models, fontsize=8)
    ax.set_ylabel("SSM state per request [MiB]")
    ax.set_ylim(0, top * 1.25)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8, frameon=False)
    ax.set_title(f"SSM-state memory per request; numbers on bars: max batch within {budget_gb:g} GB "
                 f"(SSM state only)", fontsize=9)
    fig.tight_layout()
    out_dir = Path(out_dir)
    png = out_dir / f"{stem}.png"
    fig.savefig(png, dpi=150, bbox_inches="tight")
    fig.savefig(out_dir / f"{stem}.svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    return png


def report_section(models, out_dir: Path, budget_gb: float = 80.0, spec_window: int = 4,
                   buffer_len: int | None = None, flush_period: int = 16) -> tuple[str, str, Path]:
    """(markdown, caption, figure png) of the memory section for a report's models
    (buffer_len defaults to flush_period + spec_window)."""
    L = flush_period + spec_window if buffer_len is None else buffer_len
    L = max(L, flush_period + spec_window)
    rows = memory_table(models, budget_gb, spec_window, L, flush_period)
    png = fig_memory(rows, out_dir, budget_gb)
    md = _header(budget_gb, spec_window, L, flush_period) + ". " + EXCLUDED + "\n\n" + markdown_table(rows, budget_gb)
    caption = (f"SSM-state bytes per request (all SSM layers) at T = {spec_window}, L = {L}; bars annotated "
               f"with the largest batch whose SSM state fits {budget_gb:g} GB. Analytical, not measured.")
    return md, caption, png
