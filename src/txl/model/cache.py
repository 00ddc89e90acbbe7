"""The key/value cache of incremental decoding: per layer, the keys and values of the remembered positions
and their hidden states. It only stores and slides; it knows no model."""

# The key/value cache of incremental decoding: for every layer, the keys and values of the remembered
# positions (projections of fixed hidden states, computed once) and the hidden states themselves (the memory as
# data, :meth:`KVCache.memory`). This module only stores and slides; it knows no model and no module. The model
# appends to it (``TransformerXL.forward(..., cache=...)``), and the one-position decoder (``decode.py``) reads
# its windows.
#
# Dimensions (the legend of ``model/``): L layers, B batch, T new positions, M memory length, S buffer slots,
# H heads, Dh head size, D model size, K keys in view.
#
# Sliding: each buffer holds S >= M + T slots, the remembered positions in ``[start, end)`` in order. A step
# writes the T new positions at ``end`` (no copy of the memory), then drops the oldest by moving ``start``, so
# that at most ``mem_len`` remain: exactly ``update_memory``'s concatenate-and-truncate. When a step would run
# past the end of the buffer, the remembered slots move back to the front, once every ``mem_len / 4`` steps or
# so (the copy is amortised to about four positions per step; the buffers hold 1.25 ``mem_len``).
#
# A cache built from a :class:`Memory` holds its hidden states but not yet their keys and values: slots
# ``[projected, end)`` are *unprojected*. The next segment through ``forward`` projects them with its own
# positions (:meth:`LayerCache.unprojected`, then :meth:`LayerCache.append` of both), as the memory path does.
#
#     cache = KVCache(model.config, batch_size=2, span=Span(mem_len=256), memory=None)
#     out = model(prompt, cache=cache, last_only=True)     # out.log_probs (B, 1, V); keys/values appended
#     cache.memory()                                       # == the memory the segment-wise model would carry
#
# Documents: the cache keeps, per row, the :class:`Memory`'s *reach* (how many of the last remembered positions
# belong to the row's current document; None: all), moved along by :meth:`KVCache.advance` with the segment's
# starts. The row operations (continuous batching: a request prefills alone, then joins a row of a shared
# cache): :meth:`KVCache.put_rows` moves a small cache's rows into a big one when :meth:`KVCache.can_join`,
# :meth:`KVCache.reset_rows` starts rows anew, :meth:`KVCache.row_memory` reads one row's own memory and
# :meth:`KVCache.keep_rows` keeps a subset of rows. Nothing outside ``model/`` slices the buffers.

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..config import Span, TransformerXLConfig, cache_slots, has_memory, positive_int
from .memory import Memory, full_reach, next_reach

__all__ = ["KVCache", "LayerCache", "CACHE_SIZES"]

CACHE_SIZES = ("n_layer", "n_head", "d_head", "d_model")
"""The sizes a key/value cache is built for: a model must have the same to use it (:meth:`KVCache.fits`)."""


