"""PPO of txl.rl against independent computations: the update against a clipped surrogate written here
(replayed from the memory at each window's start, recomputed by stepping), the collector's episode starts
against the environment's own first steps, GAE against a hand-computed case, continuous actions (sampled,
clipped for the environment, log-probabilities of the sample), the memory after an update (keep, reset, and
recompute against a fresh run of the new weights over the same observations), the vector environments PPO
refuses, and a short run that learns."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

gym = pytest.importorskip(
    "gymnasium", reason="txl.rl's PPO needs gymnasium: pip install 'transformer-xl[rl]'"
)

from txl.config import ConfigError  # noqa: E402
from txl.rl import CoreConfig  # noqa: E402
from txl.rl.agent import ActionSpec, Agent  # noqa: E402
from txl.rl.config import PPOConfig, RLConfig  # noqa: E402
from txl.rl.envs import make_vector_env  # noqa: E402
from txl.rl.ppo import Collector, check_vector_env, collect, gae, refresh_memory, update  # noqa: E402
from txl.rl.run import train  # noqa: E402

TINY = CoreConfig(n_layer=2, n_head=2, d_head=8, d_model=16, d_inner=16, mem_len=4)


class Echo(gym.Env):
    """Say the suit shown now: one-hot of 4 observed, +0.1 for the same action, 0 otherwise; 10 steps."""

    observation_space = gym.spaces.Box(0.0, 1.0, (4,), dtype=np.float32)
    action_space = gym.spaces.Discrete(4)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.card = 0, int(self.np_random.integers(4))
        return np.eye(4, dtype=np.float32)[self.card], {}

    def step(self, action):
        reward = 0.1 if int(action) == self.card else 0.0
        self.t += 1
        self.card = int(self.np_random.integers(4))
        return np.eye(4, dtype=np.float32)[self.card], reward, self.t >= 10, False, {}


class Marked(gym.Env):
    """Episodes of ``lengths[0]`` to ``lengths[1] - 1`` steps (drawn at reset); the observation's first
    number is 1 on an episode's first step only (the environment's own account of where episodes start), the
    others are noise. Actions are Discrete(3) or (``continuous``) a Box [-0.5, 0.5]^2; the environment keeps
    the actions it receives."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (3,), dtype=np.float32)

    def __init__(self, continuous: bool = False, lengths: tuple[int, int] = (3, 10)) -> None:
        self.action_space = (
            gym.spaces.Box(-0.5, 0.5, (2,), dtype=np.float32) if continuous else gym.spaces.Discrete(3)
        )
        self.lengths = lengths
        self.received: list[np.ndarray] = []

    def _obs(self):
        noise = self.np_random.normal(size=2).astype(np.float32)
        return np.concatenate([[1.0 if self.t == 0 else 0.0], noise]).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.length = 0, int(self.np_random.integers(*self.lengths))
        return self._obs(), {}

    def step(self, action):
        self.received.append(np.array(action, copy=True))
        reward = (
            float(np.sum(action)) if isinstance(action, np.ndarray) and action.ndim else float(action == 1)
        )
        self.t += 1
        return self._obs(), reward, self.t >= self.length, False, {}


def _agent(obs_dim: int, actions: ActionSpec, kind: str = "xl", seed: int = 0) -> Agent:
    torch.manual_seed(seed)
    return Agent(kind, obs_dim, actions, TINY)


def _marked(n: int, continuous: bool = False, lengths: tuple[int, int] = (3, 10)):
    return make_vector_env(lambda: Marked(continuous, lengths), n)


# -- the update against an independent clipped surrogate -----------------------------------------------------


