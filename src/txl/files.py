"""Atomic file writes, the one helper every file txl writes goes through (written under a temporary name,
flushed, renamed into place), and the one check of an output path every writing command makes before it
starts (:func:`check_output`).
"""

from __future__ import annotations

import errno
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, Literal

from .errors import OutputPathError

__all__ = [
    "atomic_open",
    "atomic_write_text",
    "sync_folder",
    "temporaries_of",
    "new_file_mode",
    "check_output",
    "OutputKind",
]

OutputKind = Literal["folder", "file"]
"""What an output path names: a folder txl fills (a run, a report) or one file it writes (an ONNX model)."""

_REASONS = {
    errno.EROFS: "is on a read-only file system",
    errno.EACCES: "is not writable (permission denied)",
    errno.EPERM: "is not writable (operation not permitted)",
    errno.ENOSPC: "has no space left on its device",
    errno.EDQUOT: "has no space left (disk quota exceeded)",
}


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


def _temporary_name(path: Path, tag: str) -> Path:
    return path.with_name(f".{path.name}.{tag}.tmp")


def temporaries_of(path: str | os.PathLike[str]) -> list[Path]:
    """The temporary files of writes of ``path`` by :func:`atomic_open` that are still on disk: a write in
    progress, or one whose process was killed before it renamed its file into place (nothing else removes
    those; delete them only where no other process can be writing ``path``)."""
    path = Path(path)
    name = re.compile(re.escape(f".{path.name}.") + r"[0-9a-f]{8}\.tmp")
    return sorted(p for p in path.parent.glob(_temporary_name(path, "*").name) if name.fullmatch(p.name))


def _create_temporary(path: Path) -> tuple[int, Path]:
    """Create ``.NAME.RANDOM.tmp`` next to ``path`` for writing, with the permissions of any new file (0666
    less the umask, as ``open`` gives): not ``tempfile.mkstemp``'s 0600, which the rename would carry over,
    so that some run files were private and others not."""
    for _ in range(100):
        tmp = _temporary_name(path, secrets.token_hex(4))
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
        with os.fdopen(fd, mode, encoding="utf-8" if mode == "w" else None) as fh:
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


def sync_folder(folder: str | os.PathLike[str]) -> None:
    """fsync ``folder`` itself, so that the renames into it survive a crash (a no-op where the platform cannot
    open or sync a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _existing_ancestor(path: Path, flag: str) -> Path:
    """The deepest existing folder of ``path`` (``path`` itself when it is one); refuses a file on the way."""
    base = path
    while not base.exists():
        if base == base.parent:
            break
        base = base.parent
    if base.exists() and not base.is_dir():
        what = "exists and is not a folder" if base == path else f"is under {base}, which is a file"
        raise OutputPathError(f"{flag} {path}: {what}")
    return base


def check_output(path: str | os.PathLike[str], *, flag: str, kind: OutputKind = "folder") -> Path:
    """Refuse, before any work starts, an output ``path`` that the command given ``flag`` could not write.

    ``kind="folder"``: a folder to create or fill; ``kind="file"``: one file, written next to its name. The
    deepest existing folder on the way (the path itself, or the folder to create it in) must be a folder on
    a writable file system where this process may create entries, with space left: a probe (a folder when
    the path is still to be made, else a file) is created there and removed at once, so that nothing is left
    behind. Each failure is an :class:`~txl.errors.OutputPathError` whose one line names the flag and the
    path (``--out /mnt/ro/run: /mnt/ro is on a read-only file system``). Returns the path."""
    path = Path(path).expanduser()
    if kind == "file" and path.is_dir():
        raise OutputPathError(f"{flag} {path}: is a folder; give the name of the file to write")
    target = path if kind == "folder" else path.parent
    base = _existing_ancestor(target, flag)
    where = "" if base == path else f"{base} "
    try:
        if base == target:
            fd, probe = tempfile.mkstemp(prefix=".txl-probe-", dir=base)
            os.close(fd)
            os.unlink(probe)
        else:
            shutil.rmtree(tempfile.mkdtemp(prefix=".txl-probe-", dir=base))
        free = os.statvfs(base)
    except OSError as exc:
        reason = _REASONS.get(exc.errno or 0, f"cannot be written ({exc.strerror or exc})")
        raise OutputPathError(f"{flag} {path}: {where}{reason}") from None
    if free.f_blocks > 0 and free.f_bavail == 0:
        raise OutputPathError(f"{flag} {path}: {where}{_REASONS[errno.ENOSPC]}")
    return path
