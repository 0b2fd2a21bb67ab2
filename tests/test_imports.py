"""The import graph of the package and its tools has no cycle: a module that needs another's
names comes after it, whichever is imported first. The layers (import-linter's contracts in
pyproject.toml, ``make lint``) order the packages; this orders the modules within a layer.

Built from the source with ``ast``, every import counted: those inside functions (a
function-level import that closes a cycle only postpones it to the first call) and those under
``TYPE_CHECKING`` (a type that needs its user's module is a cycle in the design). An import of
``a.b`` counts as an edge to ``a.b`` alone, not to the packages above it.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# Each root package of the graph, and the folder its dotted names are relative to.
ROOTS = {"loaderbench": REPO / "src", "tools": REPO}


def module_name(path: Path, base: Path) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(tree: ast.AST, name: str, is_package: bool, modules: set[str]) -> set[str]:
    """The package's modules that the module ``name`` imports, wherever the import stands."""
    found: set[str] = set()
    base = name if is_package else name.rpartition(".")[0]

    def visit(node: ast.AST) -> None:
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
    paths = {
        module_name(path, base): path
        for package, base in ROOTS.items()
        for path in (base / package).rglob("*.py")
    }
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
    assert len(graph) > 100 and {"loaderbench.measure.meters", "tools.bench.limits"} <= set(graph)
    assert cycles(graph) == []


def test_a_cycle_is_found() -> None:
    """The check itself: a cycle through a function-level import counts, and through an
    import under TYPE_CHECKING."""
    modules = {"p.a", "p.b", "p.c"}
    a = imported(ast.parse("import p.b\n"), "p.a", False, modules)
    b = imported(ast.parse("def f():\n    from p import a\n"), "p.b", False, modules)
    c = imported(
        ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n"),
        "p.c",
        False,
        modules,
    )
    assert (a, b, c) == ({"p.b"}, {"p.a"}, {"p.a"})
    assert cycles({"p.a": a, "p.b": b, "p.c": c}) == [["p.a", "p.b"]]
