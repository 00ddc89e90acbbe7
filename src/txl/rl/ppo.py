"""PPO for agents with memory, CleanRL-style. The :class:`Collector` steps the environments with the core's
``step`` and keeps what carries over from one rollout to the next; :func:`update` replays the rollout's
training windows with the core's ``window``, each from the memory stored at its start; :func:`refresh_memory`
applies the rule for the memory after an update (``ppo.memory_after_update``). Run folders, checkpoints and
resuming are :mod:`txl.rl.run`'s. Dimensions: E environments, T rollout steps, W windows, S window length
(T = W * S), N windows per minibatch, H remembered observations, D_obs observation size, A action dimensions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..config import ConfigError
from .agent import ActionSpec, Agent
from .config import MemoryAfterUpdate, PPOConfig
from .normalize import Normalizer
from .state import TensorState

__all__ = [
    "Rollout",
    "Collected",
    "History",
    "Collector",
    "check_vector_env",
    "gae",
    "collect",
    "truncation_values",
    "update",
    "refresh_memory",
]


def check_vector_env(envs: Any, n_envs: int) -> ActionSpec:
    """Refuse (ConfigError, one line) a vector environment PPO cannot train on: one that resets an ended
    environment in the next step (gymnasium's default ``NEXT_STEP``: every episode would begin one step late,
    on the observation that ended the previous one), another number of environments than ``n_envs``, or
    observations that are not a flat ``Box``. Returns its :class:`~txl.rl.agent.ActionSpec`."""
    metadata = getattr(envs, "metadata", None) or {}
    mode = metadata.get("autoreset_mode")
    if str(getattr(mode, "value", mode)) != "SameStep":
        raise ConfigError(
            f"envs: the vector environment resets an ended episode with autoreset mode {mode}; PPO needs "
            "AutoresetMode.SAME_STEP (the observation after a done is the next episode's first), as "
            "txl.rl.envs.make_vector_env makes: gymnasium.vector.SyncVectorEnv(..., "
            "autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP)"
        )
    count = getattr(envs, "num_envs", None)
    if count != n_envs:
        raise ConfigError(f"ppo.n_envs: {n_envs}, but the vector environment steps {count} environments")
    space = envs.single_observation_space
    if type(space).__name__ != "Box" or len(space.shape) != 1:
        raise ConfigError(
            f"envs: observations must be a flat Box (D_obs,), got {type(space).__name__} "
            f"{getattr(space, 'shape', '')}"
        )
    return ActionSpec.of(envs.single_action_space)


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
class Rollout:
    """The rollout's tensors, (E, T, ...) each: what the core was given (observations, episode starts), what
    the policy did (actions: (E, T) discrete or (E, T, A) continuous, the unclipped samples; their
    log-probabilities), the values, and what the environments returned."""

    obs: Tensor
    starts: Tensor
    actions: Tensor
    logp: Tensor
    values: Tensor
    rewards: Tensor
    dones: Tensor

    @classmethod
    def empty(cls, e: int, t: int, obs_dim: int, actions: ActionSpec) -> Rollout:
        """Zeros for E environments and T steps."""
        z = torch.zeros
        action = z(e, t, dtype=torch.long) if actions.discrete else z(e, t, actions.size)
        return cls(
            z(e, t, obs_dim),
            z(e, t, dtype=torch.bool),
            action,
            z(e, t),
            z(e, t),
            z(e, t),
            z(e, t, dtype=torch.bool),
        )

    def windows(self, s: int) -> dict[str, Tensor]:
        """What training reads, cut into windows of S steps: (W, E, S, ...) each."""
        return {name: _split(getattr(self, name), s) for name in ("obs", "starts", "actions", "logp")}


def _split(x: Tensor, s: int) -> Tensor:
    """(E, T, ...) -> (W, E, S, ...) with T = W * S."""
    e, t = x.shape[:2]
    return x.reshape(e, t // s, s, *x.shape[2:]).transpose(0, 1)


@dataclass
class Collected:
    """One rollout: its tensors, the core states at each window's start, what the updates train towards,
    and the episodes that ended in it (return, length)."""

    batch: Rollout
    window_states: list[TensorState]
    advantages: Tensor  # (E, T)
    returns: Tensor  # (E, T)
    finished: list[tuple[float, int]]


@dataclass
class History:
    """Each environment's last H observations and episode starts, oldest first: what ``recompute`` re-reads.
    Slots before an environment's first observation hold zeros marked as episode starts."""

    obs: Tensor  # (E, H, D_obs)
    starts: Tensor  # (E, H) bool

    @classmethod
    def empty(cls, e: int, h: int, obs_dim: int) -> History:
        """No observation seen yet."""
        return cls(torch.zeros(e, h, obs_dim), torch.ones(e, h, dtype=torch.bool))

    def push(self, obs: Tensor, start: Tensor) -> None:
        """Append one step, obs (E, D_obs) and start (E,), dropping the oldest."""
        self.obs = torch.cat((self.obs[:, 1:], obs[:, None]), dim=1)
        self.starts = torch.cat((self.starts[:, 1:], start[:, None]), dim=1)


