"""The Transformer-XL language model (and its vanilla baseline): embedding -> decoder layers -> adaptive
softmax, with the segment-level recurrence carried explicitly as :class:`Memory`.

Dimensions: B batch, T segment length, M memory length, K = M + T keys, H heads, Dh head size,
D model size, V vocabulary, N = n_layer.

    out = model(tokens, memory=memory, targets=targets)   # tokens, targets (B, T) int64
    out.loss      # (B, T) per-token negative log-likelihood in nats
    out.memory    # pass to the next segment
    out = model(tokens, memory=memory, span=Span(mem_len=640, same_length=True))  # evaluation lengths
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import Span, TransformerXLConfig
from .adaptive import AdaptiveEmbedding, AdaptiveLogSoftmax
from .attention import RelativeContext
from .layers import DecoderLayer
from .memory import Memory, update_memory
from .positional import relative_distances, sinusoid

__all__ = ["TransformerXL", "ModelOutput", "attention_mask"]


@dataclass
class ModelOutput:
    """What :meth:`TransformerXL.forward` returns; fields not asked for are None."""

    logits: Tensor | None
    """(B, T, V) **log-probabilities** of the next token (already normalised by the full or adaptive
    softmax: ``logits.exp().sum(-1) == 1``; the name follows the usual ``ModelOutput``). None when targets are
    given, unless ``return_logits=True``."""
    loss: Tensor | None
    """(B, T) negative log-likelihood of each target in nats (0 where the target is ``ignore_index``)."""
    memory: Memory | None
    """Memory for the next segment: the input of each layer on the last ``span.mem_len`` positions (None for
    the vanilla baseline or mem_len = 0)."""
    hidden: Tensor | None = None
    """(B, T, D) final hidden states, when ``return_hidden=True``."""


def attention_mask(t: int, m: int, *, same_length: bool, mem_len: int, device: torch.device | None = None) -> Tensor:
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
            shape = (config.n_head, config.d_head) if config.share_rel_bias else (config.n_layer, config.n_head, config.d_head)
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
            raise ValueError(f"targets shape {tuple(targets.shape)} differs from tokens shape {tuple(tokens.shape)}")
        if memory is None:
            return
        if self.config.attention == "absolute":
            raise ValueError("the vanilla baseline (attention='absolute') has no memory: pass memory=None")
        if len(memory) != self.config.n_layer:
            raise ValueError(f"memory has {len(memory)} states, the model needs one per layer ({self.config.n_layer})")
        if memory.batch_size != tokens.shape[0] or memory.states[0].shape[-1] != self.config.d_model:
            raise ValueError(f"memory states are {tuple(memory.states[0].shape)}, expected "
                             f"({tokens.shape[0]}, M, {self.config.d_model})")

    def forward(self, tokens: Tensor, *, memory: Memory | None = None, targets: Tensor | None = None,
                span: Span | None = None, return_logits: bool | None = None, return_hidden: bool = False,
                ignore_index: int = -100) -> ModelOutput:
        """tokens (B, T) int64; memory from the previous segment or None (empty); targets (B, T) int64;
        ``span``: the memory length, clamp and same-length setting to run with (default: the config's).

        Returns per-token losses (B, T) when targets are given, log-probabilities (B, T, V) when they are not
        (or when ``return_logits``), and the memory for the next segment."""
        self._check_inputs(tokens, memory, targets)
        cfg = self.config
        span = cfg.span if span is None else span
        if cfg.attention != "relative" and span.mem_len > 0:
            raise ValueError("the vanilla baseline (attention='absolute') has no memory: its span has mem_len 0")
        b, t = tokens.shape
        h = self.embedding(tokens)  # (B, T, D), scaled by sqrt(D)
        contexts: list[RelativeContext | None] = [None] * cfg.n_layer
        if cfg.attention == "relative":
            m = 0 if memory is None else memory.length
            distances = relative_distances(m + t, clamp_len=span.clamp_len, device=tokens.device)  # (K,)
            pos = self.drop(sinusoid(distances, cfg.d_model, dtype=h.dtype))  # (K, D)
            mask = attention_mask(t, m, same_length=span.same_length, mem_len=span.mem_len, device=tokens.device)
            for index in range(cfg.n_layer):
                u, v = (self.u, self.v) if cfg.share_rel_bias else (self.u[index], self.v[index])
                contexts[index] = RelativeContext(pos=pos, mask=mask, u=u, v=v)
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
        h = self.drop(h)
        flat = h.reshape(b * t, -1)  # (B*T, D)
        loss = logits = None
        if targets is not None:
            loss = self.softmax.nll(flat, targets.reshape(-1), ignore_index=ignore_index).view(b, t)  # (B, T)
        if targets is None or return_logits:
            logits = self.softmax.log_prob(flat).view(b, t, -1)  # (B, T, V), normalised
        return ModelOutput(logits=logits, loss=loss, memory=new_memory, hidden=h if return_hidden else None)
