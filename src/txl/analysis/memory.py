"""``txl analyze memory``: the loss of one trained Transformer-XL as a function of the memory it is given
at evaluation, from none up to several times its training memory (the paper evaluates with a longer memory
than it trains with). Each length is a full evaluation of the split with :func:`txl.evaluate.evaluate`:
every token predicted once, memory carried across segments. The sweep starts from the settings ``txl eval``
uses on the run (:func:`txl.config.eval_span`: its ``[eval]`` clamp and same-length attention, else the
model's), and each length is also evaluated with ``clamp_len`` at the training attention length (training
memory + training segment): beside the unclamped figure, it tells a gain lost to distances the model never
saw in training from one the model cannot make.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from tqdm.auto import tqdm

from ..config import Span, eval_span
from ..errors import TxlError
from ..evaluate import EvalResult, EvalSettings, evaluate
from ..model import TransformerXL
from ..runs import load_run
from .common import split_tokens
from .report import format_table, new_figure, run_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["MemoryRow", "MemoryResult", "default_memory_lengths", "memory_sweep", "analyze_memory"]


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


def memory_sweep(
    model: TransformerXL,
    tokens: np.ndarray,
    *,
    lengths: Sequence[int],
    tgt_len: int,
    batch_size: int,
    clamp_len: int | None = None,
    same_length: bool = False,
    train_attention_len: int | None = None,
    progress: bool = False,
) -> tuple[MemoryRow, ...]:
    """Evaluate ``model`` on ``tokens`` once per memory length (segments of ``tgt_len``, ``batch_size``
    streams); the other evaluation lengths are ``clamp_len`` and ``same_length`` (off at memory 0, which
    leaves it nothing to act on), and again with ``clamp_len = train_attention_len`` (default: the model's
    mem_len + ``tgt_len``)."""
    if model.config.attention != "relative":
        raise TxlError(
            "the memory analysis needs a Transformer-XL run (this run is the vanilla baseline, "
            "which has no memory)"
        )
    attention_len = train_attention_len or model.config.mem_len + tgt_len

    def run(span: Span) -> EvalResult:
        desc = f"mem_len {span.mem_len}, clamp_len {span.clamp_len}"
        settings = EvalSettings(
            batch_size=batch_size, tgt_len=tgt_len, span=span, progress=progress, name=desc
        )
        return evaluate(model, tokens, settings)

    rows = []
    for mem_len in tqdm(lengths, desc="memory lengths", disable=not progress, leave=False):
        span = Span(mem_len=mem_len, clamp_len=clamp_len, same_length=same_length and mem_len > 0)
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


def analyze_memory(
    run_dir: Path,
    *,
    lengths: Sequence[int] | None = None,
    clamp_len: int | None = None,
    same_length: bool | None = None,
    split: str = "valid",
    max_tokens: int | None = None,
    tgt_len: int | None = None,
    batch_size: int | None = None,
    checkpoint: str = "best",
    device: str = "cpu",
    progress: bool = True,
) -> MemoryResult:
    """Load a run and sweep its evaluation memory (default: :func:`default_memory_lengths`). Everything
    not given starts where ``txl eval`` starts on the run: segment length and streams from its ``[eval]``
    section (else training), ``clamp_len`` and ``same_length`` by :func:`txl.config.eval_span`."""
    run = load_run(Path(run_dir), checkpoint=checkpoint, device=device)
    config = run.config
    if config.model.attention != "relative":
        raise TxlError(
            "the memory analysis needs a Transformer-XL run (this run is the vanilla baseline, "
            "which has no memory)"
        )
    tokens = split_tokens(config, run.vocab, split, max_tokens=max_tokens)
    train_mem = config.model.mem_len
    lengths = tuple(lengths) if lengths else default_memory_lengths(train_mem)
    span = eval_span(config, mem_len=max(1, train_mem), clamp_len=clamp_len, same_length=same_length)
    clamp_len, same_length = span.clamp_len, span.same_length
    tgt_len = tgt_len or config.eval.tgt_len or config.train.tgt_len
    batch_size = batch_size or config.eval.batch_size
    attention_len = train_mem + config.train.tgt_len
    rows = memory_sweep(
        run.model,
        tokens,
        lengths=lengths,
        tgt_len=tgt_len,
        batch_size=batch_size,
        clamp_len=clamp_len,
        same_length=same_length,
        train_attention_len=attention_len,
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
        train_attention_len=attention_len,
        rows=rows,
    )
