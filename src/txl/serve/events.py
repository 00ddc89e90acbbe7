"""What ``txl serve``'s works give, as plain values: the text events a client is sent, and the results of
completions and scores (:mod:`txl.serve.openai` gives them their wire shapes)."""

from __future__ import annotations

from dataclasses import dataclass

from ..config import Span

__all__ = ["TokenInfo", "TextEvent", "ChoiceResult", "CompletionResult", "ScoreResult"]


@dataclass(frozen=True)
class TokenInfo:
    """One token's text and log-probability (None: the first token of a text, which has no context), its
    ``logprobs`` most likely alternatives, and where its text starts in the choice's text."""

    piece: str
    logprob: float | None
    top: dict[str, float] | None
    offset: int


@dataclass(frozen=True)
class TextEvent:
    """Text for a client: choice ``index``'s new text, and its tokens when log-probabilities were asked."""

    index: int
    text: str
    tokens: tuple[TokenInfo, ...] | None


@dataclass(frozen=True)
class ChoiceResult:
    """One choice's text, why it ended (``stop`` or ``length``), and its tokens (with log-probabilities)."""

    index: int
    text: str
    finish: str
    tokens: tuple[TokenInfo, ...] | None


@dataclass(frozen=True)
class CompletionResult:
    """A completion's choices, the tokens generated, and the seconds it took."""

    choices: tuple[ChoiceResult, ...]
    completion_tokens: int
    seconds: float


@dataclass(frozen=True)
class ScoreResult:
    """A text scored: per-token (id, text, log-probability or None) and the lengths used."""

    tokens: tuple[tuple[int, str, float | None], ...]
    losses: tuple[float, ...]
    tgt_len: int
    span: Span
    tokens_read: int | None = None  # a session's total
