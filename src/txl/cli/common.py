"""What several command handlers share: the ``--device`` check, the library's warnings said the CLI's way, and
the figures and durations of the summaries printed for a person."""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ..config import ConfigError
from . import _note

__all__ = ["check_device", "check_same_length", "library_warnings", "figures", "duration"]


def check_device(name: str) -> None:
    """Refuse ``--device NAME`` when it names no device here; the library's message names the config field
    (``train.device: ...``), this one the flag."""
    from ..device import resolve_device

    try:
        resolve_device(name)
    except ConfigError as exc:
        raise ConfigError(f"--device {name}: {str(exc).removeprefix('train.device: ')}") from None


def check_same_length(args: argparse.Namespace) -> None:
    """Refuse ``--same-length`` with ``--mem-len 0`` before any work, naming the flags (the rule is
    :class:`txl.config.Span`'s)."""
    from ..config import Span

    if args.mem_len is None or not args.same_length:
        return
    try:
        Span(args.mem_len, same_length=True)
    except ConfigError:
        raise ConfigError("--same-length needs a memory: it cannot be used with --mem-len 0") from None


@contextmanager
def library_warnings(args: argparse.Namespace) -> Iterator[None]:
    """Say what the library warned about, the CLI's way: same-length attention turned off for want of memory
    as a note naming the flag; the others once each, as :func:`txl.cli.main` shows warnings."""
    from ..config import SameLengthOff

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SameLengthOff)
        yield
    said = set()
    for warning in caught:
        message = str(warning.message)
        if message in said:  # the same warning for each sample: once
            continue
        said.add(message)
        if isinstance(warning.message, SameLengthOff):
            from . import FIELD_FLAGS

            flag = FIELD_FLAGS[warning.message.field]
            _note(warning.message.named(flag) if getattr(args, warning.message.field, None) == 0 else message)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)


def figures(record: dict[str, Any], prefix: str = "") -> str:
    """``loss 2.3451, ppl 10.43, bpc 1.8812`` from a record's ``{prefix}loss``, ppl and bits (bpc, bpb, or
    bits per token where a token is neither a character nor a byte)."""
    bits = next((name for name in ("bpc", "bpb") if f"{prefix}{name}" in record), "bits_per_token")
    label = "bits/token" if bits == "bits_per_token" else bits
    return (
        f"loss {record[prefix + 'loss']:.4f}, ppl {record[prefix + 'ppl']:.2f}, "
        f"{label} {record[prefix + bits]:.4f}"
    )


def duration(seconds: float) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"
