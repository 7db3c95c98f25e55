"""PerdraftOptions: the per-draft ops' per-family overrides of the launch table (tuning)."""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import ClassVar

from ..common.table import Options


@dataclass(frozen=True)
class PerdraftOptions(Options):
    """.override("gdn" | "mamba2", BLOCK_R=..., num_warps=...) replaces the picked row's params."""

    TUNABLE: ClassVar = MappingProxyType({"mamba2": frozenset({"BLOCK_R", "num_warps"}),
                                          "gdn": frozenset({"BLOCK_R", "num_warps"})})
