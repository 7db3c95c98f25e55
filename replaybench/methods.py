"""The method registry: every decode method the suite knows, and what each one is.

One entry per method; every set of methods a module needs (the buffered ones, the speculative
ones, those the layer runner builds, those the report compares against eager, ...) is derived
from these entries with :func:`names`, never written out again. A new method is one entry here
(and its kernels); tests/replaybench/test_methods.py fails on a literal method set elsewhere.

Fields:
    measures        what one row of the method times (one line, for docs and ``--help``)
    traffic         the traffic model (replaybench.traffic.step_traffic): 'eager' (read + write
                    the state), 'replay' (checkpoint + input buffer, averaged over a flush period),
                    'spec-replay' (verify T from checkpoint + buffer, commit m), 'spec-perdraft'
                    (the state written after every draft, 1 + T slots)
    runner          the module of replaybench.runners that times it under the 'kernel' runner:
                    'kernel' (one decode step), 'spec' (verify + commit rounds), 'peers' (vLLM)
    peer            '' for our kernels (replayssm); 'vllm' for vLLM's own kernels (backend 'vllm')
    precision       state precision kind: 'single' (one copy, state_dtype), 'dual' (float32 high
                    copy for flushes + a low copy, lo_dtype, the steps read), 'shared-low' (one
                    low-precision checkpoint: state_dtype := lo_dtype)
    buffer          keeps an input buffer (buffer_len, flush_period axes apply)
    spec            speculative: spec_window T in 1..8, an acceptance model
    layer           the decode-layer runner (replayssm.layers) builds it
    e2e             served end to end in vLLM by runners/e2e.py (the stock engine, or ours plugged in)
    vs_eager        the report gives its speedup over eager of the same run
    paper_baseline  the vLLM method it is divided by in the paper-style figure ('' none)
    memory_label    its label in the SSM-memory table (methods with one are that table's default set)
    color           its colour in every figure (fixed: regenerated figures keep their colours)
"""
from __future__ import annotations

from dataclasses import dataclass, fields

FAMILIES = ("mamba2", "gdn")
TRAFFIC_MODELS = ("eager", "replay", "spec-replay", "spec-perdraft")
PRECISIONS = ("single", "dual", "shared-low")

# roles other modules name: the baseline of each comparison
EAGER = "eager"                  # our eager step: the baseline of every speedup
PEER_EAGER = "vllm-eager"        # vLLM's eager kernel: the peer of the roofline / peer table
SPEC_BASELINE = "spec-perdraft"  # per-draft slots: the baseline of the speculative tables


@dataclass(frozen=True)
class Method:
    name: str
    measures: str
    traffic: str
    runner: str = "kernel"
    peer: str = ""
    precision: str = "single"
    buffer: bool = False
    spec: bool = False
    layer: bool = False
    e2e: bool = False
    vs_eager: bool = False
    paper_baseline: str = ""
    memory_label: str = ""
    color: str = "#000000"
    families: tuple[str, ...] = FAMILIES

    @property
    def ours(self) -> bool:
        """Our kernels (replayssm), not a peer's."""
        return not self.peer

    @property
    def vllm(self) -> bool:
        return self.peer == "vllm"

    @property
    def lo(self) -> bool:
        """Takes a low-precision dtype (lo_dtype)."""
        return self.precision != "single"

    @property
    def shared_low(self) -> bool:
        return self.precision == "shared-low"

    @property
    def needs_fp32_state(self) -> bool:
        """The high copy of a dual-precision method is float32."""
        return self.precision == "dual"

    @property
    def mode(self) -> str:
        """The replay-state mode of replayssm.state ('replay' | 'dual' | 'shared-low'), '' for a
        method without a checkpoint + buffer."""
        if not self.buffer:
            return ""
        return {"single": "replay", "dual": "dual", "shared-low": "shared-low"}[self.precision]


