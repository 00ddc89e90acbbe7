"""Errors shared across txl. Each is a ValueError whose message is one line that says what is wrong and
what to do; the CLI prints it and exits with a non-zero status."""

from __future__ import annotations

__all__ = ["TxlError", "CheckpointError", "CorpusError", "RunError", "TxlWarning"]


class TxlError(ValueError):
    """Base of txl's user-facing errors."""


class CheckpointError(TxlError):
    """A checkpoint that is missing, corrupt, truncated, or from another model or vocabulary."""


class CorpusError(TxlError):
    """A corpus could not be found or read; the message says what, which file, and what to do."""


class RunError(TxlError):
    """A run folder that cannot be used as asked (it holds another run, it has no checkpoint, ...)."""


class TxlWarning(UserWarning):
    """Base of txl's warnings: something was done differently from what was asked, or may surprise; the CLI
    prints each as one ``txl: warning:`` line."""
