"""One checkpoint folder, given its path: weights in safetensors, the rest (config, step, stream position,
optimizer hyper-parameters) in JSON, state tensors in a second safetensors file; written and deleted
atomically, checksummed, never unpickled. Where a run keeps its checkpoints is :mod:`txl.runs`' job.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from .config import architecture_fields
from .errors import CheckpointError, TxlWarning
from .files import new_file_mode, sync_folder
from .model import Memory

__all__ = [
    "CheckpointContents",
    "DamagedCheckpoint",
    "ResumeWarning",
    "TrainingState",
    "save_checkpoint",
    "delete_checkpoint",
    "load_checkpoint",
    "load_weights",
    "load_rank_rng",
    "load_extra_tensors",
    "is_checkpoint",
    "read_checkpoint_meta",
    "verify_checkpoint",
    "checkpoint_step",
    "tidy_interrupted_saves",
]

FORMAT_VERSION = 1
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.safetensors"
META_FILE = "state.json"
RANK_RNG = "rng.rank."  # rng.rank.R.torch, rng.rank.R.cuda: the RNG states of rank R of a distributed run
EXTRA = "extra."  # extra.NAME: CheckpointContents.extra


class DamagedCheckpoint(CheckpointError):
    """A checkpoint whose files are missing, truncated or fail their checksum (an older one may be intact)."""


class ResumeWarning(TxlWarning):
    """A resumed run that is not exact, or that changes course (another checkpoint, another schedule)."""


@dataclass
class TrainingState:
    """Where a run stands: everything besides tensors needed to continue it exactly."""

    step: int = 0
    tokens: int = 0
    best_val_loss: float | None = None
    bad_evals: int = 0
    elapsed: float = 0.0
    train_seconds: float = 0.0
    stream: dict[str, Any] = field(default_factory=dict)
    world_size: int = 1
    """Processes that trained the run when the checkpoint was taken (each has its RNG state in it)."""


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    state = optimizer.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, dict[str, Any]] = {}
    for pid, values in state["state"].items():
        for key, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"optim.{pid}.{key}"] = value.detach().contiguous().cpu()
            else:
                scalars.setdefault(str(pid), {})[key] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def _restore_optimizer(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]
) -> None:
    state: dict[int, dict[str, Any]] = {}
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, pid, key = name.split(".", 2)
            state.setdefault(int(pid), {})[key] = value
    for pid, values in meta.get("scalars", {}).items():
        state.setdefault(int(pid), {}).update(values)
    try:
        optimizer.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    except (ValueError, KeyError) as exc:
        raise CheckpointError(f"optimizer state does not fit this model ({exc})") from None


@dataclass(frozen=True)
class CheckpointContents:
    """What one checkpoint holds, given to :func:`save_checkpoint`."""

    model: nn.Module
    """The model whose weights are saved (model.safetensors)."""
    optimizer: torch.optim.Optimizer | None = None
    """The optimizer whose moments and hyper-parameters are saved; None for weights alone."""
    memory: Memory | None = None
    """The memory of every stream of the batch (all B rows), or None."""
    state: TrainingState = field(default_factory=TrainingState)
    """Where the run stands (step, tokens, stream position, ...)."""
    meta: Mapping[str, Any] = field(default_factory=dict)
    """JSON facts checked on load (``model``: the model config dict, ``vocab_fingerprint``, ...)."""
    rank_rng: Sequence[Mapping[str, torch.Tensor]] = ()
    """The RNG states of each process of a distributed run, in rank order (``{"torch": ..., "cuda": ...}``;
    see :func:`load_rank_rng`)."""
    extra: Mapping[str, torch.Tensor] = field(default_factory=dict)
    """Other tensors to keep with the run's state, by name (a reinforcement-learning run's collector: its
    memory, last observations, episode starts); read back with :func:`load_extra_tensors`."""

    def __post_init__(self) -> None:
        if not isinstance(self.model, nn.Module):
            raise TypeError(f"model: must be a torch.nn.Module, got {type(self.model).__name__}")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _write(tmp: Path, contents: CheckpointContents) -> None:
    """The files of a checkpoint, each fsynced, into the folder ``tmp``."""
    model, optimizer, memory = contents.model, contents.optimizer, contents.memory
    save_model(model, str(tmp / MODEL_FILE))
    os.chmod(tmp / MODEL_FILE, new_file_mode())  # safetensors writes 0600
    tensors: dict[str, torch.Tensor] = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, rng in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = rng
    for rank, states in enumerate(contents.rank_rng):
        tensors.update({f"{RANK_RNG}{rank}.{kind}": value.cpu() for kind, value in states.items()})
    if memory is not None:
        tensors.update({k: v.cpu() for k, v in memory.state_dict().items()})
    tensors.update(
        {f"{EXTRA}{name}": value.detach().contiguous().cpu() for name, value in contents.extra.items()}
    )
    optim_meta = None
    if optimizer is not None:
        optim_tensors, optim_meta = _optimizer_tensors(optimizer)
        tensors.update(optim_tensors)
    save_file(tensors, str(tmp / STATE_FILE))
    os.chmod(tmp / STATE_FILE, new_file_mode())
    files = {
        name: {"sha256": _sha256(tmp / name), "bytes": (tmp / name).stat().st_size}
        for name in (MODEL_FILE, STATE_FILE)
    }
    document = {
        "format": FORMAT_VERSION,
        "state": asdict(contents.state),
        "optimizer": optim_meta,
        "files": files,
        **contents.meta,
    }
    (tmp / META_FILE).write_text(json.dumps(document, indent=1), encoding="utf-8")
    for name in (MODEL_FILE, STATE_FILE, META_FILE):
        with open(tmp / name, "rb") as fh:
            os.fsync(fh.fileno())


def save_checkpoint(folder: Path, contents: CheckpointContents) -> Path:
    """Write ``contents`` as a checkpoint folder, atomically (replacing one of that name). Returns the folder. A failed write (a full disk) raises CheckpointError, removes the temporary folder and
    leaves every existing checkpoint as it was."""
    folder = Path(folder)
    tmp = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    old = folder.with_name(f".old-{folder.name}-{os.getpid()}")

    def undo() -> None:
        shutil.rmtree(tmp, ignore_errors=True)
        if old.exists() and not folder.exists():  # stopped between the two renames: put the old one back
            os.rename(old, folder)

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        _write(tmp, contents)
        if folder.exists():  # re-saving the same name (best, or a step after a resume): swap, then clean up
            os.rename(folder, old)  # a kill between the two renames is undone by tidy_interrupted_saves
            os.rename(tmp, folder)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, folder)
        sync_folder(folder.parent)
    except (OSError, SafetensorError) as exc:
        undo()
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise CheckpointError(f"cannot write checkpoint {folder.name} in {folder.parent}: {reason}") from None
    except BaseException:
        undo()
        raise
    return folder


def delete_checkpoint(folder: Path) -> None:
    """Delete a checkpoint folder, whole or not at all under its name: it is renamed to ``.del-NAME-PID``
    (one step: it stops being a checkpoint at once), then deleted file by file. A process killed during the
    deletion leaves only that hidden folder, which :func:`tidy_interrupted_saves` removes; deleted in place,
    a folder whose state.json went first was no longer a checkpoint, and was never deleted again."""
    folder = Path(folder)
    gone = folder.with_name(f".del-{folder.name}-{os.getpid()}")
    try:
        os.rename(folder, gone)
    except FileNotFoundError:
        return
    shutil.rmtree(gone, ignore_errors=True)


def is_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` holds a complete checkpoint's JSON document (its files are checked on load)."""
    return (Path(folder) / META_FILE).is_file()


