"""PPO's normalisation and time-limit bootstrap against independent computations: the running moments
against the pooled mean and variance of the whole stream (numpy), the rewards against a naive loop over
discounted returns, a run's observation statistics against every observation its environments returned,
the evaluation's frozen statistics, the bootstrap of a truncated episode against a value and a GAE computed
here, the clip annealed, and exact resume with all of it on."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
import torch

gym = pytest.importorskip(
    "gymnasium", reason="txl.rl's PPO needs gymnasium: pip install 'transformer-xl[rl]'"
)

from txl.checkpoint import load_extra_tensors  # noqa: E402
from txl.config import ConfigError  # noqa: E402
from txl.rl import CoreConfig, PPOConfig, RLConfig, load_agent  # noqa: E402
from txl.rl.agent import ActionSpec, Agent  # noqa: E402
from txl.rl.envs import make_vector_env  # noqa: E402
from txl.rl.normalize import INITIAL_COUNT, Normalizer, RunningMoments  # noqa: E402
from txl.rl.ppo import Collector, collect  # noqa: E402
from txl.rl.run import TIMING_FIELDS, resume, train  # noqa: E402
from txl.runs import latest_checkpoint  # noqa: E402

TINY = CoreConfig(n_layer=2, n_head=2, d_head=8, d_model=16, d_inner=16, mem_len=4)


pytestmark = pytest.mark.usefixtures("one_thread")  # as txl rl train runs: see conftest


def _pooled(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The mean and variance of the prior (mean 0, variance 1, weight INITIAL_COUNT) pooled with ``rows``
    (N, ...), written as sums over the whole stream at once."""
    n = rows.shape[0] + INITIAL_COUNT
    mean = rows.sum(axis=0) / n
    squares = ((rows - mean) ** 2).sum(axis=0) + INITIAL_COUNT * (1.0 + mean**2)
    return mean, squares / n


def test_running_moments_equal_the_pooled_moments_of_the_whole_stream():
    rng = np.random.default_rng(0)
    moments = RunningMoments.empty((3,))
    seen = []
    for size in (1, 5, 2, 17, 8, 1):
        batch = rng.normal([1.0, -4.0, 100.0], [0.5, 3.0, 0.01], size=(size, 3))
        moments.update(batch)
        seen.append(batch)
        mean, var = _pooled(np.concatenate(seen))
        np.testing.assert_allclose(moments.mean, mean, rtol=1e-12)
        np.testing.assert_allclose(moments.var, var, rtol=1e-9)
    assert moments.count == pytest.approx(34 + INITIAL_COUNT)
    x = rng.normal(size=(4, 3)) * 50
    expected = np.clip((x - moments.mean) / np.sqrt(moments.var + 1e-8), -10, 10)
    np.testing.assert_allclose(moments.scale(x, clip=10.0), expected)
    assert np.abs(moments.scale(x, clip=10.0)).max() == 10.0  # the third column is far out: clipped


def test_rewards_are_divided_by_the_std_of_the_discounted_returns_seen_so_far():
    """A naive loop: each environment's discounted return G <- gamma * G + r (0 again after its episode
    ends), every G so far pooled, the reward divided by their standard deviation and clipped."""
    rng = np.random.default_rng(1)
    gamma, clip = 0.9, 3.0
    norm = Normalizer.begin(2, 1, obs=False, reward=True, gamma=gamma, clip=clip)
    returns_so_far: list[float] = []
    g = [0.0, 0.0]
    for _ in range(40):
        reward = rng.normal(2.0, 1.0, size=2)
        done = rng.random(2) < 0.2
        got = norm.reward(reward, done)
        for i in range(2):
            g[i] = gamma * g[i] + reward[i]
            returns_so_far.append(g[i])
        _, var = _pooled(np.asarray(returns_so_far))
        for i in range(2):
            expected = float(np.clip(reward[i] / np.sqrt(var + 1e-8), -clip, clip))
            assert got[i] == pytest.approx(expected, rel=1e-9)
            g[i] = 0.0 if done[i] else g[i]
    assert not np.allclose(got, reward)


class Recorded(gym.vector.VectorWrapper):
    """A vector environment that keeps every observation it returns (reset and step)."""

    def __init__(self, env):
        super().__init__(env)
        self.seen: list[np.ndarray] = []

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.seen.append(np.array(obs))
        return obs, info

    def step(self, actions):
        out = self.env.step(actions)
        self.seen.append(np.array(out[0]))
        return out


def _config(**ppo_fields) -> RLConfig:
    ppo = PPOConfig(n_envs=4, n_steps=16, seq_len=8, n_minibatches=2, epochs=2, **ppo_fields)
    return RLConfig(task="CartPoleNoVelocity", steps=4 * 64, checkpoint_every=2, ppo=ppo, core=TINY)


