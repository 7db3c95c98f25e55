"""The one launch-table schema (replayssm.common.table): picking, validation, options."""
from dataclasses import dataclass
from types import MappingProxyType

import pytest

from replayssm.common.launch import Launch
from replayssm.common.table import Case, Options, Row, Table


def _table():
    return Table([
        Row("a.dual", "a", dict(tile=32), why="x", state_bytes=2, dual=True, min_work=100),
        Row("a.mod", "a", dict(tile=64), why="x", p_mod=64, max_batch=4),
        Row("a.any", "a", dict(tile=16), why="x"),
        Row("b.some", "b", dict(tile=8), why="x", when=lambda c: c.batch % 2 == 0),
    ], params_of={"a": {"tile"}, "b": {"tile"}})


def test_pick_first_matching_row_in_order():
    t = _table()
    assert t.pick("a", batch=64, heads=2, state_bytes=2, dual=True, head_dim=64).name == "a.dual"
    assert t.pick("a", batch=4, heads=2, state_bytes=2, dual=True, head_dim=64).name == "a.mod"
    assert t.pick("a", batch=5, heads=2, state_bytes=4, dual=False, head_dim=64).name == "a.any"
    assert t.pick("b", batch=2).name == "b.some"
    assert [r.name for r in t.rows_for("a")] == ["a.dual", "a.mod", "a.any"]
    assert Case(batch=3, heads=5).work == 15


def test_pick_errors_name_op_and_case():
    t = _table()
    with pytest.raises(LookupError, match=r"no 'b' row applies.*batch=3"):
        t.pick("b", batch=3)
    with pytest.raises(KeyError, match="no table rows for op 'c'"):
        t.pick("c", batch=1)
    with pytest.raises(KeyError, match="lacks"):
        t.pick("a", batch=1, heads=1)          # a.dual needs state_bytes


def test_table_validation_at_build():
    with pytest.raises(ValueError, match="duplicate"):
        Table([Row("x", "a"), Row("x", "a")])
    with pytest.raises(ValueError, match="unknown params"):
        Table([Row("x", "a", dict(tiel=1))], params_of={"a": {"tile"}})
    with pytest.raises(ValueError, match="unknown op"):
        Table([Row("x", "z")], params_of={"a": {"tile"}})
    with pytest.raises(TypeError):
        Row("x", "a", stat_bytes=4)            # a misspelt condition


@dataclass(frozen=True)
class _Opts(Options):
    TUNABLE = MappingProxyType({"a": frozenset({"tile", "warps"})})
    knob: bool = True


def test_options_override_is_validated_and_pure():
    o = _Opts()
    o2 = o.override("a", tile=8).override("a", warps=2)
    assert o.overrides_for("a") == {} and o2.overrides_for("a") == {"tile": 8, "warps": 2}
    assert hash(o2) == hash(_Opts().override("a", warps=2, tile=8))
    with pytest.raises(ValueError, match="unknown params.*tiel"):
        o.override("a", tiel=8)
    with pytest.raises(ValueError, match="unknown op 'q'"):
        o.override("q", tile=8)
    with pytest.raises(TypeError):
        o.replace(knbo=False)
    assert o.replace(knob=False).knob is False


def test_launch_describe_names_kernel_grid_meta_row():
    def k():
        pass
    d = Launch(k, (3, 2, 1), (), {"BLOCK": 16, "num_warps": 4}, row="a.any").describe()
    assert d == {"kernel": "k", "grid": (3, 2, 1), "meta": {"BLOCK": 16, "num_warps": 4}, "row": "a.any"}
