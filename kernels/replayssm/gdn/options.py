"""GDNOptions: the GDN ops' knobs, frozen and passed explicitly (`options=`)."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from ..common.table import Options, Table
from .table import PARAMS

# per-op tuning keys: the table's params; replay and commit also take the flush step's as "F_<KEY>"
_TUNABLE = {op: frozenset(keys) for op, keys in PARAMS.items() if op != "flush_step"}
for _op in ("replay", "commit"):
    _TUNABLE[_op] = _TUNABLE[_op] | {f"F_{k}" for k in PARAMS["flush_step"]}


@dataclass(frozen=True)
class GDNOptions(Options):
    """pdl: chain an op's launches as programmatic dependents where the GPU has them (launch.pdl_meta).
    small_batch_route: let small batches take the table's route rows (off: every step buffers, as
    tests of the buffered state layout need). dual_route_heads: a dual state's step routes while
    batch x value heads is at most this. verify_f32_precision: the verify's products with fp32
    operands, "split" (mma.split_precision) or one mma precision for all of them. table: the
    launch table to pick rows from (None: the shipped table.TABLE).
    overrides (via .override(op, **params)): params that replace the picked table row's."""

    TUNABLE: ClassVar = MappingProxyType(_TUNABLE)
    pdl: bool = True
    small_batch_route: bool = True
    dual_route_heads: int = 512
    verify_f32_precision: str = "split"
    table: Table | None = None
