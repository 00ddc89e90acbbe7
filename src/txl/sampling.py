"""Pure sampling: the settings of one draw (:class:`SamplingSettings`), the top-k and nucleus filters, and one
token per row from next-token scores. No model here: the decoding loop is :mod:`txl.generate`'s.

Dimensions: B batch, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .config import check_sampling

__all__ = ["SamplingSettings", "GREEDY", "filter_logits", "sample_next", "draw"]


@dataclass(frozen=True)
class SamplingSettings:
    """How one token is drawn from the model's scores; checked when built (:func:`txl.config.check_sampling`,
    the rule :class:`~txl.config.GenerateConfig` uses), so a loop that holds one never checks again."""

    temperature: float = 1.0
    """The scores are divided by it before the softmax; 0 is greedy (argmax, the lower id on ties)."""
    top_k: int | None = None
    """Keep the k highest scores (None: all)."""
    top_p: float | None = None
    """Keep the smallest set of most likely tokens whose probability reaches p (None or 1: all)."""

    def __post_init__(self) -> None:
        check_sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    @property
    def filters(self) -> bool:
        """Whether top-k or top-p can remove a token."""
        return self.top_k is not None or (self.top_p is not None and self.top_p < 1)


GREEDY = SamplingSettings(temperature=0.0)
"""Greedy decoding."""


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
        mass_before = torch.cat(
            [torch.zeros_like(mass[..., :1]), mass[..., :-1]], dim=-1
        )  # better-ranked mass
        keep_sorted = mass_before < top_p  # rank 0 has mass_before 0 < p: always kept
        keep = torch.gather(keep_sorted, -1, ranks)  # (..., V) back to token order
        out = out.masked_fill(~keep, float("-inf"))
    return out


def draw(
    logprobs: Tensor,
    settings: SamplingSettings,
    *,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
) -> Tensor:
    """One token id per row (B,) int64 from ``logprobs`` (B, V) with ``settings`` (checked when they were
    built, so nothing is checked here: this runs once per generated token). ``generator``: one for all rows,
    or a sequence of one per row (row r drawn from ``generator[r]`` alone, as a batch of one would be)."""
    if logprobs.dtype in (torch.float16, torch.bfloat16):
        logprobs = logprobs.float()
    if settings.temperature == 0:
        return torch.argmax(logprobs, dim=-1)  # (B,)
    scores = logprobs / settings.temperature
    if settings.filters:
        scores = filter_logits(scores, top_k=settings.top_k, top_p=settings.top_p)
    probs = torch.softmax(scores, dim=-1)  # (B, V)
    if isinstance(generator, (list, tuple)):
        rows = [torch.multinomial(p[None], 1, generator=g) for p, g in zip(probs, generator, strict=True)]
        return torch.cat(rows).squeeze(-1)  # (B,)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token id per row (B,) int64 from next-token scores ``logits`` (B, V) (raw logits or log-probs).

    ``temperature`` 0 is greedy (argmax, the lower id on ties; top-k/top-p cannot change it). Otherwise the
    scores are divided by the temperature, filtered by :func:`filter_logits`, and one token is drawn with
    ``generator`` (the global generator when None)."""
    settings = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p)
    if logits.dim() != 2 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be (batch, vocab), got shape {tuple(logits.shape)}")
    return draw(logits, settings, generator=generator)
