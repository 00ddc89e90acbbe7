"""Pure sampling: the top-k and nucleus filters, and one token per row from next-token scores, as a
:class:`~txl.inference.params.SamplingParams` says. No model here: the engine is :mod:`.engine`'s."""

# Dimensions: B batch, V vocabulary.

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..config import check_sampling
from .params import SamplingParams

__all__ = ["filter_logits", "sample_next", "draw"]


def _ranks(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Sort descending with ties broken by the lower token id; returns (sorted values, rank of every entry)."""
    values, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # (..., V)
    return values, torch.argsort(order, dim=-1)  # (..., V) rank of each token id


def filter_logits(logits: Tensor, *, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """A copy of ``logits`` (..., V) with the entries outside the top-k and then outside the nucleus set to -inf.

    ``top_k`` keeps the k highest scores. ``top_p`` keeps the smallest set of most likely tokens whose
    probability (softmax of the top-k-filtered scores) reaches p, and always at least the most likely token.
    Ties are broken deterministically in favour of the lower token id. The input is not modified."""
    check_sampling(top_k=top_k, top_p=top_p)
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be (..., V) with V >= 1, got shape {tuple(logits.shape)}")
    out = logits.clone()
    if top_k is not None and top_k < out.shape[-1]:
        _, ranks = _ranks(out)
        out = out.masked_fill(ranks >= top_k, float("-inf"))
    if top_p is not None and top_p < 1:
        values, ranks = _ranks(out)
        low_precision = values.dtype in (torch.float16, torch.bfloat16)
        probs = torch.softmax(values.float() if low_precision else values, dim=-1)
        mass = torch.cumsum(probs, dim=-1)  # (..., V)
        # the mass of the better-ranked tokens: rank 0 has 0 < p, so it is always kept
        mass_before = torch.cat([torch.zeros_like(mass[..., :1]), mass[..., :-1]], dim=-1)
        keep = torch.gather(mass_before < top_p, -1, ranks)  # (..., V) back to token order
        out = out.masked_fill(~keep, float("-inf"))
    return out


def draw(
    log_probs: Tensor,
    params: SamplingParams,
    *,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
) -> Tensor:
    """One token id per row (B,) int64 from ``log_probs`` (B, V) with the params' temperature, top-k and
    top-p (checked when the params were built, so nothing is checked here: this runs once per token).
    ``generator``: one for all rows, or a sequence of one per row (row r drawn from ``generator[r]`` alone,
    as a batch of one would be)."""
    if log_probs.dtype in (torch.float16, torch.bfloat16):
        log_probs = log_probs.float()
    if params.greedy:
        return torch.argmax(log_probs, dim=-1)  # (B,)
    scores = log_probs / params.temperature
    if params.filters:
        scores = filter_logits(scores, top_k=params.top_k, top_p=params.top_p)
    probs = torch.softmax(scores, dim=-1)  # (B, V)
    if generator is None or isinstance(generator, torch.Generator):
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)
    rows = [torch.multinomial(p[None], 1, generator=g) for p, g in zip(probs, generator, strict=True)]
    return torch.cat(rows).squeeze(-1)  # (B,)


def sample_next(
    logits: Tensor,
    params: SamplingParams = SamplingParams(),
    *,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token id per row (B,) int64 from next-token scores ``logits`` (B, V) (raw logits or log-probs),
    as :func:`draw` with the shape checked: temperature 0 (or below
    :data:`~txl.inference.params.GREEDY_BELOW`) is greedy (argmax, the lower id on ties; top-k and top-p
    cannot change it); otherwise the scores are divided by the temperature, filtered by
    :func:`filter_logits`, and one token is drawn with ``generator`` (the global generator when None)."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    if not isinstance(logits, Tensor) or logits.dim() != 2 or logits.shape[-1] == 0:
        shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
        raise ValueError(f"logits must be (batch, vocab), got {shape}")
    return draw(logits, params, generator=generator)
