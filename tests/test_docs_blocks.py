"""Every fenced code block of README.md and the documentation (docs/**/*.md, and the files their pages include)
as a user would paste it: each block is covered by exactly one rule of its language, and a block of a language
no rule knows fails.

- ``python``: executed in a fresh namespace, in a temporary folder, with ``TXL_DATA_DIR`` pointing into it.
- ``bash``, ``console``, ``sh``, ``shell`` (and the ``$ `` lines of a ``text`` block): every command is checked
  by what it runs. ``txl ...`` (also ``python -m txl`` and ``torchrun ... -m txl``) is parsed by txl's own
  parser, so a flag cannot drift; ``torchrun``'s flags by PyTorch's; a script or module of the repository
  (``benchmarks/``, ``examples/``, ``python -m MODULE``) by its own argparse parser, run until its arguments
  are parsed; ``python -c`` code compiles; ``pip install`` names real requirements and txl's real extras,
  never the unrelated ``txl`` package; ``curl`` data is JSON; ``git clone``, ``mkdocs`` and a few shell
  utilities are checked for form. A command only a clone of the repository can run (``pip install -e``,
  ``PYTHONPATH=src``, a script of ``benchmarks/``, ``examples/``, ``tools/``, ``tests/``, ``pytest``,
  ``mkdocs``, ``git clone``) needs the words "clone" in the block, in its section before it, or in the
  page's introduction. A command no rule knows fails.
- ``text``: free text (diagrams, layouts, formulas, output). ``toml``: parses with tomllib, and a txl config
  (a ``[model]``, ``[data]``, ``[train]``, ``[eval]`` or ``[generate]`` section) loads with
  ``txl.config.load_config``. ``json``, ``jsonl``: parse. ``yaml``: parses (an lm-eval task names its task).

An HTML comment right above a block (invisible on the site and on GitHub) declares what the block needs:

    <!-- test: run=runs/shakespeare corpus=tinyshakespeare file=scene.txt exec=eval,generate -->

- ``run=PATH``: a copy of a tiny trained run (the suite's ``trained_run``) at PATH in the temporary folder;
- ``corpus=NAME``: a small corpus NAME in ``$TXL_DATA_DIR`` (``tinyshakespeare``, ``wikitext-2``);
- ``file=NAME``: a small prompt file (``.jsonl``: two prompts);
- ``original=NAME``: a small state_dict in the authors' format;
- ``serve=PATH``: a live ``txl serve`` of the run at PATH on a free port; ``127.0.0.1:8000`` and
  ``localhost:8000`` in the block stand for its address;
- ``continue``: a python block that continues the page's previous python block (the same session);
- ``slow``: the block takes seconds (marked slow, as are those with ``serve`` or ``corpus``);
- ``replace OLD NEW``: a test-time substitution (OLD must occur), for a cost the suite cannot pay, such as the
  number of training steps; the code path is the block's own;
- ``exec`` (every ``txl`` line of a shell block, run in this process; a block of no ``txl`` line runs with
  bash, and ``curl`` fails on an HTTP error) or ``exec=PREFIXES`` (the ``txl`` lines whose command starts with
  one of the comma-separated prefixes, e.g. ``eval,generate`` or ``data list``): shell commands run for real,
  each expected to succeed; other lines are only parsed.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import json
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import tomllib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import write_text_corpus

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
SHELL = ("bash", "console", "sh", "shell")
LANGUAGES = ("python", *SHELL, "text", "toml", "json", "jsonl", "yaml")
CLONE_ONLY_DIRS = ("benchmarks/", "examples/", "tools/", "tests/")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`]*)$")
DIRECTIVE = re.compile(r"^\s*<!--\s*test:(?P<body>.*?)-->\s*$")
SNIPPET = re.compile(r'^\s*--8<--\s+"(?P<path>[^"]+)"\s*$')
KEYS = ("run", "corpus", "file", "original", "serve", "exec")
FLAGS = ("continue", "exec", "slow")


# ---------------------------------------------------------------------------------------------------------
# The blocks
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Block:
    """One fenced code block: where it is, its language and code, the directive above it, and the prose a
    reader has seen in its section before it (and in its page's introduction)."""

    page: Path
    line: int
    lang: str
    code: str
    directive: dict[str, list[str]] = field(default_factory=dict)
    replace: list[tuple[str, str]] = field(default_factory=list)
    context: str = ""
    previous: Block | None = None
    """The page's python block before this one (for ``continue``)."""

    def __repr__(self) -> str:
        return f"Block({self.name}, {self.lang})"

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"

    def has(self, key: str) -> bool:
        return key in self.directive

    def values(self, key: str) -> list[str]:
        return [v for v in self.directive.get(key, []) if v]


def _directive(text: str, where: str) -> tuple[dict[str, list[str]], list[tuple[str, str]]]:
    found: dict[str, list[str]] = {}
    replace: list[tuple[str, str]] = []
    tokens = shlex.split(text)
    while tokens:
        token = tokens.pop(0)
        if token == "replace":
            assert len(tokens) >= 2, f"{where}: 'replace' takes OLD and NEW"
            replace.append((tokens.pop(0), tokens.pop(0)))
            continue
        key, _, value = token.partition("=")
        assert key in KEYS + FLAGS, f"{where}: unknown test directive {token!r}"
        assert value or key in FLAGS, f"{where}: {key} needs a value ({key}=...)"
        found.setdefault(key, []).append(value)
    return found, replace


def _page_lines(page: Path) -> list[tuple[Path, int, str]]:
    """The lines of a page, with those of the files it includes (pymdownx.snippets' ``--8<-- "FILE"``, FILE
    relative to the repository, as ``mkdocs build`` finds it), each with its file and line number."""
    out = []
    for number, text in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        included = SNIPPET.match(text)
        if included:
            out.extend(_page_lines(REPO / included["path"]))
        else:
            out.append((page, number, text))
    return out


def extract(page: Path) -> list[Block]:
    """The fenced code blocks of ``page`` in order."""
    blocks: list[Block] = []
    lines = _page_lines(page)
    intro: list[str] = []  # the page's text before its first level-2 heading
    section: list[str] = []  # the prose since the last heading
    seen_heading = False
    last_python: Block | None = None
    i = 0
    while i < len(lines):
        path, number, text = lines[i]
        opened = FENCE.match(text)
        if not opened:
            if text.startswith("#"):
                seen_heading = seen_heading or text.startswith("## ")
                section = []
            section.append(text)
            if not seen_heading:
                intro.append(text)
            i += 1
            continue
        indent, fence = len(opened["indent"]), opened["fence"]
        info = opened["info"].strip()
        lang = info.split()[0].lower() if info else ""
        body = []
        i += 1
        while i < len(lines) and not (
            lines[i][2].strip().startswith(fence) and set(lines[i][2].strip()) == {fence[0]}
        ):
            body.append(lines[i][2][indent:] if lines[i][2][:indent].strip() == "" else lines[i][2])
            i += 1
        i += 1  # the closing fence
        directive: dict[str, list[str]] = {}
        replace: list[tuple[str, str]] = []
        for above in reversed(section):  # the HTML comments right above the block
            if not above.strip():
                continue
            if not above.strip().startswith("<!--"):
                break
            match = DIRECTIVE.match(above)
            if match:
                directive, replace = _directive(match["body"], f"{path.name}:{number}")
        block = Block(
            path,
            number,
            lang,
            "\n".join(body) + "\n",
            directive,
            replace,
            context="\n".join(section + ["", *intro]),
            previous=last_python,
        )
        if lang == "python":
            last_python = block
        blocks.append(block)
        section.append(block.code)  # a later block's section includes this one's text (its comments)
    return blocks


BLOCKS = [block for page in PAGES for block in extract(page)]


def test_the_pages_have_blocks_to_check():
    """The extraction finds the blocks a reader sees (a guard against a parser that finds none)."""
    by_lang = {lang: sum(b.lang == lang for b in BLOCKS) for lang in LANGUAGES}
    assert by_lang["python"] >= 15 and by_lang["bash"] >= 25 and by_lang["toml"] >= 1, by_lang
    assert {b.page.name for b in BLOCKS} >= {"README.md", "getting-started.md", "python.md", "rl.md"}


# ---------------------------------------------------------------------------------------------------------
# Fixtures a block declares
# ---------------------------------------------------------------------------------------------------------


def _wikitext(folder: Path) -> None:
    """A small WikiText-style corpus: articles under `` = Title = `` headings, tokenized text."""
    words = write_text_corpus(folder / "source.txt").read_text(encoding="utf-8").split()[:6000]
    (folder / "source.txt").unlink()
    for split, part in (("train", words[:4000]), ("valid", words[4000:5000]), ("test", words[5000:])):
        lines = []
        for k in range(0, len(part), 250):
            lines += [f" = Article {split} {k} = ", "", " " + " ".join(part[k : k + 250]) + " ", ""]
        (folder / f"wiki.{split}.tokens").write_text("\n".join(lines) + "\n", encoding="utf-8")


def _corpus(data: Path, name: str) -> None:
    folder = data / name
    folder.mkdir(parents=True, exist_ok=True)
    if name == "tinyshakespeare":
        text = write_text_corpus(folder / "input.txt").read_text(encoding="utf-8")
        (folder / "input.txt").write_text(text[:60_000], encoding="utf-8")
    elif name == "wikitext-2":
        _wikitext(folder)
    else:
        raise AssertionError(f"no test corpus named {name!r} (corpus=tinyshakespeare or wikitext-2)")


def _prompt_file(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".jsonl":
        path.write_text('"class "\n{"prompt": "def wrap(text):"}\n', encoding="utf-8")
    else:
        path.write_text("ROMEO: What light through yonder window breaks?\n", encoding="utf-8")


def _original_weights(path: Path) -> None:
    """A small model's weights renamed to the authors' keys (the interop tests' own renaming)."""
    import torch

    from test_interop import _original_state
    from txl import TransformerXL, TransformerXLConfig

    config = TransformerXLConfig(
        vocab_size=40, n_layer=2, n_head=2, d_head=4, d_model=8, d_inner=16, mem_len=4
    )
    torch.save(_original_state(TransformerXL(config)), path)


@contextlib.contextmanager
def _served(run_dir: Path) -> Iterator[str]:
    """A live ``txl serve`` of ``run_dir`` in this process; yields its address (host:port)."""
    pytest.importorskip("fastapi", reason="txl serve needs fastapi: pip install 'transformer-xl[serve]'")
    pytest.importorskip("uvicorn", reason="txl serve needs uvicorn: pip install 'transformer-xl[serve]'")
    from serve_helpers import live_server
    from txl.runs import load_run
    from txl.serve.app import create_app

    with live_server(create_app(load_run(run_dir), run_dir=run_dir)) as url:
        yield url.removeprefix("http://")


@contextlib.contextmanager
def prepared(blocks: list[Block], folder: Path, trained_run: Path, monkeypatch) -> Iterator[str | None]:
    """Every fixture the ``blocks`` declare, in ``folder`` (the working folder, with ``TXL_DATA_DIR`` in it);
    yields the address of the live server when one is declared."""
    data = folder / "data"
    data.mkdir(exist_ok=True)
    monkeypatch.chdir(folder)
    monkeypatch.setenv("TXL_DATA_DIR", str(data))
    for block in blocks:
        for path in block.values("run") + block.values("serve"):
            if not (folder / path).exists():
                shutil.copytree(trained_run, folder / path)
        for name in block.values("corpus"):
            _corpus(data, name)
        for name in block.values("file"):
            _prompt_file(folder / name)
        for name in block.values("original"):
            _original_weights(folder / name)
    served = [p for b in blocks for p in b.values("serve")]
    if not served:
        yield None
        return
    with _served(folder / served[0]) as address:
        yield address


def _code(block: Block, address: str | None) -> str:
    code = block.code
    for old, new in block.replace:
        assert old in code, f"{block.name}: the directive replaces {old!r}, which the block does not hold"
        code = code.replace(old, new)
    if address is not None:
        code = code.replace("127.0.0.1:8000", address).replace("localhost:8000", address)
    return code


def _optional(exc: ModuleNotFoundError) -> bool:
    """Whether a missing module is an optional package (the block then skips), not a module of txl's."""
    top = (exc.name or "").split(".")[0]
    return top not in ("", "txl", "_common") and not (REPO / "benchmarks" / f"{top}.py").exists()


# ---------------------------------------------------------------------------------------------------------
# python blocks
# ---------------------------------------------------------------------------------------------------------


def _chain(block: Block) -> list[Block]:
    """The blocks a python block runs after (``continue``), oldest first, and itself."""
    chain = [block]
    while chain[0].has("continue"):
        assert chain[0].previous is not None, f"{chain[0].name}: 'continue' with no python block before it"
        chain.insert(0, chain[0].previous)
    return chain


def check_python(block: Block, folder: Path, trained_run: Path, monkeypatch) -> None:
    chain = _chain(block)
    namespace: dict = {"__name__": "__main__"}
    with prepared(chain, folder, trained_run, monkeypatch) as address:
        for part in chain:
            try:
                exec(compile(_code(part, address), part.name, "exec"), namespace)  # noqa: S102 - the docs' code
            except ModuleNotFoundError as exc:
                if _optional(exc):
                    pytest.skip(f"{part.name} needs {exc.name}, which is not installed")
                raise


# ---------------------------------------------------------------------------------------------------------
# shell blocks
# ---------------------------------------------------------------------------------------------------------

SEPARATORS = {";", "&&", "||", "|", "(", ")", "&"}
ANSI_C = re.compile(r"\$'((?:[^'\\]|\\.)*)'")


@dataclass
class Command:
    """One simple command of a shell block: its words after the environment assignments, those assignments,
    and the line it starts on."""

    words: list[str]
    env: dict[str, str]
    line: int
    text: str


def commands(block: Block) -> list[Command]:
    """The simple commands of a shell block (or the ``$ `` lines of a console transcript), with backslash
    continuations joined, comments dropped, ``$'...'`` decoded as bash does, and a ``for VAR in A B`` loop's
    variable read as its first value."""
    lines = block.code.splitlines()
    if block.lang in ("console", "text"):
        lines = [line[2:] if line.startswith("$ ") else "" for line in lines]
    found: list[Command] = []
    variables: dict[str, str] = {}
    number = 0
    while number < len(lines):
        start, text = number, lines[number]
        while text.endswith("\\") and number + 1 < len(lines):
            number += 1
            text = text[:-1] + " " + lines[number].strip()
        number += 1
        text = ANSI_C.sub(lambda m: shlex.quote(codecs.decode(m[1], "unicode_escape")), text)
        lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words: list[str] = []
        for token in [*list(lexer), ";"]:
            if token not in SEPARATORS:
                words.append(token)
                continue
            while words and words[0] in ("do", "then", "else"):
                words.pop(0)
            if not words or words == ["done"] or words == ["fi"]:
                words = []
                continue
            if words[0] == "for":
                assert len(words) >= 4 and words[2] == "in", f"{block.name}: a for loop as 'for X in A B'"
                variables[words[1]] = words[3]
                words = []
                continue
            for name, value in variables.items():
                words = [w.replace(f"${name}", value).replace(f"${{{name}}}", value) for w in words]
            env = {}
            while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                name, _, value = words.pop(0).partition("=")
                env[name] = value
            found.append(Command(words, env, block.line + 1 + start, text))
            words = []
    return found


class _Parsed(Exception):
    """Raised once a script's argparse parser has parsed its arguments: the script does no work."""


@contextlib.contextmanager
def _parse_only() -> Iterator[None]:
    """Make the outermost ``ArgumentParser.parse_args`` (or ``parse_known_args``) call raise :class:`_Parsed`
    once it has parsed (its errors still exit with status 2, as they would for the user)."""
    real = {name: getattr(argparse.ArgumentParser, name) for name in ("parse_args", "parse_known_args")}
    depth = [0]

    def stopping(name: str):
        def parse(self, args=None, namespace=None):
            depth[0] += 1
            try:
                result = real[name](self, args, namespace)
            finally:
                depth[0] -= 1
            if depth[0] == 0:
                raise _Parsed(result)
            return result

        return parse

    for name in real:
        setattr(argparse.ArgumentParser, name, stopping(name))
    try:
        yield
    finally:
        for name, method in real.items():
            setattr(argparse.ArgumentParser, name, method)


def _parse_script(where: str, target: str, args: list[str], *, module: bool, monkeypatch) -> None:
    """Run a script (a path of the repository) or a module until its argparse parser has parsed ``args``."""
    if not module:
        path = REPO / target
        assert path.is_file(), f"{where}: {target} is not a file of the repository"
        monkeypatch.syspath_prepend(str(path.parent))
    monkeypatch.setattr(sys, "argv", [target, *args])
    try:
        with _parse_only(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # import-time notes of the script and runpy's about txl.rl
            if module:
                runpy.run_module(target, run_name="__main__", alter_sys=True)
            else:
                runpy.run_path(str(REPO / target), run_name="__main__")
    except _Parsed:
        return
    except SystemExit as exc:
        assert exc.code in (0, None), f"{where}: {target} refused its arguments {args} (status {exc.code})"
        return
    except ModuleNotFoundError as exc:
        if _optional(exc):
            pytest.skip(f"{where}: {target} needs {exc.name}, which is not installed")
        raise
    raise AssertionError(f"{where}: {target} ran to its end without parsing arguments with argparse")


def _parse_txl(where: str, argv: list[str]) -> None:
    from txl.cli import build_parser

    try:
        build_parser().parse_args(argv)
    except SystemExit as exc:  # --help, --version
        assert exc.code in (0, None), f"{where}: txl {shlex.join(argv)} exits with {exc.code}"
    except Exception as exc:  # noqa: BLE001 - txl's parser raises its one-line usage error
        raise AssertionError(f"{where}: txl refuses 'txl {shlex.join(argv)}': {exc}") from None


def _check_pip(where: str, words: list[str]) -> bool:
    """A ``pip install`` line: real requirements, txl's real extras, never the unrelated ``txl``; returns
    whether it needs a clone (an editable install)."""
    from packaging.requirements import InvalidRequirement, Requirement

    assert words[:1] == ["install"], (
        f"{where}: pip {' '.join(words)}: only 'pip install' lines are documented"
    )
    extras = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    clone = False
    items = iter(words[1:])
    for item in items:
        if item in ("--index-url", "--extra-index-url", "-i"):
            assert next(items, "").startswith("https://"), f"{where}: {item} takes a URL"
            continue
        if item in ("-e", "--editable"):
            item, clone = next(items, ""), True
            match = re.fullmatch(r"\.(\[(?P<extras>[\w,-]+)\])?", item)
            assert match, (
                f"{where}: pip install -e takes the clone's folder, '.' or '.[EXTRAS]', got {item!r}"
            )
            unknown = set((match["extras"] or "").split(",")) - extras - {""}
            assert not unknown, f"{where}: no extra {sorted(unknown)} in pyproject.toml"
            continue
        assert not item.startswith("-"), f"{where}: pip install option {item} has no rule here"
        try:
            requirement = Requirement(item)
        except InvalidRequirement as exc:
            raise AssertionError(f"{where}: {item!r} is not a requirement ({exc})") from None
        assert requirement.name != "txl", f"{where}: 'pip install txl' installs an unrelated program"
        if requirement.name == "transformer-xl":
            unknown = requirement.extras - extras
            assert not unknown, f"{where}: no extra {sorted(unknown)} in pyproject.toml"
    return clone


def _check_curl(where: str, words: list[str]) -> None:
    for flag, value in zip(words, words[1:], strict=False):
        if flag in ("-d", "--data", "--data-raw"):
            try:
                json.loads(value)
            except json.JSONDecodeError as exc:
                raise AssertionError(f"{where}: curl's data is not JSON: {value} ({exc})") from None


UTILITIES = ("export", "cd", "mkdir", "rm", "cp", "ls", "cat", "echo")


def check_command(block: Block, command: Command, monkeypatch) -> tuple[bool, list[str] | None]:
    """Check one command by the rule of its program: (whether only a clone can run it, the argv of txl when
    it is a txl command)."""
    where = f"{block.name} (line {command.line}: {command.text.strip()})"
    words = list(command.words)
    clone = command.env.get("PYTHONPATH", "").split(":")[0] == "src"
    if not words:  # an assignment alone (id=$(...): the command inside is its own)
        return clone, None
    if words[0] == "nice":
        words = words[3:] if words[1:2] == ["-n"] else words[1:]
    program = Path(words[0]).name
    args = words[1:]
    if program == "txl":
        _parse_txl(where, args)
        return clone, args
    if program in ("python", "python3"):
        if args[:2] == ["-m", "txl"]:
            _parse_txl(where, args[2:])
            return clone, args[2:]
        if args[:2] == ["-m", "pytest"]:
            for arg in args[2:]:
                if not arg.startswith("-") and "/" in arg:
                    assert (REPO / arg.split("::")[0]).exists(), f"{where}: no {arg} in the repository"
            return True, None
        if args[:2] == ["-m", "venv"]:
            return clone, None
        if args[:1] == ["-m"]:
            _parse_script(where, args[1], args[2:], module=True, monkeypatch=monkeypatch)
            return clone, None
        if args[:1] == ["-c"]:
            compile(args[1], where, "exec")
            return clone, None
        script = args[0]
        _parse_script(where, script, args[1:], module=False, monkeypatch=monkeypatch)
        return clone or script.startswith(CLONE_ONLY_DIRS), None
    if program == "torchrun":
        from torch.distributed.run import get_args_parser

        parsed = get_args_parser().parse_args(args)
        assert parsed.module and parsed.training_script == "txl", f"{where}: torchrun runs '-m txl'"
        _parse_txl(where, parsed.training_script_args)
        return clone, None
    if program in ("pip", "pip3"):
        return _check_pip(where, args) or clone, None
    if program == "git":
        assert args[:1] == ["clone"] and 2 <= len(args) <= 3, f"{where}: git clone URL [FOLDER]"
        return True, None
    if program == "mkdocs":
        assert args[:1] in (["serve"], ["build"]), f"{where}: mkdocs serve or mkdocs build"
        return True, None
    if program == "curl":
        _check_curl(where, args)
        return clone, None
    if program in UTILITIES:
        return clone, None
    raise AssertionError(
        f"{where}: no rule checks the command {program!r} (add one to {Path(__file__).name})"
    )


def _exec_selected(block: Block, argv: list[str]) -> bool:
    prefixes = block.values("exec")
    if not block.has("exec"):
        return False
    if not prefixes:
        return True
    line = " ".join(argv)
    return any(line == p or line.startswith(p + " ") for s in prefixes for p in s.split(","))


def check_shell(block: Block, folder: Path, trained_run: Path, monkeypatch, capsys) -> None:
    found = commands(block)
    assert found or block.lang == "text", f"{block.name}: a shell block with no command"
    to_run: list[list[str]] = []
    needs_clone = []
    for command in found:
        clone, argv = check_command(block, command, monkeypatch)
        if clone:
            needs_clone.append(command.text.strip())
        if argv is not None and _exec_selected(block, argv):
            to_run.append(argv)
    if needs_clone:
        said = "clone" in block.code.lower() or "clone" in block.context.lower()
        assert said, (
            f'{block.name}: {needs_clone[0]!r} runs only from a clone of the repository: say so ("from a '
            "clone\") in the block, its section or the page's introduction, or give the pip user's form"
        )
    if not block.has("exec"):
        return
    from txl.cli import main

    with prepared([block], folder, trained_run, monkeypatch) as address:
        if to_run:
            for argv in to_run:
                try:
                    code = main(argv)
                except SystemExit as exc:  # --help, --version
                    code = exc.code or 0
                err = capsys.readouterr().err
                assert code == 0, f"{block.name}: txl {shlex.join(argv)} exited with {code}: {err}"
            return
        assert not any(c.words and Path(c.words[0]).name == "txl" for c in found), (
            f"{block.name}: exec selects none of the block's txl lines"
        )
        for tool in ("bash", "curl"):
            if shutil.which(tool) is None and tool in ("bash", *(c.words[0] for c in found if c.words)):
                pytest.skip(f"{block.name} runs {tool}, which is not installed here")
        script = 'set -euo pipefail\ncurl() { command curl --fail-with-body "$@"; }\n' + _code(block, address)
        done = subprocess.run(
            ["bash", "-c", script], capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, f"{block.name}: the block failed:\n{done.stdout}\n{done.stderr}"


# ---------------------------------------------------------------------------------------------------------
# Blocks that are not code
# ---------------------------------------------------------------------------------------------------------

CONFIG_SECTIONS = {"model", "data", "train", "eval", "generate"}


def check_data(block: Block, folder: Path) -> None:
    if block.lang == "toml":
        data = tomllib.loads(block.code)
        if CONFIG_SECTIONS & set(data):
            from txl.config import load_config

            path = folder / "block.toml"
            path.write_text(block.code, encoding="utf-8")
            load_config(path)
    elif block.lang == "json":
        json.loads(block.code)
    elif block.lang == "jsonl":
        for line in block.code.splitlines():
            if line.strip():
                json.loads(line)
    elif block.lang == "yaml":
        yaml = pytest.importorskip("yaml", reason="a yaml block needs PyYAML (lm-eval brings it)")
        data = yaml.safe_load(block.code)
        assert isinstance(data, dict), f"{block.name}: a YAML mapping"
        if "output_type" in data:
            assert "task" in data, f"{block.name}: an lm-eval task names its task"


# ---------------------------------------------------------------------------------------------------------
# The test: one per block
# ---------------------------------------------------------------------------------------------------------

SLOW = ("serve", "corpus", "slow")
"""Directives whose blocks take seconds (a live server, training or lm-eval on a corpus, or ``slow`` said
outright): marked slow."""


def _param(block: Block):
    marks = [pytest.mark.slow] if any(block.has(key) for key in SLOW) else []
    return pytest.param(block, id=block.name, marks=marks)


@pytest.mark.parametrize("block", [_param(b) for b in BLOCKS])
def test_block(block: Block, tmp_path, trained_run, monkeypatch, capsys):
    assert block.lang in LANGUAGES, (
        f"{block.name}: a code block of language {block.lang or '(none)'!r}, which no rule checks; "
        f"give it one of {', '.join(LANGUAGES)}"
    )
    if block.lang == "python":
        check_python(block, tmp_path, trained_run, monkeypatch)
    elif block.lang in SHELL or (
        block.lang == "text" and any(x.startswith("$ ") for x in block.code.splitlines())
    ):
        check_shell(block, tmp_path, trained_run, monkeypatch, capsys)
    elif block.lang != "text":
        check_data(block, tmp_path)
    assert not (block.directive or block.replace) or block.lang in ("python", *SHELL), (
        f"{block.name}: a test directive on a {block.lang} block, which nothing runs"
    )
