"""``txl analyze recl``: the relative effective context length (RECL) of a group of trained models, as Dai et
al. (2019) define it (Section 4.2 and Appendix C), measured on the same targets for every model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from ..config import ConfigError, RunConfig, Span, eval_lengths, first_set, positive_int
from ..errors import TxlError
from ..evaluation import EvalSettings
from ..model import TransformerXL
from ..runs import LoadedRun
from .common import split_tokens
from .context import WindowSettings, sliding_losses, stream_losses
from .report import format_table, new_figure, run_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DEFAULT_R",
    "THRESHOLD",
    "relative_gains",
    "recl_from_gains",
    "context_losses",
    "default_recl_lengths",
    "ReclSettings",
    "ReclModel",
    "ReclResult",
    "analyze_recl",
]

DEFAULT_R = (0.1, 0.5, 1.0)
"""The paper's ratios r: fractions of the targets, the hardest first (1.0: every target)."""

THRESHOLD = 0.01
"""The paper's threshold on the relative gain g_i(c, c + delta) (a 1% lower perplexity)."""


# ---------------------------------------------------------------------------------------------------------
# The arithmetic (pure)
# ---------------------------------------------------------------------------------------------------------


def relative_gains(
    losses: np.ndarray, *, lengths: Sequence[int], delta: int, r: float
) -> tuple[tuple[int, ...], np.ndarray]:
    """Relative gains g_i(c, c + delta) of every model of the group on its top-``r`` hardest targets.

    ``losses``: (I, C, N), the loss of model i at context ``lengths[k]`` on target t. Returns the contexts c
    for which c + delta is among ``lengths`` (in the order of ``lengths``) and the gains (I, len(contexts)),
    by the equations of :func:`analyze_recl`: T_r(c) is the ceil(r N) targets with the largest baseline
    b(c, t) (ties: the earlier target first), and g_i = 1 - exp(f_i(c, c + delta) - f_i(c, c)), which is
    (exp f_i(c, c) - exp f_i(c, c + delta)) / exp f_i(c, c) without overflow."""
    losses = np.asarray(losses, dtype=np.float64)
    if losses.ndim != 3 or losses.shape[1] != len(lengths):
        raise ValueError(f"losses must be (models, {len(lengths)} lengths, tokens), got {losses.shape}")
    if not 0 < r <= 1:
        raise ValueError(f"r must be a fraction of the targets in (0, 1], got {r}")
    index = {c: k for k, c in enumerate(lengths)}
    contexts = tuple(c for c in lengths if c + delta in index)
    top = max(1, math.ceil(r * losses.shape[2]))
    gains = np.zeros((losses.shape[0], len(contexts)))
    for j, c in enumerate(contexts):
        best = losses[:, index[c]].min(axis=0)  # b(c, t): (N,)
        hardest = np.argsort(-best, kind="stable")[:top]  # T_r(c): (top,)
        base = best[hardest].mean()  # f_i(c, c) = mean_T min(b, l_i(c, t)) = mean_T b(c, t), as b <= l_i
        longer = losses[:, index[c + delta]][:, hardest]  # l_i(c + delta, t) on T_r(c): (I, top)
        extended = np.minimum(best[None, hardest], longer).mean(axis=1)  # f_i(c, c + delta): (I,)
        gains[:, j] = 0.0 - np.expm1(extended - base)  # 0.0 - x: no -0.0 where nothing is gained
    return contexts, gains


