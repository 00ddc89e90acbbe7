"""Per-token losses and predictions of a model over a token array, with the context of every prediction
under control. The analyses build on two protocols:

- **stream** (:func:`stream_losses`, :func:`stream_predictions`): the array cut into B contiguous rows, each
  read in segments of ``tgt_len`` tokens carrying memory (the Transformer-XL; the vanilla model then reads
  disjoint segments). Every target is predicted once; each row starts ``first - 1`` tokens before its first
  counted target, so that every counted target has at least ``first`` tokens before it in its row.
- **sliding window** (:func:`sliding_losses`, :func:`sliding_predictions`): the vanilla model of the paper,
  each prediction made by a window of the ``window`` tokens before it, recomputed from scratch. With
  ``stride`` s a window predicts its last s tokens (s = 1 is the paper's protocol). The windows of a chunk
  run as one batch and only the predicted positions reach the softmax (:func:`absolute_hidden`).

Both return values for the targets ``first .. N-1`` in order (target t is ``tokens[t]`` given the tokens
before it). Evaluation mode and ``torch.inference_mode``; the model's training flag is restored.

Dimensions: N tokens, B rows, L row length, T segment or window length, W windows in a chunk, S stride,
D model size, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import Tensor
from tqdm.auto import tqdm

from ..config import Span
from ..evaluate import EvalSettings, SegmentLosses, segment_losses
from ..model import TransformerXL, eval_mode

__all__ = [
    "absolute_hidden",
    "stream_losses",
    "stream_predictions",
    "sliding_losses",
    "sliding_predictions",
]


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
    *,
    tgt_len: int,
    span: Span | None,
    first: int,
    batch_size: int,
    progress: bool,
    desc: str,
    read: Callable[[SegmentLosses], Tensor],
    with_targets: bool,
) -> np.ndarray:
    """Run the rows segment by segment (:func:`txl.evaluate.segment_losses`, the protocol of ``txl eval``) and
    return ``read(segment)`` (B, T) for targets first..N-1."""
    device = _device(model)
    ids = _as_tensor(tokens, device)
    n = ids.numel()
    _check_first(first, n)
    rows = min(batch_size, n - first)
    per_row = math.ceil((n - first) / rows)  # counted targets per row (C)
    length = first - 1 + per_row  # inputs per row (L): first - 1 warm-up targets, then C counted ones
    # (B, L+1)
    index = (
        torch.arange(rows, device=device)[:, None] * per_row
        + torch.arange(length + 1, device=device)[None, :]
    )
    padded = ids[index.clamp(max=n - 1)].masked_fill(index >= n, 0)  # (B, L+1), zeros past the end
    settings = EvalSettings(tgt_len=tgt_len, span=span, batch_size=rows, log_probs=not with_targets)
    segments = segment_losses(model, padded, settings)
    pieces = []
    with torch.inference_mode():
        steps = math.ceil(length / tgt_len)
        for segment in tqdm(segments, total=steps, desc=desc, disable=not progress, leave=False):
            pieces.append(read(segment).double().cpu())  # (B, T)
    values = torch.cat(pieces, dim=1)[:, first - 1 :]  # (B, C): the counted targets, row after row
    return values.reshape(-1)[: n - first].numpy()


def stream_losses(
    model: TransformerXL,
    tokens: np.ndarray | Tensor,
    *,
    tgt_len: int,
    span: Span | None = None,
    first: int = 1,
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "stream",
) -> np.ndarray:
    """Loss in nats (float64) of every target ``first .. N-1``, reading B = ``batch_size`` rows in segments
    of ``tgt_len`` with memory (``span``: the model's by default). With ``first = 1`` this is the protocol
    of :func:`txl.evaluate.evaluate` (same rows, same segments, the same mean)."""
    return _stream(
        model,
        tokens,
        tgt_len=tgt_len,
        span=span,
        first=first,
        batch_size=batch_size,
        progress=progress,
        desc=desc,
        read=lambda segment: segment.loss,
        with_targets=True,
    )


def stream_predictions(
    model: TransformerXL,
    tokens: np.ndarray | Tensor,
    *,
    tgt_len: int,
    span: Span | None = None,
    first: int = 1,
    batch_size: int = 8,
    progress: bool = False,
    desc: str = "stream",
) -> np.ndarray:
    """The most likely next token (int64) for every target ``first .. N-1``, as :func:`stream_losses`."""
    return _stream(
        model,
        tokens,
        tgt_len=tgt_len,
        span=span,
        first=first,
        batch_size=batch_size,
        progress=progress,
        desc=desc,
        read=lambda segment: segment.log_probs.argmax(-1),
        with_targets=False,
    )


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
    *,
    window: int,
    keep: int,
    batch_size: int,
    read: Callable[[Tensor, Tensor], Tensor],
    progress: bool,
    desc: str,
) -> Tensor:
    """For each window ``ids[start : start + window]``, ``read(hidden, targets)`` of its last ``keep``
    positions: (len(starts), keep). Windows run ``batch_size`` at a time."""
    device = ids.device
    offsets = torch.arange(window + 1, device=device)  # (T+1,)
    parts = []
    chunks = range(0, len(starts), batch_size)
    for begin in tqdm(chunks, desc=desc, disable=not progress or len(chunks) < 2, leave=False):
        first = torch.as_tensor(starts[begin : begin + batch_size], device=device)  # (W,)
        grid = ids[first[:, None] + offsets[None, :]]  # (W, T+1)
        hidden = absolute_hidden(model, grid[:, :-1])[:, -keep:]  # (W, S, D): only what is predicted
        targets = grid[:, -keep:]  # (W, S)
        flat = read(hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1))  # (W*S,)
        parts.append(flat.view(-1, keep).cpu())
    return torch.cat(parts) if parts else torch.zeros(0, keep)


def _check_window(model: TransformerXL, window: int, stride: int) -> None:
    if model.config.attention != "absolute":
        raise ValueError(
            "sliding-window evaluation is for the vanilla model (attention='absolute'); "
            "the Transformer-XL reads streams with memory (stream_losses)"
        )
    if window < 1 or not 1 <= stride <= window:
        raise ValueError(f"need window >= 1 and 1 <= stride <= window, got window={window}, stride={stride}")


def sliding_losses(
    model: TransformerXL,
    tokens: np.ndarray | Tensor,
    *,
    window: int,
    stride: int = 1,
    first: int = 1,
    batch_size: int = 64,
    progress: bool = False,
    desc: str = "sliding",
) -> np.ndarray:
    """Loss in nats (float64) of every target ``first .. N-1`` by a vanilla model reading windows of
    ``window`` tokens: target t is predicted from ``tokens[t - window : t]`` (from ``tokens[:t]`` while
    t <= window, all by one window at the start). With ``stride`` s, a window ``tokens[e - window : e]``
    predicts its last s targets (e-s+1 .. e), each seeing between window - s + 1 and window tokens.
    ``batch_size`` windows run as one batch."""
    _check_window(model, window, stride)
    ids = _as_tensor(tokens, _device(model))
    n = ids.numel()
    _check_first(first, n)

    def nll(hidden: Tensor, targets: Tensor) -> Tensor:
        return model.softmax.nll(hidden, targets)

    out = []
    with _evaluating(model):
        head = min(window, n - 1)  # the first window predicts targets 1..head, each from all tokens before it
        if first <= head:
            losses = _windows(
                model,
                ids,
                np.zeros(1, dtype=np.int64),
                window=head,
                keep=head,
                batch_size=1,
                read=nll,
                progress=False,
                desc=desc,
            )
            out.append(losses[0, first - 1 :])
        targets = np.arange(max(first, head + 1), n)  # each needs a window that ends at it
        if len(targets):
            ends = targets[stride - 1 :: stride]  # the last target of each full group of s
            partial = len(targets) % stride
            if partial:
                ends = np.append(ends, n - 1)
            losses = _windows(
                model,
                ids,
                ends - window,
                window=window,
                keep=stride,
                batch_size=batch_size,
                read=nll,
                progress=progress,
                desc=desc,
            ).reshape(-1)
            if partial:  # the last window's first s - r positions were predicted by the window before it
                losses = torch.cat([losses[:-stride], losses[-partial:]])
            out.append(losses)
    return torch.cat(out).double().numpy()


def sliding_predictions(
    model: TransformerXL,
    tokens: np.ndarray | Tensor,
    *,
    window: int,
    positions: np.ndarray,
    batch_size: int = 64,
    progress: bool = False,
    desc: str = "sliding",
) -> np.ndarray:
    """The vanilla model's most likely token (int64) at each target position p in ``positions`` (1 <= p < N),
    each from the window of the ``window`` tokens before it (``tokens[:p]`` while p <= window)."""
    _check_window(model, window, 1)
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
            preds = _windows(
                model,
                ids,
                np.zeros(1, dtype=np.int64),
                window=head,
                keep=head,
                batch_size=1,
                read=argmax,
                progress=False,
                desc=desc,
            )[0]
            result[early] = preds[positions[early] - 1].numpy()
        late = positions[~early]
        if len(late):
            result[~early] = (
                _windows(
                    model,
                    ids,
                    late - window,
                    window=window,
                    keep=1,
                    batch_size=batch_size,
                    read=argmax,
                    progress=progress,
                    desc=desc,
                )
                .reshape(-1)
                .numpy()
            )
    return result
