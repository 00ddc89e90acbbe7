"""A request's values checked against the run and the server's limits (each refusal a 400 naming its field):
prompts read as ``txl generate`` reads them, sampling settings, OpenAI's fields accepted at no-op values."""

# Dimensions: P prompt tokens.

from __future__ import annotations

import json
import secrets
import warnings
from dataclasses import dataclass

import torch
from torch import Tensor

from ..config import GenerateConfig
from ..inference import SamplingParams
from ..inference.params import MAX_SEED
from ..inference.text import UnknownTokensWarning, describe_unknown, read_prompt
from ..runs import LoadedRun
from .openai import CompletionRequest, RequestError

__all__ = [
    "MAX_STOP",
    "Limits",
    "check_model",
    "check_text",
    "encode_text",
    "prompt_ids",
    "prompts_of",
    "params_of",
]

MAX_STOP = 4
"""Stop strings per request (OpenAI's limit)."""


@dataclass(frozen=True)
class Limits:
    """The server's limits a request is checked against (from its ``ServeSettings``)."""

    max_tokens: int
    max_prompt_chars: int
    max_batch: int
    default_max_tokens: int


def check_model(requested: str | None, *, served: str) -> None:
    """Refuse (404 naming ``model``) a request for a model other than the one served (None: the one served)."""
    if requested is not None and requested != served:
        raise RequestError(
            404,
            f"model: no model {requested!r} here; this server serves {served!r} (GET /v1/models), or leave "
            "model out",
            param="model",
            kind="not_found_error",
        )


def check_text(text: str, *, field_name: str, limit: int) -> None:
    """Refuse (400 naming ``field_name``) a text longer than ``limit`` characters."""
    if len(text) > limit:
        raise RequestError(
            400,
            f"{field_name} has {len(text)} characters, more than this server takes ({limit}; "
            "its max_prompt_chars)",
            param=field_name,
        )


def encode_text(run: LoadedRun, text: str, *, field_name: str) -> tuple[Tensor, list[str]]:
    """(P,) ids of ``text``, and warnings: a word vocabulary reads unknown words as <unk> (as ``txl
    generate``), other vocabularies refuse characters they have never seen (400 naming the field)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnknownTokensWarning)
            ids, missing = read_prompt(run.vocab, text)  # (P,), as txl generate reads its prompt
    except ValueError as exc:
        raise RequestError(400, f"{field_name}: {exc}", param=field_name) from None
    notes = []
    if missing:
        notes.append(
            f"{len(missing)} word(s) of {field_name} not in the vocabulary, read as <unk>: {describe_unknown(missing)}"
        )
    return ids, notes


def prompt_ids(run: LoadedRun, prompt: str | list[int], *, limit: int) -> tuple[Tensor, list[str]]:
    """(P,) ids of a prompt given as text or as token ids (each in the vocabulary: else a 400 naming it)."""
    if isinstance(prompt, str):
        check_text(prompt, field_name="prompt", limit=limit)
        return encode_text(run, prompt, field_name="prompt")
    size = len(run.vocab)
    if len(prompt) > limit:
        raise RequestError(
            400, f"prompt has {len(prompt)} token ids, more than this server takes ({limit})", param="prompt"
        )
    bad = [i for i in prompt if not 0 <= i < size]
    if bad:
        raise RequestError(400, f"prompt: token ids must be in [0, {size}), got {bad[:5]}", param="prompt")
    return torch.tensor(prompt, dtype=torch.long), []


def prompts_of(prompt: str | list[int] | list[str] | list[list[int]]) -> list[str | list[int]]:
    """The prompts of a request: one (a text or token ids) or a list of them."""
    if isinstance(prompt, str) or all(isinstance(p, int) for p in prompt):
        return [prompt]  # type: ignore[list-item]
    if not prompt:
        return [[]]
    return list(prompt)  # type: ignore[arg-type]


def _no_ops(req: CompletionRequest) -> None:
    """Refuse OpenAI's fields that this server does not apply, unless at their no-op values."""
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value not in (None, 0):
            raise RequestError(
                400,
                f"{name}: only 0 is supported (this server applies no penalties), got {value}",
                param=name,
            )
    if req.logit_bias:
        raise RequestError(
            400, "logit_bias: not supported (only an empty object is accepted)", param="logit_bias"
        )
    if req.suffix:
        raise RequestError(400, "suffix: not supported (only an empty string is accepted)", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise RequestError(
            400,
            f"best_of: only best_of = n is supported (no ranking of choices), got {req.best_of}",
            param="best_of",
        )


def params_of(
    req: CompletionRequest, *, defaults: GenerateConfig, limits: Limits, prompts: int
) -> SamplingParams:
    """How a completion request samples: its fields, else the run's ``[generate]`` settings; a seed always
    (drawn at random when the request has none; a negative one as ``torch.Generator.manual_seed`` reads it).
    What the reply holds (``echo``, ``logprobs``) stays the request's."""
    _no_ops(req)
    max_tokens = req.max_tokens if req.max_tokens is not None else limits.default_max_tokens
    if max_tokens > limits.max_tokens:
        raise RequestError(
            400,
            f"max_tokens: {max_tokens} is above this server's limit of {limits.max_tokens} (its max_tokens)",
            param="max_tokens",
        )
    if max_tokens == 0 and not req.echo:
        raise RequestError(
            400, "max_tokens: 0 generates nothing; it needs echo (to score the prompt)", param="max_tokens"
        )
    if req.n * prompts > limits.max_batch:
        raise RequestError(
            400,
            f"n: {req.n} choices of {prompts} prompt(s) are more than the rows this server decodes at once "
            f"({limits.max_batch}; its max_batch)",
            param="n",
        )
    stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
    if len(stop) > MAX_STOP or any(not s for s in stop):
        raise RequestError(
            400, f"stop: at most {MAX_STOP} non-empty strings, got {json.dumps(req.stop)[:60]}", param="stop"
        )
    seed = req.seed if req.seed is not None else secrets.randbits(63)
    return SamplingParams.from_config(
        defaults,
        max_new_tokens=max_tokens,
        **{k: v for k in ("temperature", "top_k", "top_p") if (v := getattr(req, k)) is not None},
        seed=seed % (MAX_SEED + 1),
        stop=stop,
    )
