"""The layering of DESIGN §5, read from the source's imports (the `ast` module, nothing imported).

Layers, lowest first: the core `wire_dagster`, then `resources`, `assets`, `sensors` and last
`definitions`. A module imports only from its own layer or lower ones; the one exception is the
CLI entry point (`wire_dagster/cli.py`), which with `definitions.py` may join core and Dagster.
No import cycle among the project's modules, counting imports inside functions as well: a lazy
import hides a cycle from the interpreter, not from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("wire_dagster", "resources", "assets", "sensors", "definitions")
MAY_JOIN = {"wire_dagster.cli"}  # the CLI entry point (DESIGN §5)


def _modules() -> dict[str, Path]:
    found = {"definitions": ROOT / "definitions.py"}
    for package in LAYERS[:-1]:
        for path in sorted((ROOT / package).glob("*.py")):
            found[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules `name` imports (a `from X import y` of a submodule counts as X.y)."""
    package = name if path.stem == "__init__" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        else:
            continue
        for target in targets:
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_no_module_imports_a_higher_layer() -> None:
    upward = sorted(
        f"{a} imports {b}"
        for a, targets in _graph().items()
        for b in targets
        if a not in MAY_JOIN and _layer(b) > _layer(a)
    )
    assert upward == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    assert _cycles(_graph()) == []


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"a"}}, [["a", "b"]]),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_the_cycle_finder_finds_cycles(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert _cycles(graph) == expected


def test_the_reader_sees_lazy_and_relative_imports() -> None:
    graph = _graph()
    assert "sensors.tick" in graph["wire_dagster.cli"]  # imported inside a function
    assert "wire_dagster.errors" in graph["wire_dagster.cli"]  # `from .errors import ...`
    assert _layer("sensors.tick") > _layer("wire_dagster.cli")  # the exception the CLI is
