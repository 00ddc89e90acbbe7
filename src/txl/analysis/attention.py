"""``txl analyze attention``: where each layer of a trained Transformer-XL looks, per layer and head: the
attention probability at every relative distance and the share that goes to the memory.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

# Dimensions: B rows, T segment length, M memory length, K = M + T keys, H heads, N layers.
from ..config import ConfigError, eval_lengths, first_set
from ..errors import TxlError
from ..evaluation import EvalSettings
from ..model import TransformerXL, eval_mode
from ..model.attention import RelativeContext, RelativeMultiHeadAttention
from ..runs import LoadedRun
from .common import split_tokens
from .report import format_table, new_figure, run_label

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "AttentionSettings",
    "AttentionStats",
    "AttentionResult",
    "attention_statistics",
    "analyze_attention",
]


@dataclass(frozen=True)
class AttentionStats:
    """Sums over every counted query, per layer and head; :attr:`by_distance` and the shares are the means.

    prob_sum (N, H, K): attention probability summed at each distance; seen (K,): how many query-head pairs
    of one head could see a key at each distance; memory_sum (N, H): probability summed over memory keys;
    distance_sum (N, H): expected distance summed; queries: how many queries were counted."""

    prob_sum: np.ndarray
    seen: np.ndarray
    memory_sum: np.ndarray
    distance_sum: np.ndarray
    queries: int

    @property
    def by_distance(self) -> np.ndarray:
        """(N, H, K) mean attention probability a query gives the key at each distance (over the queries
        that can see a key there; NaN where none can)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return self.prob_sum / self.seen[None, None, :]

    @property
    def memory_share(self) -> np.ndarray:
        """(N, H) mean share of a query's attention that goes to memory keys."""
        return self.memory_sum / max(self.queries, 1)

    @property
    def mean_distance(self) -> np.ndarray:
        """(N, H) mean distance of the attended keys (probability-weighted)."""
        return self.distance_sum / max(self.queries, 1)


@dataclass(frozen=True)
class AttentionSettings:
    """What :func:`analyze_attention` reads and how (the defaults are ``txl analyze attention``'s)."""

    split: str = "valid"
    """The split sampled."""
    reading: EvalSettings = EvalSettings(batch_size=4, max_tokens=8192, progress=True)
    """How the sample is read: its first ``max_tokens`` tokens in ``batch_size`` rows, in segments of
    ``tgt_len`` with the memory of ``span`` (each None: the run's, as ``txl eval`` reads it), and whether a
    progress bar shows."""

    def __post_init__(self) -> None:
        if not isinstance(self.reading, EvalSettings):
            raise ConfigError(f"reading: must be an EvalSettings, got {type(self.reading).__name__}")


