#!/usr/bin/env python3
"""Nsight Compute's view of one speculative round's kernels: where the verify kernel's time goes.

Profiles one round (verify T drafts + commit) of one layer of a spec case, after an unprofiled
warm-up (replaybench.runners.spec.profile_rounds, the workload of `replaybench sweep --ncu`),
and prints ncu's report per kernel: speed of light (DRAM / SM throughput), launch statistics
(registers, grid), occupancy, warp-state (stall reason) statistics and memory workload.
A tune_spec.py variant can be applied to the replay verify launch (--variant NAME).

usage (GPU machine; ncu on PATH or under /usr/local/cuda):
  python3 tools/ncu_spec.py --model q122b --batch 256 --T 4 [--variant pp-bv64w4] [--kernels verify]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
import tune_spec as ts  # noqa: E402  (variant tables, case construction, override hooks)

SECTIONS = ("SpeedOfLight", "LaunchStats", "Occupancy", "WarpStateStats", "MemoryWorkloadAnalysis",
            "SchedulerStats")


def child(case_json: str, op: str, variant: str) -> None:
    """Inside ncu: apply the variant, warm up, profile one round."""
    from replaybench.runners.spec import profile_rounds
    from replaybench.scenario import Case
    case = Case(**json.loads(case_json))
    src = ts.MAMBA2_VARIANTS if op == "mamba2" else ts.GDN_VARIANTS
    ts.apply_variant(op, src[variant])
    profile_rounds(case, "cuda", 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="q122b", help="of: " + ", ".join(ts.STUDY))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--T", type=int, default=4)
    ap.add_argument("--K", type=int, default=16)
    ap.add_argument("--lo", default="none", help="read copy of the dual checkpoint (none, bfloat16)")
    ap.add_argument("--method", default="spec-replay", help="spec-replay or spec-perdraft")
    ap.add_argument("--variant", default="default", help="a tune_spec.py variant name (spec-replay)")
    ap.add_argument("--kernels", default="verify", help="ncu -k regex: kernels whose names match")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--op", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.op, args.variant)
        return 0
    if args.model not in ts.STUDY:
        raise SystemExit(f"--model: unknown {args.model!r}; allowed: {', '.join(ts.STUDY)}")
    from replaybench.models import get_model
    from replaybench.ncu import ncu_path
    model = ts.MODELS[args.model]
    op = get_model(model).op
    src = ts.MAMBA2_VARIANTS if op == "mamba2" else ts.GDN_VARIANTS
    if args.variant not in src:
        raise SystemExit(f"--variant: unknown {args.variant!r} for {op}; allowed: {', '.join(src)}")
    case = ts.mk_case(model, args.method, args.batch, args.T, args.K, args.lo, device="cuda")
    exe = ncu_path()
    if exe is None:
        raise SystemExit("ncu not found (PATH, /usr/local/cuda, /opt/nvidia/nsight-compute)")
    cmd = [exe, "--clock-control", "none", "--profile-from-start", "off", "-k", f"regex:{args.kernels}"]
    for s in SECTIONS:
        cmd += ["--section", s]
    cmd += [sys.executable, __file__, "--child", json.dumps(dataclasses.asdict(case)), "--op", op,
            "--variant", args.variant]
    print(f"# {args.model} b{args.batch} T{args.T} K{args.K} lo={args.lo} {args.method} variant={args.variant}",
          flush=True)
    return subprocess.run(cmd).returncode


if __name__ == "__main__":
    raise SystemExit(main())