def tidy_interrupted_saves(parent: Path) -> None:
    """Clean up after :func:`save_checkpoint` and :func:`delete_checkpoint` calls killed in the folder
    ``parent`` (call it while no other process writes there): put back a checkpoint whose replacement was
    interrupted between its two renames (``.old-NAME-PID`` without ``NAME``), and delete the ``.tmp-*``
    folders of interrupted writes, the ``.old-*`` ones already replaced and the ``.del-*`` ones of
    interrupted deletions."""
    parent = Path(parent)
    if not parent.is_dir():
        return
    for old in sorted(parent.glob(".old-*")):
        name = old.name[len(".old-") :].rsplit("-", 1)[0]
        if not (parent / name).exists() and is_checkpoint(old):
            os.rename(old, parent / name)
        else:
            shutil.rmtree(old, ignore_errors=True)
    for stale in (*parent.glob(".tmp-*"), *parent.glob(".del-*")):
        shutil.rmtree(stale, ignore_errors=True)


def read_checkpoint_meta(folder: Path) -> dict[str, Any]:
    """The JSON document of a checkpoint folder (DamagedCheckpoint when missing or corrupt)."""
    path = Path(folder) / META_FILE
    if not path.is_file():
        raise DamagedCheckpoint(f"{folder}: not a checkpoint (no {META_FILE})")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DamagedCheckpoint(f"{path}: corrupt checkpoint metadata ({exc})") from None
    except FileNotFoundError:  # replaced while being read
        raise DamagedCheckpoint(f"{folder}: not a checkpoint (no {META_FILE})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: {_format_problem(document)}")
    return document


