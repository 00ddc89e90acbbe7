"""The key/value cache of incremental decoding. For every layer it keeps the keys and values of the remembered
positions (projections of fixed hidden states: computed once, when the position was new), the hidden states
themselves (the memory as data, returned by :meth:`KVCache.memory`), the projected distance table ``W_R R``
of the distances in use (computed once per cache, i.e. once per memory length and clamp_len), and the
weights laid out for a few rows at a time (transposed copies, which such products read fastest on the CPU).
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
from .positional import relative_distances, sinusoid

if TYPE_CHECKING:
    from .layers import LayerStep
    from .transformer import TransformerXL

__all__ = ["KVCache", "LayerCache"]


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

    def __init__(self, config: TransformerXLConfig, *, batch_size: int | None = None, span: Span | None = None,
                 memory: Memory | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        span = config.span if span is None else span
        if config.attention != "relative" or span.mem_len == 0:
            raise ValueError("a key/value cache needs a Transformer-XL with memory (relative attention, mem_len > 0)")
        if memory is not None:
            if not isinstance(memory, Memory):
                raise ValueError(f"memory must be a txl Memory, got {type(memory).__name__}")
            if batch_size is not None and batch_size != memory.batch_size:
                raise ValueError(f"memory has {memory.batch_size} batch rows, batch_size is {batch_size}")
            if len(memory) != config.n_layer or memory.states[0].shape[-1] != config.d_model:
                raise ValueError(f"memory has {len(memory)} states of size {memory.states[0].shape[-1]}, the model "
                                 f"needs {config.n_layer} of size {config.d_model}")
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
        """Per layer, what decoding one position needs (set by :meth:`bind`): the projected distances R-1..0
        (clamped) of the longest key window, copied per batch row, (B*H, Dh, R); the biases; the weights laid
        out for one row at a time (see :class:`~txl.model.layers.LayerStep`)."""
        self.step_contexts: tuple[int, list[LayerStep]] | None = None
        """:attr:`prepared` with the distances sliced to the current key count K (kept while K stays)."""
        self.output_t: tuple[Tensor, Tensor, Tensor | None] | None = None
        """For a plain (not adaptive) softmax on the CPU: its weight transposed to (E, V) and contiguous, with its
        bias and projection. One row of logits reads the weight about 1.8 times as fast in this layout (measured:
        86 vs 157 us for 10k x 128 on 2 threads), and the output layer is a large share of a small model's token.
        A copy of V·E numbers, made when the cache is bound (about a millisecond here) and freed with it."""
        self.model: nn.Module | None = None
        """The model this cache serves (set on first use)."""
        self.layers = tuple(LayerCache(self, i) for i in range(n))

    def bind(self, model: TransformerXL) -> None:
        """Fill in what depends on the weights: the distance table and the keys and values of the memory the
        cache was built with. Called by the model the first time it gets this cache."""
        if self.model is model:
            return
        if self.model is not None:
            raise ValueError("this key/value cache belongs to another model: build one per model")
        if model.config.attention != "relative":
            raise ValueError("a key/value cache needs a Transformer-XL with relative attention")
        sizes = ("n_layer", "n_head", "d_head", "d_model")
        if any(getattr(model.config, f) != getattr(self.config, f) for f in sizes):
            raise ValueError(f"this key/value cache was built for other sizes ({', '.join(sizes)}) than the model's")
        param = next(model.parameters())
        if param.dtype != self.hidden.dtype or param.device != self.hidden.device:
            raise ValueError(f"the cache holds {self.hidden.dtype} on {self.hidden.device}, the model's weights are "
                             f"{param.dtype} on {param.device}")
        with torch.no_grad():
            distances = relative_distances(self.reach + 1, clamp_len=self.span.clamp_len, device=param.device)  # (R,)
            pos = sinusoid(distances, self.config.d_model, dtype=param.dtype)  # (R, D)
            self.prepared = [layer.prepare_step(pos, u=u, v=v, batch_size=self.batch_size)
                             for layer, (u, v) in zip(model.layers, model._biases(), strict=True)]
            for index, layer in enumerate(model.layers):
                state = self.hidden[index, :, self.start:self.end]  # (B, M, D)
                _, k, v = layer.attn.project(layer.attention_input(state), None)  # (B, H, M, Dh) each
                self.kv[index, 0, :, :, self.start:self.end] = k
                self.kv[index, 1, :, :, self.start:self.end] = v
            if model.softmax.n_clusters == 0 and param.device.type == "cpu":
                weight, bias, proj = model.softmax._cluster_params(0)  # (V, E), (V,), (D, E) or None
                self.output_t = (weight.t().contiguous(), bias, proj)  # (E, V) contiguous
        self.model = model

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
        return Memory(tuple(self.hidden[i, :, self.start:self.end].clone() for i in range(len(self.layers))))

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
            hidden[:, :, :m] = self.hidden[:, :, self.start:self.end]
            kv[:, :, :, :, :m] = self.kv[:, :, :, :, self.start:self.end]
            self.hidden, self.kv = hidden, kv
            self.layers = tuple(LayerCache(self, i) for i in range(len(self.layers)))
        else:  # slide back to the front (source and target may overlap: copy through a clone)
            self.hidden[:, :, :m] = self.hidden[:, :, self.start:self.end].clone()
            self.kv[:, :, :, :, :m] = self.kv[:, :, :, :, self.start:self.end].clone()
        self.start, self.end = 0, m

    def store_inputs(self, inputs: list[Tensor]) -> None:
        """Write every layer's input (B, D) for one new position at once (what the memory keeps)."""
        torch.stack(inputs, out=self.hidden.select(2, self.end))  # (N, B, D) into (N, B, C, D)

    def advance(self, t: int) -> None:
        """After a step of T positions: they join the memory, and the oldest beyond ``mem_len`` leave it."""
        self.end += t
        self.start = max(self.start, self.end - self.span.mem_len)
