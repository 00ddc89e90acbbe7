"""The ordered segment iterator: one token array cut into B contiguous streams, read T tokens at a time, so
that a model's memory carries over between batches; owns batching, variable lengths, resumable position and
document starts, not tokenization. Dimensions: B batch size (streams), T segment length, L tokens per stream.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..config import positive_int

__all__ = [
    "Batch",
    "SegmentStream",
    "BatchSettings",
    "document_cuts",
    "VARLEN_STD",
    "VARLEN_MIN",
    "VARLEN_MAX_DEV",
]

VARLEN_STD = 5.0  # as the original Transformer-XL: std of the segment length
VARLEN_MIN = 5  # shortest variable segment
VARLEN_MAX_DEV = 3  # longest variable segment is tgt_len + VARLEN_MAX_DEV * VARLEN_STD


def document_cuts(n_tokens: int, starts: np.ndarray, *, batch_size: int) -> np.ndarray:
    """Where B evaluation streams over ``n_tokens`` tokens begin when each document must be read whole in one
    stream: (R,) increasing token indices, R <= B, the first 0 and the others document ``starts``, each the
    start nearest to b (N - 1) / B (so that the streams are as even as the documents allow; fewer than B when
    there are fewer documents, or when one is longer than a share)."""
    starts = np.asarray(starts, dtype=np.int64)
    inside = starts[(starts > 0) & (starts < n_tokens - 1)]  # a cut leaves a stream at least one target
    cuts = [0]
    for b in range(1, batch_size):
        if not inside.size:
            break
        ideal = b * (n_tokens - 1) / batch_size
        right = int(np.searchsorted(inside, ideal))
        near = [inside[i] for i in (right - 1, right) if 0 <= i < inside.size]
        cut = int(min(near, key=lambda s: abs(s - ideal)))
        if cut > cuts[-1]:
            cuts.append(cut)
    return np.asarray(cuts, dtype=np.int64)


@dataclass(frozen=True)
class BatchSettings:
    """How a :class:`SegmentStream` cuts and reads its tokens."""

    batch_size: int
    """B: the parallel streams the tokens are cut into (rows of each batch)."""
    tgt_len: int
    """T: tokens per segment (the mean length with ``varlen``)."""
    varlen: bool = False
    """Draw each segment's length as the original Transformer-XL does (training only)."""
    seed: int = 0
    """Seed of the generator of the variable lengths."""
    drop_last: bool = True
    """True (training): equal streams, the tail dropped; False (evaluation): every target read once."""

    def __post_init__(self) -> None:
        positive_int(self.batch_size, "batch_size", field=False)
        positive_int(self.tgt_len, "tgt_len", field=False)


@dataclass(frozen=True)
class Batch:
    """inputs and targets: (B, T) int64, targets = inputs shifted by one token within each stream.
    mask: (B, T) bool, True where the target is a real token; None when all are real.
    new_epoch: the batch starts a pass over the split (position 0): no row continues the batch before,
    so a memory carried from it (the end of the split) must be dropped.
    starts: (B, T) bool, True where ``inputs[b, t]`` begins a document; None when the stream was given no
    document starts. A row's first token of an epoch is not marked unless a document begins there (the
    memory is dropped at the wrap anyway), so the marks are the corpus's boundaries and nothing else."""

    inputs: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor | None = None
    new_epoch: bool = False
    starts: torch.Tensor | None = None

    @property
    def n_targets(self) -> int:
        """Number of real targets in the batch."""
        return int(self.mask.sum()) if self.mask is not None else self.targets.numel()

    def select(self, rows: slice) -> Batch:
        """The batch of some rows (streams), e.g. those of one data-parallel process."""
        mask = self.mask[rows] if self.mask is not None else None
        starts = self.starts[rows] if self.starts is not None else None
        return Batch(self.inputs[rows], self.targets[rows], mask, self.new_epoch, starts)

    def to(self, device: torch.device | str, *, non_blocking: bool = False) -> Batch:
        """The batch on ``device``."""

        def move(x: torch.Tensor) -> torch.Tensor:
            return x.to(device, non_blocking=non_blocking)

        mask = None if self.mask is None else move(self.mask)
        starts = None if self.starts is None else move(self.starts)
        return Batch(move(self.inputs), move(self.targets), mask, self.new_epoch, starts)