@dataclass
class Collector:
    """What carries over from one rollout to the next: the environments, their last observations (not yet
    given to the core; normalised where ``ppo.normalize_obs``), which of them begin an episode, the core's
    state, each environment's running return and length, (for ``recompute``) their last observations, and
    the normalisation's running statistics (:class:`~txl.rl.normalize.Normalizer`)."""

    envs: Any
    obs: Tensor  # (E, D_obs)
    start: Tensor  # (E,) bool
    state: TensorState
    running: np.ndarray  # (E,) float64
    lengths: np.ndarray  # (E,) int64
    history: History | None = None
    norm: Normalizer | None = None

    @classmethod
    def begin(
        cls,
        envs: Any,
        agent: Agent,
        *,
        seed: int | None,
        history: int = 0,
        norm: Normalizer | None = None,
    ) -> Collector:
        """Reset the environments (with ``seed``) and start every one on a new episode with an empty memory;
        keep the last ``history`` observations of each (0: none); normalise with ``norm`` (None: never),
        whose statistics the first observations join."""
        raw = envs.reset(seed=seed)[0]
        # (E, D_obs), normalised with the statistics they join
        obs = torch.as_tensor(raw, dtype=torch.float32) if norm is None else norm.observe(raw)
        e = obs.shape[0]
        state = agent.core.initial_state(e)
        if not isinstance(state, TensorState):
            raise TypeError(f"a core's state must be a TensorState, got {type(state).__name__}")
        return cls(
            envs,
            obs,
            torch.ones(e, dtype=torch.bool),  # the first observations begin episodes
            state,
            np.zeros(e),
            np.zeros(e, dtype=np.int64),
            History.empty(e, history, obs.shape[1]) if history > 0 else None,
            norm,
        )

    def tensors(self) -> dict[str, Tensor]:
        """Its tensors by name, for a checkpoint (the inverse of :meth:`load`)."""
        out = {"obs": self.obs, "start": self.start}
        out.update({f"state.{i}": t for i, t in enumerate(self.state.tensors())})
        if self.history is not None:
            out.update({"history.obs": self.history.obs, "history.starts": self.history.starts})
        if self.norm is not None:
            out.update({f"norm.{k}": t for k, t in self.norm.tensors().items()})
        return {name: t.detach().contiguous() for name, t in out.items()}

    def record(self) -> dict[str, Any]:
        """Its running returns and lengths as JSON values (exact: a float's repr reads back the same)."""
        return {"running": [float(v) for v in self.running], "lengths": [int(v) for v in self.lengths]}

    def load(self, tensors: Mapping[str, Tensor], record: Mapping[str, Any]) -> None:
        """Take the values :meth:`tensors` and :meth:`record` gave, checking their shapes against its own."""
        mine = self.tensors()
        if set(tensors) != set(mine):
            raise ConfigError(
                f"the collector's saved tensors are {sorted(tensors)}, this run's {sorted(mine)}"
            )
        for name, value in tensors.items():
            if value.shape != mine[name].shape or value.dtype != mine[name].dtype:
                raise ConfigError(
                    f"the collector's saved {name} is {value.dtype} {tuple(value.shape)}, this run's "
                    f"{mine[name].dtype} {tuple(mine[name].shape)}"
                )
        self.obs, self.start = tensors["obs"], tensors["start"]
        count = len(self.state.tensors())
        self.state = type(self.state)(*(tensors[f"state.{i}"] for i in range(count)))
        if self.history is not None:
            self.history = History(tensors["history.obs"], tensors["history.starts"])
        if self.norm is not None:
            self.norm.load({k[len("norm.") :]: t for k, t in tensors.items() if k.startswith("norm.")})
        self.running = np.asarray(record["running"], dtype=np.float64)
        self.lengths = np.asarray(record["lengths"], dtype=np.int64)


