"""Performance-regression gate between two runs: ``replaybench check BASE NEW``.

Rows with status 'ok' in both runs are matched by (case_id, method, backend).
A case is a regression when NEW/BASE median > 1 + threshold AND the IQR ranges
do not overlap (NEW's lower quartile above BASE's upper quartile; quartiles are
the runner's q1_us/q3_us columns when present, else median -/+ iqr/2).
A case ok in BASE but error in NEW also fails the gate. Cases timed under the power cap
(replaybench.timing's power_capped column) are compared like the others and marked in the
`capped` column (base / new / both): their times are rates at the board's power limit.

Exit codes: 0 pass, 1 regression, 2 usage problem (missing run, devices differ
without --allow-device-mismatch).
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from .store import RunStore, StoreError

KEY = ["case_id", "method", "backend"]


@dataclass
class CheckResult:
    exit_code: int
    regressions: int
    improvements: int
    compared: int
    new_errors: int
    missing: int
    geomean_ratio: float | None
    table: object = None        # DataFrame of the comparison


def _quartiles(df):
    import pandas as pd
    med = df["median_us"].astype(float)
    half = df["iqr_us"].astype(float).fillna(0) / 2
    q1 = df["q1_us"].astype(float) if "q1_us" in df else pd.Series(float("nan"), index=df.index)
    q3 = df["q3_us"].astype(float) if "q3_us" in df else pd.Series(float("nan"), index=df.index)
    return q1.fillna(med - half), q3.fillna(med + half)


def device_of(manifest: dict, df) -> str:
    """The device a run ran on: the manifest's device name, else the rows' device column."""
    dev = manifest.get("device") or {}
    if dev.get("name"):
        return str(dev["name"])
    vals = sorted(set(df["device"].dropna().astype(str))) if len(df) else []
    return ",".join(vals) or "unknown"


def compare(base_df, new_df, threshold: float = 0.05):
    """Comparison table with columns base_us, new_us, ratio, verdict."""
    b = base_df[base_df["status"] == "ok"].copy()
    n = new_df[new_df["status"] == "ok"].copy()
    b["b_q1"], b["b_q3"] = _quartiles(b)
    n["n_q1"], n["n_q3"] = _quartiles(n)
    for d in (b, n):
        d["capped"] = d["power_capped"].fillna(False).astype(bool) if "power_capped" in d else False
    b = b[KEY + ["model", "batch", "median_us", "iqr_us", "b_q1", "b_q3", "capped"]].rename(
        columns={"median_us": "base_us", "iqr_us": "base_iqr_us", "capped": "b_capped"})
    n = n[KEY + ["median_us", "iqr_us", "n_q1", "n_q3", "capped"]].rename(
        columns={"median_us": "new_us", "iqr_us": "new_iqr_us", "capped": "n_capped"})
    m = b.merge(n, on=KEY, how="inner")
    m["capped"] = [{(True, True): "both", (True, False): "base", (False, True): "new"}.get((bc, nc), "")
                   for bc, nc in zip(m["b_capped"], m["n_capped"])]
    m["ratio"] = m["new_us"].astype(float) / m["base_us"].astype(float)
    slower = (m["ratio"] > 1 + threshold) & (m["n_q1"] > m["b_q3"])
    faster = (m["ratio"] < 1 - threshold) & (m["n_q3"] < m["b_q1"])
    m["verdict"] = "same"
    m.loc[(m["ratio"] > 1 + threshold) & ~slower, "verdict"] = "slower (noise)"
    m.loc[(m["ratio"] < 1 - threshold) & ~faster, "verdict"] = "faster (noise)"
    m.loc[slower, "verdict"] = "REGRESSION"
    m.loc[faster, "verdict"] = "faster"
    return m.drop(columns=["b_q1", "b_q3", "n_q1", "n_q3", "b_capped", "n_capped"])


def run_check(base: str | Path, new: str | Path, threshold: float = 0.05,
              allow_device_mismatch: bool = False, results_dir: str | Path = "results",
              out: TextIO | None = None) -> CheckResult:
    out = out or sys.stdout
    err = sys.stderr
    try:
        bs, ns = RunStore.open(base, results_dir), RunStore.open(new, results_dir)
    except StoreError as e:
        print(f"replaybench check: {e}", file=err)
        return CheckResult(2, 0, 0, 0, 0, 0, None)
    bm, nm = bs.manifest(), ns.manifest()
    bdf, ndf = bs.dataframe(), ns.dataframe()
    bdev, ndev = device_of(bm, bdf), device_of(nm, ndf)
    if bdev != ndev and not allow_device_mismatch:
        print(f"replaybench check: devices differ: BASE ran on {bdev!r}, NEW on {ndev!r}; "
              f"times are not comparable (pass --allow-device-mismatch to compare anyway)",
              file=err)
        return CheckResult(2, 0, 0, 0, 0, 0, None)

    table = compare(bdf, ndf, threshold)
    base_ok = set(bdf.loc[bdf["status"] == "ok", "case_id"])
    new_err = ndf[(ndf["status"] == "error") & ndf["case_id"].isin(base_ok)]
    missing = base_ok - set(ndf["case_id"])
    regressions = int((table["verdict"] == "REGRESSION").sum())
    improvements = int((table["verdict"] == "faster").sum())
    ratios = [r for r in table["ratio"] if r and r > 0 and not math.isnan(r)]
    geo = math.exp(sum(math.log(r) for r in ratios) / len(ratios)) if ratios else None

    print(f"BASE {bs.run_id} ({bdev})  vs  NEW {ns.run_id} ({ndev}); threshold "
          f"{threshold:.1%}", file=out)
    if len(table):
        cols = ["case_id", "base_us", "new_us", "ratio", "verdict", "capped"]
        w = max(len("case_id"), *(len(c) for c in table["case_id"]))
        print(f"{'case_id'.ljust(w)}  {'base_us':>10}  {'new_us':>10}  {'new/base':>8}  verdict", file=out)
        for _, r in table.sort_values("ratio", ascending=False)[cols].iterrows():
            capped = f"  [power-capped: {r['capped']}]" if r["capped"] else ""
            print(f"{r['case_id'].ljust(w)}  {r['base_us']:10.3f}  {r['new_us']:10.3f}  "
                  f"{r['ratio']:8.3f}  {r['verdict']}{capped}", file=out)
    for _, r in new_err.iterrows():
        print(f"NEW ERROR  {r['case_id']}: {r['error']}", file=out)
    if missing:
        print(f"{len(missing)} case(s) ok in BASE have no row in NEW (not compared)", file=out)
    only_new = set(ndf.loc[ndf["status"] == "ok", "case_id"]) - set(bdf["case_id"])
    if only_new:
        print(f"{len(only_new)} case(s) only in NEW (not compared)", file=out)
    gs = f"{geo:.3f}" if geo else "n/a"
    print(f"compared {len(table)}: {regressions} regression(s), {improvements} faster, "
          f"{len(new_err)} new error(s); geomean new/base {gs}", file=out)
    failed = regressions > 0 or len(new_err) > 0
    print("FAIL" if failed else "PASS", file=out)
    return CheckResult(1 if failed else 0, regressions, improvements, len(table), len(new_err),
                       len(missing), geo, table)