def _format_problem(document: Any) -> str:
    """Why a checkpoint's JSON document is not one this version reads: its format, named."""
    found = document.get("format") if isinstance(document, dict) else None
    reads = f"this version of txl reads format {FORMAT_VERSION}"
    if isinstance(found, int) and not isinstance(found, bool) and found > FORMAT_VERSION:
        return f"checkpoint format {found}, written by a newer txl; {reads}: upgrade txl to read it"
    if found is None:
        return f"not a txl checkpoint document (no format field); {reads}"
    return f"unknown checkpoint format {found!r}; {reads}"


def checkpoint_step(folder: Path) -> int:
    """The step a checkpoint was taken at (from its state.json)."""
    return int(read_checkpoint_meta(folder).get("state", {}).get("step", 0))


def _identity(path: Path) -> tuple[int, int, int]:
    st = path.stat()
    return st.st_ino, st.st_size, st.st_mtime_ns


def _verify_file(folder: Path, name: str, document: dict[str, Any]) -> tuple[int, int, int]:
    """Check one tensor file against the SHA-256 in state.json (older checkpoints have none: only that it
    exists); returns its identity, to notice a file replaced while it is read."""
    path = Path(folder) / name
    try:
        identity = _identity(path)
    except FileNotFoundError:
        raise DamagedCheckpoint(f"{path}: missing from the checkpoint") from None
    recorded = (document.get("files") or {}).get(name)
    if recorded is not None:
        actual = _sha256(path)
        if actual != recorded.get("sha256"):
            raise DamagedCheckpoint(
                f"{path}: checksum mismatch, the file is corrupt (SHA-256 {actual[:12]}..., "
                f"{META_FILE} records {str(recorded.get('sha256'))[:12]}...)"
            )
    return identity


def verify_checkpoint(folder: Path) -> dict[str, Any]:
    """Check that a checkpoint is complete and its files match their checksums; returns its JSON document.
    Raises DamagedCheckpoint naming the first bad file."""
    document = read_checkpoint_meta(folder)
    for name in (MODEL_FILE, STATE_FILE):
        _verify_file(folder, name, document)
    return document


def _check_meta(folder: Path, document: dict[str, Any], expected: dict[str, Any]) -> None:
    for key, what in (("vocab_fingerprint", "vocabulary"), ("corpus_fingerprint", "corpus")):
        if key in expected and document.get(key) != expected[key]:
            raise CheckpointError(
                f"{folder}: checkpoint was trained with another {what} "
                f"(fingerprint {str(document.get(key))[:12]}..., this run has "
                f"{str(expected[key])[:12]}...)"
            )
    if "model" in expected:
        saved = document.get("model", {})
        diffs = [
            f"{k}={saved.get(k)!r} (expected {expected['model'].get(k)!r})"
            for k in architecture_fields()
            if saved.get(k) != expected["model"].get(k)
        ]
        if diffs:
            raise CheckpointError(f"{folder}: checkpoint is from another model size: {', '.join(diffs)}")


