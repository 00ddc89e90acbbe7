"""Atomic file writes: the one helper every file txl writes goes through (run files, vocabularies, encoded
splits, reports). A file is written under a temporary name in its folder, flushed to disk and renamed into
place, so a reader or a killed writer never sees half a file. Folders (checkpoints) are made atomic by
``txl.checkpoint`` with the same write-then-rename idea.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_open", "atomic_write_text"]


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path`` (``"w"``: UTF-8 text, ``"wb"``: bytes) for the block; on
    success it is fsynced and renamed to ``path``, on any exception removed. The folder must exist."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, mode, **({"encoding": "utf-8"} if mode == "w" else {})) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a UTF-8 text file atomically (see :func:`atomic_open`)."""
    with atomic_open(path) as fh:
        fh.write(text)
