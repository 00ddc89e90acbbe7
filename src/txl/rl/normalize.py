"""Running statistics of what the environments return, and the normalisation PPO applies with them
(``ppo.normalize_obs``, ``ppo.normalize_reward``): observations centred and scaled by their running mean and
variance, rewards scaled by the running standard deviation of each environment's discounted return, both
clipped, as Stable-Baselines3's ``VecNormalize``. The statistics are float64 and travel in a checkpoint as
tensors, so that a resumed run continues exactly and an evaluation uses the training's statistics, frozen.
Dimensions: E environments, D_obs observation size.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..config import ConfigError

__all__ = ["RunningMoments", "Normalizer", "EPSILON", "INITIAL_COUNT"]

EPSILON = 1e-8
"""Added to a variance before its square root divides."""

INITIAL_COUNT = 1e-4
"""The weight of the initial statistics (mean 0, variance 1) before the first batch: nearly none."""


@dataclass
class RunningMoments:
    """The mean and (population) variance of all the rows seen so far, and their count, updated a batch at a
    time (the pairwise combination of Chan, Golub and LeVeque): ``mean`` and ``var`` of one row's shape."""

    mean: np.ndarray
    var: np.ndarray
    count: float

    @classmethod
    def empty(cls, shape: tuple[int, ...]) -> RunningMoments:
        """Mean 0, variance 1, weighted :data:`INITIAL_COUNT`."""
        return cls(np.zeros(shape), np.ones(shape), INITIAL_COUNT)

    def update(self, batch: np.ndarray) -> None:
        """Add the rows of ``batch`` (N, ...) to the statistics."""
        batch = np.asarray(batch, dtype=np.float64)
        n = batch.shape[0]
        batch_mean, batch_var = batch.mean(axis=0), batch.var(axis=0)
        delta = batch_mean - self.mean
        total = self.count + n
        squares = self.var * self.count + batch_var * n + delta**2 * self.count * n / total
        self.mean = self.mean + delta * n / total
        self.var = squares / total
        self.count = total

    def scale(self, x: np.ndarray, *, clip: float, center: bool = True) -> np.ndarray:
        """``(x - mean) / sqrt(var + EPSILON)`` (without ``- mean`` unless ``center``), clipped to
        ``[-clip, clip]``."""
        shifted = np.asarray(x, dtype=np.float64) - (self.mean if center else 0.0)
        return np.clip(shifted / np.sqrt(self.var + EPSILON), -clip, clip)


@dataclass
class Normalizer:
    """The normalisation of E environments' observations (``obs``: their running moments, None when off) and
    rewards (``returns``: the running moments of the discounted returns, None when off; ``running`` (E,), each
    environment's discounted return so far, reset when its episode ends)."""

    obs: RunningMoments | None
    returns: RunningMoments | None
    running: np.ndarray
    gamma: float
    clip: float

    @classmethod
    def begin(
        cls, n_envs: int, obs_dim: int, *, obs: bool, reward: bool, gamma: float, clip: float
    ) -> Normalizer:
        """Statistics of nothing yet, for what is switched on."""
        return cls(
            RunningMoments.empty((obs_dim,)) if obs else None,
            RunningMoments.empty(()) if reward else None,
            np.zeros(n_envs),
            gamma,
            clip,
        )

    def observe(self, obs: np.ndarray) -> Tensor:
        """Observations (E, D_obs) the environments returned: add them to the statistics, then normalise them
        (float32 tensor); returned as they are when observations are not normalised."""
        if self.obs is None:
            return torch.as_tensor(obs, dtype=torch.float32)
        self.obs.update(obs)
        return self.normalize_obs(obs)

    def normalize_obs(self, obs: np.ndarray) -> Tensor:
        """Observations (N, D_obs) normalised with the statistics as they are (float32 tensor)."""
        if self.obs is None:
            return torch.as_tensor(obs, dtype=torch.float32)
        return torch.as_tensor(self.obs.scale(obs, clip=self.clip), dtype=torch.float32)

    def reward(self, reward: np.ndarray, done: np.ndarray) -> np.ndarray:
        """Rewards (E,): add them to each environment's discounted return and the return to its statistics,
        then divide the rewards by the returns' standard deviation (clipped); an ended episode's return starts
        again at 0. Returned as they are when rewards are not normalised."""
        if self.returns is None:
            return np.asarray(reward, dtype=np.float64)
        self.running = self.running * self.gamma + reward
        self.returns.update(self.running)
        scaled = self.returns.scale(reward, clip=self.clip, center=False)
        self.running = np.where(done, 0.0, self.running)
        return scaled

    def tensors(self) -> dict[str, Tensor]:
        """The statistics as float64 tensors by name (none when nothing is normalised)."""
        out: dict[str, Tensor] = {}
        for name, moments in (("obs", self.obs), ("returns", self.returns)):
            if moments is not None:
                out[f"{name}.mean"] = torch.as_tensor(np.asarray(moments.mean, dtype=np.float64))
                out[f"{name}.var"] = torch.as_tensor(np.asarray(moments.var, dtype=np.float64))
                out[f"{name}.count"] = torch.tensor(moments.count, dtype=torch.float64)
        if self.returns is not None:
            out["running"] = torch.as_tensor(self.running, dtype=torch.float64)
        return out

    def load(self, tensors: Mapping[str, Tensor]) -> None:
        """Take the statistics :meth:`tensors` gave (a ConfigError when they are not this normaliser's)."""
        if set(tensors) != set(self.tensors()):
            raise ConfigError(
                f"the saved normalisation statistics are {sorted(tensors)}, this run's {sorted(self.tensors())}"
            )
        for name, moments in (("obs", self.obs), ("returns", self.returns)):
            if moments is not None:
                moments.mean = tensors[f"{name}.mean"].numpy().copy()
                moments.var = tensors[f"{name}.var"].numpy().copy()
                moments.count = float(tensors[f"{name}.count"])
        if self.returns is not None:
            self.running = tensors["running"].numpy().copy()
