"""What a request asks (:class:`SamplingParams`: its own tokens, filters, stops and seed) apart from how an
engine decodes (:class:`DecodeSettings`: lengths, window, prompt chunks, rows), both frozen and checked when
built, with a ValueError that names the field."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..config import ConfigError, GenerateConfig, Span, check_sampling, positive_int

__all__ = [
    "SamplingParams",
    "DecodeSettings",
    "GREEDY",
    "GREEDY_BELOW",
    "DEFAULT_CONTEXT",
    "DEFAULT_MAX_NEW_TOKENS",
    "MAX_SEED",
]

DEFAULT_CONTEXT = 512
"""Window (tokens) recomputed at every step when the model has no memory and ``context`` is not given."""

DEFAULT_MAX_NEW_TOKENS = 100
"""Tokens generated when ``max_new_tokens`` is not given."""

MAX_SEED = 2**64 - 1
"""The largest seed a ``torch.Generator`` takes."""


def _non_negative(name: str, value: Any, *, optional: bool = False, high: int | None = None) -> None:
    if optional and value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or value < 0
        or (high is not None and value > high)
    ):
        bound = "" if high is None else f" and <= {high}"
        raise ValueError(
            f"{name} must be an integer >= 0{bound}{' or None' if optional else ''}, got {value!r}"
        )


def _stop_ids(value: Sequence[int] | Tensor | None) -> tuple[int, ...] | None:
    if value is None:
        return None
    message = f"stop_ids must be a non-empty sequence of token ids, got {value!r:.80}"
    try:
        ids = torch.as_tensor(value).reshape(-1)
    except (TypeError, ValueError, RuntimeError):
        raise ValueError(message) from None
    if ids.numel() == 0 or ids.dtype == torch.bool or ids.dtype.is_floating_point or ids.dtype.is_complex:
        raise ValueError(message)
    out = tuple(int(i) for i in ids.tolist())
    if min(out) < 0:
        raise ValueError(f"stop_ids must be token ids >= 0, got {list(out)}")
    return out


def _stop(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ValueError(f"stop must be a list of non-empty strings, got {value!r:.80}")
    if any(not isinstance(s, str) or not s for s in value):
        raise ValueError(f"stop must be a list of non-empty strings, got {value!r:.80}")
    return tuple(value)


@dataclass(frozen=True)
class SamplingParams:
    """What one request asks, whatever else is decoded beside it (as vLLM's ``SamplingParams``). Every field
    is checked when the value is built (a ValueError naming the field); derive variants with
    ``dataclasses.replace``.

        params = SamplingParams(max_new_tokens=50, temperature=0.8, top_p=0.9, stop_ids=(eos,), seed=0)
        generate(model, prompt, params)

    A request with a ``seed`` draws from a generator of its own seeded with it, so it samples the same
    tokens alone or in any batch (:class:`~txl.inference.engine.Engine`)."""

    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    """Tokens to generate (fewer when one of ``stop_ids`` comes first). 0 is allowed by the text-level
    functions (no model runs); the engine, :func:`~txl.inference.loop.generate` and ``stream`` need at
    least 1."""
    temperature: float = 1.0
    """The log-probabilities are divided by it before the softmax; 0 is greedy (argmax, the lower id on
    ties), and so is any temperature below :data:`GREEDY_BELOW` (1e-5)."""
    top_k: int | None = None
    """Keep the k most likely tokens (None: all)."""
    top_p: float | None = None
    """Keep the smallest set of most likely tokens whose probability reaches p (None or 1: all)."""
    stop_ids: tuple[int, ...] | None = None
    """The request ends at the first of these token ids, which is its last token (any sequence or tensor of
    ids is accepted and stored as a tuple)."""
    stop: tuple[str, ...] = ()
    """Strings that end the request's text as soon as it contains one (the text is cut before it): read by
    the faces that have a vocabulary (the text functions, the harness, ``txl serve``); the token-level
    ``generate`` and ``stream`` refuse them."""
    seed: int | None = None
    """Seed of the request's own random generator (None: a seed drawn from the engine's generator when the
    request is admitted, torch's global generator by default)."""

    def __post_init__(self) -> None:
        _non_negative("max_new_tokens", self.max_new_tokens)
        check_sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        object.__setattr__(self, "stop_ids", _stop_ids(self.stop_ids))
        object.__setattr__(self, "stop", _stop(self.stop))
        _non_negative("seed", self.seed, optional=True, high=MAX_SEED)

    @classmethod
    def from_config(cls, config: GenerateConfig, **changes: Any) -> SamplingParams:
        """The sampling of a run's ``[generate]`` section (max_new_tokens, temperature, top_k, top_p), with
        ``changes`` (fields of this class) over it."""
        fields = {
            "max_new_tokens": config.max_new_tokens,
            "temperature": config.temperature,
            "top_k": config.top_k,
            "top_p": config.top_p,
        }
        return cls(**{**fields, **changes})

    @property
    def greedy(self) -> bool:
        """Whether the request takes the most likely token at every step: ``temperature`` is 0 or below
        :data:`GREEDY_BELOW`."""
        return self.temperature < GREEDY_BELOW

    @property
    def filters(self) -> bool:
        """Whether top-k or top-p can remove a token."""
        return self.top_k is not None or (self.top_p is not None and self.top_p < 1)


GREEDY_BELOW = 1e-5
"""A temperature below this is greedy, as 0 is: dividing the scores by a smaller one can overflow them (1e-46
is 0 in float32), and a draw at this one differs from the argmax only between log-probabilities closer than
about 1e-4."""

GREEDY = SamplingParams(temperature=0.0)
"""Greedy decoding with the other defaults."""


@dataclass(frozen=True)
class DecodeSettings:
    """How an :class:`~txl.inference.engine.Engine` decodes, the same for all its requests: the lengths of
    the model's memory, the window of a model without memory, the prompt chunk, and the rows decoded at
    once. Checked when built (a ValueError naming the field).

        engine = Engine(model, DecodeSettings(span=Span(mem_len=256), rows=16))
    """

    span: Span | None = None
    """Memory length, clamp and same-length attention (None: the model's)."""
    context: int | None = None
    """Window recomputed at every step on the memoryless path (None: :data:`DEFAULT_CONTEXT`)."""
    prompt_chunk: int | None = None
    """Prompt tokens fed at once on the memory path (None: ``span.mem_len``)."""
    rows: int | None = None
    """The rows decoded at once: requests beyond them wait for a row (None: as many as the requests
    waiting at the first step, which is what :func:`~txl.inference.loop.generate` gives its prompts)."""
    compiled: bool = False
    """Step the memory path through the step compiled ahead of time (:mod:`txl.model.compiled`: C++ of the
    same maths, 1.2-1.6x faster per token on the CPU in float32, most with small vocabularies). It is compiled on the first step for the
    sizes at hand, about a minute of CPU once, then kept on disk (loaded in well under a second by later
    processes), so it pays off for long generations and servers, not for a short generation in a fresh
    setup. Where no C++ compiler runs, decoding is eager, with one warning."""

    def __post_init__(self) -> None:
        if self.span is not None and not isinstance(self.span, Span):
            raise ConfigError(f"span must be a txl Span, got {type(self.span).__name__}")
        positive_int(self.context, "context", optional=True, field=False)
        positive_int(self.prompt_chunk, "prompt_chunk", optional=True, field=False)
        positive_int(self.rows, "rows", optional=True, field=False)
        if not isinstance(self.compiled, bool):
            raise ConfigError(f"compiled must be True or False, got {self.compiled!r}")
