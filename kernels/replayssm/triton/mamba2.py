"""Transitional: the suite's old entry point for the Mamba-2 route period (replaybench.traffic
and its tests). The kernels, table and options live in replayssm.mamba2; call
replayssm.mamba2.route_period(..., options=Mamba2Options(...)) instead. Delete this module once
nothing imports it."""
from __future__ import annotations

from ..mamba2.options import Mamba2Options
from ..mamba2.route import route_period as _route_period

SMALL_BATCH_ROUTE = True                # read by route_period below only
OVERRIDE: dict[str, dict] = {}          # {"replay": {...}}: options.override("replay", ...)
ROUTE_BATCH = {4: 4, 2: 16}             # the largest routed batch per read bytes (mamba2.table's route rows)


def route_period(P: int, read_bytes: int, batch: int, nheads: int, flush_period: int, dual: bool = False,
                 hi_bytes: int = 4) -> int:
    o = Mamba2Options(small_batch_route=SMALL_BATCH_ROUTE)
    if OVERRIDE.get("replay"):
        o = o.override("replay", **OVERRIDE["replay"])
    return _route_period(batch=batch, heads=nheads, head_dim=P, read_bytes=read_bytes, flush_period=flush_period,
                         dual=dual, hi_bytes=hi_bytes, options=o)