def _surrogate_loss(agent: Agent, rollout, config: PPOConfig) -> torch.Tensor:
    """PPO's loss over the whole rollout (one minibatch of every window), computed here: the state at each
    window's start is recomputed by stepping the core from the rollout's first state (not the stored ones);
    the advantages normalised over the batch; the clipped surrogate as the paper writes it, with min."""
    obs, starts = rollout.batch.obs, rollout.batch.starts  # (E, T, D_obs), (E, T)
    e, t = starts.shape
    s = config.seq_len
    state = rollout.window_states[0]
    logp, values, entropy = [], [], []
    for w in range(t // s):
        span = slice(w * s, (w + 1) * s)
        features, _ = agent.core.window(obs[:, span], state, starts[:, span])  # gradients inside the window
        policy, value = agent.heads(features)
        logp.append(policy.log_prob(rollout.batch.actions[:, span]))
        values.append(value)
        entropy.append(policy.entropy())
        with torch.no_grad():  # the state at the next window's start, step by step
            for i in range(w * s, (w + 1) * s):
                _, state = agent.core.step(obs[:, i], state, starts[:, i])
    logp, values, entropy = torch.cat(logp, 1), torch.cat(values, 1), torch.cat(entropy, 1)  # (E, T)
    ratio = torch.exp(logp - rollout.batch.logp)
    adv = rollout.advantages
    adv = (adv - adv.mean()) / (adv.std() + 1e-8)
    clipped = torch.clamp(ratio, 1 - config.clip, 1 + config.clip)
    surrogate = torch.min(ratio * adv, clipped * adv).mean()  # maximised
    value_loss = 0.5 * ((values - rollout.returns) ** 2).mean()
    return -surrogate + config.vf_coef * value_loss - config.ent_coef * entropy.mean()


@pytest.mark.parametrize("continuous", [False, True], ids=["discrete", "continuous"])
def test_the_update_follows_the_clipped_surrogate_replayed_from_each_windows_memory(continuous):
    """One epoch, one minibatch, plain SGD of rate 1 without a norm clip: the update moves every parameter by
    minus the gradient of the loss computed here. The old log-probabilities are shifted so that many ratios
    fall outside the clip (the clip's max matters) and episodes outlast the windows (the stored memory
    matters)."""
    config = PPOConfig(
        n_envs=3, n_steps=16, seq_len=4, n_minibatches=1, epochs=1, max_grad_norm=1e9, ent_coef=0.05
    )
    envs = _marked(3, continuous)
    agent = _agent(3, ActionSpec.of(envs.single_action_space), seed=1)
    collector = Collector.begin(envs, agent, seed=3)
    collect(agent, collector, config)  # a first rollout: the second starts mid-episode, with a memory
    rollout = collect(agent, collector, config)
    assert rollout.window_states[0].reach.min() > 0
    shift = torch.linspace(-0.6, 0.6, rollout.batch.logp.numel())[torch.randperm(rollout.batch.logp.numel())]
    rollout.batch.logp = rollout.batch.logp + shift.reshape(rollout.batch.logp.shape)
    reference = copy.deepcopy(agent)
    before = {n: p.detach().clone() for n, p in agent.named_parameters()}
    update(agent, torch.optim.SGD(agent.parameters(), lr=1.0), rollout, config)
    loss = _surrogate_loss(reference, rollout, config)
    grads = dict(
        zip(
            [n for n, _ in reference.named_parameters()],
            torch.autograd.grad(loss, list(reference.parameters())),
            strict=True,
        )
    )
    moved = 0
    for name, param in agent.named_parameters():
        step = before[name] - param.detach()
        torch.testing.assert_close(step, grads[name], rtol=1e-4, atol=1e-6, msg=name)
        moved += int(grads[name].abs().max() > 1e-4)
    assert moved > 10  # the core's layers learn too, not only the heads
    envs.close()


# -- collection ----------------------------------------------------------------------------------------------


def test_collection_marks_the_episode_starts_the_environment_shows():
    """Over three rollouts, the starts given to the core are exactly the steps the environment marks as an
    episode's first (its observation's first number), including at the rollouts' boundaries, and each
    window's stored state is the memory the core had there."""
    config = PPOConfig(n_envs=4, n_steps=12, seq_len=4, n_minibatches=1)
    envs = _marked(4)
    agent = _agent(3, ActionSpec.of(envs.single_action_space))
    collector = Collector.begin(envs, agent, seed=0)
    state = agent.core.initial_state(4)
    for _ in range(3):
        rollout = collect(agent, collector, config)
        first = rollout.batch.obs[..., 0] == 1.0  # (E, T): the environment's own account
        assert first.any() and not first.all()
        assert torch.equal(rollout.batch.starts, first)
        for t in range(config.n_steps):
            if t % config.seq_len == 0:
                stored = rollout.window_states[t // config.seq_len]
                assert torch.equal(stored.memory, state.memory) and torch.equal(stored.reach, state.reach)
            _, state = agent.core.step(rollout.batch.obs[:, t], state, rollout.batch.starts[:, t])
    envs.close()


def test_continuous_actions_are_sampled_from_a_gaussian_and_clipped_only_for_the_environment():
    """A Box action space gets a Gaussian policy (mean from the features, a state-independent log standard
    deviation starting at 0); the rollout keeps the samples (some beyond the bounds [-0.5, 0.5]) with their
    log-probabilities; the environment receives them clipped."""
    config = PPOConfig(n_envs=2, n_steps=16, seq_len=4, n_minibatches=1)
    envs = _marked(2, continuous=True)
    agent = _agent(3, ActionSpec.of(envs.single_action_space))
    assert torch.equal(agent.log_std.detach(), torch.zeros(2))
    rollout = collect(agent, Collector.begin(envs, agent, seed=0), config)
    actions = rollout.batch.actions  # (E, T, 2)
    assert actions.shape == (2, 16, 2) and actions.abs().max() > 0.5
    received = np.stack(envs.envs[0].received)  # environment 0's actions, in order
    np.testing.assert_allclose(received, np.clip(actions[0].numpy(), -0.5, 0.5), rtol=0, atol=0)
    with torch.no_grad():  # log N(a; mean, 1) summed over the 2 dimensions, from the same features
        state, means = rollout.window_states[0], []
        for t in range(16):
            features, state = agent.core.step(rollout.batch.obs[:, t], state, rollout.batch.starts[:, t])
            means.append(agent.actor(features))
    mean = torch.stack(means, 1)
    expected = (-0.5 * (actions - mean) ** 2 - 0.5 * np.log(2 * np.pi)).sum(-1)
    torch.testing.assert_close(rollout.batch.logp, expected, rtol=1e-5, atol=1e-5)
    envs.close()


def test_gae_against_a_hand_computed_case():
    rewards = torch.tensor([[1.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.25, 1.0]])
    dones = torch.tensor([[False, True, False]])
    adv = gae(rewards, values, dones, torch.tensor([4.0]), gamma=0.5, lam=0.5)
    d2 = 2.0 + 0.5 * 4.0 - 1.0  # 3.0
    d1 = 0.0 - 0.25  # the episode ended: no bootstrap
    d0 = 1.0 + 0.5 * 0.25 - 0.5
    expected = torch.tensor([[d0 + 0.25 * d1, d1, d2]])
    assert torch.allclose(adv, expected)


# -- the memory after an update ------------------------------------------------------------------------------


def _perturbed(agent: Agent) -> None:
    """New weights, as an update would give."""
    with torch.no_grad():
        for p in agent.parameters():
            p.add_(0.1 * torch.randn_like(p))


@pytest.mark.parametrize("kind,lengths", [("xl", (12, 24)), ("gru", (3, 10)), ("lstm", (3, 10))])
def test_recompute_gives_the_memory_of_a_fresh_run_of_the_new_weights(kind, lengths):
    """After two rollouts, the memory recomputed from the last n_layer x mem_len = 8 observations continues
    exactly as a run of the new weights would that stepped every observation from the start: the features of
    the next steps agree. The XL core reaches 8 steps back, so its episodes may be longer (12 to 23 steps);
    a recurrent core's state depends on its whole episode, so its episodes fit in the 8 (3 to 9 steps)."""
    config = PPOConfig(n_envs=3, n_steps=8, seq_len=4, n_minibatches=1)
    envs = _marked(3, lengths=lengths)
    agent = _agent(3, ActionSpec.of(envs.single_action_space), kind)
    collector = Collector.begin(envs, agent, seed=5, history=TINY.n_layer * TINY.mem_len)
    rollouts = [collect(agent, collector, config) for _ in range(2)]
    _perturbed(agent)
    refresh_memory(agent, collector, "recompute")
    with torch.no_grad():
        fresh = agent.core.initial_state(3)
        for r in rollouts:
            for t in range(config.n_steps):
                _, fresh = agent.core.step(r.batch.obs[:, t], fresh, r.batch.starts[:, t])
        probe = torch.randn(5, 3, 3)
        recomputed = collector.state
        for t in range(5):
            start = collector.start if t == 0 else torch.zeros(3, dtype=torch.bool)
            a, recomputed = agent.core.step(probe[t], recomputed, start)
            b, fresh = agent.core.step(probe[t], fresh, start)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    envs.close()


def test_reset_starts_from_an_empty_memory_and_keep_leaves_it():
    config = PPOConfig(n_envs=2, n_steps=8, seq_len=4, n_minibatches=1)
    envs = _marked(2)
    agent = _agent(3, ActionSpec.of(envs.single_action_space))
    collector = Collector.begin(envs, agent, seed=1)
    collect(agent, collector, config)
    kept = collector.state
    _perturbed(agent)
    refresh_memory(agent, collector, "keep")
    assert collector.state is kept and kept.reach.max() > 0
    refresh_memory(agent, collector, "reset")
    empty = agent.core.initial_state(2)
    assert torch.equal(collector.state.memory, empty.memory) and torch.equal(
        collector.state.reach, empty.reach
    )
    envs.close()


# -- what PPO refuses, and a run that learns -----------------------------------------------------------------


def test_a_vector_env_that_resets_one_step_late_is_refused():
    """gymnasium's default NEXT_STEP autoreset would start every episode one step late; refused by name."""
    late = gym.vector.SyncVectorEnv([Echo, Echo])
    with pytest.raises(ConfigError, match="SAME_STEP"):
        check_vector_env(late, 2)
    with pytest.raises(ConfigError, match="ppo.n_envs: 3"):
        check_vector_env(make_vector_env(Echo, 2), 3)
    config = RLConfig(task="Echo", steps=64, ppo=PPOConfig(n_envs=2, n_steps=16, seq_len=8, n_minibatches=1))
    with pytest.raises(ConfigError, match="SAME_STEP"):
        train(config, envs=late, progress=False)


@pytest.mark.parametrize("agent,lr", [("xl", 3e-3), ("gru", 3e-3), ("lstm", 1e-2), ("mlp", 3e-3)])
def test_a_short_ppo_run_improves_on_a_trivial_task(agent, lr):
    """2,048 steps of PPO on Echo: the mean return of the last rollouts beats the first ones' (chance, 0.25)
    clearly; a row per rollout. (The LSTM learns it at a higher learning rate.)"""
    config = RLConfig(
        task="Echo",
        agent=agent,
        steps=2048,
        ppo=PPOConfig(n_envs=8, n_steps=16, seq_len=8, n_minibatches=2, lr=lr),
        core=CoreConfig(n_layer=1, d_model=32, d_head=8, d_inner=32, mem_len=8),
    )
    rows = train(config, envs=make_vector_env(Echo, 8), progress=False)
    assert len(rows) == 16 and [r["step"] for r in rows] == list(range(1, 17))
    first = np.nanmean([r["return_mean"] for r in rows[:3]])
    last = np.nanmean([r["return_mean"] for r in rows[-3:]])
    assert first < 0.4 and last > first + 0.2, (first, last)


def test_reward_scale_scales_what_the_values_learn_not_the_logged_returns(monkeypatch):
    """With ``reward_scale`` s, GAE sees s times the rewards of the same rollout, and the logged returns are
    the environment's own."""
    import txl.rl.ppo as ppo

    seen = []

    def spy(rewards, *args, **kwargs):
        seen.append(rewards.clone())
        return gae(rewards, *args, **kwargs)

    monkeypatch.setattr(ppo, "gae", spy)
    rows = {}
    for scale in (1.0, 10.0):
        ppo_config = PPOConfig(n_envs=8, n_steps=16, seq_len=8, n_minibatches=2, reward_scale=scale)
        config = RLConfig(task="Echo", agent="mlp", steps=128, ppo=ppo_config, core=TINY)
        rows[scale] = train(config, envs=make_vector_env(Echo, 8), progress=False)
    assert seen[0].abs().sum() > 0
    np.testing.assert_allclose(seen[1].numpy(), 10 * seen[0].numpy(), rtol=1e-6)
    assert rows[1.0][0]["return_mean"] == rows[10.0][0]["return_mean"]
