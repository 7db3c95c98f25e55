#!/usr/bin/env python3
"""Where a case's time goes inside its CUDA graph: each kernel's in-graph duration and the gaps.

Nsight Compute (tools/ncu_kernels.py) times one launch at a time with its caches flushed; the
sweep times whole CUDA-graph replays. This tool sits between them: it builds the sweep's own
timed workload for one case (replaybench.runners.kernel.workload / runners.spec.workload: the
same layers, steps and staggered cursors), captures it in a CUDA graph as the sweep's timing
does, replays it under torch.profiler (CUPTI kernel records), and prints per kernel name its
launches per step, mean and median duration, and time per step; then, per step, the span
(first kernel start to last kernel end over all replays, so the gaps between replays count),
the sum of kernel durations, the union of the kernels' busy intervals (programmatic dependent
launches overlap) and the graph replay's wall time from CUDA events (no profiler).

usage (GPU machine):
  python3 tools/graph_profile.py --model q4b --method replay --batch 32 [--L 16 --K 16] [--lo bfloat16]
  python3 tools/graph_profile.py --model q4b --method spec-replay --batch 128 --T 4 [--variant NAME]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))


def kernel_intervals(prof) -> list[tuple[str, float, float]]:
    """(name, start_us, end_us) of every device kernel record of a torch.profiler run."""
    from torch.autograd import DeviceType
    out = []
    for e in prof.events():
        if e.device_type == DeviceType.CUDA and e.time_range.end > e.time_range.start:
            out.append((e.name, float(e.time_range.start), float(e.time_range.end)))
    return sorted(out, key=lambda t: t[1])


def busy_union(iv: list[tuple[str, float, float]]) -> float:
    """Total length of the union of the intervals (sorted by start)."""
    total, cur_s, cur_e = 0.0, None, None
    for _, s, e in iv:
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    return total + (cur_e - cur_s if cur_e is not None else 0.0)


def summarize(iv: list[tuple[str, float, float]], units: int) -> dict:
    """Per kernel name: launches per unit, mean / median us, us per unit; and the totals."""
    by: dict[str, list[float]] = {}
    for name, s, e in iv:
        by.setdefault(name, []).append(e - s)
    kernels = {n: {"per_unit": len(d) / units, "mean_us": statistics.fmean(d), "median_us": statistics.median(d),
                   "us_per_unit": sum(d) / units} for n, d in by.items()}
    span = (iv[-1][2] - iv[0][1]) if iv else 0.0
    return {"kernels": kernels, "span_us": span / units, "sum_us": sum(e - s for _, s, e in iv) / units,
            "busy_us": busy_union(iv) / units}


def build(args):
    """(case, sample, units per sample) of the sweep's timed workload for the arguments."""
    import ncu_kernels as nk

    from replaybench.models import get_model
    from replaybench.runners import kernel, spec
    model = get_model(nk.ts.MODELS.get(args.model, args.model))
    case = nk.make_case(args, model.name)
    if case.method in spec.METHODS:
        if args.variant != "default":
            src = nk.ts.MAMBA2_VARIANTS if model.op == "mamba2" else nk.ts.GDN_VARIANTS
            nk.ts.apply_variant(model.op, src[args.variant])
        accept = spec.resolve_accept(case.accept if case.accept not in (None, "", "none") else spec.DEFAULT,
                                     case.spec_window)
        sample, rounds, nl, _, _ = spec.workload(case, model, "cuda", accept)
        return case, sample, rounds * nl
    sample, steps, nl = kernel.workload(case, model, "cuda")
    return case, sample, steps * nl


def main() -> int:
    import ncu_kernels as nk
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="q4b", help="a tools/tune_spec.py short name (q4b, q122b, nano, super) or a model name")
    ap.add_argument("--method", default="replay", help="of: eager, replay, replay-dual, spec-replay, "
                                                       "spec-replay-dual, spec-perdraft")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--T", type=int, default=4, help="draft window (speculative methods)")
    ap.add_argument("--K", type=int, default=16, help="flush period")
    ap.add_argument("--L", type=int, default=16, help="buffer length (replay, replay-dual)")
    ap.add_argument("--lo", default="bfloat16", help="read copy of the dual methods")
    ap.add_argument("--state", default="float32", choices=("float32", "bfloat16", "float16"))
    ap.add_argument("--variant", default="default", help="a tune_spec.py variant name (speculative methods)")
    ap.add_argument("--replays", type=int, default=20, help="graph replays profiled (and timed)")
    args = ap.parse_args()
    if args.method not in nk.METHODS or args.method.startswith("vllm"):
        sys.exit(f"--method {args.method!r}: allowed {', '.join(m for m in nk.METHODS if not m.startswith('vllm'))}")
    if not args.method.endswith("-dual"):
        args.lo = "none"

    import torch
    from replaybench.timing import capture, warm_up
    case, sample, units = build(args)
    warm_up(sample, 2)          # as the sweep's timing does (scenario warmup 2)
    graph = capture(sample)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()

    ev = [torch.cuda.Event(enable_timing=True) for _ in range(args.replays + 1)]
    ev[0].record()
    for i in range(args.replays):
        graph.replay()
        ev[i + 1].record()
    torch.cuda.synchronize()
    wall = statistics.median(ev[i].elapsed_time(ev[i + 1]) * 1e3 for i in range(args.replays)) / units

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(args.replays):
            graph.replay()
        torch.cuda.synchronize()
    iv = kernel_intervals(prof)
    s = summarize(iv, units * args.replays)
    print(f"case {case.case_id}: {units} units (steps x layers) per graph replay, {args.replays} replays")
    print(f"{'kernel':58s} {'per unit':>8s} {'mean us':>9s} {'median':>9s} {'us/unit':>9s}")
    for name, k in sorted(s["kernels"].items(), key=lambda kv: -kv[1]["us_per_unit"]):
        print(f"{name[:58]:58s} {k['per_unit']:8.3f} {k['mean_us']:9.2f} {k['median_us']:9.2f} {k['us_per_unit']:9.2f}")
    print(f"per unit: wall {wall:.2f} us (CUDA events, no profiler); under the profiler: span {s['span_us']:.2f}, "
          f"kernels busy {s['busy_us']:.2f} (union), sum of kernel durations {s['sum_us']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
