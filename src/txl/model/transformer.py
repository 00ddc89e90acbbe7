"""The Transformer-XL language model (and its vanilla baseline): embedding -> decoder layers -> adaptive
softmax, with the segment-level recurrence carried explicitly as :class:`Memory`.

Dimensions: B batch, T segment length, M memory length, K = M + T keys, H heads, Dh head size,
D model size, V vocabulary, N = n_layer.

    out = model(tokens, memory=memory, targets=targets)   # tokens, targets (B, T) int64
    out.loss      # (B, T) per-token negative log-likelihood in nats
    out.memory    # pass to the next segment
    out = model(tokens, memory=memory, span=Span(mem_len=640, same_length=True))  # evaluation lengths
    cache = KVCache(model.config, batch_size=B)            # generation: keys and values projected once
    out = model(tokens, cache=cache, last_only=True)       # out.logits (B, 1, V); the cache slides
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import Span, TransformerXLConfig
from .adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from .attention import RelativeContext
from .cache import DecodingTables, KVCache, OutputLayout
from .layers import DecoderLayer, LayerStep
from .memory import Memory, update_memory
from .positional import relative_distances, sinusoid

__all__ = ["TransformerXL", "ModelOutput", "attention_mask"]


@dataclass
class ModelOutput:
    """What :meth:`TransformerXL.forward` returns; fields not asked for are None."""

    logits: Tensor | None
    """(B, T, V) **log-probabilities** of the next token (already normalised by the full or adaptive
    softmax: ``logits.exp().sum(-1) == 1``; the name follows the usual ``ModelOutput``). None when targets are
    given, unless ``return_logits=True``. (B, 1, V) for the last position only with ``last_only=True``."""
    loss: Tensor | None
    """(B, T) negative log-likelihood of each target in nats (0 where the target is ``ignore_index``)."""
    memory: Memory | None
    """Memory for the next segment: the input of each layer on the last ``span.mem_len`` positions (None for
    the vanilla baseline or mem_len = 0, and with a ``cache``, which holds it: ``cache.memory()``)."""
    hidden: Tensor | None = None
    """(B, T, D) final hidden states, when ``return_hidden=True``."""


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
        self, t: int, m: int, *, span: Span, device: torch.device, dtype: torch.dtype
    ) -> list[RelativeContext]:
        """Per-layer positions, mask and biases for T queries after M remembered positions."""
        cfg = self.config
        distances = relative_distances(m + t, clamp_len=span.clamp_len, device=device)  # (K,)
        pos = self.drop(sinusoid(distances, cfg.d_model, dtype=dtype))  # (K, D)
        mask = attention_mask(t, m, same_length=span.same_length, mem_len=span.mem_len, device=device)
        return [RelativeContext(pos=pos, mask=mask, u=u, v=v) for u, v in self._biases()]

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
        return_logits: bool | None = None,
        return_hidden: bool = False,
        ignore_index: int = -100,
        cache: KVCache | None = None,
        last_only: bool = False,
    ) -> ModelOutput:
        """tokens (B, T) int64; memory from the previous segment or None (empty); targets (B, T) int64;
        ``span``: the memory length, clamp and same-length setting to run with (default: the config's).

        Returns per-token losses (B, T) when targets are given, log-probabilities (B, T, V) when they are not
        (or when ``return_logits``), and the memory for the next segment. ``last_only``: log-probabilities of
        the last position only, (B, 1, V) (what generation needs; no (B, T, V) tensor is built).

        ``cache``: a :class:`KVCache` holding the memory (pass no ``memory``; ``span`` is the cache's). The
        keys and values of remembered positions come from it, this segment's are appended and the window
        slides; ``out.memory`` is then None (``cache.memory()`` has it). Equal to the call without a cache, but
        computes no gradients."""
        if last_only and targets is not None:
            raise ValueError("last_only gives log-probabilities of the last position: it takes no targets")
        if cache is not None:
            return self._forward_cached(
                tokens,
                cache=cache,
                span=span,
                memory=memory,
                targets=targets,
                last_only=last_only,
                return_hidden=return_hidden,
                return_logits=return_logits,
                ignore_index=ignore_index,
            )
        self._check_inputs(tokens, memory, targets)
        h, new_memory = self.hidden_states(tokens, memory=memory, span=span)
        b, t = tokens.shape
        loss = None if targets is None else self._token_losses(h, targets, ignore_index=ignore_index)
        logits = None
        if targets is None or return_logits:
            last = h[:, -1:] if last_only else h  # (B, T', D)
            logits = self.softmax.log_prob(last.reshape(-1, self.config.d_model)).view(
                b, last.shape[1], -1
            )  # (B, T', V)
        return ModelOutput(logits=logits, loss=loss, memory=new_memory, hidden=h if return_hidden else None)

    def hidden_states(
        self, tokens: Tensor, *, memory: Memory | None = None, span: Span | None = None
    ) -> tuple[Tensor, Memory | None]:
        """The model before its softmax: final hidden states (B, T, D) of tokens (B, T) after ``memory``
        (after the final norm and dropout, what :meth:`forward` sends to the softmax), and the memory for the
        next segment. For callers that send only some positions to the softmax."""
        cfg = self.config
        span = cfg.span if span is None else span
        if cfg.attention != "relative" and span.mem_len > 0:
            raise ValueError(
                "the vanilla baseline (attention='absolute') has no memory: its span has mem_len 0"
            )
        t = tokens.shape[1]
        h = self.embedding(tokens)  # (B, T, D), scaled by sqrt(D)
        contexts: list[RelativeContext | None] = [None] * cfg.n_layer
        if cfg.attention == "relative":
            m = 0 if memory is None else memory.length
            contexts = self._relative_contexts(t, m, span=span, device=tokens.device, dtype=h.dtype)
        else:
            positions = torch.arange(t, device=tokens.device)
            h = h + sinusoid(positions, cfg.d_model, dtype=h.dtype)  # absolute positions, input only
        h = self.drop(h)

        inputs = []  # the input of every layer: what the next segment remembers
        for index, layer in enumerate(self.layers):
            inputs.append(h)
            layer_memory = None if memory is None else memory.states[index]
            h = layer(h, memory=layer_memory, context=contexts[index])
        new_memory = update_memory(memory, inputs, mem_len=span.mem_len) if span.mem_len > 0 else None

        if self.norm is not None:
            h = self.norm(h)
        return self.drop(h), new_memory

    def decoding_tables(self, *, reach: int, clamp_len: int | None, batch_size: int) -> DecodingTables:
        """The distance tables and weight layouts of one-position decoding (:class:`DecodingTables`) for key
        windows of up to ``reach`` + 1 positions and ``batch_size`` rows, as a :class:`KVCache` needs them.

        Remembered between calls (one entry: the last settings) and made again when a weight changed (its
        storage or version counter), the settings differ or the intra-op thread count moved, so that a series
        of ``generate`` calls pays for the transposed copies once; :meth:`train` drops the memo."""
        blocks = min(torch.get_num_threads(), 4) if self.config.vocab_size >= 4096 else 1
        params = list(self.parameters())
        key = (
            reach,
            clamp_len,
            batch_size,
            blocks,
            params[0].dtype,
            params[0].device,
            tuple((p.data_ptr(), p._version) for p in params),
        )
        memo = self.__dict__.get("_decoding_memo")
        if memo is not None and memo.key == key:
            return memo
        with torch.no_grad():
            distances = relative_distances(reach + 1, clamp_len=clamp_len, device=params[0].device)  # (R,)
            pos = sinusoid(distances, self.config.d_model, dtype=params[0].dtype)  # (R, D)
            steps = tuple(
                layer.prepare_step(pos, u=u, v=v, batch_size=batch_size)
                for layer, (u, v) in zip(self.layers, self._biases(), strict=True)
            )
            output = None
            if self.softmax.n_clusters == 0 and params[0].device.type == "cpu":
                output = OutputLayout(*self.softmax.cluster_params(0), blocks=blocks)
        memo = DecodingTables(key, steps, output)
        self.__dict__["_decoding_memo"] = memo  # a plain attribute: not a parameter, buffer or submodule
        return memo

    def train(self, mode: bool = True) -> TransformerXL:
        """As :meth:`nn.Module.train`; training also drops the decoding tables' memo (it would go stale)."""
        if mode:
            self.__dict__.pop("_decoding_memo", None)
        return super().train(mode)

    def _step_contexts(self, cache: KVCache) -> list[LayerStep]:
        """Contexts for one query against the cache: the projected distances of the keys in view, no mask.
        With ``same_length`` and a full memory the oldest key is out of view (``attention_mask``'s rule)."""
        cache.prepare_tables()
        span = cache.span
        k = cache.length + 1
        if span.same_length:
            k = min(k, span.mem_len)
        cache.view_start = cache.end + 1 - k
        if cache.step_contexts is None or cache.step_contexts[0] != k:
            contexts = [
                dataclasses.replace(
                    step, attention=dataclasses.replace(step.attention, rel=step.attention.rel[:, :, -k:])
                )
                for step in cache.prepared
            ]  # rel (B*H, Dh, K)
            cache.step_contexts = (k, contexts)
        return cache.step_contexts[1]

    def _forward_cached(
        self,
        tokens: Tensor,
        *,
        cache: KVCache,
        span: Span | None,
        memory: Memory | None,
        targets: Tensor | None,
        last_only: bool,
        return_hidden: bool,
        return_logits: bool | None = None,
        ignore_index: int = -100,
    ) -> ModelOutput:
        """forward() against a key/value cache: T new positions, after the cache's memory. No gradients: the
        cache keeps values, not a graph (it serves generation and evaluation; training takes whole segments
        and a memory). With targets, the per-token losses as :meth:`forward` gives them."""
        if torch.is_grad_enabled():
            with torch.no_grad():
                return self._forward_cached(
                    tokens,
                    cache=cache,
                    span=span,
                    memory=memory,
                    targets=targets,
                    last_only=last_only,
                    return_hidden=return_hidden,
                    return_logits=return_logits,
                    ignore_index=ignore_index,
                )
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
        if cache.model is not self:
            cache.bind(self)
        b, t = tokens.shape
        h = self.embedding(tokens)  # (B, T, D)
        cache.make_room(t)
        if t == 1 and not self.training:  # one query: the lean path, rows (B, D), the distance table ahead
            contexts = self._step_contexts(cache)
            h = h[:, 0]  # (B, D)
            inputs = []
            for layer, context, layer_cache in zip(self.layers, contexts, cache.layers, strict=True):
                inputs.append(h)
                h = layer.step(h, prepared=context, cache=layer_cache)
            cache.store_inputs(inputs)
            cache.advance(1)
            if self.norm is not None:
                h = self.norm(h)
            h = h[:, None]  # (B, 1, D)
        else:
            h = self.drop(h)
            cache.view_start = cache.start
            contexts = self._relative_contexts(
                t, cache.length, span=cache.span, device=tokens.device, dtype=h.dtype
            )
            for layer, context, layer_cache in zip(self.layers, contexts, cache.layers, strict=True):
                layer_cache.store_input(h)
                h = layer(h, context=context, cache=layer_cache)
            cache.advance(t)
            h = self.drop(h if self.norm is None else self.norm(h))  # (B, T, D)
        loss = None if targets is None else self._token_losses(h, targets, ignore_index=ignore_index)
        logits = None
        if targets is None or return_logits:
            last = h[:, -1] if last_only else h.reshape(b * t, -1)  # (B, D) or (B*T, D)
            logits = self._cached_log_probs(last, cache).view(b, -1, self.config.vocab_size)  # (B, T', V)
        return ModelOutput(logits=logits, loss=loss, memory=None, hidden=h if return_hidden else None)

    def _token_losses(self, h: Tensor, targets: Tensor, *, ignore_index: int) -> Tensor:
        """Per-token negative log-likelihood (B, T) of targets (B, T) under final hidden states h (B, T, D)."""
        b, t = targets.shape
        flat = h.reshape(b * t, -1)  # (B*T, D)
        return self.softmax.nll(flat, targets.reshape(-1), ignore_index=ignore_index).view(b, t)  # (B, T)

    def _cached_log_probs(self, hidden: Tensor, cache: KVCache) -> Tensor:
        """Log-probabilities (N, V) of final hidden states (N, D), with the output weight the cache prepared."""
        cache.prepare_tables()
        if cache.output is None:
            return self.softmax.log_prob(hidden)
        scores = cache.output.scores(
            hidden
        )  # (N, V): the plain softmax of log_prob, its weight laid out ahead
        return torch.log_softmax(
            scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores, dim=-1
        )
