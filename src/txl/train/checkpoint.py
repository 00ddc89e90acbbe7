"""Checkpoints: weights in safetensors, everything else (config, step, stream position, optimizer
hyper-parameters) in JSON, tensors of state (optimizer moments, memory, RNG) in a second safetensors file.

A checkpoint is a folder ``checkpoints/step-00000100/`` written under a temporary name and renamed into
place, so a killed run never leaves a half-written checkpoint; nothing here unpickles anything.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from ..errors import CheckpointError
from ..model import Memory

__all__ = [
    "TrainingState",
    "save_checkpoint",
    "load_checkpoint",
    "list_checkpoints",
    "latest_checkpoint",
    "best_checkpoint",
    "prune_checkpoints",
    "load_weights",
    "atomic_write_text",
    "read_checkpoint_meta",
]

FORMAT_VERSION = 1


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


def atomic_write_text(path: Path, text: str) -> None:
    """Write a text file through a temporary file and a rename (never a half-written file)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


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


def _restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> None:
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


def save_checkpoint(folder: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                    memory: Memory | None, state: TrainingState, meta: dict[str, Any]) -> Path:
    """Write a checkpoint folder atomically. ``meta`` holds JSON facts checked on load (``config``: the
    model config dict, ``vocab_fingerprint``, ...). Returns the folder."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.with_name(f".tmp-{folder.name}-{os.getpid()}")
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_model(model, str(tmp / "model.safetensors"))
    tensors: dict[str, torch.Tensor] = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, rng in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"rng.cuda.{i}"] = rng
    if memory is not None:
        tensors.update({k: v.cpu() for k, v in memory.state_dict().items()})
    optim_meta = None
    if optimizer is not None:
        optim_tensors, optim_meta = _optimizer_tensors(optimizer)
        tensors.update(optim_tensors)
    save_file(tensors, str(tmp / "state.safetensors"))
    document = {"format": FORMAT_VERSION, "state": asdict(state), "optimizer": optim_meta, **meta}
    (tmp / "state.json").write_text(json.dumps(document, indent=1), encoding="utf-8")
    for name in ("model.safetensors", "state.safetensors", "state.json"):
        with open(tmp / name, "rb") as fh:
            os.fsync(fh.fileno())
    if folder.exists():  # re-saving the same step (e.g. after a resume): swap atomically, then clean up
        old = folder.with_name(f".old-{folder.name}-{os.getpid()}")
        os.rename(folder, old)
        os.rename(tmp, folder)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, folder)
    _fsync_dir(folder.parent)
    return folder


def read_checkpoint_meta(folder: Path) -> dict[str, Any]:
    """The JSON document of a checkpoint folder (CheckpointError when missing or corrupt)."""
    path = folder / "state.json"
    if not path.is_file():
        raise CheckpointError(f"{folder}: not a checkpoint (no state.json)")
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: corrupt checkpoint metadata ({exc})") from None
    if not isinstance(document, dict) or document.get("format") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: unknown checkpoint format")
    return document


def _check_meta(folder: Path, document: dict[str, Any], expected: dict[str, Any]) -> None:
    for key, what in (("vocab_fingerprint", "vocabulary"), ("corpus_fingerprint", "corpus")):
        if key in expected and document.get(key) != expected[key]:
            raise CheckpointError(f"{folder}: checkpoint was trained with another {what} "
                                  f"(fingerprint {str(document.get(key))[:12]}..., this run has "
                                  f"{str(expected[key])[:12]}...)")
    if "model" in expected:
        saved = document.get("model", {})
        sizes = ("vocab_size", "n_layer", "n_head", "d_head", "d_model", "d_inner", "d_embed", "attention",
                 "cutoffs", "div_val", "share_rel_bias", "tie_weights", "tie_projs", "pre_norm", "final_norm")
        diffs = [f"{k}={saved.get(k)!r} (expected {expected['model'].get(k)!r})" for k in sizes
                 if saved.get(k) != expected["model"].get(k)]
        if diffs:
            raise CheckpointError(f"{folder}: checkpoint is from another model size: {', '.join(diffs)}")


def load_weights(folder: Path, model: nn.Module, *, expected: dict[str, Any] | None = None) -> dict[str, Any]:
    """Load the weights of a checkpoint folder into ``model`` (checking ``expected`` facts first);
    returns the checkpoint's JSON document."""
    folder = Path(folder)
    document = read_checkpoint_meta(folder)
    _check_meta(folder, document, expected or {})
    path = folder / "model.safetensors"
    if not path.is_file():
        raise CheckpointError(f"{folder}: checkpoint has no model.safetensors")
    try:
        missing, unexpected = load_model(model, str(path), strict=False)
    except Exception as exc:  # noqa: BLE001 - safetensors raises several types for damaged files
        raise CheckpointError(f"{path}: corrupt or truncated weights ({type(exc).__name__}: {exc})") from None
    if missing or unexpected:
        raise CheckpointError(f"{path}: weights do not fit this model (missing {sorted(missing)[:3]}, "
                              f"unexpected {sorted(unexpected)[:3]})")
    return document


def load_checkpoint(folder: Path, *, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                    expected: dict[str, Any] | None = None,
                    restore_rng: bool = True) -> tuple[TrainingState, Memory | None, dict[str, Any]]:
    """Restore model weights, optimizer state, RNG state; return the training state, memory and JSON document."""
    folder = Path(folder)
    document = load_weights(folder, model, expected=expected)
    try:
        tensors = load_file(str(folder / "state.safetensors"))
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"{folder / 'state.safetensors'}: corrupt or truncated state "
                              f"({type(exc).__name__}: {exc})") from None
    if optimizer is not None:
        if document.get("optimizer") is None:
            raise CheckpointError(f"{folder}: checkpoint has no optimizer state")
        _restore_optimizer(optimizer, tensors, document["optimizer"])
    if restore_rng:
        torch.set_rng_state(tensors["rng.torch"])
        if torch.cuda.is_available():
            cuda = [tensors[k] for k in sorted(t for t in tensors if t.startswith("rng.cuda."))]
            if len(cuda) == torch.cuda.device_count():
                torch.cuda.set_rng_state_all(cuda)
    memory = Memory.from_state_dict(tensors)
    return TrainingState(**document["state"]), memory, document


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Step checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    return sorted((p for p in root.glob("step-*") if p.is_dir()), key=lambda p: p.name)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest step checkpoint, or None."""
    found = list_checkpoints(run_dir)
    return found[-1] if found else None


def best_checkpoint(run_dir: Path) -> Path | None:
    """The checkpoint with the best validation loss, if one was kept."""
    best = Path(run_dir) / "checkpoints" / "best"
    return best if best.is_dir() else None


def prune_checkpoints(run_dir: Path, *, keep_last: int) -> None:
    """Delete all but the ``keep_last`` newest step checkpoints and leftovers of interrupted writes."""
    root = Path(run_dir) / "checkpoints"
    for stale in root.glob(".tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    for old in list_checkpoints(run_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