class SegmentStream:
    """Iterate a 1-D token array as B parallel contiguous streams, T tokens per step.

    drop_last=True (training): stream b = tokens[b*L:(b+1)*L], L = N // B; the tail beyond B*L is
    dropped, as is the prediction of each stream's first token. Needs L >= T + 1.
    drop_last=False (evaluation): every token 1..N-1 is a target exactly once. L = ceil((N-1)/B);
    stream b = tokens[b*L : b*L+L+1] (consecutive streams share one boundary token); short streams are
    padded with 0 and `Batch.mask` marks real targets. Needs N >= 2.
    varlen=True: each segment length is drawn as in the original Transformer-XL (tgt_len with
    probability 0.95, else tgt_len/2; then normal(that, 5), clipped to [5, tgt_len + 15]) from a
    numpy Generator seeded with `seed`, whose state is part of `state_dict()`.

    The last batch of an epoch may be shorter. Producing it moves the stream to position 0 of the
    next epoch, whose first batch has `Batch.new_epoch` set (all rows wrap together), so a trainer
    knows to drop its memory; the flag follows from the position, so it survives `state_dict()`.
    One iteration at a time: the stream holds the position, iterators share it.

    starts: the token indices where documents begin (1-D, increasing; :attr:`PreparedData.starts`): each batch
    then carries ``Batch.starts``, True at those tokens of its inputs. In training (drop_last=True) a document
    split between two streams begins only where it begins (the second stream's first token is not marked).
    In evaluation (drop_last=False) the streams are cut at document starts instead (:func:`document_cuts`),
    so that every document is read whole in one stream; each stream is padded in front to keep every token
    at its offset in the segment (its index modulo T) that one stream gives it, so that the memory each token
    reads, hence every loss, does not depend on B (to float rounding).
    """

    def __init__(
        self,
        tokens: np.ndarray | torch.Tensor,
        settings: BatchSettings,
        *,
        name: str = "tokens",
        starts: np.ndarray | None = None,
    ) -> None:
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.detach().cpu().numpy()
        tokens = np.asarray(tokens)
        if tokens.ndim != 1:
            raise ValueError(f"{name}: expected a 1-D token array, got shape {tuple(tokens.shape)}")
        n = int(tokens.shape[0])
        batch_size, tgt_len, drop_last = settings.batch_size, settings.tgt_len, settings.drop_last
        self.settings = settings
        self.batch_size, self.tgt_len, self.varlen, self.seed = (
            batch_size,
            tgt_len,
            settings.varlen,
            settings.seed,
        )
        self.drop_last, self.name, self.n_tokens = drop_last, name, n
        self._starts: np.ndarray | None = None
        if starts is not None:
            starts = np.asarray(starts, dtype=np.int64)
            if starts.ndim != 1 or (starts.size and (np.any(np.diff(starts) <= 0) or starts[0] < 0)):
                raise ValueError(f"{name}: document starts must be increasing token indices (1-D)")
            self._starts = starts
        self._row_first = np.zeros(batch_size, dtype=np.int64)  # (B,) each row's first real input
        if drop_last:
            length = n // batch_size
            if length < tgt_len + 1:
                raise ValueError(
                    f"split '{name}' has {n} tokens, fewer than one segment "
                    f"(B x (T+1) = {batch_size} x {tgt_len + 1} = {batch_size * (tgt_len + 1)}); "
                    "lower batch_size or tgt_len"
                )
            self._rows = tokens[: batch_size * length].reshape(batch_size, length)  # (B, L), a view
            self._row_len = np.full(batch_size, length)
            self._n_steps = length - 1
            self._row_start = (
                np.arange(batch_size, dtype=np.int64) * length
            )  # token index of each row's first
        elif n < 2:
            raise ValueError(f"split '{name}' has {n} tokens; evaluation needs at least 2")
        elif self._starts is not None:
            self._cut_at_documents(tokens)
        else:
            length = math.ceil((n - 1) / batch_size)
            rows = np.zeros((batch_size, length + 1), dtype=tokens.dtype)  # (B, L+1), padded
            row_len = np.zeros(batch_size, dtype=np.int64)
            for b in range(batch_size):
                piece = tokens[b * length : min(b * length + length + 1, n)]
                rows[b, : len(piece)] = piece
                row_len[b] = len(piece)
            self._rows, self._row_len, self._n_steps = rows, row_len, length
            self._row_start = np.arange(batch_size, dtype=np.int64) * length
        self._reset_position()

    def _cut_at_documents(self, tokens: np.ndarray) -> None:
        """Evaluation streams cut at document starts (:func:`document_cuts`), row b the tokens c_b .. c_(b+1)
        (the next row's first token is this row's last target) after c_b mod T positions of padding."""
        assert self._starts is not None
        n, t = len(tokens), self.tgt_len
        cuts = document_cuts(n, self._starts, batch_size=self.batch_size)  # (R,) R <= B rows used
        ends = np.append(cuts[1:], n - 1)  # (R,) each row's last token
        first = cuts % t  # (R,) padding in front: the offset in the segment that one stream gives c_b
        row_len = np.zeros(self.batch_size, dtype=np.int64)
        row_len[: len(cuts)] = first + ends - cuts + 1
        length = int(row_len.max()) - 1
        rows = np.zeros((self.batch_size, length + 1), dtype=tokens.dtype)  # (B, L+1), padded
        for b, (cut, end, pad) in enumerate(zip(cuts, ends, first, strict=True)):
            rows[b, pad : pad + end - cut + 1] = tokens[cut : end + 1]
        self._rows, self._row_len, self._n_steps = rows, row_len, length
        self._row_first[: len(cuts)] = first
        self._row_start = np.zeros(self.batch_size, dtype=np.int64)
        self._row_start[: len(cuts)] = cuts - first  # token index a row's position 0 stands for

    def _reset_position(self) -> None:
        self._pos = 0
        self._epoch = 0
        self._rng = np.random.default_rng(self.seed)

    # -- sizes -------------------------------------------------------------------------------

    @property
    def n_batches(self) -> int:
        """Batches per epoch at fixed length (with varlen, the count at the mean length tgt_len)."""
        return math.ceil(self._n_steps / self.tgt_len)

    @property
    def tokens_per_epoch(self) -> int:
        """Targets predicted per epoch (B*(L-1) for training, N-1 for evaluation)."""
        return int(np.clip(self._row_len - 1 - self._row_first, 0, None).sum())

    def target_indices(self) -> np.ndarray:
        """(B, L) int64: the token index of the target at each stream position over an epoch, -1 where there
        is none (padding); in evaluation every index 1 .. N - 1 appears once. What puts losses read in streams
        back into token order."""
        positions = np.arange(self._n_steps)  # (L,) input positions
        index = self._row_start[:, None] + positions[None, :] + 1  # (B, L)
        return np.where(self._real(positions), index, -1)

    def _real(self, positions: np.ndarray) -> np.ndarray:
        """(B, T) bool: whether the target after input position ``positions`` (T,) of each row is a token."""
        after = positions[None, :] + 1 < self._row_len[:, None]  # (B, T): not past the row's end
        return after & (positions[None, :] >= self._row_first[:, None])  # nor in its padding in front

    @property
    def position(self) -> int:
        return self._pos

    @property
    def epoch(self) -> int:
        return self._epoch

    # -- iteration ---------------------------------------------------------------------------

    def _next_len(self) -> int:
        if not self.varlen:
            return self.tgt_len
        base = self.tgt_len if self._rng.random() < 0.95 else self.tgt_len / 2
        seq_len = int(self._rng.normal(base, VARLEN_STD))
        return max(
            min(VARLEN_MIN, self.tgt_len), min(seq_len, int(self.tgt_len + VARLEN_MAX_DEV * VARLEN_STD))
        )

    def _batch(self, pos: int, seq_len: int) -> Batch:
        inputs = np.asarray(self._rows[:, pos : pos + seq_len], dtype=np.int64)  # (B, T)
        targets = np.asarray(self._rows[:, pos + 1 : pos + 1 + seq_len], dtype=np.int64)  # (B, T)
        mask = None
        if not self.drop_last:
            real = self._real(pos + np.arange(seq_len))  # (B, T)
            if not real.all():
                mask = torch.from_numpy(real)
        starts = None if self._starts is None else torch.from_numpy(self._marks(pos, inputs.shape[1]))
        return Batch(
            torch.from_numpy(inputs), torch.from_numpy(targets), mask, new_epoch=pos == 0, starts=starts
        )

    def _marks(self, pos: int, seq_len: int) -> np.ndarray:
        """(B, T) bool: True where input ``pos + t`` of row b is a document's first token."""
        starts = self._starts
        assert starts is not None  # called only for a stream given document starts
        marks = np.zeros((self.batch_size, seq_len), dtype=bool)  # (B, T)
        first = self._row_start + pos  # (B,) token index of each row's input 0
        lo = np.asarray(
            np.searchsorted(starts, first + np.maximum(self._row_first - pos, 0))
        )  # not in padding
        hi = np.asarray(
            np.searchsorted(starts, first + np.clip(self._row_len - 1 - pos, 0, seq_len))
        )  # inputs
        for b in range(self.batch_size):
            marks[b, starts[lo[b] : hi[b]] - first[b]] = True
        return marks

    def __iter__(self) -> Iterator[Batch]:
        """Batches from the current position to the end of the epoch."""
        while self._pos < self._n_steps:
            pos = self._pos
            seq_len = min(self._next_len(), self._n_steps - pos)
            batch = self._batch(pos, seq_len)
            self._pos = pos + seq_len
            if self._pos >= self._n_steps:  # epoch done: the next batch starts the next epoch
                self._pos = 0
                self._epoch += 1
                yield batch
                return
            yield batch

    def batches(self) -> Iterator[Batch]:
        """Endless batches, epoch after epoch (for training by steps)."""
        while True:
            yield from self

    # -- resume ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """JSON-able position: load it into an equal stream to continue exactly here."""
        return {
            "position": self._pos,
            "epoch": self._epoch,
            "rng": self._rng.bit_generator.state,
            "n_tokens": self.n_tokens,
            "batch_size": self.batch_size,
            "tgt_len": self.tgt_len,
            "varlen": self.varlen,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("n_tokens", "batch_size", "tgt_len", "varlen", "drop_last"):
            if key in state and state[key] != getattr(self, key):
                raise ValueError(
                    f"stream state was saved with {key}={state[key]!r}, this stream has "
                    f"{key}={getattr(self, key)!r}; resume with the same data and settings"
                )
        pos = int(state["position"])
        if not 0 <= pos < max(self._n_steps, 1):
            raise ValueError(f"stream position {pos} is outside 0..{self._n_steps - 1}")
        self._pos, self._epoch = pos, int(state["epoch"])
        rng = np.random.default_rng(self.seed)
        rng.bit_generator.state = state["rng"]
        self._rng = rng
