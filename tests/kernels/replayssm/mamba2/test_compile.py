"""The Mamba-2 kernels compiled for sm_90 offline (Triton's LLVM and bundled ptxas, no GPU) at
real dims with the shipped table: registers, spills, occupancy; and a PTX property of the step."""
from __future__ import annotations

import pytest

from kernel_checks import spills_allowed

_OFFLINE = r"""
import json, os
os.environ.pop("TRITON_INTERPRET", None)
import torch
from replayssm import inputs as I
from replayssm.state import Mamba2ReplayState
from replayssm.mamba2 import eager, fold, replay, spec
from replayssm.mamba2.options import Mamba2Options
from replayssm.mamba2.plan import compile_offline
from replayssm.mamba2.table import LEAN

sh, dev, b = I.Mamba2Shape(96, 80, 128, 8), "meta", 256     # Nemotron-3-Nano-4B, large bucket
p = {k: v.to(dev) for k, v in I.mamba2_params(sh).items()}
inp = lambda act, T=None: {k: v.to(dev) for k, v in I.mamba2_step_inputs(sh, b, T=T, act_dtype=act).items()}
idx = torch.zeros(b, dtype=torch.int32, device=dev)
acc = torch.zeros(b, dtype=torch.int32, device=dev)
st = lambda dt: torch.zeros(b, 96, 80, 128, dtype=dt, device=dev)
rs = lambda mode, lo=None, act=torch.bfloat16, K=16, L=16, sd="float32": Mamba2ReplayState.allocate(
    b, 96, 80, 128, 8, L, K, mode=mode, state_dtype=sd, lo_dtype=lo, act_dtype=act, device=dev)
plans = {
    "eager fp32": eager.plan_eager(st(torch.float32), **inp(torch.bfloat16), **p, state_indices=idx)[0],
    "eager bf16": eager.plan_eager(st(torch.bfloat16), **inp(torch.bfloat16), **p, state_indices=idx)[0],
    "replay fp32": replay.plan_replay(rs("replay"), **inp(torch.bfloat16), **p, state_indices=idx)[0],
    "replay dual fp8": replay.plan_replay(rs("dual", "float8_e4m3"), **inp(torch.bfloat16), **p,
                                           state_indices=idx)[0],
    "replay dual bf16": replay.plan_replay(rs("dual", "bfloat16"), **inp(torch.bfloat16), **p, state_indices=idx)[0],
    "replay bf16": replay.plan_replay(rs("replay", sd="bfloat16"), **inp(torch.bfloat16), **p, state_indices=idx)[0],
    "replay fp32 acts (tf32x3)": replay.plan_replay(rs("replay", act=torch.float32), **inp(torch.float32), **p,
                                                     state_indices=idx, advance=False)[0],
    "commit dual bf16": fold.plan_commit(rs("dual", "bfloat16", K=16, L=20), p["A"], acc, idx),
    # batch 128: the listed commit, both launches programmatic dependents (PDL)
    "commit fp32 b128 listed": fold.plan_commit(rs("replay", K=16, L=20), p["A"], acc[:128], idx[:128]),
    "verify T4 fp32 (64 + 16 rows)": spec.plan_verify(rs("replay", K=16, L=20), **inp(torch.bfloat16, T=4), **p,
                                                     state_indices=idx)[0],
    "verify T4 dual bf16 (64 + 16 rows)": spec.plan_verify(rs("dual", "bfloat16", K=16, L=20),
                                                         **inp(torch.bfloat16, T=4), **p, state_indices=idx)[0],
    "verify T4 dual fp8": spec.plan_verify(rs("dual", "float8_e4m3", K=16, L=20), **inp(torch.bfloat16, T=4), **p,
                                         state_indices=idx)[0],
}
plans["refresh lo dual fp8"] = fold.plan_refresh_lo(rs("dual", "float8_e4m3"), idx, b)   # a routed dual state's verify
# batch 4: the shipped small-batch routes (fp32: the deferred route, 8 x 1, period 2; dual: every step at batch 2)
plans["replay fp32 b4 deferred route"] = replay.plan_replay(rs("replay"), **{k: v[:4] for k, v in inp(
    torch.bfloat16).items()}, **p, state_indices=idx[:4])[0]
plans["replay dual bf16 b2 route"] = replay.plan_replay(rs("dual", "bfloat16"), **{k: v[:2] for k, v in inp(
    torch.bfloat16).items()}, **p, state_indices=idx[:2])[0]
o = Mamba2Options().override("verify", gram=True)     # the verify's Gram pre-pass (opt-in)
plans["verify T4 fp32 gram"] = spec.plan_verify(rs("replay", K=16, L=20), **inp(torch.bfloat16, T=4), **p,
                                                state_indices=idx, options=o)[0]
plans["verify T4 dual bf16 gram"] = spec.plan_verify(rs("dual", "bfloat16", K=16, L=20), **inp(torch.bfloat16, T=4),
                                                     **p, state_indices=idx, options=o)[0]
# Nemotron-3-Super-120B (64-row heads: whole-head programs)
sh = I.Mamba2Shape(128, 64, 128, 8)
p = {k: v.to(dev) for k, v in I.mamba2_params(sh).items()}
rs2 = lambda mode, lo=None, sd="float32": Mamba2ReplayState.allocate(b, 128, 64, 128, 8, 16, 16, mode=mode,
                                                                     state_dtype=sd, lo_dtype=lo,
                                                                     act_dtype=torch.bfloat16, device=dev)
plans["super replay fp32"] = replay.plan_replay(rs2("replay"), **inp(torch.bfloat16), **p, state_indices=idx)[0]
plans["super replay dual bf16"] = replay.plan_replay(rs2("dual", "bfloat16"), **inp(torch.bfloat16), **p,
                                                      state_indices=idx)[0]
plans["super replay bf16"] = replay.plan_replay(rs2("replay", sd="bfloat16"), **inp(torch.bfloat16), **p,
                                                 state_indices=idx)[0]
plans["super eager bf16"] = eager.plan_eager(torch.zeros(b, 128, 64, 128, dtype=torch.bfloat16, device=dev),
                                               **inp(torch.bfloat16), **p, state_indices=idx)[0]
o = Mamba2Options().override("replay", route="eager", block_p=32, warps=4)     # the route at any batch
plans["super replay eager route fp32"] = replay.plan_replay(rs2("replay"), **inp(torch.bfloat16), **p,
                                                            state_indices=idx, options=o)[0]
plans["super replay eager route dual bf16"] = replay.plan_replay(rs2("dual", "bfloat16"), **inp(torch.bfloat16),
                                                                 **p, state_indices=idx, options=o)[0]
o = Mamba2Options().override("replay", **LEAN, pf=1)     # the lean step with the state tile's L2 hint (tuning)
plans["super replay fp32 pf1"] = replay.plan_replay(rs2("replay"), **inp(torch.bfloat16), **p, state_indices=idx,
                                                    options=o)[0]
plans["super replay dual bf16 pf1"] = replay.plan_replay(rs2("dual", "bfloat16"), **inp(torch.bfloat16), **p,
                                                         state_indices=idx, options=o)[0]
out = {}
for name, launches in plans.items():
    for launch in launches:
        r = compile_offline(launch)
        r["warps"] = launch.meta["num_warps"]
        out[f"{name}: {launch.name}"] = r
print(json.dumps(out))
"""


