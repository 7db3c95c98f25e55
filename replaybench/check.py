"""Performance-regression gate between two runs: ``replaybench check BASE NEW``.

Rows with status 'ok' in both runs are matched by (case_id, method, backend). Each matched
case gets a verdict FASTER / SLOWER / SAME / AMBIGUOUS from its stored samples
(replaybench.stats: median ratio NEW/BASE, the Mann-Whitney / Hodges-Lehmann interval of the
ratio at level 1 - alpha, the relative threshold). Rows without per-sample times (runs made
before rows kept ``samples_us``) are compared from their median, IQR and sample count.

Thresholds: ``--threshold`` (else the scenario's ``[check] threshold``, else 5 %), and per case
the last matching pattern of the scenario's ``[check.cases]`` table (``"*/b1/*" = 0.04``). The
scenario is the one stored in BASE's manifest, or ``--scenario FILE``.

Clocks: a side whose samples ran at the board's power cap (``power_capped``) or that lost
batches to a throttle reason (``throttle``) is named in the ``clock`` column; a SLOWER case
with such a side is reported but does not fail the gate unless ``strict``.

The gate fails (exit 1) on a SLOWER case with clean clocks, or on a case ok in BASE that is an
error in NEW. Exit 2: bad input (missing run, devices differ without
--allow-device-mismatch, a bad [check] table).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from . import stats as S
from .store import RunStore, StoreError

KEY = ["case_id", "method", "backend"]
MAX_MARKDOWN_ROWS = 150        # a pull-request comment holds at most 65536 characters


@dataclass
class CheckResult:
    exit_code: int
    regressions: int                # SLOWER cases that fail the gate
    improvements: int               # FASTER cases
    compared: int
    new_errors: int
    missing: int
    geomean_ratio: float | None
    table: object = None            # DataFrame of the comparison
    counts: dict = field(default_factory=dict)     # verdict -> cases
    clock_excused: int = 0          # SLOWER cases not failing because of a capped/throttled side
    errors: list = field(default_factory=list)     # (case_id, error) of NEW errors
    only_new: int = 0


def device_of(manifest: dict, df) -> str:
    """The device a run ran on: the manifest's device name, else the rows' device column."""
    dev = manifest.get("device") or {}
    if dev.get("name"):
        return str(dev["name"])
    vals = sorted(set(df["device"].dropna().astype(str))) if len(df) else []
    return ",".join(vals) or "unknown"


def _col(df, name, default=None):
    return df[name] if name in df else [default] * len(df)


def _num(v) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return float("nan")
    return f


def compare(base_df, new_df, threshold: float = S.DEFAULT_THRESHOLD, alpha: float = S.DEFAULT_ALPHA,
            config: S.CheckConfig | None = None, strict: bool = False):
    """Comparison table of the cases ok in both runs: base_us, new_us, ratio (medians), lo/hi
    (interval of the ratio), p, test, threshold, verdict, clock, capped (power cap only:
    base / new / both), fails (this case fails the gate)."""
    import pandas as pd
    config = config or S.CheckConfig()
    b = base_df[base_df["status"] == "ok"]
    n = new_df[new_df["status"] == "ok"]
    keep = ["median_us", "iqr_us", "samples", "samples_us", "power_capped", "throttle"]

    def side(d, tag):
        out = pd.DataFrame({k: list(_col(d, k)) for k in KEY + ["model", "batch"] + keep})
        return out.rename(columns={k: f"{tag}_{k}" for k in keep})

    m = side(b, "b").merge(side(n, "n").drop(columns=["model", "batch"]), on=KEY, how="inner")
    rows = []
    for r in m.itertuples(index=False):
        rd = r._asdict()
        cid = rd["case_id"]
        thr = config.threshold_for(cid, threshold)
        bs, ns = S.parse_samples(rd["b_samples_us"]), S.parse_samples(rd["n_samples_us"])
        bmed, nmed = _num(rd["b_median_us"]), _num(rd["n_median_us"])
        if bs and ns:
            c = S.compare_samples(bs, ns, thr, alpha)
        elif bmed > 0 and nmed > 0:
            c = S.compare_quartiles(bmed, _num(rd["b_iqr_us"]), _num(rd["b_samples"]) if not math.isnan(
                _num(rd["b_samples"])) else 1, nmed, _num(rd["n_iqr_us"]), _num(rd["n_samples"]) if not
                math.isnan(_num(rd["n_samples"])) else 1, thr, alpha)
        else:
            c = S.Comparison(float("nan"), float("nan"), float("nan"), float("nan"), S.AMBIGUOUS, thr, alpha,
                             "none")
        bcl = S.clock_state(rd["b_power_capped"], rd["b_throttle"])
        ncl = S.clock_state(rd["n_power_capped"], rd["n_throttle"])
        bcap, ncap = bcl == "capped", ncl == "capped"
        clock = S.clock_flag(bcl, ncl)
        fails = c.verdict == S.SLOWER and (strict or not clock)
        rows.append({
            "case_id": cid, "method": rd["method"], "backend": rd["backend"], "model": rd["model"],
            "batch": rd["batch"], "base_us": bmed, "new_us": nmed,
            "base_iqr_us": _num(rd["b_iqr_us"]), "new_iqr_us": _num(rd["n_iqr_us"]),
            "ratio": c.ratio, "lo": c.lo, "hi": c.hi, "p": c.p, "test": c.test, "threshold": thr,
            "verdict": c.verdict, "clock": clock,
            "capped": {(True, True): "both", (True, False): "base", (False, True): "new"}.get((bcap, ncap), ""),
            "fails": fails,
        })
    cols = ["case_id", "method", "backend", "model", "batch", "base_us", "new_us", "base_iqr_us", "new_iqr_us",
            "ratio", "lo", "hi", "p", "test", "threshold", "verdict", "clock", "capped", "fails"]
    return pd.DataFrame(rows, columns=cols)


def geomean(ratios) -> float | None:
    rs = [float(r) for r in ratios if r is not None and not math.isnan(float(r)) and float(r) > 0]
    return math.exp(sum(math.log(r) for r in rs) / len(rs)) if rs else None


def gate(table, base_df, new_df) -> CheckResult:
    """The gate's decision from a comparison table and the two runs' rows."""
    base_ok = set(base_df.loc[base_df["status"] == "ok", "case_id"])
    new_err = new_df[(new_df["status"] == "error") & new_df["case_id"].isin(base_ok)]
    missing = base_ok - set(new_df["case_id"])
    only_new = set(new_df.loc[new_df["status"] == "ok", "case_id"]) - set(base_df["case_id"])
    counts = {v: int((table["verdict"] == v).sum()) for v in S.VERDICTS}
    regressions = int(table["fails"].sum()) if len(table) else 0
    excused = counts[S.SLOWER] - regressions
    failed = regressions > 0 or len(new_err) > 0
    errs = [(r["case_id"], r.get("error")) for _, r in new_err.iterrows()]
    return CheckResult(1 if failed else 0, regressions, counts[S.FASTER], len(table), len(new_err),
                       len(missing), geomean(table["ratio"]), table, counts, excused, errs, len(only_new))


def _fmt_ci(r) -> str:
    if not (math.isfinite(r["lo"]) and math.isfinite(r["hi"])):
        return "n/a"
    return f"[{r['lo']:.3f}, {r['hi']:.3f}]"


def _verdict_text(r) -> str:
    v = r["verdict"]
    if v == S.SLOWER and not r["fails"]:
        v += " (not gating)"
    return v


_ORDER = {S.SLOWER: 0, S.AMBIGUOUS: 1, S.FASTER: 2, S.SAME: 3}


def _sorted(table):
    t = table.copy()
    t["_o"] = [_ORDER.get(v, 9) for v in t["verdict"]]
    return t.sort_values(["_o", "ratio"], ascending=[True, False]).drop(columns="_o")


def format_text(res: CheckResult, header: str, out: TextIO) -> None:
    t = res.table
    print(header, file=out)
    if t is not None and len(t):
        w = max(len("case_id"), *(len(c) for c in t["case_id"]))
        print(f"{'case_id'.ljust(w)}  {'base_us':>10}  {'new_us':>10}  {'new/base':>8}  {'interval':>16}  "
              f"{'thr':>5}  verdict", file=out)
        for _, r in _sorted(t).iterrows():
            clock = f"  [clock: {r['clock']}]" if r["clock"] else ""
            print(f"{r['case_id'].ljust(w)}  {r['base_us']:10.3f}  {r['new_us']:10.3f}  {r['ratio']:8.3f}  "
                  f"{_fmt_ci(r):>16}  {r['threshold']:5.1%}  {_verdict_text(r)}{clock}", file=out)
    for cid, e in res.errors:
        print(f"NEW ERROR  {cid}: {e}", file=out)
    if res.missing:
        print(f"{res.missing} case(s) ok in BASE have no row in NEW (not compared)", file=out)
    if res.only_new:
        print(f"{res.only_new} case(s) only in NEW (not compared)", file=out)
    print(summary_line(res), file=out)
    print("FAIL" if res.exit_code == 1 else "PASS", file=out)


def summary_line(res: CheckResult) -> str:
    c = res.counts
    gs = f"{res.geomean_ratio:.4f}" if res.geomean_ratio else "n/a"
    excused = f" ({res.clock_excused} not gating: capped/throttled clocks)" if res.clock_excused else ""
    return (f"compared {res.compared}: {c.get(S.SLOWER, 0)} SLOWER{excused}, {c.get(S.AMBIGUOUS, 0)} AMBIGUOUS, "
            f"{c.get(S.FASTER, 0)} FASTER, {c.get(S.SAME, 0)} SAME; {res.new_errors} new error(s); "
            f"geomean new/base {gs}")


def format_markdown(res: CheckResult, title: str, notes: list[str] | None = None) -> str:
    """A summary fit for a pull-request comment: the decision, counts, every case that is not
    SAME, and all cases folded away."""
    t = res.table
    status = "FAIL" if res.exit_code == 1 else "PASS"
    icon = {"PASS": ":white_check_mark:", "FAIL": ":x:"}[status]
    lines = [f"### {icon} {title}: **{status}**", ""]
    for n in notes or []:
        lines.append(f"- {n}")
    c = res.counts
    gs = f"{res.geomean_ratio:.4f}" if res.geomean_ratio else "n/a"
    lines += ["", "| compared | SLOWER (gating) | AMBIGUOUS | FASTER | SAME | new errors | "
              "geomean new/base |", "|---:|---:|---:|---:|---:|---:|---:|",
              f"| {res.compared} | {c.get(S.SLOWER, 0)} ({res.regressions}) | {c.get(S.AMBIGUOUS, 0)} | "
              f"{c.get(S.FASTER, 0)} | {c.get(S.SAME, 0)} | {res.new_errors} | {gs} |", ""]

    def table_md(rows) -> list[str]:
        out = ["| case | base µs | new µs | new/base | interval | threshold | verdict | clock |",
               "|---|---:|---:|---:|---|---:|---|---|"]
        for i, (_, r) in enumerate(rows.iterrows()):
            if i == MAX_MARKDOWN_ROWS:
                out.append(f"| … {len(rows) - i} more | | | | | | | |")
                break
            out.append(f"| `{r['case_id']}` | {r['base_us']:.3f} | {r['new_us']:.3f} | {r['ratio']:.3f} | "
                       f"{_fmt_ci(r)} | {r['threshold']:.1%} | {_verdict_text(r)} | {r['clock']} |")
        return out

    if t is not None and len(t):
        notable = _sorted(t[t["verdict"] != S.SAME])
        if len(notable):
            lines += ["Cases that are not SAME:", ""] + table_md(notable) + [""]
        if res.errors:
            lines += ["Errors in NEW (ok in BASE):", ""] + [f"- `{cid}`: {e}" for cid, e in res.errors] + [""]
        lines += ["<details><summary>All compared cases</summary>", ""] + table_md(_sorted(t)) + ["", "</details>", ""]
    lines += ["Verdicts: SLOWER / FASTER = the median ratio is beyond the threshold and the "
              "interval (Mann-Whitney, Hodges-Lehmann) excludes 1; AMBIGUOUS = the interval holds 1 "
              "and reaches beyond the threshold (rerun, or measure with more samples); a SLOWER case "
              "with a power-capped or throttled side does not gate unless `--strict`.", ""]
    return "\n".join(lines)


def resolve_config(manifest: dict, scenario: str | Path | None) -> S.CheckConfig:
    """The [check] settings: of --scenario FILE if given, else of the scenario text stored in
    the manifest. Raises CheckTableError / OSError."""
    if scenario is not None:
        return S.check_config_from_text(Path(scenario).read_text(encoding="utf-8"))
    return S.check_config_from_text((manifest.get("scenario") or {}).get("text"))


def run_check(base: str | Path, new: str | Path, threshold: float | None = None,
              allow_device_mismatch: bool = False, results_dir: str | Path = "results",
              out: TextIO | None = None, alpha: float | None = None, strict: bool | None = None,
              markdown: str | Path | None = None, scenario: str | Path | None = None) -> CheckResult:
    out = out or sys.stdout
    err = sys.stderr
    bad = CheckResult(2, 0, 0, 0, 0, 0, None)
    try:
        bs, ns = RunStore.open(base, results_dir), RunStore.open(new, results_dir)
    except StoreError as e:
        print(f"replaybench check: {e}", file=err)
        return bad
    bm, nm = bs.manifest(), ns.manifest()
    bdf, ndf = bs.dataframe(), ns.dataframe()
    bdev, ndev = device_of(bm, bdf), device_of(nm, ndf)
    if bdev != ndev and not allow_device_mismatch:
        print(f"replaybench check: devices differ: BASE ran on {bdev!r}, NEW on {ndev!r}; "
              f"times are not comparable (pass --allow-device-mismatch to compare anyway)",
              file=err)
        return bad
    try:
        cfg = resolve_config(bm, scenario)
    except (S.CheckTableError, OSError, ValueError) as e:
        print(f"replaybench check: scenario {scenario or 'of BASE'}: {e}", file=err)
        return bad
    thr = threshold if threshold is not None else (cfg.threshold if cfg.threshold is not None
                                                   else S.DEFAULT_THRESHOLD)
    a = alpha if alpha is not None else (cfg.alpha if cfg.alpha is not None else S.DEFAULT_ALPHA)
    st = bool(strict) if strict is not None else bool(cfg.strict)
    table = compare(bdf, ndf, thr, a, cfg, st)
    res = gate(table, bdf, ndf)
    header = (f"BASE {bs.run_id} ({bdev})  vs  NEW {ns.run_id} ({ndev}); threshold {thr:.1%}"
              f"{' (per-case overrides: ' + str(len(cfg.cases)) + ')' if cfg.cases else ''}, alpha {a:g}"
              f"{', strict' if st else ''}")
    format_text(res, header, out)
    if markdown:
        notes = [f"BASE `{bs.run_id}` ({bdev}, git {_sha(bm)}), NEW `{ns.run_id}` ({ndev}, git {_sha(nm)})",
                 f"threshold {thr:.1%}, alpha {a:g}{', strict' if st else ''}"]
        Path(markdown).write_text(format_markdown(res, "replaybench check", notes), encoding="utf-8")
    return res


def _sha(manifest: dict) -> str:
    g = manifest.get("git") or {}
    sha = str(g.get("sha") or "?")[:10]
    return sha + ("+dirty" if g.get("dirty") else "")


# ----------------------------------------------------------------------------- command line

def add_arguments(c) -> None:
    """`replaybench check`'s arguments (two stored runs, or --revs for a one-machine A/B)."""
    c.add_argument("base", nargs="?", help="BASE run id (under --results-dir) or run directory")
    c.add_argument("new", nargs="?", help="NEW run id or run directory")
    c.add_argument("--revs", nargs=3, metavar=("BASE_REV", "NEW_REV", "SCENARIO"),
                   help="A/B on this machine: measure the kernels of two git revisions (or "
                        "kernel directories; WORKTREE = this checkout) interleaved, case by case, "
                        "on the same device, then gate NEW_REV against BASE_REV")
    c.add_argument("--threshold", type=float, default=None,
                   help="relative change tolerated (default: the scenario's [check] threshold, else 0.05)")
    c.add_argument("--alpha", type=float, default=None,
                   help="significance level of the test (default: [check] alpha, else 0.01)")
    c.add_argument("--strict", action="store_true", default=None,
                   help="SLOWER cases with a power-capped or throttled side fail the gate too")
    c.add_argument("--markdown", metavar="FILE", help="also write a Markdown summary (pull-request comment)")
    c.add_argument("--scenario", metavar="FILE",
                   help="take the [check] table from this scenario (default: the one stored with BASE)")
    c.add_argument("--allow-device-mismatch", action="store_true",
                   help="compare runs made on different devices (refused by default: their times are not comparable)")
    c.add_argument("--results-dir", default="results", help="where runs are stored (default: results)")
    c.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="--revs: where to measure")
    c.add_argument("--inject", type=float, action="append", default=[], metavar="FRACTION",
                   help="--revs, validation of the gate: also measure NEW_REV with an extra read of FRACTION "
                        "of each case's modelled bytes in the same CUDA graph (repeatable: 0.03, 0.05; "
                        "0 = one more plain NEW side, an A/A replica)")
    c.add_argument("--run-id", help="--revs: prefix of the run ids written (default: ab-<scenario>-<time>)")
    c.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                   help="--revs: start no new case after this many seconds of measuring; judge what was measured")
