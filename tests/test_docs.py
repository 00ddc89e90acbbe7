"""The front matter a user reads: every public module and every name of ``txl.__all__`` has a docstring and a
page in the API reference, the README stays short, no page names an issue number, and the package is
published under its own name with its version from the metadata."""

from __future__ import annotations

import ast
import inspect
import re
import tomllib
import types
from pathlib import Path

import txl
from txl import _version

REPO = Path(__file__).resolve().parents[1]
SRC = REPO / "src"
DOCS = REPO / "docs"


def public_modules() -> dict[str, Path]:
    """Dotted name -> file of every module of ``src/txl`` that no underscore hides (``__main__`` is a script)."""
    found = {}
    for path in sorted((SRC / "txl").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts[-1] == "__main__" or any(part.startswith("_") for part in parts):
            continue
        found[".".join(parts)] = path
    return found


def module_all(tree: ast.Module) -> list[str]:
    """The names a module's ``__all__`` spells out as strings ([] without one)."""
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets) and node.value is not None:
            items = node.value.elts if isinstance(node.value, (ast.List, ast.Tuple)) else []
            return [i.value for i in items if isinstance(i, ast.Constant) and isinstance(i.value, str)]
    return []


def documented_in_reference() -> set[str]:
    """The modules the reference pages render: each ``::: name`` and, unless its options say
    ``show_submodules: false``, every module below it."""
    roots = set()
    for page in (DOCS / "reference").glob("*.md"):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            if line.startswith("::: "):
                options = []
                for follow in lines[i + 1 :]:
                    if not follow.startswith(" "):
                        break
                    options.append(follow.strip())
                roots.add((line[4:].strip(), "show_submodules: false" not in options))
    covered = set()
    for name in public_modules():
        for root, deep in roots:
            if name == root or (deep and name.startswith(root + ".")):
                covered.add(name)
    return covered


def test_every_public_module_has_a_docstring_and_a_reference_page():
    modules = public_modules()
    assert {"txl", "txl.config", "txl.model.attention", "txl.runs"} <= set(modules)
    undocumented = [
        name for name, path in modules.items() if not ast.get_docstring(ast.parse(path.read_text()))
    ]
    assert not undocumented, f"modules without a docstring: {undocumented}"
    missing = sorted(set(modules) - documented_in_reference())
    assert not missing, f"modules no page of docs/reference/ renders (add a '::: name' line): {missing}"


def test_every_function_and_class_a_public_module_exports_has_a_docstring():
    bare = []
    for name, path in public_modules().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        bare += [f"{name}.{n}" for n in module_all(tree) if n in defs and not ast.get_docstring(defs[n])]
    assert not bare, f"exported without a docstring: {bare}"


def _own_docstring(obj: object) -> str | None:
    """The docstring written for ``obj`` in its source (not one that dataclasses or a base class supply)."""
    if isinstance(obj, types.ModuleType):
        return obj.__doc__
    tree = ast.parse(Path(inspect.getfile(obj)).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == obj.__name__:
            return ast.get_docstring(node)
    return None


def test_every_root_name_has_a_docstring_and_is_listed_in_the_reference():
    index = (DOCS / "reference" / "index.md").read_text(encoding="utf-8")
    for name in txl.__all__:
        obj = getattr(txl, name)
        assert _own_docstring(obj), f"txl.{name} has no docstring of its own"
        assert f"`{name}`" in index, f"docs/reference/index.md does not list txl.{name}"


def _pages() -> list[Path]:
    return [REPO / "README.md", *sorted(DOCS.rglob("*.md"))]


def test_the_readme_is_short_and_no_page_names_an_issue():
    assert (REPO / "README.md").stat().st_size < 15_000
    for page in _pages():
        found = re.findall(r"\bissues?\s*#?\d+", page.read_text(encoding="utf-8"), re.I)
        assert not found, f"{page.relative_to(REPO)} names {found}"


def test_every_page_is_in_the_navigation():
    nav = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")} - {"rl.md"}
    assert not sorted(p for p in pages if p not in nav), "pages left out of mkdocs.yml's nav"


def test_the_distribution_has_its_own_name_and_gives_the_version():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["name"] == _version.DISTRIBUTION == "transformer-xl"
    references = [r for extra in project["optional-dependencies"].values() for r in extra if "[" in r]
    assert references and all(
        r.startswith(f"{project['name']}[") for r in references if r.split("[")[0] in {"txl", project["name"]}
    )
    assert not [r for r in references if r.startswith("txl[")], "an extra names the other txl"
    assert txl.__version__ == _version.installed_version() == project["version"]
