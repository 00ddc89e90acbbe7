"""PPO for agents with memory (``xl``, ``gru``, ``mlp`` cores), CleanRL-style: rollouts collected with the
core's ``step``, training replaying windows with ``window`` from the states stored at each window's start.
Dimensions: E environments, T rollout steps, W windows, S window length (T = W * S), N windows per minibatch.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import math
import resource
import time
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import torch
from torch import Tensor, nn
from torch.distributions import Categorical

from ..config import _check, _one_of, _positive_int
from .baselines import GRUCore, MLPCore
from .config import CoreConfig
from .core import MemoryCore
from .envs import make_vector_env
from .state import TensorState

__all__ = ["AgentKind", "PPOConfig", "Core", "Agent", "gae", "train", "main"]

AgentKind = Literal["xl", "gru", "mlp"]


@dataclass(frozen=True)
class PPOConfig:
    """One PPO run: the task, the agent, the budget and PPO's settings (the same for every agent)."""

    task: str = "RepeatPreviousEasy"
    """A task of :data:`txl.rl.envs.Task`."""
    agent: AgentKind = "xl"
    """The core: ``xl`` (Transformer-XL memory), ``gru``, or ``mlp`` (no memory)."""
    total_steps: int = 400_000
    """Environment steps, all environments together."""
    seed: int = 1
    """Seeds torch and the environments."""
    n_envs: int = 16
    """Environments stepped together (E)."""
    n_steps: int = 128
    """Steps per environment per rollout (T)."""
    seq_len: int = 32
    """Length of the training windows (S), a divisor of ``n_steps``."""
    n_minibatches: int = 4
    """Minibatches per epoch (of windows)."""
    epochs: int = 4
    """Passes over each rollout."""
    lr: float = 3e-4
    """Adam's learning rate, annealed linearly to 0."""
    gamma: float = 0.99
    """Discount."""
    gae_lambda: float = 0.95
    """GAE's lambda."""
    clip: float = 0.2
    """PPO's ratio clip."""
    ent_coef: float = 0.01
    """Entropy bonus."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Gradient norm clip."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before the values and advantages are learned (the logged returns are
    not): for tasks whose returns are large, such as CartPole's (up to 500), a scale that brings them near 1."""
    core: CoreConfig = field(default_factory=CoreConfig)
    """The XL core's sizes; ``core.d_model`` is also the GRU's and the MLP's feature size."""

    def __post_init__(self) -> None:
        _one_of(self, "agent", typing.get_args(AgentKind))
        for name in ("total_steps", "n_envs", "n_steps", "seq_len", "n_minibatches", "epochs"):
            _positive_int(self, name)
        _check(self.n_steps % self.seq_len == 0, "seq_len", f"must divide n_steps ({self.n_steps})")
        scale = self.reward_scale
        _check(
            isinstance(scale, (int, float))
            and not isinstance(scale, bool)
            and math.isfinite(scale)
            and scale > 0,
            "reward_scale",
            f"must be a finite number above 0, got {scale!r}",
        )
        windows = self.n_envs * self.n_steps // self.seq_len
        _check(windows % self.n_minibatches == 0, "n_minibatches", f"must divide the {windows} windows")


class Core(Protocol):
    """What PPO needs of a core (:class:`~txl.rl.MemoryCore`, ``GRUCore``, ``MLPCore``); states are
    :class:`~txl.rl.state.TensorState` values."""

    def initial_state(self, n_envs: int) -> Any: ...

    def step(self, obs: Tensor, state: Any, episode_start: Tensor) -> tuple[Tensor, Any]: ...

    def window(self, obs: Tensor, state0: Any, starts: Tensor) -> tuple[Tensor, Any]: ...


