"""The command object: what one ``txl`` command declares (its arguments, handler, outputs, thread workload and
advice when memory runs out), so that the parser, the output checks and the thread policy read it in one place."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass

from ..files import OutputKind
from ..threads import Workload

__all__ = ["Command", "Group", "Output"]


@dataclass(frozen=True)
class Output:
    """A path the command writes, checked before any work starts (:func:`txl.files.check_output`)."""

    attribute: str
    """The parsed argument that holds the path (``out``); a value of None is not checked."""
    flag: str
    """The flag or argument the error message names (``--out``, ``DST``)."""
    kind: OutputKind = "folder"
    """A folder to create or fill, or one file."""


@dataclass(frozen=True)
class Group:
    """A command that only holds subcommands (``txl data``, ``txl analyze``)."""

    name: str
    """The word on the command line."""
    help: str
    """One line in ``txl --help``."""
    dest: str
    """The attribute of the parsed arguments that holds the chosen subcommand's name."""


@dataclass(frozen=True)
class Command:
    """One ``txl`` command: ``txl NAME`` or, with a ``parent`` group, ``txl PARENT NAME``."""

    name: str
    """The word on the command line."""
    help: str
    """One line in the help of its parent (``txl --help``)."""
    arguments: Callable[[argparse.ArgumentParser], None]
    """Adds the command's arguments to its parser."""
    handler: Callable[[argparse.Namespace], int]
    """Runs the command with the parsed arguments and returns its exit status."""
    parent: str | None = None
    """The :class:`Group` it belongs to (None: a top-level command)."""
    description: str | None = None
    """The text of ``txl ... NAME --help``, laid out by hand (None: the help line only)."""
    writes: tuple[Output, ...] = ()
    """The paths it writes, checked before its handler runs."""
    workload: Workload = "batches"
    """Its parallel work, for the thread policy (:mod:`txl.threads`)."""
    lower: str = "the lengths and batch sizes"
    """What to lower when an allocation fails deep inside (``txl: error: out of memory (...); lower ...``)."""
