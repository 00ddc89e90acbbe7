"""The run folder, the one owner of its layout (:class:`RunPaths`): where each file lives, refusing to clobber
another run, the training lock, the checkpoints' names and finding one, keeping the last few, and loading a
trained model back. One checkpoint folder is :mod:`txl.checkpoint`'s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint import (
    DamagedCheckpoint,
    ResumeWarning,
    checkpoint_step,
    delete_checkpoint,
    is_checkpoint,
    load_weights,
    tidy_interrupted_saves,
    verify_checkpoint,
)
from .config import ConfigError, RunConfig, config_from_dict, config_to_dict
from .data import Vocab, load_vocab
from .device import resolve_device
from .errors import CheckpointError, RunError
from .files import atomic_write_text, temporaries_of
from .model import TransformerXL

__all__ = [
    "RunPaths",
    "check_new_run_dir",
    "check_run_folder",
    "clear_run",
    "lock_run",
    "new_run_folder",
    "load_run_config",
    "load_config_to_resume",
    "save_run_config",
    "read_metrics",
    "truncate_metrics",
    "list_checkpoints",
    "latest_checkpoint",
    "best_checkpoint",
    "find_checkpoint",
    "newest_intact_checkpoint",
    "recover_checkpoints",
    "recover_run",
    "prune_checkpoints",
    "load_run",
    "LoadedRun",
]

LOCK_YOUNG_S = 10.0  # an unreadable lock file younger than this may be being written by its owner
STEP_NAME = re.compile(r"step-\d{8}")
BEST_NAME = "best"


@dataclass(frozen=True)
class RunPaths:
    """Where each file of a run lives."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.json"

    @property
    def vocab(self) -> Path:
        return self.root / "vocab.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def best(self) -> Path:
        """The folder of the best checkpoint (it may not exist yet)."""
        return self.checkpoints / BEST_NAME

    def checkpoint_at(self, step: int) -> Path:
        """The folder of the checkpoint taken after ``step`` steps (it may not exist yet)."""
        return self.checkpoints / f"step-{step:08d}"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def lock(self) -> Path:
        return self.root / ".lock"

    def files(self) -> tuple[Path, ...]:
        """The run's own files (each written whole, by :func:`txl.files.atomic_open`)."""
        return (self.config, self.vocab, self.metrics, self.summary)

    def holds_run(self) -> bool:
        return self.config.exists() or self.checkpoints.exists() or self.metrics.exists()


def check_new_run_dir(out: Path, *, overwrite: bool, resumable: bool = True) -> RunPaths:
    """Refuse a run folder that is not a folder, or that already holds a run unless ``overwrite``. Writes
    nothing: the run's files are cleared (:func:`clear_run`) only once its data has been checked.
    ``resumable``: the refusal may advise resuming the run there (training does; a conversion does not)."""
    paths = RunPaths(Path(out))
    if paths.root.exists() and not paths.root.is_dir():
        raise RunError(f"{paths.root} exists and is not a folder")
    if paths.holds_run() and not overwrite:
        resume = f"use 'resume {paths.root}' to continue it or " if resumable else "give "
        other = "" if resumable else "another folder, or "
        raise RunError(
            f"{paths.root} already holds a run; {resume}{other}overwrite to replace it",
            fields=("resume", "overwrite") if resumable else ("overwrite",),
        )
    return paths


def check_run_folder(root: Path) -> None:
    """Refuse (RunError, one line) a run folder that does not exist, or is a file."""
    if root.is_dir():
        return
    if root.exists():
        raise RunError(
            f"{root} is a file, not a run folder (a folder that txl train made, with config.json, "
            "vocab.json and checkpoints/)"
        )
    raise RunError(f"run folder not found: {root}")


