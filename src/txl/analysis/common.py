"""Plumbing shared by the analyses: the tokens of a run's split, training a run or continuing or reusing
the one already in its folder, and parsing comma-separated lists. The run folder (its layout, its metrics)
belongs to :mod:`txl.runs`, training to :mod:`txl.train.trainer`.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np

from ..checkpoint import checkpoint_step
from ..config import ConfigError, RunConfig, config_to_dict
from ..data import Vocab, prepare_data
from ..errors import RunError
from ..runs import RunPaths, latest_checkpoint, load_run_config
from ..train.trainer import resume, train

__all__ = ["split_tokens", "train_or_reuse", "parse_ints", "parse_floats"]


def split_tokens(config: RunConfig, vocab: Vocab, split: str, *, max_tokens: int | None = None) -> np.ndarray:
    """Token ids of one split of the run's corpus under its vocabulary (the cached encoding); with
    ``max_tokens``, the first ``max_tokens + 1`` (so that ``max_tokens`` targets are predicted)."""
    tokens = prepare_data(config.data, vocab=vocab, splits=(split,)).splits[split]
    return tokens if max_tokens is None else tokens[: max_tokens + 1]


def _same_recipe(saved: RunConfig, wanted: RunConfig) -> bool:
    """Whether a saved run was made from ``wanted`` (training sets model.vocab_size from the vocabulary)."""
    wanted = dataclasses.replace(
        wanted, model=dataclasses.replace(wanted.model, vocab_size=saved.model.vocab_size)
    )
    return config_to_dict(saved) == config_to_dict(wanted)


def train_or_reuse(
    config: RunConfig, run_dir: Path, *, overwrite: bool = False, progress: bool = True
) -> tuple[dict[str, Any], str]:
    """Make ``run_dir`` a finished run of ``config`` and return (its summary, what was done).

    An empty folder, or ``overwrite``: train from scratch ("trained"). A finished run of the same config:
    reuse it ("reused"). An unfinished one (interrupted): continue it from its latest checkpoint with
    :func:`txl.train.trainer.resume` ("resumed"); one killed before its first checkpoint starts again.
    A folder holding a run of another config is an error (nothing is touched)."""
    paths = RunPaths(Path(run_dir))
    if overwrite or not paths.holds_run():
        return train(config, paths.root, overwrite=True, progress=progress), "trained"
    try:
        saved = load_run_config(paths.root)
    except RunError:
        saved = None
    if saved is None or not _same_recipe(saved, config):
        raise RunError(
            f"{paths.root} holds a run of another config; pass overwrite to replace it or choose another out",
            fields=("overwrite", "out"),
        )
    latest = latest_checkpoint(paths.root)
    if latest is None:
        return train(config, paths.root, overwrite=True, progress=progress), "trained"
    step = checkpoint_step(latest)
    if paths.summary.is_file():
        summary = json.loads(paths.summary.read_text(encoding="utf-8"))
        if summary.get("steps", -1) >= step:
            return summary, "reused"
    return resume(paths.root, progress=progress), "resumed"


def _parse(text: str, kind: type, name: str) -> tuple:
    try:
        values = tuple(kind(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ConfigError(f"{name}: expected comma-separated {kind.__name__} values, got {text!r}") from None
    if not values:
        raise ConfigError(f"{name}: expected at least one value, got {text!r}")
    return values


def parse_ints(text: str, *, name: str, minimum: int = 0) -> tuple[int, ...]:
    """``"0,64,128"`` -> (0, 64, 128); each at least ``minimum``, as a ConfigError naming ``name``."""
    values = _parse(text, int, name)
    if min(values) < minimum:
        raise ConfigError(f"{name}: values must be >= {minimum}, got {text!r}")
    return values


def parse_floats(text: str, *, name: str) -> tuple[float, ...]:
    """``"0.1,0.5,1"`` -> (0.1, 0.5, 1.0), each non-negative."""
    values = _parse(text, float, name)
    if min(values) < 0:
        raise ConfigError(f"{name}: values must be >= 0, got {text!r}")
    return values
