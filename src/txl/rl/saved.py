"""A trained agent read back from its run folder (:func:`load_agent`), to act in a loop of one's own, and its
evaluation over fresh episodes (:func:`evaluate_agent`): the mean return, its standard deviation and a 95%
confidence interval, with the policy's most likely actions or with sampled ones. Loading needs no
environment (the checkpoint says what the agent observes and does); evaluating makes the run's task.
Dimensions: E environments, D_obs observation size, A action dimensions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..checkpoint import (
    DamagedCheckpoint,
    checkpoint_step,
    load_extra_tensors,
    load_weights,
    read_checkpoint_meta,
)
from ..config import ConfigError, positive_int
from ..errors import CheckpointError
from ..runs import find_checkpoint
from .agent import ActionSpec, Agent
from .config import RLConfig
from .normalize import RunningMoments
from .run import make_envs, read_rl_config
from .state import TensorState

__all__ = ["SavedAgent", "load_agent", "Returns", "evaluate_agent", "t_quantile"]


class SavedAgent:
    """An agent loaded from a run (:func:`load_agent`), in eval mode, without gradients: ``initial_state``
    and ``act`` for a loop over a gymnasium vector environment::

        state = agent.initial_state(E)
        action, state = agent.act(obs, state, episode_start)   # (E, D_obs), (E,) bool -> (E,) or (E, A)
    """

    def __init__(
        self,
        config: RLConfig,
        agent: Agent,
        checkpoint: Path,
        step: int,
        obs_norm: RunningMoments | None = None,
    ) -> None:
        self.config, self.agent, self.checkpoint, self.step = config, agent, checkpoint, step
        self.obs_norm = obs_norm
        """The training's observation statistics at the checkpoint, frozen (None: observations are not
        normalised, ``ppo.normalize_obs`` off)."""

    @property
    def actions(self) -> ActionSpec:
        """What it acts in."""
        return self.agent.actions

    def initial_state(self, n_envs: int) -> TensorState:
        """The memory of ``n_envs`` environments that have seen nothing."""
        positive_int(n_envs, "n_envs", error=ValueError, field=False)
        state = self.agent.core.initial_state(n_envs)
        assert isinstance(state, TensorState)
        return state

    def act(
        self, obs: Any, state: TensorState, episode_start: Any, *, deterministic: bool = True
    ) -> tuple[np.ndarray, TensorState]:
        """One step of E environments: ``obs`` (E, D_obs) and ``episode_start`` (E,) bool (True where obs is
        an episode's first), arrays or tensors -> the actions, as the environments take them (discrete: (E,)
        integers; continuous: (E, A) clipped to the bounds), and the next state. ``deterministic``: the
        policy's most likely action (else a sample). Observations are the environments' own: a run that
        normalised them has them normalised here with its statistics, frozen (:attr:`obs_norm`)."""
        obs_t = torch.as_tensor(np.asarray(obs, dtype=np.float32))
        start_t = torch.as_tensor(np.asarray(episode_start, dtype=bool))
        if obs_t.dim() != 2 or obs_t.shape[1] != self.agent.obs_dim:
            raise ValueError(f"obs must be (E, {self.agent.obs_dim}), got {tuple(obs_t.shape)}")
        if start_t.shape != (obs_t.shape[0],):
            raise ValueError(
                f"episode_start must be ({obs_t.shape[0]},) for these observations, got {tuple(start_t.shape)}"
            )
        if self.obs_norm is not None:
            clip = self.config.ppo.normalize_clip
            obs_t = torch.as_tensor(self.obs_norm.scale(obs_t.numpy(), clip=clip), dtype=torch.float32)
        with torch.no_grad():
            features, state = self.agent.core.step(obs_t, state, start_t)
            policy, _ = self.agent.heads(features)
            action = self.agent.mode(policy) if deterministic else policy.sample()
        return self.actions.to_env(action), state


def load_agent(run: str | Path, *, checkpoint: str = "latest") -> SavedAgent:
    """The agent of a run folder (made by ``txl rl train`` or :func:`txl.rl.run.train`) from a checkpoint
    named as :func:`txl.runs.find_checkpoint` takes them (default: the latest). Only complete checkpoints are
    read, their checksums checked."""
    config = read_rl_config(Path(run))
    for attempt in range(2):
        folder = find_checkpoint(Path(run), checkpoint)
        try:
            saved = read_checkpoint_meta(folder).get("agent")
            if not isinstance(saved, dict):
                raise CheckpointError(f"{folder}: not a checkpoint of a txl rl run (no agent record)")
            agent = Agent(
                config.agent,
                int(saved["obs_dim"]),
                ActionSpec.from_dict(saved["actions"]),
                config.core,
                separate_critic=config.ppo.separate_critic,
            )
            load_weights(folder, agent)
            step = checkpoint_step(folder)
            obs_norm = _obs_statistics(folder, config)
            break
        except DamagedCheckpoint:
            if attempt == 1:
                raise
    agent.eval()
    return SavedAgent(config, agent, folder, step, obs_norm)


def _obs_statistics(folder: Path, config: RLConfig) -> RunningMoments | None:
    """The observation statistics saved in a checkpoint of a run that normalised its observations."""
    if not config.ppo.normalize_obs:
        return None
    saved = load_extra_tensors(folder)
    names = [f"collector.norm.obs.{k}" for k in ("mean", "var", "count")]
    if any(name not in saved for name in names):
        raise CheckpointError(f"{folder}: the run normalised its observations, but no statistics were saved")
    mean, var, count = (saved[name] for name in names)
    return RunningMoments(mean.numpy().copy(), var.numpy().copy(), float(count))


def t_quantile(p: float, df: int) -> float:
    """The ``p`` quantile of Student's t distribution with ``df`` degrees of freedom (0.5 < p < 1), by
    bisection on its distribution function (Simpson's rule over the density)."""
    if not 0.5 < p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < p < 1 and df >= 1, got p={p}, df={df}")
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def density(x: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(x * x / df))

    def cdf(x: float, n: int = 2000) -> float:  # 0.5 + the integral of the density over [0, x]
        h = x / n
        total = density(0) + density(x) + sum((4 if i % 2 else 2) * density(i * h) for i in range(1, n))
        return 0.5 + total * h / 3

    low, high = 0.0, 1.0
    while cdf(high) < p:
        low, high = high, high * 2
    for _ in range(60):
        mid = (low + high) / 2
        low, high = (mid, high) if cdf(mid) < p else (low, mid)
    return (low + high) / 2


@dataclass(frozen=True)
class Returns:
    """The returns of some episodes and their summary: ``mean``, ``std`` (the sample standard deviation,
    0 for one episode) and the 95% confidence interval of the mean (Student's t; the mean itself for one
    episode)."""

    returns: tuple[float, ...]
    lengths: tuple[int, ...]

    @property
    def mean(self) -> float:
        """The mean return."""
        return float(np.mean(self.returns))

    @property
    def std(self) -> float:
        """The sample standard deviation of the return (ddof 1)."""
        return float(np.std(self.returns, ddof=1)) if len(self.returns) > 1 else 0.0

    @property
    def ci95(self) -> tuple[float, float]:
        """The 95% confidence interval of the mean return."""
        n = len(self.returns)
        if n < 2:
            return (self.mean, self.mean)
        half = t_quantile(0.975, n - 1) * self.std / math.sqrt(n)
        return (self.mean - half, self.mean + half)

    def as_dict(self) -> dict[str, Any]:
        """The figures as JSON values: ``mean_return``, ``std_return``, ``ci95_low``, ``ci95_high``,
        ``mean_length``, ``episodes``."""
        low, high = self.ci95
        return {
            "mean_return": self.mean,
            "std_return": self.std,
            "ci95_low": low,
            "ci95_high": high,
            "mean_length": float(np.mean(self.lengths)),
            "episodes": len(self.returns),
        }


def evaluate_agent(
    agent: SavedAgent, episodes: int, *, seed: int, deterministic: bool = True, n_envs: int | None = None
) -> Returns:
    """Run ``episodes`` fresh episodes of the agent's task (``n_envs`` environments at once, default up to
    16) from a reset with ``seed``, with the policy's most likely actions (``deterministic``) or sampled ones
    (drawn from a generator seeded with ``seed``; the caller's random state is left as it was). Each
    environment plays a fixed share of the episodes, so short episodes are not favoured."""
    positive_int(episodes, "episodes", error=ConfigError, field=False)
    n = (
        min(episodes, 16)
        if n_envs is None
        else positive_int(n_envs, "n_envs", error=ConfigError, field=False)
    )
    n = min(n, episodes)
    quota = np.full(n, episodes // n) + (np.arange(n) < episodes % n)  # episodes each environment plays
    envs = make_envs(agent.config.task, n)
    returns: list[float] = []
    lengths: list[int] = []
    try:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            obs, _ = envs.reset(seed=seed)
            state = agent.initial_state(n)
            start = np.ones(n, dtype=bool)
            running, steps, played = np.zeros(n), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.int64)
            while (played < quota).any():
                action, state = agent.act(obs, state, start, deterministic=deterministic)
                obs, reward, terminated, truncated, _ = envs.step(action)
                start = np.logical_or(terminated, truncated)
                running += reward
                steps += 1
                for i in np.flatnonzero(start):
                    if played[i] < quota[i]:
                        returns.append(float(running[i]))
                        lengths.append(int(steps[i]))
                        played[i] += 1
                    running[i], steps[i] = 0.0, 0
    finally:
        envs.close()
    return Returns(tuple(returns), tuple(lengths))
