"""Floor-plan figures of a source tree, read with the AST: module and function sizes, wide signatures, relays.

Usage: ``python tools/code_metrics.py [SRC] [--json] [--list] [--rules] [--settings]`` (SRC defaults to
``src/txl``).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["Metrics", "measure", "rules", "RULES", "settings", "flag_raises", "main"]

WIDE = 6  # a function taking more parameters than this is "wide"
LONG = 100  # a function longer than this many lines is "long"


@dataclass
class Metrics:
    """What `measure` counts over a tree of Python modules."""

    modules: int = 0
    lines: int = 0
    largest_module: tuple[str, int] = ("", 0)
    largest_function: tuple[str, int] = ("", 0)
    long_functions: list[tuple[str, int]] = field(default_factory=list)
    wide_functions: list[tuple[str, int]] = field(default_factory=list)
    wide_public_functions: list[tuple[str, int]] = field(default_factory=list)
    relay_keywords: int = 0
    relay_lines: int = 0
    header_lines: list[int] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        """The figures, as one flat record."""
        headers = sorted(self.header_lines)
        return {
            "modules": self.modules,
            "lines": self.lines,
            "largest_module": f"{self.largest_module[0]} ({self.largest_module[1]} lines)",
            "largest_module_lines": self.largest_module[1],
            "largest_function": f"{self.largest_function[0]} ({self.largest_function[1]} lines)",
            "largest_function_lines": self.largest_function[1],
            f"functions_over_{LONG}_lines": len(self.long_functions),
            f"functions_over_{WIDE}_parameters": len(self.wide_functions),
            f"public_functions_over_{WIDE}_parameters": len(self.wide_public_functions),
            "relay_keywords": self.relay_keywords,
            "relay_lines": self.relay_lines,
            "header_lines_median": headers[len(headers) // 2] if headers else 0,
            "header_lines_max": headers[-1] if headers else 0,
            "modules_with_header_over_3_lines": sum(1 for n in headers if n > 3),
        }


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Named parameters, without ``self``/``cls`` and without ``*args``/``**kwargs``."""
    a = node.args
    names = [p.arg for p in a.posonlyargs + a.args + a.kwonlyargs]
    return len([n for n in names if n not in ("self", "cls")])


def _is_relay(kw: ast.keyword) -> bool:
    """``name=name`` or ``name=args.name``."""
    if kw.arg is None:
        return False
    v = kw.value
    if isinstance(v, ast.Name):
        return v.id == kw.arg
    return (
        isinstance(v, ast.Attribute)
        and v.attr == kw.arg
        and isinstance(v.value, ast.Name)
        and v.value.id == "args"
    )


def _header_lines(tree: ast.Module) -> int:
    """Lines of the module docstring (0 without one)."""
    if tree.body and isinstance(tree.body[0], ast.Expr) and isinstance(tree.body[0].value, ast.Constant):
        doc = tree.body[0].value.value
        if isinstance(doc, str):
            return len(doc.strip().splitlines())
    return 0


def _public(qualname: str) -> bool:
    return not any(part.startswith("_") and not part.startswith("__") for part in qualname.split("."))


@dataclass
class _Module:
    rel: str
    lines: list[str]
    relay_lines: set[int]


def _visit(node: ast.AST, prefix: str, module: _Module, m: Metrics) -> None:
    """Count the functions and keywords under `node`, whose qualified names start with `prefix`."""
    rel, source_lines, relay_lines = module.rel, module.lines, module.relay_lines
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{child.name}"
            where = f"{rel}:{name}"
            size = (child.end_lineno or child.lineno) - child.lineno + 1
            if size > m.largest_function[1]:
                m.largest_function = (where, size)
            if size > LONG:
                m.long_functions.append((where, size))
            width = _parameters(child)
            if width > WIDE:
                m.wide_functions.append((where, width))
                if _public(name) and not child.name.startswith("__"):
                    m.wide_public_functions.append((where, width))
            _visit(child, f"{name}.", module, m)
        elif isinstance(child, ast.ClassDef):
            _visit(child, f"{prefix}{child.name}.", module, m)
        else:
            if isinstance(child, ast.keyword) and _is_relay(child):
                m.relay_keywords += 1
                line = source_lines[child.lineno - 1].strip().rstrip(",")
                if child.lineno == child.end_lineno and line == ast.unparse(child).replace(" ", ""):
                    relay_lines.add(child.lineno)
            _visit(child, prefix, module, m)


