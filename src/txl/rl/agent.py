"""An agent: a core with memory (:data:`~txl.rl.config.AgentKind`) under a policy head and a value head. The
policy is categorical for a discrete action space and Gaussian for a continuous one (a mean per action
dimension from the features, a log standard deviation that is a parameter of its own, as Stable-Baselines3's);
:class:`ActionSpec` says which, in JSON, so that a saved agent needs no environment to be loaded. Dimensions:
E environments, D feature size, A action dimensions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol, cast

import numpy as np
import torch
from torch import Tensor, nn
from torch.distributions import Categorical, Distribution, Independent, Normal

from ..config import ConfigError
from .baselines import GRUCore, LSTMCore, MLPCore
from .config import AgentKind, CoreConfig
from .core import MemoryCore
from .state import TensorState

__all__ = ["ActionSpec", "Core", "SplitCore", "Agent", "build_core"]


@dataclass(frozen=True)
class ActionSpec:
    """What the agent acts in: ``Discrete(n, start)`` (``n`` set) or a 1-D ``Box`` (``low`` and ``high``,
    one bound per dimension; infinite bounds allowed)."""

    n: int | None = None
    """The number of discrete actions; None for a continuous space."""
    start: int = 0
    """The first discrete action (gymnasium's ``Discrete(n, start=...)``)."""
    low: tuple[float, ...] = ()
    """The continuous actions' lower bounds (A,)."""
    high: tuple[float, ...] = ()
    """The continuous actions' upper bounds (A,)."""

    def __post_init__(self) -> None:
        if self.n is not None:
            if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
                raise ConfigError(f"n: must be a positive number of actions, got {self.n!r}")
        elif not self.low or len(self.low) != len(self.high):
            raise ConfigError(
                f"a continuous action space needs low and high of one length >= 1, got {self.low} and {self.high}"
            )

    @property
    def discrete(self) -> bool:
        """Whether the actions are discrete."""
        return self.n is not None

    @property
    def size(self) -> int:
        """Logits (discrete) or action dimensions (continuous) the policy head outputs."""
        return self.n if self.n is not None else len(self.low)

    @classmethod
    def of(cls, space: Any) -> ActionSpec:
        """The spec of a gymnasium action space: ``Discrete`` or a 1-D ``Box`` (ConfigError for another)."""
        kind = type(space).__name__
        if kind == "Discrete":
            return cls(n=int(space.n), start=int(space.start))
        if kind == "Box" and len(space.shape) == 1:
            low = np.asarray(space.low, dtype=np.float64)
            high = np.asarray(space.high, dtype=np.float64)
            return cls(low=tuple(map(float, low)), high=tuple(map(float, high)))
        shape = getattr(space, "shape", None)
        raise ConfigError(
            f"the action space must be Discrete or a 1-D Box, got {kind}{'' if shape is None else f' {shape}'}"
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain values for JSON (infinite bounds as null)."""
        if self.n is not None:
            return {"n": self.n, "start": self.start}
        return {
            "low": [v if math.isfinite(v) else None for v in self.low],
            "high": [v if math.isfinite(v) else None for v in self.high],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ActionSpec:
        """The inverse of :meth:`to_dict`."""
        if data.get("n") is not None:
            return cls(n=int(data["n"]), start=int(data.get("start", 0)))
        low = tuple(-math.inf if v is None else float(v) for v in data["low"])
        high = tuple(math.inf if v is None else float(v) for v in data["high"])
        return cls(low=low, high=high)

    def to_env(self, action: Tensor) -> np.ndarray:
        """Actions as the environments take them: discrete (E,) shifted by ``start``; continuous (E, A)
        clipped to the bounds (the policy's sample itself is what the log-probabilities are of)."""
        if self.n is not None:
            return action.numpy() + self.start
        low = np.asarray(self.low, dtype=np.float32)
        high = np.asarray(self.high, dtype=np.float32)
        return np.clip(action.numpy().astype(np.float32), low, high)


class Core(Protocol):
    """What an agent needs of a core (:class:`~txl.rl.MemoryCore`, the baselines): its state for E
    environments, one step of them, and a window of T steps from a stored state."""

    def initial_state(self, n_envs: int) -> Any: ...

    def step(self, obs: Tensor, state: Any, episode_start: Tensor) -> tuple[Tensor, Any]: ...

    def window(self, obs: Tensor, state0: Any, starts: Tensor) -> tuple[Tensor, Any]: ...


def build_core(kind: AgentKind, obs_dim: int, config: CoreConfig) -> nn.Module:
    """The core of an agent of ``kind`` over observations of ``obs_dim``: the XL core with ``config``, or a
    baseline of ``config.d_model`` features."""
    if kind == "xl":
        return MemoryCore(obs_dim, config)
    if kind == "gru":
        return GRUCore(obs_dim, config.d_model)
    if kind == "lstm":
        return LSTMCore(obs_dim, config.d_model)
    if kind == "mlp":
        return MLPCore(obs_dim, config.d_model)
    raise ConfigError(f"agent: must be one of 'xl', 'gru', 'lstm', 'mlp', got {kind!r}")


class SplitCore(nn.Module):
    """Two cores of one kind side by side, the actor's and the critic's, behind the one core interface: the
    features (..., 2D) are the actor core's then the critic core's; the state is the two cores' states with
    each floating-point tensor joined along its last dimension (D) and the integer ones (the XL core's
    reach, which follows the episode starts alone) shared."""

    def __init__(self, actor: nn.Module, critic: nn.Module, d_model: int) -> None:
        super().__init__()
        self.actor: Core = cast(Core, actor)
        self.critic: Core = cast(Core, critic)
        self.d_model = d_model

    def _split(self, state: TensorState) -> tuple[TensorState, TensorState]:
        d = self.d_model
        tensors = state.tensors()
        actor = [t[..., :d] if t.is_floating_point() else t for t in tensors]
        critic = [t[..., d:] if t.is_floating_point() else t for t in tensors]
        return type(state)(*actor), type(state)(*critic)

    @staticmethod
    def _join(actor: TensorState, critic: TensorState) -> TensorState:
        pairs = zip(actor.tensors(), critic.tensors(), strict=True)
        return type(actor)(*(torch.cat([a, c], dim=-1) if a.is_floating_point() else a for a, c in pairs))

    def initial_state(self, n_envs: int) -> TensorState:
        """The two cores' initial states, joined."""
        return self._join(self.actor.initial_state(n_envs), self.critic.initial_state(n_envs))

    def step(self, obs: Tensor, state: TensorState, episode_start: Tensor) -> tuple[Tensor, TensorState]:
        """obs (E, D_obs), episode_start (E,) -> features (E, 2D), the next joined state."""
        actor_state, critic_state = self._split(state)
        actor_features, actor_state = self.actor.step(obs, actor_state, episode_start)
        critic_features, critic_state = self.critic.step(obs, critic_state, episode_start)
        return torch.cat([actor_features, critic_features], dim=-1), self._join(actor_state, critic_state)

    def window(self, obs: Tensor, state0: TensorState, starts: Tensor) -> tuple[Tensor, TensorState]:
        """obs (E, T, D_obs), starts (E, T) -> features (E, T, 2D), the joined state after."""
        actor_state, critic_state = self._split(state0)
        actor_features, actor_state = self.actor.window(obs, actor_state, starts)
        critic_features, critic_state = self.critic.window(obs, critic_state, starts)
        return torch.cat([actor_features, critic_features], dim=-1), self._join(actor_state, critic_state)


class Agent(nn.Module):
    """A core with a policy head and a value head on its features (D): ``heads`` gives the policy (a
    distribution over one action per row) and the value. With ``separate_critic`` the value head reads a core
    of its own (:class:`SplitCore`), so that the value loss does not train the policy's core."""

    def __init__(
        self,
        kind: AgentKind,
        obs_dim: int,
        actions: ActionSpec,
        core: CoreConfig,
        *,
        separate_critic: bool = False,
    ) -> None:
        super().__init__()
        self.kind, self.obs_dim, self.actions = kind, obs_dim, actions
        self.separate_critic, self.d_model = separate_critic, core.d_model
        if separate_critic:
            actor_core, critic_core = build_core(kind, obs_dim, core), build_core(kind, obs_dim, core)
            self.core: Core = SplitCore(actor_core, critic_core, core.d_model)
        else:
            self.core = build_core(kind, obs_dim, core)  # type: ignore[assignment]
        self.actor = nn.Linear(core.d_model, actions.size)
        self.critic = nn.Linear(core.d_model, 1)
        nn.init.orthogonal_(self.actor.weight, 0.01)
        nn.init.zeros_(self.actor.bias)
        if not actions.discrete:  # the Gaussian's log standard deviation, the same in every state
            self.log_std = nn.Parameter(torch.zeros(actions.size))

    def heads(self, features: Tensor) -> tuple[Distribution, Tensor]:
        """features (..., D) -> the policy (one action per row of ``...``) and the value (...)."""
        if self.separate_critic:  # features (..., 2D): the actor core's, then the critic core's
            out = self.actor(features[..., : self.d_model])  # (..., A)
            value = self.critic(features[..., self.d_model :])[..., 0]
        else:
            out = self.actor(features)  # (..., A)
            value = self.critic(features)[..., 0]
        if self.actions.discrete:
            return Categorical(logits=out), value
        return Independent(Normal(out, self.log_std.exp().expand_as(out)), 1), value

    def mode(self, policy: Distribution) -> Tensor:
        """The policy's most likely action: the arg-max (discrete) or the mean (continuous)."""
        if isinstance(policy, Categorical):
            return policy.probs.argmax(dim=-1)
        return policy.mean
