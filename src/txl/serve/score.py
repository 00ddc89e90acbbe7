"""The model's surprisal at every token of a text, segment by segment with or without memory, the lengths a
run is scored with, and the text each token stands for. Torch only."""

# Dimensions: N tokens of the text, T segment length.

from __future__ import annotations

import warnings
from collections.abc import Callable, Generator, Sequence
from contextlib import closing
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from ..config import EvalLengths, RunConfig, SameLengthOff, Span, eval_lengths, positive_int
from ..evaluation import EvalSettings, SegmentLosses, segment_losses
from ..model import TransformerXL

__all__ = ["Scores", "score_tokens", "score_segments", "scores_of", "token_pieces", "scoring_lengths"]


@dataclass(frozen=True)
class Scores:
    """What :func:`score_tokens` returns."""

    losses: Tensor
    """(N - 1,) float64 negative log-likelihood in nats of tokens 1..N-1, each given all tokens before it
    that the model sees (the first token has no context and is not scored)."""
    tgt_len: int
    """The segment length used."""
    span: Span
    """The memory length, clamp and same-length setting used (mem_len 0 without memory)."""

    @property
    def mean_loss(self) -> float:
        """The mean loss in nats (nan with no token scored)."""
        return float(self.losses.mean()) if self.losses.numel() else float("nan")


def scoring_lengths(config: RunConfig, *, memory: bool) -> EvalLengths:
    """The segment length and span a run is evaluated with when ``txl eval`` is given no flags (the one
    resolver, :func:`~txl.config.eval_lengths`): the run's ``[eval]`` settings, else its model's and training's.
    ``memory=False`` is ``txl eval --mem-len 0``: same-length attention then goes off (it needs a memory;
    the answer's span says so, the warning is not repeated). The vanilla baseline always has no memory."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SameLengthOff)
        given = None if memory or config.model.attention != "relative" else 0
        return eval_lengths(config, mem_len=given)


def score_segments(
    model: TransformerXL, ids: Tensor, lengths: EvalLengths, losses: list[Tensor]
) -> Generator[None, None, None]:
    """:func:`score_tokens` one segment at a time: each ``next`` reads one segment and appends its losses
    (T,) to ``losses`` (so a caller can do other work between segments; closing it stops)."""
    if ids.dim() != 1 or ids.numel() < 2:
        raise ValueError(f"scoring needs at least 2 tokens, got {ids.numel()}")
    positive_int(lengths.tgt_len, "tgt_len", error=ValueError, field=False)
    # txl eval's loop (a generator: closed early, it restores the training flags now)
    settings = EvalSettings(lengths.tgt_len, batch_size=1, span=lengths.span)
    segments = cast(Generator[SegmentLosses, None, None], segment_losses(model, ids[None], settings))
    with closing(segments):  # stopped early: the generator restores the training flags now
        for segment in segments:
            losses.append(segment.loss[0].cpu())  # (T,)
            yield None


def scores_of(losses: list[Tensor], lengths: EvalLengths) -> Scores:
    """The :class:`Scores` of the segments' losses collected by :func:`score_segments`."""
    joined = torch.cat(losses) if losses else torch.zeros(0, dtype=torch.float64)
    return Scores(joined, lengths.tgt_len, lengths.span)


@torch.inference_mode()
def score_tokens(
    model: TransformerXL,
    ids: Tensor,
    lengths: EvalLengths,
    *,
    should_stop: Callable[[], bool] | None = None,
) -> Scores:
    """Per-token losses of ``ids`` (N,) int64: tokens 1..N-1 predicted segment by segment of
    ``lengths.tgt_len`` targets, each segment attending over the memory of the previous ones when
    ``lengths.span.mem_len > 0`` and over itself only when it is 0 (:func:`scoring_lengths` gives a run's). This is exactly ``txl eval`` on the same tokens with batch size 1.
    ``should_stop`` is asked between segments; when it says True the losses so far are returned."""
    losses: list[Tensor] = []
    with closing(score_segments(model, ids, lengths, losses)) as segments:
        while should_stop is None or not should_stop():
            if next(segments, StopIteration) is StopIteration:
                break
    return scores_of(losses, lengths)


def token_pieces(decode: Callable[[Sequence[int]], str], ids: Sequence[int], *, window: int = 8) -> list[str]:
    """The text each token adds, for showing tokens one by one: the decoding of a few tokens up to it minus
    the decoding of those before it (so word vocabularies get their spaces). A byte that only starts a
    UTF-8 character shows nothing; the byte that completes it shows the character. Joined, the pieces are
    the decoded text, up to vocabularies whose decoding of a token depends on more than ``window`` tokens."""
    pieces = []
    for i in range(len(ids)):
        start = max(0, i - window)
        before = decode(ids[start:i]).rstrip("\ufffd") if i > start else ""
        upto = decode(ids[start : i + 1])
        if i < len(ids) - 1:
            upto = upto.rstrip("\ufffd")
        common = 0
        for a, b in zip(before, upto, strict=False):
            if a != b:
                break
            common += 1
        pieces.append(upto[common:])
    return pieces