def test_a_runs_observation_statistics_are_those_of_every_observation_its_environments_returned(tmp_path):
    """The statistics in the last checkpoint pool the first reset's observations and every step's; the agent
    loaded for evaluation has them frozen and normalises raw observations with them (clipped)."""
    config = _config(normalize_obs=True, normalize_clip=2.0)
    envs = Recorded(make_vector_env("CartPoleNoVelocity", 4))
    train(config, tmp_path / "run", envs=envs, progress=False)
    rows = np.concatenate(envs.seen).astype(np.float64)  # (1 + 64 batches of 4, 2)
    assert rows.shape == (4 * 65, 2)
    saved = load_extra_tensors(latest_checkpoint(tmp_path / "run"))
    mean, var = _pooled(rows)
    np.testing.assert_allclose(saved["collector.norm.obs.mean"].numpy(), mean, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(saved["collector.norm.obs.var"].numpy(), var, rtol=1e-9)
    assert "collector.norm.returns.var" not in saved  # rewards not normalised

    agent = load_agent(tmp_path / "run")
    assert agent.obs_norm is not None and agent.obs_norm.count == pytest.approx(4 * 65 + INITIAL_COUNT)
    raw = np.array([[0.3, -0.01], [50.0, 0.2]], dtype=np.float32)
    given = []
    step = agent.agent.core.step

    def spy(obs, state, starts):  # what the core is given
        given.append(obs.clone())
        return step(obs, state, starts)

    agent.agent.core.step = spy
    agent.act(raw, agent.initial_state(2), np.ones(2, dtype=bool))
    scaled = np.clip((raw - mean) / np.sqrt(var + 1e-8), -2.0, 2.0)
    np.testing.assert_allclose(given[0].numpy(), scaled, rtol=1e-6)
    assert given[0].abs().max() == 2.0  # 50 is far out: clipped


class Clock(gym.Env):
    """Reward 1 a step; observes [t, 1]; truncated after 3 steps unless ``end`` terminates it there."""

    observation_space = gym.spaces.Box(-10.0, 10.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, end: bool = False) -> None:
        self.end = end

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0, 1.0], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        last = self.t >= 3
        return np.array([self.t, 1.0], dtype=np.float32), 1.0, last and self.end, last and not self.end, {}


@pytest.mark.parametrize("kind", ["xl", "lstm"])
def test_a_truncated_episode_bootstraps_from_the_value_of_its_last_observation(kind):
    """Episodes of 3 steps cut by a time limit: the third reward gains gamma x V(the 4th observation [3, 1],
    after the episode's 3 steps), computed here by stepping the core over the episode; the advantages are
    GAE's over those rewards. Terminated episodes (and bootstrap_truncated off) gain nothing."""
    gamma, lam = 0.9, 0.8
    torch.manual_seed(0)
    agent = Agent(kind, 2, ActionSpec(n=2), TINY)
    with torch.no_grad():
        agent.critic.bias.fill_(0.7)  # values far from 0
    config = PPOConfig(
        n_envs=1, n_steps=6, seq_len=6, n_minibatches=1, gamma=gamma, gae_lambda=lam, bootstrap_truncated=True
    )
    rollout = collect(agent, Collector.begin(make_vector_env(Clock, 1), agent, seed=0), config)
    with torch.no_grad():
        obs = torch.tensor([[[0.0, 1.0], [1.0, 1.0], [2.0, 1.0], [3.0, 1.0]]])  # (1, 4, 2)
        starts = torch.tensor([[True, False, False, False]])
        features, _ = agent.core.window(obs, agent.core.initial_state(1), starts)
        values = agent.heads(features)[1][0]  # (4,)
    final = float(values[3])
    assert abs(final) > 0.1
    expected_rewards = torch.tensor([[1.0, 1.0, 1.0 + gamma * final] * 2])
    torch.testing.assert_close(rollout.batch.rewards, expected_rewards)
    torch.testing.assert_close(rollout.batch.values[0, :3], values[:3])
    # GAE written out for the first episode: its third step ends it (no value after it inside the episode)
    v = rollout.batch.values[0]
    r = expected_rewards[0]
    d = [float(r[0] + gamma * v[1] - v[0]), float(r[1] + gamma * v[2] - v[1]), float(r[2] - v[2])]
    hand = [d[0] + gamma * lam * (d[1] + gamma * lam * d[2]), d[1] + gamma * lam * d[2], d[2]]
    torch.testing.assert_close(rollout.advantages[0, :3], torch.tensor(hand), rtol=1e-5, atol=1e-6)

    for env, bootstrap in ((Clock(end=True), True), (Clock(), False)):
        off = dataclasses.replace(config, bootstrap_truncated=bootstrap)
        plain = collect(agent, Collector.begin(make_vector_env(lambda e=env: e, 1), agent, seed=0), off)
        torch.testing.assert_close(plain.batch.rewards, torch.ones(1, 6))


