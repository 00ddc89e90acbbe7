"""Transformer-XL's layer stack (:class:`LayerStack`: the decoder layers with their memory, reach and document
starts; no embedding) and the language model (or its vanilla baseline): embedding -> LayerStack -> adaptive
softmax, the segment-level recurrence carried explicitly as :class:`Memory` (or in a :class:`KVCache`)."""

# The language model is an embedding, a LayerStack and an output layer: ``model.layers`` is the stack, which
# the agents' memory core (``txl.rl.MemoryCore``) also runs over projected observations. One-position
# decoding, which needs tables of its own, lives in ``decode.py``.
#
# Dimensions (the legend of ``model/``): B batch, T segment length, M memory length, K = M + T keys, D model
# size, V vocabulary, L layers, H heads, Dh head size.
#
#     out = model(tokens, memory=memory, targets=targets)   # tokens, targets (B, T) int64
#     out.loss      # (B, T) per-token negative log-likelihood in nats
#     out.memory    # pass to the next segment
#     out = model(tokens, memory=memory, span=Span(mem_len=640, same_length=True))  # evaluation lengths
#     out.log_probs # (B, T, V) log-probabilities of the next token (no targets given)
#     cache = KVCache(model.config, batch_size=B)            # keys and values of the memory projected once
#     out = model(tokens, cache=cache, last_only=True)       # out.log_probs (B, 1, V); the cache slides
#     out = model(tokens, memory=memory, starts=starts)      # starts (B, T) bool: documents begin there
#
# Documents: with ``starts``, a token that begins a document, and every later token of its row, attends to
# nothing before it (neither earlier positions of the segment nor the memory); the memory carries each row's
# reach (:class:`Memory`), so that the boundary holds in the next segments too. The model computes everything
# as without starts and only masks more keys (:func:`document_mask`), so a document read after others gets
# exactly the losses it has read alone (to rounding) as long as the memory holds the whole document.

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import overload

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import Span, StackConfig, TransformerXLConfig
from .adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from .attention import AbsoluteContext, RelativeContext
from .cache import CACHE_SIZES, KVCache, LayerCache
from .layers import DecoderLayer
from .memory import Memory, full_reach, update_memory
from .positional import relative_distances, sinusoid

__all__ = [
    "LayerStack",
    "LayerFactory",
    "TransformerXL",
    "ModelOutput",
    "attention_mask",
    "document_mask",
    "config_of",
    "eval_mode",
]


@dataclass
class ModelOutput:
    """What :meth:`TransformerXL.forward` returns; fields not asked for are None."""

    log_probs: Tensor | None
    """(B, T, V) log-probabilities of the next token, normalised by the full or adaptive softmax
    (``log_probs.exp().sum(-1) == 1``); (B, 1, V) for the last position only with ``last_only=True``. None
    when targets are given (then ``loss`` has what they need)."""
    loss: Tensor | None
    """(B, T) negative log-likelihood of each target in nats."""
    memory: Memory | None
    """Memory for the next segment: the input of each layer on the last ``span.mem_len`` positions (None for
    the vanilla baseline or mem_len = 0, and with a ``cache``, which holds it: ``cache.memory()``)."""