class LayerCache:
    """One layer's part of a :class:`KVCache`: views of its buffers, handed to that layer's attention."""

    __slots__ = ("_owner", "kv", "keys_t", "values", "hidden")

    def __init__(self, owner: KVCache, index: int) -> None:
        self._owner = owner
        self.kv = owner.kv[index]  # (2, B, H, S, Dh): keys, values
        b, h, s, dh = self.kv.shape[1:]
        self.keys_t = self.kv[0].view(b * h, s, dh).transpose(1, 2)  # (B*H, Dh, S), the same storage
        self.values = self.kv[1].view(b * h, s, dh)  # (B*H, S, Dh)
        self.hidden = owner.hidden[index]  # (B, S, D)

    def unprojected(self) -> Tensor | None:
        """The remembered hidden states (B, P, D) whose keys and values are not in the cache yet (a memory the
        cache was built with), or None."""
        owner = self._owner
        if owner.projected == owner.end:
            return None
        return self.hidden[:, owner.projected : owner.end]  # (B, P, D)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write keys and values (B, H, P + T, Dh) of the unprojected and the T new positions and return those
        of every position in view, (B, H, K, Dh) each, K = M + T: [memory ; new]."""
        owner = self._owner
        first, n = owner.projected, k.shape[2]
        self.kv[0].narrow(2, first, n).copy_(k)
        self.kv[1].narrow(2, first, n).copy_(v)
        window = self.kv.narrow(3, owner.start, first + n - owner.start)  # (2, B, H, K, Dh)
        return window[0], window[1]

    def append_one(self, kv: Tensor, *, first: int) -> tuple[Tensor, Tensor]:
        """One new position: write its keys and values ``kv`` (2, B, H, Dh) at ``end`` and return the keys in
        view from slot ``first`` on, transposed, (B*H, Dh, K), and the values, (B*H, K, Dh), flattened for
        batched matmuls (views of the buffer)."""
        end = self._owner.end
        self.kv.select(3, end).copy_(kv)
        return self.keys_t.narrow(2, first, end + 1 - first), self.values.narrow(1, first, end + 1 - first)


class KVCache:
    """Per-layer keys, values and hidden states of the last ``span.mem_len`` positions, for a model fed a few
    positions at a time (generation, evaluation). Build it empty or from a :class:`Memory` and pass it to
    ``model(tokens, cache=cache)``: each call appends its positions and slides the window; the result equals
    ``model(tokens, memory=cache.memory(), span=cache.span)`` without projecting the memory again.

    The cache is sized from the config alone and holds no model. It is mutable state of one decoding session:
    it belongs to the caller, and its keys and values are valid for the model (and weights) that computed
    them only."""

    def __init__(
        self,
        config: TransformerXLConfig,
        *,
        batch_size: int | None = None,
        span: Span | None = None,
        memory: Memory | None = None,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        span = config.span if span is None else span
        if not has_memory(config, span):
            raise ValueError(
                "a key/value cache needs a Transformer-XL with memory (relative attention, mem_len > 0)"
            )
        if memory is not None:
            if not isinstance(memory, Memory):
                raise ValueError(f"memory must be a txl Memory, got {type(memory).__name__}")
            if batch_size is not None and batch_size != memory.batch_size:
                raise ValueError(f"memory has {memory.batch_size} batch rows, batch_size is {batch_size}")
            if len(memory) != config.n_layer or memory.states[0].shape[-1] != config.d_model:
                raise ValueError(
                    f"memory has {len(memory)} states of size {memory.states[0].shape[-1]}, the model "
                    f"needs {config.n_layer} of size {config.d_model}"
                )
            batch_size = memory.batch_size
            dtype = memory.states[0].dtype if dtype is None else dtype
            device = memory.states[0].device if device is None else device
        batch_size = positive_int(batch_size, "batch_size (without a memory)", error=ValueError, field=False)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        m0 = 0 if memory is None else memory.length
        self.config = config
        self.span = span
        self.batch_size = batch_size
        self.longest = max(span.mem_len, m0)
        """The most positions ever remembered at once (``mem_len``, or a longer memory given at the start)."""
        self._slack = cache_slots(span.mem_len) - span.mem_len  # room to slide before moving back
        n, b, h, dh, d = config.n_layer, batch_size, config.n_head, config.d_head, config.d_model
        slots = self.longest + self._slack
        self.hidden = torch.zeros(n, b, slots, d, dtype=dtype, device=device)  # (L, B, S, D)
        self.kv = torch.zeros(n, 2, b, h, slots, dh, dtype=dtype, device=device)  # (L, 2, B, H, S, Dh)
        if memory is not None:
            for index, state in enumerate(memory.states):
                self.hidden[index, :, :m0] = state
        self.start = 0
        """First remembered slot."""
        self.end = m0
        """One past the last remembered slot (where the next positions are written)."""
        self.projected = 0
        """One past the last slot whose keys and values are stored (``end`` once a segment went through)."""
        self.reach: Tensor | None = None
        """(B,) int64 or None: how many of the last remembered positions belong to each row's current document
        (as :attr:`Memory.reach`; None: all of them)."""
        if memory is not None and memory.reach is not None:
            self.reach = memory.reach.to(device=self.hidden.device, copy=True)
        self.layers = tuple(LayerCache(self, i) for i in range(n))

    @property
    def dtype(self) -> torch.dtype:
        return self.hidden.dtype

    @property
    def device(self) -> torch.device:
        return self.hidden.device

    @property
    def length(self) -> int:
        """M, the number of remembered positions."""
        return self.end - self.start

    @property
    def capacity(self) -> int:
        """S, the slots of each buffer."""
        return self.hidden.shape[2]

    def memory(self) -> Memory | None:
        """The remembered hidden states as a :class:`Memory`, with the reach (copies; None when nothing is
        remembered yet)."""
        if self.end == self.start:
            return None
        return Memory(
            tuple(self.hidden[i, :, self.start : self.end].clone() for i in range(len(self.layers))),
            reach=None if self.reach is None else self.reach.clone(),
        )

    def fits(self, config: TransformerXLConfig) -> bool:
        """Whether this cache's buffers fit a model of ``config``: the same :data:`CACHE_SIZES`."""
        return all(getattr(self.config, f) == getattr(config, f) for f in CACHE_SIZES)

    def full_reach(self) -> Tensor:
        """The reach, with None spelled out: (B,) int64, the window's length for every row without one."""
        return full_reach(self.reach, batch_size=self.batch_size, length=self.length, device=self.device)

    def reset_rows(self, rows: Tensor | Sequence[int] | slice) -> None:
        """Those rows start anew: their reach becomes 0, so nothing they remember is attended (nothing else
        changes; no other row is touched)."""
        reach = self.full_reach().clone()
        reach[_rows(rows, self.device)] = 0
        self.reach = reach

    def put_rows(
        self,
        rows: Tensor | Sequence[int] | slice,
        source: KVCache,
        *,
        source_rows: Sequence[int] | None = None,
    ) -> None:
        """Copy ``source``'s remembered window (hidden states, keys and values; all projected) into ``rows`` of
        this cache, aligned at the end of this cache's window, and give those rows the source's reach (its
        length when it has none). The rows then continue exactly as the source would: their older slots are
        out of reach. ``source_rows``: which of the source's rows each of ``rows`` takes (default: all, in
        order; one source row may go to several rows). Needs :meth:`can_join` (a server keeps its shared
        cache full by building it from ``Memory.zeros(config, B, mem_len)``)."""
        index = _rows(rows, self.device)
        n = torch.arange(self.batch_size, device=self.device)[index].numel()
        taken: Tensor | slice = slice(None)
        given = source.batch_size
        if source_rows is not None:
            taken = _rows(source_rows, self.device)
            given = len(source_rows)
            if any(not 0 <= int(i) < source.batch_size for i in source_rows):
                raise ValueError(f"put_rows: source_rows must be in [0, {source.batch_size})")
        if not source.fits(self.config):
            raise ValueError(
                f"put_rows: the source cache was built for other sizes ({', '.join(CACHE_SIZES)})"
            )
        if source.dtype != self.dtype or source.device != self.device:
            raise ValueError(
                f"put_rows: the source holds {source.dtype} on {source.device}, this cache {self.dtype} on "
                f"{self.device}"
            )
        if n != given:
            raise ValueError(f"put_rows: {n} rows given, the source cache has {given}")
        if source.projected != source.end:
            raise ValueError("put_rows: the source has unprojected memory (feed it a segment first)")
        if not self.can_join(n, source.length):
            raise ValueError(
                f"put_rows: the source remembers {source.length} positions, this cache's window only "
                f"{self.length} (build it from Memory.zeros(config, B, mem_len))"
            )
        m = source.length
        first = self.end - m
        window = slice(source.start, source.end)
        self.hidden[:, index, first : self.end] = source.hidden[:, taken, window]
        self.kv[:, :, index, :, first : self.end] = source.kv[:, :, taken, :, window]
        reach = self.full_reach().clone()
        reach[index] = source.full_reach()[taken]
        self.reach = reach

    def row_memory(self, row: int, *, reach: int | None = None, drop: int = 0) -> Memory | None:
        """Row ``row``'s own memory as a batch-1 :class:`Memory` (a copy; None when it remembers nothing): its
        last ``reach`` remembered positions (default: its reach, everything of its current document), before
        the last ``drop`` positions written (padding after the row's last real position)."""
        if not 0 <= row < self.batch_size:
            raise ValueError(f"row_memory: row must be in [0, {self.batch_size}), got {row}")
        length = int(self.full_reach()[row]) if reach is None else reach
        end = self.end - drop
        if length < 0 or drop < 0 or end - length < 0:
            raise ValueError(f"row_memory: {length} positions before the last {drop} are not in the buffers")
        if length == 0:
            return None
        block = self.hidden[:, row : row + 1, end - length : end].clone()  # (L, 1, M, D)
        return Memory(block.unbind(0))

    def can_join(self, n: int, length: int) -> bool:
        """Whether ``n`` rows remembering ``length`` positions (a source of :meth:`put_rows`) fit this cache:
        as many rows, and a window at least as long."""
        return n <= self.batch_size and length <= self.length

    def keep_rows(self, rows: Sequence[int]) -> KVCache:
        """A cache of only ``rows`` (in that order): their remembered window, keys and values (no projection
        again) and reach."""
        index = _rows(rows, self.device)
        kept = KVCache.__new__(KVCache)
        kept.config, kept.span, kept.longest, kept._slack = self.config, self.span, self.longest, self._slack
        kept.hidden = self.hidden[:, index].clone()  # (L, n, S, D)
        kept.kv = self.kv[:, :, index].clone()  # (L, 2, n, H, S, Dh)
        kept.batch_size = kept.hidden.shape[1]
        kept.start, kept.end, kept.projected = self.start, self.end, self.projected
        kept.reach = None if self.reach is None else self.reach[index].clone()
        kept.layers = tuple(LayerCache(kept, i) for i in range(len(self.layers)))
        return kept

    def make_room(self, t: int) -> None:
        """Ensure T more positions fit after the memory: move the remembered slots to the front when the
        buffers would overflow, or grow them for a segment longer than the slack."""
        if self.end + t <= self.capacity:
            return
        m, shift = self.length, self.start
        if m + t > self.capacity:  # a long segment: grow (rare; generation appends one position at a time)
            slots = m + t + self._slack
            hidden = self.hidden.new_zeros(*self.hidden.shape[:2], slots, self.hidden.shape[3])
            kv = self.kv.new_zeros(*self.kv.shape[:4], slots, self.kv.shape[5])
            hidden[:, :, :m] = self.hidden[:, :, self.start : self.end]
            kv[:, :, :, :, :m] = self.kv[:, :, :, :, self.start : self.end]
            self.hidden, self.kv = hidden, kv
            self.layers = tuple(LayerCache(self, i) for i in range(len(self.layers)))
        else:  # slide back to the front (source and target may overlap: copy through a clone)
            self.hidden[:, :, :m] = self.hidden[:, :, self.start : self.end].clone()
            self.kv[:, :, :, :, :m] = self.kv[:, :, :, :, self.start : self.end].clone()
        self.start, self.end, self.projected = 0, m, self.projected - shift

    def store_inputs(self, inputs: list[Tensor]) -> None:
        """Write every layer's input on the new positions, (B, T, D) each, or (B, D) each for one position
        (what the memory keeps)."""
        if inputs[0].dim() == 2:
            torch.stack(inputs, out=self.hidden.select(2, self.end))  # (L, B, D) into (L, B, S, D)
            return
        for layer, h in zip(self.layers, inputs, strict=True):
            layer.hidden.narrow(1, self.end, h.shape[1]).copy_(h)

    def mark_projected(self) -> None:
        """The keys and values of every remembered position are stored now (a memory was bound)."""
        self.projected = self.end

    def advance(self, t: int, *, starts: Tensor | None = None) -> None:
        """After a step of T positions, whose keys and values are stored (with those of any unprojected
        memory): they join the memory, and the oldest beyond ``mem_len`` leave it. ``starts`` (B, T) bool:
        where documents began in the step (the reach moves as :func:`~txl.model.memory.next_reach`)."""
        if starts is not None or self.reach is not None:
            before = self.full_reach()
        self.end += t
        self.projected = self.end
        self.start = max(self.start, self.end - self.span.mem_len)
        if starts is not None or self.reach is not None:
            self.reach = next_reach(before, starts, t=t, length=self.length)


def _rows(rows: Tensor | Sequence[int] | slice, device: torch.device) -> Tensor | slice:
    """Batch rows as an index: a slice or tensor as given, a sequence of ints as an int64 tensor."""
    if isinstance(rows, (slice, Tensor)):
        return rows
    return torch.as_tensor(list(rows), dtype=torch.long, device=device)
