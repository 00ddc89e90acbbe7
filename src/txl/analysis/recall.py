"""``txl analyze recall``: the fastest demonstration that the memory works. The Transformer-XL and the vanilla
baseline train briefly on ``synthetic-recall``, then each predicts every symbol that repeats one D positions back.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..config import (
    ConfigError,
    DataConfig,
    EvalConfig,
    RunConfig,
    TrainConfig,
    TransformerXLConfig,
    eval_lengths,
    positive_int,
    vanilla_baseline,
)
from ..data.corpora import RECALL_ALPHABET, load_corpus, recall_positions
from ..evaluation import EvalSettings
from ..runs import LoadedRun, load_run, read_metrics
from ..train.trainer import Interrupted
from .common import split_tokens, train_or_reuse
from .context import WindowSettings, sliding_predictions, stream_predictions
from .report import format_table, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "DEFAULT_SEGMENT",
    "DEFAULT_STEPS",
    "RecallSettings",
    "recall_config",
    "RecallResult",
    "recall_accuracy",
    "recall_task",
]

DEFAULT_SEGMENT = 16
"""Training segment of both models; the distance defaults to twice this."""
DEFAULT_STEPS = 400
"""Training steps of each model."""


@dataclass(frozen=True)
class RecallSettings:
    """The recall task and its training budget (the defaults are ``txl analyze recall``'s)."""

    segment: int = DEFAULT_SEGMENT
    """Training segment of both models (the vanilla model's window)."""
    distance: int | None = None
    """D, positions between a symbol and its repeat (None: twice ``segment``); must exceed ``segment``."""
    steps: int = DEFAULT_STEPS
    """Training steps of each model."""
    seed: int = 0
    """Seed of the corpus and of training."""
    overwrite: bool = False
    """Train both runs again from scratch instead of continuing or reusing them."""
    progress: bool = True
    """Show progress bars."""

    def __post_init__(self) -> None:
        positive_int(self.segment, "segment")
        positive_int(self.steps, "steps")
        if self.distance is not None and self.distance <= self.segment:
            raise ConfigError(
                f"distance: must exceed segment ({self.segment}), got {self.distance}; otherwise the "
                "vanilla model sees the symbol to repeat"
            )


def recall_config(settings: RecallSettings = RecallSettings()) -> RunConfig:
    """The Transformer-XL run of the recall task: 2 layers, 4 heads, d_model 64, memory = the distance
    (default 2 x segment), on ``synthetic-recall:distance=D,seed=S`` at character level."""
    segment, steps = settings.segment, settings.steps
    distance = 2 * segment if settings.distance is None else settings.distance
    return RunConfig(
        model=TransformerXLConfig(
            vocab_size=len(RECALL_ALPHABET) + 3,
            n_layer=2,
            n_head=4,
            d_head=16,
            d_model=64,
            d_inner=128,
            mem_len=distance,
        ),
        data=DataConfig(corpus=f"synthetic-recall:distance={distance},seed={settings.seed}", vocab="char"),
        train=TrainConfig(
            steps=settings.steps,
            batch_size=16,
            tgt_len=segment,
            lr=3e-3,
            min_lr=3e-4,
            warmup_steps=min(50, steps // 4),
            clip=1.0,
            seed=settings.seed,
            log_every=10,
            eval_every=max(1, steps // 4),
            eval_tokens=4096,
            checkpoint_every=max(1, steps // 4),
        ),
        eval=EvalConfig(batch_size=16, tgt_len=segment),
    )


@dataclass(frozen=True)
class RecallResult:
    """Exact-recall accuracy of both models (``as_dict`` is results.json)."""

    distance: int
    segment: int
    xl_accuracy: float
    vanilla_accuracy: float
    chance: float
    positions: int
    steps: int
    xl_mem_len: int
    runs: dict[str, str]
    by_offset: dict[str, list[float]] = field(default_factory=dict, repr=False)
    curves: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)

    def as_dict(self) -> dict[str, Any]:
        return {
            "distance": self.distance,
            "segment": self.segment,
            "xl_accuracy": self.xl_accuracy,
            "vanilla_accuracy": self.vanilla_accuracy,
            "chance": self.chance,
            "positions": self.positions,
            "steps": self.steps,
            "xl_mem_len": self.xl_mem_len,
            "runs": self.runs,
            "accuracy_by_offset": self.by_offset,
        }

    def table(self) -> str:
        head = (
            f"exact recall of {self.positions:,} symbols that repeat the one {self.distance} positions "
            f"earlier (segments of {self.segment}, {self.steps} training steps each)"
        )
        rows = [
            ["Transformer-XL", f"memory {self.xl_mem_len}", self.xl_accuracy],
            ["vanilla", f"window {self.segment}", self.vanilla_accuracy],
            ["chance", f"1/{len(RECALL_ALPHABET)}", self.chance],
        ]
        return head + "\n" + format_table(["model", "context", "accuracy"], rows)

    def figures(self) -> Mapping[str, Callable[[], Figure]]:
        return {"recall": self._plot}

    def _plot(self) -> Figure:
        fig = new_figure(width=10.0)
        left, right = fig.subplots(1, 2)
        for name, label in (("xl", "Transformer-XL"), ("vanilla", "vanilla")):
            acc = self.by_offset.get(name, [])
            left.plot(
                range(len(acc)), acc, marker=".", label=f"{label}: {getattr(self, f'{name}_accuracy'):.1%}"
            )
            records = [r for r in self.curves.get(name, []) if r.get("split") == "train"]
            right.plot([r["step"] for r in records], [r["loss"] for r in records], label=label)
        left.axhline(self.chance, color="gray", linestyle="--", label=f"chance ({self.chance:.1%})")
        left.set_ylim(-0.02, 1.02)
        left.set_xlabel(f"position in the repeated copy (each {self.distance} after its source)")
        left.set_ylabel("exact recall accuracy (test)")
        left.legend()
        right.set_xlabel("step")
        right.set_ylabel("training loss (nats per token)")
        right.legend()
        for ax in (left, right):
            ax.grid(alpha=0.3)
        fig.suptitle(f"Recall at distance {self.distance}, segments of {self.segment}")
        return fig


def recall_accuracy(
    run: LoadedRun, tokens: np.ndarray, positions: np.ndarray, *, distance: int, progress: bool = False
) -> np.ndarray:
    """Whether ``run`` predicts the token at each of ``positions`` (all >= ``distance``) exactly: bool array.
    Transformer-XL: a stream with its evaluation lengths, every row warmed up by ``distance`` tokens;
    vanilla: a window of its training segment before each position (its best case)."""
    config = run.config
    if config.model.attention == "relative":
        lengths = eval_lengths(config)
        stream = EvalSettings(
            lengths.tgt_len,
            span=lengths.span,
            batch_size=config.eval.batch_size,
            progress=progress,
            name="recall xl",
        )
        predictions = stream_predictions(run.model, tokens, stream, first=distance)[positions - distance]
    else:
        window = WindowSettings(config.train.tgt_len, progress=progress, desc="recall vanilla")
        predictions = sliding_predictions(run.model, tokens, window, positions=positions)
    return predictions == np.asarray(tokens)[positions]


def recall_task(out: Path, settings: RecallSettings = RecallSettings()) -> RecallResult:
    """Train (or continue, or reuse) both models under ``out`` (``out/xl``, ``out/vanilla``) and measure
    their recall on the test split.

    On ``synthetic-recall`` (made by txl in memory: each line is ``f r|r``, and every symbol of the second
    copy of ``r`` repeats the one exactly D positions before it, D larger than the segment), the vanilla
    model sees at most its training segment (< D), so it is at chance (1/64, the symbols being uniform);
    the XL's memory covers D, so it can be exact. The XL reads the test split in segments with its memory;
    the vanilla model predicts each scored symbol from a full window of its training segment (its best
    case). Only symbols with at least D tokens before them are scored, the same ones for both."""
    config = recall_config(settings)
    distance = config.model.mem_len
    actions = {}
    for name, cfg in (("xl", config), ("vanilla", vanilla_baseline(config))):
        try:
            actions[name] = train_or_reuse(
                cfg, Path(out) / name, overwrite=settings.overwrite, progress=settings.progress
            )[1]
        except Interrupted as exc:
            raise Interrupted(
                f"{name} interrupted at a checkpoint; run the same 'txl analyze recall' command "
                "again to continue",
                signum=exc.signum,
            ) from None
    runs = {name: load_run(Path(out) / name, checkpoint="latest") for name in ("xl", "vanilla")}
    corpus = load_corpus(config.data.corpus)
    positions = recall_positions(corpus.text("test"), distance=distance)
    positions = positions[positions >= distance]
    tokens = split_tokens(config, runs["xl"].vocab, "test")
    hits = {
        name: recall_accuracy(run, tokens, positions, distance=distance, progress=settings.progress)
        for name, run in runs.items()
    }
    offsets = _copy_offsets(corpus.text("test"), positions)
    by_offset = {
        name: [float(h[offsets == j].mean()) for j in range(distance - 1)] for name, h in hits.items()
    }
    return RecallResult(
        distance=distance,
        segment=settings.segment,
        xl_accuracy=float(hits["xl"].mean()),
        vanilla_accuracy=float(hits["vanilla"].mean()),
        chance=1 / len(RECALL_ALPHABET),
        positions=len(positions),
        steps=settings.steps,
        xl_mem_len=distance,
        runs=actions,
        by_offset=by_offset,
        curves={n: read_metrics(Path(out) / n) for n in ("xl", "vanilla")},
    )


def _copy_offsets(text: str, positions: np.ndarray) -> np.ndarray:
    """For each recall position, its index within its copy (0 right after the ``|``)."""
    marks = np.flatnonzero(np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32) == ord("|"))
    return positions - marks[np.searchsorted(marks, positions) - 1] - 1
