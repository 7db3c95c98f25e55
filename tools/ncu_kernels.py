#!/usr/bin/env python3
"""Nsight Compute's view of a case's kernels: what limits them (occupancy, issue rate, stalls).

Profiles the workload of `replaybench sweep --ncu` for one case of one layer, after its
unprofiled warm-up (replaybench.ncu's child: decode steps with staggered cursors for eager /
replay / dual / vLLM's eager kernel; verify + commit rounds for the speculative methods), and
prints ncu's report for the first --count launches whose kernel name matches --kernels:
speed of light (DRAM / SM throughput), launch statistics (registers, grid), occupancy,
scheduler and warp-state (stall) statistics, memory workload. For spec-replay a tune_spec.py
variant can be applied to the verify launch (--variant NAME).

usage (GPU machine; ncu on PATH or under /usr/local/cuda):
  python3 tools/ncu_kernels.py --model q122b --method spec-replay --T 4 [--variant bv64w4] [--kernels verify]
  python3 tools/ncu_kernels.py --model super --method replay --L 16 --K 16 [--lo bfloat16] [--kernels replay]
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


METHODS = ("eager", "replay", "replay-dual", "vllm-eager", "spec-replay", "spec-replay-dual", "spec-perdraft",
           "vllm-spec")


def make_case(args, model: str):
    """The sweep's Case for the arguments (scenario conventions: L = K + T for spec-replay)."""
    from replaybench.models import get_model
    from replaybench.scenario import Case, make_case_id
    from replaybench.scenario import METHODS as SPECS
    if SPECS[args.method].spec:
        return ts.mk_case(model, args.method.replace("-dual", ""), args.batch, args.T, args.K, args.lo, "cuda")
    L, K = (args.L, args.K) if args.method in ("replay", "replay-dual") else (0, 0)
    lo = args.lo if args.method == "replay-dual" else "none"
    backend = "vllm" if args.method.startswith("vllm") else "triton"
    return Case(case_id=make_case_id(model, args.method, backend, args.batch, L, K, 0, args.state, lo),
                runner="kernel", model=model, op=get_model(model).op, method=args.method, backend=backend,
                batch=args.batch, buffer_len=L, flush_period=K, spec_window=0, state_dtype=args.state,
                lo_dtype=lo, device="cuda")


def child(case_json: str, op: str, variant: str) -> None:
    """Inside ncu: apply the variant (spec-replay), then replaybench.ncu's warm-up + profiled steps."""
    from replaybench import ncu
    src = ts.MAMBA2_VARIANTS if op == "mamba2" else ts.GDN_VARIANTS
    ts.apply_variant(op, src[variant])
    ncu._child(case_json)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="q122b", help="of: " + ", ".join(ts.STUDY))
    ap.add_argument("--method", default="spec-replay", help="of: " + ", ".join(METHODS))
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--T", type=int, default=4, help="draft window (speculative methods)")
    ap.add_argument("--K", type=int, default=16, help="flush period")
    ap.add_argument("--L", type=int, default=16, help="buffer length (replay, replay-dual)")
    ap.add_argument("--lo", default="bfloat16", help="read copy of replay-dual / spec-replay-dual (bfloat16, ...)")
    ap.add_argument("--state", default="float32", choices=("float32", "bfloat16", "float16"),
                    help="state dtype (eager, replay, vllm-eager; dual modes keep an fp32 high copy)")
    ap.add_argument("--source-csv", default=None,
                    help="also sample warp stalls per SASS instruction (SourceCounters) and write ncu's "
                         "source page of the profiled launches to this CSV")
    ap.add_argument("--variant", default="default", help="a tune_spec.py variant name (spec-replay)")
    ap.add_argument("--kernels", default=".", help="ncu -k regex: kernels whose names match (default: all)")
    ap.add_argument("--count", type=int, default=2, help="profile the first COUNT matching launches")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--op", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.op, args.variant)
        return 0
    if args.model not in ts.STUDY:
        raise SystemExit(f"--model: unknown {args.model!r}; allowed: {', '.join(ts.STUDY)}")
    if args.method not in METHODS:
        raise SystemExit(f"--method: unknown {args.method!r}; allowed: {', '.join(METHODS)}")
    if not args.method.endswith("-dual"):
        args.lo = "none"
    if args.state != "float32" and (args.method.endswith("-dual") or args.method.startswith("spec")):
        raise SystemExit(f"--state {args.state}: only eager, replay and vllm-eager take a 16-bit state")
    from replaybench.models import get_model
    from replaybench.ncu import ncu_path
    model = ts.MODELS[args.model]
    op = get_model(model).op
    src = ts.MAMBA2_VARIANTS if op == "mamba2" else ts.GDN_VARIANTS
    if args.variant not in src:
        raise SystemExit(f"--variant: unknown {args.variant!r} for {op}; allowed: {', '.join(src)}")
    case = make_case(args, model)
    exe = ncu_path()
    if exe is None:
        raise SystemExit("ncu not found (PATH, /usr/local/cuda, /opt/nvidia/nsight-compute)")
    cmd = [exe, "--clock-control", "none", "--profile-from-start", "off", "-k", f"regex:{args.kernels}",
           "--launch-count", str(args.count)]
    for s in SECTIONS + (("SourceCounters",) if args.source_csv else ()):
        cmd += ["--section", s]
    rep = Path(args.source_csv).with_suffix(".ncu-rep") if args.source_csv else None
    if rep:
        cmd += ["-f", "-o", str(rep.with_suffix(""))]
    cmd += [sys.executable, __file__, "--child", json.dumps(dataclasses.asdict(case)), "--op", op,
            "--variant", args.variant]
    print(f"# {case.case_id} variant={args.variant}", flush=True)
    rc = subprocess.run(cmd).returncode
    if rep and rc == 0:
        # the report was written instead of printed: print its details, then its source page
        rc = subprocess.run([exe, "-i", str(rep), "--page", "details"]).returncode
        with open(args.source_csv, "w") as f:
            subprocess.run([exe, "-i", str(rep), "--page", "source", "--csv", "--print-source", "sass"], stdout=f)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
