"""Random decode inputs and layer parameters at given dims (tests, runners, benchmarks).

Values are drawn to look like a trained layer's decode traffic: dt_raw so that softplus
lands around 0.01-0.5, A in [-8, -1], GDN gates with alpha in (0.9, 1) and beta in (0, 1).
Never zeros: they hide unwritten outputs and wrong indexing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Mamba2Shape:
    nheads: int
    head_dim: int
    d_state: int
    n_groups: int


@dataclass(frozen=True)
class GDNShape:
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int


def mamba2_params(shape: Mamba2Shape, device="cpu", dtype=torch.float32, gen=None) -> dict:
    """Per-layer parameters: A [H] (< 0), D [H], dt_bias [H]."""
    H = shape.nheads
    r = lambda *s: torch.rand(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    return {"A": (-(1 + 7 * r(H))).to(device=device, dtype=dtype),
            "D": (0.5 + r(H)).to(device=device, dtype=dtype),
            "dt_bias": (-3 + 2 * r(H)).to(device=device, dtype=dtype)}


def mamba2_step_inputs(shape: Mamba2Shape, batch: int, T: int | None = None, act_dtype=torch.bfloat16,
                       device="cpu", gate=True, gen=None) -> dict:
    """Inputs of one step (T None) or of T drafts: x [b,(T,)H,P], dt [b,(T,)H], B/C [b,(T,)G,N], z."""
    lead = (batch,) if T is None else (batch, T)
    n = lambda *s: torch.randn(*lead, *s, generator=gen, dtype=torch.float64)  # noqa: E731
    out = {"x": n(shape.nheads, shape.head_dim), "dt": n(shape.nheads) * 0.5,
           "B": n(shape.n_groups, shape.d_state) / shape.d_state ** 0.5,
           "C": n(shape.n_groups, shape.d_state) / shape.d_state ** 0.5,
           "z": n(shape.nheads, shape.head_dim) if gate else None}
    return {k: (v.to(device=device, dtype=torch.float32 if k == "dt" and act_dtype != torch.float64 else act_dtype)
                if v is not None else None) for k, v in out.items()}


def gdn_step_inputs(shape: GDNShape, batch: int, T: int | None = None, act_dtype=torch.bfloat16,
                    device="cpu", gen=None) -> dict:
    """q/k [b,(T,)Hk,dk], v [b,(T,)Hv,dv], g [b,(T,)Hv] (log alpha), beta [b,(T,)Hv]."""
    lead = (batch,) if T is None else (batch, T)
    n = lambda *s: torch.randn(*lead, *s, generator=gen, dtype=torch.float64)  # noqa: E731
    r = lambda *s: torch.rand(*lead, *s, generator=gen, dtype=torch.float64)  # noqa: E731
    gf = torch.float64 if act_dtype == torch.float64 else torch.float32
    return {"q": n(shape.num_k_heads, shape.head_k_dim).to(device=device, dtype=act_dtype),
            "k": n(shape.num_k_heads, shape.head_k_dim).to(device=device, dtype=act_dtype),
            "v": n(shape.num_v_heads, shape.head_v_dim).to(device=device, dtype=act_dtype),
            "g": torch.log(0.9 + 0.1 * r(shape.num_v_heads)).to(device=device, dtype=gf),
            "beta": (0.05 + 0.9 * r(shape.num_v_heads)).to(device=device, dtype=gf)}


def random_state(slots: int, heads: int, rows: int, cols: int, dtype=torch.float32, device="cpu", gen=None,
                 scale: float = 0.5) -> torch.Tensor:
    """A non-zero recurrent state [slots, heads, rows, cols].

    Drawn on the generator's device (a GPU generator makes GiB-sized states quickly), in
    float64 only when float64 is asked for."""
    where = gen.device if gen is not None else device
    draw = torch.float64 if dtype == torch.float64 else torch.float32
    s = torch.randn(slots, heads, rows, cols, generator=gen, dtype=draw, device=where)
    return (s * scale).to(device=device, dtype=dtype)
