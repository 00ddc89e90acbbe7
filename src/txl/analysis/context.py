"""Per-token losses and predictions over a token array with the context of every prediction under control:
streams read in segments with memory (:func:`stream_losses`) and sliding windows (:func:`sliding_losses`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..config import ConfigError, positive_int
from ..evaluation import EvalSettings, SegmentLosses, segment_losses
from ..model import TransformerXL, eval_mode

# Dimensions: N tokens, B rows, L row length, T segment or window length, W windows in a chunk, S stride,
# D model size, V vocabulary.

__all__ = [
    "WindowSettings",
    "absolute_hidden",
    "stream_losses",
    "stream_predictions",
    "sliding_losses",
    "sliding_predictions",
]


@dataclass(frozen=True)
class WindowSettings:
    """How the vanilla model reads a token array by sliding windows, the paper's protocol for it: each
    prediction made by a window of the ``window`` tokens before it, recomputed from scratch. With ``stride``
    s a window predicts its last s tokens (s = 1 is the paper's protocol). The windows of a chunk run as one
    batch and only the predicted positions reach the softmax (:func:`absolute_hidden`)."""

    window: int
    """Tokens a prediction sees (T)."""
    stride: int = 1
    """Targets each window predicts, its last ones (S, at most ``window``)."""
    batch_size: int = 64
    """Windows per forward (W)."""
    progress: bool = False
    """Show a progress bar."""
    desc: str = "sliding"
    """The progress bar's label."""

    def __post_init__(self) -> None:
        positive_int(self.window, "window")
        positive_int(self.batch_size, "batch_size")
        if not 1 <= self.stride <= self.window:
            raise ConfigError(
                f"stride: need 1 <= stride <= window, got window={self.window}, stride={self.stride}"
            )


@contextmanager
def _evaluating(model: TransformerXL) -> Iterator[None]:
    """Eval mode (:func:`txl.model.eval_mode`) and inference mode inside."""
    with eval_mode(model), torch.inference_mode():
        yield


def _as_tensor(tokens: np.ndarray | Tensor, device: torch.device) -> Tensor:
    if isinstance(tokens, Tensor):
        return tokens.to(device=device, dtype=torch.long).reshape(-1)
    return torch.from_numpy(np.asarray(tokens, dtype=np.int64).reshape(-1)).to(device)


def _device(model: TransformerXL) -> torch.device:
    return next(model.parameters()).device


def _check_first(first: int, n: int) -> None:
    if not 1 <= first < n:
        raise ValueError(f"first must be in 1..{n - 1} for {n} tokens, got {first}")


# ---------------------------------------------------------------------------------------------------------
# Stream: rows read segment by segment, carrying memory
# ---------------------------------------------------------------------------------------------------------


def _stream(
    model: TransformerXL,
    tokens: np.ndarray | Tensor,
    settings: EvalSettings,
    first: int,
    read: Callable[[SegmentLosses], Tensor],
    with_targets: bool,
) -> np.ndarray:
    """Run the rows segment by segment (:func:`txl.evaluation.segment_losses`, the protocol of ``txl eval``) and
    return ``read(segment)`` (B, T) for targets first..N-1."""
    device = _device(model)
    ids = _as_tensor(tokens, device)
    n = ids.numel()
    _check_first(first, n)
    tgt_len, batch_size, span = settings.resolved(model)
    rows = min(batch_size, n - first)
    per_row = math.ceil((n - first) / rows)  # counted targets per row (C)
    length = first - 1 + per_row  # inputs per row (L): first - 1 warm-up targets, then C counted ones
    # (B, L+1)
    index = (
        torch.arange(rows, device=device)[:, None] * per_row
        + torch.arange(length + 1, device=device)[None, :]
    )
    padded = ids[index.clamp(max=n - 1)].masked_fill(index >= n, 0)  # (B, L+1), zeros past the end
    evaluation = replace(settings, span=span, batch_size=rows, log_probs=not with_targets, max_tokens=None)
    segments = segment_losses(model, padded, evaluation)
    pieces = []
    with torch.inference_mode():
        steps = math.ceil(length / tgt_len)
        desc = settings.name or "stream"
        bar = tqdm(segments, total=steps, desc=desc, disable=not settings.progress, leave=False)
        for segment in bar:
            pieces.append(read(segment).double().cpu())  # (B, T)
    values = torch.cat(pieces, dim=1)[:, first - 1 :]  # (B, C): the counted targets, row after row
    return values.reshape(-1)[: n - first].numpy()


def stream_losses(
    model: TransformerXL, tokens: np.ndarray | Tensor, settings: EvalSettings, *, first: int = 1
) -> np.ndarray:
    """Loss in nats (float64) of every target ``first .. N-1`` (target t is ``tokens[t]`` given the tokens
    before it), reading the array as a stream as ``settings`` says (the protocol of ``txl eval``): cut into
    ``batch_size`` contiguous rows (fewer when the array has fewer targets), each read in segments of
    ``tgt_len`` tokens carrying the memory of ``span`` (the model's when None), every target predicted once;
    ``name`` labels the progress bar. Each row starts ``first - 1`` tokens before its first counted
    target, so that every counted target has at least ``first`` tokens before it in its row. With
    ``first = 1`` this is the protocol of :func:`txl.evaluation.evaluate` (same rows, same segments, the same
    mean). Evaluation and inference mode; the model's training flag is restored."""
    return _stream(model, tokens, settings, first, lambda segment: segment.loss, True)


def stream_predictions(
    model: TransformerXL, tokens: np.ndarray | Tensor, settings: EvalSettings, *, first: int = 1
) -> np.ndarray:
    """The most likely next token (int64) for every target ``first .. N-1``, as :func:`stream_losses`."""

    def argmax(segment: SegmentLosses) -> Tensor:
        assert segment.log_probs is not None  # asked for with log_probs=True
        return segment.log_probs.argmax(-1)

    return _stream(model, tokens, settings, first, argmax, False)


# ---------------------------------------------------------------------------------------------------------
# Sliding windows: the vanilla model, recomputed for every prediction
# ---------------------------------------------------------------------------------------------------------


def absolute_hidden(model: TransformerXL, windows: Tensor) -> Tensor:
    """Final hidden states (W, T, D) of the vanilla model on ``windows`` (W, T)
    (:meth:`TransformerXL.hidden_states`), so that a caller can send only the positions it needs to the
    softmax."""
    if model.config.attention != "absolute":
        raise ValueError("absolute_hidden is the vanilla model's path (attention='absolute')")
    return model.hidden_states(windows)[0]  # (W, T, D)


def _windows(
    model: TransformerXL,
    ids: Tensor,
    starts: np.ndarray,
    keep: int,
    read: Callable[[Tensor, Tensor], Tensor],
    settings: WindowSettings,
) -> Tensor:
    """For each window ``ids[start : start + settings.window]``, ``read(hidden, targets)`` of its last
    ``keep`` positions: (len(starts), keep). Windows run ``settings.batch_size`` at a time."""
    device = ids.device
    offsets = torch.arange(settings.window + 1, device=device)  # (T+1,)
    parts = []
    chunks = range(0, len(starts), settings.batch_size)
    quiet = not settings.progress or len(chunks) < 2
    for begin in tqdm(chunks, desc=settings.desc, disable=quiet, leave=False):
        first = torch.as_tensor(starts[begin : begin + settings.batch_size], device=device)  # (W,)
        grid = ids[first[:, None] + offsets[None, :]]  # (W, T+1)
        hidden = absolute_hidden(model, grid[:, :-1])[:, -keep:]  # (W, S, D): only what is predicted
        targets = grid[:, -keep:]  # (W, S)
        flat = read(hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1))  # (W*S,)
        parts.append(flat.view(-1, keep).cpu())
    return torch.cat(parts) if parts else torch.zeros(0, keep)


