"""tools/tune_gdn.py's variant lists: every list the TUNE_MODES names select builds, and every
variant has a name (the lists read the shipped launch table, which changes under them)."""
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("triton")


def _tool():
    spec = importlib.util.spec_from_file_location("tune_gdn", Path(__file__).parents[2] / "tools" / "tune_gdn.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_focused_list_builds_and_names_its_variants():
    t = _tool()
    assert t.EXTRA and t.SMALL
    for name, (mode, cfgs, batch, models) in t.EXTRA.items():
        assert cfgs and batch >= 1 and set(models) <= set(t.MODELS), name
        assert mode in t.MODE or mode in t.EAGER_SD, name
        names = [t.vname(c) for c in cfgs]
        assert all(names), name
    for b, modes in t.SMALL.items():
        for cfgs in modes.values():
            assert all(t.vname(c) for c in cfgs)


def test_route_candidates_are_routes_or_buffered_rows():
    t = _tool()
    for c in t._route_list("bf16", 32):
        assert c.get("EAGER_ROUTE") or "NR" in c       # a buffered row carries its chunking
