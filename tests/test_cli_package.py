"""The CLI as a package of command objects: building the parser, ``--help``, ``--version`` and a mistyped
command import no torch; every command object is complete; ``settings_from`` builds a settings value from
parsed arguments."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from txl.cli import build_parser
from txl.cli.commands import COMMANDS, GROUPS, find
from txl.cli.options import settings_from

SRC = Path(__file__).resolve().parents[1] / "src"

_NO_TORCH = """
import contextlib, io, sys
from txl.cli import build_parser, main
build_parser()
for argv in ({argvs}):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    print(argv[0], code)
print("torch" in sys.modules)
"""


def test_the_parser_help_version_and_a_typo_import_no_torch():
    argvs = [
        ["--help"],
        ["--version"],
        ["trian", "--config", "tiny"],
        ["demo", "--help"],
        ["analyze", "memory", "--help"],
        ["eval", "run", "--tgt-len", "0"],
        ["rl", "train", "--help"],
    ]
    out = subprocess.run(
        [sys.executable, "-c", _NO_TORCH.format(argvs=", ".join(map(repr, argvs)))],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(SRC)},
        timeout=120,
    )
    lines = out.stdout.split("\n")
    assert lines[:-2] == ["--help 0", "--version 0", "trian 2", "demo 0", "analyze 0", "eval 2", "rl 0"], (
        out.stderr
    )
    assert lines[-2] == "False", "building the parser imported torch"


def test_every_command_is_complete_and_reachable():
    parse = build_parser().parse_args
    paths = [c.name if c.parent is None else f"{c.parent} {c.name}" for c in COMMANDS]
    assert len(set(paths)) == len(paths) == 20
    for command in COMMANDS:
        assert command.help and command.lower and command.workload in ("batches", "tokens")
        assert command.parent is None or command.parent in GROUPS
    assert parse(["data", "list"]).txl_command is find("data list")
    assert parse(["analyze", "recall", "--out", "x"]).txl_command is find("analyze recall")
    assert parse(["rl", "eval", "run"]).txl_command is find("rl eval")
    with pytest.raises(KeyError):
        find("analyze")


@dataclass(frozen=True)
class _Settings:
    mem_len: int | None = None
    tgt_len: int = 8
    progress: bool = True


def test_settings_from_takes_the_fields_args_has_and_the_values_given():
    args = argparse.Namespace(mem_len=4, tgt_len=16, device="cpu")
    assert settings_from(_Settings, args) == _Settings(mem_len=4, tgt_len=16)
    assert settings_from(_Settings, args, progress=False, tgt_len=2) == _Settings(4, 2, False)
    assert settings_from(_Settings, argparse.Namespace()) == _Settings()
    with pytest.raises(TypeError):
        settings_from(_Settings, args, device="cpu")  # not a field: refused, not dropped


@pytest.mark.parametrize("command", [["eval", "no-run"], ["harness", "no-run", "--tasks", "x"]])
def test_same_length_without_memory_is_refused_before_any_work(command, capsys):
    from txl.cli import main

    assert main([*command, "--mem-len", "0", "--same-length"]) == 2
    err = capsys.readouterr().err
    assert err == "txl: error: --same-length needs a memory: it cannot be used with --mem-len 0\n"
    assert main([*command, "--mem-len", "0", "--no-same-length"]) == 2  # allowed: the missing run is refused
    assert "--same-length" not in capsys.readouterr().err