def _check_vanilla(model: TransformerXL) -> None:
    if model.config.attention != "absolute":
        raise ValueError(
            "sliding-window evaluation is for the vanilla model (attention='absolute'); "
            "the Transformer-XL reads streams with memory (stream_losses)"
        )


def _head(settings: WindowSettings, head: int) -> WindowSettings:
    """The one window at the start: ``head`` tokens, alone, without a progress bar."""
    return replace(settings, window=head, stride=head, batch_size=1, progress=False)


def sliding_losses(
    model: TransformerXL, tokens: np.ndarray | Tensor, settings: WindowSettings, *, first: int = 1
) -> np.ndarray:
    """Loss in nats (float64) of every target ``first .. N-1`` by a vanilla model reading windows of
    T = ``settings.window`` tokens: target t is predicted from ``tokens[t - T : t]`` (from ``tokens[:t]``
    while t <= T, all by one window at the start). With stride s, a window ``tokens[e - T : e]`` predicts
    its last s targets (e-s+1 .. e), each seeing between T - s + 1 and T tokens. Evaluation and inference
    mode; the model's training flag is restored."""
    _check_vanilla(model)
    window, stride = settings.window, settings.stride
    ids = _as_tensor(tokens, _device(model))
    n = ids.numel()
    _check_first(first, n)

    def nll(hidden: Tensor, targets: Tensor) -> Tensor:
        return model.softmax.nll(hidden, targets)

    out = []
    with _evaluating(model):
        head = min(window, n - 1)  # the first window predicts targets 1..head, each from all tokens before it
        if first <= head:
            start = np.zeros(1, dtype=np.int64)
            out.append(_windows(model, ids, start, head, nll, _head(settings, head))[0, first - 1 :])
        targets = np.arange(max(first, head + 1), n)  # each needs a window that ends at it
        if len(targets):
            ends = targets[stride - 1 :: stride]  # the last target of each full group of s
            partial = len(targets) % stride
            if partial:
                ends = np.append(ends, n - 1)
            losses = _windows(model, ids, ends - window, stride, nll, settings).reshape(-1)
            if partial:  # the last window's first s - r positions were predicted by the window before it
                losses = torch.cat([losses[:-stride], losses[-partial:]])
            out.append(losses)
    return torch.cat(out).double().numpy()


def sliding_predictions(
    model: TransformerXL, tokens: np.ndarray | Tensor, settings: WindowSettings, *, positions: np.ndarray
) -> np.ndarray:
    """The vanilla model's most likely token (int64) at each target position p in ``positions`` (1 <= p < N),
    each from the window of the T = ``settings.window`` tokens before it (``tokens[:p]`` while p <= T);
    every position has a window of its own (``settings.stride`` is not used)."""
    _check_vanilla(model)
    window = settings.window
    ids = _as_tensor(tokens, _device(model))
    n = ids.numel()
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size and (positions.min() < 1 or positions.max() >= n):
        raise ValueError(f"positions must lie in 1..{n - 1}")

    def argmax(hidden: Tensor, _: Tensor) -> Tensor:
        return model.softmax.log_prob(hidden).argmax(-1)

    result = np.zeros(len(positions), dtype=np.int64)
    head = min(window, n - 1)
    early = positions <= head
    with _evaluating(model):
        if early.any():
            start = np.zeros(1, dtype=np.int64)
            preds = _windows(model, ids, start, head, argmax, _head(settings, head))[0]
            result[early] = preds[positions[early] - 1].numpy()
        late = positions[~early]
        if len(late):
            result[~early] = _windows(model, ids, late - window, 1, argmax, settings).reshape(-1).numpy()
    return result
