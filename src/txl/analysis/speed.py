"""``txl analyze speed``: the paper's Table 9, per-token evaluation time of the vanilla Transformer (a sliding
window) against the Transformer-XL (memory) at several attention lengths, on random weights and tokens.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from ..config import ConfigError, RunConfig, Span, TransformerXLConfig, positive_int, vanilla_baseline
from ..model import Memory, TransformerXL, eval_mode
from .context import WindowSettings, sliding_losses
from .report import format_table, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "SpeedSettings",
    "SpeedRow",
    "SpeedResult",
    "DEFAULT_LENGTHS",
    "time_vanilla",
    "time_xl",
    "speed_benchmark",
]

DEFAULT_LENGTHS = (128, 256, 512, 800)
"""The attention lengths timed by default."""


@dataclass(frozen=True)
class SpeedSettings:
    """What :func:`speed_benchmark` times (the defaults are ``txl analyze speed``'s)."""

    lengths: tuple[int, ...] = DEFAULT_LENGTHS
    """Attention lengths L."""
    model: TransformerXLConfig | None = None
    """The sizes (None: 2 layers, 4 heads of 32, d_model 128, d_inner 512, byte vocabulary); attention and
    memory are set per length."""
    segment: int = 64
    """The Transformer-XL's segment length."""
    tokens: int = 128
    """Vanilla predictions timed per length."""
    xl_tokens: int = 2048
    """Transformer-XL predictions timed per length (rounded up to whole segments)."""
    windows_per_batch: int | None = None
    """Vanilla windows per forward of the batched timing (None: about 16k positions per batch)."""
    repeats: int = 3
    """Timed runs per measurement; the fastest counts."""
    seed: int = 0
    """Seed of the random weights and tokens."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "lengths", tuple(self.lengths))
        if not self.lengths:
            raise ConfigError("lengths: give at least one attention length")
        for length in self.lengths:
            positive_int(length, "lengths")
        for name in ("segment", "tokens", "xl_tokens", "repeats"):
            positive_int(getattr(self, name), name)
        if self.windows_per_batch is not None:
            positive_int(self.windows_per_batch, "windows_per_batch")


@dataclass(frozen=True)
class SpeedRow:
    """Milliseconds per predicted token at one attention length: the Transformer-XL (batch 1), the vanilla
    model by the paper's protocol (one window per forward) and batched (``windows_per_batch`` windows per
    forward); ``ratio`` and ``batched_ratio``: those vanilla times over the XL's."""

    length: int
    xl_ms_per_token: float
    vanilla_ms_per_token: float
    vanilla_batched_ms_per_token: float
    windows_per_batch: int
    ratio: float
    batched_ratio: float


