"""``txl analyze memory``: the loss of one trained Transformer-XL as a function of the memory it is given at
evaluation, from none up to several times its training memory, each length a full evaluation of the split.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from ..config import ConfigError, SameLengthOff, Span, eval_lengths, first_set, positive_int, span_of
from ..errors import TxlError
from ..evaluation import EvalResult, EvalSettings, evaluate
from ..model import TransformerXL
from ..runs import LoadedRun
from .common import split_tokens
from .report import format_table, new_figure, run_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "MemorySettings",
    "SweepSettings",
    "MemoryRow",
    "MemoryResult",
    "default_memory_lengths",
    "memory_sweep",
    "analyze_memory",
]


def _lengths(value: tuple[int, ...] | None, name: str) -> tuple[int, ...] | None:
    """``value`` as a tuple of lengths >= 0 (None stays None), else a ConfigError naming ``name``."""
    if value is None:
        return None
    lengths = tuple(value)
    if any(isinstance(m, bool) or not isinstance(m, int) or m < 0 for m in lengths):
        raise ConfigError(f"{name}: memory lengths must be integers >= 0, got {list(lengths)}")
    return lengths


@dataclass(frozen=True)
class MemorySettings:
    """What :func:`analyze_memory` sweeps and how; every length not given starts where ``txl eval`` starts
    on the run (its ``[eval]`` section, else training: :func:`txl.config.eval_lengths`)."""

    lengths: tuple[int, ...] | None = None
    """Evaluation memory lengths (None: :func:`default_memory_lengths` of the training memory)."""
    split: str = "valid"
    """The split evaluated."""
    reading: EvalSettings = EvalSettings(progress=True)
    """How the split is read: its first ``max_tokens`` targets (None: all), ``tgt_len`` and ``batch_size``
    (None: the run's), the clamp and same-length attention of ``span`` at every length (None: the run's;
    its ``mem_len`` is replaced by each of ``lengths``; same-length attention is off at memory 0), and
    whether progress bars show."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", _lengths(self.lengths, "lengths") or None)
        if not isinstance(self.reading, EvalSettings):
            raise ConfigError(f"reading: must be an EvalSettings, got {type(self.reading).__name__}")


