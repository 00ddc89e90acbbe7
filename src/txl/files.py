"""Atomic file writes: the one helper every file txl writes goes through (run files, vocabularies, encoded
splits, reports). A file is written under a temporary name in its folder, flushed to disk and renamed into
place, so a reader or a killed writer never sees half a file. Folders (checkpoints) are made atomic by
``txl.checkpoint`` with the same write-then-rename idea.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_open", "atomic_write_text", "new_file_mode"]


def new_file_mode() -> int:
    """0666 less this process's umask: the permissions ``open`` gives a new file, which every file txl writes
    has (files written by libraries that make them 0600, safetensors', are set to it)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return 0o666 & ~int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # read it by setting it (where /proc does not say), then put it back
    os.umask(mask)
    return 0o666 & ~mask


def _create_temporary(path: Path) -> tuple[int, Path]:
    """Create ``.NAME.RANDOM.tmp`` next to ``path`` for writing, with the permissions of any new file (0666
    less the umask, as ``open`` gives): not ``tempfile.mkstemp``'s 0600, which the rename would carry over,
    so that some run files were private and others not."""
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            return os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"{path.parent}: no free temporary name for {path.name}")


@contextmanager
def atomic_open(path: str | os.PathLike[str], mode: str = "w") -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path`` (``"w"``: UTF-8 text, ``"wb"``: bytes) for the block; on
    success it is fsynced and renamed to ``path``, on any exception removed. The folder must exist."""
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = Path(path)
    fd, tmp = _create_temporary(path)
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
