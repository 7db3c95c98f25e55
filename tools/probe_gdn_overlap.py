"""Timing probe, H200 (session 23): would the GDN SPLIT replay step gain from running its flush
step beside its output launch (two streams, forked and joined inside the CUDA graph) instead of
after it?

    source tools/device_env.sh; python3 tools/probe_gdn_overlap.py     # ~35 s on the GPU machine

Times, per step and layer, in a CUDA graph of K steps over enough layers for 1 GiB of state
(tools/tune_gdn.py's states, cursors staggered): the two launches in order (without and with
the programmatic dependent launch), each launch alone, and the two on two streams, the flush
step launched first or second, its stream at normal or high priority. The concurrent forms are
a PROBE, not a correct step: the flush step reads the scratch the output launch writes (the
previous step's) and writes cursors the output launch reads, so their outputs are not checked.
What they measure is how much of the flush step's time overlapping would hide. Session 23:
8-10 us of the flush step's 48-81 us at Qwen3.5-122B b256 (results/device-logs-20261202-s23/)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import tune_gdn as T  # noqa: E402


def run(model: str, mode: str, batch: int) -> None:
    layers, x, idx, o, nl = T.probe_layers(model, mode, batch)
    plans = [T.plans_for("replay", {"PDL": False}, rs, x, idx, o) for rs in layers]   # [output, flush step]
    plans_pdl = [T.plans_for("replay", {}, rs, x, idx, o) for rs in layers]
    sides = {p: torch.cuda.Stream(priority=p) for p in (0, -1)}

    def in_order(ps):
        def f():
            for _ in range(T.K):
                for p in ps:
                    T.launch(p)
        return f

    def beside(prio, flush_first):
        side = sides[prio]

        def f():
            main = torch.cuda.current_stream()
            for _ in range(T.K):
                for p in plans:
                    side.wait_stream(main)
                    if not flush_first:
                        T.launch([p[0]])
                    with torch.cuda.stream(side):
                        T.launch([p[1]])
                    if flush_first:
                        T.launch([p[0]])
                    main.wait_stream(side)
        return f

    for name, fn in [("in order", in_order(plans)), ("in order, PDL", in_order(plans_pdl)),
                     ("output launch only", T.launch_only(plans, 0)), ("flush step only", T.launch_only(plans, 1)),
                     ("beside, flush first", beside(0, True)), ("beside, flush first, high prio", beside(-1, True)),
                     ("beside, output first", beside(0, False)), ("beside, output first, high prio", beside(-1, False)),
                     ("in order (again)", in_order(plans))]:
        us = T.time_graph(fn) / (T.K * nl)
        print(f"{model} {mode} b{batch} {name:32s} {us:8.1f} us", flush=True)


if __name__ == "__main__":
    T.run_probe(run, [("q122b", "f32", 256), ("q122b", "dual-bf16", 256), ("q4b", "f32", 256),
                      ("q4b", "dual-bf16", 256), ("q122b", "f32", 128), ("q122b", "bf16", 256)])
