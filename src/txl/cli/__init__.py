"""``txl <command>``: builds the parser from the command objects (:mod:`txl.cli.commands`), runs the chosen one,
and turns the errors a user can fix into one ``txl: error: ...`` line with exit status 2. Building the parser
imports no torch; the command's thread policy is applied before its handler runs."""

from __future__ import annotations

import argparse
import copy
import math
import os
import re
import sys
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn, TextIO, cast

from .. import __version__
from ..errors import TxlError, TxlWarning
from ..files import check_output
from ..threads import at_launch
from .command import Command

__all__ = ["main", "build_parser", "FIELD_FLAGS", "with_flags"]


# ---------------------------------------------------------------------------------------------------------
# The library names settings fields; the command line names its flags (one table)
# ---------------------------------------------------------------------------------------------------------

FIELD_FLAGS: dict[str, str] = {
    "batch_size": "--batch-size",
    "check=False": "--no-check",
    "clamp_len": "--clamp-len",
    "documents": "--documents",
    "host": "--host",
    "include_path": "--include-path",
    "max_new_tokens": "--max-new-tokens",
    "mem_len": "--mem-len",
    "out": "--out",
    "overwrite": "--overwrite",
    "plots=False": "--no-plots",
    "port": "--port",
    "prompts": "--prompt",
    "resume": "--resume",
    "same_length": "--same-length",
    "sessions_max_bytes": "--sessions-max-bytes",
    "source": "--from",
    "steps": "--steps",
    "stride": "--stride",
    "tasks": "--tasks",
    "tgt_len": "--tgt-len",
    "train.steps": "--set train.steps",
    "vocab": "--vocab",
}
"""Each settings field that the library's messages name (:attr:`txl.errors.TxlError.fields`, the field of
:class:`txl.config.SameLengthOff`) and the flag that sets it on the command line."""


def with_flags(message: str, fields: Sequence[str], flags: Mapping[str, str] = FIELD_FLAGS) -> str:
    """``message`` with each of ``fields`` that it names (a whole word, not part of a dotted name or a path)
    written as its flag (``flags``, by default :data:`FIELD_FLAGS`): what the library says to a Python caller,
    said to a command line user."""
    for name in fields:
        flag = flags.get(name)
        if flag is not None:
            message = re.sub(rf"(?<![\w./-]){re.escape(name)}(?![\w/-]|\.\w)", flag, message)
    return message


# ---------------------------------------------------------------------------------------------------------
# Flag values: checked while parsing, so that the message names the flag
# ---------------------------------------------------------------------------------------------------------


class _UsageError(Exception):
    """A command line that argparse refused; ``main`` prints it as one line."""


class _StatesDefaults(argparse.HelpFormatter):
    """Help that states every option's default: `` (default: X)`` is added to the help of an option with a
    default (not None, False or an empty list) whose help does not already say it."""

    @staticmethod
    def _has_default(action: argparse.Action) -> bool:
        default = action.default
        return bool(action.option_strings) and not (
            default is None or default is False or default is argparse.SUPPRESS or default == []
        )

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and self._has_default(action):  # an option without help still shows it
            action = copy.copy(action)
            action.help = "default: %(default)s"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text == argparse.SUPPRESS or not self._has_default(action) or "default" in (text or ""):
            return text
        return f"{text} (default: %(default)s)"


class _HelpFormatter(_StatesDefaults, argparse.HelpFormatter):
    """Every parser's help formatter (see :class:`_StatesDefaults`)."""


