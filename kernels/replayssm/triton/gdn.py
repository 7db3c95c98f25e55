"""Transitional: the GDN kernels live in replayssm.gdn. Kept only for replaybench.traffic's call
of route_period with its old positional signature; remove once it calls replayssm.gdn.route_period."""
from __future__ import annotations

from ..gdn import route_period as _route_period
from ..gdn.options import GDNOptions

DUAL_ROUTE_HEADS = GDNOptions().dual_route_heads


def route_period(batch: int, dv: int, dk: int, buffer_len: int, read_bytes: int, flush_period: int,
                 config: dict | None = None, dual: bool = False, heads: int | None = None) -> int:
    options = GDNOptions().override("replay", **config) if config else None
    return _route_period(batch=batch, heads=heads, head_dim=dv, key_dim=dk, buffer_len=buffer_len,
                         read_bytes=read_bytes, flush_period=flush_period, dual=dual, options=options)