@dataclass(frozen=True)
class SweepSettings:
    """The evaluations of :func:`memory_sweep`: one per memory length, each also with the clamp at the
    training attention length."""

    lengths: tuple[int, ...]
    """Evaluation memory lengths."""
    reading: EvalSettings
    """How each length reads: ``tgt_len`` and ``batch_size`` (both needed), the clamp and same-length
    attention of ``span`` (None: no clamp, no same-length; its ``mem_len`` is replaced by each length, and
    same-length attention is off at memory 0, which leaves it nothing to act on), the progress bars."""
    train_attention_len: int | None = None
    """Clamp of the second evaluation (None: the model's mem_len + ``tgt_len``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", _lengths(self.lengths, "lengths"))
        if not isinstance(self.reading, EvalSettings):
            raise ConfigError(f"reading: must be an EvalSettings, got {type(self.reading).__name__}")
        positive_int(self.reading.tgt_len, "tgt_len")
        positive_int(self.reading.batch_size, "batch_size")
        if self.train_attention_len is not None:
            positive_int(self.train_attention_len, "train_attention_len")


@dataclass(frozen=True)
class MemoryRow:
    """One memory length: the mean loss (nats per token) over ``tokens`` targets with the sweep's clamp,
    and with distances clamped at the training attention length (``clamped_*``; the same evaluation when
    no distance reaches it: memory + segment - 1 <= that length). ``same_length``: as evaluated (off without
    memory, as ``txl eval`` turns it off)."""

    mem_len: int
    loss: float
    ppl: float
    bits_per_token: float
    tokens: int
    same_length: bool
    clamped_loss: float
    clamped_ppl: float


@dataclass(frozen=True)
class MemoryResult:
    """Loss against evaluation memory for one run."""

    run: str
    split: str
    step: int
    train_mem_len: int
    tgt_len: int
    batch_size: int
    clamp_len: int | None
    same_length: bool
    train_attention_len: int
    rows: tuple[MemoryRow, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in asdict(self).items() if k != "rows"},
            "rows": [asdict(r) for r in self.rows],
        }

    def table(self) -> str:
        best = min(self.rows, key=lambda r: r.loss)
        rows = [
            [
                r.mem_len,
                f"{r.mem_len / self.train_mem_len:g}x" if self.train_mem_len else "-",
                r.loss,
                r.ppl,
                r.bits_per_token,
                r.clamped_loss,
                r.clamped_ppl,
                "best" if r is best else "",
            ]
            for r in self.rows
        ]
        head = (
            f"{self.run}: {self.split} loss against evaluation memory (segments of {self.tgt_len}, trained "
            f"with memory {self.train_mem_len}, clamp_len {self.clamp_len}, same_length {self.same_length}; "
            f"clamped: clamp_len {self.train_attention_len}, the training attention length)"
        )
        names = ["mem_len", "x train", "loss", "ppl", "bits", "clamped loss", "clamped ppl", ""]
        return head + "\n" + format_table(names, rows)

    def figures(self) -> Mapping[str, Callable[[], Figure]]:
        return {"memory": self._plot}

    def _plot(self) -> Figure:
        fig = new_figure()
        ax = fig.subplots()
        mems = [r.mem_len for r in self.rows]
        ax.plot(mems, [r.loss for r in self.rows], marker="o", label=f"clamp_len {self.clamp_len}")
        ax.plot(
            mems,
            [r.clamped_loss for r in self.rows],
            marker="x",
            linestyle="--",
            label=f"clamp_len {self.train_attention_len} (training attention length)",
        )
        ax.axvline(
            self.train_mem_len, color="gray", linestyle="--", label=f"training memory ({self.train_mem_len})"
        )
        ax.set_xlabel("memory length at evaluation (positions per layer)")
        ax.set_ylabel(f"{self.split} loss (nats per token)")
        ax.set_title(f"Loss against evaluation memory: {run_label(self.run)}")
        ax.legend()
        ax.grid(alpha=0.3)
        return fig


def default_memory_lengths(train_mem_len: int) -> tuple[int, ...]:
    """0 (none), a quarter, a half, 1x, 2x, 4x and 8x the training memory."""
    m = max(train_mem_len, 1)
    return tuple(sorted({0, m // 4, m // 2, m, 2 * m, 4 * m, 8 * m}))


def memory_sweep(model: TransformerXL, tokens: np.ndarray, settings: SweepSettings) -> tuple[MemoryRow, ...]:
    """Evaluate ``model`` on ``tokens`` once per memory length of ``settings`` (:func:`txl.evaluation.evaluate`:
    every token predicted once, memory carried across segments), and again with the clamp at the training
    attention length: beside the unclamped figure, it tells a gain lost to distances the model never saw
    in training from one the model cannot make."""
    if model.config.attention != "relative":
        raise TxlError(
            "the memory analysis needs a Transformer-XL run (this run is the vanilla baseline, "
            "which has no memory)"
        )
    reading = settings.reading
    tgt_len = reading.tgt_len
    assert tgt_len is not None  # checked by SweepSettings
    clamp_len = None if reading.span is None else reading.span.clamp_len
    same_length = reading.span is not None and reading.span.same_length
    attention_len = settings.train_attention_len or model.config.mem_len + tgt_len

    def run(span: Span) -> EvalResult:
        desc = f"mem_len {span.mem_len}, clamp_len {span.clamp_len}"
        return evaluate(model, tokens, replace(reading, span=span, name=desc))

    rows = []
    for mem_len in tqdm(settings.lengths, desc="memory lengths", disable=not reading.progress, leave=False):
        with warnings.catch_warnings():  # the sweep says itself that memory 0 turns same-length off
            warnings.simplefilter("ignore", SameLengthOff)
            span = span_of(mem_len=mem_len, clamp_len=clamp_len, same_length=same_length)
        result = run(span)
        # distances reach mem_len + tgt_len - 1: a clamp at or above that changes nothing
        reach = mem_len + tgt_len - 1
        same = clamp_len == attention_len or (attention_len >= reach and (clamp_len or reach) >= reach)
        clamped = result if same else run(replace(span, clamp_len=attention_len))
        rows.append(
            MemoryRow(
                mem_len=mem_len,
                loss=result.loss,
                ppl=result.ppl,
                bits_per_token=result.bits_per_token,
                tokens=result.tokens,
                same_length=span.same_length,
                clamped_loss=clamped.loss,
                clamped_ppl=clamped.ppl,
            )
        )
    return tuple(rows)


def analyze_memory(run: LoadedRun, settings: MemorySettings = MemorySettings()) -> MemoryResult:
    """Sweep the evaluation memory of a loaded run (:func:`memory_sweep`; the paper evaluates with a longer
    memory than it trains with). Everything not given starts where ``txl eval`` starts on the run, and each
    length is also evaluated with ``clamp_len`` at the training attention length (training memory +
    training segment)."""
    config, reading = run.config, settings.reading
    if config.model.attention != "relative":
        raise TxlError(
            "the memory analysis needs a Transformer-XL run (this run is the vanilla baseline, "
            "which has no memory)"
        )
    tokens = split_tokens(config, run.vocab, settings.split, max_tokens=reading.max_tokens)
    train_mem = config.model.mem_len
    lengths = eval_lengths(config, tgt_len=reading.tgt_len, mem_len=max(1, train_mem))
    span = lengths.span if reading.span is None else reading.span
    attention_len = train_mem + config.train.tgt_len
    batch_size = first_set(reading.batch_size, config.eval.batch_size)
    sweep = SweepSettings(
        lengths=settings.lengths or default_memory_lengths(train_mem),
        reading=replace(reading, tgt_len=lengths.tgt_len, batch_size=batch_size, span=span, max_tokens=None),
        train_attention_len=attention_len,
    )
    return MemoryResult(
        run=str(run.root),
        split=settings.split,
        step=run.step,
        train_mem_len=train_mem,
        tgt_len=lengths.tgt_len,
        batch_size=batch_size,
        clamp_len=span.clamp_len,
        same_length=span.same_length,
        train_attention_len=attention_len,
        rows=memory_sweep(run.model, tokens, sweep),
    )
