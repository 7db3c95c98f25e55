"""Reports from stored rows only: ``reports/<run-id>/`` with report.md, report.html
(self-contained, PNGs inlined as base64) and figures as PNG + SVG. ``replaybench report RUN``.

The report is a package of sections, each a module with its figures and tables; they share
report/common.py and never import each other's internals:

  overview   time per decode step vs batch, modelled bytes per step, throttled rows
  speedup    replay-family speedup vs eager (table; heat map per model over buffer_len x flush_period,
             none for a 1x1 grid of a model the model-size figure shows)
  size       scaled variants (<model>@d<depth>w<width>): speedup vs eager vs state size
  spec       speculative decoding and SSM-state memory
  roofline   the roofline, modelled vs measured traffic, against vLLM's eager kernel
  paper      paper-scenario runs: ratios over vLLM's kernels next to the published points (published.toml)
  goals      the project's targets held against the run (goals.toml)
  spread     with --compare OTHER: run-to-run spread against a repeat
  drift      drift-runner runs: numerical drift of the state precisions against fp64

Speedups are computed here from rows of the same run; they are never stored.
A report never runs a kernel.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from ..schema import TABLE_COLUMNS  # the "All rows" table's columns
from ..store import RunStore
from . import drift, goals, paper, roofline, size, spec, spread
from .common import METHOD_COLORS, device_suffix, fmt_value, is_cpu_run, method_key, save_figure
from .overview import fig_bytes_per_step, fig_time_vs_batch, throttle_table
from .speedup import fig_speedup_heatmaps, route_label, speedup_table

__all__ = ["write_report", "speedup_table", "route_label", "header_lines", "row_sessions", "METHOD_COLORS",
           "TABLE_COLUMNS"]

FIG_PATTERNS = ("time_vs_batch.*", "bytes_per_step.*", "speedup_*.png", "speedup_*.svg", "spec_speedup.*",
                "memory.*", "roofline.*", "traffic_measured.*", "spread.*", "model_size.*",
                "paper_style.*", "drift-*.png")


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
                      f"copy {fmt_value(ceil.get('copy_gbps'))} GB/s (torch.add out=), "
                      f"read {fmt_value(ceil.get('read_gbps'))} GB/s (torch.sum), "
                      f"matmul {fmt_value(ceil.get('matmul_tflops'))} TFLOP/s ({ceil.get('matmul_dtype')})"))
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
    if len(df) and "noisy" in df.columns:
        noisy = df[(df["status"] == "ok") & df["noisy"].fillna(False).astype(bool)]
        if len(noisy):
            items.append(("noisy rows", f"{len(noisy)} ok row(s) with < 3 samples or IQR / median > 10 % "
                                        f"(column noisy): read their medians with care"))
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
        lines.append("| " + " | ".join(_md_escape(fmt_value(r.get(c))) for c in cols) + " |")
    return "\n".join(lines) + "\n"


def _html_table(df, cols: list[str]) -> str:
    if df.empty:
        return "<p><em>(none)</em></p>"
    out = ["<table><thead><tr>" + "".join(f"<th>{html.escape(c)}</th>" for c in cols) + "</tr></thead><tbody>"]
    for r in df.to_dict(orient="records"):
        cls = f' class="{html.escape(str(r.get("status")))}"' if "status" in cols else ""
        out.append(f"<tr{cls}>" + "".join(f"<td>{html.escape(fmt_value(r.get(c)))}</td>" for c in cols) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def _html_code(text: str) -> str:
    """Escape text for HTML, rendering Markdown `code` spans as <code>."""
    parts = str(text).split("`")
    return "".join(f"<code>{html.escape(p)}</code>" if i % 2 else html.escape(p) for i, p in enumerate(parts))


def _sorted_rows(df):
    d = df.copy()
    d["_m"] = d["method"].map(method_key)
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
        ostore, omanifest, odf = spread.open_other(compare, results_dir, store, manifest, df)
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
    extra_tables: list = []
    sp = speedup_table(df)
    timed = bool(len(df)) and "median_us" in df.columns and df["median_us"].notna().any()
    if timed:   # a drift run has no timings: no timing, traffic, speedup or roofline sections
        png, _ = fig_time_vs_batch(df, manifest, out_dir, cpu)
        figures.append(("Time per decode step vs batch",
                        "Median time per decode step of one SSM layer for the whole batch; error bars "
                        "span the IQR. One line per method and backend at one configuration per method "
                        "(named in the legend).", png))
        png, _ = fig_bytes_per_step(df, manifest, out_dir)
        figures.append(("Modelled bytes per decode step",
                        "Bytes read + written per decode step from the analytical traffic model "
                        "(bytes_model column), averaged over a flush period, at the largest batch.", png))
        cross = ("; * = the eager and method medians come from different sessions of this resumed run "
                 "(see 'sessions' above: possibly another GPU or commit)"
                 if len(sp) and sp["cross_session"].any() else "")
        size_t = size.size_table(df, sp)
        for model, png, _ in fig_speedup_heatmaps(df, manifest, out_dir, cpu, sp, covered=set(size_t["model"])):
            figures.append((f"Speedup vs eager: {model}",
                            "Eager median / method median, same run, same model, batch, state dtype "
                            f"and backend, at the largest batch; n/a = not measured or invalid (K > L){cross}.",
                            png))
        size_figures, size_tables = size.sections(df, manifest, out_dir, cpu, size_t)
        figures += size_figures
        extra_figures, extra_tables = spec.sections(df, out_dir, cpu)
        figures += extra_figures
        roof_figures, roof_tables = roofline.sections(df, manifest, out_dir, save_figure)
        figures += roof_figures
        paper_figures, paper_tables = paper.sections(df, manifest, out_dir, cpu)
        figures += paper_figures
        extra_tables = size_tables + roof_tables + paper_tables + goals.sections(df) + extra_tables
    thr = throttle_table(df)
    if len(thr):
        extra_tables.append(("Throttled measurements",
                             "Rows whose timing saw NVML throttle reasons (replaybench.timing): throttled "
                             "batches are discarded and counted; power_capped = every batch ran under the "
                             "power cap alone, so the median is the kernel's power-capped rate.",
                             thr, list(thr.columns)))
    spread_section = None
    if other is not None:
        oid, omanifest, odf = other
        spread_section = spread.section(run_id, manifest, df, oid, omanifest, odf, out_dir, save_figure, METHOD_COLORS,
                         device_suffix(manifest, cpu), spread.command(run_id, oid, results_dir, reports_dir))

    rows_sorted = _sorted_rows(df) if len(df) else df
    errors = rows_sorted[rows_sorted["status"] == "error"] if len(df) else df
    header = header_lines(manifest, df, cpu)
    dev_name = (manifest.get("device") or {}).get("name", "")
    banner = CPU_BANNER.format(name=dev_name) if cpu else None
    sp_cols = ["model", "method", "backend", "batch", "buffer_len", "flush_period", "spec_window",
               "state_dtype", "lo_dtype", "eager_us", "median_us", "speedup"]
    if len(sp) and (sp["route"] != "").any():   # rows that record the replay step's route
        sp_cols.append("route")
    title = f"replaybench report: {run_id}" + (" [CPU run]" if cpu else "")

    # markdown
    md = [f"# {title}", ""]
    if banner:
        md += [f"> **{banner}**", ""]
    md += [f"- **{k}**: {_md_escape(v)}" for k, v in header] + [""]
    for t, cap, p in figures:
        md += [f"## {t}", "", f"![{t}]({p.name})", "", f"_{cap}_ (vector: [{p.stem}.svg]({p.stem}.svg))", ""]
    if spread_section is not None:
        p = spread_section.png
        md += [f"## {spread_section.title}", "", f"![{spread_section.title}]({p.name})", "",
               f"_{spread_section.caption}_ (vector: [{p.stem}.svg]({p.stem}.svg); every case: "
               f"[{spread_section.csv.name}]({spread_section.csv.name}))", "", spread_section.intro, "",
               f"Reproduce: `{spread_section.command}`", "", _md_table(spread_section.summary, list(spread_section.summary.columns)),
               f"Worst {len(spread_section.worst)} case(s):", "", _md_table(spread_section.worst, list(spread_section.worst.columns))]
    if timed:
        md += ["## Speedups vs eager (same run)", "", _md_table(sp, sp_cols)]
    for t, intro, tdf, cols in extra_tables:
        md += [f"## {t}", "", intro, "", _md_table(tdf, cols)]
    drift_md = drift.drift_section(df, out_dir) if len(df) and "drift_series" in df.columns else ""
    if drift_md:   # drift-runner rows: their own section (tables and one figure per model)
        md += [drift_md, ""]
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
    if spread_section is not None:
        b64 = base64.b64encode(spread_section.png.read_bytes()).decode("ascii")
        t = html.escape(spread_section.title)
        h.append(f"<h2>{t}</h2><figure><img alt='{t}' src='data:image/png;base64,{b64}'>"
                 f"<figcaption>{html.escape(spread_section.caption)}</figcaption></figure>"
                 f"<p>{_html_code(spread_section.intro)}</p><p>Reproduce: <code>{html.escape(spread_section.command)}</code></p>"
                 + _html_table(spread_section.summary, list(spread_section.summary.columns))
                 + f"<p>Worst {len(spread_section.worst)} case(s):</p>"
                 + _html_table(spread_section.worst, list(spread_section.worst.columns)))
    if timed:
        h.append("<h2>Speedups vs eager (same run)</h2>" + _html_table(sp, sp_cols))
    for t, intro, tdf, cols in extra_tables:
        h.append(f"<h2>{html.escape(t)}</h2><p>{html.escape(intro)}</p>" + _html_table(tdf, cols))
    if drift_md:
        long = drift.drift_long(df)
        dt, dg = drift.drift_table(long), drift.drift_goals(long)
        h.append("<h2>Numerical drift vs fp64</h2>" + _html_table(dt, list(dt.columns))
                 + "<h3>Goal: dual flat, and &gt;= 5x below shared-low at 4,096 steps</h3>"
                 + _html_table(dg, list(dg.columns)))
        for p in sorted(out_dir.glob("drift-*.png")):
            b64 = base64.b64encode(p.read_bytes()).decode("ascii")
            h.append(f"<figure><img alt='{html.escape(p.stem)}' src='data:image/png;base64,{b64}'></figure>")
    h.append(f"<h2>Errors ({len(errors)})</h2>" + _html_table(errors, ["case_id", "error"]))
    h.append(f"<h2>All rows ({len(df)})</h2>" + _html_table(rows_sorted, TABLE_COLUMNS))
    h.append("</body></html>")
    (out_dir / "report.html").write_text("\n".join(h), encoding="utf-8")
    return out_dir
