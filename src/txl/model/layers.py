"""The position-wise feed-forward network and the decoder layer (attention + feed-forward, each with a
residual connection and LayerNorm, post-norm as the paper or pre-norm). Attention itself is in attention.py."""

# Dimensions (the legend of ``model/``): B batch, T segment length, M memory length, D model size.

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import Tensor, nn

from ..config import StackConfig
from .attention import AbsoluteContext, RelativeContext, make_attention

if TYPE_CHECKING:
    from .cache import LayerCache

__all__ = ["FeedForward", "DecoderLayer"]


class FeedForward(nn.Module):
    """Linear -> ReLU -> dropout -> Linear -> dropout, as the authors' ``PositionwiseFF`` core."""

    def __init__(self, config: StackConfig) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(config.d_model, config.d_inner),
            nn.ReLU(inplace=True),
            nn.Dropout(config.dropout),
            nn.Linear(config.d_inner, config.d_model),
            nn.Dropout(config.dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        """x (..., D) -> (..., D). Run on rows (N, D): ``F.linear`` of a 3-D input returns a view, and the
        in-place ReLU on a view makes autograd clone the whole base in backward; on rows the ReLU stays in place,
        with no copy."""
        *lead, d = x.shape
        return self.net(x.reshape(-1, d)).view(*lead, -1)  # (N, D) -> (..., D)


class DecoderLayer(nn.Module):
    """One Transformer-XL layer. Post-norm: x = LN(x + Attn(x)); x = LN(x + FF(x)).
    Pre-norm: x = x + Attn(LN(x), memory=LN(memory)); x = x + FF(LN(x)) (the memory is normalised too,
    as in the authors' code)."""

    def __init__(self, config: StackConfig) -> None:
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

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        context: RelativeContext | AbsoluteContext | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """x (B, T, D), memory (B, M, D) or None -> (B, T, D). ``context``: relative positions (for the vanilla
        baseline, None or the documents' mask). ``cache``: this layer's part of a key/value cache, where attention reads the
        remembered keys and values (``memory`` is then only the part not yet projected, usually None)."""
        if self.pre_norm:
            normed_memory = None if memory is None else self.attn_norm(memory)
            x = x + self.attn(self.attn_norm(x), memory=normed_memory, context=context, cache=cache)
            return x + self.ff(self.ff_norm(x))
        x = self.attn_norm(x + self.attn(x, memory=memory, context=context, cache=cache))
        return self.ff_norm(x + self.ff(x))
