"""The position-wise feed-forward network and the decoder layer (attention + feed-forward, each with a
residual connection and LayerNorm, post-norm as the paper or pre-norm). Attention itself is in attention.py.

Dimensions: B batch, T segment length, M memory length, K = M + T, D model size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from ..config import TransformerXLConfig
from .attention import OneQueryContext, RelativeContext, make_attention

if TYPE_CHECKING:
    from .cache import LayerCache

__all__ = ["FeedForward", "DecoderLayer", "LayerStep"]


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
        """x (..., D) -> (..., D). Run on rows (N, D): ``F.linear`` of a 3-D input returns a view, and the
        in-place ReLU on a view makes autograd clone the whole base in backward (measured: about 3 ms of a
        130 ms training step at the small benchmark shape); on rows the ReLU stays in place, with no copy."""
        *lead, d = x.shape
        return self.net(x.reshape(-1, d)).view(*lead, -1)  # (N, D) -> (..., D)

    def prepare_one(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Weights for :meth:`forward_one`: (W1ᵀ (D, D_inner), b1, W2ᵀ (D_inner, D), b2), transposed and
        contiguous (the layout in which a few rows times a weight run fastest on the CPU)."""
        first, second = self.net[0], self.net[3]
        return first.weight.t().contiguous(), first.bias, second.weight.t().contiguous(), second.bias

    @staticmethod
    def forward_one(x: Tensor, weights: tuple[Tensor, Tensor, Tensor, Tensor]) -> Tensor:
        """Rows x (B, D) -> (B, D) in eval mode (the dropouts are identities), with :meth:`prepare_one`'s weights."""
        w1_t, b1, w2_t, b2 = weights
        return torch.addmm(b2, torch.addmm(b1, x, w1_t).relu_(), w2_t)


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

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        context: RelativeContext | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """x (B, T, D), memory (B, M, D) or None -> (B, T, D). ``context``: relative positions (None for the
        vanilla baseline). ``cache``: this layer's keys and values of the memory (incremental decoding; then
        ``memory`` is None)."""
        if self.pre_norm:
            normed_memory = None if memory is None else self.attn_norm(memory)
            x = x + self.attn(self.attn_norm(x), memory=normed_memory, context=context, cache=cache)
            return x + self.ff(self.ff_norm(x))
        x = self.attn_norm(x + self.attn(x, memory=memory, context=context, cache=cache))
        return self.ff_norm(x + self.ff(x))

    def prepare_step(self, pos: Tensor, *, u: Tensor, v: Tensor, batch_size: int) -> LayerStep:
        """What :meth:`step` needs, prepared once per model and settings
        (:meth:`~txl.model.TransformerXL.decoding_tables`): see :class:`LayerStep`."""
        return LayerStep(
            attention=self.attn.prepare_one(pos, u=u, v=v, batch_size=batch_size),
            ff=self.ff.prepare_one(),
            attn_norm=_norm_args(self.attn_norm),
            ff_norm=_norm_args(self.ff_norm),
        )

    def step(self, x: Tensor, *, prepared: LayerStep, cache: LayerCache) -> Tensor:
        """One new position per row against the cache, in eval mode: x (B, D) -> (B, D). The maths of
        :meth:`forward` with weights laid out ahead and functions instead of module calls: decoding one token
        at a time, the per-call overhead is a visible share of a token's time."""
        attend, ff, norm = self.attn.forward_one, FeedForward.forward_one, torch.layer_norm  # no wrapper
        if self.pre_norm:
            x = attend(norm(x, *prepared.attn_norm), context=prepared.attention, cache=cache, residual=x)
            return x + ff(norm(x, *prepared.ff_norm), prepared.ff)
        x = norm(attend(x, context=prepared.attention, cache=cache, residual=x), *prepared.attn_norm)
        return norm(x + ff(x, prepared.ff), *prepared.ff_norm)


@dataclass(frozen=True)
class LayerStep:
    """One layer's tables and weights for decoding one position per row (:meth:`DecoderLayer.step`), prepared
    once per model and settings (:meth:`~txl.model.TransformerXL.decoding_tables`): the attention's
    :class:`OneQueryContext` (distance table, biases, projection weights), the feed-forward weights of
    :meth:`FeedForward.prepare_one` and the norms' parameters. The transposed weights are copies (as many
    numbers as the layer's linear weights) kept with the model's memo until a weight changes: about 9% of a
    small model's token (measured, see docs/benchmarks.md)."""

    attention: OneQueryContext
    ff: tuple[Tensor, Tensor, Tensor, Tensor]
    attn_norm: tuple
    """The arguments of ``F.layer_norm`` after the input: (shape, weight, bias, eps)."""
    ff_norm: tuple


def _norm_args(norm: nn.LayerNorm) -> tuple:
    """``norm``'s arguments for ``F.layer_norm(x, *args)``, read once rather than through the module per call."""
    return norm.normalized_shape, norm.weight, norm.bias, norm.eps
