"""The one launch-table schema of the kernel families (mamba2, gdn).

A family's launch table is a `Table` of `Row`s. A row names an op (the launch it tunes: "eager",
"replay", "fold", "verify", ...), the cases it applies to (conditions; None = any) and the
tile parameters it hands to the planner. `Table.pick(op, **case)` returns the first row of
that op, in table order, whose conditions hold, so a table lists its special cases first and
ends each op with a catch-all row. Every row says in one line why it exists and names the
committed run that measured it.

Knobs are not module globals: a family's options object (a frozen `Options` subclass) is passed
explicitly to its ops and planners; `Options.override(op, **params)` returns a copy whose
params replace the picked row's for that op (tuning), and rejects unknown ops and params.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, ClassVar, Mapping

_RANGES = ("batch", "work")


class Case(Mapping):
    """The case a row is picked for: keyword values (batch, heads, head_dim, state_bytes, dual,
    ...), read by key or attribute. `work` (batch x heads) is derived when not given."""

    def __init__(self, **kw):
        if "work" not in kw and "batch" in kw and "heads" in kw:
            kw["work"] = kw["batch"] * kw["heads"]
        self._kw = kw

    def __getitem__(self, k):
        return self._kw[k]

    def __iter__(self):
        return iter(self._kw)

    def __len__(self):
        return len(self._kw)

    def __getattr__(self, k):
        try:
            return self._kw[k]
        except KeyError:
            raise AttributeError(k) from None

    def __repr__(self):
        return ", ".join(f"{k}={v!r}" for k, v in self._kw.items())


@dataclass(frozen=True)
class Row:
    """One launch choice. Conditions (None = any): state_bytes (bytes per element of the state
    copy the launch streams), batch and work (batch x heads) ranges, p_mod (the head dim is a
    multiple of it), dual (a dual state's launch or not), match (other case keys that must
    equal the given values) and `when` (a predicate on the Case, for anything else)."""

    name: str
    op: str
    params: Mapping = field(default_factory=dict)
    why: str = ""
    run: str = ""
    state_bytes: int | None = None
    min_batch: int | None = None
    max_batch: int | None = None
    min_work: int | None = None
    max_work: int | None = None
    p_mod: int | None = None
    dual: bool | None = None
    match: Mapping = field(default_factory=dict)
    when: Callable[[Case], bool] | None = None

    def __post_init__(self):
        if not self.name or not self.op:
            raise ValueError(f"table row needs a name and an op: {self!r}")
        object.__setattr__(self, "params", MappingProxyType(dict(self.params)))
        object.__setattr__(self, "match", MappingProxyType(dict(self.match)))

    def _need(self, case: Case, key: str):
        if key not in case:
            raise KeyError(f"table row {self.name!r} conditions on {key!r}, which the case ({case}) lacks")
        return case[key]

    def applies(self, case: Case) -> bool:
        """Whether every condition of the row holds for `case`."""
        if self.state_bytes is not None and self._need(case, "state_bytes") != self.state_bytes:
            return False
        for key in _RANGES:
            lo, hi = getattr(self, f"min_{key}"), getattr(self, f"max_{key}")
            if lo is not None or hi is not None:
                v = self._need(case, key)
                if (lo is not None and v < lo) or (hi is not None and v > hi):
                    return False
        if self.p_mod is not None and self._need(case, "head_dim") % self.p_mod:
            return False
        if self.dual is not None and bool(self._need(case, "dual")) != self.dual:
            return False
        if any(self._need(case, k) != v for k, v in self.match.items()):
            return False
        return self.when is None or bool(self.when(case))

    def conditions(self) -> str:
        """The row's conditions in words ("any" for a catch-all)."""
        parts = []
        if self.state_bytes is not None:
            parts.append(f"state_bytes={self.state_bytes}")
        for key in _RANGES:
            lo, hi = getattr(self, f"min_{key}"), getattr(self, f"max_{key}")
            if lo is not None or hi is not None:
                parts.append(f"{'' if lo is None else lo}<={key}<={'' if hi is None else hi}")
        if self.p_mod is not None:
            parts.append(f"head_dim%{self.p_mod}==0")
        if self.dual is not None:
            parts.append(f"dual={self.dual}")
        parts += [f"{k}={v!r}" for k, v in self.match.items()]
        if self.when is not None:
            parts.append(f"when={getattr(self.when, '__name__', 'predicate')}")
        return ", ".join(parts) or "any"