class _Collector:
    """Accumulates attention probabilities from the pre-hooks of every layer's attention."""

    def __init__(self, n_layer: int, n_head: int, max_keys: int) -> None:
        self.prob_sum = torch.zeros(n_layer, n_head, max_keys, dtype=torch.float64)
        self.seen = torch.zeros(max_keys, dtype=torch.float64)
        self.memory_sum = torch.zeros(n_layer, n_head, dtype=torch.float64)
        self.distance_sum = torch.zeros(n_layer, n_head, dtype=torch.float64)
        self.queries = 0
        self.active = False

    def hook(self, index: int) -> Callable[..., None]:
        def capture(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
            if self.active:
                assert isinstance(module, RelativeMultiHeadAttention)  # checked: the model is relative
                self.add(index, module, args[0], kwargs.get("memory"), kwargs["context"])

        return capture

    def add(
        self,
        index: int,
        module: RelativeMultiHeadAttention,
        x: Tensor,
        memory: Tensor | None,
        context: RelativeContext,
    ) -> None:
        probs = torch.softmax(
            module.scores(x, memory=memory, context=context).double(), dim=-1
        )  # (B, H, T, K)
        b, _, t, k = probs.shape
        m = k - t
        distance = (m + torch.arange(t)[:, None] - torch.arange(k)[None, :]).to(probs.device)  # (T, K)
        visible = ~context.mask  # (T, K)
        per_pair = probs.sum(0)[:, visible]  # (H, P): summed over rows, at each visible (query, key)
        d = distance[visible]  # (P,)
        self.prob_sum[index].index_add_(1, d.cpu(), per_pair.cpu())
        self.memory_sum[index] += probs[..., :m].sum(dim=(0, 2, 3)).cpu()  # (H,)
        self.distance_sum[index] += (per_pair * d[None, :]).sum(1).cpu()  # (H,)
        if index == 0:
            self.seen.index_add_(0, d.cpu(), torch.full(d.shape, float(b), dtype=torch.float64))
            self.queries += b * t

    def stats(self) -> AttentionStats:
        return AttentionStats(
            prob_sum=self.prob_sum.numpy(),
            seen=self.seen.numpy(),
            memory_sum=self.memory_sum.numpy(),
            distance_sum=self.distance_sum.numpy(),
            queries=self.queries,
        )


@torch.no_grad()
def attention_statistics(model: TransformerXL, tokens: np.ndarray, settings: EvalSettings) -> AttentionStats:
    """Attention statistics of ``model`` over ``tokens`` cut into ``settings.batch_size`` rows read in segments
    of ``settings.tgt_len`` with memory (``settings.span``: the model's by default). Segments are counted once the memory is
    full (the first ceil(M / T) are a warm-up), so every query sees the whole memory.

    The probabilities are recomputed from the model's public pieces, without modifying it: a forward
    pre-hook on each layer's attention module captures its inputs (hidden states, memory,
    :class:`RelativeContext`), and :meth:`RelativeMultiHeadAttention.scores` gives the masked scores, whose
    softmax is what the layer attends with (dropout is off in evaluation)."""
    if model.config.attention != "relative":
        raise TxlError(
            "the attention analysis needs a Transformer-XL run (relative attention over a memory); "
            "this run is the vanilla baseline"
        )
    tgt_len, batch_size, span = settings.resolved(model)
    progress = settings.progress
    length = len(tokens) // batch_size
    warm = math.ceil(span.mem_len / tgt_len)
    if length < (warm + 1) * tgt_len:
        raise TxlError(
            f"{len(tokens)} tokens in {batch_size} rows are too few to fill a memory of "
            f"{span.mem_len} and then read one segment of {tgt_len}; give more tokens"
        )
    device = next(model.parameters()).device
    rows = torch.as_tensor(np.asarray(tokens[: batch_size * length], dtype=np.int64), device=device)
    rows = rows.view(batch_size, length)  # (B, L)
    collector = _Collector(model.config.n_layer, model.config.n_head, span.mem_len + tgt_len)
    handles = [
        layer.get_submodule("attn").register_forward_pre_hook(collector.hook(i), with_kwargs=True)
        for i, layer in enumerate(model.layers)
    ]
    memory = None
    try:
        starts = range(0, length - tgt_len + 1, tgt_len)  # whole segments only: every query has T - 1 peers
        for s, start in enumerate(tqdm(starts, desc="attention", disable=not progress, leave=False)):
            collector.active = s >= warm
            with eval_mode(model):
                memory = model(rows[:, start : start + tgt_len], memory=memory, span=span).memory
    finally:
        for handle in handles:
            handle.remove()
    return collector.stats()


@dataclass(frozen=True)
class AttentionResult:
    """Attention by distance and memory share, per layer, for one run."""

    run: str
    split: str
    tgt_len: int
    mem_len: int
    queries: int
    stats: AttentionStats

    def as_dict(self) -> dict[str, Any]:
        by_distance = self.stats.by_distance
        layers = []
        for n in range(by_distance.shape[0]):
            layers.append(
                {
                    "layer": n,
                    "memory_share": float(self.stats.memory_share[n].mean()),
                    "current_share": float(1 - self.stats.memory_share[n].mean()),
                    "mean_distance": float(self.stats.mean_distance[n].mean()),
                    "by_distance": by_distance[n].mean(0).tolist(),
                    "heads": [
                        {
                            "memory_share": float(self.stats.memory_share[n, h]),
                            "mean_distance": float(self.stats.mean_distance[n, h]),
                            "by_distance": by_distance[n, h].tolist(),
                        }
                        for h in range(by_distance.shape[1])
                    ],
                }
            )
        return {
            "run": self.run,
            "split": self.split,
            "tgt_len": self.tgt_len,
            "mem_len": self.mem_len,
            "queries": self.queries,
            "distances": list(range(by_distance.shape[2])),
            "layers": layers,
        }

    def _bands(self) -> list[tuple[str, slice]]:
        t, k = self.tgt_len, self.tgt_len + self.mem_len
        edges = sorted({0, 1, 2, 8, t, k} | ({t + self.mem_len // 2} if self.mem_len else set()))
        edges = [e for e in edges if e <= k]
        return [
            (f"d {a}-{b - 1}" if b - 1 > a else f"d {a}", slice(a, b))
            for a, b in zip(edges, edges[1:], strict=False)
        ]

    def table(self) -> str:
        by_distance = self.stats.by_distance.mean(1)  # (N, K) averaged over heads
        bands = self._bands()
        rows = []
        for n in range(by_distance.shape[0]):
            share = float(self.stats.memory_share[n].mean())
            means = [float(np.nanmean(by_distance[n, band])) for _, band in bands]
            rows.append([n, 1 - share, share, float(self.stats.mean_distance[n].mean()), *means])
        head = (
            f"{self.run}: attention per layer on {self.queries:,} {self.split} queries (segments of "
            f"{self.tgt_len}, memory {self.mem_len}; a query's current segment is at distances 0..i, its "
            f"memory beyond; 'd a-b': mean probability per key at those distances)"
        )
        return (
            head
            + "\n"
            + format_table(["layer", "current", "memory", "mean dist", *(n for n, _ in bands)], rows)
        )

    def figures(self) -> Mapping[str, Callable[[], Figure]]:
        return {"attention": self._plot}

    def _plot(self) -> Figure:
        from matplotlib.colors import LogNorm

        by_distance = self.stats.by_distance.mean(1)  # (N, K)
        fig = new_figure(width=10.0, height=1.2 + 0.6 * by_distance.shape[0] + 2.5)
        top, bottom = fig.subplots(2, 1, height_ratios=[max(1.0, 0.5 * by_distance.shape[0]), 1.2])
        positive = by_distance[np.isfinite(by_distance) & (by_distance > 0)]
        image = top.imshow(
            np.where(by_distance > 0, by_distance, np.nan),
            aspect="auto",
            interpolation="nearest",
            norm=LogNorm(vmin=max(positive.min(), 1e-6), vmax=positive.max()),
            cmap="viridis",
        )
        top.axvline(self.tgt_len - 0.5, color="white", linestyle="--", linewidth=1)
        top.set_yticks(range(by_distance.shape[0]))
        top.set_ylabel("layer")
        top.set_xlabel(f"relative distance (beyond {self.tgt_len - 1}, dashed: memory keys only)")
        top.set_title(f"Mean attention probability per key by distance: {run_label(self.run)}")
        fig.colorbar(image, ax=top, label="probability (log)")
        layers = np.arange(by_distance.shape[0])
        memory = self.stats.memory_share.mean(1)
        bottom.bar(layers, 1 - memory, label="current segment")
        bottom.bar(layers, memory, bottom=1 - memory, label="memory")
        bottom.set_xticks(layers)
        bottom.set_xlabel("layer")
        bottom.set_ylabel("share of attention")
        bottom.set_ylim(0, 1.25)
        bottom.legend(loc="upper center", ncols=2)
        return fig


def analyze_attention(run: LoadedRun, settings: AttentionSettings = AttentionSettings()) -> AttentionResult:
    """Measure the attention of a loaded run (:func:`attention_statistics`) on the first
    ``settings.reading.max_tokens`` tokens of the split, with the run's evaluation lengths (``txl eval``'s:
    :func:`txl.config.eval_lengths`) unless ``settings.reading`` gives the span or the segment length."""
    config, reading = run.config, settings.reading
    lengths = eval_lengths(config, tgt_len=reading.tgt_len)
    span = lengths.span if reading.span is None else reading.span
    tokens = split_tokens(config, run.vocab, settings.split, max_tokens=reading.max_tokens)
    batch_size = first_set(reading.batch_size, AttentionSettings().reading.batch_size)
    read = dataclasses.replace(reading, tgt_len=lengths.tgt_len, span=span, batch_size=batch_size)
    stats = attention_statistics(run.model, tokens, read)
    return AttentionResult(
        run=str(run.root),
        split=settings.split,
        tgt_len=lengths.tgt_len,
        mem_len=span.mem_len,
        queries=stats.queries,
        stats=stats,
    )