@dataclass(frozen=True)
class SpeedResult:
    """The speed table and how it was measured."""

    model: dict[str, int]
    params: int
    segment: int
    tokens: int
    xl_tokens: int
    repeats: int
    threads: int
    device: str
    rows: tuple[SpeedRow, ...]

    def as_dict(self) -> dict[str, Any]:
        return {
            **{k: v for k, v in asdict(self).items() if k != "rows"},
            "rows": [asdict(r) for r in self.rows],
        }

    def table(self) -> str:
        sizes = ", ".join(f"{k} {v}" for k, v in self.model.items())
        head = (
            f"evaluation time per token ({sizes}; {self.params:,} parameters; {self.threads} threads on "
            f"{self.device}; fastest of {self.repeats}). XL: batch 1, segments of {self.segment}, memory L, "
            f"same-length. Vanilla: a window of L per prediction, one window per forward (batch 1, the "
            f"paper's protocol) and batched (W windows per forward)"
        )
        names = [
            "attention length",
            "vanilla batch 1 ms/token",
            "vanilla batched ms/token",
            "W",
            "XL ms/token",
            "vanilla / XL (batch 1)",
            "vanilla / XL (batched)",
        ]
        rows = [
            [
                r.length,
                r.vanilla_ms_per_token,
                r.vanilla_batched_ms_per_token,
                r.windows_per_batch,
                r.xl_ms_per_token,
                r.ratio,
                r.batched_ratio,
            ]
            for r in self.rows
        ]
        return head + "\n" + format_table(names, rows)

    def figures(self) -> Mapping[str, Callable[[], Figure]]:
        return {"speed": self._plot}

    def _plot(self) -> Figure:
        fig = new_figure(width=9.0)
        left, right = fig.subplots(1, 2)
        lengths = [r.length for r in self.rows]
        # the Transformer-XL is much faster: on the vanilla model's axis its line would lie on zero, so it
        # has a second axis (right), in its own colour
        (vanilla,) = left.plot(
            lengths,
            [r.vanilla_ms_per_token for r in self.rows],
            marker="o",
            color="tab:blue",
            label="vanilla (sliding window)",
        )
        xl_axis = left.twinx()
        (xl,) = xl_axis.plot(
            lengths,
            [r.xl_ms_per_token for r in self.rows],
            marker="s",
            color="tab:orange",
            label="Transformer-XL (memory)",
        )
        left.set_xlabel("attention length")
        left.set_ylabel("vanilla: ms per token", color="tab:blue")
        xl_axis.set_ylabel("Transformer-XL: ms per token", color="tab:orange")
        left.set_ylim(bottom=0)
        xl_axis.set_ylim(bottom=0)
        left.legend(handles=[vanilla, xl], loc="upper left")
        left.grid(alpha=0.3)
        right.bar([str(n) for n in lengths], [r.ratio for r in self.rows], color="tab:green")
        for i, r in enumerate(self.rows):
            right.annotate(f"{r.ratio:,.0f}x", (i, r.ratio), ha="center", va="bottom")
        right.set_xlabel("attention length")
        right.set_ylabel("slowdown of the vanilla model")
        fig.suptitle("Evaluation speed (the paper's Table 9)")
        return fig