class Agent(nn.Module):
    """A core (XL, GRU or MLP) with a policy head and a value head on its features."""

    def __init__(self, kind: AgentKind, obs_dim: int, n_actions: int, core: CoreConfig) -> None:
        super().__init__()
        self.core: Core
        if kind == "xl":
            self.core = MemoryCore(obs_dim, core)
        elif kind == "gru":
            self.core = GRUCore(obs_dim, core.d_model)
        else:
            self.core = MLPCore(obs_dim, core.d_model)
        self.actor = nn.Linear(core.d_model, n_actions)
        self.critic = nn.Linear(core.d_model, 1)
        nn.init.orthogonal_(self.actor.weight, 0.01)
        nn.init.zeros_(self.actor.bias)

    def heads(self, features: Tensor) -> tuple[Categorical, Tensor]:
        """features (..., D) -> the policy over actions and the value (...)."""
        return Categorical(logits=self.actor(features)), self.critic(features)[..., 0]


def gae(
    rewards: Tensor, values: Tensor, dones: Tensor, next_value: Tensor, *, gamma: float, lam: float
) -> Tensor:
    """Generalised advantage estimates (E, T): ``dones[:, t]`` is True where step t ended an episode (its
    next observation is a new episode's first); ``next_value`` (E,) the value after the rollout."""
    advantages = torch.zeros_like(rewards)
    last = torch.zeros_like(next_value)
    for t in reversed(range(rewards.shape[1])):
        following = next_value if t == rewards.shape[1] - 1 else values[:, t + 1]
        live = 1.0 - dones[:, t].to(rewards.dtype)
        delta = rewards[:, t] + gamma * following * live - values[:, t]
        last = delta + gamma * lam * live * last
        advantages[:, t] = last
    return advantages


@dataclass
class _Collector:
    """What carries over from one rollout to the next: the environments, their last observations, which of
    them begin an episode, the core's state, and each environment's running return and length."""

    envs: Any
    obs: Tensor  # (E, D_obs)
    start: Tensor  # (E,) bool
    state: Any
    running: np.ndarray  # (E,)
    lengths: np.ndarray  # (E,)


@dataclass
class _Collected:
    """One rollout: its tensors, the core states at each window's start, what the updates train towards,
    and the episodes that ended in it (return, length)."""

    batch: _Rollout
    window_states: list[TensorState]
    advantages: Tensor  # (E, T)
    returns: Tensor  # (E, T)
    finished: list[tuple[float, int]]


def _collect(agent: Agent, env: _Collector, config: PPOConfig) -> _Collected:
    """Step the E environments T times with the core's ``step`` (no gradients), storing the core state at
    each window's start; then the advantages and returns of the rollout."""
    s = config.seq_len
    batch = _Rollout.empty(config.n_envs, config.n_steps, env.obs.shape[1])
    window_states: list[TensorState] = []
    finished: list[tuple[float, int]] = []
    with torch.no_grad():
        for t in range(config.n_steps):
            if t % s == 0:
                window_states.append(env.state)
            features, env.state = agent.core.step(env.obs, env.state, env.start)
            policy, value = agent.heads(features)
            action = policy.sample()
            batch.put(
                t, obs=env.obs, start=env.start, action=action, logp=policy.log_prob(action), value=value
            )
            next_obs, reward, terminated, truncated, _ = env.envs.step(action.numpy())
            done = np.logical_or(terminated, truncated)
            batch.rewards[:, t] = torch.as_tensor(reward, dtype=torch.float32) * config.reward_scale
            batch.dones[:, t] = torch.as_tensor(done)
            env.running += reward
            env.lengths += 1
            for i in np.flatnonzero(done):
                finished.append((float(env.running[i]), int(env.lengths[i])))
                env.running[i], env.lengths[i] = 0.0, 0
            env.obs = torch.as_tensor(next_obs, dtype=torch.float32)
            env.start = torch.as_tensor(done)
        next_value = agent.heads(agent.core.step(env.obs, env.state, env.start)[0])[1]
        advantages = gae(
            batch.rewards, batch.values, batch.dones, next_value, gamma=config.gamma, lam=config.gae_lambda
        )
    return _Collected(batch, window_states, advantages, advantages + batch.values, finished)


