#!/usr/bin/env python3
"""Where a kernel's warps wait: the stall breakdown and the hottest SASS instructions of an
Nsight Compute source page (`tools/ncu_kernels.py --source-csv FILE`, or
`ncu -i REPORT --page source --csv --print-source sass`), per kernel in the file.

    python3 tools/ncu_stalls.py results/device-logs-20261130-s8/src_gdn_f32.csv.gz [--top 12]

Prints, per kernel: the share of all warp-stall samples by reason (ncu's stall_* columns:
long_sb = waiting on a global/local load, short_sb = shared memory / MIO, barrier = bar.sync,
...), then the instructions with the most samples. CSV or gzip'd CSV.
"""
from __future__ import annotations

import argparse
import gzip
import io
import sys

import pandas as pd

SAMPLES = "Warp Stall Sampling (All Samples)"


def kernels(text: str) -> list[tuple[str, pd.DataFrame]]:
    """[(kernel name, its rows)] of a source page holding one or more profiled launches."""
    out = []
    for part in text.split('"Kernel Name",')[1:]:
        name, body = part.split("\n", 1)
        df = pd.read_csv(io.StringIO(body))
        if SAMPLES not in df.columns:
            raise SystemExit(f"no {SAMPLES!r} column: profile with the SourceCounters section")
        out.append((name.strip().strip(",").strip('"'), df))
    return out


def summary(df: pd.DataFrame, top: int) -> tuple[pd.Series, pd.DataFrame]:
    """(share of samples by stall reason, the `top` instructions by samples) in percent."""
    num = lambda s: pd.to_numeric(s, errors="coerce").fillna(0)   # noqa: E731
    samples = num(df[SAMPLES])
    total = samples.sum()
    reasons = [c for c in df.columns if c.startswith("stall_") and "Not Issued" not in c]
    by_reason = (df[reasons].apply(num).sum() / total * 100).sort_values(ascending=False)
    hot = pd.DataFrame({"pct": samples / total * 100, "sass": df["Source"].str.strip()})
    return by_reason, hot.sort_values("pct", ascending=False).head(top)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv", help="ncu source page (.csv or .csv.gz)")
    ap.add_argument("--top", type=int, default=12, help="instructions to list per kernel")
    args = ap.parse_args()
    opener = gzip.open if args.csv.endswith(".gz") else open
    try:
        with opener(args.csv, "rt") as f:
            text = f.read()
    except OSError as e:
        raise SystemExit(f"{args.csv}: {e}")
    found = kernels(text)
    if not found:
        raise SystemExit(f"{args.csv}: no '\"Kernel Name\"' record (not an ncu source page?)")
    for name, df in found:
        by_reason, hot = summary(df, args.top)
        print(f"# {name}: {len(df)} SASS instructions, {int(pd.to_numeric(df[SAMPLES], errors='coerce').sum())} "
              "stall samples")
        for reason, pct in by_reason.head(8).items():
            print(f"  {reason:22s} {pct:5.1f} %")
        print("  hottest instructions (% of samples):")
        for _, r in hot.iterrows():
            print(f"    {r['pct']:5.1f}  {r['sass'][:100]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
