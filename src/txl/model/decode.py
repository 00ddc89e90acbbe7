"""One-position decoding: everything that exists only to make one new token per row cheap (a :class:`Decoder`
over a model and a key/value cache, stepping with tables derived from the weights)."""

# One-position decoding: everything that exists only to make one new token per row cheap. A
# :class:`Decoder` is a value the caller holds, over a model and a :class:`~txl.model.cache.KVCache`: it
# prefills the cache with a prompt (through the model's ordinary ``forward``) and then steps one position at
# a time with tables derived from the weights (the projected distance table, transposed weights, the output
# layer in column blocks). The maths is the model's (``attention.py``, ``layers.py``); this room only lays it
# out for a few rows at a time and is tested against the plain path.
#
# Dimensions (the legend of ``model/``): B batch, M memory length, K keys in view, R distances in a table,
# H heads, Dh head size, D model size, F feed-forward size, E output embedding size, V vocabulary, N rows,
# J column blocks of width W.
#
#     cache = KVCache(model.config, batch_size=B, span=span, memory=memory)
#     decoder = Decoder(model, cache)
#     log_probs = decoder.prefill(prompt)         # (B, V): the next token after the prompt
#     log_probs = decoder.step(next_token)        # (B, V), one position further; the cache slides
#
# The tables are copies of the weights (transposed, as many numbers as the linear weights) made once per model
# and settings and remembered here, one entry per model (a weak reference: nothing is stored on the model),
# until a weight changes (its storage or version counter: an optimizer step, ``load_state_dict``) or the
# intra-op thread count moves; a series of generations pays for them once.

from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple, cast

import torch
from torch import Tensor, nn

from .attention import RelativeMultiHeadAttention
from .cache import KVCache, LayerCache
from .compiled import CompiledStep, StepSizes, compiled_step, embedder, unsupported
from .layers import DecoderLayer
from .positional import relative_distances, sinusoid
from .transformer import TransformerXL, config_of

__all__ = [
    "Decoder",
    "DecodingTables",
    "LayerTables",
    "OutputLayout",
    "StepKeys",
    "TableShape",
    "attention_step",
    "bind_memory",
    "decoding_tables",
    "document_bias",
    "feed_forward_step",
    "step_sizes",
    "step_weights",
    "weights_key",
]