def _load_model_file(folder: Path, document: dict[str, Any], model: nn.Module) -> None:
    path = folder / MODEL_FILE
    before = _verify_file(folder, MODEL_FILE, document)
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for damaged files
        raise DamagedCheckpoint(
            f"{path}: corrupt or truncated weights ({type(exc).__name__}: {exc})"
        ) from None
    try:
        replaced = _identity(path) != before
    except FileNotFoundError:
        replaced = True
    if replaced:
        raise DamagedCheckpoint(f"{path}: replaced while it was read")
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not fit this model (missing {sorted(missing)[:3]}, "
            f"unexpected {sorted(unexpected)[:3]})"
        )


def load_weights(folder: Path, model: nn.Module, *, expected: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load the weights of a checkpoint folder into ``model`` (checking ``expected`` facts and the file's
    checksum first); returns the checkpoint's JSON document."""
    folder = Path(folder)
    document = read_checkpoint_meta(folder)
    _check_meta(folder, document, expected or {})
    _load_model_file(folder, document, model)
    return document


def _restore_rng(folder: Path, tensors: dict[str, torch.Tensor]) -> None:
    torch.set_rng_state(tensors["rng.torch"])
    names = sorted((t for t in tensors if t.startswith("rng.cuda.")), key=lambda t: int(t.rsplit(".", 1)[1]))
    if not names:
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if len(names) == count:
        torch.cuda.set_rng_state_all([tensors[k] for k in names])
    else:
        warnings.warn(
            f"{folder}: the checkpoint holds the CUDA random state of {len(names)} GPU(s), this machine "
            f"has {count}; it is not restored, so the resumed run is not exact (dropout draws differ)",
            ResumeWarning,
            stacklevel=3,
        )


def load_rank_rng(folder: Path) -> list[dict[str, torch.Tensor]]:
    """The RNG states saved for each process of a distributed run, in rank order (``[]`` for a run of one
    process, whose state is the checkpoint's own ``rng.torch``)."""
    folder = Path(folder)
    document = read_checkpoint_meta(folder)
    _verify_file(folder, STATE_FILE, document)
    states: dict[int, dict[str, torch.Tensor]] = {}
    with safe_open(str(folder / STATE_FILE), framework="pt") as fh:
        for name in fh.keys():  # noqa: SIM118 - safe_open has no __iter__
            if name.startswith(RANK_RNG):
                rank, kind = name[len(RANK_RNG) :].split(".", 1)
                states.setdefault(int(rank), {})[kind] = fh.get_tensor(name)
    return [states[rank] for rank in sorted(states)]


def load_extra_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """The tensors saved as :attr:`CheckpointContents.extra`, by name (checksum checked first)."""
    folder = Path(folder)
    document = read_checkpoint_meta(folder)
    _verify_file(folder, STATE_FILE, document)
    with safe_open(str(folder / STATE_FILE), framework="pt") as fh:
        return {
            name[len(EXTRA) :]: fh.get_tensor(name)
            for name in fh.keys()  # noqa: SIM118 - safe_open has no __iter__
            if name.startswith(EXTRA)
        }


def load_checkpoint(
    folder: Path,
    *,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    expected: dict[str, Any] | None = None,
    restore_rng: bool = True,
) -> tuple[TrainingState, Memory | None, dict[str, Any]]:
    """Restore model weights, optimizer state, RNG state; return the training state, memory and JSON document.
    Every file is checked (facts, checksums) before the model or optimizer is touched."""
    folder = Path(folder)
    document = read_checkpoint_meta(folder)
    _check_meta(folder, document, expected or {})
    _verify_file(folder, STATE_FILE, document)
    if optimizer is not None and document.get("optimizer") is None:
        raise CheckpointError(f"{folder}: checkpoint has no optimizer state")
    try:
        tensors = load_file(str(folder / STATE_FILE))
    except Exception as exc:  # noqa: BLE001
        raise DamagedCheckpoint(
            f"{folder / STATE_FILE}: corrupt or truncated state ({type(exc).__name__}: {exc})"
        ) from None
    _load_model_file(folder, document, model)
    if optimizer is not None:
        _restore_optimizer(optimizer, tensors, document["optimizer"])
    if restore_rng:
        _restore_rng(folder, tensors)
    memory = Memory.from_state_dict(tensors)
    return TrainingState(**document["state"]), memory, document
