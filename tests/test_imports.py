"""txl's modules import one another one way: no circle in the graph of every import statement of ``src/txl``
(module level, inside functions and under ``TYPE_CHECKING``), read from the source, not by importing it."""

from __future__ import annotations

import ast
import importlib
import inspect
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
    inference = {
        "txl.inference.text",
        "txl.inference.loop",
        "txl.inference.rows",
        "txl.inference.sampling",
        "txl.inference.engine",
        "txl.inference.params",
    }
    assert inference | {"txl.interop.checkpoints"} <= set(graph)
    # the graph sees the arrows it should: module level, inside functions, under TYPE_CHECKING
    assert {"txl.inference.engine", "txl.inference.params"} <= graph["txl.inference.text"]
    assert "txl.runs" in graph["txl.inference.text"]  # under TYPE_CHECKING only
    assert "txl.runs" in graph["txl.cli.train"]  # inside a function only
    assert _circles(graph) == []


def test_no_submodule_shares_its_name_with_a_function_at_the_root():
    """``txl.<name>`` of a function exported at the root must be that function: a submodule of the same name
    would replace it as soon as anything imports the submodule."""
    functions = [name for name in txl.__all__ if inspect.isfunction(getattr(txl, name))]
    assert {"generate", "stream", "load_config", "segment_losses", "evaluate"} <= set(functions)
    modules = {path.stem for path in ROOT.glob("*.py")} | {
        path.name for path in ROOT.iterdir() if path.is_dir()
    }
    assert not set(functions) & modules, set(functions) & modules
    assert "evaluation" in modules  # the module of txl.evaluate, the function
    # a submodule imported by someone else leaves the root's function where it was
    evaluation = importlib.import_module("txl.evaluation")
    assert inspect.isfunction(txl.evaluate) and txl.evaluate is evaluation.evaluate


def test_the_circle_finder_finds_one():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