class OutputLayout:
    """A plain softmax's output weight laid out for a few rows of logits at a time on the CPU.

    The (V, E) weight is transposed and cut into J column blocks, (J, E, W) contiguous with W = ceil(V / J)
    (the last block padded with zero columns, sliced off again), so that one batched matmul computes the
    logits and spreads the J blocks over the intra-op threads: a single row times a (E, V) weight runs on
    one thread otherwise. Measured on 2 cores (10k x 128): 157 us with the weight as stored, 86 us
    transposed, 55-60 us transposed in 2 blocks (identical results)."""

    __slots__ = ("weight", "bias", "proj", "vocab_size")

    def __init__(self, weight: Tensor, bias: Tensor, proj: Tensor | None, *, blocks: int) -> None:
        v, e = weight.shape
        width = -(-v // blocks)
        pad = width * blocks - v
        with torch.no_grad():
            if pad:
                weight = torch.cat([weight, weight.new_zeros(pad, e)])  # (J*W, E)
                bias = torch.cat([bias, bias.new_zeros(pad)])  # (J*W,)
            self.weight = weight.view(blocks, width, e).transpose(1, 2).contiguous()  # (J, E, W)
            self.bias = bias.view(blocks, 1, width).clone()  # (J, 1, W)
        self.proj = proj
        self.vocab_size = v

    def scores(self, hidden: Tensor) -> Tensor:
        """Rows of final hidden states (N, D) -> scores before the softmax (N, V)."""
        x = hidden if self.proj is None else hidden @ self.proj  # (N, E)
        j, e, width = self.weight.shape
        n = x.shape[0]
        if j == 1:
            out = torch.addmm(self.bias[0], x, self.weight[0])  # (N, W)
        else:
            out = torch.baddbmm(self.bias, x.expand(j, n, e), self.weight)  # (J, N, W)
            out = out.view(n, j * width) if n == 1 else out.transpose(0, 1).reshape(n, j * width)  # (N, J*W)
        return out if out.shape[1] == self.vocab_size else out[:, : self.vocab_size]


@dataclass(frozen=True)
class AttentionTables:
    """One layer's relative attention laid out for one query per row.

    rel: (B*H, Dh, R) the projected distances ``W_R R`` for the distances R-1..0 (clamped), one copy per batch
    row so that one batched matmul scores every head of every row; q_bias: (3*H*Dh,) ``[u | 0 | 0]``, which
    makes the qkv projection return q + u; v_minus_u: (H, Dh), since q + v = (q + u) + (v - u); qkv_t:
    (D, 3*H*Dh) and out_t: (H*Dh, D), the projection weights transposed and contiguous (the layout in which a
    few rows times a weight run fastest on the CPU); scale: 1 / sqrt(Dh)."""

    rel: Tensor
    q_bias: Tensor
    v_minus_u: Tensor
    qkv_t: Tensor
    out_t: Tensor
    scale: float


@dataclass(frozen=True)
class LayerTables:
    """One decoder layer for one position per row: the attention's tables, the feed-forward weights
    (W1ᵀ (D, F), b1, W2ᵀ (F, D), b2) transposed and contiguous, and the norms' ``F.layer_norm`` arguments
    after the input, (shape, weight, bias, eps)."""

    attention: AttentionTables
    ff: tuple[Tensor, Tensor, Tensor, Tensor]
    attn_norm: tuple
    ff_norm: tuple
    pre_norm: bool


@dataclass(frozen=True)
class DecodingTables:
    """What one-position decoding needs beyond the cache's keys and values: :class:`LayerTables` per layer,
    the output layout (None for an adaptive softmax or off the CPU), and the key of the weights and
    settings they were made from (:func:`weights_key`)."""

    key: tuple
    layers: tuple[LayerTables, ...]
    output: OutputLayout | None


def _norm_args(norm: nn.LayerNorm) -> tuple:
    """``norm``'s arguments for ``F.layer_norm(x, *args)``, read once rather than through the module per call."""
    return norm.normalized_shape, norm.weight, norm.bias, norm.eps


def _output_blocks(model: TransformerXL) -> int:
    return min(torch.get_num_threads(), 4) if model.config.vocab_size >= 4096 else 1


class TableShape(NamedTuple):
    """The settings decoding tables are made for: key windows of up to ``longest`` + 1 positions, distances
    clamped at ``clamp_len`` (None: not clamped), ``batch_size`` rows."""

    longest: int
    clamp_len: int | None
    batch_size: int


def weights_key(model: TransformerXL, shape: TableShape) -> tuple:
    """What decoding tables depend on: the settings, the output's column blocks (from the thread count), and
    every parameter's storage and version counter (an in-place change, as an optimizer step, bumps it)."""
    params = list(model.parameters())
    return (
        *shape,
        _output_blocks(model),
        params[0].dtype,
        params[0].device,
        tuple((p.data_ptr(), p._version) for p in params),
    )


@torch.no_grad()
def _layer_tables(layer: DecoderLayer, pos: Tensor, u: Tensor, v: Tensor, batch_size: int) -> LayerTables:
    attn = cast(RelativeMultiHeadAttention, layer.attn)
    b, h, dh = batch_size, attn.n_head, attn.d_head
    rel = attn.project_distances(pos)  # (H, Dh, R)
    rel = rel.unsqueeze(0).expand(b, h, dh, rel.shape[-1]).reshape(b * h, dh, -1)  # (B*H, Dh, R)
    attention = AttentionTables(
        rel=rel,
        q_bias=torch.cat([u.reshape(-1), u.new_zeros(2 * h * dh)]),  # (3*H*Dh,): [u | 0 | 0]
        v_minus_u=v - u,
        qkv_t=attn.qkv.weight.t().contiguous(),
        out_t=attn.out.weight.t().contiguous(),
        scale=attn.scale,
    )
    first, second = cast(nn.Linear, layer.ff.net[0]), cast(nn.Linear, layer.ff.net[3])
    ff = (first.weight.t().contiguous(), first.bias, second.weight.t().contiguous(), second.bias)
    return LayerTables(attention, ff, _norm_args(layer.attn_norm), _norm_args(layer.ff_norm), layer.pre_norm)


_MEMO: weakref.WeakKeyDictionary[TransformerXL, DecodingTables] = weakref.WeakKeyDictionary()
"""The last tables made for each live model (weakly keyed: a model that is collected leaves no entry)."""


def decoding_tables(
    model: TransformerXL, *, longest: int, clamp_len: int | None, batch_size: int
) -> DecodingTables:
    """The :class:`DecodingTables` of ``model`` for key windows of up to ``longest`` + 1 positions and
    ``batch_size`` rows: the remembered ones while :func:`weights_key` is unchanged, else made anew."""
    key = weights_key(model, TableShape(longest, clamp_len, batch_size))
    memo = _MEMO.get(model)
    if memo is not None and memo.key == key:
        return memo
    with torch.no_grad():
        param = model.u
        distances = relative_distances(longest + 1, clamp_len=clamp_len, device=param.device)  # (R,)
        pos = sinusoid(distances, model.config.d_model, dtype=param.dtype)  # (R, D)
        layers = tuple(
            _layer_tables(cast(DecoderLayer, layer), pos, u, v, batch_size)
            for layer, (u, v) in zip(model.layers, model._biases(), strict=True)
        )
        output = None
        if model.softmax.n_clusters == 0 and param.device.type == "cpu":
            output = OutputLayout(*model.softmax.cluster_params(0), blocks=_output_blocks(model))
    tables = DecodingTables(key, layers, output)
    _MEMO[model] = tables
    return tables


def step_sizes(model: TransformerXL, cache: KVCache, tables: DecodingTables) -> StepSizes:
    """The :class:`StepSizes` of a model, its cache and the decoding tables made for them."""
    c = model.config
    layer = tables.layers[0]
    return StepSizes(
        n_layer=c.n_layer,
        n_head=c.n_head,
        d_head=c.d_head,
        d_model=c.d_model,
        d_inner=c.d_inner,
        vocab_size=c.vocab_size,
        pre_norm=c.pre_norm,
        final_norm=model.norm is not None,
        plain_output=model.softmax.n_clusters == 0,
        eps=float(layer.attn_norm[3]),
        emb_scale=float(model.embedding.scale),
        batch_size=cache.batch_size,
        slots=cache.capacity,
        distances=layer.attention.rel.shape[-1],
    )


def step_weights(model: TransformerXL, tables: DecodingTables) -> list[Tensor]:
    """The weights a compiled step takes, in its order: per layer ``[u | 0 | 0]``, v - u, the qkv and output
    projections transposed, the distance table (H, Dh, R), the feed-forward weights (transposed) and biases,
    the two norms' weights and biases; then the final norm's (if any) and the output layer's weight
    transposed (E, V) and bias (plain softmax)."""
    weights: list[Tensor] = []
    for layer in tables.layers:
        attn = layer.attention
        h = attn.v_minus_u.shape[0]
        weights += [attn.q_bias, attn.v_minus_u, attn.qkv_t, attn.out_t, attn.rel[:h].contiguous()]
        weights += [*layer.ff, layer.attn_norm[1], layer.attn_norm[2], layer.ff_norm[1], layer.ff_norm[2]]
    if model.norm is not None:
        weights += [model.norm.weight, model.norm.bias]
    if model.softmax.n_clusters == 0:
        weight, bias, proj = model.softmax.cluster_params(0)
        weight_t = weight.t() if proj is None else (weight @ proj.t()).t()  # (D, V)
        weights += [weight_t.contiguous(), bias]
    return [w.detach().contiguous() for w in weights]


class StepKeys(NamedTuple):
    """The keys one decoding step sees, the same in every layer."""

    first: int
    """The first slot in view (``same_length`` leaves the oldest keys out)."""
    bias: Tensor | None = None
    """(B*H, 1, K), 0 where a key may be attended and -inf where it lies before the row's document
    (:func:`document_bias`); None: every key in view, no extra op."""


def attention_step(
    x: Tensor, tables: AttentionTables, rel: Tensor, cache: LayerCache, keys: StepKeys, *, residual: Tensor
) -> Tensor:
    """One new position per row against the cache, no dropout: x (B, D) -> residual + attention (B, D).

    The four terms of the relative score, (q + u)·k + (q + v)·W_R R, with the distance table ``rel``
    (B*H, Dh, K) projected ahead, no shift and no mask (one query; ``keys.first``, the first slot in view,
    leaves the oldest keys out under ``same_length``), and batched matmuls with a plain softmax, which for one query
    cost less than the fused kernel's set-up. Every tensor op costs microseconds of dispatch whatever its
    size, so this path issues few: u rides in the projection as a bias, the scale and the position term enter
    through one ``baddbmm``, the residual through the output projection's ``addmm``.

    ``keys.bias`` rides in the position term's matmul."""
    b, bias = x.shape[0], keys.bias
    h, dh = tables.v_minus_u.shape
    qkv = torch.addmm(tables.q_bias, x, tables.qkv_t).view(b, 3, h, dh)  # (B, 3, H, Dh): q + u | k | v
    k_t, v = cache.append_one(qkv[:, 1:].transpose(0, 1), first=keys.first)  # (B*H, Dh, K), (B*H, K, Dh)
    q_u = qkv[:, 0]  # (B, H, Dh)
    q_v = (q_u + tables.v_minus_u).view(b * h, 1, dh)  # (B*H, 1, Dh)
    scale = tables.scale
    if bias is None:
        position = torch.bmm(q_v, rel)  # (B*H, 1, K): terms (b) + (d)
    else:
        position = torch.baddbmm(bias, q_v, rel)  # (B*H, 1, K): terms (b) + (d), -inf before the document
    score = torch.baddbmm(position, q_u.reshape(b * h, 1, dh), k_t, beta=scale, alpha=scale)  # (B*H, 1, K)
    attn = torch.bmm(torch.softmax(score, dim=-1), v)  # (B*H, 1, Dh)
    return torch.addmm(residual, attn.view(b, h * dh), tables.out_t)  # (B, D)


def feed_forward_step(x: Tensor, weights: tuple[Tensor, Tensor, Tensor, Tensor]) -> Tensor:
    """The feed-forward network on rows x (B, D) -> (B, D), no dropout, with :class:`LayerTables` weights."""
    w1_t, b1, w2_t, b2 = weights
    return torch.addmm(b2, torch.addmm(b1, x, w1_t).relu_(), w2_t)


def layer_step(x: Tensor, tables: LayerTables, rel: Tensor, cache: LayerCache, keys: StepKeys) -> Tensor:
    """One decoder layer (``DecoderLayer.forward``'s maths) on one new position per row: x (B, D) -> (B, D),
    with functions instead of module calls (the per-call overhead is a visible share of a token's time).
    ``keys``: what :func:`attention_step` sees."""
    norm = torch.layer_norm
    attn = tables.attention
    if tables.pre_norm:
        x = attention_step(norm(x, *tables.attn_norm), attn, rel, cache, keys, residual=x)
        return x + feed_forward_step(norm(x, *tables.ff_norm), tables.ff)
    x = norm(attention_step(x, attn, rel, cache, keys, residual=x), *tables.attn_norm)
    return norm(x + feed_forward_step(x, tables.ff), *tables.ff_norm)


def document_bias(reach: Tensor, starts: Tensor | None, *, k: int, heads: int, dtype: torch.dtype) -> Tensor:
    """The additive bias (B*H, 1, K) of one new position per row that keeps its keys within its document:
    of the K keys in view (the last is the new position itself), row b sees the last ``reach[b]`` remembered
    ones, none where ``starts[b]`` (a new document begins at this position); -inf before them, 0 from them on."""
    seen = reach if starts is None else torch.where(starts, 0, reach)  # (B,)
    keys = torch.arange(k, device=reach.device)  # (K,)
    blocked = keys < (k - 1 - seen)[:, None]  # (B, K)
    bias = torch.zeros(blocked.shape, dtype=dtype, device=reach.device).masked_fill_(blocked, float("-inf"))
    return bias[:, None, None, :].expand(-1, heads, 1, k).reshape(-1, 1, k)  # (B*H, 1, K)


@torch.no_grad()
def bind_memory(model: TransformerXL, cache: KVCache) -> None:
    """Project the keys and values of the memory a cache was built with (its unprojected slots) through the
    model, as the first segment through ``forward`` would."""
    for module, layer_cache in zip(model.layers, cache.layers, strict=True):
        state = layer_cache.unprojected()  # (B, P, D)
        if state is None:
            return
        layer = cast(DecoderLayer, module)
        attn = cast(RelativeMultiHeadAttention, layer.attn)
        _, k, v = attn.project(layer.attention_input(state), None)  # (B, H, P, Dh) each
        layer_cache.append(k, v)
    cache.mark_projected()


class _Fast(NamedTuple):
    """What a decoder keeps for its compiled step: the tables and cache slots it was made for, the step, the
    reach that bounds nothing (B,) and the embedding of tokens."""

    tables: DecodingTables
    slots: int
    step: CompiledStep
    every: Tensor
    embed: Callable[[Tensor], Tensor]


class Decoder:
    """Decoding against one key/value cache, one position at a time: :meth:`prefill` feeds a prompt (the
    model's ``forward`` with the cache), :meth:`step` one token per row (the lean path: tables made once).

    The decoder reads the weights through its tables: when they change (:attr:`stale`), :meth:`prefill`
    makes the tables again; :meth:`step` does not check (it runs per token), so change no weight between
    steps. A model in training mode steps through ``forward`` (with its dropout), and so does any module that
    is not a :class:`TransformerXL` but has its ``forward`` (a wrapper, a compiled model): the tables read the
    model's own layers.

    ``compiled=True``: :meth:`step` runs the step compiled ahead of time (:mod:`txl.model.compiled`: the same
    maths as one C++ function of static shapes), compiled on the first step for these sizes (about a minute
    of CPU, once: the package is kept on disk) or loaded; where it cannot be (no C++ compiler; a model off
    the CPU, not in float32, or in training mode) the decoder steps eagerly, with one warning for a missing
    compiler."""

    def __init__(self, model: nn.Module, cache: KVCache, *, compiled: bool = False) -> None:
        if config_of(model).attention != "relative":
            raise ValueError("one-position decoding needs a Transformer-XL with relative attention")
        if not isinstance(compiled, bool):
            raise ValueError(f"compiled must be True or False, got {compiled!r}")
        self.model = model
        self.cache = cache
        self.xl = model if isinstance(model, TransformerXL) else None
        """The model when its layers can be read into tables (None: a wrapper, stepped through its forward)."""
        self.tables = None if self.xl is None else self._tables(self.xl)
        self._rel: tuple[int, list[Tensor]] = (-1, [])
        self.compiled = compiled
        """Whether :meth:`step` runs the compiled step where it can."""
        self._fast: _Fast | None = None

    def _shape(self) -> TableShape:
        cache = self.cache
        return TableShape(cache.longest, cache.span.clamp_len, cache.batch_size)

    def _tables(self, xl: TransformerXL) -> DecodingTables:
        cache = self.cache
        return decoding_tables(
            xl, longest=cache.longest, clamp_len=cache.span.clamp_len, batch_size=cache.batch_size
        )

    @property
    def stale(self) -> bool:
        """Whether a weight changed since the tables were made (or the thread count moved)."""
        if self.tables is None or self.xl is None:
            return False
        return weights_key(self.xl, self._shape()) != self.tables.key

    def prefill(self, tokens: Tensor, *, starts: Tensor | None = None, chunk: int | None = None) -> Tensor:
        """Feed tokens (B, T) through the model with the cache, ``chunk`` positions at a time (default: all),
        and return the log-probabilities (B, V) of the next token. ``starts`` (B, T) bool: where documents
        begin (as ``TransformerXL.forward``; e.g. at each row's first token of a left-padded batch)."""
        if self.stale and self.xl is not None:
            self.tables, self._rel, self._fast = self._tables(self.xl), (-1, []), None
        step = tokens.shape[1] if chunk is None else chunk
        for start in range(0, tokens.shape[1], step):
            part = None if starts is None else starts[:, start : start + step]
            out = self.model(tokens[:, start : start + step], cache=self.cache, last_only=True, starts=part)
        return out.log_probs[:, -1]

    def _distances(self, tables: DecodingTables, k: int) -> list[Tensor]:
        """Each layer's distance table sliced to the K keys in view (kept while K stays)."""
        if self._rel[0] != k:
            self._rel = (k, [layer.attention.rel[:, :, -k:] for layer in tables.layers])  # (B*H, Dh, K)
        return self._rel[1]

    @torch.no_grad()
    def step(self, token: Tensor, *, starts: Tensor | None = None) -> Tensor:
        """One token per row, (B,) int64 -> log-probabilities (B, V) of the next one; the cache slides.
        ``starts`` (B,) bool: rows whose token begins a new document (it attends to nothing remembered)."""
        model, cache, tables, xl = self.model, self.cache, self.tables, self.xl
        if starts is not None and (
            not isinstance(starts, Tensor) or starts.dtype != torch.bool or starts.shape != token.shape
        ):
            got = (
                f"{starts.dtype} {tuple(starts.shape)}"
                if isinstance(starts, Tensor)
                else type(starts).__name__
            )
            raise ValueError(
                f"starts must be a bool tensor of the token's shape {tuple(token.shape)}, got {got}"
            )
        if model.training or tables is None or xl is None:
            column = None if starts is None else starts[:, None]
            return model(token[:, None], cache=cache, last_only=True, starts=column).log_probs[:, -1]
        if cache.projected != cache.end:
            bind_memory(xl, cache)
        span = cache.span
        cache.make_room(1)
        k = cache.length + 1
        if span.same_length:  # with a full memory the oldest key is out of view (attention_mask's rule)
            k = min(k, span.mem_len)
        first = cache.end + 1 - k
        fast = self._compiled_step(xl, tables) if self.compiled else None
        if fast is not None:
            return self._step_compiled(fast, token, starts, first)
        bias = None  # documents: the keys before each row's own are out of view
        if starts is not None or cache.reach is not None:
            bias = document_bias(
                cache.full_reach(), starts, k=k, heads=xl.config.n_head, dtype=cache.dtype
            )  # (B*H, 1, K)
        h = xl.embedding(token[:, None])[:, 0]  # (B, D)
        inputs, keys = [], StepKeys(first, bias)
        for layer, rel, layer_cache in zip(
            tables.layers, self._distances(tables, k), cache.layers, strict=True
        ):
            inputs.append(h)
            h = layer_step(h, layer, rel, layer_cache, keys)
        cache.store_inputs(inputs)
        cache.advance(1, starts=None if starts is None else starts[:, None])
        if xl.norm is not None:
            h = xl.norm(h)
        return self.log_probs(h)

    def _compiled_step(self, xl: TransformerXL, tables: DecodingTables) -> _Fast | None:
        """The compiled step for these tables and the cache's slots (made or loaded on first use), or None
        where there is none (then the eager step runs)."""
        fast, cache = self._fast, self.cache
        if fast is not None and fast.tables is tables and fast.slots == cache.capacity:
            return fast
        if unsupported(xl, cache) is not None:
            self.compiled = False
            return None
        step = compiled_step(step_sizes(xl, cache, tables), step_weights(xl, tables))
        if step is None:
            self.compiled = False
            return None
        every = torch.full((cache.batch_size,), cache.capacity, dtype=torch.int64)  # (B,): no document bound
        self._fast = _Fast(tables, cache.capacity, step, every, embedder(xl))
        return self._fast

    def _step_compiled(
        self,
        fast: _Fast,
        token: Tensor,
        starts: Tensor | None,
        first: int,
    ) -> Tensor:
        """:meth:`step` through the compiled step, from ``first``, the first slot in view (room made)."""
        cache, xl = self.cache, cast(TransformerXL, self.xl)
        step, every, embed = fast.step, fast.every, fast.embed
        end = cache.end
        step.slots[0], step.slots[1] = end, first
        seen = every
        if starts is not None or cache.reach is not None:
            reach = cache.full_reach()  # (B,)
            seen = reach if starts is None else torch.where(starts, 0, reach)
        x = embed(token)  # (B, D)
        out, new_kv, inputs = step(x, seen, cache.kv, cache.hidden)
        cache.kv.select(4, end).copy_(new_kv)  # (L, 2, B, H, Dh)
        cache.hidden.select(2, end).copy_(inputs)  # (L, B, D)
        cache.advance(1, starts=None if starts is None else starts[:, None])
        return out if step.sizes.plain_output else xl.softmax.log_prob(out)

    def log_probs(self, hidden: Tensor) -> Tensor:
        """Log-probabilities (N, V) of final hidden states (N, D), with the output layer in column blocks
        where the tables have it."""
        output = None if self.tables is None else self.tables.output
        if output is None:
            xl = self.xl if self.xl is not None else cast(TransformerXL, self.model)
            return xl.softmax.log_prob(hidden)
        scores = output.scores(hidden)  # (N, V): the plain softmax of log_prob, its weight laid out ahead
        return torch.log_softmax(
            scores.float() if scores.dtype in (torch.float16, torch.bfloat16) else scores, dim=-1
        )
