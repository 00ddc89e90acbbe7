"""``txl analyze recl``: the relative effective context length (RECL) of a group of trained models
(Dai et al. 2019, Section 4.4; after Khandelwal et al. 2018's effective context length).

With l_i(c, t) the loss of model i on target t given c tokens of context:

    b(c, t)      = min_i l_i(c, t)                             the best model of the group at context c
    f_i(c, c')   = mean_t min(b(c, t), l_i(c', t))             relative loss of model i at c' against b at c
    g_i(c, c')   = (f_i(c, c) - f_i(c, c')) / f_i(c, c)        relative gain of extending c to c'
    RECL_i(r)    = the largest c with g_i(c, c + delta) >= r   (r in percent, as the paper's table; 0 when
                                                               no measured c gains r)

How a model gets exactly c tokens of context (:func:`context_losses`):

- **Transformer-XL**: a stream with memory c and same-length attention, so that every query attends to
  exactly c positions (itself and the c - 1 before it) in every layer. Further context can only reach it
  through the cached states of lower layers, as in the model's normal use: this is the paper's attention
  length. (For a one-layer model it is exactly a window of c tokens; tested.)
- **vanilla**: a sliding window (stride 1) of the min(c, T) tokens before each target, T its training
  segment: trained with absolute positions 0..T-1, it cannot use more than T.

Every model scores the same targets, and each of them has at least max(c) tokens before it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from ..config import RunConfig, Span, eval_span
from ..errors import TxlError
from ..model import TransformerXL
from ..runs import load_run
from .common import split_tokens
from .context import sliding_losses, stream_losses
from .report import format_table, new_figure, run_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DEFAULT_R",
    "relative_gains",
    "recl_from_gains",
    "context_losses",
    "default_recl_lengths",
    "ReclModel",
    "ReclResult",
    "analyze_recl",
]

DEFAULT_R = (0.1, 0.5, 1.0)
"""The paper's thresholds, in percent."""


# ---------------------------------------------------------------------------------------------------------
# The arithmetic (pure)
# ---------------------------------------------------------------------------------------------------------


def relative_gains(
    losses: np.ndarray, *, lengths: Sequence[int], delta: int
) -> tuple[tuple[int, ...], np.ndarray]:
    """Relative gains g_i(c, c + delta) from per-token losses.

    ``losses``: (I, C, N), the loss of model i at context ``lengths[k]`` on target t. Returns the contexts c
    for which c + delta is among ``lengths`` (in the order of ``lengths``) and the gains (I, len(contexts))."""
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 3 or losses.shape[1] != len(lengths):
        raise ValueError(f"losses must be (models, {len(lengths)} lengths, tokens), got {losses.shape}")
    index = {c: k for k, c in enumerate(lengths)}
    contexts = tuple(c for c in lengths if c + delta in index)
    gains = np.zeros((losses.shape[0], len(contexts)))
    for j, c in enumerate(contexts):
        best = losses[:, index[c]].min(axis=0)  # b(c, t): (N,)
        base = best.mean()  # f_i(c, c) = mean_t min(b, l_i(c, t)) = mean_t b(c, t), as b <= l_i
        extended = np.minimum(best[None, :], losses[:, index[c + delta]]).mean(
            axis=1
        )  # f_i(c, c + delta): (I,)
        gains[:, j] = (base - extended) / base
    return contexts, gains


def recl_from_gains(
    contexts: Sequence[int], gains: np.ndarray, *, r_percent: Sequence[float]
) -> list[dict[float, int]]:
    """For each model (row of ``gains``) and threshold r (percent): the largest context c whose gain is at
    least r / 100, or 0 when there is none."""
    result = []
    for row in np.asarray(gains, dtype=np.float64):
        result.append(
            {
                r: max((c for c, g in zip(contexts, row, strict=True) if g >= r / 100), default=0)
                for r in r_percent
            }
        )
    return result


# ---------------------------------------------------------------------------------------------------------
# Losses with c tokens of context
# ---------------------------------------------------------------------------------------------------------


def context_losses(
    model: TransformerXL,
    config: RunConfig,
    tokens: np.ndarray,
    *,
    context: int,
    first: int,
    batch_size: int = 8,
    progress: bool = False,
) -> np.ndarray:
    """Loss of every target ``first .. N-1`` given ``context`` tokens (the protocol of the module docstring;
    ``first`` >= context). ``config``: the run's, for its segment lengths and clamp."""
    if first < context:
        raise ValueError(f"first ({first}) must be at least the context ({context})")
    desc = f"context {context}"
    if config.model.attention == "relative":
        span = Span(mem_len=context, clamp_len=eval_span(config).clamp_len, same_length=True)
        tgt_len = config.eval.tgt_len or config.train.tgt_len
        return stream_losses(
            model,
            tokens,
            tgt_len=tgt_len,
            span=span,
            first=first,
            batch_size=batch_size,
            progress=progress,
            desc=desc,
        )
    window = min(context, config.train.tgt_len)
    return sliding_losses(
        model,
        tokens,
        window=window,
        first=first,
        batch_size=max(1, 8192 // window),
        progress=progress,
        desc=desc,
    )


# ---------------------------------------------------------------------------------------------------------
# The analysis
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReclModel:
    """One model of the group: its RECL per threshold, its gain per context and its mean loss per length."""

    run: str
    attention: str
    recl: dict[float, int]
    gains: dict[int, float]
    mean_loss: dict[int, float]

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "attention": self.attention,
            "recl": {str(r): c for r, c in self.recl.items()},
            "gains": {str(c): g for c, g in self.gains.items()},
            "mean_loss": {str(c): v for c, v in self.mean_loss.items()},
        }


