"""The recurrent memory of Transformer-XL as plain data, and the one function that updates it.

Memory holds, for every layer, the hidden states that entered it on the last M positions (the embedding
output and the output of every layer but the last: n_layer tensors), batch-first (B, M, D). It never requires grad
(stop-gradient, Section 3.2), can be sliced by batch row, moved between devices, saved and restored.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["Memory", "update_memory"]


@dataclass(frozen=True)
class Memory:
    """Per-layer cached hidden states: ``states[l]`` is the input of layer l, shape (B, M, D).

    The authors' code also keeps the last layer's output (n_layer + 1 tensors); no layer reads it, so txl
    does not: ``interop`` and checkpoint loading drop it where it appears.
    """

    states: tuple[Tensor, ...]

    def __post_init__(self) -> None:
        if not self.states:
            raise ValueError("Memory needs at least one state tensor")
        shape = self.states[0].shape
        if any(s.dim() != 3 or s.shape != shape for s in self.states):
            raise ValueError(
                f"Memory states must all be (B, M, D) of one shape, got {[tuple(s.shape) for s in self.states]}"
            )

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
        return Memory(tuple(s[rows] for s in self.states))

    def to(self, *args, **kwargs) -> Memory:
        """Move or cast every state (arguments as ``Tensor.to``)."""
        return Memory(tuple(s.to(*args, **kwargs) for s in self.states))

    def state_dict(self) -> dict[str, Tensor]:
        """Flat named tensors (``memory.0`` ...), e.g. for safetensors."""
        return {f"memory.{i}": s.detach().contiguous() for i, s in enumerate(self.states)}

    @classmethod
    def from_state_dict(cls, tensors: dict[str, Tensor]) -> Memory | None:
        """Inverse of :meth:`state_dict`; None when no memory tensors are present."""
        keys = sorted((k for k in tensors if k.startswith("memory.")), key=lambda k: int(k.split(".")[1]))
        if not keys:
            return None
        return cls(tuple(tensors[k] for k in keys))

    @staticmethod
    def cat_rows(parts: Sequence[Memory]) -> Memory:
        """Stack the memories of several row groups back into one (inverse of :meth:`select` on chunks)."""
        return Memory(
            tuple(torch.cat(group, dim=0) for group in zip(*(p.states for p in parts), strict=True))
        )


def update_memory(memory: Memory | None, hiddens: Sequence[Tensor], *, mem_len: int) -> Memory | None:
    """Concatenate the old memory with this segment's hidden states, keep the last ``mem_len`` positions,
    and detach (stop-gradient). ``hiddens``: the input of each layer (B, T, D). Returns None when mem_len is 0."""
    if mem_len == 0:
        return None
    with torch.no_grad():
        if memory is None:
            merged = [h[:, -mem_len:] for h in hiddens]  # (B, min(T, M), D)
        else:
            merged = [
                torch.cat([m, h], dim=1)[:, -mem_len:] for m, h in zip(memory.states, hiddens, strict=True)
            ]
    return Memory(tuple(m.detach() for m in merged))
