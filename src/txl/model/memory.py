"""The recurrent memory of Transformer-XL as plain data, and the one function that updates it."""

# Memory holds, for every layer, the hidden states that entered it on the last M positions (the embedding
# output and the output of every layer but the last: n_layer tensors), batch-first (B, M, D). It never requires grad
# (stop-gradient, Section 3.2), can be sliced by batch row, moved between devices, saved and restored.
#
# Documents: a memory may also carry, per row, its *reach*: how many of its last positions belong to the
# row's current document (a stream read with ``starts``, see ``TransformerXL.forward``). The next segment's
# queries of that row attend only those. :func:`next_reach` is the one rule that moves it along a segment.

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

if TYPE_CHECKING:
    from ..config import TransformerXLConfig

__all__ = ["Memory", "update_memory", "next_reach", "last_start", "full_reach"]


@dataclass(frozen=True)
class Memory:
    """Per-layer cached hidden states: ``states[l]`` is the input of layer l, shape (B, M, D).

    The authors' code also keeps the last layer's output (n_layer + 1 tensors); no layer reads it, so txl
    does not: ``interop`` and checkpoint loading drop it where it appears.

    ``reach``: (B,) int64 on the states' device, or None. ``reach[b]`` is how many of the last positions belong
    to row b's current document (0 <= reach <= M): the next segment's queries of row b attend only those
    (until a new start). None means all of them (a stream without document boundaries).
    """

    states: tuple[Tensor, ...]
    reach: Tensor | None = None

    def __post_init__(self) -> None:
        if not self.states:
            raise ValueError("Memory needs at least one state tensor")
        shape = self.states[0].shape
        if any(s.dim() != 3 or s.shape != shape for s in self.states):
            raise ValueError(
                f"Memory states must all be (B, M, D) of one shape, got {[tuple(s.shape) for s in self.states]}"
            )
        reach = self.reach
        if reach is not None and (
            not isinstance(reach, Tensor) or reach.dtype != torch.int64 or reach.shape != (shape[0],)
        ):
            got = f"{reach.dtype} {tuple(reach.shape)}" if isinstance(reach, Tensor) else type(reach).__name__
            raise ValueError(f"Memory reach must be a (B,) = ({shape[0]},) int64 tensor, got {got}")

    @classmethod
    def zeros(
        cls,
        config: TransformerXLConfig,
        batch_size: int,
        length: int,
        *,
        dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
    ) -> Memory:
        """A memory of ``length`` zero states per layer with reach 0: nothing in it can be attended, so the
        next segment equals a start from an empty memory (to rounding). A fixed-size start for graphs that
        cannot take "no memory" (the ONNX export) and for rows of a shared cache that wait for a request."""
        dtype = torch.get_default_dtype() if dtype is None else dtype
        states = tuple(
            torch.zeros(batch_size, length, config.d_model, dtype=dtype, device=device)
            for _ in range(config.n_layer)
        )
        return cls(states, reach=torch.zeros(batch_size, dtype=torch.int64, device=states[0].device))

    @property
    def length(self) -> int:
        """M, the number of remembered positions."""
        return self.states[0].shape[1]

    @property
    def batch_size(self) -> int:
        """B, the number of batch rows (streams)."""
        return self.states[0].shape[0]

    def __len__(self) -> int:
        return len(self.states)

    def select(self, rows: Tensor | slice | Sequence[int]) -> Memory:
        """The memory of some batch rows (e.g. one stream, or the rows of one data-parallel rank)."""
        if not isinstance(rows, (slice, Tensor)):
            rows = torch.as_tensor(list(rows), dtype=torch.long, device=self.states[0].device)
        reach = None if self.reach is None else self.reach[rows]
        return Memory(tuple(s[rows] for s in self.states), reach)

    def to(self, *args: Any, **kwargs: Any) -> Memory:
        """Move or cast every state (arguments as ``Tensor.to``); the reach follows to the new device and
        stays int64."""
        states = tuple(s.to(*args, **kwargs) for s in self.states)
        reach = None if self.reach is None else self.reach.to(states[0].device)
        return Memory(states, reach)

    def full_reach(self) -> Tensor:
        """The reach, with None spelled out: (B,) int64, M for every row of a memory without one."""
        return full_reach(
            self.reach, batch_size=self.batch_size, length=self.length, device=self.states[0].device
        )

    def state_dict(self) -> dict[str, Tensor]:
        """Flat named tensors (``memory.0`` ..., and ``memory.reach`` when there is one), e.g. for
        safetensors."""
        tensors = {f"memory.{i}": s.detach().contiguous() for i, s in enumerate(self.states)}
        if self.reach is not None:
            tensors["memory.reach"] = self.reach.contiguous()
        return tensors

    @classmethod
    def from_state_dict(cls, tensors: dict[str, Tensor]) -> Memory | None:
        """Inverse of :meth:`state_dict`; None when no memory tensors are present."""
        keys = sorted(
            (k for k in tensors if k.startswith("memory.") and k != "memory.reach"),
            key=lambda k: int(k.split(".")[1]),
        )
        if not keys:
            return None
        return cls(tuple(tensors[k] for k in keys), reach=tensors.get("memory.reach"))

    @staticmethod
    def cat_rows(parts: Sequence[Memory]) -> Memory:
        """Stack the memories of several row groups back into one (inverse of :meth:`select` on chunks).
        When some part has a reach, the others' rows get theirs spelled out (M: everything)."""
        states = tuple(torch.cat(group, dim=0) for group in zip(*(p.states for p in parts), strict=True))
        reach = None
        if any(p.reach is not None for p in parts):
            reach = torch.cat([p.full_reach() for p in parts])
        return Memory(states, reach)