_M = Method
METHODS: dict[str, Method] = {m.name: m for m in [
    _M("eager", "one decode step that reads and writes the whole state (our Triton kernel)",
       traffic="eager", layer=True, paper_baseline="vllm-eager", memory_label="eager (no speculation)",
       color="#1f77b4"),
    _M("replay", "one decode step from checkpoint + input buffer; the state is written once per flush period",
       traffic="replay", buffer=True, layer=True, e2e=True, vs_eager=True, paper_baseline="vllm-eager",
       color="#d62728"),
    _M("replay-dual", "replay with a float32 checkpoint for the flushes and a low-precision copy the steps read",
       traffic="replay", precision="dual", buffer=True, layer=True, e2e=True, vs_eager=True,
       paper_baseline="vllm-eager", color="#2ca02c"),
    _M("replay-shared-low", "replay with one low-precision checkpoint (state_dtype := lo_dtype)",
       traffic="replay", precision="shared-low", buffer=True, layer=True, vs_eager=True, color="#9467bd"),
    _M("spec-replay", "one speculative round: verify T drafts from checkpoint + buffer, commit m (a cursor move)",
       traffic="spec-replay", runner="spec", buffer=True, spec=True, e2e=True, vs_eager=True,
       paper_baseline="vllm-spec", memory_label="ReplaySSM", color="#ff7f0e"),
    _M("spec-replay-dual", "spec-replay with a float32 checkpoint and a low-precision copy verify reads",
       traffic="spec-replay", runner="spec", precision="dual", buffer=True, spec=True, vs_eager=True,
       memory_label="ReplaySSM dual", color="#bcbd22"),
    _M("spec-perdraft", "one speculative round, the state written after every draft into 1 + T slots per request",
       traffic="spec-perdraft", runner="spec", spec=True, vs_eager=True, paper_baseline="vllm-spec",
       memory_label="per-draft slots (vLLM)", color="#8c564b"),
    _M("vllm-eager", "vLLM's own eager decode kernel, called as its model layers call it",
       traffic="eager", runner="peers", peer="vllm", e2e=True, color="#7f7f7f"),
    _M("vllm-spec", "vLLM's own speculative decode kernel (1 + T slots per request)",
       traffic="spec-perdraft", runner="peers", peer="vllm", spec=True, e2e=True, color="#17becf"),
]}

_FIELDS = {f.name for f in fields(Method)}


def get(name: str) -> Method:
    """The method called `name`; ValueError naming the allowed names."""
    try:
        return METHODS[name]
    except (KeyError, TypeError):
        raise ValueError(f"unknown method {name!r}; allowed: {', '.join(METHODS)}") from None


def names(**where) -> tuple[str, ...]:
    """Method names in registry order whose fields / properties equal the given values, e.g.
    ``names(buffer=True)``, ``names(traffic="replay", ours=True)``; a value may be a tuple of
    allowed values."""
    for k in where:
        if k not in _FIELDS and not isinstance(getattr(Method, k, None), property):
            raise ValueError(f"unknown method attribute {k!r}")
    out = []
    for m in METHODS.values():
        if all((getattr(m, k) in v) if isinstance(v, tuple) else getattr(m, k) == v for k, v in where.items()):
            out.append(m.name)
    return tuple(out)


def order(name: str) -> int:
    """Position in the registry (figures and tables sort methods by it); unknown names last."""
    keys = list(METHODS)
    return keys.index(name) if name in keys else len(keys)


def colors() -> dict[str, str]:
    return {m.name: m.color for m in METHODS.values()}


def _check_registry() -> None:
    for m in METHODS.values():
        assert m.traffic in TRAFFIC_MODELS, m
        assert m.precision in PRECISIONS, m
        assert m.runner in ("kernel", "spec", "peers"), m
        assert not m.paper_baseline or METHODS[m.paper_baseline].vllm, m
    assert len({m.color for m in METHODS.values()}) == len(METHODS)


_check_registry()