class _RawHelpFormatter(_StatesDefaults, argparse.RawDescriptionHelpFormatter):
    """The same for the commands whose description is laid out by hand."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``txl: error: --tgt-len must be ..., got 0``, and whose
    help states the defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        value = re.fullmatch(r"argument (\S+): (must .*)", message, flags=re.DOTALL)  # from the checks below
        if value:
            raise _UsageError(f"{value[1]} {value[2]}")
        raise _UsageError(f"{message} (see '{self.prog} --help')")


def _number(kind: type, accept: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses a ``kind`` and refuses values ``accept`` rejects."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text}")
        return value

    parse.__name__ = expected
    return parse


_positive_int = _number(int, lambda v: v > 0, "a positive integer")
_non_negative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "a positive number")
_temperature = _number(float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0 (0 is greedy)")
_top_p = _number(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
_port = _number(int, lambda v: 0 <= v <= 65535, "a port number in 0..65535")


# ---------------------------------------------------------------------------------------------------------
# The parser, from the command objects
# ---------------------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``txl`` command, its flags and their help (imports no torch)."""
    from .commands import COMMANDS, GROUPS

    parser = _Parser(prog="txl", description="Transformer-XL language modelling.")
    parser.add_argument("--version", action="version", version=f"txl {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="with an operating-system error or out of memory, print the Python traceback too, for a bug "
        "report (default: off; TXL_DEBUG=1 does the same)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    groups: dict[str, Any] = {}
    for command in COMMANDS:
        where = sub
        if command.parent is not None:
            if command.parent not in groups:
                group = GROUPS[command.parent]
                p = sub.add_parser(group.name, help=group.help)
                groups[group.name] = p.add_subparsers(dest=group.dest, required=True)
            where = groups[command.parent]
        p = where.add_parser(
            command.name,
            help=command.help,
            description=command.description,
            formatter_class=_HelpFormatter if command.description is None else _RawHelpFormatter,
        )
        command.arguments(p)
        p.set_defaults(func=command.handler, txl_command=command)
    return parser


# ---------------------------------------------------------------------------------------------------------
# Running a command: outputs checked first, errors as one line
# ---------------------------------------------------------------------------------------------------------


def _note(message: str) -> None:
    print(f"txl: note: {message}", file=sys.stderr)


def _one_line_warnings(show: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints txl's own warnings as one ``txl: warning:`` line on stderr and
    passes the others to ``show``."""

    def show_warning(
        message: Warning | str,
        category: type[Warning],
        filename: str,
        lineno: int,
        file: TextIO | None = None,
        line: str | None = None,
    ) -> None:
        if issubclass(category, TxlWarning):
            print(f"txl: warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning


def _rank() -> int | None:
    """This process's rank when torchrun started it in a group of several, else None."""
    from ..distributed import under_torchrun

    return int(os.environ.get("RANK", "0")) if under_torchrun() else None


def _check_outputs(command: Command, args: argparse.Namespace) -> None:
    """Check every output path the command writes (its ``writes``) before any work starts: one
    ``txl: error:`` line naming the flag and the path, and nothing made."""
    for output in command.writes:
        value = getattr(args, output.attribute, None)
        if value is not None:
            check_output(value, flag=output.flag, kind=output.kind)


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed: MemoryError, or PyTorch's CPU or CUDA allocator."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def _os_error_line(exc: OSError) -> str:
    """``[Errno 28] No space left on device: 'runs/x/metrics.jsonl'`` -> ``runs/x/metrics.jsonl: no space
    left on device``."""
    if exc.filename is None:
        return str(exc)
    names = str(exc.filename) + ("" if exc.filename2 is None else f" -> {exc.filename2}")
    return f"{names}: {(exc.strerror or str(exc)).lower()}"


def _resume_command(command: Command, args: argparse.Namespace) -> str:
    """How a run is resumed from this command line (``txl train --resume``, ``txl rl train --resume``): what
    the library's ``resume`` is called in its messages (a command without ``--resume``: ``txl train``'s)."""
    if not hasattr(args, "resume"):
        return "txl train --resume"
    return " ".join(["txl", *([command.parent] if command.parent else []), command.name, "--resume"])


def _handler(command: Command, rank: int | None) -> Callable[[argparse.Namespace], int]:
    """The command's handler; under torchrun wrapped in torch's ``record``, so that a process that fails with
    an exception has its rank and traceback reported by torchrun."""
    if rank is None:
        return command.handler
    from torch.distributed.elastic.multiprocessing.errors import record

    return cast(Callable[[argparse.Namespace], int], record(command.handler))


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``txl ARGV`` (default: the process's arguments) and return its exit status; errors are one line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(f"txl: error: {exc}", file=sys.stderr)
        return 2
    command: Command = args.txl_command
    at_launch(command.workload)  # the command's thread policy, before anything imports torch
    args.argv = argv
    debug = args.debug or os.environ.get("TXL_DEBUG", "") not in ("", "0")
    rank = _rank()
    where = "" if rank is None else f"[rank {rank}] "  # under torchrun: which process says it
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default", TxlWarning)  # each message once per place, even when seen before
            if rank:  # the same warnings come from every process: rank 0 says them
                warnings.simplefilter("ignore", TxlWarning)
            warnings.showwarning = _one_line_warnings(warnings.showwarning)
            _check_outputs(command, args)
            return _handler(command, rank)(args)
    except TxlError as exc:
        from ..train.trainer import Interrupted

        flags = {**FIELD_FLAGS, "resume": _resume_command(command, args)}
        if isinstance(exc, Interrupted):  # the checkpoint is saved: the run can go on, this is no error
            if not rank:
                _note(with_flags(str(exc), exc.fields, flags))
            return _stopped_status(128 + exc.signum)
        print(f"txl: error: {where}{with_flags(str(exc), exc.fields, flags)}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        if debug:
            traceback.print_exc()
        print(f"txl: error: {where}{exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a file system gone read-only, ... after the start
        if debug:
            traceback.print_exc()
        print(f"txl: error: {where}{_os_error_line(exc)}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise
        if debug:
            traceback.print_exc()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        print(f"txl: error: {where}out of memory ({first}); lower {command.lower}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if not rank:
            print("txl: interrupted", file=sys.stderr)
        return _stopped_status(130)


def _stopped_status(status: int) -> int:
    """The exit status of a process stopped by a signal: 0 for a rank that ``txl train --nproc`` launched
    (its launcher reports the signal; a non-zero status would make torchrun print a failure report)."""
    from ..distributed import LAUNCHED_BY_TXL

    return 0 if os.environ.get(LAUNCHED_BY_TXL) == "1" and _rank() is not None else status