def measure(src: Path) -> Metrics:
    """Walk every ``*.py`` under `src` and count."""
    m = Metrics()
    for path in sorted(src.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        rel = path.relative_to(src.parent).as_posix()
        n_lines = len(text.splitlines())
        m.modules += 1
        m.lines += n_lines
        m.header_lines.append(_header_lines(tree))
        if n_lines > m.largest_module[1]:
            m.largest_module = (rel, n_lines)
        source_lines = text.splitlines()
        relay_lines: set[int] = set()

        _visit(tree, "", _Module(rel, source_lines, relay_lines), m)
        m.relay_lines += len(relay_lines)
    return m


RULES: dict[str, str] = {
    "evaluation segment length (given, else [eval], else training)": r"eval\.tgt_len\b.*train\.tgt_len|eval\.tgt_len\s+or\b",
    "has memory (relative attention and mem_len > 0)": r"attention\s*==\s*\"relative\"\s+and\s+[\w.]*mem_len\s*>\s*0"
    r"|mem_len\s*>\s*0\s+and\s+[\w.]*attention\s*==",
    "start token of a text (<eos>, else newline)": r"def start_token\b|tensor\(\[\s*[\w.]*eos\w*\s*\]|encode\(\"\\n\"\)",
    "perplexity of a mean loss": r"math\.exp\(\s*[\w.\[\]\"']*loss",
    "key/value cache slots (M + max(M // 4, 16))": r"max\(\s*[\w.]*mem_len\s*//\s*4\s*,\s*16\s*\)",
    "reach spelled out (None means every position)": r"torch\.full\(\s*\((?:self\.)?batch_size,\)",
    "model/cache size compatibility": r"\(\"n_layer\", \"n_head\", \"d_head\", \"d_model\"\)",
    "positive-integer check": r"positive integer",
    "eval_mode": r"def eval_mode\b",
    "layer loop keeping each layer's input (LayerStack; the one-position fast path)": r"\binputs\.append\(h\)",
    "LayerStack's owners (an instance, or a subclass)": r"(?<!class )\bLayerStack\(|\(LayerStack\)",
}
"""Each rule and a pattern that finds where it is written out (its definition included)."""


def _docstring_lines(tree: ast.Module) -> set[int]:
    """The line numbers of every docstring in `tree` (prose, not code)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    lines.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    return lines


def _scopes(tree: ast.Module) -> list[tuple[int, int, str]]:
    """(first line, last line, qualified name) of every function and class in `tree`."""
    out: list[tuple[int, int, str]] = []

    def walk(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                out.append((child.lineno, child.end_lineno or child.lineno, name))
                walk(child, f"{name}.")

    walk(tree, "")
    return out


def rules(src: Path) -> dict[str, list[str]]:
    """Where each of `RULES` is written out under `src`: one ``path:function`` per place (a module's top
    level is ``path:<module>``), however many of its lines match."""
    found: dict[str, list[str]] = {name: [] for name in RULES}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).as_posix()
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        prose, scopes = _docstring_lines(tree), _scopes(tree)
        for number, line in enumerate(text.splitlines(), 1):
            if number in prose or line.lstrip().startswith("#"):
                continue
            for name, pattern in RULES.items():
                if re.search(pattern, line):
                    inside = [(a, q) for a, b, q in scopes if a <= number <= b]
                    place = f"{rel}:{max(inside)[1] if inside else '<module>'}"
                    if place not in found[name]:
                        found[name].append(place)
    return found


SETTINGS_SUFFIXES = ("Settings", "Config", "Args", "Lengths", "Params", "Options")
"""A frozen dataclass whose name ends with one of these (or is ``Span``) is a settings value."""

UNITS = ("Span", "EvalLengths")
"""The values that the lengths travel in: their own fields are the lengths, not flat copies of them."""

TRACKED = (
    "mem_len",
    "clamp_len",
    "same_length",
    "tgt_len",
    "batch_size",
    "checkpoint",
    "device",
    "progress",
    "seed",
)
"""The fields whose flat copies ``--settings`` always reports."""


def _frozen_dataclass(node: ast.ClassDef) -> bool:
    for d in node.decorator_list:
        if isinstance(d, ast.Call) and any(
            k.arg == "frozen" and isinstance(k.value, ast.Constant) and k.value.value is True
            for k in d.keywords
        ):
            return True
    return False


def settings(src: Path) -> dict[str, object]:
    """The settings values under `src` (``path:Name``) and, for each field name that two or more of them hold
    flat (outside `UNITS`), the values that hold it."""
    values: list[str] = []
    holders: dict[str, list[str]] = {}
    for path in sorted(src.rglob("*.py")):
        rel = path.relative_to(src.parent).as_posix()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef) or not _frozen_dataclass(node):
                continue
            if not (node.name == "Span" or node.name.endswith(SETTINGS_SUFFIXES)):
                continue
            values.append(f"{rel}:{node.name}")
            if node.name in UNITS:
                continue
            for stmt in node.body:
                if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                    holders.setdefault(stmt.target.id, []).append(node.name)
    repeated = {
        name: sorted(owners) for name, owners in holders.items() if len(owners) > 1 or name in TRACKED
    }
    for name in TRACKED:
        repeated.setdefault(name, [])
    return {"values": values, "fields": dict(sorted(repeated.items(), key=lambda kv: (-len(kv[1]), kv[0])))}


_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def _strings(node: ast.AST) -> list[str]:
    """The literal text in `node`: its string constants and the constant parts of its f-strings."""
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def flag_raises(src: Path, *, skip: tuple[str, ...] = ("cli/", "demo.py")) -> list[str]:
    """Every ``raise`` outside the command line (`skip`, relative to `src`) whose message names a ``--flag``:
    one ``path:line`` each."""
    found: list[str] = []
    for path in sorted(src.rglob("*.py")):
        inner = path.relative_to(src).as_posix()
        if any(inner.startswith(s) for s in skip):
            continue
        rel = path.relative_to(src.parent).as_posix()
        lines = [
            node.lineno
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Raise)
            and node.exc is not None
            and any(_FLAG.search(text) for text in _strings(node.exc))
        ]
        found.extend(f"{rel}:{line}" for line in sorted(lines))
    return found


def main(argv: list[str] | None = None) -> int:
    """Print the figures of a tree (JSON with ``--json``; the offenders with ``--list``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("src", nargs="?", default="src/txl", type=Path)
    parser.add_argument("--json", action="store_true", help="one JSON record")
    parser.add_argument("--list", action="store_true", help="also list long and wide functions")
    parser.add_argument("--rules", action="store_true", help="also say where each rule is written out")
    parser.add_argument(
        "--settings",
        action="store_true",
        help="also count the settings values, the fields they repeat and the library's errors naming a --flag",
    )
    args = parser.parse_args(argv)
    m = measure(args.src)
    record = m.summary()
    if args.list:
        record["long"] = [f"{w} ({n})" for w, n in sorted(m.long_functions, key=lambda x: -x[1])]
        record["wide"] = [f"{w} ({n})" for w, n in sorted(m.wide_functions, key=lambda x: -x[1])]
    if args.rules:
        record["rules"] = {name: places for name, places in rules(args.src).items()}
    if args.settings:
        family = settings(args.src)
        flags = flag_raises(args.src)
        fields = family["fields"]
        assert isinstance(fields, dict)
        record["settings_values"] = len(family["values"])  # type: ignore[arg-type]
        record["settings_fields"] = {name: owners for name, owners in fields.items()}
        record["flag_raises_outside_cli"] = len(flags)
        record["flag_raises"] = flags
    if args.json:
        print(json.dumps(record, indent=2))
    else:
        for key, value in record.items():
            if isinstance(value, list):
                print(f"{key}:")
                for item in value:
                    print(f"  {item}")
            elif isinstance(value, dict):
                print(f"{key}:")
                for name, places in value.items():
                    print(f"  {name}: {len(places)}  {' '.join(places)}")
            else:
                print(f"{key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
