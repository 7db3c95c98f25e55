"""The method registry (replaybench.methods) is the one place that lists methods."""
import ast
from pathlib import Path

import pytest

from replaybench import methods
from replaybench.methods import METHODS, names

PKG = Path(methods.__file__).parent


def _method_sets(path: Path):
    """(line, names) of every tuple / list / set literal, or dict's keys, made of >= 2 method names
    and nothing else (a table keyed by other things that happen to include a method name is not a
    method set)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        elts = (node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set))
                else [k for k in node.keys if k is not None] if isinstance(node, ast.Dict) else [])
        strs = [e.value for e in elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        found = [s for s in strs if s in METHODS]
        if len(found) >= 2 and len(found) == len(strs):
            yield node.lineno, found


def test_no_literal_method_set_outside_the_registry():
    bad = [f"{p.relative_to(PKG.parent)}:{line}: {found}"
           for p in sorted(PKG.rglob("*.py")) if p.name != "methods.py"
           for line, found in _method_sets(p)]
    assert not bad, "method sets written out instead of derived from replaybench.methods:\n" + "\n".join(bad)


def test_derived_sets():
    assert names(traffic="replay") == ("replay", "replay-dual", "replay-shared-low")
    assert names(runner="spec") == ("spec-replay", "spec-replay-dual", "spec-perdraft")
    assert names(peer="vllm") == ("vllm-eager", "vllm-spec")
    assert names(layer=True) == ("eager", "replay", "replay-dual", "replay-shared-low")
    assert set(names(spec=True)) == {"spec-replay", "spec-replay-dual", "spec-perdraft", "vllm-spec"}
    assert all(METHODS[m].ours for m in names(vs_eager=True))


def test_every_method_is_described_and_has_a_traffic_model():
    for m in METHODS.values():
        assert m.measures and m.traffic in methods.TRAFFIC_MODELS
        assert m.families == ("mamba2", "gdn")
        assert bool(m.mode) == (m.buffer and m.ours)
        assert not m.paper_baseline or METHODS[m.paper_baseline].peer == "vllm"


def test_lookup_errors_name_the_allowed_values():
    with pytest.raises(ValueError, match="allowed: eager, replay"):
        methods.get("nope")
    with pytest.raises(ValueError, match="unknown method attribute"):
        names(colour="red")