def collect(agent: Agent, env: Collector, config: PPOConfig) -> Collected:
    """Step the E environments T times with the core's ``step`` (no gradients), storing the core state at
    each window's start; then the advantages and returns of the rollout. Continuous actions are clipped to
    the action space's bounds for the environments; the rollout keeps the policy's own samples. Observations
    and rewards are normalised as ``config`` says (the collector's :class:`~txl.rl.normalize.Normalizer`);
    with ``config.bootstrap_truncated`` the last reward of an episode cut by a time limit gains ``gamma``
    times the value of its last observation (:func:`truncation_values`)."""
    s = config.seq_len
    batch = Rollout.empty(config.n_envs, config.n_steps, env.obs.shape[1], agent.actions)
    window_states: list[TensorState] = []
    finished: list[tuple[float, int]] = []
    with torch.no_grad():
        for t in range(config.n_steps):
            if t % s == 0:
                window_states.append(env.state)
            if env.history is not None:
                env.history.push(env.obs, env.start)
            features, env.state = agent.core.step(env.obs, env.state, env.start)
            policy, value = agent.heads(features)
            action = policy.sample()
            batch.obs[:, t], batch.starts[:, t], batch.actions[:, t] = env.obs, env.start, action
            batch.logp[:, t], batch.values[:, t] = policy.log_prob(action), value
            next_obs, reward, terminated, truncated, info = env.envs.step(agent.actions.to_env(action))
            done = np.logical_or(terminated, truncated)
            if env.norm is None:
                batch.rewards[:, t] = torch.as_tensor(reward, dtype=torch.float32) * config.reward_scale
                next_t = torch.as_tensor(next_obs, dtype=torch.float32)
            else:
                scaled = env.norm.reward(np.asarray(reward, dtype=np.float64) * config.reward_scale, done)
                batch.rewards[:, t] = torch.as_tensor(scaled, dtype=torch.float32)
                next_t = env.norm.observe(next_obs)
            if config.bootstrap_truncated:
                cut = np.flatnonzero(np.logical_and(truncated, np.logical_not(terminated)))
                if cut.size:
                    final = _final_obs(info, cut, env.norm)
                    rows = torch.as_tensor(cut)
                    batch.rewards[rows, t] += config.gamma * truncation_values(agent, final, env.state[rows])
            batch.dones[:, t] = torch.as_tensor(done)
            env.running += reward
            env.lengths += 1
            for i in np.flatnonzero(done):
                finished.append((float(env.running[i]), int(env.lengths[i])))
                env.running[i], env.lengths[i] = 0.0, 0
            env.obs = next_t
            env.start = torch.as_tensor(done)
        next_value = agent.heads(agent.core.step(env.obs, env.state, env.start)[0])[1]
        advantages = gae(
            batch.rewards, batch.values, batch.dones, next_value, gamma=config.gamma, lam=config.gae_lambda
        )
    return Collected(batch, window_states, advantages, advantages + batch.values, finished)


def _final_obs(info: Mapping[str, Any], envs: np.ndarray, norm: Normalizer | None) -> Tensor:
    """The last observations (N, D_obs) of the episodes of environments ``envs`` (N,) that the step ended
    (gymnasium's ``final_obs``, as the vector environment's same-step autoreset gives them), normalised with
    the statistics as they are."""
    rows = np.stack([np.asarray(info["final_obs"][i], dtype=np.float32) for i in envs])  # (N, D_obs)
    return norm.normalize_obs(rows) if norm is not None else torch.as_tensor(rows)