def _fastest(run: Callable[[], object], repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def time_vanilla(
    model: TransformerXL,
    tokens: torch.Tensor,
    *,
    length: int,
    predictions: int,
    windows_per_batch: int,
    repeats: int = 3,
) -> float:
    """Seconds per token for ``predictions`` predictions, each by a full window of ``length`` tokens
    (``tokens`` needs at least length + predictions + 1)."""
    ids = tokens[: length + predictions + 1]
    if ids.numel() < length + predictions + 1:
        raise ValueError(f"need {length + predictions + 1} tokens, got {tokens.numel()}")

    settings = WindowSettings(length, batch_size=windows_per_batch)

    def run() -> None:  # targets length+1 .. length+predictions: every one has a full window
        sliding_losses(model, ids, settings, first=length + 1)

    run()  # warm-up (allocator, kernels)
    return _fastest(run, repeats) / predictions


def time_xl(
    model: TransformerXL,
    tokens: torch.Tensor,
    *,
    length: int,
    segment: int,
    predictions: int,
    repeats: int = 3,
) -> float:
    """Seconds per token for the Transformer-XL: segments of ``segment`` with a full memory of ``length``
    and same-length attention (each prediction attends to ``length`` positions). Returns the time per token
    of ``ceil(predictions / segment)`` whole segments after ``ceil(length / segment)`` to fill the memory."""
    span = Span(mem_len=length, same_length=True)
    warm, timed = math.ceil(length / segment), math.ceil(predictions / segment)
    ids = tokens[: (warm + timed) * segment + 1].view(1, -1)  # (1, N)
    if ids.shape[1] < (warm + timed) * segment + 1:
        raise ValueError(f"need {(warm + timed) * segment + 1} tokens, got {tokens.numel()}")

    def segments(first: int, count: int, memory: Memory | None) -> Memory | None:
        for s in range(first, first + count):
            x = ids[:, s * segment : (s + 1) * segment + 1]  # (1, T+1)
            memory = model(x[:, :-1], memory=memory, targets=x[:, 1:], span=span).memory
        return memory

    with eval_mode(model), torch.inference_mode():
        filled = segments(0, warm, None)
        segments(warm, timed, filled)  # warm-up
        seconds = _fastest(lambda: segments(warm, timed, filled), repeats)
    return seconds / (timed * segment)


def speed_benchmark(settings: SpeedSettings = SpeedSettings(), *, device: str = "cpu") -> SpeedResult:
    """Time both models, on ``device``, at every attention length L; the ratios are vanilla over Transformer-XL time per
    token, and each time is the fastest of ``settings.repeats`` runs (a shared machine adds noise, it never
    removes any).

    - **vanilla**: every prediction is made by a window of the L tokens before it, recomputed from scratch
      (the window slides one position per prediction), and only the window's last position goes through
      the softmax (:func:`txl.analysis.context.sliding_losses`). Timed two ways, each labelled: the paper's
      protocol, **one window per forward** (batch 1, as the paper timed it), and **batched**, W windows per
      forward, which is per token much faster on a CPU and so understates the Transformer-XL's advantage
      over the paper's setting.
    - **Transformer-XL**: one stream (batch 1) in segments of ``settings.segment`` tokens with a memory of L
      positions and same-length attention, so that every prediction attends to exactly L positions, as the
      paper evaluates (enwik8: segments of 128, memory 3,800; WikiText-103: segments of 64, memory 640).
      The memory is filled before the clock starts."""
    sizes = settings.model or TransformerXLConfig(
        vocab_size=256, n_layer=2, n_head=4, d_head=32, d_model=128, d_inner=512
    )
    sizes = dataclasses.replace(
        sizes, dropout=0.0, dropatt=0.0, attention="relative", clamp_len=None, same_length=False
    )
    segment, tokens, xl_tokens = settings.segment, settings.tokens, settings.xl_tokens
    generator = torch.Generator().manual_seed(settings.seed)
    rows = []
    for length in tqdm(
        settings.lengths, desc="attention lengths", disable=not settings.progress, leave=False
    ):
        xl_config = RunConfig(model=dataclasses.replace(sizes, mem_len=length))
        torch.manual_seed(settings.seed)
        xl = TransformerXL(xl_config.model).to(device)
        vanilla = TransformerXL(vanilla_baseline(xl_config).model).to(device)
        needed = max(
            length + tokens + 1, (math.ceil(length / segment) + math.ceil(xl_tokens / segment)) * segment + 1
        )
        ids = torch.randint(0, sizes.vocab_size, (needed,), generator=generator).to(device)
        # W: at most every window
        per_batch = min(settings.windows_per_batch or max(1, 16384 // length), tokens)
        xl_s = time_xl(
            xl, ids, length=length, segment=segment, predictions=xl_tokens, repeats=settings.repeats
        )
        vanilla_s, batched_s = (
            time_vanilla(
                vanilla, ids, length=length, predictions=tokens, windows_per_batch=w, repeats=settings.repeats
            )
            for w in (1, per_batch)
        )
        rows.append(
            SpeedRow(
                length=length,
                xl_ms_per_token=1e3 * xl_s,
                vanilla_ms_per_token=1e3 * vanilla_s,
                vanilla_batched_ms_per_token=1e3 * batched_s,
                windows_per_batch=per_batch,
                ratio=vanilla_s / xl_s,
                batched_ratio=batched_s / xl_s,
            )
        )
        params = sum(p.numel() for p in xl.parameters())
    fields = ("vocab_size", "n_layer", "n_head", "d_head", "d_model", "d_inner")
    return SpeedResult(
        model={f: getattr(sizes, f) for f in fields},
        params=params,
        segment=settings.segment,
        tokens=settings.tokens,
        xl_tokens=math.ceil(xl_tokens / segment) * segment,
        repeats=settings.repeats,
        threads=torch.get_num_threads(),
        device=str(device),
        rows=tuple(rows),
    )
