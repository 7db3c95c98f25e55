"""Per-launch durations of one method's decode step at a small batch, for Nsight Compute.

Session 31. The deferred small-batch route (ROUTE_K 2) alternates two different steps, one that
appends an entry (no state write) and one that folds it and writes the state; a CUDA-graph
timing gives only their mean. Run under ncu, this script lays the layers out as the sweep does
(>= 1 GiB of state, at most 64 layers, so a layer's state comes from HBM), steps every layer
`--warm` times outside the profiled range, then `--steps` times inside it (cudaProfilerStart /
Stop), so each launch's gpu__time_duration can be grouped by step (launch i // layers):

  ncu --profile-from-start off --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum --csv python3 tools/probe_route_steps.py qwen3.5-4b replay 1 --route-k 2
  python3 tools/probe_route_steps.py --summarise ncu.csv --layers 64

(--route-k with --block-v / --warps patch the table's small-batch route row: GDN's through
probe_layers.patched_route, Mamba-2's through probe_layers.m2_route, --block-v its rows per
program. Session 32: DRAM bytes read and written per launch (dram__bytes_read.sum /
dram__bytes_write.sum in --metrics) are summarised per step too, in MB: with the caches left
alone they show where a step's writes reach DRAM, which may be a later launch. Session 33:
methods eager-probe / eager-nostore launch probe_layers' copy of the Mamba-2 eager kernel with
and without its state store, to set the per-launch cost of the store beside the routes'.)"""
from __future__ import annotations

import argparse
import csv
import io
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


# Mamba-2 only: probe_layers' copy of the eager kernel, with and without its state store
PROBES = ("eager-probe", "eager-nostore")


def run_probe(a) -> None:
    """Session 33: the Mamba-2 eager step's probe copy (probe_layers.m2_eager_plans), with its
    state store (method eager-probe) or without (eager-nostore), launched as run() launches."""
    from probe_layers import launch_plans, m2_eager_plans
    plans, nl = m2_eager_plans(a.model, a.batch, store=a.method == "eager-probe")
    _profile(lambda: launch_plans(plans), a, nl)


def _profile(step, a, nl) -> None:
    """`step` (one step over every layer) a.warm times, then a.steps times inside the profiled range."""
    import torch
    for _ in range(a.warm):
        step()
    torch.cuda.synchronize()
    print(f"# {a.model} {a.method} b{a.batch} route_k {a.route_k} layers {nl}", file=sys.stderr)
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(a.steps):
        step()
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()


def run(a) -> None:
    import torch
    from probe_layers import get_model, Layer, _inputs, m2_route, patched_route, sweep_layers
    if a.method in PROBES:
        return run_probe(a)
    model = get_model(a.model)
    nl = sweep_layers(a.model, a.batch)
    gen = torch.Generator().manual_seed(3)
    lo = "bfloat16" if a.method == "replay-dual" else "none"
    kk = 16 if a.method.startswith("replay") else 0
    if model.op == "mamba2":
        ctx = m2_route(a.route_k, a.block_v, a.warps)      # route_k None: the table as shipped
    else:
        ctx = patched_route(a.batch, a.route_k, {"BLOCK_V": a.block_v, "num_warps": a.warps}
                            if a.route_k is not None else None)
    with ctx:
        layers = [Layer(model.op, model.ssm, a.method, "triton", a.batch, kk, kk, "float32", lo, "cuda", gen)
                  for _ in range(nl)]
        inp, params = _inputs(model.op, model.ssm, a.batch, "cuda", gen)
        idx = torch.arange(a.batch, dtype=torch.int32, device="cuda")

        def step():
            for lay in layers:
                lay.step(inp, params, idx)
        _profile(step, a, nl)


# metric -> (what a summary line says, value in its unit from ncu's value and unit)
METRICS = {
    "gpu__time_duration.sum": ("us per step", lambda v, unit: v / 1e3 if unit in ("nsecond", "ns") else v),
    "dram__bytes_read.sum": ("MB read per step", lambda v, unit: v / 1e6 if unit in ("byte", "B") else v),
    "dram__bytes_write.sum": ("MB written per step", lambda v, unit: v / 1e6 if unit in ("byte", "B") else v),
}


def summarise(path: str, layers: int, label: str) -> None:
    """Median per step index (launch i // layers) of every kernel named in ncu's CSV, one line
    per kernel and metric of METRICS found (time in us, DRAM bytes in MB)."""
    text = open(path).read()
    start = text.find('"ID"')
    by = {}
    for r in csv.DictReader(io.StringIO(text[start:])):
        metric = r.get("Metric Name")
        if metric not in METRICS:
            continue
        v = METRICS[metric][1](float(r["Metric Value"].replace(",", "")), r["Metric Unit"])
        by.setdefault((metric, r["Kernel Name"].split("(")[0]), []).append(v)
    for metric in METRICS:
        for (m, name), ts in by.items():
            if m != metric:
                continue
            steps = [ts[i:i + layers] for i in range(0, len(ts), layers)]
            med = " ".join(f"{statistics.median(s):6.2f}" for s in steps)
            print(f"{label:40s} {name:32s} launches {len(ts):4d}  {METRICS[metric][0]}: {med}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?")
    ap.add_argument("method", nargs="?", choices=["eager", "replay", "replay-dual", *PROBES])
    ap.add_argument("batch", nargs="?", type=int)
    ap.add_argument("--route-k", type=int, default=None)
    ap.add_argument("--block-v", type=int, default=4, help="rows per program of the patched route")
    ap.add_argument("--warps", type=int, default=1)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--summarise", metavar="CSV")
    ap.add_argument("--layers", type=int, default=64)
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    if a.summarise:
        summarise(a.summarise, a.layers, a.label)
    elif a.model and a.method and a.batch:
        run(a)
    else:
        ap.error("give MODEL METHOD BATCH, or --summarise CSV")


if __name__ == "__main__":
    main()
