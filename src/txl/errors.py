"""Errors shared across txl. Each is a ValueError whose message is one line that says what is wrong and
what to do, naming the settings' fields (``max_new_tokens``, ``eval.mem_len``); the CLI prints it with its flags
in their place and exits with a non-zero status."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = [
    "TxlError",
    "CheckpointError",
    "CorpusError",
    "RunError",
    "OutputPathError",
    "SizeError",
    "TxlWarning",
]


class TxlError(ValueError):
    """Base of txl's user-facing errors. ``fields``: the settings fields its message names (as a Python caller
    spells them, ``max_new_tokens``); the command line shows its own flag for each (``--max-new-tokens``)."""

    fields: tuple[str, ...] = ()

    def __init__(self, *args: object, fields: Iterable[str] = ()) -> None:
        super().__init__(*args)
        self.fields = tuple(fields)


class CheckpointError(TxlError):
    """A checkpoint that is missing, corrupt, truncated, or from another model or vocabulary."""


class CorpusError(TxlError):
    """A corpus could not be found or read; the message says what, which file, and what to do."""


class RunError(TxlError):
    """A run folder that cannot be used as asked (it holds another run, it has no checkpoint, ...)."""


class OutputPathError(TxlError):
    """An output path that cannot be written: under a file, on a read-only file system, not permitted, on a
    full disk, a folder where a file is wanted. The message names the field (or flag) and the path."""


class SizeError(TxlError):
    """A length or batch whose buffers cannot fit in the memory available; the message names the setting, the
    bytes it needs and what to lower."""


class TxlWarning(UserWarning):
    """Base of txl's warnings: something was done differently from what was asked, or may surprise; the CLI
    prints each as one ``txl: warning:`` line."""
