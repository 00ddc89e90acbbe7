"""Multi-head attention: Transformer-XL's relative attention (the paper's Eq. in Section 3.3) and the
absolute-position attention of the vanilla baseline. Norms and residuals belong to ``layers.py``."""

# Dimensions (the legend of ``model/``, see its ``__init__``): B batch, T queries (new positions), M memory
# length, K = M + T keys, H heads, Dh head size, D model size.
#
# The relative score between query i and key j (Dai et al. 2019, Section 3.3):
#
#     A_ij = q_i·k_j  (a: content)  + q_i·W_R R_{i-j}  (b: content-position)
#          + u·k_j    (c: global content bias) + v·W_R R_{i-j}  (d: global position bias)
#          = (q_i + u)·k_j + (q_i + v)·W_R R_{i-j}
#
# Terms (b) + (d) for every (i, j) come from one matmul of (q + v) with the K projected distances followed
# by :func:`rel_shift`; no (T, K, D) tensor of position vectors is ever built.
#
# With a :class:`~txl.model.cache.KVCache` the keys and values of remembered positions are read from the
# cache (projected once, when their positions were new) instead of being projected again: the only difference
# between the memory path and the cache path. One-position decoding has its own room, ``decode.py``.

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import StackConfig

if TYPE_CHECKING:
    from .cache import LayerCache

__all__ = [
    "rel_shift",
    "RelativeContext",
    "AbsoluteContext",
    "MultiHeadAttention",
    "RelativeMultiHeadAttention",
    "AbsoluteMultiHeadAttention",
    "make_attention",
]


def rel_shift(x: Tensor) -> Tensor:
    """Turn scores against distances into scores against keys.

    ``x[..., i, m]`` is the score of query i against distance ``K-1-m`` (distances in descending order).
    Returns ``y`` with ``y[..., i, j] = x[..., i, j + T - 1 - i]``: the score of query i (absolute position
    M + i) against key j, whose distance is M + i - j. Entries for j > M + i (the future) are meaningless and
    must be masked.

    No copy: in a contiguous (T, K) block that element sits at offset ``(T-1) + i·(K-1) + j``, so ``y`` is a
    strided view of ``x`` (row stride K-1, offset T-1). Row i's last entries run into row i+1: they are exactly
    the future ones. The gradient is written back through the same view without its overlap (see
    :class:`_RelShift`). The paper's pad-reshape-slice form (:func:`_rel_shift_padded`) costs a zero-filled
    padded copy and a second copy forward, and as many backward; it is kept for graph capture
    (``torch.compile``, ``torch.export`` and the ONNX export), which cannot follow a tensor set on a storage."""
    if torch.compiler.is_compiling() or torch.jit.is_tracing():
        return _rel_shift_padded(x)
    return _RelShift.apply(x)


def _rel_shift_padded(x: Tensor) -> Tensor:
    """:func:`rel_shift` as pad-reshape-slice: (..., T, K) -> (..., T, K+1) -> (..., K+1, T) -> drop a row."""
    *lead, t, k = x.shape
    padded = F.pad(x, (1, 0))  # (..., T, K+1)
    padded = padded.reshape(*lead, k + 1, t)  # (..., K+1, T)
    return padded[..., 1:, :].reshape(*lead, t, k)  # (..., T, K)