def clear_run(paths: RunPaths) -> None:
    """Remove txl's own files from a run folder (and nothing else in it), with the temporaries of writes of
    them that a killed process left (call it holding the run's lock)."""
    for f in paths.files():
        for tmp in temporaries_of(f):
            tmp.unlink(missing_ok=True)
        f.unlink(missing_ok=True)
    for d in (paths.checkpoints, paths.tensorboard):
        shutil.rmtree(d, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------------
# The lock: one training process per run folder
# ---------------------------------------------------------------------------------------------------------


def _read_lock(path: Path) -> dict[str, Any] | None:
    """The lock's record; {} when unreadable, None when there is no lock file."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/PID/stat`` that follow the command name (the state first: field 3 of proc(5)),
    or None where there is no such file (no /proc, or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    return stat.rpartition(")")[2].split()  # the name, in parentheses, may hold spaces and parentheses


def _process_started(stat: list[str] | None) -> str | None:
    """When a process started, from its ``/proc/PID/stat`` fields: this boot's id and the clock tick of the
    start (field 22), which tell it from an earlier process that had the same pid; None where unknown."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
        return f"{boot}:{stat[19]}" if stat is not None else None
    except (OSError, IndexError):
        return None


def _pid_alive(pid: int, *, started: Any = None) -> bool:
    """Whether the process ``pid`` of this host may still hold what it took: it exists and is not a zombie
    (killed, not yet waited for by its parent), and when ``started`` (:func:`_process_started` of it, as
    recorded then) is known, it is that process and not a later one given the same pid."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        pass
    stat = _proc_stat(pid)
    if stat is None:  # no /proc here (or the process has just gone): the pid is all there is to go by
        return True
    if stat[:1] in (["Z"], ["X"]):
        return False
    now = _process_started(stat)
    return not isinstance(started, str) or now is None or now == started


def _lock_is_live(path: Path, record: dict[str, Any]) -> bool:
    """Whether a lock's owner may still run: its process is alive on this host (the same process, not a
    zombie nor a later one with its pid), or it is on another host (which cannot be checked from here), or
    the file is too young to have been written out."""
    if not isinstance(record.get("pid"), int) or not isinstance(record.get("host"), str):
        try:
            return time.time() - path.stat().st_mtime < LOCK_YOUNG_S
        except FileNotFoundError:
            return False
    if record["host"] != socket.gethostname():
        return True
    return _pid_alive(record["pid"], started=record.get("started"))


def _break_stale(path: Path, record: dict[str, Any]) -> None:
    """Move a stale lock out of the way: rename it (only one process can), then check that the file moved
    is the stale one and not a lock another process has just taken (put that one back)."""
    moved = path.with_name(f"{path.name}.stale-{os.getpid()}")
    try:
        os.rename(path, moved)
    except FileNotFoundError:
        return
    if _read_lock(moved) == record:
        moved.unlink(missing_ok=True)
        return
    try:
        os.link(moved, path)  # never over a lock taken meanwhile
    except FileExistsError:
        pass
    moved.unlink(missing_ok=True)


def _holder(record: dict[str, Any]) -> str:
    if "pid" in record:
        return f"pid {record.get('pid')} on {record.get('host')}"
    return "a process that is taking it now"


def _sweep_lock_drafts(path: Path) -> None:
    """Remove the drafts of locks (``.lock.HOST.PID.tmp``) left by processes of this host that are gone: a
    process killed after writing its draft and before linking it as the lock."""
    host = socket.gethostname()
    for draft in path.parent.glob(f"{path.name}.*.tmp"):
        owner, _, pid = draft.name[len(path.name) + 1 : -len(".tmp")].rpartition(".")
        if owner == host and pid.isdigit() and not _pid_alive(int(pid)):
            draft.unlink(missing_ok=True)


def _create_lock(path: Path, record: dict[str, Any]) -> None:
    """Create the lock ``path`` holding ``record``, whole or not at all: the record is written and fsynced
    into a draft next to it, then hard-linked as ``path`` (which, like O_CREAT|O_EXCL, fails with
    FileExistsError when ``path`` exists), so a process killed at any moment never leaves an empty lock."""
    draft = path.with_name(f"{path.name}.{record['host']}.{record['pid']}.tmp")
    try:
        fd = os.open(draft, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o666)  # less the umask
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(record))
            fh.flush()
            os.fsync(fh.fileno())
        os.link(draft, path)
    finally:
        draft.unlink(missing_ok=True)


@contextmanager
def lock_run(root: Path) -> Iterator[Path]:
    """Hold ``root/.lock`` (holding pid, host and when the process started as JSON, created whole by
    :func:`_create_lock`) for the duration of the block; a lock whose process is gone from this host (a
    zombie, or its pid now another process's) is replaced. Refuses (RunError) while another live process
    holds it. Released on exit, including on exceptions."""
    path = RunPaths(Path(root)).lock
    _sweep_lock_drafts(path)
    pid = os.getpid()
    mine = {"pid": pid, "host": socket.gethostname(), "since": time.time()}
    mine["started"] = _process_started(_proc_stat(pid))
    for _ in range(5):
        try:
            _create_lock(path, mine)
        except FileExistsError:
            record = _read_lock(path)
            if record is None:  # released meanwhile
                continue
            if _lock_is_live(path, record):
                raise RunError(
                    f"{path.parent} is in use: another process ({_holder(record)}) holds the run; "
                    f"wait for it to finish (if that process is gone, delete {path})"
                ) from None
            _break_stale(path, record)
            continue
        except FileNotFoundError:
            raise RunError(f"run folder not found: {path.parent}") from None
        break
    else:
        raise RunError(f"{path}: cannot take the run's lock (it keeps changing hands); try again")
    try:
        yield path
    finally:
        if _read_lock(path) == mine:
            path.unlink(missing_ok=True)


def _missing_folders(path: Path) -> list[Path]:
    """The folders ``path.mkdir(parents=True)`` would create, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


@contextmanager
def new_run_folder(paths: RunPaths, *, overwrite: bool) -> Iterator[None]:
    """Create the run folder (clearing an old run with ``overwrite``) and hold its lock for the block. If the
    block fails before a checkpoint exists, remove what was written and the folders made, so that the same
    command can run again."""
    created = _missing_folders(paths.root)
    paths.root.mkdir(parents=True, exist_ok=True)
    try:
        with lock_run(paths.root):
            # again, now that no one else can start one
            check_new_run_dir(paths.root, overwrite=overwrite)
            clear_run(paths)
            try:
                yield
            except BaseException:
                if latest_checkpoint(paths.root) is None and best_checkpoint(paths.root) is None:
                    clear_run(paths)
                raise
    finally:
        for folder in created:
            try:
                folder.rmdir()
            except OSError:  # not empty: the run is there
                break


def load_run_config(run_dir: Path) -> RunConfig:
    """The RunConfig saved in a run folder."""
    paths = RunPaths(Path(run_dir))
    check_run_folder(paths.root)
    if not paths.config.is_file():
        raise RunError(f"{paths.root} holds no run (no config.json)")
    try:
        return config_from_dict(json.loads(paths.config.read_text(encoding="utf-8")))
    except json.JSONDecodeError as exc:
        raise RunError(f"{paths.config}: corrupt ({exc})") from None
    except ConfigError as exc:
        raise RunError(f"{paths.config}: {exc}") from None


def load_config_to_resume(run_dir: Path) -> RunConfig:
    """The saved config of a run about to be resumed, read while holding the run's lock (:func:`lock_run`).
    A start writes config.json under that lock, so only there can a missing config.json be told apart: a
    start still writing its files is refused as in use (RunError naming its pid), and what one killed before
    it wrote config.json left (its lock, a half-written file: :func:`recover_run`) is cleared, not left
    behind, before RunError says the folder holds no run."""
    paths = RunPaths(Path(run_dir))
    check_run_folder(paths.root)
    with lock_run(paths.root):
        recover_run(paths.root)
        return load_run_config(paths.root)


@dataclass
class LoadedRun:
    """A trained model ready for evaluation or generation."""

    config: RunConfig
    vocab: Vocab
    model: TransformerXL
    checkpoint: Path
    step: int
    root: Path = Path(".")
    """The run folder it was loaded from."""


def save_run_config(run_dir: Path, config: RunConfig) -> None:
    """Write the run's effective config as config.json (atomically)."""
    atomic_write_text(RunPaths(Path(run_dir)).config, json.dumps(config_to_dict(config), indent=1) + "\n")


def _metric_lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each line of a metrics.jsonl with its record; a line cut short by a kill is skipped."""
    if not path.is_file():
        return
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            yield line, json.loads(line)
        except json.JSONDecodeError:
            continue


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    """The records of a run's metrics.jsonl."""
    return [record for _, record in _metric_lines(RunPaths(Path(run_dir)).metrics)]


def truncate_metrics(run_dir: Path, step: int) -> None:
    """Drop the metric lines logged after ``step`` (by a run killed after its last checkpoint) and the final
    evaluations (they are made again when the resumed run ends)."""
    path = RunPaths(Path(run_dir)).metrics
    if path.exists():
        kept = [
            line
            for line, record in _metric_lines(path)
            if record.get("step", 0) <= step and not record.get("final")
        ]
        atomic_write_text(path, "".join(f"{line}\n" for line in kept))


# ---------------------------------------------------------------------------------------------------------
# Checkpoints: their names, finding one, keeping the last few
# ---------------------------------------------------------------------------------------------------------


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Step checkpoints of a run (``step-XXXXXXXX`` folders holding a state.json), oldest first; never the
    temporary folders of a write in progress or interrupted."""
    root = RunPaths(Path(run_dir)).checkpoints
    if not root.is_dir():
        return []
    return sorted(
        (p for p in root.iterdir() if STEP_NAME.fullmatch(p.name) and is_checkpoint(p)), key=lambda p: p.name
    )


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest step checkpoint, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def best_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint with the best validation loss, if one was kept."""
    best = RunPaths(Path(run_dir)).best
    return best if is_checkpoint(best) else None


def recover_run(run_dir: Path) -> None:
    """Tidy a run folder after a process killed while it wrote there (call it holding the run's lock, so that
    no write is in progress): delete the temporaries of its files (a config.json, a metrics.jsonl or a
    summary.json that was being written) and tidy the checkpoints folder (:func:`recover_checkpoints`)."""
    paths = RunPaths(Path(run_dir))
    for f in paths.files():
        for tmp in temporaries_of(f):
            tmp.unlink(missing_ok=True)
    recover_checkpoints(paths.root)


def recover_checkpoints(run_dir: Path) -> None:
    """Tidy the checkpoints folder after a killed writer (call it holding the run's lock)."""
    tidy_interrupted_saves(RunPaths(Path(run_dir)).checkpoints)


def prune_checkpoints(run_dir: Path, *, keep_last: int) -> None:
    """Delete all but the ``keep_last`` newest step checkpoints and leftovers of interrupted writes."""
    recover_checkpoints(run_dir)
    for old in list_checkpoints(run_dir)[:-keep_last]:
        delete_checkpoint(old)


def newest_intact_checkpoint(run_dir: Path) -> Path:
    """The newest intact checkpoint (step folders and best, by step), to resume from. Damaged newer ones are
    skipped with a ResumeWarning; DamagedCheckpoint when none is intact, RunError when there is none."""
    root = Path(run_dir)
    ranked, damaged = [], []
    for folder in (*list_checkpoints(root), best_checkpoint(root)):
        if folder is None:
            continue
        try:
            ranked.append((checkpoint_step(folder), folder.name != BEST_NAME, folder))
        except DamagedCheckpoint as exc:
            damaged.append(str(exc))
    if not ranked and not damaged:
        raise RunError(
            f"{root} has no checkpoint to resume from; start it again with overwrite", fields=("overwrite",)
        )
    for step, _, folder in sorted(ranked, key=lambda r: r[:2], reverse=True):
        try:
            verify_checkpoint(folder)
        except DamagedCheckpoint as exc:
            damaged.append(str(exc))
            continue
        if damaged:
            warnings.warn(
                f"{'; '.join(damaged)}; resuming from the newest intact checkpoint {folder.name} "
                f"(step {step})",
                ResumeWarning,
                stacklevel=3,
            )
        return folder
    raise DamagedCheckpoint(f"{'; '.join(damaged)}; no intact checkpoint to resume from")


def find_checkpoint(run_dir: Path, name: str) -> Path:
    """A run's checkpoint by name: ``best`` (else the latest), ``latest``, a folder name inside
    ``checkpoints/`` (``step-00001750``), a step number (``1750``), or a path to a checkpoint folder."""
    paths = RunPaths(Path(run_dir))
    folder: Path | None
    if name == BEST_NAME:
        folder = best_checkpoint(paths.root) or latest_checkpoint(paths.root)
    elif name == "latest":
        folder = latest_checkpoint(paths.root)
    else:
        inside = paths.checkpoint_at(int(name)) if name.isdigit() else paths.checkpoints / name
        path = Path(name).expanduser()
        if name and not name.startswith(".") and "/" not in name and os.sep not in name and inside.is_dir():
            folder = inside
        elif path.is_dir() and not path.name.startswith("."):
            folder = path
        else:
            steps = [p.name for p in list_checkpoints(paths.root)]
            available = ", ".join(([BEST_NAME] if best_checkpoint(paths.root) else []) + steps) or "none yet"
            raise CheckpointError(
                f"no checkpoint {name!r} in {paths.checkpoints} (available: {available}; "
                "or 'best', 'latest', a step number, a path)"
            )
    if folder is None:
        raise CheckpointError(f"{paths.root} has no checkpoint yet")
    return folder


def load_run(run_dir: Path, *, checkpoint: str = "best", device: str = "cpu") -> LoadedRun:
    """Load a run's model in eval mode from a checkpoint named as :func:`find_checkpoint` takes them
    (default ``best``, else ``latest``). Only complete checkpoints are read, their checksums checked; one
    replaced by a run training meanwhile is looked up and read again once."""
    paths = RunPaths(Path(run_dir))
    config = load_run_config(paths.root)
    if not paths.vocab.is_file():
        raise RunError(f"{paths.root} has no vocab.json")
    vocab = load_vocab(paths.vocab)
    if len(vocab) != config.model.vocab_size:
        raise CheckpointError(
            f"{paths.vocab} has {len(vocab)} tokens, the run's model {config.model.vocab_size}"
        )
    model = TransformerXL(config.model)
    expected = {"vocab_fingerprint": vocab.fingerprint, "model": config_to_dict(config.model)}
    for attempt in range(2):
        folder = find_checkpoint(paths.root, checkpoint)
        try:
            document = load_weights(folder, model, expected=expected)
            break
        except DamagedCheckpoint:
            if attempt == 1:
                raise
    model.to(resolve_device(device)).eval()
    return LoadedRun(config, vocab, model, checkpoint=folder, step=document["state"]["step"], root=paths.root)