def recl_from_gains(
    contexts: Sequence[int], gains: np.ndarray, *, delta: int, threshold: float = THRESHOLD
) -> list[tuple[int, bool]]:
    """The paper's thresholding, per model (row of ``gains``, the gains g(c, c + delta) at ``contexts``):
    from the shortest context c, step to c + delta while g(c, c + delta) >= ``threshold``; RECL is the c
    where it stops. Returns (RECL, at_least) per model: ``at_least`` when the steps ran past the measured
    contexts (the true RECL may be longer)."""
    measured = dict.fromkeys(contexts)
    result = []
    for row in np.asarray(gains, dtype=np.float64):
        gain = dict(zip(contexts, row, strict=True))
        c = min(contexts)
        while c in measured and gain[c] >= threshold:
            c += delta
        result.append((c, c not in measured))
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
    settings: ReclSettings | None = None,
) -> np.ndarray:
    """Loss of every target ``first .. N-1`` given ``context`` tokens (``first`` >= context), by the protocol
    of :func:`analyze_recl`. ``config``: the run's, for its segment lengths and clamp; ``settings``: the
    rows the Transformer-XL reads in parallel and the progress bar."""
    if first < context:
        raise ValueError(f"first ({first}) must be at least the context ({context})")
    reading = (settings or ReclSettings()).reading
    desc = f"context {context}"
    if config.model.attention == "relative":
        lengths = eval_lengths(config)
        span = Span(mem_len=context, clamp_len=lengths.span.clamp_len, same_length=True)
        stream = EvalSettings(
            lengths.tgt_len,
            span=span,
            batch_size=first_set(reading.batch_size, ReclSettings().reading.batch_size),
            progress=reading.progress,
            name=desc,
        )
        return stream_losses(model, tokens, stream, first=first)
    window = min(context, config.train.tgt_len)
    windows = WindowSettings(window, batch_size=max(1, 8192 // window), progress=reading.progress, desc=desc)
    return sliding_losses(model, tokens, windows, first=first)


# ---------------------------------------------------------------------------------------------------------
# The analysis
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReclSettings:
    """What :func:`analyze_recl` measures and how (the defaults are ``txl analyze recl``'s)."""

    lengths: tuple[int, ...] | None = None
    """The contexts c (None: delta, 2 delta, ..., 8T, T the group's shortest training segment)."""
    delta: int | None = None
    """The extension c -> c + delta (None: T/2)."""
    r: tuple[float, ...] = DEFAULT_R
    """Fractions of the hardest targets, each in (0, 1]."""
    threshold: float = THRESHOLD
    """The least relative gain g(c, c + delta) that counts as still gaining."""
    split: str = "valid"
    """The split whose targets are scored."""
    reading: EvalSettings = EvalSettings(batch_size=8, max_tokens=20_000, progress=True)
    """``max_tokens``: the targets scored (None: the whole split), after a warm-up of the longest context;
    ``batch_size``: the rows the Transformer-XL reads in parallel; ``progress``: show progress bars (its
    lengths are the analysis's own)."""

    def __post_init__(self) -> None:
        if self.lengths is not None:
            object.__setattr__(self, "lengths", tuple(self.lengths))
            for c in self.lengths:
                positive_int(c, "lengths")
        if self.delta is not None:
            positive_int(self.delta, "delta")
        object.__setattr__(self, "r", tuple(self.r))
        if not self.r or any(not 0 < v <= 1 for v in self.r):
            raise ConfigError(f"r: must be fractions of the targets in (0, 1], got {list(self.r)}")
        if not isinstance(self.reading, EvalSettings):
            raise ConfigError(f"reading: must be an EvalSettings, got {type(self.reading).__name__}")


@dataclass(frozen=True)
class ReclModel:
    """One model of the group: its RECL per ratio r (``at_least``: the r whose steps ran past the measured
    contexts), its gain g(c, c + delta) per r and context, and its mean loss (all targets) per length."""

    run: str
    attention: str
    recl: dict[float, int]
    at_least: dict[float, bool]
    gains: dict[float, dict[int, float]]
    mean_loss: dict[int, float]

    def as_dict(self) -> dict[str, Any]:
        return {
            "run": self.run,
            "attention": self.attention,
            "recl": {str(r): c for r, c in self.recl.items()},
            "at_least": {str(r): v for r, v in self.at_least.items()},
            "gains": {str(r): {str(c): g for c, g in row.items()} for r, row in self.gains.items()},
            "mean_loss": {str(c): v for c, v in self.mean_loss.items()},
        }


@dataclass(frozen=True)
class ReclResult:
    """RECL of a group of models on the same targets."""

    split: str
    tokens: int
    lengths: tuple[int, ...]
    delta: int
    r: tuple[float, ...]
    threshold: float
    models: tuple[ReclModel, ...] = field(default=())

    def as_dict(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "tokens": self.tokens,
            "lengths": list(self.lengths),
            "delta": self.delta,
            "r": list(self.r),
            "threshold": self.threshold,
            "models": [m.as_dict() for m in self.models],
        }

    def table(self) -> str:
        head = (
            f"relative effective context length (Dai et al. 2019, Appendix C) on {self.tokens:,} {self.split} "
            f"targets: the group's baseline is its best model at each context; r: the fraction of hardest "
            f"targets; contexts {self.lengths[0]}..{self.lengths[-1]} in steps of {self.delta}, threshold "
            f"{self.threshold:g} (>=: still gaining at the longest measured context)"
        )
        rows = [
            [m.run, m.attention, *(f"{'>=' if m.at_least[r] else ''}{m.recl[r]}" for r in self.r)]
            for m in self.models
        ]
        return head + "\n" + format_table(["run", "attention", *(f"RECL r={r:g}" for r in self.r)], rows)

    def figures(self) -> Mapping[str, Callable[[], Figure]]:
        return {"recl": self._plot}

    def _plot(self) -> Figure:
        fig = new_figure(width=10.0)
        left, right = fig.subplots(1, 2)
        r = min(self.r)  # the paper's Figure 3 shows r = 0.1
        for m in self.models:
            name = run_label(m.run)
            left.plot(list(m.mean_loss), list(m.mean_loss.values()), marker="o", label=name)
            right.plot(list(m.gains[r]), [100 * g for g in m.gains[r].values()], marker="o", label=name)
        right.axhline(100 * self.threshold, color="gray", linestyle=":", linewidth=1)
        left.set_xlabel("context c (tokens)")
        left.set_ylabel("mean loss (nats per token)")
        right.set_xlabel("context c (tokens)")
        right.set_ylabel(f"relative gain g(c, c + {self.delta}) (%), r = {r:g}")
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


def analyze_recl(runs: Sequence[LoadedRun], settings: ReclSettings | None = None) -> ReclResult:
    """RECL of the group of loaded runs (:func:`txl.runs.load_run`; same corpus and vocabulary) on the first
    ``settings.reading.max_tokens`` targets of the split after a warm-up of max(c) tokens, for each ratio r. The
    losses are measured at every context c and at c + delta; the steps of the thresholding walk through all
    of them. Defaults: :func:`default_recl_lengths`.

    RECL is a property of a model *within a group*: every model's gain is measured against the same
    baseline, the best model of the group at the shorter context.

    With l_i(c, t) the loss of model i of the group on target t given c tokens of context, N targets, and a
    ratio r in (0, 1] (the paper's r = 0.1, 0.5 and 1.0 are fractions of the targets: 1.0 is every target):

        b(c, t)       = min_i l_i(c, t)                                  the group's baseline at context c
        T_r(c)        = the ceil(r N) targets t with the largest b(c, t)  the top-r hardest positions
        f_i(c, c')    = 1/|T_r(c)| sum_{t in T_r(c)} min(b(c, t), l_i(c', t))   relative loss, c' >= c
        g_i(c, c')    = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c)   relative perplexity gain

    and RECL_i(r) by the paper's thresholding with step delta and the fixed threshold 0.01: start with c the
    shortest measured context; while g_i(c, c + delta) >= 0.01, set c = c + delta; RECL_i(r) = c. (As
    b <= l_i, f_i(c, c) = mean_{T_r(c)} b(c, t) is the same for every model: all gain over one baseline.) A
    model whose gain still passes at the longest measured extension has a RECL of at least that c + delta;
    the result says so (:attr:`ReclModel.at_least`) instead of inventing a number.

    How a model gets exactly c tokens of context (:func:`context_losses`):

    - **Transformer-XL**: a stream with memory c and same-length attention, so that every query attends to
      exactly c positions (itself and the c - 1 before it) in every layer. Further context can only reach it
      through the cached states of lower layers, as in the model's normal use: this is the paper's attention
      length. (For a one-layer model it is exactly a window of c tokens.)
    - **vanilla**: a sliding window (stride 1) of the min(c, T) tokens before each target, T its training
      segment: trained with absolute positions 0..T-1, it cannot use more than T.

    Every model scores the same targets, and each of them has at least max(c) tokens before it.
    """
    settings = settings or ReclSettings()
    if len(runs) < 1:
        raise TxlError("recl needs at least one run (the paper compares a group of models)")
    _check_group(runs)
    default_delta, default_contexts = default_recl_lengths(min(run.config.train.tgt_len for run in runs))
    delta = settings.delta or default_delta
    contexts = tuple(sorted(set(settings.lengths))) if settings.lengths else default_contexts
    grid = tuple(sorted(set(contexts) | {c + delta for c in contexts}))
    first = grid[-1]
    max_tokens = settings.reading.max_tokens
    tokens = split_tokens(
        runs[0].config,
        runs[0].vocab,
        settings.split,
        max_tokens=None if max_tokens is None else max_tokens + first - 1,
    )
    if len(tokens) <= first + 1:
        raise TxlError(
            f"the {settings.split} split has {len(tokens)} tokens, too few for contexts up to {first}"
        )
    losses = np.zeros((len(runs), len(grid), len(tokens) - first))
    for i, run in enumerate(runs):
        losses[i] = _group_losses(run, tokens, grid, settings, label=f"model {i + 1}/{len(runs)}")
    r = settings.r
    gains: dict[float, tuple[tuple[int, ...], np.ndarray]] = {
        v: relative_gains(losses, lengths=grid, delta=delta, r=v) for v in r
    }
    recls = {v: recl_from_gains(*gains[v], delta=delta, threshold=settings.threshold) for v in r}
    models = tuple(
        ReclModel(
            run=str(run.root),
            attention=run.config.model.attention,
            recl={v: recls[v][i][0] for v in r},
            at_least={v: recls[v][i][1] for v in r},
            gains={v: {c: float(g) for c, g in zip(gains[v][0], gains[v][1][i], strict=True)} for v in r},
            mean_loss={c: float(losses[i, k].mean()) for k, c in enumerate(grid)},
        )
        for i, run in enumerate(runs)
    )
    return ReclResult(
        split=settings.split,
        tokens=losses.shape[2],
        lengths=grid,
        delta=delta,
        r=settings.r,
        threshold=settings.threshold,
        models=models,
    )


def _check_group(runs: Sequence[LoadedRun]) -> None:
    """Every run reads the corpus and vocabulary of the first: RECL compares models on the same targets."""
    for run in runs:
        if (
            run.vocab.fingerprint != runs[0].vocab.fingerprint
            or run.config.data.corpus != runs[0].config.data.corpus
        ):
            raise TxlError(
                f"{run.root} uses another corpus or vocabulary than {runs[0].root}: RECL compares models on "
                "the same targets"
            )


def _group_losses(
    run: LoadedRun, tokens: np.ndarray, grid: Sequence[int], settings: ReclSettings, *, label: str
) -> np.ndarray:
    """(len(grid), N - max(grid)): the run's losses at every context of ``grid``."""
    relative = run.config.model.attention == "relative"
    done: dict[int, np.ndarray] = {}  # vanilla: every c >= T is the same window
    rows = []
    for c in tqdm(grid, desc=label, disable=not settings.reading.progress, leave=False):
        key = c if relative else min(c, run.config.train.tgt_len)
        if key not in done:
            done[key] = context_losses(
                run.model, run.config, tokens, context=c, first=grid[-1], settings=settings
            )
        rows.append(done[key])
    return np.stack(rows)