def test_the_clip_anneals_linearly_to_zero_with_anneal_clip(monkeypatch):
    import txl.rl.run as run_module

    seen: list[float] = []
    real = run_module.update

    def spy(*args, clip=None, **kwargs):
        seen.append(clip)
        return real(*args, clip=clip, **kwargs)

    monkeypatch.setattr(run_module, "update", spy)
    train(_config(anneal_clip=True, clip=0.3), progress=False)
    assert seen == pytest.approx([0.3 * (1 - k / 4) for k in range(4)])
    seen.clear()
    train(_config(clip=0.3), progress=False)
    assert seen == [0.3] * 4


@pytest.mark.parametrize("agent", ["xl", "lstm"])
def test_a_resumed_run_with_normalisation_logs_the_rows_of_an_uninterrupted_one(tmp_path, agent):
    """A finished run with every new field on, its newest checkpoint removed, resumed from the one before:
    the rows it logs again are the uninterrupted run's, bit for bit (the statistics and the discounted
    returns come back with the collector; the annealed clip with the counters)."""
    config = dataclasses.replace(
        _config(
            normalize_obs=True,
            normalize_reward=True,
            bootstrap_truncated=True,
            anneal_clip=True,
            separate_critic=True,
        ),
        agent=agent,
        steps=8 * 64,
    )

    def deterministic(rows):
        return [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in rows]

    run = tmp_path / "run"
    reference = deterministic(train(config, run, progress=False))
    shutil.rmtree(latest_checkpoint(run))  # step 8: the run resumes from step 6
    resumed = deterministic(resume(run, progress=False))
    assert len(resumed) == 8 and resumed == reference
    assert len({r["value_loss"] for r in resumed}) == 8
    assert load_agent(run).agent.separate_critic  # the evaluation builds the same agent


@pytest.mark.parametrize("kind", ["xl", "lstm", "gru"])
def test_a_separate_critic_is_a_second_core_that_only_the_value_loss_trains(kind):
    """The split core's features and state are the two cores' own, each run alone from its own state over
    the same steps (episode starts inside); the policy's loss reaches the actor's core only, the value's the
    critic's only."""
    torch.manual_seed(0)
    agent = Agent(kind, 3, ActionSpec(n=2), TINY, separate_critic=True)
    split = agent.core
    obs = torch.randn(2, 6, 3)
    starts = torch.zeros(2, 6, dtype=torch.bool)
    starts[1, 3] = True  # an episode start inside; the windows go on from the states before them
    state = split.initial_state(2)
    actor_state, critic_state = split.actor.initial_state(2), split.critic.initial_state(2)
    for _ in range(3):  # from the initial states, then from the states after each window
        features, state = split.window(obs, state, starts)
        actor_features, actor_state = split.actor.window(obs, actor_state, starts)
        critic_features, critic_state = split.critic.window(obs, critic_state, starts)
        torch.testing.assert_close(features, torch.cat([actor_features, critic_features], dim=-1))
        for joined, a, c in zip(state.tensors(), actor_state.tensors(), critic_state.tensors(), strict=True):
            expected = torch.cat([a, c], dim=-1) if a.is_floating_point() else a
            torch.testing.assert_close(joined, expected)
    assert not torch.allclose(actor_features, critic_features)  # two cores, two initialisations

    policy, value = agent.heads(split.window(obs, split.initial_state(2), starts)[0])
    for loss, trained, untouched in (
        (policy.log_prob(torch.zeros(2, 6, dtype=torch.long)).sum(), split.actor, split.critic),
        (value.pow(2).sum(), split.critic, split.actor),
    ):
        agent.zero_grad()
        loss.backward(retain_graph=True)
        assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trained.parameters())
        assert all(p.grad is None or p.grad.abs().sum() == 0 for p in untouched.parameters())


def test_the_new_fields_are_checked():
    for field, value, message in (
        ("normalize_obs", 1, "normalize_obs: must be true or false"),
        ("normalize_reward", "yes", "normalize_reward: must be true or false"),
        ("bootstrap_truncated", None, "bootstrap_truncated: must be true or false"),
        ("anneal_clip", 0, "anneal_clip: must be true or false"),
        ("normalize_clip", 0.0, "normalize_clip: must be a finite number above 0"),
    ):
        with pytest.raises(ConfigError, match=message):
            PPOConfig(**{field: value})


def test_defaults_leave_the_rollout_as_the_environment_gave_it():
    """Normalisation and bootstrap off (the defaults): the collector keeps no statistics, its observations
    are the environments' own and its rewards theirs times reward_scale."""
    config = PPOConfig(n_envs=2, n_steps=8, seq_len=4, n_minibatches=1, reward_scale=0.5)
    envs = Recorded(make_vector_env(Clock, 2))
    agent = Agent("mlp", 2, ActionSpec(n=2), TINY)
    collector = Collector.begin(envs, agent, seed=0)
    rollout = collect(agent, collector, config)
    assert collector.norm is None and not any(k.startswith("norm.") for k in collector.tensors())
    seen = torch.as_tensor(np.stack(envs.seen[:8], axis=1))  # (E, T, 2): the reset's, then the steps'
    torch.testing.assert_close(rollout.batch.obs, seen)
    torch.testing.assert_close(rollout.batch.rewards, torch.full((2, 8), 0.5))