class Table:
    """A family's launch table: rows in pick order. Names are unique; `params` keys must be in
    `params_of[op]` where that is given (a misspelt key fails at import)."""

    def __init__(self, rows, params_of: Mapping[str, set] | None = None):
        self.rows = tuple(rows)
        seen = set()
        for r in self.rows:
            if not isinstance(r, Row):
                raise TypeError(f"table rows must be Row, got {type(r).__name__}")
            if r.name in seen:
                raise ValueError(f"duplicate table row name {r.name!r}")
            seen.add(r.name)
            if params_of is not None:
                if r.op not in params_of:
                    raise ValueError(f"table row {r.name!r}: unknown op {r.op!r}; known: {', '.join(params_of)}")
                bad = set(r.params) - set(params_of[r.op])
                if bad:
                    raise ValueError(f"table row {r.name!r}: unknown params {sorted(bad)} for op {r.op!r}; "
                                     f"allowed: {sorted(params_of[r.op])}")
        self._by_name = {r.name: r for r in self.rows}

    def ops(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(r.op for r in self.rows))

    def rows_for(self, op: str) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.op == op)

    def row(self, name: str) -> Row:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"no table row named {name!r}") from None

    def pick(self, op: str, **case) -> Row:
        """The first row of `op` whose conditions hold for the case (keyword values)."""
        c = case if isinstance(case, Case) else Case(**case)
        rows = self.rows_for(op)
        if not rows:
            raise KeyError(f"no table rows for op {op!r}; ops: {', '.join(self.ops())}")
        for r in rows:
            if r.applies(c):
                return r
        raise LookupError(f"no {op!r} row applies to the case ({c})")

    def __iter__(self):
        return iter(self.rows)

    def __len__(self):
        return len(self.rows)


@dataclass(frozen=True)
class Options:
    """Base of a family's frozen options. Subclasses declare `TUNABLE` ({op: allowed param
    names}); `overrides` holds per-op params that replace the picked table row's (tuning)."""

    TUNABLE: ClassVar[Mapping[str, frozenset]] = MappingProxyType({})
    overrides: tuple = ()

    def __post_init__(self):
        for op, params in self.overrides:
            self._check(op, dict(params))

    @classmethod
    def _check(cls, op: str, params: dict) -> None:
        if op not in cls.TUNABLE:
            raise ValueError(f"{cls.__name__}.override: unknown op {op!r}; allowed: {', '.join(cls.TUNABLE)}")
        bad = set(params) - set(cls.TUNABLE[op])
        if bad:
            raise ValueError(f"{cls.__name__}.override({op!r}): unknown params {sorted(bad)}; "
                             f"allowed: {sorted(cls.TUNABLE[op])}")

    def override(self, op: str, **params) -> "Options":
        """A copy whose `op` launches take `params` over the table's (keys given only)."""
        self._check(op, params)
        cur = dict(self.overrides)
        merged = {**dict(cur.get(op, ())), **params}
        cur[op] = tuple(sorted(merged.items()))
        return dataclasses.replace(self, overrides=tuple(sorted(cur.items())))

    def overrides_for(self, op: str) -> dict:
        """The params set by override(op, ...) (empty when none)."""
        return dict(dict(self.overrides).get(op, ()))

    def replace(self, **fields) -> "Options":
        """A copy with the given fields changed (unknown names raise TypeError)."""
        return dataclasses.replace(self, **fields)
