"""Every ``txl`` command object, in the order of ``txl --help``, and the groups that hold subcommands."""

from __future__ import annotations

from .analyze import ANALYSES, ANALYZE, COMPARE
from .command import Command, Group
from .data import DATA, DOWNLOAD, LIST
from .demo import DEMO
from .eval import EVAL
from .generate import GENERATE
from .harness import HARNESS
from .interop import CONVERT, EXPORT
from .rl import RL, RL_EVAL, RL_PLOT, RL_TRAIN
from .serve import SERVE
from .train import TRAIN

__all__ = ["COMMANDS", "GROUPS", "find"]

COMMANDS: tuple[Command, ...] = (
    TRAIN,
    EVAL,
    GENERATE,
    SERVE,
    DEMO,
    DOWNLOAD,
    LIST,
    COMPARE,
    *ANALYSES,
    CONVERT,
    EXPORT,
    HARNESS,
    RL_TRAIN,
    RL_EVAL,
    RL_PLOT,
)
"""The commands :func:`txl.cli.build_parser` adds, in this order (a group where its first subcommand is)."""

GROUPS: dict[str, Group] = {group.name: group for group in (DATA, ANALYZE, RL)}
"""The groups, by name."""


def find(path: str) -> Command:
    """The command ``path`` names (``"eval"``, ``"analyze memory"``); KeyError for none."""
    for command in COMMANDS:
        if (command.name if command.parent is None else f"{command.parent} {command.name}") == path:
            return command
    raise KeyError(path)