def _update(
    agent: Agent, optimizer: torch.optim.Optimizer, rollout: _Collected, config: PPOConfig
) -> dict[str, float]:
    """``config.epochs`` passes of minibatches of windows (W, E), each replayed with the core's ``window``
    from its stored state; returns the mean of each training figure."""
    e, s = config.n_envs, config.seq_len
    states = type(rollout.window_states[0]).stack(rollout.window_states)  # (W, E, ...)
    windows = rollout.batch.windows(s)  # each (W, E, S, ...)
    adv_w, ret_w = _split(rollout.advantages, s), _split(rollout.returns, s)  # (W, E, S)
    n_windows = states.tensors()[0].shape[0] * e
    stats: dict[str, list[float]] = {
        k: [] for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")
    }
    for _ in range(config.epochs):
        order = torch.randperm(n_windows)
        for chunk in order.chunk(config.n_minibatches):
            w, env = chunk // e, chunk % e  # (N,), (N,)
            features, _ = agent.core.window(windows["obs"][w, env], states[w, env], windows["starts"][w, env])
            policy, value = agent.heads(features)  # (N, S, A), (N, S)
            logp = policy.log_prob(windows["actions"][w, env])
            ratio = (logp - windows["logp"][w, env]).exp()
            adv = adv_w[w, env]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - config.clip, 1 + config.clip)).mean()
            value_loss = 0.5 * (value - ret_w[w, env]).pow(2).mean()
            entropy = policy.entropy().mean()
            loss = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), config.max_grad_norm)
            optimizer.step()
            with torch.no_grad():
                log_ratio = logp - windows["logp"][w, env]
                stats["approx_kl"].append(float(((ratio - 1) - log_ratio).mean()))
                stats["clipfrac"].append(float(((ratio - 1).abs() > config.clip).float().mean()))
            stats["policy_loss"].append(float(policy_loss.detach()))
            stats["value_loss"].append(float(value_loss.detach()))
            stats["entropy"].append(float(entropy.detach()))
    return {k: float(np.mean(v)) for k, v in stats.items()}


