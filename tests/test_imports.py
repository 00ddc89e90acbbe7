"""txl's modules import one another one way: no circle in the graph of every import statement of ``src/txl``
(module level, inside functions and under ``TYPE_CHECKING``), read from the source, not by importing it."""

from __future__ import annotations

import ast
from pathlib import Path

import txl

ROOT = Path(txl.__file__).parent


def _modules() -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package)."""
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        package = path.name == "__init__.py"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the txl modules its import statements name (a ``from x import y`` names ``x.y`` when that is a
    module, else ``x``); an import of a package the module belongs to is left out (Python runs it first)."""
    modules = _modules()

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, package) in modules.items():
        base = name.split(".") if package else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                parent = base[: len(base) - node.level + 1] if node.level else []
                module = ".".join(parent + ([node.module] if node.module else []))
                targets = [f"{module}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                found = owner(target)
                if found and found != name and not name.startswith(found + "."):
                    graph[name].add(found)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return circles


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    assert {"txl.text", "txl.generate", "txl.sampling", "txl.interop.checkpoints"} <= set(graph)
    assert {"txl.generate", "txl.sampling"} <= graph["txl.text"]  # the graph sees the arrows it should
    assert _circles(graph) == []


def test_the_circle_finder_finds_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