def full_reach(reach: Tensor | None, *, batch_size: int, length: int, device: torch.device) -> Tensor:
    """A reach with None spelled out: ``reach``, else (B,) int64 ``length`` for every row (everything
    remembered is in reach); the one rule of :meth:`Memory.full_reach` and :meth:`KVCache.full_reach`."""
    if reach is not None:
        return reach
    return torch.full((batch_size,), length, dtype=torch.int64, device=device)


def last_start(starts: Tensor) -> Tensor:
    """Index of each row's last document start in a segment, -1 where it has none: (B, T) bool -> (B,)."""
    t = starts.shape[1]
    positions = torch.arange(t, device=starts.device)
    return torch.where(starts, positions, -1).amax(dim=1)  # (B,)


def next_reach(reach: Tensor, starts: Tensor | None, *, t: int, length: int) -> Tensor:
    """The reach after a segment of T positions: ``reach`` (B,) before it (positions of the current document
    among the remembered ones), ``starts`` (B, T) bool or None, ``length`` the memory length after the
    segment (``min(M + T, mem_len)``). A row whose segment has a start keeps the positions from its last
    start on; the others add T. Both are capped at ``length``."""
    grown = reach + t  # (B,)
    if starts is not None:
        grown = torch.where(starts.any(dim=1), t - last_start(starts), grown)  # (B,)
    return grown.clamp(max=length)


def update_memory(
    memory: Memory | None, hiddens: Sequence[Tensor], *, mem_len: int, starts: Tensor | None = None
) -> Memory | None:
    """Concatenate the old memory with this segment's hidden states, keep the last ``mem_len`` positions,
    and detach (stop-gradient). ``hiddens``: the input of each layer (B, T, D). Returns None when mem_len is 0.

    ``starts`` (B, T) bool, True where a document begins: the new memory's reach (:func:`next_reach`). It has
    one whenever ``starts`` is given or the old memory had one (an empty memory reaches nothing)."""
    if mem_len == 0:
        return None
    with torch.no_grad():
        if memory is None:
            merged = [h[:, -mem_len:] for h in hiddens]  # (B, min(T, M), D)
        else:
            merged = [
                torch.cat([m, h], dim=1)[:, -mem_len:] for m, h in zip(memory.states, hiddens, strict=True)
            ]
    reach = None
    if starts is not None or (memory is not None and memory.reach is not None):
        b, t = hiddens[0].shape[:2]
        if memory is None:
            before = torch.zeros(b, dtype=torch.int64, device=hiddens[0].device)
        else:
            before = memory.full_reach()
        reach = next_reach(before, starts, t=t, length=merged[0].shape[1])
    return Memory(tuple(m.detach() for m in merged), reach)
