"""Architecture rules, checked on the source (AST, nothing imported):

* no import circle within replaybench or replayssm (every import counts, also those inside
  functions, except under ``if TYPE_CHECKING:``);
* the kernel library (replayssm) never imports the suite (replaybench);
* no module reaches another module's private name (``from m import _x`` or ``m._x``).
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {"replaybench": ROOT / "replaybench", "replayssm": ROOT / "kernels" / "replayssm"}

# Tolerated import circles, each the set of its modules: none. An entry the code no longer has
# fails the test, so the list cannot go stale.
KNOWN_CIRCLES: list[set[str]] = []


def _modules() -> dict[str, Path]:
    out = {}
    for pkg, base in PACKAGES.items():
        for p in base.rglob("*.py"):
            rel = p.relative_to(base).with_suffix("")
            parts = [pkg, *rel.parts]
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = p
    return out


MODULES = _modules()


def _is_package(mod: str) -> bool:
    return MODULES.get(mod, Path()).name == "__init__.py"


def _type_checking_nodes(tree) -> set[int]:
    skip = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for sub in node.body:
                skip.update(id(n) for n in ast.walk(sub))
    return skip


def _resolve(mod: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if _is_package(mod) else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(mod: str) -> list[tuple[str, list[str], int]]:
    """(imported module, names taken from it, line) for every import of `mod`."""
    tree = ast.parse(MODULES[mod].read_text(encoding="utf-8"))
    skip = _type_checking_nodes(tree)
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out += [(a.name, [], node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((_resolve(mod, node), [a.name for a in node.names], node.lineno))
    return out


def _edges(mod: str) -> set[str]:
    """The modules of the two packages that `mod` imports."""
    out = set()
    for target, names, _ in _imports(mod):
        for name in names or [None]:
            sub = f"{target}.{name}" if name else None
            if sub in MODULES:
                out.add(sub)
            elif target in MODULES:
                out.add(target)
    out.discard(mod)
    return out


def _circles() -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    graph = {m: _edges(m) for m in MODULES}
    index, low, stack, on, comps, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = set()
            while True:
                w = stack.pop()
                on.discard(w)
                comp.add(w)
                if w == v:
                    break
            if len(comp) > 1:
                comps.append(comp)

    for m in sorted(graph):
        if m not in index:
            visit(m)
    return comps


def test_no_import_circles():
    circles = _circles()
    new = [c for c in circles if not any(c <= k for k in KNOWN_CIRCLES)]
    assert not new, "import circles:\n" + "\n".join(" <-> ".join(sorted(c)) for c in new)
    stale = [k for k in KNOWN_CIRCLES if not any(c & k for c in circles)]
    assert not stale, f"KNOWN_CIRCLES entries that no longer exist (remove them): {stale}"


def test_kernel_library_never_imports_the_suite():
    bad = [f"{m}:{line}: imports {target}" for m in MODULES if m.startswith("replayssm")
           for target, _, line in _imports(m) if target == "replaybench" or target.startswith("replaybench.")]
    assert not bad, "\n".join(bad)


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _private_reaches(mod: str) -> list[str]:
    tree = ast.parse(MODULES[mod].read_text(encoding="utf-8"))
    bad, aliases = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            target = _resolve(mod, node)
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in MODULES:
                    aliases[a.asname or a.name] = sub
                elif target in MODULES and target != mod and _private(a.name):
                    bad.append(f"{mod}:{node.lineno}: from {target} import {a.name}")
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES and a.asname:
                    aliases[a.asname] = a.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                and aliases[node.value.id] != mod and _private(node.attr)):
            bad.append(f"{mod}:{node.lineno}: {aliases[node.value.id]}.{node.attr}")
    return bad


@pytest.mark.parametrize("pkg", ["replaybench", "replayssm"])
def test_no_private_names_across_modules(pkg):
    bad = [b for m in sorted(MODULES) if m.split(".")[0] == pkg for b in _private_reaches(m)]
    assert not bad, "private names reached across modules:\n" + "\n".join(bad)


def test_the_checker_sees_a_circle_and_a_private_reach(tmp_path, monkeypatch):
    (tmp_path / "a.py").write_text("from .b import _x\n", encoding="utf-8")
    (tmp_path / "b.py").write_text("def f():\n    from . import a\n_x = 1\n", encoding="utf-8")
    (tmp_path / "__init__.py").write_text("", encoding="utf-8")
    fake = {"fake": tmp_path / "__init__.py", "fake.a": tmp_path / "a.py", "fake.b": tmp_path / "b.py"}
    monkeypatch.setattr(sys.modules[__name__], "MODULES", fake)
    assert _circles() == [{"fake.a", "fake.b"}]
    assert _private_reaches("fake.a") == ["fake.a:1: from fake.b import _x"]
