"""The run folder: its layout, refusing to clobber another run, and loading a trained model back.

    RUN_DIR/config.json      the effective RunConfig (model.vocab_size set from the vocabulary)
    RUN_DIR/vocab.json       the vocabulary (JSON, never pickled)
    RUN_DIR/metrics.jsonl    one JSON object per log step / evaluation
    RUN_DIR/summary.json     final figures
    RUN_DIR/checkpoints/     step-XXXXXXXX/ folders and best/
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import ConfigError, RunConfig, config_from_dict, config_to_dict
from .data import Vocab, load_vocab
from .errors import CheckpointError, RunError
from .model import TransformerXL
from .train.checkpoint import best_checkpoint, latest_checkpoint, load_weights

__all__ = ["RunPaths", "prepare_run_dir", "load_run_config", "load_run", "resolve_device", "LoadedRun"]


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
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    def holds_run(self) -> bool:
        return self.config.exists() or self.checkpoints.exists() or self.metrics.exists()


def prepare_run_dir(out: Path, *, overwrite: bool) -> RunPaths:
    """Create the run folder; refuse one that already holds a run unless ``overwrite`` (then remove only
    txl's own files from it)."""
    paths = RunPaths(Path(out))
    if paths.root.exists() and not paths.root.is_dir():
        raise RunError(f"{paths.root} exists and is not a folder")
    if paths.holds_run():
        if not overwrite:
            raise RunError(f"{paths.root} already holds a run; use 'txl train --resume {paths.root}' to continue "
                           "it or --overwrite to replace it")
        for f in (paths.config, paths.vocab, paths.metrics, paths.summary):
            f.unlink(missing_ok=True)
        for d in (paths.checkpoints, paths.tensorboard):
            shutil.rmtree(d, ignore_errors=True)
    paths.root.mkdir(parents=True, exist_ok=True)
    return paths


def load_run_config(run_dir: Path) -> RunConfig:
    """The RunConfig saved in a run folder."""
    paths = RunPaths(Path(run_dir))
    if not paths.root.is_dir():
        raise RunError(f"run folder not found: {paths.root}")
    if not paths.config.is_file():
        raise RunError(f"{paths.root} holds no run (no config.json)")
    try:
        return config_from_dict(json.loads(paths.config.read_text(encoding="utf-8")))
    except json.JSONDecodeError as exc:
        raise RunError(f"{paths.config}: corrupt ({exc})") from None
    except ConfigError as exc:
        raise RunError(f"{paths.config}: {exc}") from None


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda when available, else cpu."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise ConfigError(f"train.device: {exc}") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError("train.device: CUDA is not available on this machine")
    return device


@dataclass
class LoadedRun:
    """A trained model ready for evaluation or generation."""

    config: RunConfig
    vocab: Vocab
    model: TransformerXL
    checkpoint: Path
    step: int


def load_run(run_dir: Path, *, checkpoint: str = "best", device: str = "cpu") -> LoadedRun:
    """Load a run's model (``best`` checkpoint, else ``latest``; or a checkpoint folder path) in eval mode."""
    paths = RunPaths(Path(run_dir))
    config = load_run_config(paths.root)
    if not paths.vocab.is_file():
        raise RunError(f"{paths.root} has no vocab.json")
    vocab = load_vocab(paths.vocab)
    if checkpoint == "best":
        folder = best_checkpoint(paths.root) or latest_checkpoint(paths.root)
    elif checkpoint == "latest":
        folder = latest_checkpoint(paths.root)
    else:
        folder = Path(checkpoint)
    if folder is None:
        raise CheckpointError(f"{paths.root} has no checkpoint yet")
    if len(vocab) != config.model.vocab_size:
        raise CheckpointError(f"{paths.vocab} has {len(vocab)} tokens, the run's model {config.model.vocab_size}")
    model = TransformerXL(config.model)
    document = load_weights(folder, model, expected={"vocab_fingerprint": vocab.fingerprint,
                                                     "model": config_to_dict(config.model)})
    model.to(resolve_device(device)).eval()
    return LoadedRun(config=config, vocab=vocab, model=model, checkpoint=folder, step=document["state"]["step"])
