"""Learning curves of reinforcement-learning runs, read from their run folders (``metrics.jsonl`` and
``config.json``): the mean episode return of each update against environment steps, smoothed, one line per
run, in one figure (``txl rl plot RUN [RUN ...] --out FILE``); needs matplotlib (the ``plots`` extra).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import RunError
from ..runs import read_metrics
from .run import read_rl_config

__all__ = ["Curve", "read_curve", "smooth", "plot_runs"]


@dataclass(frozen=True)
class Curve:
    """One run's returns: ``steps`` (environment steps after each update) and ``returns`` (the mean return of
    the episodes that ended in that update; NaN where none did), with the run's name, task, agent and seed."""

    name: str
    task: str
    agent: str
    seed: int
    steps: np.ndarray
    returns: np.ndarray


def read_curve(run: str | Path) -> Curve:
    """The curve of a run folder made by ``txl rl train`` (RunError where it has no rows yet)."""
    root = Path(run)
    config = read_rl_config(root)
    rows = read_metrics(root)
    if not rows:
        raise RunError(f"{root} has no metrics rows yet")
    steps = np.array([int(r["env_steps"]) for r in rows])
    returns = np.array([math.nan if r["return_mean"] is None else float(r["return_mean"]) for r in rows])
    return Curve(root.name, config.task, config.agent, config.seed, steps, returns)


def smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` updates (fewer at the start), ignoring NaN (updates with no episode)."""
    out = np.empty_like(values, dtype=np.float64)
    for i in range(len(values)):
        part = values[max(0, i - window + 1) : i + 1]
        out[i] = np.nanmean(part) if np.any(~np.isnan(part)) else math.nan
    return out


def plot_runs(
    runs: Sequence[str | Path], out: str | Path, *, window: int = 10, title: str | None = None
) -> Path:
    """One figure of the curves of ``runs`` (each smoothed over ``window`` updates), written to ``out`` (its
    suffix picks the format: .png, .svg, .pdf); returns its path. Lines are labelled ``task agent seed``
    (and the folder's name where two runs share them)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [read_curve(run) for run in runs]
    labels = [f"{c.task} {c.agent} seed {c.seed}" for c in curves]
    labels = [
        f"{label} ({c.name})" if labels.count(label) > 1 else label
        for label, c in zip(labels, curves, strict=True)
    ]
    fig, ax = plt.subplots(figsize=(6.4, 3.8), dpi=100)
    for curve, label in zip(curves, labels, strict=True):
        ax.plot(curve.steps, smooth(curve.returns, window), label=label)
    tasks = sorted({c.task for c in curves})
    ax.set_title(title if title is not None else ", ".join(tasks))
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"mean episode return ({window}-update mean)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    path = Path(out)
    fig.savefig(path)
    plt.close(fig)
    return path
