"""What an agent's core carries from one step to the next, as frozen values of tensors indexed by environment
(and, once stacked, time), which a rollout buffer stores, slices and detaches. Dimensions: E environments,
T time, L layers, M remembered steps, D model size, H hidden.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Self

import torch
from torch import Tensor

__all__ = ["TensorState", "CoreState", "RecurrentState"]


@dataclass(frozen=True)
class TensorState:
    """A frozen value of tensors that share their leading (batch) dimensions: environments (E,), or time and
    environments (T, E) once stacked. Indexing applies to those leading dimensions of every field."""

    def tensors(self) -> tuple[Tensor, ...]:
        """The fields, in order."""
        return tuple(getattr(self, f.name) for f in fields(self))

    def _map(self, fn: Any) -> Self:
        return type(self)(*(fn(t) for t in self.tensors()))

    def __getitem__(self, index: Any) -> Self:
        """The state of some environments (``state[envs]``) or, stacked, of some times and environments
        (``states[t, envs]``, ``states[:, envs]``)."""
        return self._map(lambda t: t[index])

    def detach(self) -> Self:
        """The same values, cut from any autograd graph."""
        return self._map(Tensor.detach)

    def clone(self) -> Self:
        """A copy that shares no storage with this state (for a buffer that outlives the rollout)."""
        return self._map(Tensor.clone)

    def to(self, *args: Any, **kwargs: Any) -> Self:
        """Move every tensor (arguments as ``Tensor.to``; integer fields keep their dtype)."""
        return self._map(
            lambda t: t.to(*args, **kwargs) if t.is_floating_point() else t.to(*_device(args, kwargs))
        )

    @classmethod
    def stack(cls, states: Sequence[Self], dim: int = 0) -> Self:
        """Stack states of one batch shape along a new leading dimension (e.g. time: T states of (E,) give
        one of (T, E))."""
        if not states:
            raise ValueError("stack needs at least one state")
        columns = zip(*(s.tensors() for s in states), strict=True)
        return cls(*(torch.stack(list(c), dim=dim) for c in columns))

    @classmethod
    def cat(cls, states: Sequence[Self], dim: int = 0) -> Self:
        """Concatenate states along an existing leading dimension (e.g. the environments of two groups)."""
        if not states:
            raise ValueError("cat needs at least one state")
        columns = zip(*(s.tensors() for s in states), strict=True)
        return cls(*(torch.cat(list(c), dim=dim) for c in columns))


def _device(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """The device among ``Tensor.to`` arguments (a dtype is dropped: integer fields keep theirs)."""
    device = kwargs.get("device")
    for a in args:
        if isinstance(a, (torch.device, str)):
            device = a
    return () if device is None else (device,)


@dataclass(frozen=True)
class CoreState(TensorState):
    """The memory of :class:`~txl.rl.MemoryCore` for E environments: a fixed number of slots per layer, of
    which each environment's current episode owns the last ``reach``.

    ``memory``: (E, L, M, D), the input of every layer at the last M steps (never requires grad once
    returned by the core); ``reach``: (E,) int64, how many of those steps belong to the environment's current
    episode (0 after an episode start with nothing seen yet; at most M). Slots outside the reach are never
    attended, whatever they hold."""

    memory: Tensor
    reach: Tensor

    def __post_init__(self) -> None:
        if self.memory.dim() < 3 or self.reach.shape != self.memory.shape[:-3]:
            raise ValueError(
                f"CoreState needs memory (..., L, M, D) and reach of its leading shape, got "
                f"{tuple(self.memory.shape)} and {tuple(self.reach.shape)}"
            )
        if self.reach.dtype != torch.int64:
            raise ValueError(f"CoreState reach must be int64, got {self.reach.dtype}")


@dataclass(frozen=True)
class RecurrentState(TensorState):
    """The state of a baseline core: ``hidden`` (E, H) (a GRU's hidden state; H = 0 for a core without
    memory)."""

    hidden: Tensor
