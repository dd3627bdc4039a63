"""The package's layers import each other without a cycle, function-level imports included.

Every module of ``gpytorch_augment`` is parsed with :mod:`ast`; every ``import``/``from ... import`` statement in it
(at module level, inside a function or class, under ``if TYPE_CHECKING``: wherever it stands) is resolved to a module
of the package, relative imports included. A module belongs to a *unit*: its subpackage (``core``,
``distributions``, ``likelihoods``, ``variational``, ``mlls``, ``inference``, ``testing``, ``_numerics``), a
top-level module (``_validation``, ``models``, ...) or the package itself (``gpytorch_augment/__init__.py``, which
re-exports everything and is imported by nothing inside). The graph of units must be acyclic.

Rule: a lower layer never imports a higher one, not even inside a function to dodge the import-time cycle; a check
that two layers share lives in the lower one (e.g. :mod:`gpytorch_augment._validation`). The modules themselves import
each other without a cycle too (a module's import of a package that holds it is left out: importing the module runs
that package's ``__init__`` first anyway).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import gpytorch_augment

PACKAGE = "gpytorch_augment"
ROOT = Path(gpytorch_augment.__file__).resolve().parent


def module_name(path: Path) -> str:
    """``gpytorch_augment.inference.cavi`` for ``<root>/inference/cavi.py`` (a package: its ``__init__``)."""
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def imported(name: str, path: Path, known: set[str]) -> set[str]:
    """The package modules that the module ``name`` (at ``path``) imports anywhere in its body."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: from the package holding this module, ``level - 1`` packages up
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.add(target)
            # ``from pkg import sub``: the submodule where it is one
            found.update(f"{target}.{alias.name}" for alias in node.names if f"{target}.{alias.name}" in known)
    resolved = set()
    for target in found:
        while target and target not in known:  # ``pkg.mod.attr`` -> ``pkg.mod``
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def unit(name: str) -> str:
    """The unit (subpackage, top-level module or the package itself) a module belongs to."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else PACKAGE


def unit_graph() -> dict[str, set[str]]:
    """The import edges between units (edges inside a unit dropped)."""
    found = modules()
    known = set(found)
    graph: dict[str, set[str]] = {unit(n): set() for n in known}
    for name, path in found.items():
        for target in imported(name, path, known):
            if unit(target) != unit(name):
                graph[unit(name)].add(unit(target))
    return graph


def module_graph() -> dict[str, set[str]]:
    """The import edges between modules (a module's imports of the packages that hold it dropped)."""
    found = modules()
    known = set(found)
    return {
        name: {t for t in imported(name, path, known) if not name.startswith(t + ".")} for name, path in found.items()
    }


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as ``[a, b, ..., a]``, or ``None`` if it is acyclic (depth-first search)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_the_units_are_found() -> None:
    graph = unit_graph()
    for expected in ("core", "inference", "likelihoods", "mlls", "variational", "_validation", PACKAGE):
        assert expected in graph
    assert "core" in graph["inference"] and "likelihoods" in graph["mlls"]


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_units() -> None:
    graph = unit_graph()
    cycle = find_cycle(graph)
    if cycle is not None:
        print("import cycle:", " -> ".join(cycle))
        pytest.fail(f"import cycle between the package's units: {' -> '.join(cycle)}")


def test_no_import_cycle_between_modules() -> None:
    cycle = find_cycle(module_graph())
    if cycle is not None:
        print("import cycle:", " -> ".join(cycle))
        pytest.fail(f"import cycle between the package's modules: {' -> '.join(cycle)}")


def test_nothing_inside_imports_the_package_itself() -> None:
    """The package's ``__init__`` imports every unit: a unit importing it back is a cycle through everything."""
    graph = unit_graph()
    assert [u for u, targets in graph.items() if PACKAGE in targets] == []
