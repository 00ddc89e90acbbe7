"""``txl analyze documents``: what resetting the memory at document boundaries does, overall and by position
within a document, reading across documents (``continue``) or starting each anew (``reset``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from ..config import ConfigError, Span, eval_lengths, first_set
from ..data import BatchSettings, SegmentStream, check_documents, prepare_data
from ..evaluation import EvalSettings, eval_rows, metrics_from_loss, segment_losses
from ..model import TransformerXL
from ..runs import LoadedRun
from .report import format_table, new_figure, run_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DOCUMENT_MODES",
    "PositionBucket",
    "DocumentSplit",
    "DocumentRun",
    "DocumentsResult",
    "DocumentsSettings",
    "token_losses",
    "document_positions",
    "position_buckets",
    "analyze_documents",
]

DOCUMENT_MODES = ("continue", "reset")
"""The two ways of reading: across documents (the authors' way) or starting each anew."""
_SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class DocumentsSettings:
    """What :func:`analyze_documents` evaluates and how."""

    splits: tuple[str, ...] = ("valid", "test")
    """The splits evaluated (each must exist)."""
    reading: EvalSettings = EvalSettings(progress=True)
    """How each split is read: its first ``max_tokens`` targets (None: all), the lengths (``tgt_len``,
    ``span``) and ``batch_size`` (each None: the run's, as ``txl eval`` takes them,
    :func:`txl.config.eval_lengths`), and whether progress bars show."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "splits", tuple(self.splits))
        if not self.splits or any(s not in _SPLITS for s in self.splits):
            raise ConfigError(f"splits: expected some of {', '.join(_SPLITS)}, got {list(self.splits)}")
        if not isinstance(self.reading, EvalSettings):
            raise ConfigError(f"reading: must be an EvalSettings, got {type(self.reading).__name__}")


@dataclass(frozen=True)
class PositionBucket:
    """The targets at positions ``[start, stop)`` of their documents: how many, and their mean loss (nats per
    token) read each way."""

    start: int
    stop: int
    tokens: int
    continue_loss: float
    reset_loss: float


@dataclass(frozen=True)
class DocumentSplit:
    """One split of one run: its documents and targets, the loss read each way, and the loss by position."""

    split: str
    documents: int
    tokens: int
    continue_loss: float
    reset_loss: float
    continue_ppl: float
    reset_ppl: float
    buckets: tuple[PositionBucket, ...]


@dataclass(frozen=True)
class DocumentRun:
    """One run: how it was trained (``data.documents``), its step and evaluation lengths, and its splits."""

    run: str
    trained: str
    step: int
    tgt_len: int
    batch_size: int
    mem_len: int
    splits: tuple[DocumentSplit, ...]


@dataclass(frozen=True)
class DocumentsResult:
    """The runs of ``txl analyze documents``."""

    runs: tuple[DocumentRun, ...]

    def as_dict(self) -> dict[str, Any]:
        return {"runs": [asdict(r) for r in self.runs]}

    def table(self) -> str:
        rows = [
            [
                run_label(r.run),
                r.trained,
                s.split,
                s.documents,
                s.tokens,
                s.continue_loss,
                s.reset_loss,
                s.reset_loss - s.continue_loss,
            ]
            for r in self.runs
            for s in r.splits
        ]
        names = [
            "run",
            "trained",
            "split",
            "docs",
            "tokens",
            "eval continue",
            "eval reset",
            "reset - continue",
        ]
        head = "Loss (nats per token) evaluated reading across documents (continue) and starting each anew (reset)"
        by_position = [
            [run_label(r.run), r.trained, s.split, f"{b.start}-{b.stop - 1}", b.tokens, b.continue_loss,
             b.reset_loss, b.reset_loss - b.continue_loss]
            for r in self.runs
            for s in r.splits
            for b in s.buckets
        ]  # fmt: skip
        names2 = ["run", "trained", "split", "positions", "tokens", "continue", "reset", "reset - continue"]
        return (
            head
            + "\n"
            + format_table(names, rows)
            + "\n\nLoss by position within a document\n"
            + format_table(names2, by_position)
        )

    def figures(self) -> Mapping[str, Callable[[], Figure]]:
        return {"documents": self._plot}

    def _plot(self) -> Figure:
        splits = sorted({s.split for r in self.runs for s in r.splits}, key=("valid", "test", "train").index)
        fig = new_figure(width=5.2 * max(len(splits), 1), height=4.0)
        axes = np.atleast_1d(fig.subplots(1, max(len(splits), 1), sharey=True))
        for ax, split in zip(axes, splits, strict=False):
            for r in self.runs:
                for s in r.splits:
                    if s.split != split or not s.buckets:
                        continue
                    x = [max(b.start, 1) for b in s.buckets]
                    for mode, style in (("continue", "-"), ("reset", "--")):
                        y = [getattr(b, f"{mode}_loss") for b in s.buckets]
                        ax.plot(
                            x, y, style, marker="o", label=f"{run_label(r.run)} (trained {r.trained}), {mode}"
                        )
            ax.set_xscale("log")
            ax.set_xlabel("position within the document (bucket start; 0 drawn at 1)")
            ax.set_title(f"{split}")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("loss (nats per token)")
        axes[0].legend(fontsize="small")
        fig.suptitle("Loss by position within a document: reading across documents or starting anew")
        return fig


def token_losses(
    model: TransformerXL, tokens: np.ndarray, settings: EvalSettings, *, starts: np.ndarray | None
) -> np.ndarray:
    """The loss of every target of ``tokens`` (N,), in token order: (N - 1,) float64, entry i the loss of
    token i + 1 given what came before it in its stream, read as :func:`~txl.evaluation.evaluate` reads it
    with ``settings`` (the rows the data fills, memory carried, with ``starts`` each document alone)."""
    n = len(tokens)
    tgt_len, batch_size, _ = settings.resolved(model)
    rows = eval_rows(n, batch_size)
    where = SegmentStream(
        tokens, BatchSettings(batch_size=rows, tgt_len=tgt_len, drop_last=False), starts=starts
    ).target_indices()  # (B, L) the token index of each target of the streams segment_losses reads
    out = np.zeros(n - 1, dtype=np.float64)
    position = 0
    desc = settings.name or "stream"
    segments = segment_losses(model, tokens, replace(settings, batch_size=rows, name=desc), starts=starts)
    steps = -(-where.shape[1] // tgt_len)
    bar = tqdm(segments, total=steps, desc=desc, disable=not settings.progress, leave=False)
    for segment in bar:
        t = segment.loss.shape[1]
        index = where[:, position : position + t]  # (B, T)
        out[index[index >= 0] - 1] = segment.loss.cpu().numpy()[index >= 0]
        position += t
    return out


def document_positions(n_tokens: int, starts: np.ndarray) -> np.ndarray:
    """(N - 1,) int64: the position of each target (tokens 1 .. N - 1) within its document, its distance from
    the last start at or before it (``starts`` increasing, the first 0)."""
    index = np.arange(1, n_tokens, dtype=np.int64)
    last = np.searchsorted(starts, index, side="right") - 1
    return index - np.asarray(starts, dtype=np.int64)[last]


def position_buckets(longest: int) -> list[tuple[int, int]]:
    """[0, 10), [10, 100), [100, 1000), ... until the bucket that holds position ``longest``."""
    bounds, stop = [], 10
    start = 0
    while start <= longest:
        bounds.append((start, stop))
        start, stop = stop, stop * 10
    return bounds


def _split(
    model: TransformerXL,
    tokens: np.ndarray,
    starts: np.ndarray,
    split: str,
    stream: EvalSettings,
) -> DocumentSplit:
    losses = {
        mode: token_losses(
            model, tokens, replace(stream, name=f"{split} {mode}"), starts=starts if mode == "reset" else None
        )
        for mode in DOCUMENT_MODES
    }
    positions = document_positions(len(tokens), starts)
    buckets = []
    for start, stop in position_buckets(int(positions.max()) if len(positions) else 0):
        inside = (positions >= start) & (positions < stop)
        if inside.any():
            buckets.append(
                PositionBucket(
                    start,
                    stop,
                    tokens=int(inside.sum()),
                    continue_loss=float(losses["continue"][inside].mean()),
                    reset_loss=float(losses["reset"][inside].mean()),
                )
            )
    means = {mode: float(losses[mode].mean()) for mode in DOCUMENT_MODES}
    return DocumentSplit(
        split=split,
        documents=len(starts),
        tokens=len(tokens) - 1,
        continue_loss=means["continue"],
        reset_loss=means["reset"],
        continue_ppl=metrics_from_loss(means["continue"])["ppl"],
        reset_ppl=metrics_from_loss(means["reset"])["ppl"],
        buckets=tuple(buckets),
    )


def analyze_documents(
    runs: Sequence[LoadedRun], settings: DocumentsSettings = DocumentsSettings()
) -> DocumentsResult:
    """Evaluate each loaded run (:func:`txl.runs.load_run`) on the splits reading across documents and starting each anew, overall and by
    position within a document. The corpus must say where its documents begin (a ConfigError naming
    ``data.documents`` otherwise).

    Every figure is read from one pass of :func:`txl.evaluation.segment_losses` per split and way (the
    protocol of ``txl eval``, whose loss it equals): the per-token losses are put back in token order, and
    each target's position is its distance from the last document start at or before it. A target at
    position 0 is a document's first token, predicted from the end of the previous document (the start is
    marked on the input, so that token itself is read with what came before in either way)."""
    done = []
    reading = settings.reading
    for run in runs:
        config = run.config
        lengths = eval_lengths(config, tgt_len=reading.tgt_len)
        span: Span = first_set(reading.span, lengths.span)
        batch_size: int = first_set(reading.batch_size, config.eval.batch_size)
        stream = replace(reading, tgt_len=lengths.tgt_len, span=span, batch_size=batch_size)
        data = prepare_data(config.data, vocab=run.vocab, splits=settings.splits)
        check_documents(data.corpus, "reset", name="txl analyze documents")
        results = []
        for split in settings.splits:
            tokens, starts = data.splits[split], data.starts[split]
            if reading.max_tokens is not None:
                tokens = tokens[: reading.max_tokens + 1]
                starts = starts[starts < len(tokens)]
            results.append(_split(run.model, tokens, starts, split, replace(stream, max_tokens=None)))
        done.append(
            DocumentRun(
                run=str(run.root),
                trained=config.data.documents,
                step=run.step,
                tgt_len=lengths.tgt_len,
                batch_size=batch_size,
                mem_len=span.mem_len,
                splits=tuple(results),
            )
        )
    return DocumentsResult(runs=tuple(done))
