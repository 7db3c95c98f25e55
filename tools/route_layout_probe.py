"""Is the GDN small-batch route's gap to the eager kernel (bf16 state, batch 8-32: 4-7 % in
session 17) the route kernel's, or the memory layout's? One process, one GPU, Qwen3.5 dims,
each timed twice in turn (CUDA graphs over enough layers that the state streams from HBM,
tools/tune_gdn.py's timing), microseconds per layer step:
    eager      the eager kernel on plain state tensors (as the sweep's and tuner's eager layers)
    eager@rs   the eager kernel on the checkpoint tensors of replay layers (checkpoint, buffer
               and cursors allocated per layer, as the sweep's replay layers)
    route      the replay step's eager route (the shipped table row) on those replay layers
    route@L1   the route on replay layers with a one-entry buffer (little memory between states)
eager@rs ~ route: the layout costs it; eager@rs ~ eager: the route kernel does.
MODE: tools/tune_gdn.py's (bf16, f32, dual-bf16: the eager comparator runs the high copy's dtype).
Usage (GPU): python3 tools/route_layout_probe.py [q122b,q4b] [8,16,32] [bf16,dual-bf16,...]
"""
from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tune_gdn as T  # noqa: E402  (its states, inputs and CUDA-graph timing)

from replayssm.triton import gdn as TK  # noqa: E402


def probe(model: str, mode: str, batch: int) -> dict[str, list[float]]:
    _, Hv = T.MODELS[model]
    sd = T.MODE[mode][1]        # the eager comparator's state dtype (a dual state's high copy)
    nl = T.layers_for(batch * Hv * 128 * 128 * torch.tensor([], dtype=getattr(torch, sd)).element_size())
    states = [T.make_state(model, sd, batch, seed=20 + i) for i in range(nl)]
    layers = [T.make_rs(model, mode, batch, seed=11 + i) for i in range(nl)]
    T.L = T.K = 1
    try:
        short = [T.make_rs(model, mode, batch, seed=31 + i) for i in range(nl)]
    finally:
        T.L = T.K = 16
    x = T.inputs(model, batch, 1)
    idx = torch.arange(batch, dtype=torch.int32, device=T.DEV)
    o = torch.empty_like(x["v"])
    assert TK.state_takes_eager_route(layers[0], x["k"], x["v"]), "the table does not route this shape"
    kinds = {
        "eager": [T.plans_for("eager", {}, st, x, idx, o) for st in states],
        "eager@rs": [T.plans_for("eager", {}, rs.hi.data, x, idx, o) for rs in layers],
        "route": [T.plans_for("replay", {}, rs, x, idx, o) for rs in layers],
        "route@L1": [T.plans_for("replay", {}, rs, x, idx, o) for rs in short],
    }
    times = {k: [] for k in kinds}
    for _ in range(2):
        for name, plans in kinds.items():
            def sample(plans=plans):
                for _ in range(16):
                    for p in plans:
                        T.launch(p)
            times[name].append(T.time_graph(sample) / (16 * nl))
    return times


def main() -> None:
    models = (sys.argv[1] if len(sys.argv) > 1 else "q122b,q4b").split(",")
    batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "8,16,32").split(",")]
    modes = (sys.argv[3] if len(sys.argv) > 3 else "bf16").split(",")
    print(f"# {torch.cuda.get_device_name()}; us per layer step, two passes each")
    for mode in modes:
        for model in models:
            for b in batches:
                try:
                    t = probe(model, mode, b)
                except Exception as e:      # one shape's failure is reported, the rest still run
                    print(f"ERROR {model} {mode} b{b}: {type(e).__name__}: {str(e)[:300]}", flush=True)
                    continue
                e = min(t["eager"])
                print(f"{model:6s} {mode:9s} b{b:<3d} " + "  ".join(
                    f"{k} {min(v):7.2f} ({e / min(v):.3f}x) [{' / '.join(f'{u:.2f}' for u in v)}]"
                    for k, v in t.items()), flush=True)
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
