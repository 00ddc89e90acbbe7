"""``txl analyze memory``: the loss of one trained Transformer-XL as a function of the memory it is given
at evaluation, from none up to several times its training memory (the paper evaluates with a longer memory
than it trains with). Each length is a full evaluation of the split with :func:`txl.evaluate.evaluate`:
every token predicted once, memory carried across segments.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from ..config import Span, eval_span
from ..errors import TxlError
from ..evaluate import evaluate
from ..model import TransformerXL
from ..runs import load_run
from .common import split_tokens
from .report import format_table, new_figure, run_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MemoryRow", "MemoryResult", "default_memory_lengths", "memory_sweep", "analyze_memory"]


@dataclass(frozen=True)
class MemoryRow:
    """One evaluation: the memory length and the mean loss (nats per token) over ``tokens`` targets."""

    mem_len: int
    loss: float
    ppl: float
    bits_per_token: float
    tokens: int


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
                "best" if r is best else "",
            ]
            for r in self.rows
        ]
        head = (
            f"{self.run}: {self.split} loss against evaluation memory (segments of {self.tgt_len}, trained "
            f"with memory {self.train_mem_len}, clamp_len {self.clamp_len}, same_length {self.same_length})"
        )
        return head + "\n" + format_table(["mem_len", "x train", "loss", "ppl", "bits", ""], rows)

    def figures(self) -> Mapping[str, Callable[[], Figure]]:
        return {"memory": self._plot}

    def _plot(self) -> Figure:
        fig = new_figure()
        ax = fig.subplots()
        ax.plot([r.mem_len for r in self.rows], [r.loss for r in self.rows], marker="o")
        ax.axvline(
            self.train_mem_len, color="gray", linestyle="--", label=f"training memory ({self.train_mem_len})"
        )
        ax.set_xlabel("memory length at evaluation (positions per layer)")
        ax.set_ylabel(f"{self.split} loss (nats per token)")
        ax.set_title(f"Loss against evaluation memory: {run_label(self.run)}")
        ax.legend()
        ax.grid(alpha=0.3)
        return fig


def default_memory_lengths(train_mem_len: int, *, same_length: bool = False) -> tuple[int, ...]:
    """0 (none; left out with ``same_length``), a quarter, a half, 1x, 2x, 4x and 8x the training memory."""
    m = max(train_mem_len, 1)
    lengths = {m // 4, m // 2, m, 2 * m, 4 * m, 8 * m} | ({0} if not same_length else set())
    return tuple(sorted(v for v in lengths if v > 0 or not same_length))


def memory_sweep(
    model: TransformerXL,
    tokens: np.ndarray,
    *,
    lengths: Sequence[int],
    tgt_len: int,
    batch_size: int,
    clamp_len: int | None = None,
    same_length: bool = False,
    progress: bool = False,
) -> tuple[MemoryRow, ...]:
    """Evaluate ``model`` on ``tokens`` once per memory length (segments of ``tgt_len``, ``batch_size``
    streams); the other evaluation lengths are ``clamp_len`` and ``same_length``."""
    if model.config.attention != "relative":
        raise TxlError(
            "the memory analysis needs a Transformer-XL run (this run is the vanilla baseline, "
            "which has no memory)"
        )
    rows = []
    for mem_len in tqdm(lengths, desc="memory lengths", disable=not progress, leave=False):
        span = Span(mem_len=mem_len, clamp_len=clamp_len, same_length=same_length)
        result = evaluate(
            model,
            tokens,
            batch_size=batch_size,
            tgt_len=tgt_len,
            span=span,
            progress=progress,
            desc=f"mem_len {mem_len}",
        )
        rows.append(
            MemoryRow(
                mem_len=mem_len,
                loss=result.loss,
                ppl=result.ppl,
                bits_per_token=result.bits_per_token,
                tokens=result.tokens,
            )
        )
    return tuple(rows)


def analyze_memory(
    run_dir: Path,
    *,
    lengths: Sequence[int] | None = None,
    clamp_len: int | None = None,
    same_length: bool = False,
    split: str = "valid",
    max_tokens: int | None = None,
    tgt_len: int | None = None,
    batch_size: int | None = None,
    checkpoint: str = "best",
    device: str = "cpu",
    progress: bool = True,
) -> MemoryResult:
    """Load a run and sweep its evaluation memory (default: :func:`default_memory_lengths`). Segment length
    and streams default to the run's evaluation settings; ``clamp_len`` to the run's evaluation clamp."""
    run = load_run(Path(run_dir), checkpoint=checkpoint, device=device)
    config = run.config
    tokens = split_tokens(config, run.vocab, split, max_tokens=max_tokens)
    train_mem = config.model.mem_len
    lengths = tuple(lengths) if lengths else default_memory_lengths(train_mem, same_length=same_length)
    clamp_len = clamp_len if clamp_len is not None else eval_span(config).clamp_len
    tgt_len = tgt_len or config.eval.tgt_len or config.train.tgt_len
    batch_size = batch_size or config.eval.batch_size
    rows = memory_sweep(
        run.model,
        tokens,
        lengths=lengths,
        tgt_len=tgt_len,
        batch_size=batch_size,
        clamp_len=clamp_len,
        same_length=same_length,
        progress=progress,
    )
    return MemoryResult(
        run=str(run_dir),
        split=split,
        step=run.step,
        train_mem_len=train_mem,
        tgt_len=tgt_len,
        batch_size=batch_size,
        clamp_len=clamp_len,
        same_length=same_length,
        rows=rows,
    )
