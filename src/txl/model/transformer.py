"""The Transformer-XL language model (and its vanilla baseline): embedding -> decoder layers -> adaptive
softmax, with the segment-level recurrence carried explicitly as :class:`Memory` (or in a :class:`KVCache`)."""

# The Transformer-XL language model (and its vanilla baseline): embedding -> decoder layers -> adaptive
# softmax, with the segment-level recurrence carried explicitly as :class:`Memory` (or in a caller's
# :class:`KVCache`). One-position decoding, which needs tables of its own, lives in ``decode.py``.
#
# Dimensions (the legend of ``model/``): B batch, T segment length, M memory length, K = M + T keys, D model
# size, V vocabulary, L layers.
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
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import Span, TransformerXLConfig
from .adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from .attention import AbsoluteContext, RelativeContext
from .cache import CACHE_SIZES, KVCache
from .layers import DecoderLayer
from .memory import Memory, update_memory
from .positional import relative_distances, sinusoid

__all__ = ["TransformerXL", "ModelOutput", "attention_mask", "document_mask", "config_of", "eval_mode"]


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


class TransformerXL(nn.Module):
    """Transformer-XL language model (Dai et al., 2019), or the vanilla baseline with ``attention="absolute"``."""

    def __init__(self, config: TransformerXLConfig) -> None:
        super().__init__()
        self.config = config
        self.embedding = AdaptiveEmbedding(config)
        self.drop = nn.Dropout(config.dropout)
        self.layers = nn.ModuleList([DecoderLayer(config) for _ in range(config.n_layer)])
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

    def _check_inputs(self, tokens: Tensor, memory: Memory | None, targets: Tensor | None) -> None:
        if tokens.dim() != 2:
            raise ValueError(f"tokens must be (batch, time), got shape {tuple(tokens.shape)}")
        if targets is not None and targets.shape != tokens.shape:
            raise ValueError(
                f"targets shape {tuple(targets.shape)} differs from tokens shape {tuple(tokens.shape)}"
            )
        if memory is None:
            return
        if self.config.attention == "absolute":
            raise ValueError("the vanilla baseline (attention='absolute') has no memory: pass memory=None")
        if len(memory) != self.config.n_layer:
            raise ValueError(
                f"memory has {len(memory)} states, the model needs one per layer ({self.config.n_layer})"
            )
        if memory.batch_size != tokens.shape[0] or memory.states[0].shape[-1] != self.config.d_model:
            raise ValueError(
                f"memory states are {tuple(memory.states[0].shape)}, expected "
                f"({tokens.shape[0]}, M, {self.config.d_model})"
            )

    def _relative_contexts(
        self,
        t: int,
        m: int,
        span: Span,
        documents: Tensor | None,
        *,
        device: torch.device,
        dtype: torch.dtype,
    ) -> list[RelativeContext]:
        """Per-layer positions, mask and biases for T queries after M remembered positions; ``documents``
        (B, T, K) the keys each row's queries may not see for document boundaries (:func:`document_mask`)."""
        cfg = self.config
        distances = relative_distances(m + t, clamp_len=span.clamp_len, device=device)  # (K,)
        pos = self.drop(sinusoid(distances, cfg.d_model, dtype=dtype))  # (K, D)
        mask = attention_mask(t, m, same_length=span.same_length, mem_len=span.mem_len, device=device)
        if documents is not None:
            mask = (mask | documents)[:, None]  # (B, 1, T, K): one mask per row, shared by the heads
        return [RelativeContext(pos, mask, u, v) for u, v in self._biases()]

    def _absolute_documents(self, h: Tensor, starts: Tensor) -> tuple[Tensor, AbsoluteContext]:
        """The vanilla baseline with document starts: positions count from each document's start (from the
        segment's for a document begun before it) and attention is block-diagonal per document, so that a
        document reads as alone. h (B, T, D) embeddings -> with positions added, and the mask."""
        b, t, d = h.shape
        positions = torch.arange(t, device=h.device)  # (T,)
        begun = torch.where(starts, positions, -1).cummax(dim=1).values  # (B, T): last start <= i, or -1
        within = positions - begun.clamp(min=0)  # (B, T): position in the document
        h = h + sinusoid(within.reshape(-1), self.config.d_model, dtype=h.dtype).view(b, t, d)
        reach = torch.zeros(b, dtype=torch.int64, device=h.device)
        causal = attention_mask(t, 0, same_length=False, mem_len=0, device=h.device)  # (T, T)
        documents = document_mask(starts, reach, t=t, m=0)  # (B, T, T)
        return h, AbsoluteContext(mask=(causal | documents)[:, None])  # mask (B, 1, T, T)

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
            self._check_inputs(tokens, memory, targets)
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

        The one layer loop: with a memory, every layer projects the keys and values of [memory ; current];
        with a cache, it projects the current positions' only and reads the memory's from the cache.
        ``starts``: document starts, as :meth:`forward`."""
        cfg = self.config
        if starts is not None:
            _check_starts(tokens, starts)
        span = (cfg.span if span is None else span) if cache is None else cache.span
        if cfg.attention != "relative" and span.mem_len > 0:
            raise ValueError(
                "the vanilla baseline (attention='absolute') has no memory: its span has mem_len 0"
            )
        t = tokens.shape[1]
        h = self.embedding(tokens)  # (B, T, D), scaled by sqrt(D)
        contexts: Sequence[RelativeContext | AbsoluteContext | None] = [None] * cfg.n_layer
        if cfg.attention == "relative":
            if cache is not None:
                m, reach = cache.length, cache.reach
            else:
                m, reach = (0, None) if memory is None else (memory.length, memory.reach)
            documents = None
            if starts is not None or reach is not None:  # else no mask per row: the plain path, as before
                if reach is None:
                    reach = torch.full((tokens.shape[0],), m, dtype=torch.int64, device=tokens.device)
                documents = document_mask(starts, reach, t=t, m=m)  # (B, T, K)
            contexts = self._relative_contexts(t, m, span, documents, device=tokens.device, dtype=h.dtype)
        elif starts is None:
            positions = torch.arange(t, device=tokens.device)
            h = h + sinusoid(positions, cfg.d_model, dtype=h.dtype)  # absolute positions, input only
        else:
            h, context = self._absolute_documents(h, starts)
            contexts = [context] * cfg.n_layer
        h = self.drop(h)
        if cache is not None:
            cache.make_room(t)

        inputs = []  # the input of every layer: what the next segment remembers
        for index, layer in enumerate(self.layers):
            inputs.append(h)
            layer_cache = None if cache is None else cache.layers[index]
            if layer_cache is not None:
                layer_memory = layer_cache.unprojected()  # (B, P, D) or None: keys and values not cached yet
            else:
                layer_memory = None if memory is None else memory.states[index]  # (B, M, D)
            h = layer(h, memory=layer_memory, context=contexts[index], cache=layer_cache)
        if cache is not None:
            cache.store_inputs(inputs)
            cache.advance(t, starts=starts)
            new_memory = None
        elif span.mem_len > 0:
            new_memory = update_memory(memory, inputs, mem_len=span.mem_len, starts=starts)
        else:
            new_memory = None

        if self.norm is not None:
            h = self.norm(h)
        return self.drop(h), new_memory


def _check_starts(tokens: Tensor, starts: Tensor) -> None:
    """``starts`` must be a bool tensor of the tokens' (B, T) shape, on their device."""
    if not isinstance(starts, Tensor) or starts.dtype != torch.bool or starts.shape != tokens.shape:
        got = f"{starts.dtype} {tuple(starts.shape)}" if isinstance(starts, Tensor) else type(starts).__name__
        raise ValueError(
            f"starts must be a bool tensor of the tokens' shape {tuple(tokens.shape)}, got {got}"
        )
    if starts.device != tokens.device:
        raise ValueError(f"starts is on {starts.device}, the tokens on {tokens.device}")