def train(
    config: PPOConfig, *, envs: Any = None, out: Path | None = None, progress: bool = True
) -> list[dict[str, Any]]:
    """Run PPO; returns one row per rollout (also written to ``out/{task}_{agent}_s{seed}.csv``). ``envs``:
    a gymnasium vector environment of ``n_envs`` that resets in the step where an episode ends (default: the
    task's, :func:`txl.rl.envs.make_vector_env`)."""
    from tqdm import tqdm

    torch.manual_seed(config.seed)
    e = config.n_envs
    envs = make_vector_env(config.task, e) if envs is None else envs
    agent = Agent(
        config.agent, envs.single_observation_space.shape[0], envs.single_action_space.n, config.core
    )
    optimizer = torch.optim.Adam(agent.parameters(), lr=config.lr, eps=1e-5)
    n_updates = max(1, config.total_steps // (e * config.n_steps))
    writer, handle = _csv_writer(out, config)
    rows: list[dict[str, Any]] = []
    obs = torch.as_tensor(envs.reset(seed=config.seed)[0], dtype=torch.float32)  # (E, D_obs)
    # the first observations begin episodes
    env = _Collector(
        envs,
        obs,
        torch.ones(e, dtype=torch.bool),
        agent.core.initial_state(e),
        np.zeros(e),
        np.zeros(e, dtype=np.int64),
    )
    wall0, cpu0 = time.perf_counter(), _cpu_seconds()
    bar = tqdm(
        total=n_updates * e * config.n_steps,
        unit="step",
        disable=not progress,
        desc=f"{config.task} {config.agent}",
    )
    for update in range(n_updates):
        for group in optimizer.param_groups:
            group["lr"] = config.lr * (1.0 - update / n_updates)
        rollout = _collect(agent, env, config)
        stats = _update(agent, optimizer, rollout, config)
        steps = (update + 1) * e * config.n_steps
        wall = time.perf_counter() - wall0
        finished = rollout.finished
        row: dict[str, Any] = {
            "task": config.task,
            "agent": config.agent,
            "seed": config.seed,
            "update": update + 1,
            "global_step": steps,
            "episodes": len(finished),
            "return_mean": float(np.mean([r for r, _ in finished])) if finished else math.nan,
            "length_mean": float(np.mean([n for _, n in finished])) if finished else math.nan,
            **stats,
            "steps_per_s": steps / wall,
            "wall_s": wall,
            "cpu_s": _cpu_seconds() - cpu0,
        }
        rows.append(row)
        if writer is not None:
            writer.writerow(row)
            handle.flush()
        bar.update(e * config.n_steps)
        bar.set_postfix(ret=f"{row['return_mean']:.3f}")
    bar.close()
    if handle is not None:
        handle.close()
    envs.close()
    return rows


@dataclass
class _Rollout:
    """The rollout's tensors, (E, T, ...) each."""

    obs: Tensor
    starts: Tensor
    actions: Tensor
    logp: Tensor
    values: Tensor
    rewards: Tensor
    dones: Tensor

    @classmethod
    def empty(cls, e: int, t: int, obs_dim: int) -> _Rollout:
        z = torch.zeros
        return cls(
            z(e, t, obs_dim),
            z(e, t, dtype=torch.bool),
            z(e, t, dtype=torch.long),
            z(e, t),
            z(e, t),
            z(e, t),
            z(e, t, dtype=torch.bool),
        )

    def put(self, t: int, *, obs: Tensor, start: Tensor, action: Tensor, logp: Tensor, value: Tensor) -> None:
        self.obs[:, t], self.starts[:, t], self.actions[:, t] = obs, start, action
        self.logp[:, t], self.values[:, t] = logp, value

    def windows(self, s: int) -> dict[str, Tensor]:
        """What training reads, cut into windows of S steps: (W, E, S, ...) each."""
        return {name: _split(getattr(self, name), s) for name in ("obs", "starts", "actions", "logp")}


def _split(x: Tensor, s: int) -> Tensor:
    """(E, T, ...) -> (W, E, S, ...) with T = W * S."""
    e, t = x.shape[:2]
    return x.reshape(e, t // s, s, *x.shape[2:]).transpose(0, 1)


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


_COLUMNS = (
    "task agent seed update global_step episodes return_mean length_mean policy_loss value_loss entropy "
    "approx_kl clipfrac steps_per_s wall_s cpu_s"
).split()


def _csv_writer(out: Path | None, config: PPOConfig) -> tuple[Any, Any]:
    if out is None:
        return None, None
    out.mkdir(parents=True, exist_ok=True)
    handle = open(out / f"{config.task}_{config.agent}_s{config.seed}.csv", "w", newline="")  # noqa: SIM115
    writer = csv.DictWriter(handle, fieldnames=_COLUMNS)
    writer.writeheader()
    return writer, handle


# -- command line -------------------------------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m txl.rl.ppo",
        description="PPO with a Transformer-XL (xl), GRU or MLP core on a memory task; writes a CSV per run.",
    )
    for f in dataclasses.fields(PPOConfig):
        if f.name != "core":
            parser.add_argument(
                f"--{f.name}", type=type(f.default), default=f.default, help=f"(default {f.default})"
            )
    for f in dataclasses.fields(CoreConfig):
        parser.add_argument(
            f"--core.{f.name}", dest=f"core_{f.name}", type=type(f.default), default=f.default
        )
    parser.add_argument("--out", type=Path, default=Path("runs/rl"), help="folder of the CSV logs")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m txl.rl.ppo``: one run, its CSV in ``--out``; prints the last rollout's figures."""
    args = vars(_parser().parse_args(argv))
    torch.set_num_threads(args.pop("threads"))
    out, quiet = args.pop("out"), args.pop("no_progress")
    core = CoreConfig(**{k[5:]: args.pop(k) for k in list(args) if k.startswith("core_")})
    rows = train(PPOConfig(**args, core=core), out=out, progress=not quiet)
    last = rows[-1]
    print(
        f"{last['task']} {last['agent']} seed {last['seed']}: {last['global_step']} steps, return {last['return_mean']:.3f}, "
        f"{last['steps_per_s']:.0f} steps/s, wall {last['wall_s']:.0f} s, cpu {last['cpu_s']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
