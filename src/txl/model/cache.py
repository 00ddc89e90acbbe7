"""The key/value cache of incremental decoding. For every layer it keeps the keys and values of the remembered
positions (projections of fixed hidden states: computed once, when the position was new), the hidden states
themselves (the memory as data, returned by :meth:`KVCache.memory`), the projected distance table ``W_R R``
of the distances in use, and the weights laid out for a few rows at a time (transposed copies, which such
products read fastest on the CPU); the last two are made once per model and settings
(:meth:`TransformerXL.decoding_tables`).
The attention maths stays in ``attention.py`` and the model drives the cache (``TransformerXL.forward(...,
cache=...)``); this module only stores and slides.

Dimensions: N layers, B batch, T new positions, M memory length, C buffer capacity, H heads, Dh head size,
D model size, R = (longest memory) + 1 distances in the table.

Sliding: each buffer holds C >= M + T slots, the remembered positions in ``[start, end)`` in order. A step
writes the T new positions at ``end`` (no copy of the memory), then drops the oldest by moving ``start``, so
that at most ``mem_len`` remain: exactly ``update_memory``'s concatenate-and-truncate. When a step would run
past the end of the buffer, the remembered slots move back to the front, once every ``mem_len / 4`` steps or
so (the copy is amortised to about four positions per step; the buffers hold 1.25 ``mem_len``).

    cache = KVCache(model.config, batch_size=2, span=Span(mem_len=256), memory=None)
    out = model(prompt, cache=cache, last_only=True)     # out.logits (B, 1, V); keys/values appended
    out = model(next_token[:, None], cache=cache, last_only=True)
    cache.memory()                                       # == the memory the segment-wise model would carry
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..config import Span, TransformerXLConfig
from .memory import Memory

if TYPE_CHECKING:
    from .layers import LayerStep
    from .transformer import TransformerXL

__all__ = ["KVCache", "LayerCache", "DecodingTables", "OutputLayout"]


class OutputLayout:
    """A plain softmax's output weight laid out for a few rows of logits at a time on the CPU.

    The (V, E) weight is transposed and cut into S column blocks, (S, E, W) contiguous with W = ceil(V / S)
    (the last block padded with zero columns, sliced off again), so that one batched matmul computes the
    logits and spreads the S blocks over the intra-op threads: a single row times a (E, V) weight runs on
    one thread otherwise. Measured on 2 cores (10k x 128): 157 us with the weight as stored, 86 us
    transposed, 55-60 us transposed in 2 blocks (identical results). The layout is a copy of the V·E
    weight, kept as long as the model's :meth:`~txl.model.TransformerXL.decoding_tables` memo."""

    __slots__ = ("weight", "bias", "proj", "vocab_size")

    def __init__(self, weight: Tensor, bias: Tensor, proj: Tensor | None, *, blocks: int) -> None:
        v, e = weight.shape
        width = -(-v // blocks)
        pad = width * blocks - v
        with torch.no_grad():
            if pad:
                weight = torch.cat([weight, weight.new_zeros(pad, e)])  # (S*W, E)
                bias = torch.cat([bias, bias.new_zeros(pad)])  # (S*W,)
            self.weight = weight.view(blocks, width, e).transpose(1, 2).contiguous()  # (S, E, W)
            self.bias = bias.view(blocks, 1, width).clone()  # (S, 1, W)
        self.proj = proj
        self.vocab_size = v

    def scores(self, hidden: Tensor) -> Tensor:
        """Rows of final hidden states (N, D) -> scores before the softmax (N, V)."""
        x = hidden if self.proj is None else hidden @ self.proj  # (N, E)
        s, e, width = self.weight.shape
        n = x.shape[0]
        if s == 1:
            out = torch.addmm(self.bias[0], x, self.weight[0])  # (N, W)
        else:
            out = torch.baddbmm(self.bias, x.expand(s, n, e), self.weight)  # (S, N, W)
            out = out.view(n, s * width) if n == 1 else out.transpose(0, 1).reshape(n, s * width)  # (N, S*W)
        return out if out.shape[1] == self.vocab_size else out[:, : self.vocab_size]


class DecodingTables:
    """What decoding one position per row needs beyond the cache's keys and values, derived from the weights
    by :meth:`~txl.model.TransformerXL.decoding_tables`: a :class:`~txl.model.layers.LayerStep` per layer
    (distance table for R distances, biases, transposed weights) and the output layout."""

    __slots__ = ("key", "steps", "output")

    def __init__(self, key: tuple, steps: tuple[LayerStep, ...], output: OutputLayout | None) -> None:
        self.key = key
        self.steps = steps
        self.output = output


class LayerCache:
    """One layer's part of a :class:`KVCache`, handed to its attention module."""

    __slots__ = ("_owner", "kv", "keys_t", "values", "hidden")

    def __init__(self, owner: KVCache, index: int) -> None:
        self._owner = owner
        self.kv = owner.kv[index]  # (2, B, H, C, Dh): keys, values
        b, h, c, dh = self.kv.shape[1:]
        self.keys_t = self.kv[0].view(b * h, c, dh).transpose(1, 2)  # (B*H, Dh, C), the same storage
        self.values = self.kv[1].view(b * h, c, dh)  # (B*H, C, Dh)
        self.hidden = owner.hidden[index]  # (B, C, D)

    def store_input(self, h: Tensor) -> None:
        """Write the layer's input on the new positions, (B, T, D) or (B, D) for one: what the memory keeps."""
        end = self._owner.end
        if h.dim() == 2:
            self.hidden.select(1, end).copy_(h)
        else:
            self.hidden.narrow(1, end, h.shape[1]).copy_(h)

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Write the keys and values (B, H, T, Dh) of the T new positions after the memory and return the
        keys and values in view of this step's queries, (B, H, K, Dh) each: [memory ; new]."""
        owner = self._owner
        end, t = owner.end, k.shape[2]
        self.kv[0].narrow(2, end, t).copy_(k)
        self.kv[1].narrow(2, end, t).copy_(v)
        window = self.kv.narrow(3, owner.view_start, end + t - owner.view_start)  # (2, B, H, K, Dh)
        return window[0], window[1]

    def append_one(self, kv: Tensor) -> tuple[Tensor, Tensor]:
        """One new position: write its keys and values ``kv`` (2, B, H, Dh) and return the keys in view,
        transposed, (B*H, Dh, K), and the values, (B*H, K, Dh), flattened for batched matmuls (views of the
        buffer; ``same_length`` may leave the oldest key out)."""
        owner = self._owner
        end, first = owner.end, owner.view_start
        self.kv.select(3, end).copy_(kv)
        return self.keys_t.narrow(2, first, end + 1 - first), self.values.narrow(1, first, end + 1 - first)


class KVCache:
    """Per-layer keys, values and hidden states of the last ``span.mem_len`` positions, for a model fed a few
    positions at a time (generation). Build it empty or from a :class:`Memory` and pass it to
    ``model(tokens, cache=cache)``: each call appends its positions and slides the window; the result equals
    ``model(tokens, memory=cache.memory(), span=cache.span)`` without projecting the memory again.

    The cache is sized from the config alone; the first model it is passed to fills in what depends on the
    weights (the memory's keys and values, the distance table) and it serves only that model afterwards.
    A cache is mutable state of one decoding session: it belongs to the caller, never to the model, and is
    valid only while the weights stay as they were."""

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
        if config.attention != "relative" or span.mem_len == 0:
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
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer (or give a memory), got {batch_size!r}")
        dtype = torch.get_default_dtype() if dtype is None else dtype
        m0 = 0 if memory is None else memory.length
        self.config = config
        self.span = span
        self.batch_size = batch_size
        self.reach = max(span.mem_len, m0)
        """The most positions ever remembered at once (``mem_len``, or a longer memory given at the start)."""
        self._slack = max(span.mem_len // 4, 16)  # room to slide before moving back
        n, b, h, dh, d = config.n_layer, batch_size, config.n_head, config.d_head, config.d_model
        capacity = self.reach + self._slack
        self.hidden = torch.zeros(n, b, capacity, d, dtype=dtype, device=device)  # (N, B, C, D)
        self.kv = torch.zeros(n, 2, b, h, capacity, dh, dtype=dtype, device=device)  # (N, 2, B, H, C, Dh)
        if memory is not None:
            for index, state in enumerate(memory.states):
                self.hidden[index, :, :m0] = state
        self.start = 0
        """First remembered slot."""
        self.end = m0
        """One past the last remembered slot (where the next positions are written)."""
        self.view_start = 0
        """First slot the current step's queries see (set by the model for each step)."""
        self.prepared: list[LayerStep] = []
        """Per layer, what decoding one position needs (from :meth:`TransformerXL.decoding_tables`, set by
        :meth:`bind`): the projected distances R-1..0 (clamped) of the longest key window, copied per batch row,
        (B*H, Dh, R); the biases; the weights laid out for one row at a time (see
        :class:`~txl.model.layers.LayerStep`)."""
        self.step_contexts: tuple[int, list[LayerStep]] | None = None
        """:attr:`prepared` with the distances sliced to the current key count K (kept while K stays)."""
        self.output: OutputLayout | None = None
        """The plain (not adaptive) softmax's weight laid out for a few rows at a time on the CPU (see
        :class:`OutputLayout`), or None (adaptive softmax, or not on the CPU)."""
        self.model: nn.Module | None = None
        """The model this cache serves (set on first use)."""
        self.layers = tuple(LayerCache(self, i) for i in range(n))

    def bind(self, model: TransformerXL) -> None:
        """Fill in what depends on the weights: the keys and values of the memory the cache was built with
        (the decoding tables follow when first needed: :meth:`prepare_tables`). Called by the model the first
        time it gets this cache."""
        if self.model is model:
            return
        if self.model is not None:
            raise ValueError("this key/value cache belongs to another model: build one per model")
        if model.config.attention != "relative":
            raise ValueError("a key/value cache needs a Transformer-XL with relative attention")
        sizes = ("n_layer", "n_head", "d_head", "d_model")
        if any(getattr(model.config, f) != getattr(self.config, f) for f in sizes):
            raise ValueError(
                f"this key/value cache was built for other sizes ({', '.join(sizes)}) than the model's"
            )
        param = next(model.parameters())
        if param.dtype != self.hidden.dtype or param.device != self.hidden.device:
            raise ValueError(
                f"the cache holds {self.hidden.dtype} on {self.hidden.device}, the model's weights are "
                f"{param.dtype} on {param.device}"
            )
        with torch.no_grad():
            for index, layer in enumerate(model.layers):
                state = self.hidden[index, :, self.start : self.end]  # (B, M, D)
                _, k, v = layer.attn.project(layer.attention_input(state), None)  # (B, H, M, Dh) each
                self.kv[index, 0, :, :, self.start : self.end] = k
                self.kv[index, 1, :, :, self.start : self.end] = v
        self.model = model

    def prepare_tables(self) -> None:
        """Fetch the bound model's decoding tables (:meth:`TransformerXL.decoding_tables`) the first time the
        one-position path or the output layout is needed: a cache that only evaluates segments needs neither."""
        if self.prepared or self.output is not None or self.model is None:
            return
        tables = self.model.decoding_tables(
            reach=self.reach, clamp_len=self.span.clamp_len, batch_size=self.batch_size
        )
        self.prepared, self.output = list(tables.steps), tables.output

    @property
    def length(self) -> int:
        """M, the number of remembered positions."""
        return self.end - self.start

    @property
    def capacity(self) -> int:
        """C, the slots of each buffer."""
        return self.hidden.shape[2]

    def memory(self) -> Memory | None:
        """The remembered hidden states as a :class:`Memory` (copies; None when nothing is remembered yet)."""
        if self.end == self.start:
            return None
        return Memory(
            tuple(self.hidden[i, :, self.start : self.end].clone() for i in range(len(self.layers)))
        )

    def make_room(self, t: int) -> None:
        """Ensure T more positions fit after the memory: move the remembered slots to the front when the
        buffers would overflow, or grow them for a segment longer than the slack."""
        if self.end + t <= self.capacity:
            return
        m = self.length
        if m + t > self.capacity:  # a long segment: grow (rare; generation appends one position at a time)
            capacity = m + t + self._slack
            hidden = self.hidden.new_zeros(*self.hidden.shape[:2], capacity, self.hidden.shape[3])
            kv = self.kv.new_zeros(*self.kv.shape[:4], capacity, self.kv.shape[5])
            hidden[:, :, :m] = self.hidden[:, :, self.start : self.end]
            kv[:, :, :, :, :m] = self.kv[:, :, :, :, self.start : self.end]
            self.hidden, self.kv = hidden, kv
            self.layers = tuple(LayerCache(self, i) for i in range(len(self.layers)))
        else:  # slide back to the front (source and target may overlap: copy through a clone)
            self.hidden[:, :, :m] = self.hidden[:, :, self.start : self.end].clone()
            self.kv[:, :, :, :, :m] = self.kv[:, :, :, :, self.start : self.end].clone()
        self.start, self.end = 0, m

    def store_inputs(self, inputs: list[Tensor]) -> None:
        """Write every layer's input (B, D) for one new position at once (what the memory keeps)."""
        torch.stack(inputs, out=self.hidden.select(2, self.end))  # (N, B, D) into (N, B, C, D)

    def advance(self, t: int) -> None:
        """After a step of T positions: they join the memory, and the oldest beyond ``mem_len`` leave it."""
        self.end += t
        self.start = max(self.start, self.end - self.span.mem_len)
