"""Timing probe, H200 (session 23): how much of the Mamba-2 replay step's time its flushes take.

    source tools/device_env.sh; python3 tools/probe_mamba2_flush_share.py     # ~25 s on the GPU machine

The step folds a sequence's buffer into its checkpoint in the same launch (the fused route), so
no profile separates the two. This times, per step and layer at batch 256 (replaybench's kernel
runner layers, 1 GiB of state, cursors staggered, CUDA graph of K steps): the fused step as the
tables choose it, the split route (an output-only step launch for every sequence, then
_replay_flush_kernel), and the split route's output-only launch alone. The last is not a
correct step (nothing is ever folded: the cursors still move and reset at K, the buffer is
overwritten); it times the output path, so fused minus it is what the flushes cost. Session 23,
Super dual bf16, before that session's 32-column fold chunks: fused 235.8 us, output path 152.9
us, i.e. 83 us for the flushes of 1/16 of the sequences (results/device-logs-20261202-s23/)."""
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from replaybench.models import get_model  # noqa: E402
from replaybench.runners.kernel import Layer, _inputs  # noqa: E402
from replayssm.triton import mamba2 as tk  # noqa: E402
from tune_gdn import time_graph  # noqa: E402   (median us of a CUDA graph replay)

K = L = 16


def run(model_name: str, method: str, sd: str, lo: str | None, batch: int) -> None:
    model = get_model(model_name)
    gen = torch.Generator().manual_seed(0)
    first = Layer("mamba2", model.ssm, method, "triton", batch, L, K, sd, lo, "cuda", gen)
    per = first.rs.hi.data.numel() * first.rs.hi.data.element_size()
    nl = max(1, min(64, math.ceil((1 << 30) / per)))
    layers = [first] + [Layer("mamba2", model.ssm, method, "triton", batch, L, K, sd, lo, "cuda", gen)
                        for _ in range(nl - 1)]
    inp, params = _inputs("mamba2", model.ssm, batch, "cuda", gen)
    idx = torch.arange(batch, dtype=torch.int32, device="cuda")

    def steps(drop_flush: bool):
        def f():
            for _ in range(K):
                for ly in layers:
                    plans, _ = tk.plan_replay_step(ly.rs, **inp, **params, state_indices=idx)
                    for p in plans:
                        if not (drop_flush and p.kernel is tk._replay_flush_kernel):
                            p()
        return f

    for name, override, drop in (("fused (the tables)", {}, False), ("split", {"route": "split"}, False),
                                 ("split, output launch only", {"route": "split"}, True),
                                 ("fused (again)", {}, False)):
        tk.OVERRIDE.clear()
        if override:
            tk.OVERRIDE["replay"] = dict(override)
        us = time_graph(steps(drop), reps=7) / (K * nl)
        print(f"{model_name.split('-')[2]:6s} {method:12s} b{batch} {name:28s} {us:8.1f} us", flush=True)
    tk.OVERRIDE.clear()
    del layers, first
    torch.cuda.empty_cache()


if __name__ == "__main__":
    for m in ("nemotron-3-super-120b-a12b", "nemotron-3-nano-4b"):
        for method, sd, lo in (("replay-dual", "float32", "bfloat16"), ("replay", "float32", None)):
            run(m, method, sd, lo, 256)
