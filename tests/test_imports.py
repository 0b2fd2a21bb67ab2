"""The package's import graph has no cycle (imports under ``TYPE_CHECKING`` aside): a module
that needs another's names at import time comes after it, whichever is imported first.

Built from the source with ``ast``, every import counted, those inside functions too (a
function-level import that closes a cycle only postpones it to the first call). An import
of ``a.b`` counts as an edge to ``a.b`` alone, not to the packages above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
PACKAGE = "loaderbench"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def under_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The package's modules that the module ``name`` imports, TYPE_CHECKING blocks aside."""
    found: set[str] = set()
    base = name if is_package else name.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and under_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                anchor = base.split(".")[: len(base.split(".")) - (node.level - 1)]
                source = ".".join([*anchor, *([source] if source else [])])
            for alias in node.names:
                child = f"{source}.{alias.name}"
                found.add(child if child in modules else source)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return {module for module in found if module in modules and module != name}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(path): path for path in (SRC / PACKAGE).rglob("*.py")}
    modules = set(paths)
    return {
        name: imported(ast.parse(path.read_text()), name, path.name == "__init__.py", modules)
        for name, path in paths.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in sorted(graph[node]):
            if other not in index:
                connect(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50 and "loaderbench.measure.meters" in graph  # the whole package read
    assert cycles(graph) == []


def test_a_cycle_is_found() -> None:
    """The check itself: a cycle through a function-level import counts; TYPE_CHECKING's not."""
    modules = {"p.a", "p.b", "p.c"}
    a = imported(ast.parse("import p.b\n"), "p.a", False, modules)
    b = imported(ast.parse("def f():\n    from p import a\n"), "p.b", False, modules)
    c = imported(
        ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n"),
        "p.c",
        False,
        modules,
    )
    assert (a, b, c) == ({"p.b"}, {"p.a"}, set())
    assert cycles({"p.a": a, "p.b": b, "p.c": c}) == [["p.a", "p.b"]]
