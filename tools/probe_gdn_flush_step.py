"""Timing probe, H200: the GDN flush step alone, as the table plans it and in variants.

    source tools/device_env.sh; python3 tools/probe_gdn_flush_step.py [write_o|split]   # ~40 s on the GPU machine

"split" (session 27, the default): the three-term bf16 split of its products against the keys
(mma "bf16x3e") as shipped (inline PTX) and by Triton's conversions ("_cvt", session 26's), for
dual, fp32 and bf16 states; the flush step at depth 2 under a 200-register budget (dual: 5
programs per SM; the others' registers are below it); the dual flush step's small fp32 products
in Triton's "tf32x3" (before session 27's "bf16x6"; the other flush steps have none).
probe_flush_step_s27a.txt ran a third variant, the PTX marked impure, since removed, and no
"tf32x3" one (then the table's).

"write_o" (session 26): what the dual flush step would take without its
output rewrite, and under a register budget that this would let it fit.

The SPLIT replay step's second launch (_gdn_flush_step_kernel) folds the flushing rows and, for
dual states, rewrites their outputs from the folded high state (WRITE_O). Offline sm_90 compiles
(session 25) put the dual flush step at 254-255 registers with the rewrite and 168 without it,
no spill: 6 two-warp programs per SM instead of 4. This probe times, per step and layer, in a
CUDA graph of K steps over enough layers for 1 GiB of state (tools/tune_gdn.py's states,
cursors staggered): the output launch alone, the flush step alone as the table plans it, and
the flush step with WRITE_O off and / or a register budget. WRITE_O off is NOT a correct step
under the reference's semantics (the flushing rows keep the output launch's, which skips
them): the outputs are not checked. What it measures is how much the rewrite costs, i.e.
whether the semantics change that would drop it (flush-step outputs from the low copy, as
every other step) could pay for the output launch's extra reads of the flushing rows."""
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tune_gdn as T  # noqa: E402

_CVT = {"F_FOLD_PREC": "bf16x3e_cvt", "F_P_PREC": "bf16x3e_cvt"}
SPLIT = {   # name: (config over the table's row, WRITE_O); P_PREC is the dual flush step's only
    "table": ({}, True),
    "split by Triton's conversions": (_CVT, True),
    "depth 2, maxnreg 200": ({"F_num_stages": 2, "F_maxnreg": 200}, True),
    "small products tf32x3": ({"F_SMALL_PREC": "tf32x3"}, True),
}
WRITE_O = {   # name: (config over the table's row, WRITE_O)
    "table": ({}, True),
    "table, maxnreg 168": ({"F_maxnreg": 168}, True),
    "no WRITE_O": ({}, False),
    "no WRITE_O, maxnreg 168": ({"F_maxnreg": 168}, False),
    "no WRITE_O, maxnreg 128": ({"F_maxnreg": 128}, False),
}
# variant set name: (variants, cases (model, mode, batch))
SETS = {
    "split": (SPLIT, [(m, mode, 256) for mode in ("dual-bf16", "f32", "bf16") for m in ("q122b", "q4b")]
              + [("q122b", "dual-bf16", 512)]),
    "write_o": (WRITE_O, [("q122b", "dual-bf16", 256), ("q4b", "dual-bf16", 256), ("q122b", "dual-bf16", 512)]),
}


def run(model: str, mode: str, batch: int, variants: dict) -> None:
    layers, x, idx, o, nl = T.probe_layers(model, mode, batch)
    base = [T.plans_for("replay", {}, rs, x, idx, o) for rs in layers]
    for p in base:       # the scratch (nxt) the flush step reads: one output launch per layer
        T.launch([p[0]])

    us = T.time_graph(T.launch_only(base, 0)) / (T.K * nl)
    print(f"{model} {mode} b{batch} {'output launch only':34s} {us:8.1f} us", flush=True)
    for name, (cfg, write_o) in variants.items():
        plans = [T.plans_for("replay", cfg, rs, x, idx, o) for rs in layers]
        for p in plans:
            p[1][3]["WRITE_O"] = write_o
        try:
            us = T.time_graph(T.launch_only(plans, 1)) / (T.K * nl)
            print(f"{model} {mode} b{batch} flush step, {name:28s} {us:8.1f} us", flush=True)
        except Exception as e:     # a variant that does not compile is reported, the rest go on
            print(f"{model} {mode} b{batch} flush step, {name:28s} FAIL {type(e).__name__}: {e}", flush=True)


if __name__ == "__main__":
    which = sys.argv[1] if len(sys.argv) > 1 else "split"
    if which not in SETS:
        sys.exit(f"probe_gdn_flush_step.py: unknown variant set {which!r}; allowed: {', '.join(SETS)}")
    variants, cases = SETS[which]
    T.run_probe(functools.partial(run, variants=variants), cases)
