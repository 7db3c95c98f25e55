"""Acceptance models for speculative decoding: how many of a round's T verified tokens a
sequence commits (0..T), per sequence and round.

Scenario values (the ``accept`` sweep axis; default "fixed:T/2"):

    m (an integer) or "fixed:<m>"   every sequence commits m tokens every round (m <= T)
    "fixed:T/2", "fixed:T"          the same with m = floor(T/2) or T (resolved per window)
    "uniform"                        m uniform on 0..T, drawn per sequence and round (seeded)
    "geom:<p>"                       each token accepted with probability p until the first
                                     rejection: P(m = k) = p^k (1 - p) for k < T, P(m = T) = p^T

A case carries the resolved form ("fixed:2", "uniform", "geom:0.7"). The expected accepted
count (mean_accepted) and the distribution (pmf) feed the traffic model; draws (draw_accepted)
are seeded so a case is reproducible. Imports neither torch nor triton.
"""
from __future__ import annotations

import re

DEFAULT = "fixed:T/2"
ALLOWED = ('an integer m >= 0 or "fixed:<m>" (m accepted every round, m <= spec_window), '
           '"fixed:T/2", "fixed:T", "uniform" (0..T), or "geom:<p>" with 0 < p < 1')
_FIXED = re.compile(r"^fixed:(\d+|T|T/2)$")
_GEOM = re.compile(r"^geom:([0-9]*\.?[0-9]+(?:[eE][-+]?\d+)?)$")


def parse_accept(value) -> str:
    """Normalise a scenario value (int or string) to its window-independent form; ValueError
    (message: the allowed forms) when it is none of them."""
    if isinstance(value, bool):
        raise ValueError(f"invalid value {value!r}; allowed: {ALLOWED}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"invalid value {value!r}; allowed: {ALLOWED}")
        return f"fixed:{value}"
    if isinstance(value, str):
        s = value.strip()
        if s == "uniform" or _FIXED.match(s):
            return s
        m = _GEOM.match(s)
        if m:
            p = float(m.group(1))
            if 0.0 < p < 1.0:
                return f"geom:{p:g}"
    raise ValueError(f"invalid value {value!r}; allowed: {ALLOWED}")


def resolve_accept(value, T: int) -> str:
    """The case form for window T: "fixed:<m>" (m <= T), "uniform" or "geom:<p>"."""
    s = parse_accept(value)
    if s.startswith("fixed:"):
        arg = s.split(":", 1)[1]
        m = T // 2 if arg == "T/2" else T if arg == "T" else int(arg)
        if m > T:
            raise ValueError(f"accept {value!r}: {m} accepted tokens per round > spec_window {T}")
        return f"fixed:{m}"
    return s


def accept_pmf(accept: str, T: int) -> list[float]:
    """P(m = k), k = 0..T, of a (resolvable) acceptance model."""
    s = resolve_accept(accept, T)
    if s.startswith("fixed:"):
        m = int(s.split(":")[1])
        return [1.0 if k == m else 0.0 for k in range(T + 1)]
    if s == "uniform":
        return [1.0 / (T + 1)] * (T + 1)
    p = float(s.split(":")[1])
    return [p ** k * (1 - p) for k in range(T)] + [p ** T]


def mean_accepted(accept: str, T: int) -> float:
    return sum(k * q for k, q in enumerate(accept_pmf(accept, T)))


def draw_accepted(accept: str, T: int, batch: int, rounds: int, seed: int = 0):
    """numpy int32 [rounds, batch] of accepted counts drawn from the model (seeded)."""
    import numpy as np
    pmf = np.asarray(accept_pmf(accept, T), dtype=np.float64)
    if pmf.max() == 1.0:
        return np.full((rounds, batch), int(pmf.argmax()), dtype=np.int32)
    rng = np.random.default_rng(seed)
    return rng.choice(T + 1, size=(rounds, batch), p=pmf / pmf.sum()).astype(np.int32)
