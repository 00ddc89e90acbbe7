"""The position-wise feed-forward network and the decoder layer (attention + feed-forward, each with a
residual connection and LayerNorm, post-norm as the paper or pre-norm). Attention itself is in attention.py.

Dimensions: B batch, T segment length, M memory length, K = M + T, D model size.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch.nn.functional as F
from torch import Tensor, nn

from ..config import TransformerXLConfig
from .attention import RelativeContext, make_attention

if TYPE_CHECKING:
    from .cache import LayerCache

__all__ = ["FeedForward", "DecoderLayer"]


class FeedForward(nn.Module):
    """Linear -> ReLU -> dropout -> Linear -> dropout, as the authors' ``PositionwiseFF`` core."""

    def __init__(self, config: TransformerXLConfig) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(config.d_model, config.d_inner),
            nn.ReLU(inplace=True),
            nn.Dropout(config.dropout),
            nn.Linear(config.d_inner, config.d_model),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        if self.training:
            return self.net(x)
        # Eval: the dropouts are identities; the two linear layers called directly (what decoding one token at
        # a time notices is the per-call overhead of five modules, not the arithmetic).
        first, second = self.net[0], self.net[3]
        return F.linear(F.linear(x, first.weight, first.bias).relu_(), second.weight, second.bias)


class DecoderLayer(nn.Module):
    """One Transformer-XL layer. Post-norm: x = LN(x + Attn(x)); x = LN(x + FF(x)).
    Pre-norm: x = x + Attn(LN(x), memory=LN(memory)); x = x + FF(LN(x)) (the memory is normalised too,
    as in the authors' code)."""

    def __init__(self, config: TransformerXLConfig) -> None:
        super().__init__()
        self.pre_norm = config.pre_norm
        self.attn = make_attention(config)
        self.attn_norm = nn.LayerNorm(config.d_model)
        self.ff = FeedForward(config)
        self.ff_norm = nn.LayerNorm(config.d_model)

    def attention_input(self, x: Tensor) -> Tensor:
        """What attention sees of hidden states x (B, T, D) (the layer's input, or its memory): x itself
        post-norm, ``attn_norm(x)`` pre-norm. The key/value cache projects the memory through this."""
        return self.attn_norm(x) if self.pre_norm else x

    def forward(self, x: Tensor, *, memory: Tensor | None = None, context: RelativeContext | None = None,
                cache: LayerCache | None = None) -> Tensor:
        """x (B, T, D), memory (B, M, D) or None -> (B, T, D). ``context``: relative positions (None for the
        vanilla baseline). ``cache``: this layer's keys and values of the memory (incremental decoding; then
        ``memory`` is None)."""
        if self.pre_norm:
            normed_memory = None if memory is None else self.attn_norm(memory)
            x = x + self.attn(self.attn_norm(x), memory=normed_memory, context=context, cache=cache)
            return x + self.ff(self.ff_norm(x))
        x = self.attn_norm(x + self.attn(x, memory=memory, context=context, cache=cache))
        return self.ff_norm(x + self.ff(x))

    def step(self, x: Tensor, *, context: RelativeContext, cache: LayerCache) -> Tensor:
        """One new position per row against the cache, in eval mode: x (B, 1, D) -> (B, 1, D). The maths of
        :meth:`forward`, with the sub-modules' functions called directly rather than through module calls,
        whose overhead is a visible share of a token's time when decoding one token at a time."""
        attend, ff = self.attn.forward_one, self.ff.forward
        if self.pre_norm:
            x = x + attend(_layer_norm(self.attn_norm, x), context=context, cache=cache)
            return x + ff(_layer_norm(self.ff_norm, x))
        x = _layer_norm(self.attn_norm, x + attend(x, context=context, cache=cache))
        return _layer_norm(self.ff_norm, x + ff(x))


def _layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    """``norm(x)`` without the module call."""
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
