"""Rows of one decoding batch that join, step and leave: :class:`RowBatch` (a Transformer-XL with memory,
the rows of one key/value cache) and :class:`WindowRows` (a model without memory, a recomputed window), one
interface; the :class:`~txl.inference.engine.Engine` is their one user."""

# Rows of one decoding batch that join, step and leave: :class:`RowBatch` (a Transformer-XL with memory: one
# key/value cache and one :class:`~txl.model.decode.Decoder`) and :class:`WindowRows` (a model without memory:
# a recomputed window), with one interface. A prompt is prefilled apart (:meth:`RowBatch.prefill`, the one
# chunked-prefill recipe), then joins free rows of the batch (:meth:`RowBatch.join`, the one shared-cache
# recipe, with :class:`~txl.model.KVCache`'s row operations); every :meth:`RowBatch.step` decodes all rows at
# once, and a row that ends is freed at once. Both share their bookkeeping (:class:`_Rows`).
#
# Dimensions: R rows of the batch, n rows of one prefill, P prompt length (the longest), V vocabulary, M memory
# length, C context window (the memoryless path), W window width (at most C).
#
# Each row attends only to its own tokens (a document of its own: left padding is never attended, and a row
# joined into a shared cache sees only its own reach), so each row decodes exactly as it would alone.

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from ..config import Span, has_memory
from ..model import KVCache, Memory
from ..model.decode import Decoder
from ..model.transformer import config_of
from .params import DEFAULT_CONTEXT, DecodeSettings

__all__ = ["Prefilled", "RowBatch", "WindowRows", "rows_for", "prepare_rows"]


def _prompt(prompt: Any, vocab_size: int, device: torch.device) -> Tensor:
    """Validate and return a tensor prompt as (B, P) int64 on ``device``."""
    if not isinstance(prompt, Tensor):
        raise ValueError(f"prompt must be a tensor of token ids, got {type(prompt).__name__}")
    if prompt.dtype == torch.bool or prompt.dtype.is_floating_point or prompt.dtype.is_complex:
        raise ValueError(f"prompt must hold integer token ids, got dtype {prompt.dtype}")
    if prompt.dim() == 1:
        prompt = prompt.unsqueeze(0)  # (1, P)
    if prompt.dim() != 2:
        raise ValueError(f"prompt must be (batch, time) or (time,), got shape {tuple(prompt.shape)}")
    if prompt.shape[0] == 0 or prompt.shape[1] == 0:
        raise ValueError(f"prompt is empty (shape {tuple(prompt.shape)}): give at least one token per row")
    low, high = int(prompt.min()), int(prompt.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"prompt token id {bad} is out of range for vocab_size={vocab_size}")
    return prompt.to(device=device, dtype=torch.long)


def prepare_rows(prompt: Any, *, vocab_size: int, device: torch.device) -> list[Tensor]:
    """The prompt as a list of rows (P_r,) int64 on ``device``, checked: a (B, P) or (P,) tensor gives rows of
    one length, a non-empty sequence of 1-D tensors (or of lists of ids) rows of any lengths."""
    if isinstance(prompt, Tensor):
        return list(_prompt(prompt, vocab_size, device))
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ValueError(
            f"prompt must be a tensor of token ids or a non-empty list of rows, got {prompt!r:.80}"
        )
    rows = []
    for row in prompt:
        row = row if isinstance(row, Tensor) else torch.as_tensor(row)
        if row.dim() != 1:
            raise ValueError(f"each prompt row must be 1-D (time,), got shape {tuple(row.shape)}")
        rows.append(_prompt(row, vocab_size, device)[0])
    return rows


