"""plan(op, ...): the launches one Mamba-2 op makes for a case, as Launch records (kernel, grid,
args, meta and the table row that chose them), without running them. Inputs may live on the
'meta' device (no memory, no GPU): that is how `explain` and the offline sm_90 compile use it."""
from __future__ import annotations

from ..common.launch import Launch
from ..common.offline import compile_launch
from .eager import plan_eager
from .fold import plan_commit, plan_cursor, plan_flush
from .host import run  # noqa: F401 (the public ops run plans with it)
from .options import Mamba2Options
from .replay import plan_replay, step_params
from .route import route_period  # noqa: F401
from .spec import plan_verify

OPS = ("eager", "replay", "advance_cursors", "flush", "verify", "commit")


def plan(op: str, *args, options: Mamba2Options | None = None, **kw) -> list[Launch]:
    """The launches of `op` with the public op's arguments (replayssm.mamba2.<op>, less
    backend / counter), in launch order:
        plan("eager", state, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None)
        plan("replay", rs, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None, advance=True)
        plan("advance_cursors", rs, batch, state_indices=None)
        plan("flush", rs, A, slots=None)
        plan("verify", rs, x, dt, A, B, C, D, dt_bias, z=None, state_indices=None)
        plan("commit", rs, A, accepted, state_indices=None)"""
    if op == "eager":
        return plan_eager(*args, options=options, **kw)[0]
    if op == "replay":
        return plan_replay(*args, options=options, **kw)[0]
    if op == "advance_cursors":
        rs, batch, *rest = args
        idx = rest[0] if rest else kw.pop("state_indices", None)
        return plan_cursor(rs, idx, batch, 0, options=options)
    if op == "flush":
        return plan_flush(*args, options=options, **kw)
    if op == "verify":
        return plan_verify(*args, options=options, **kw)[0]
    if op == "commit":
        return plan_commit(*args, options=options, **kw)
    raise ValueError(f"unknown Mamba-2 op {op!r}; allowed: {', '.join(OPS)}")


def explain(launches: list[Launch]) -> list[dict]:
    """What the launches run: kernel, grid, tile meta and table row of each (Launch.describe)."""
    return [launch.describe() for launch in launches]


def compile_offline(launch: Launch, arch: int = 90, asm: bool = False) -> dict:
    """A recorded launch compiled for CUDA sm_<arch> without a GPU (common.offline.compile_launch:
    'regs', 'spill_stores', 'spill_loads', ...; 'asm' with asm=True). Needs TRITON_INTERPRET unset."""
    return compile_launch(launch.kernel, launch.args, launch.meta, arch, asm)


def state_route_period(rs, x, options: Mamba2Options | None = None) -> int:
    """The small-batch route's period for an advancing step of `rs` with inputs x [b, H, P]
    (route.route_period at the state's case)."""
    v = step_params(rs, x, options)
    return min(v["route_k"], rs.flush_period) if v["route"] == "eager" else 0