# Launches that the table ships although ptxas spills (bytes of spill stores / loads allowed):
# each ran faster on the H200 as compiled than the spill-free alternative (the table rows' why).
# Nano's dual bf16 whole-head verify (128 registers, 8 programs an SM); Nano's dual fp8 step in
# 32-row programs (row-scaled copies fold whole rows); the 16-bit steps under their register
# budgets, whose spills are all in the flushing programs' fold.
SPILL_ALLOWED = {"verify T4 dual bf16 (64 + 16 rows)": 12, "replay dual fp8": 72, "super replay dual bf16": 96,
                 "replay dual bf16": 4, "super replay bf16": 16, "replay bf16": 16}
# Per Triton minor version, where a newer allocator spills a little more than 3.6 (the GPU
# machine's): 3.7 in the opt-in Gram pre-pass's dual verify (not a table route).
SPILL_ALLOWED_BY_TRITON = {"3.7.": {"verify T4 dual bf16 gram": 4}}


def _offline_json(script: str) -> dict:
    """Run an offline sm_90 compile script (Triton's LLVM + bundled ptxas, no GPU) in a process
    of its own, without TRITON_INTERPRET; its last stdout line, as JSON. Skips where Triton
    has no bundled ptxas."""
    import json
    import os
    import subprocess
    import sys

    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not os.path.exists(ptxas):
        pytest.skip("Triton's bundled ptxas is not available")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_compiles_for_sm90():
    """Every kernel compiles for sm_90 at real dims (Triton's LLVM + bundled ptxas, no GPU)
    with the launch table's configs: no register spills (but those of SPILL_ALLOWED), and at
    least 4 programs fit on an SM (65536 registers, 2048 threads), which the tuned configs were
    measured with."""
    report = _offline_json(_OFFLINE)
    spills = spills_allowed(SPILL_ALLOWED, SPILL_ALLOWED_BY_TRITON)
    for name, r in report.items():
        allowed = spills.get(name.split(":")[0], 0)
        assert r["spill_stores"] <= allowed and r["spill_loads"] <= allowed, f"{name} spills: {r}"
        assert r["regs"] is not None, name
        threads = 32 * r["warps"]
        assert min(2048 // threads, 65536 // (threads * r["regs"])) >= 4, f"{name}: {r}"


_OFFLINE_FOLD_WAIT = r"""
import json, os
os.environ.pop("TRITON_INTERPRET", None)
import torch
from replayssm import inputs as I
from replayssm.state import Mamba2ReplayState
from replayssm.mamba2 import eager, fold, replay, spec
from replayssm.mamba2.options import Mamba2Options
from replayssm.mamba2.plan import compile_offline
from replayssm.mamba2.table import LEAN

sh, dev, b = I.Mamba2Shape(128, 64, 128, 8), "meta", 256     # Nemotron-3-Super-120B, a coef row
p = {k: v.to(dev) for k, v in I.mamba2_params(sh).items()}
inp = {k: v.to(dev) for k, v in I.mamba2_step_inputs(sh, b, act_dtype=torch.bfloat16).items()}
idx = torch.zeros(b, dtype=torch.int32, device=dev)
out = {}
for wait in (True, False):
    o = Mamba2Options().override("replay", fold_wait=wait)
    rs = Mamba2ReplayState.allocate(b, 128, 64, 128, 8, 16, 16, mode="dual", lo_dtype="bfloat16",
                                    act_dtype=torch.bfloat16, device=dev)
    step = [ln for ln in replay.plan_replay(rs, **inp, **p, state_indices=idx, options=o)[0]
            if ln.name == "_replay_step_kernel"][0]
    assert step.meta["PRE_COEF"] and step.meta["GDC"], step.meta
    out[str(wait)] = compile_offline(step, asm=True)["asm"]["ptx"].count("griddepcontrol.wait")
print(json.dumps(out))
"""


def test_flushing_programs_wait_for_the_prepass():
    """The step behind the coef / B_i . C pre-pass (a programmatic dependent launch) waits for it
    in its flushing programs too (FOLD_WAIT), not only in the output route, so that a step whose
    sequences all flush still cannot finish before the pre-pass: the sm_90 PTX of the shipped Super
    dual bf16 b256 step holds more grid-dependency waits with the knob than without."""
    waits = _offline_json(_OFFLINE_FOLD_WAIT)
    assert waits["False"] >= 1 and waits["True"] > waits["False"], waits