@dataclass(frozen=True)
class ReclResult:
    """RECL of a group of models on the same targets."""

    split: str
    tokens: int
    lengths: tuple[int, ...]
    delta: int
    r_percent: tuple[float, ...]
    models: tuple[ReclModel, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "tokens": self.tokens,
            "lengths": list(self.lengths),
            "delta": self.delta,
            "r_percent": list(self.r_percent),
            "models": [m.as_dict() for m in self.models],
        }

    def table(self) -> str:
        head = (
            f"relative effective context length on {self.tokens:,} {self.split} targets (contexts "
            f"{self.lengths[0]}..{self.lengths[-1]}, delta {self.delta}; 0: no measured gain reaches r)"
        )
        rows = [[m.run, m.attention, *(m.recl[r] for r in self.r_percent)] for m in self.models]
        return (
            head
            + "\n"
            + format_table(["run", "attention", *(f"RECL r={r:g}%" for r in self.r_percent)], rows)
        )

    def figures(self) -> Mapping[str, Callable[[], Figure]]:
        return {"recl": self._plot}

    def _plot(self) -> Figure:
        fig = new_figure(width=10.0)
        left, right = fig.subplots(1, 2)
        for m in self.models:
            name = run_label(m.run)
            left.plot(list(m.mean_loss), list(m.mean_loss.values()), marker="o", label=name)
            right.plot(list(m.gains), [100 * g for g in m.gains.values()], marker="o", label=name)
        for r in self.r_percent:
            right.axhline(r, color="gray", linestyle=":", linewidth=1)
        left.set_xlabel("context c (tokens)")
        left.set_ylabel("mean loss (nats per token)")
        right.set_xlabel("context c (tokens)")
        right.set_ylabel(f"relative gain g(c, c + {self.delta}) (%)")
        for ax in (left, right):
            ax.legend()
            ax.grid(alpha=0.3)
        fig.suptitle("Relative effective context length")
        return fig


def default_recl_lengths(train_len: int) -> tuple[int, tuple[int, ...]]:
    """(delta, contexts): delta = T/2 and contexts delta, 2 delta, ..., 8T (T: the shortest training
    segment of the group)."""
    delta = max(1, train_len // 2)
    return delta, tuple(range(delta, 8 * train_len + 1, delta))


def analyze_recl(
    run_dirs: Sequence[Path],
    *,
    lengths: Sequence[int] | None = None,
    delta: int | None = None,
    r_percent: Sequence[float] = DEFAULT_R,
    split: str = "valid",
    max_tokens: int | None = 20_000,
    batch_size: int = 8,
    checkpoint: str = "best",
    device: str = "cpu",
    progress: bool = True,
) -> ReclResult:
    """RECL of the runs in ``run_dirs`` (same corpus and vocabulary) on the first ``max_tokens`` targets
    of ``split`` after a warm-up of max(c) tokens. Defaults: :func:`default_recl_lengths`."""
    if len(run_dirs) < 1:
        raise TxlError("recl needs at least one run (the paper compares a group of models)")
    runs = [load_run(Path(d), checkpoint=checkpoint, device=device) for d in run_dirs]
    first_run = runs[0]
    for d, run in zip(run_dirs, runs, strict=True):
        if (
            run.vocab.fingerprint != first_run.vocab.fingerprint
            or run.config.data.corpus != first_run.config.data.corpus
        ):
            raise TxlError(
                f"{d} uses another corpus or vocabulary than {run_dirs[0]}: RECL compares models on "
                "the same targets"
            )
    train_len = min(run.config.train.tgt_len for run in runs)
    default_delta, default_contexts = default_recl_lengths(train_len)
    delta = delta or default_delta
    contexts = tuple(sorted(set(lengths))) if lengths else default_contexts
    if min(contexts) < 1 or delta < 1:
        raise TxlError("recl: lengths and delta must be positive")
    grid = tuple(sorted(set(contexts) | {c + delta for c in contexts}))
    first = grid[-1]
    tokens = split_tokens(
        first_run.config,
        first_run.vocab,
        split,
        max_tokens=None if max_tokens is None else max_tokens + first - 1,
    )
    if len(tokens) <= first + 1:
        raise TxlError(f"the {split} split has {len(tokens)} tokens, too few for contexts up to {first}")
    losses = np.zeros((len(runs), len(grid), len(tokens) - first))
    for i, run in enumerate(runs):
        done: dict[int, np.ndarray] = {}  # vanilla: every c >= T is the same window
        for k, c in enumerate(
            tqdm(grid, desc=f"model {i + 1}/{len(runs)}", disable=not progress, leave=False)
        ):
            key = c if run.config.model.attention == "relative" else min(c, run.config.train.tgt_len)
            if key not in done:
                done[key] = context_losses(
                    run.model,
                    run.config,
                    tokens,
                    context=c,
                    first=first,
                    batch_size=batch_size,
                    progress=progress,
                )
            losses[i, k] = done[key]
    measured, gains = relative_gains(losses, lengths=grid, delta=delta)
    keep = [j for j, c in enumerate(measured) if c in contexts]
    measured, gains = tuple(measured[j] for j in keep), gains[:, keep]
    recls = recl_from_gains(measured, gains, r_percent=r_percent)
    models = tuple(
        ReclModel(
            run=str(d),
            attention=run.config.model.attention,
            recl=recls[i],
            gains={c: float(g) for c, g in zip(measured, gains[i], strict=True)},
            mean_loss={c: float(losses[i, k].mean()) for k, c in enumerate(grid)},
        )
        for i, (d, run) in enumerate(zip(run_dirs, runs, strict=True))
    )
    return ReclResult(
        split=split,
        tokens=losses.shape[2],
        lengths=grid,
        delta=delta,
        r_percent=tuple(r_percent),
        models=models,
    )