def truncation_values(agent: Agent, final_obs: Tensor, state: TensorState) -> Tensor:
    """The values (N,) of the last observations (N, D_obs) of N episodes cut by a time limit, each one more
    step of the core from ``state`` (the state after the episode's last acted step)."""
    features, _ = agent.core.step(final_obs, state, torch.zeros(final_obs.shape[0], dtype=torch.bool))
    return agent.heads(features)[1]


def update(
    agent: Agent,
    optimizer: torch.optim.Optimizer,
    rollout: Collected,
    config: PPOConfig,
    *,
    clip: float | None = None,
) -> dict[str, float]:
    """``config.epochs`` passes of minibatches of windows (W, E), each replayed with the core's ``window``
    from its stored state, minimising PPO's clipped surrogate (advantages normalised per minibatch; the
    ratio clipped to ``1 ± clip``, default ``config.clip``), the value loss and the entropy bonus; returns the
    mean of each training figure."""
    e, s = config.n_envs, config.seq_len
    clip = config.clip if clip is None else clip
    states = type(rollout.window_states[0]).stack(rollout.window_states)  # (W, E, ...)
    windows = rollout.batch.windows(s)  # each (W, E, S, ...)
    adv_w, ret_w = _split(rollout.advantages, s), _split(rollout.returns, s)  # (W, E, S)
    n_windows = len(rollout.window_states) * e
    stats: dict[str, list[float]] = {
        k: [] for k in ("policy_loss", "value_loss", "entropy", "approx_kl", "clipfrac")
    }
    for _ in range(config.epochs):
        order = torch.randperm(n_windows)
        for chunk in order.chunk(config.n_minibatches):
            w, env = chunk // e, chunk % e  # (N,), (N,)
            features, _ = agent.core.window(windows["obs"][w, env], states[w, env], windows["starts"][w, env])
            policy, value = agent.heads(features)  # a policy over (N, S), values (N, S)
            logp = policy.log_prob(windows["actions"][w, env])  # (N, S)
            log_ratio = logp - windows["logp"][w, env]
            ratio = log_ratio.exp()
            adv = adv_w[w, env]
            adv = (adv - adv.mean()) / (adv.std() + 1e-8)
            policy_loss = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
            value_loss = 0.5 * (value - ret_w[w, env]).pow(2).mean()
            entropy = policy.entropy().mean()
            loss = policy_loss + config.vf_coef * value_loss - config.ent_coef * entropy
            optimizer.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(agent.parameters(), config.max_grad_norm)
            optimizer.step()
            with torch.no_grad():
                stats["approx_kl"].append(float(((ratio - 1) - log_ratio).mean()))
                stats["clipfrac"].append(float(((ratio - 1).abs() > clip).float().mean()))
            stats["policy_loss"].append(float(policy_loss.detach()))
            stats["value_loss"].append(float(value_loss.detach()))
            stats["entropy"].append(float(entropy.detach()))
    return {k: float(np.mean(v)) for k, v in stats.items()}


def refresh_memory(agent: Agent, env: Collector, rule: MemoryAfterUpdate) -> None:
    """The collectors' memory after a weight update: ``keep`` leaves it; ``reset`` empties it (the core's
    ``initial_state``; the episodes go on); ``recompute`` runs the core with its new weights over each
    environment's remembered observations (:class:`History`) from an empty memory. For the XL core, whose
    reach is ``n_layer * mem_len`` steps, that is the memory a run with the new weights from the start
    would have; for a recurrent core it is the state after those last steps only."""
    if rule == "reset":
        env.state = agent.core.initial_state(env.obs.shape[0])
    elif rule == "recompute" and env.history is not None:
        with torch.no_grad():
            initial = agent.core.initial_state(env.obs.shape[0])
            _, env.state = agent.core.window(env.history.obs, initial, env.history.starts)
