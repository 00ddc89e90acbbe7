"""Transformer-XL memory for reinforcement-learning agents: :class:`MemoryCore` (a gated XL layer stack over
observations, stepped per environment or run over windows), its settings and state, and :func:`load_agent`
(a trained agent from its run folder, for a loop of one's own). The runs (``txl rl train``; in Python
``txl.rl.run.train``), PPO (``txl.rl.ppo``) and the tasks (``txl.rl.envs``, the ``rl`` extra) are imported
on demand."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .config import CoreConfig, PPOConfig, RLConfig
from .core import MemoryCore
from .state import CoreState

if TYPE_CHECKING:
    from .saved import load_agent

__all__ = ["CoreConfig", "PPOConfig", "RLConfig", "MemoryCore", "CoreState", "load_agent"]


def __getattr__(name: str) -> Any:
    """``load_agent``, imported on first use (it reads run folders: :mod:`txl.runs`, :mod:`txl.checkpoint`)."""
    if name == "load_agent":
        from .saved import load_agent

        return load_agent
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
