"""The one evaluation protocol (:func:`segment_losses`, segments with memory; :func:`ragged_losses`, rows of
different lengths) and its reductions (:func:`evaluate`, :func:`evaluate_run`), set by :class:`EvalSettings`."""

# Dimensions: N tokens, B streams (rows), T segment length, V vocabulary.

from __future__ import annotations

import math
from collections import deque
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from .config import (
    ConfigError,
    EvalLengths,
    Span,
    eval_lengths,
    first_set,
    has_memory,
    positive_int,
)
from .data import BatchSettings, SegmentStream, check_documents, prepare_data
from .data.stream import Batch
from .distributed import SINGLE, Distributed
from .errors import TxlError
from .limits import cache_bytes, check_fits
from .model import KVCache, Memory, TransformerXL, eval_mode
from .runs import LoadedRun

__all__ = [
    "EvalResult",
    "EvalSettings",
    "RaggedSettings",
    "RowScores",
    "RowSegment",
    "SegmentLosses",
    "bits_name",
    "check_eval_fits",
    "eval_rows",
    "evaluate",
    "evaluate_run",
    "metrics_from_loss",
    "perplexity",
    "ragged_losses",
    "score_rows",
    "segment_losses",
]


@dataclass(frozen=True)
class EvalResult:
    """Mean loss over ``tokens`` predicted targets, with perplexity and bits per token."""

    loss: float
    ppl: float
    bits_per_token: float
    tokens: int

    def as_dict(self, prefix: str = "", *, kind: str | None = None) -> dict[str, float | int]:
        """The fields as ``{prefix}name``; with the vocabulary's ``kind`` also the bits under
        :func:`bits_name` (``bpc`` for a char vocabulary, ``bpb`` for a byte one)."""
        out = {f"{prefix}{k}": v for k, v in asdict(self).items()}
        if bits_name(kind):
            out[f"{prefix}{bits_name(kind)}"] = self.bits_per_token
        return out


def bits_name(kind: str | None) -> str | None:
    """What bits per token are also called for a vocabulary of ``kind``: ``bpc`` (bits per character) for a
    char vocabulary, ``bpb`` (per byte) for a byte one, None for word and BPE ones (a token is neither)."""
    return {"char": "bpc", "byte": "bpb"}.get(kind or "")


def perplexity(loss: float) -> float:
    """The perplexity of a mean loss in nats, exp(loss) (inf when it overflows)."""
    return math.exp(loss) if loss < 700 else float("inf")


def metrics_from_loss(loss: float, *, kind: str | None = None) -> dict[str, float]:
    """Perplexity (:func:`perplexity`) and bits per token loss / ln 2 (also under :func:`bits_name` of the
    vocabulary's ``kind``)."""
    bits = loss / math.log(2)
    out = {"ppl": perplexity(loss), "bits_per_token": bits}
    name = bits_name(kind)
    if name:
        out[name] = bits
    return out