def config_of(model: nn.Module) -> TransformerXLConfig:
    """The :class:`TransformerXLConfig` of a :class:`TransformerXL`, or of a module that wraps one and carries
    its ``config`` (a compiled model, a spy in a test)."""
    config = getattr(model, "config", None)
    if not isinstance(config, TransformerXLConfig):
        raise ValueError(
            f"the model must be a txl TransformerXL (or carry its config), got {type(model).__name__}"
        )
    return config


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in evaluation mode inside the block; every module's own training flag restored after (also
    when the block raises): the one way to switch a model to evaluation for a while."""
    flags = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield model
    finally:
        for module, flag in flags.items():
            module.training = flag


def attention_mask(
    t: int, m: int, *, same_length: bool, mem_len: int, device: torch.device | None = None
) -> Tensor:
    """(T, K) bool, True where query i may NOT attend key j. Query i sits at key position M + i and sees
    memory and current positions <= M + i. With ``same_length`` every query sees the same number of keys
    (at most ``mem_len`` behind the first query, as the authors' code)."""
    k = m + t
    ones = torch.ones(t, k, dtype=torch.bool, device=device)
    mask = torch.triu(ones, diagonal=1 + m)  # the future
    if same_length:
        excess = k - mem_len
        shift = t - excess if excess > 0 else t
        mask = mask | torch.tril(ones, diagonal=-shift)  # too far in the past
    return mask


def document_mask(starts: Tensor | None, reach: Tensor, *, t: int, m: int) -> Tensor:
    """(B, T, K) bool, True where query i of row b may NOT attend key j because j lies before the start of
    i's document: the last start at or before i in the segment (``starts`` (B, T) bool, or None for none), or
    for a query after no start, the first of the ``reach[b]`` last remembered positions (``reach`` (B,)
    int64, at most M). Combine it with :func:`attention_mask` (the future, same_length)."""
    positions = torch.arange(t, device=reach.device)  # (T,)
    before = (m - reach)[:, None]  # (B, 1): the first key of the memory's own document
    if starts is None:
        first = before.expand(-1, t)  # (B, T)
    else:
        begun = torch.where(starts, positions, -1).cummax(dim=1).values  # (B, T): last start <= i, or -1
        first = torch.where(begun >= 0, m + begun, before)  # (B, T): the first key query i may see
    keys = torch.arange(m + t, device=reach.device)  # (K,)
    return keys < first[:, :, None]  # (B, T, K)


LayerFactory = Callable[[StackConfig], nn.Module]
"""What builds one layer of a :class:`LayerStack` from its settings: :class:`~txl.model.layers.DecoderLayer`,
or a variant of it (a class whose ``forward`` takes what ``DecoderLayer.forward`` takes)."""


class LayerStack(nn.ModuleList):
    """Transformer-XL's layer loop, without a token embedding or an output layer: ``n_layer`` decoder layers
    over hidden states, each layer reading its own memory, with the rows' reach and document starts.

    Dimensions: B rows, T new positions, M remembered positions, K = M + T keys, D model size, L layers,
    H heads, Dh head size.

        stack = LayerStack(StackConfig(n_layer=2, n_head=2, d_head=16, d_model=32))
        u, v = torch.zeros(2, 16), torch.zeros(2, 16)  # (H, Dh) each: the global biases, kept by the owner
        x = torch.randn(3, 5, 32)                      # (B, T, D): embeddings, projected observations...
        h, memory = stack(x, span=Span(mem_len=8), biases=[(u, v)] * 2)                 # h (B, T, D)
        h, memory = stack(x, memory=memory, span=Span(mem_len=8), biases=[(u, v)] * 2)  # the next segment

    It is the list of its layers (``stack[i]``; in its owner's state dict ``layers.{i}.*``). Per call it builds
    what they share: the relative positions (sinusoids of the K distances), the mask (the future, same-length
    attention, the keys before each row's document) and each layer's :class:`~txl.model.attention.RelativeContext`
    with the global content and position biases u, v that its owner keeps and passes (``biases``). While
    training it drops out its input and the positions (``config.dropout``), the positions first.

    :class:`TransformerXL` runs its embeddings through one (``model.layers``) and applies its final norm and
    output layer after it; the agents' memory core (``txl.rl.MemoryCore``) runs its projected observations
    through one. Variants are chosen when a stack is built: the layers by ``layer`` (a class or factory called
    with the config: GTrXL's gated layer in ``txl.rl``), the attention by ``config.attention``; a subclass may
    override :meth:`causal_mask` (which keys are out of view whatever the documents) and :meth:`run_layer`
    (one layer's call).
    """

    def __init__(self, config: StackConfig, *, layer: LayerFactory = DecoderLayer) -> None:
        if not isinstance(config, StackConfig):
            raise TypeError(f"config must be a StackConfig, got {type(config).__name__}")
        super().__init__([layer(config) for _ in range(config.n_layer)])
        self.config = config

    @overload
    def __getitem__(self, idx: slice) -> nn.ModuleList: ...
    @overload
    def __getitem__(self, idx: int) -> nn.Module: ...
    def __getitem__(self, idx: int | slice) -> nn.Module | nn.ModuleList:
        """Layer ``idx``; a slice gives those layers as a plain ``nn.ModuleList`` (not a stack)."""
        if isinstance(idx, slice):
            return nn.ModuleList(list(self._modules.values())[idx])
        return super().__getitem__(idx)

    def forward(
        self,
        h: Tensor,
        *,
        memory: Memory | KVCache | None = None,
        span: Span,
        starts: Tensor | None = None,
        biases: Sequence[tuple[Tensor, Tensor]] | None = None,
    ) -> tuple[Tensor, Memory | None]:
        """h (B, T, D): the first layer's input before dropout (embeddings, projected observations) -> the
        last layer's output (B, T, D) and the memory for the next segment.

        ``memory``: what the layers remember: None (nothing), a :class:`Memory` (the input of each layer on
        the last M positions, with the rows' reach; the returned memory keeps the last ``span.mem_len``
        positions of [memory ; this segment], detached, or is None for ``mem_len`` 0) or a :class:`KVCache`
        (every layer reads the remembered keys and values from it and appends this segment's; the window
        slides and the returned memory is None). ``span``: the lengths to run with (a cache's own with a
        cache). ``starts``: (B, T) bool, True where a document begins (it and every later position of its row
        attend to nothing before it). ``biases``: one (u, v) pair per layer, (H, Dh) each, for relative
        attention (None for absolute)."""
        self._check(h, memory, span, starts, biases)
        t = h.shape[1]
        contexts = self._contexts(h, memory, span, starts, biases)
        h = F.dropout(h, self.config.dropout, self.training)
        cache = memory if isinstance(memory, KVCache) else None
        states = memory if isinstance(memory, Memory) else None
        if cache is not None:
            cache.make_room(t)
        inputs = []  # the input of every layer: what the next segment remembers
        for index, layer in enumerate(self):
            inputs.append(h)
            layer_cache = None if cache is None else cache.layers[index]
            if layer_cache is not None:
                layer_memory = layer_cache.unprojected()  # (B, P, D) or None: keys and values not cached yet
            else:
                layer_memory = None if states is None else states.states[index]  # (B, M, D)
            h = self.run_layer(layer, h, memory=layer_memory, context=contexts[index], cache=layer_cache)
        if cache is not None:
            cache.store_inputs(inputs)
            cache.advance(t, starts=starts)
            return h, None
        return h, update_memory(states, inputs, mem_len=span.mem_len, starts=starts)

    def causal_mask(self, t: int, m: int, *, span: Span, device: torch.device) -> Tensor:
        """(T, K) bool, True where query i may not attend key j whatever the documents: the future and, with
        same-length attention, the keys too far back (:func:`attention_mask` of ``span``)."""
        return attention_mask(t, m, same_length=span.same_length, mem_len=span.mem_len, device=device)

    def run_layer(
        self,
        layer: nn.Module,
        h: Tensor,
        *,
        memory: Tensor | None,
        context: RelativeContext | AbsoluteContext | None,
        cache: LayerCache | None,
    ) -> Tensor:
        """One layer over h (B, T, D) with its memory (B, M, D) (or its part of a cache) -> (B, T, D)."""
        return layer(h, memory=memory, context=context, cache=cache)

    def _contexts(
        self,
        h: Tensor,
        memory: Memory | KVCache | None,
        span: Span,
        starts: Tensor | None,
        biases: Sequence[tuple[Tensor, Tensor]] | None,
    ) -> Sequence[RelativeContext | AbsoluteContext | None]:
        """What every layer's attention needs besides its hidden states: per-layer positions, mask and
        biases (relative), or the documents' mask (absolute with starts; None without)."""
        b, t = h.shape[:2]
        if self.config.attention != "relative":
            if starts is None:
                return [None] * len(self)  # causal attention, no mask to build
            causal = attention_mask(t, 0, same_length=False, mem_len=0, device=h.device)  # (T, T)
            alone = torch.zeros(b, dtype=torch.int64, device=h.device)  # no memory: reach 0
            blocked = causal | document_mask(starts, alone, t=t, m=0)  # (B, T, T)
            return [AbsoluteContext(mask=blocked[:, None])] * len(self)  # mask (B, 1, T, T)
        assert biases is not None  # checked
        m, reach = (0, None) if memory is None else (memory.length, memory.reach)
        documents: Tensor | None = None
        if starts is not None or reach is not None:  # else no mask per row: the plain path
            reach_all = full_reach(reach, batch_size=b, length=m, device=h.device)  # (B,)
            documents = document_mask(starts, reach_all, t=t, m=m)  # (B, T, K)
        distances = relative_distances(m + t, clamp_len=span.clamp_len, device=h.device)  # (K,)
        pos = sinusoid(distances, self.config.d_model, dtype=h.dtype)  # (K, D)
        pos = F.dropout(pos, self.config.dropout, self.training)
        mask = self.causal_mask(t, m, span=span, device=h.device)  # (T, K)
        if documents is not None:
            mask = (mask | documents)[:, None]  # (B, 1, T, K): one mask per row, shared by the heads
        return [RelativeContext(pos, mask, u, v) for u, v in biases]

    def _check(
        self,
        h: Tensor,
        memory: Memory | KVCache | None,
        span: Span,
        starts: Tensor | None,
        biases: Sequence[tuple[Tensor, Tensor]] | None,
    ) -> None:
        """Refuse a call that cannot run, with a one-line error naming the argument."""
        cfg = self.config
        if h.dim() != 3 or h.shape[-1] != cfg.d_model:
            raise ValueError(f"the stack's input must be (batch, time, {cfg.d_model}), got {tuple(h.shape)}")
        if starts is not None:
            _check_starts(starts, tuple(h.shape[:2]), h.device)
        if cfg.attention != "relative":
            if memory is not None:
                raise ValueError(
                    "the vanilla baseline (attention='absolute') has no memory: pass memory=None"
                )
            if span.mem_len > 0:
                raise ValueError(
                    "the vanilla baseline (attention='absolute') has no memory: its span has mem_len 0"
                )
            return
        if biases is None or len(biases) != cfg.n_layer:
            got = "none" if biases is None else len(biases)
            raise ValueError(
                f"biases: relative attention needs one (u, v) pair per layer ({cfg.n_layer}), got {got}"
            )
        if isinstance(memory, Memory):
            if len(memory) != cfg.n_layer:
                raise ValueError(
                    f"memory has {len(memory)} states, the stack needs one per layer ({cfg.n_layer})"
                )
            if memory.batch_size != h.shape[0] or memory.states[0].shape[-1] != cfg.d_model:
                raise ValueError(
                    f"memory states are {tuple(memory.states[0].shape)}, expected "
                    f"({h.shape[0]}, M, {cfg.d_model})"
                )


class TransformerXL(nn.Module):
    """Transformer-XL language model (Dai et al., 2019), or the vanilla baseline with ``attention="absolute"``."""

    def __init__(self, config: TransformerXLConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = AdaptiveEmbedding(config)
        self.drop = nn.Dropout(config.dropout)  # the final hidden state's (the stack drops its own)
        self.layers = LayerStack(config.stack)  # state-dict names layers.{i}.*
        self.norm = nn.LayerNorm(config.d_model) if config.final_norm else None
        self.softmax = AdaptiveLogSoftmax(config)
        if config.attention == "relative":
            shape = (
                (config.n_head, config.d_head)
                if config.share_rel_bias
                else (config.n_layer, config.n_head, config.d_head)
            )
            self.u = nn.Parameter(torch.empty(shape))  # global content bias
            self.v = nn.Parameter(torch.empty(shape))  # global position bias
        else:
            self.register_parameter("u", None)
            self.register_parameter("v", None)
        self.reset_parameters()
        self.softmax.tie_to(self.embedding, weights=config.tie_weights, projections=config.tie_projs)

    # -- construction ---------------------------------------------------------------------------------

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Initialise as the authors' training script: weights and embeddings N(0, init_std), projections
        N(0, proj_init_std), LayerNorm weights N(1, init_std), biases 0, u and v N(0, init_std)."""
        std, proj_std = self.config.init_std, self.config.proj_init_std
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, 0.0, std)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                nn.init.normal_(module.weight, 0.0, std)
            elif isinstance(module, nn.LayerNorm):
                nn.init.normal_(module.weight, 1.0, std)
                nn.init.zeros_(module.bias)
        self.embedding.reset_projections(proj_std)
        self.softmax.reset_adaptive(std=std, proj_std=proj_std)
        if self.u is not None:
            nn.init.normal_(self.u, 0.0, std)
            nn.init.normal_(self.v, 0.0, std)

    def num_parameters(self) -> int:
        """Number of distinct parameters (tied weights counted once)."""
        return sum(p.numel() for p in self.parameters())

    # -- forward --------------------------------------------------------------------------------------

    def _check_inputs(self, tokens: Tensor, targets: Tensor | None) -> None:
        """tokens (B, T) and targets of their shape (the memory is the stack's to check)."""
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, time), got shape {tuple(tokens.shape)}")
        if targets is not None and targets.shape != tokens.shape:
            raise ValueError(
                f"targets shape {tuple(targets.shape)} differs from tokens shape {tuple(tokens.shape)}"
            )

    def _absolute_positions(self, h: Tensor, starts: Tensor | None) -> Tensor:
        """The vanilla baseline's input: embeddings h (B, T, D) plus sinusoids of absolute positions, counted
        from the segment's start, or with ``starts`` from each document's (from the segment's for a document
        begun before it)."""
        b, t, d = h.shape
        positions = torch.arange(t, device=h.device)  # (T,)
        if starts is None:
            return h + sinusoid(positions, d, dtype=h.dtype)
        begun = torch.where(starts, positions, -1).cummax(dim=1).values  # (B, T): last start <= i, or -1
        within = positions - begun.clamp(min=0)  # (B, T): position in the document
        return h + sinusoid(within.reshape(-1), d, dtype=h.dtype).view(b, t, d)

    def _biases(self) -> list[tuple[Tensor, Tensor]]:
        """(u, v) of every layer, (H, Dh) each."""
        if self.config.share_rel_bias:
            return [(self.u, self.v)] * self.config.n_layer
        return [(self.u[index], self.v[index]) for index in range(self.config.n_layer)]

    def forward(
        self,
        tokens: Tensor,
        *,
        memory: Memory | None = None,
        targets: Tensor | None = None,
        span: Span | None = None,
        cache: KVCache | None = None,
        last_only: bool = False,
        starts: Tensor | None = None,
    ) -> ModelOutput:
        """tokens (B, T) int64; memory from the previous segment or None (empty); targets (B, T) int64 token ids
        in [0, V) (any other value is an error); ``span``: the memory length, clamp and same-length setting to
        run with (default: the config's).

        Returns per-token losses (B, T) when targets are given, log-probabilities (B, T, V) when they are not,
        and the memory for the next segment. ``last_only``: log-probabilities of the last position only,
        (B, 1, V) (what generation needs; no (B, T, V) tensor is built).

        ``cache``: a :class:`KVCache` holding the memory (pass no ``memory``; ``span`` is the cache's). The
        keys and values of remembered positions come from it, this segment's are appended and the window
        slides; ``out.memory`` is then None (``cache.memory()`` has it). Equal to the call without a cache, but
        computes no gradients.

        ``starts``: (B, T) bool, True where a token begins a new document: it and every later token of its
        row attend to nothing before it (neither earlier positions nor the memory). ``out.memory.reach`` (or
        the cache's) then carries the boundary into the next segments. None: one stream per row, as before."""
        if last_only and targets is not None:
            raise ValueError("last_only gives log-probabilities of the last position: it takes no targets")
        if cache is None:
            self._check_inputs(tokens, targets)
        else:
            self._check_cache(tokens, cache, (memory, span, targets))
        # the cache keeps values, not a graph
        with torch.no_grad() if cache is not None else contextlib.nullcontext():
            h, new_memory = self.hidden_states(tokens, memory=memory, span=span, cache=cache, starts=starts)
            b, t = tokens.shape
            if targets is not None:
                flat = h.reshape(b * t, -1)  # (B*T, D)
                loss = self.softmax.nll(flat, targets.reshape(-1)).view(b, t)  # (B, T)
                return ModelOutput(log_probs=None, loss=loss, memory=new_memory)
            last = h[:, -1:] if last_only else h  # (B, T', D)
            log_probs = self.softmax.log_prob(last.reshape(-1, self.config.d_model))  # (B*T', V)
        return ModelOutput(log_probs=log_probs.view(b, last.shape[1], -1), loss=None, memory=new_memory)

    def _check_cache(
        self, tokens: Tensor, cache: KVCache, given: tuple[Memory | None, Span | None, Tensor | None]
    ) -> None:
        """Refuse a cache call that cannot run: ``given`` is the call's (memory, span, targets)."""
        memory, span, targets = given
        if memory is not None:
            raise ValueError("with a cache, pass no memory (the cache holds it)")
        if span is not None and span != cache.span:
            raise ValueError(f"the cache was built for {cache.span}, not {span}")
        if tokens.dim() != 2 or tokens.shape[0] != cache.batch_size:
            raise ValueError(
                f"tokens must be (batch, time) with the cache's {cache.batch_size} rows, "
                f"got shape {tuple(tokens.shape)}"
            )
        if targets is not None and targets.shape != tokens.shape:
            raise ValueError(
                f"targets {tuple(targets.shape)} must have the shape of tokens {tuple(tokens.shape)}"
            )
        if self.config.attention != "relative":
            raise ValueError("a key/value cache needs a Transformer-XL with relative attention")
        if not cache.fits(self.config):
            raise ValueError(
                f"this key/value cache was built for other sizes ({', '.join(CACHE_SIZES)}) than the model's"
            )
        param = self.u
        if param.dtype != cache.dtype or param.device != cache.device:
            raise ValueError(
                f"the cache holds {cache.dtype} on {cache.device}, the model's weights are "
                f"{param.dtype} on {param.device}"
            )

    def hidden_states(
        self,
        tokens: Tensor,
        *,
        memory: Memory | None = None,
        span: Span | None = None,
        cache: KVCache | None = None,
        starts: Tensor | None = None,
    ) -> tuple[Tensor, Memory | None]:
        """The model before its softmax: final hidden states (B, T, D) of tokens (B, T) after ``memory``
        (after the final norm and dropout, what :meth:`forward` sends to the softmax), and the memory for the
        next segment (None with a ``cache``, which then holds it). For callers that send only some positions
        to the softmax.

        Embedding -> :class:`LayerStack` (``self.layers``) -> final norm: with a memory, every layer projects
        the keys and values of [memory ; current]; with a cache, it projects the current positions' only and
        reads the memory's from the cache.
        ``starts``: document starts, as :meth:`forward`."""
        cfg = self.config
        if starts is not None:
            _check_starts(starts, tuple(tokens.shape), tokens.device)
        span = (cfg.span if span is None else span) if cache is None else cache.span
        h = self.embedding(tokens)  # (B, T, D), scaled by sqrt(D)
        if cfg.attention == "relative":
            biases = self._biases()
        else:
            h, biases = self._absolute_positions(h, starts), None  # positions enter at the input
        remembered = memory if cache is None else cache
        h, new_memory = self.layers(h, memory=remembered, span=span, starts=starts, biases=biases)
        if self.norm is not None:
            h = self.norm(h)
        return self.drop(h), new_memory


def _check_starts(starts: Tensor, shape: tuple[int, ...], device: torch.device) -> None:
    """``starts`` must be a bool tensor of the inputs' (B, T) ``shape``, on their device."""
    if not isinstance(starts, Tensor) or starts.dtype != torch.bool or tuple(starts.shape) != shape:
        got = f"{starts.dtype} {tuple(starts.shape)}" if isinstance(starts, Tensor) else type(starts).__name__
        raise ValueError(
            f"starts must be a bool tensor of the inputs' (batch, time) shape {shape}, got {got}"
        )
    if starts.device != device:
        raise ValueError(f"starts is on {starts.device}, the inputs on {device}")
