"""Transformer-XL memory for reinforcement-learning agents: :class:`MemoryCore` (a gated XL layer stack over
observations, stepped per environment or run over windows), its settings and state. PPO and the environments
(the ``rl`` extra) are in ``txl.rl.ppo`` and ``txl.rl.envs``, imported on demand."""

from .config import CoreConfig
from .core import MemoryCore
from .state import CoreState

__all__ = ["CoreConfig", "MemoryCore", "CoreState"]