def _left_pad(rows: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Rows of different lengths as one batch: (n, P) tokens left-padded with id 0 to the longest, and (n, P)
    starts, True at each row's first token (so that no row attends to its padding)."""
    width = max(len(row) for row in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long, device=rows[0].device)
    starts = torch.zeros(len(rows), width, dtype=torch.bool, device=rows[0].device)
    for r, row in enumerate(rows):
        tokens[r, width - len(row) :] = row
        starts[r, width - len(row)] = True
    return tokens, starts


def _no_memory_why(model: nn.Module) -> str:
    absolute = config_of(model).attention == "absolute"
    return "the vanilla baseline (attention='absolute')" if absolute else "mem_len=0"


def _parameter(model: nn.Module) -> tuple[torch.device, torch.dtype]:
    param = next(model.parameters(), None)
    if param is None:
        return torch.device("cpu"), torch.get_default_dtype()
    return param.device, param.dtype


def _row_list(r: int | Sequence[int], *, size: int, what: str) -> list[int]:
    rows = [r] if isinstance(r, int) else list(r)
    if any(isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < size for i in rows):
        raise ValueError(f"{what}: rows must be integers in [0, {size}), got {r!r:.80}")
    if len(set(rows)) != len(rows):
        raise ValueError(f"{what}: rows must be distinct, got {rows}")
    return rows


def _drain(steps: Generator[None, None, Prefilled]) -> Prefilled:
    """Run a prefill generator to its end; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            prefilled: Prefilled = done.value
            return prefilled


@dataclass(frozen=True)
class Prefilled:
    """n prompts prefilled apart from a batch, ready to join rows of it (:meth:`RowBatch.join`), as often as
    wanted (n choices of one prompt join n rows), except once a first join of every row at once has made its
    cache the batch's own.

    ``log_probs`` is what the first new token of each row is drawn from; the rest is the state the rows
    carry into the batch: a key/value cache of n rows (:class:`RowBatch`), or the window of the last tokens
    (:class:`WindowRows`)."""

    log_probs: Tensor
    """(n, V) log-probabilities of the token after each prompt."""
    cache: KVCache | None = None
    """The n rows' key/value cache (a model with memory)."""
    window: Tensor | None = None
    """(n, W) the last tokens of each prompt, left-padded with 0 (a model without memory)."""
    lengths: tuple[int, ...] = ()
    """The tokens of each row of ``window``."""

    @property
    def rows(self) -> int:
        """n, the rows prefilled."""
        return self.log_probs.shape[0]


class _Rows:
    """The bookkeeping :class:`RowBatch` and :class:`WindowRows` share: R rows, which are in use, the mask of
    the free ones, and the checks of join, step and free."""

    def __init__(self, model: nn.Module, settings: DecodeSettings) -> None:
        if not isinstance(settings, DecodeSettings):
            raise ValueError(f"settings must be a DecodeSettings, got {type(settings).__name__}")
        if settings.rows is None:
            raise ValueError("settings.rows: the rows of a batch must be given (a positive integer)")
        self.model = model
        self.config = config_of(model)
        self.size: int = settings.rows
        """R, the rows of the batch."""
        self.span: Span = self.config.span if settings.span is None else settings.span
        self.compiled = settings.compiled
        """Whether the memory path steps through the compiled step (``DecodeSettings.compiled``)."""
        self.device, self.dtype = _parameter(model)
        self._active = [False] * self.size
        self._free_rows: Tensor | None = None  # (R,) bool, True at free rows, while any row is free

    @property
    def active(self) -> list[int]:
        """The rows in use."""
        return [r for r, on in enumerate(self._active) if on]

    def prefill(self, prompt: Tensor | Sequence[Tensor], memory: Memory | None = None) -> Prefilled:
        """Feed ``prompt`` after ``memory`` apart from the batch: (P,) one row, (n, P) n rows of one length,
        or a list of n 1-D rows of any lengths (each then reads only its own tokens, exactly as alone);
        ``memory``: a :class:`Memory` of n rows to continue, or None."""
        return _drain(self.prefill_steps(prompt, memory))

    def prefill_steps(
        self, prompt: Tensor | Sequence[Tensor], memory: Memory | None = None
    ) -> Generator[None, None, Prefilled]:
        """:meth:`prefill` as a generator that yields between two chunks (so that the other rows can step
        meanwhile) and returns the :class:`Prefilled`."""
        raise NotImplementedError

    def _joining(
        self, r: int | Sequence[int], prefilled: Prefilled, sources: Sequence[int] | None
    ) -> list[int]:
        """The rows ``r`` that join ``prefilled`` (its rows ``sources``, default all), checked."""
        rows = _row_list(r, size=self.size, what="join")
        wanted = prefilled.rows if sources is None else len(sources)
        if sources is not None and any(
            isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < prefilled.rows for i in sources
        ):
            raise ValueError(f"join: sources must be rows of the Prefilled, in [0, {prefilled.rows})")
        if len(rows) != wanted:
            raise ValueError(f"join: {len(rows)} rows given, the Prefilled has {wanted}")
        if any(self._active[i] for i in rows):
            raise ValueError(
                f"join: rows {[i for i in rows if self._active[i]]} are in use (free them first)"
            )
        return rows

    def _joined(self, rows: Sequence[int]) -> None:
        for i in rows:
            self._active[i] = True
        self._mark_free()

    def _mark_free(self) -> None:
        free = [not on for on in self._active]
        self._free_rows = torch.tensor(free, device=self.device) if any(free) else None

    def _fed(self, tokens: Tensor, *, ready: bool) -> Tensor:
        """The tokens of a step, checked, free rows' replaced by a dummy token that nothing attends."""
        if not ready:
            raise ValueError("step: no row has joined yet (prefill a prompt and join it first)")
        if tokens.shape != (self.size,):
            raise ValueError(f"step: tokens must be ({self.size},), one per row, got {tuple(tokens.shape)}")
        return tokens if self._free_rows is None else tokens.masked_fill(self._free_rows, 0)

    def _leaving(self, r: int) -> int:
        (row,) = _row_list(r, size=self.size, what="free")
        if not self._active[row]:
            raise ValueError(f"free: row {row} is not in use")
        self._active[row] = False
        self._mark_free()
        return row


class RowBatch(_Rows):
    """R rows of one :class:`~txl.model.KVCache` decoded together (a Transformer-XL with memory).

    A prompt (with its own memory, if any) is prefilled apart, in chunks of ``settings.prompt_chunk`` tokens
    (default ``span.mem_len``); its rows then join free rows of the shared cache; :meth:`step` feeds one token
    per row, all R rows at once (a free row feeds a dummy token that nothing attends) and returns every row's
    next log-probabilities; :meth:`free` lets a row go. Each row attends only to its own positions (its
    reach), so it decodes exactly as its prompt would alone, whoever its neighbours are and whenever it
    joined. The model should be in eval mode; every method runs in inference mode.

        rows = RowBatch(model, DecodeSettings(rows=4, span=span))
        first = rows.prefill(prompt_ids)            # (P,) -> Prefilled, first.log_probs (1, V)
        rows.join(2, first)                         # row 2 now continues that prompt
        log_probs = rows.step(tokens)               # (R,) one token per row -> (R, V)
        memory = rows.row_memory(2); rows.free(2)   # its memory (batch 1), then the row is free again
    """

    def __init__(self, model: nn.Module, settings: DecodeSettings) -> None:
        super().__init__(model, settings)
        if not has_memory(self.config, self.span):
            raise ValueError(
                f"RowBatch needs a model with memory, not {_no_memory_why(model)}: use WindowRows"
            )
        self.chunk = self.span.mem_len if settings.prompt_chunk is None else settings.prompt_chunk
        self.cache: KVCache | None = None
        """The shared cache (made when rows first join)."""
        self.decoder: Decoder | None = None

    # -- prefill: the one chunked recipe ---------------------------------------------------------------------

    @torch.inference_mode()
    def prefill_steps(
        self, prompt: Tensor | Sequence[Tensor], memory: Memory | None = None
    ) -> Generator[None, None, Prefilled]:
        """:meth:`prefill` as a generator that yields between two chunks (so a server can step its other rows
        meanwhile) and returns the :class:`Prefilled`."""
        rows = prepare_rows(prompt, vocab_size=self.config.vocab_size, device=self.device)
        n = len(rows)
        if memory is not None:
            if not isinstance(memory, Memory):
                raise ValueError(f"memory must be a txl Memory, got {type(memory).__name__}")
            if memory.batch_size != n:
                raise ValueError(f"memory has {memory.batch_size} batch rows, the prompt {n}")
        longest = max(len(row) for row in rows)
        if all(len(row) == longest for row in rows):  # one batch, as given
            cache = self._cache(n, memory)
            log_probs = yield from self._feed(cache, torch.stack(rows), None)
            return Prefilled(log_probs, cache)
        # left-padded, each row starting at its first token: in one chunk, or in chunks while every query of
        # the last one still sees its row's whole prompt (then no chunk boundary changes what it sees)
        whole = not self.span.same_length and (longest - 1) // self.chunk * self.chunk <= self.span.mem_len
        if memory is None and (longest <= self.chunk or whole):
            tokens, starts = _left_pad(rows)  # (n, P) each
            cache = self._cache(n, None)
            log_probs = yield from self._feed(cache, tokens, starts)
            return Prefilled(log_probs, cache)
        # each row alone (its chunks fall where they fall alone), then one cache of n rows
        alone, first = [], []
        for r, row in enumerate(rows):
            if r:
                yield None
            cache = self._cache(1, None if memory is None else memory.select([r]))
            first.append((yield from self._feed(cache, row[None], None)))  # (1, V)
            alone.append(cache)
        cache = self._empty(n, max(c.length for c in alone))
        for r, part in enumerate(alone):
            cache.put_rows([r], part)
        return Prefilled(torch.cat(first), cache)

    def _cache(self, n: int, memory: Memory | None) -> KVCache:
        return KVCache(
            self.config,
            batch_size=n,
            span=self.span,
            memory=memory,
            dtype=self.dtype,
            device=self.device,
        )

    def _empty(self, n: int, length: int) -> KVCache:
        """A cache of n rows that remember ``length`` positions out of everyone's reach (rows put in later)."""
        zeros = Memory.zeros(self.config, n, length, dtype=self.dtype, device=self.device)
        cache = KVCache(self.config, span=self.span, memory=zeros)
        cache.mark_projected()  # nothing reaches these slots: their keys and values are never read
        return cache

    def _feed(self, cache: KVCache, tokens: Tensor, starts: Tensor | None) -> Generator[None, None, Tensor]:
        """Tokens (n, P) through the model with ``cache``, ``chunk`` at a time (yielding between two chunks);
        returns the log-probabilities (n, V) after the last."""
        out = None
        for start in range(0, tokens.shape[1], self.chunk):
            if start:
                yield None
            part = None if starts is None else starts[:, start : start + self.chunk]
            out = self.model(tokens[:, start : start + self.chunk], cache=cache, last_only=True, starts=part)
        assert out is not None and out.log_probs is not None
        return out.log_probs[:, -1]

    # -- the shared cache: rows join, step and leave ----------------------------------------------------------

    @torch.inference_mode()
    def join(
        self, r: int | Sequence[int], prefilled: Prefilled, *, sources: Sequence[int] | None = None
    ) -> None:
        """Rows ``r`` (free ones) continue ``prefilled``'s prompts: its rows ``sources`` (default: all, in
        order; one prompt may join several rows, as choices). The first join of every row at once takes the
        prefilled cache as the batch's; later joins copy into it (``KVCache.put_rows``)."""
        if prefilled.cache is None:
            raise ValueError("join: this Prefilled has no cache (it was made by WindowRows)")
        rows = self._joining(r, prefilled, sources)
        source = prefilled.cache
        if source is self.cache:
            raise ValueError("join: this Prefilled became the batch's cache when every row joined it")
        whole = sources is None or list(sources) == list(range(prefilled.rows))
        if self.cache is None and whole and rows == list(range(self.size)):
            self._use(source)  # the whole batch at once: its cache is the batch's (no copy)
        else:
            if self.cache is None or not self.cache.can_join(len(rows), source.length):
                self._widen()
            assert self.cache is not None
            self.cache.put_rows(rows, source, source_rows=None if sources is None else list(sources))
        self._joined(rows)

    def _use(self, cache: KVCache) -> None:
        self.cache, self.decoder = cache, Decoder(self.model, cache, compiled=self.compiled)

    def _widen(self) -> None:
        """Make the shared cache remember ``mem_len`` positions per row (so that any prefilled row fits),
        keeping the rows it has."""
        cache = self._empty(self.size, self.span.mem_len)
        if self.cache is not None:
            cache.put_rows(slice(None), self.cache)
            cache.reset_rows([r for r, on in enumerate(self._active) if not on])
        self._use(cache)

    @torch.inference_mode()
    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row, (R,) int64 (free rows' values are ignored), and return the log-probabilities
        (R, V) of every row's next token."""
        tokens = self._fed(tokens, ready=self.decoder is not None)
        assert self.decoder is not None
        return self.decoder.step(tokens)

    @torch.inference_mode()
    def free(self, r: int) -> None:
        """Row ``r`` leaves: nothing it remembers is attended any more, and the row can join again."""
        row = self._leaving(r)
        if self.cache is not None:
            self.cache.reset_rows([row])

    def row_memory(self, r: int) -> Memory | None:
        """Row ``r``'s own remembered positions (those within its reach) as a batch-1 :class:`Memory` (a copy,
        of ordinary tensors; None when it remembers nothing): what a generation of its prompt alone would carry
        on with."""
        (row,) = _row_list(r, size=self.size, what="row_memory")
        return None if self.cache is None else self.cache.row_memory(row)

    def memory(self) -> Memory | None:
        """Every row's memory as one :class:`Memory` of R rows, with its per-row reach (None before a join)."""
        return None if self.cache is None else self.cache.memory()


class WindowRows(_Rows):
    """R rows of a model without memory (the vanilla baseline, ``mem_len = 0``), with :class:`RowBatch`'s
    interface: every :meth:`step` recomputes the last ``settings.context`` tokens of every row (default
    :data:`~txl.inference.params.DEFAULT_CONTEXT`), left-padded, with a start at the first token of each
    row shorter than the window, so that no row attends to its padding or to another row.

        rows = WindowRows(model, DecodeSettings(rows=4, context=256))
        rows.join(0, rows.prefill(prompt_ids)); log_probs = rows.step(tokens)    # as RowBatch
    """

    def __init__(self, model: nn.Module, settings: DecodeSettings) -> None:
        super().__init__(model, settings)
        self.context = DEFAULT_CONTEXT if settings.context is None else settings.context
        self.seq = torch.zeros(self.size, 0, dtype=torch.long, device=self.device)
        """(R, W) each row's last tokens, right-aligned (left-padded with 0)."""
        self.lengths = [0] * self.size
        """The tokens of each row in the window (0: a free row)."""

    def _forward(self, window: Tensor, lengths: Sequence[int]) -> Tensor:
        """log-probabilities (n, V) after each row's window (n, W) of ``lengths`` tokens, right-aligned."""
        width = window.shape[1]
        starts = None
        short = [(r, width - n) for r, n in enumerate(lengths) if 0 < n < width]
        if short:
            starts = torch.zeros(window.shape, dtype=torch.bool, device=window.device)  # (n, W)
            index = torch.tensor(short, device=window.device)
            starts[index[:, 0], index[:, 1]] = True
        return self.model(window, span=self.span, last_only=True, starts=starts).log_probs[:, -1]

    @torch.inference_mode()
    def prefill_steps(
        self, prompt: Tensor | Sequence[Tensor], memory: Memory | None = None
    ) -> Generator[None, None, Prefilled]:
        """:meth:`prefill` as a generator (one window: it yields nothing) that returns the :class:`Prefilled`."""
        if memory is not None:
            raise ValueError(
                f"memory was given but the model has none ({_no_memory_why(self.model)}): pass memory=None"
            )
        rows = prepare_rows(prompt, vocab_size=self.config.vocab_size, device=self.device)
        rows = [row[-self.context :] for row in rows]
        lengths = tuple(len(row) for row in rows)
        window = torch.stack(rows) if len(set(lengths)) == 1 else _left_pad(rows)[0]  # (n, W)
        return Prefilled(self._forward(window, lengths), window=window, lengths=lengths)
        yield  # a generator, as RowBatch's  # noqa: B901 - unreachable on purpose

    @torch.inference_mode()
    def join(
        self, r: int | Sequence[int], prefilled: Prefilled, *, sources: Sequence[int] | None = None
    ) -> None:
        """Rows ``r`` (free ones) continue ``prefilled``'s prompts (as :meth:`RowBatch.join`)."""
        window = prefilled.window
        if window is None:
            raise ValueError("join: this Prefilled has no window (it was made by RowBatch)")
        rows = self._joining(r, prefilled, sources)
        taken = list(range(prefilled.rows)) if sources is None else list(sources)
        width = window.shape[1]
        if self.seq.shape[1] < width:
            pad = self.seq.new_zeros(self.size, width - self.seq.shape[1])
            self.seq = torch.cat([pad, self.seq], dim=1)  # (R, W)
        index = torch.tensor(rows, device=self.device)
        self.seq[index] = 0
        self.seq[index, self.seq.shape[1] - width :] = window[torch.tensor(taken, device=self.device)]
        for i, k in zip(rows, taken, strict=True):
            self.lengths[i] = prefilled.lengths[k]
        self._joined(rows)

    @torch.inference_mode()
    def step(self, tokens: Tensor) -> Tensor:
        """Feed one token per row, (R,) int64 (free rows' values are ignored), and return the log-probabilities
        (R, V) of every row's next token."""
        tokens = self._fed(tokens, ready=any(self._active))
        self.lengths = [
            min(n + 1, self.context) if on else 0 for n, on in zip(self.lengths, self._active, strict=True)
        ]
        width = max(self.lengths)
        self.seq = torch.cat([self.seq, tokens[:, None]], dim=1)[:, -width:]  # (R, W)
        return self._forward(self.seq, self.lengths)

    def free(self, r: int) -> None:
        """Row ``r`` leaves (its tokens are forgotten); it can join again."""
        self.lengths[self._leaving(r)] = 0

    def row_memory(self, r: int) -> Memory | None:
        """None: a model without memory carries none."""
        _row_list(r, size=self.size, what="row_memory")
        return None

    def memory(self) -> Memory | None:
        """None: a model without memory carries none."""
        return None


def rows_for(model: nn.Module, settings: DecodeSettings) -> RowBatch | WindowRows:
    """The rows that decode ``model`` (``settings.rows`` of them): a :class:`RowBatch` when it has memory
    under ``settings.span``, else :class:`WindowRows`."""
    config = config_of(model)
    span = config.span if settings.span is None else settings.span
    return RowBatch(model, settings) if has_memory(config, span) else WindowRows(model, settings)