def eval_rows(n_tokens: int, batch_size: int, *, world_size: int = 1) -> int:
    """The batch rows an evaluation of ``n_tokens`` tokens in ``batch_size`` streams actually fills: rows of
    L = ceil((n - 1) / B) targets hold ceil((n - 1) / L) of them, the rest would be all padding. Evaluating
    with that many rows (rounded up to a multiple of ``world_size``, at most B) gives the same streams, the
    same L, hence the same figures."""
    if batch_size < 1 or n_tokens < 2:
        return batch_size  # refused by the stream, with its message
    length = -(-(n_tokens - 1) // batch_size)
    used = -(-(n_tokens - 1) // length)
    return min(batch_size, -(-used // world_size) * world_size)


@dataclass(frozen=True)
class EvalSettings:
    """How a token array or a run is read and evaluated (:func:`segment_losses`, :func:`evaluate`,
    :func:`evaluate_run`, the analyses): the lengths (``tgt_len`` and ``span``, an
    :class:`~txl.config.EvalLengths` in two parts, each None for the run's), the streams and what to show.
    Everything is computed on the model's device. Derive others with ``dataclasses.replace``."""

    tgt_len: int | None = None
    """T, the targets per segment. :func:`segment_losses` and :func:`evaluate` need it; for a run
    (:func:`evaluate_run`, the analyses) None is the run's (:func:`~txl.config.eval_lengths`)."""
    batch_size: int | None = None
    """B, the streams read side by side. :func:`segment_losses` and :func:`evaluate` need it; for a run None is
    the run's ``eval.batch_size``."""
    span: Span | None = None
    """The memory length, clamp and same-length attention (None: the model's; for a run, the run's evaluation
    span, :func:`~txl.config.eval_span`, which also overrides the run's lengths one by one)."""
    max_tokens: int | None = None
    """Evaluate only this many targets (a prefix of the tokens); None: all of them."""
    precision: str = "fp32"
    """"fp32", or "bf16" (autocast)."""
    reuse_keys: bool = True
    """Keep the keys and values of remembered positions in a :class:`~txl.model.KVCache` (a Transformer-XL
    in float32) instead of projecting the memory again at every segment; the losses are the same up to
    float rounding. False recomputes them, as training does."""
    log_probs: bool = False
    """:func:`segment_losses` also returns the (B, T, V) log-probabilities (and the memory)."""
    progress: bool = False
    """Show a progress bar (:func:`evaluate`)."""
    name: str | None = None
    """What the tokens are called in errors and on the progress bar (None: "tokens", "eval" for
    :func:`evaluate`, the split for :func:`evaluate_run`)."""

    def __post_init__(self) -> None:
        for field in ("tgt_len", "batch_size", "max_tokens"):
            if getattr(self, field) is not None:
                positive_int(getattr(self, field), field)
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"precision: must be 'fp32' or 'bf16', got {self.precision!r}")

    def resolved(self, model: TransformerXL) -> tuple[int, int, Span]:
        """T, B and the span to read with: ``span`` else the model's."""
        if self.tgt_len is None or self.batch_size is None:
            raise ConfigError("tgt_len and batch_size must be given to evaluate a token array")
        return self.tgt_len, self.batch_size, model.config.span if self.span is None else self.span


def check_eval_fits(
    model: TransformerXL,
    settings: EvalSettings,
    *,
    rows: int,
    steps: int,
    mem_len: int,
    cached: bool,
) -> None:
    """Refuse (:class:`~txl.errors.SizeError`, one line) an evaluation whose largest buffers cannot fit on
    the model's device, before any is allocated: B ``rows`` (of the ``settings.batch_size`` asked for, those
    the data fills), segments of T ``steps`` attending to K keys (the whole memory ``mem_len`` from the start
    when ``cached``, a memory that grows with the stream otherwise), the hidden states and keys and values of
    every layer, N x (B, K, D + 2 H Dh), one layer's attention scores and probabilities, 2 x (B, H, T, K), and
    the log-probabilities (B, T, V), in float32; with a cache at least what the cache allocates
    (:func:`txl.limits.cache_bytes`). A lower bound: what it refuses would fail. The message names
    ``settings.tgt_len``."""
    config = model.config
    keys = mem_len + steps
    width = config.d_model + 2 * config.n_head * config.d_head
    floats = config.n_layer * rows * keys * width + 2 * rows * config.n_head * steps * keys
    need = 4 * (floats + rows * steps * config.vocab_size)
    if cached:
        need = max(need, cache_bytes(config, batch=rows, mem_len=mem_len))
    filled = "" if rows == settings.batch_size else f" ({rows} rows filled)"
    check_fits(
        need,
        setting=f"batch_size {settings.batch_size}{filled} tgt_len {settings.tgt_len} mem_len {mem_len}",
        what=f"the memory and attention of {config.n_layer} layers, d_model {config.d_model}",
        lower="batch_size, tgt_len or mem_len",
        fields=("batch_size", "tgt_len", "mem_len"),
        device=next(model.parameters()).device,
    )


@dataclass(frozen=True)
class SegmentLosses:
    """One segment of :func:`segment_losses`, for the B streams."""

    loss: Tensor
    """(B, T) float64 negative log-likelihood in nats of each target given everything before it in its
    stream (0 where ``mask`` is False)."""
    targets: Tensor
    """(B, T) the target ids."""
    mask: Tensor | None
    """(B, T) bool, True where the target is a real token (the last segment is padded); None when all are."""
    log_probs: Tensor | None = None
    """(B, T, V) the log-probabilities, with ``log_probs=True``."""
    memory: Memory | None = None
    """The memory after the segment when no cache holds it (with ``log_probs=True``: ``reuse_keys`` off)."""

    @property
    def count(self) -> int:
        """The number of real targets."""
        return int(self.mask.sum()) if self.mask is not None else self.targets.numel()


def segment_losses(
    model: TransformerXL,
    tokens: np.ndarray | Tensor,
    settings: EvalSettings,
    *,
    rows: slice | None = None,
    memory: Memory | None = None,
    starts: np.ndarray | None = None,
) -> Iterator[SegmentLosses]:
    """Per-token losses of ``tokens`` segment by segment: the array (N,) cut into ``settings.batch_size``
    contiguous streams (:class:`~txl.data.SegmentStream`, the last segment padded), or given as streams
    already, (B, L+1) ids with B = ``settings.batch_size``, each row's inputs ``row[:-1]`` and targets
    ``row[1:]``. Each segment of ``settings.tgt_len`` attends over the memory of the previous ones with
    ``settings.span`` (default: the model's), starting from ``memory`` (default: none). ``rows``: only these
    streams (a data-parallel rank's share). See :class:`EvalSettings` for ``reuse_keys`` (a key/value cache,
    as generation uses), ``log_probs`` (also the log-probabilities and the memory) and ``precision``; the
    model's device computes.

    ``starts``: the token indices of the (N,) array where documents begin (:attr:`PreparedData.starts`): each
    segment's ``Batch.starts`` are passed to the model, so that a document attends to nothing before it (a
    memory long enough, and each document's losses are those it has read alone). The streams are then cut at
    document starts, each token kept at its offset in the segment (:class:`~txl.data.SegmentStream`), so that
    every document is read whole in one stream and the losses do not depend on the batch size (to rounding).
    None: read across them. Runs in evaluation mode (restored after) without gradients."""
    tgt_len, batch_size, span = settings.resolved(model)
    device = next(model.parameters()).device
    batches: Iterable[Batch]
    if isinstance(tokens, Tensor) and tokens.dim() == 2:
        if starts is not None:
            raise ValueError("starts are token indices of a 1-D token array; streams (B, L+1) take none")
        if tokens.shape[0] != batch_size or tokens.shape[1] < 2:
            raise ValueError(
                f"streams must be ({batch_size}, L+1) ids with L >= 1, got {tuple(tokens.shape)}"
            )
        ids = tokens.to(device=device, dtype=torch.long)
        inputs, targets = ids[:, :-1], ids[:, 1:]  # (B, L) each
        batches = (
            Batch(inputs[:, start : start + tgt_len], targets[:, start : start + tgt_len])
            for start in range(0, inputs.shape[1], tgt_len)
        )
    else:
        try:
            reading = BatchSettings(batch_size, tgt_len, drop_last=False)
            batches = SegmentStream(tokens, reading, name=settings.name or "tokens", starts=starts)
        except ValueError as exc:
            raise TxlError(str(exc)) from None
    rows = slice(0, batch_size) if rows is None else rows
    cache = None
    log_probs, bf16 = settings.log_probs, settings.precision == "bf16"
    if settings.reuse_keys and not log_probs and has_memory(model.config, span) and not bf16:
        dtype = next(model.parameters()).dtype
        cache = KVCache(
            model.config,
            batch_size=rows.stop - rows.start,
            span=span,
            memory=None if memory is None else memory.select(rows),
            dtype=dtype,
            device=device,
        )
    elif memory is not None:
        memory = memory.select(rows)
    with eval_mode(model), torch.no_grad():
        for batch in batches:
            batch = batch.select(rows).to(device)  # (B', T): these streams
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
                # starts only where there are some: a stream without documents calls the model as before
                extra = {} if batch.starts is None else {"starts": batch.starts}
                if log_probs:
                    out = model(batch.inputs, memory=memory, span=span, **extra)
                    probs = out.log_probs.float() if out.log_probs.dtype == torch.bfloat16 else out.log_probs
                    loss = -probs.gather(-1, batch.targets[..., None])[..., 0]  # (B', T)
                elif cache is not None:
                    out = model(batch.inputs, cache=cache, targets=batch.targets, **extra)
                    loss = out.loss
                else:
                    out = model(batch.inputs, memory=memory, targets=batch.targets, span=span, **extra)
                    loss = out.loss
            memory = out.memory
            loss = loss.double()  # (B', T)
            if batch.mask is not None:
                loss = loss * batch.mask
            yield SegmentLosses(loss, batch.targets, batch.mask, out.log_probs if log_probs else None, memory)


# ---------------------------------------------------------------------------------------------------------
# Rows of different lengths (the harness's requests, a server's prompts and session readings)
# ---------------------------------------------------------------------------------------------------------

PAD_ID = 0
"""The input and target id of the padding after a row's last segment (any id: no real position sees it)."""


@dataclass(frozen=True)
class RaggedSettings:
    """How :func:`ragged_losses` reads its rows."""

    tgt_len: int
    """T, the targets per segment (each row is read in segments of T from its own first token)."""
    span: Span | None = None
    """The memory length, clamp and same-length setting (default: the model's). mem_len 0 (and the vanilla
    baseline) reads each segment alone."""
    batch_size: int | None = None
    """The most rows read together (None: all of them); a row that finishes makes room for the next."""
    log_probs: bool = False
    """Also the (n, V) log-probabilities of every segment."""
    greedy: bool = False
    """Also whether each target was the model's most likely next token."""
    final_memory: bool = False
    """Also each row's memory after its last input (what reading on from it needs)."""

    def __post_init__(self) -> None:
        positive_int(self.tgt_len, "tgt_len")
        if self.batch_size is not None:
            positive_int(self.batch_size, "batch_size")


@dataclass(frozen=True)
class RowSegment:
    """One segment of one row, from :func:`ragged_losses`: targets ``offset .. offset + n - 1`` of the row
    (target i is token i + 1, given tokens 0..i and the row's initial memory)."""

    row: int
    """The row's index in the rows given."""
    offset: int
    """The index (among the row's targets) of the segment's first target."""
    loss: Tensor
    """(n,) float64 negative log-likelihood in nats of each target."""
    log_probs: Tensor | None
    """(n, V) log-probabilities of the next token, with ``log_probs``."""
    greedy: Tensor | None
    """(n,) bool, True where the target was the most likely token, with ``greedy``."""
    last: bool
    """The row's last segment (a row of fewer than two tokens has one, empty)."""
    memory: Memory | None = None
    """With ``final_memory``, on the last segment: the row's memory after its last input (batch 1; None when
    the model has none or nothing was read)."""


@dataclass(frozen=True)
class RowScores:
    """A whole row's values, from :func:`score_rows` (the fields of its :class:`RowSegment` s joined)."""

    loss: Tensor
    """(L - 1,) float64 negative log-likelihood of tokens 1..L-1."""
    log_probs: Tensor | None
    """(L - 1, V), with ``log_probs``."""
    greedy: Tensor | None
    """(L - 1,) bool, with ``greedy``."""
    memory: Memory | None
    """The memory after the last input, with ``final_memory``."""


@dataclass
class _Slot:
    """A row in a batch position: its index, its tokens on the device and its next target."""

    row: int
    ids: Tensor
    offset: int = 0

    @property
    def left(self) -> int:
        return self.ids.numel() - 1 - self.offset


def ragged_losses(
    model: TransformerXL,
    rows: Sequence[Sequence[int] | Tensor],
    settings: RaggedSettings,
    *,
    memory: Sequence[Memory | None] | None = None,
) -> Iterator[tuple[RowSegment, ...]]:
    """Per-token losses of rows of different lengths, each read as :func:`segment_losses` reads one stream:
    segments of ``settings.tgt_len`` targets from the row's own first token, each attending over the memory
    of the row's previous segments (in a :class:`~txl.model.KVCache` of one row per batch position) or, without
    memory, alone. Up to ``settings.batch_size`` rows are read together; a row leaves as soon as its last
    segment is read and the next row takes its place (starting from an empty memory: the model attends to
    none of the position's past), so a batch never waits on its longest row. Each row's values are those of
    reading it alone (to float rounding).

    ``memory``: per row, a batch-1 :class:`Memory` to start from (None: empty); such a row reads its first
    segment alone, then joins the batch. Yields, for every model call, the :class:`RowSegment` of each row it
    read (rows of fewer than two tokens yield one empty segment at once). Runs in evaluation mode (restored
    after) without gradients; closing the iterator early stops."""
    span = model.config.span if settings.span is None else settings.span
    param = next(model.parameters())
    ids = [torch.as_tensor(row, dtype=torch.long).to(param.device) for row in rows]
    if any(row.dim() != 1 for row in ids):
        raise ValueError("rows must be 1-D sequences of token ids")
    starts: list[Memory | None] = [None] * len(ids) if memory is None else list(memory)
    if len(starts) != len(ids):
        raise ValueError(f"memory: {len(starts)} memories given for {len(ids)} rows")
    cached = has_memory(model.config, span)
    if not cached and any(m is not None for m in starts):
        raise ValueError("memory: the model reads without memory here (vanilla baseline or mem_len 0)")
    if any(m is not None and m.batch_size != 1 for m in starts):
        raise ValueError("memory: each row's memory must have one batch row")
    reader = _RaggedReader(model, settings, span, cached, starts)
    return reader.run(ids)


def score_rows(
    model: TransformerXL,
    rows: Sequence[Sequence[int] | Tensor],
    settings: RaggedSettings,
    *,
    memory: Sequence[Memory | None] | None = None,
) -> list[RowScores]:
    """Every row's values of :func:`ragged_losses` (same arguments), joined: one :class:`RowScores` per row,
    in the order given."""
    parts: list[list[RowSegment]] = [[] for _ in rows]
    for step in ragged_losses(model, rows, settings, memory=memory):
        for segment in step:
            parts[segment.row].append(segment)
    return [_joined(pieces) for pieces in parts]


def _joined(pieces: list[RowSegment]) -> RowScores:
    """A row's segments (in order) as one :class:`RowScores`."""

    def cat(values: list[Tensor | None]) -> Tensor | None:
        return None if values[0] is None else torch.cat([v for v in values if v is not None])

    return RowScores(
        loss=torch.cat([p.loss for p in pieces]),
        log_probs=cat([p.log_probs for p in pieces]),
        greedy=cat([p.greedy for p in pieces]),
        memory=pieces[-1].memory,
    )


class _RaggedReader:
    """The state of one :func:`ragged_losses` call: the batch positions, the shared cache, what to return."""

    def __init__(
        self,
        model: TransformerXL,
        settings: RaggedSettings,
        span: Span,
        cached: bool,
        starts: list[Memory | None],
    ) -> None:
        self.model, self.settings, self.span, self.cached, self.starts = model, settings, span, cached, starts
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device
        self.cache: KVCache | None = None

    def empty(self, r: int) -> RowSegment:
        """The one segment of a row with no targets (its memory: the one it starts from)."""
        v = self.model.config.vocab_size
        return RowSegment(
            row=r,
            offset=0,
            loss=torch.zeros(0, dtype=torch.float64, device=self.device),
            log_probs=torch.zeros(0, v, dtype=self.dtype, device=self.device)
            if self.settings.log_probs
            else None,
            greedy=torch.zeros(0, dtype=torch.bool, device=self.device) if self.settings.greedy else None,
            last=True,
            memory=self.starts[r] if self.settings.final_memory else None,
        )

    def run(self, ids: list[Tensor]) -> Iterator[tuple[RowSegment, ...]]:
        """Every row's segments, longest rows first (a batch then ends together), in evaluation mode."""
        order = sorted(range(len(ids)), key=lambda r: -ids[r].numel())
        with eval_mode(self.model):
            empty = [r for r in order if ids[r].numel() < 2]
            if empty:
                yield tuple(self.empty(r) for r in empty)
            yield from self.read(deque(_Slot(r, ids[r]) for r in order if ids[r].numel() >= 2))

    def read(self, waiting: deque[_Slot]) -> Iterator[tuple[RowSegment, ...]]:
        """Read the waiting rows, up to ``batch_size`` at a time, refilling positions as rows finish."""
        width = self.settings.batch_size or max(len(waiting), 1)
        active: list[_Slot] = []
        while waiting or active:
            if not active:  # a batch begins
                admitted: list[tuple[_Slot, KVCache | None]] = []
                while waiting and len(admitted) < width:
                    entry = yield from self._admit(waiting.popleft())
                    if entry is not None:
                        admitted.append(entry)
                self._begin(admitted)
                active = [slot for slot, _ in admitted]
                if not active:
                    continue
            segments, done = self._step(active)
            yield segments
            kept: list[int] = []  # positions that hold a row after this step
            for position in range(len(active)):
                while position in done and waiting:  # the next row takes the position
                    entry = yield from self._admit(waiting.popleft())
                    if entry is not None:
                        self._place(position, *entry)
                        active[position] = entry[0]
                        done.discard(position)
                if position not in done:
                    kept.append(position)
            if len(kept) < len(active):  # no row waits: the batch shrinks
                self._shrink(kept)
                active = [active[p] for p in kept]

    def _admit(
        self, slot: _Slot
    ) -> Generator[tuple[RowSegment, ...], None, tuple[_Slot, KVCache | None] | None]:
        """A row ready to join the batch, with the cache of its own first segment when it starts from a memory
        (that segment read alone and yielded; None when it was the row's last)."""
        start = self.starts[slot.row]
        if start is None:
            return slot, None
        own = KVCache(self.model.config, span=self.span, memory=start, dtype=self.dtype, device=self.device)
        segments, done = self._step([slot], cache=own)
        yield segments
        return None if done else (slot, own)

    def _begin(self, admitted: list[tuple[_Slot, KVCache | None]]) -> None:
        """The shared cache of a new batch: empty, or (when some row read from a memory) remembering
        ``mem_len`` positions that no row can attend, into which such rows are put."""
        self.cache = None
        if not self.cached or not admitted:
            return
        config, width = self.model.config, len(admitted)
        if all(own is None for _, own in admitted):
            self.cache = KVCache(
                config, batch_size=width, span=self.span, dtype=self.dtype, device=self.device
            )
            return
        zeros = Memory.zeros(config, width, self.span.mem_len, dtype=self.dtype, device=self.device)
        self.cache = KVCache(config, span=self.span, memory=zeros, dtype=self.dtype, device=self.device)
        for position, (_, own) in enumerate(admitted):
            if own is not None:
                self.cache.put_rows([position], own)

    def _place(self, position: int, slot: _Slot, own: KVCache | None) -> None:
        """A row takes batch ``position`` of the shared cache: from an empty memory (nothing remembered there is
        attended) or from its own cache."""
        if self.cache is None:
            return
        if own is None:
            self.cache.reset_rows([position])
        else:
            self.cache.put_rows([position], own)

    def _shrink(self, keep: list[int]) -> None:
        """Keep only the rows at positions ``keep`` of the shared cache (``KVCache.keep_rows``)."""
        if self.cache is None:
            return
        self.cache = self.cache.keep_rows(keep) if keep else None

    def _step(
        self, active: list[_Slot], *, cache: KVCache | None = None
    ) -> tuple[tuple[RowSegment, ...], set[int]]:
        """One model call over the next segment of every active row: its segments and the positions that
        finished."""
        settings = self.settings
        t = min(settings.tgt_len, max(slot.left for slot in active))
        inputs = torch.full((len(active), t), PAD_ID, dtype=torch.long, device=self.device)  # (B, T)
        targets = torch.full((len(active), t), PAD_ID, dtype=torch.long, device=self.device)  # (B, T)
        counts = []
        for b, slot in enumerate(active):
            n = min(t, slot.left)
            inputs[b, :n] = slot.ids[slot.offset : slot.offset + n]
            targets[b, :n] = slot.ids[slot.offset + 1 : slot.offset + 1 + n]
            counts.append(n)
        if cache is None:
            cache = self.cache
        where: dict[str, Any] = {"cache": cache} if cache is not None else {"span": self.span}
        remembered = cache.full_reach().clone() if cache is not None and settings.final_memory else None
        with torch.no_grad():
            if settings.log_probs or settings.greedy:
                log_probs = self.model(inputs, **where).log_probs  # (B, T, V)
                loss = -log_probs.gather(-1, targets[..., None])[..., 0]  # (B, T)
            else:
                log_probs = None
                loss = self.model(inputs, targets=targets, **where).loss  # (B, T)
        loss = loss.double()
        hits = (
            log_probs.argmax(-1) == targets if log_probs is not None and settings.greedy else None
        )  # (B, T)
        segments, done = [], set()
        for b, (slot, n) in enumerate(zip(active, counts, strict=True)):
            last = n == slot.left
            memory = None
            if last and settings.final_memory and cache is not None and remembered is not None:
                # its memory right after this call: the last mem_len of what it remembered and its n new
                # positions (the padding written after them left out)
                reach = min(cache.span.mem_len, int(remembered[b]) + n)
                memory = cache.row_memory(b, reach=reach, drop=t - n)
            segments.append(
                RowSegment(
                    row=slot.row,
                    offset=slot.offset,
                    loss=loss[b, :n],
                    log_probs=log_probs[b, :n] if log_probs is not None and settings.log_probs else None,
                    greedy=hits[b, :n] if hits is not None else None,
                    last=last,
                    memory=memory,
                )
            )
            slot.offset += n
            if last:
                done.add(b)
        return tuple(segments), done


def evaluate(
    model: TransformerXL,
    tokens: np.ndarray | torch.Tensor,
    settings: EvalSettings,
    *,
    group: Distributed = SINGLE,
    starts: np.ndarray | None = None,
) -> EvalResult:
    """Mean negative log-likelihood of every token of ``tokens`` (after the first) given all before it in
    its stream, carrying memory across segments (:func:`segment_losses`, read as ``settings`` says; its
    ``max_tokens`` limits evaluation to a prefix). Under data parallelism (``group``) every process reads its
    rows (streams) of each batch, with their memory, and the loss sums and token counts are added up over the
    processes: the figure is the one process's. Only the rows the data fills are made (:func:`eval_rows`),
    and a batch that cannot fit is refused before anything is allocated (:func:`check_eval_fits`).
    ``starts``: where documents begin (token indices of ``tokens``): each then attends to nothing before it
    (see :func:`segment_losses`)."""
    with torch.no_grad():  # not a decorator: the root name txl.evaluate keeps its own source and docstring
        tgt_len, asked, span = settings.resolved(model)
        group.rows(asked, field="eval.batch_size")  # the setting as given must split over the processes
        if settings.max_tokens is not None:
            tokens = tokens[: settings.max_tokens + 1]
            if starts is not None:
                starts = starts[starts < len(tokens)]
        device = next(model.parameters()).device
        settings = replace(settings, span=span, name=settings.name or "eval")
        batch_size = eval_rows(len(tokens), asked, world_size=group.world_size)
        cached = settings.reuse_keys and has_memory(model.config, span) and settings.precision == "fp32"
        if len(tokens) >= 2:
            row_len = -(-(len(tokens) - 1) // batch_size)  # targets per stream
            check_eval_fits(
                model,
                settings,
                rows=batch_size,
                steps=min(tgt_len, row_len),
                # a cache holds the whole memory from the start; a memory grows with the stream
                mem_len=span.mem_len if cached else min(span.mem_len, max(row_len - tgt_len, 0)),
                cached=cached,
            )
        rows = group.rows(batch_size, field="eval.batch_size")
        filled = replace(settings, batch_size=batch_size)
        segments = segment_losses(model, tokens, filled, rows=rows, starts=starts)
        n_batches = math.ceil(math.ceil((len(tokens) - 1) / batch_size) / tgt_len) if len(tokens) > 1 else 0
        total = torch.zeros((), dtype=torch.float64, device=device)
        count = 0
        shown = settings.progress and group.is_main
        for segment in tqdm(segments, total=n_batches, desc=settings.name, disable=not shown, leave=False):
            count += segment.count
            total += segment.loss.sum()
        total = group.all_reduce_sum(total)
        count = int(group.all_reduce_sum(torch.tensor(count, dtype=torch.int64, device=device)))
        mean = float(total) / max(count, 1)
        return EvalResult(loss=mean, tokens=count, **metrics_from_loss(mean))


def evaluate_run(
    run: LoadedRun,
    settings: EvalSettings = EvalSettings(),
    *,
    split: str = "valid",
    documents: str | None = None,
) -> dict[str, Any]:
    """Evaluate a loaded run (:func:`txl.runs.load_run`) over a whole split (its first ``settings.max_tokens``)
    and return one record: the run, split, checkpoint and step, the figures of :class:`EvalResult`, and the
    settings used. Settings left as None are the run's own: its ``[eval]`` section, else its training segment
    (``tgt_len``) or its model's lengths (:func:`~txl.config.eval_lengths`; to override its lengths one by
    one, give ``span=eval_span(run.config, mem_len=...)``). ``documents``: "continue" or "reset" (see
    ``data.documents``; None: the run's own)."""
    config = run.config
    lengths = eval_lengths(config, tgt_len=settings.tgt_len)
    if settings.span is not None:
        lengths = EvalLengths(lengths.tgt_len, settings.span)
    if documents is not None and documents not in ("continue", "reset"):
        raise ConfigError(
            f"documents: must be 'continue' or 'reset', got {documents!r}", fields=("documents",)
        )
    documents = first_set(documents, config.data.documents)
    data = prepare_data(config.data, vocab=run.vocab, splits=(split,))
    check_documents(data.corpus, documents, name="documents")
    tokens = data.splits[split]
    used = replace(
        settings,
        tgt_len=lengths.tgt_len,
        batch_size=first_set(settings.batch_size, config.eval.batch_size),
        span=lengths.span,
        name=settings.name or split,
    )
    result = evaluate(
        run.model, tokens, used, starts=data.starts.get(split) if documents == "reset" else None
    )
    span = lengths.span
    return {
        "run": str(run.root),
        "split": split,
        "checkpoint": run.checkpoint.name,
        "step": run.step,
        **result.as_dict(kind=run.vocab.kind),
        "tgt_len": used.tgt_len,
        "batch_size": used.batch_size,
        "mem_len": span.mem_len,
        "clamp_len": span.clamp_len,
        "same_length": span.same_length,
        "documents": documents,
    }