class _RelShift(torch.autograd.Function):
    """:func:`rel_shift` as a strided view, with its backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor) -> Tensor:
        t, k = x.shape[-2:]
        x = x.contiguous()
        ctx.shape = x.shape
        stride = (*x.stride()[:-2], k - 1, 1)
        # A new tensor on x's storage rather than a view of x: autograd would otherwise also route the
        # gradient through a generic as_strided backward (a zero-filled copy of x's whole storage).
        out = x.new_empty(0)
        return out.set_(x.untyped_storage(), x.storage_offset() + t - 1, x.shape, stride)  # (..., T, K)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> Tensor:
        # Entry (i, j < K-1) of the view maps one-to-one onto offsets T-1 .. T·K-2 of each (T, K) block; the
        # last column overlaps the next row except in the last row, whose (T-1, K-1) is offset T·K-1; offsets
        # before T-1 (distances no query reaches) get no gradient. Future entries carry a zero gradient (masked).
        *lead, t, k = ctx.shape
        out = grad.new_empty(ctx.shape)
        flat = out.view(*lead, t * k)  # (..., T*K)
        flat[..., : t - 1] = 0
        flat[..., t * k - 1] = grad[..., t - 1, k - 1]
        stride = (*out.stride()[:-2], k - 1, 1)
        out.as_strided((*lead, t, k - 1), stride, t - 1).copy_(grad[..., : k - 1])
        return out


@dataclass(frozen=True)
class RelativeContext:
    """What relative attention needs besides the hidden states, built once per forward by the model.

    pos: (K, D) sinusoids of the distances K-1..0 (clamped); mask: True where attention is blocked, (T, K)
    for every row alike, or (B, 1, T, K) one per row (documents, see ``document_mask``); u, v: (H, Dh) the
    global content and position biases of this layer."""

    pos: Tensor
    mask: Tensor
    u: Tensor
    v: Tensor


@dataclass(frozen=True)
class AbsoluteContext:
    """What absolute attention (the vanilla baseline) needs besides the hidden states when documents begin
    inside the segment: mask (B, 1, T, T), True where attention is blocked (the future, and keys before the
    query's document). Without starts the baseline gets no context and attends causally."""

    mask: Tensor


class MultiHeadAttention(nn.Module):
    """Causal multi-head attention over [memory ; current]: the projections shared by both variants.
    A variant overrides :meth:`attend`, which turns heads into the attention output."""

    def __init__(self, config: StackConfig) -> None:
        super().__init__()
        self.n_head, self.d_head = config.n_head, config.d_head
        inner = config.n_head * config.d_head
        self.qkv = nn.Linear(config.d_model, 3 * inner, bias=False)  # rows: q | k | v
        self.out = nn.Linear(inner, config.d_model, bias=False)
        self.dropatt = config.dropatt
        self.drop = nn.Dropout(config.dropout)
        self.scale = 1.0 / math.sqrt(config.d_head)

    def project(self, x: Tensor, memory: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
        """Queries of the current positions and keys, values of [memory ; current]."""
        b, t, _ = x.shape
        if memory is None:
            q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, T, H*Dh)
        else:  # queries of the current positions only; keys and values of [memory ; current]
            inner = self.n_head * self.d_head
            q = F.linear(x, self.qkv.weight[:inner])  # (B, T, H*Dh)
            kv = F.linear(torch.cat([memory, x], dim=1), self.qkv.weight[inner:])  # (B, K, 2*H*Dh)
            k, v = kv.chunk(2, dim=-1)  # 2 x (B, K, H*Dh)
        q = q.reshape(b, t, self.n_head, self.d_head).transpose(1, 2)  # (B, H, T, Dh)
        k = k.reshape(b, -1, self.n_head, self.d_head).transpose(1, 2)  # (B, H, K, Dh)
        v = v.reshape(b, -1, self.n_head, self.d_head).transpose(1, 2)  # (B, H, K, Dh)
        return q, k, v

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, context: RelativeContext | AbsoluteContext | None
    ) -> Tensor:
        """Heads q (B, H, T, Dh), k and v (B, H, K, Dh) -> attention output (B, H, T, Dh)."""
        raise NotImplementedError

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        context: RelativeContext | AbsoluteContext | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """x (B, T, D), memory (B, M, D) or None -> (B, T, D) (after output dropout).

        With ``cache`` the keys and values of ``memory`` and of the T new positions are projected and appended to
        the cache, and attention reads those of every remembered position from it; ``memory`` is then only
        what the cache holds unprojected (see :meth:`~txl.model.cache.LayerCache.unprojected`), usually None."""
        b, t, _ = x.shape
        q, k, v = self.project(x, memory)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H, K, Dh): [memory ; current], the memory's read from the cache
        attn = self.attend(q, k, v, context)  # (B, H, T, Dh)
        attn = attn.transpose(1, 2).reshape(b, t, self.n_head * self.d_head)  # (B, T, H*Dh)
        return self.drop(self.out(attn))


class RelativeMultiHeadAttention(MultiHeadAttention):
    """Transformer-XL attention over [memory ; current] with relative positions and global biases u, v."""

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config)
        self.r_net = nn.Linear(config.d_model, config.n_head * config.d_head, bias=False)  # W_{k,R}

    def project_distances(self, pos: Tensor) -> Tensor:
        """W_R R: sinusoids of distances (K, D) -> this layer's projected distances (H, Dh, K)."""
        return self.r_net(pos).reshape(-1, self.n_head, self.d_head).permute(1, 2, 0)  # (H, Dh, K)

    def position_term(self, q: Tensor, pos: Tensor, v_bias: Tensor, *, scale: float = 1.0) -> Tensor:
        """Terms (b) + (d): (q_i + v)·W_R R_{i-j} for all i, j, shape (B, H, T, K), times ``scale``."""
        q_v = q + v_bias[:, None, :] if scale == 1.0 else (q + v_bias[:, None, :]) * scale  # (B, H, T, Dh)
        by_distance = q_v @ self.project_distances(pos)  # (B, H, T, K), column m = distance K-1-m
        return rel_shift(by_distance)

    def scores(self, x: Tensor, *, memory: Tensor | None, context: RelativeContext) -> Tensor:
        """Scaled, masked attention scores (B, H, T, K) before the softmax (for inspection and tests)."""
        q, k, _ = self.project(x, memory)
        content = (q + context.u[:, None, :]) @ k.transpose(-1, -2)  # (B, H, T, K): terms (a) + (c)
        score = (content + self.position_term(q, context.pos, context.v)) * self.scale
        return score.masked_fill(context.mask, float("-inf"))

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, context: RelativeContext | AbsoluteContext | None
    ) -> Tensor:
        if not isinstance(context, RelativeContext):
            raise ValueError("relative attention needs a RelativeContext (positions, mask, u, v)")
        if q.device.type != "cpu":
            return self.attend_fused(q, k, v, context)
        # On the CPU: the four terms in one baddbmm, masked in place, then softmax and values. With a bias that
        # needs a gradient, scaled_dot_product_attention takes its unfused path there, which scales, adds and
        # copies the (B, H, T, K) scores a few more times (see docs/design.md). The scale goes on the (B, H, T, Dh) queries, 1/4 of the
        # scores' size at K = 2T, so that baddbmm's backward needs no scaling pass over (B, H, T, K).
        b, h, t, dh = q.shape
        kk = k.shape[2]
        position = self.position_term(q, context.pos, context.v, scale=self.scale)  # (B, H, T, K), a view
        content_q = ((q + context.u[:, None, :]) * self.scale).reshape(b * h, t, dh)  # (B*H, T, Dh)
        # (B*H, T, K): ((a)+(c) + (b)+(d)) / sqrt(Dh)
        score = torch.baddbmm(
            position.reshape(b * h, t, kk), content_q, k.reshape(b * h, kk, dh).transpose(1, 2)
        )
        with torch.no_grad():  # masked entries get probability 0, so their gradient is 0 without autograd's
            if context.mask.dim() == 2:  # masked_fill backward (a copy of the scores)
                score.masked_fill_(context.mask, float("-inf"))
            else:  # one mask per row (documents), (B, 1, T, K) over (B, H, T, K)
                score.view(b, h, t, kk).masked_fill_(context.mask, float("-inf"))
        attn = F.dropout(torch.softmax(score.view(b, h, t, kk), dim=-1), self.dropatt, self.training)
        return attn @ v  # (B, H, T, Dh)

    def attend_fused(self, q: Tensor, k: Tensor, v: Tensor, context: RelativeContext) -> Tensor:
        """:meth:`attend` through ``scaled_dot_product_attention`` (the path on GPUs, where its kernels take
        the bias): terms (b)+(d) and the mask enter as an additive bias; the kernel adds terms (a)+(c) as
        (q + u)·k scaled by 1/sqrt(Dh), so the bias is scaled the same way."""
        bias = self.position_term(q, context.pos, context.v) * self.scale  # (B, H, T, K)
        bias = bias.masked_fill(context.mask, float("-inf"))
        return F.scaled_dot_product_attention(
            q + context.u[:, None, :],
            k,
            v,
            attn_mask=bias,
            dropout_p=self.dropatt if self.training else 0.0,
            scale=self.scale,
        )  # (B, H, T, Dh)


class AbsoluteMultiHeadAttention(MultiHeadAttention):
    """Standard causal attention for the vanilla baseline: positions enter at the input, no memory."""

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        context: RelativeContext | AbsoluteContext | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        if memory is not None or isinstance(context, RelativeContext) or cache is not None:
            raise ValueError(
                "absolute attention (the vanilla baseline) takes no memory, cache or relative positions"
            )
        return super().forward(x, context=context)

    def attend(
        self, q: Tensor, k: Tensor, v: Tensor, context: RelativeContext | AbsoluteContext | None
    ) -> Tensor:
        dropout = self.dropatt if self.training else 0.0
        if context is None:
            return F.scaled_dot_product_attention(
                q, k, v, is_causal=True, dropout_p=dropout, scale=self.scale
            )  # (B, H, T, Dh)
        # documents: block-diagonal per row (the kernel's boolean mask is True where attention is allowed)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=~context.mask, dropout_p=dropout, scale=self.scale
        )  # (B, H, T, Dh)


def make_attention(config: StackConfig) -> MultiHeadAttention:
    """The attention variant named by ``config.attention``, chosen once when the model is built."""
    kinds: dict[str, type[MultiHeadAttention]] = {
        "relative": RelativeMultiHeadAttention,
        "absolute": AbsoluteMultiHeadAttention,
    }
    return kinds[config.attention](config)
