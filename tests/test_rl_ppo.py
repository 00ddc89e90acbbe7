"""PPO of txl.rl: a short run on a trivial task improves (the harness learns at all); the environments of
the experiment (gymnasium and popgym, the ``rl`` extra) have the documented observations."""

from __future__ import annotations

import numpy as np
import pytest

gym = pytest.importorskip(
    "gymnasium", reason="txl.rl's PPO needs gymnasium: pip install 'transformer-xl[rl]'"
)

from txl.rl import CoreConfig  # noqa: E402
from txl.rl.envs import make_vector_env  # noqa: E402
from txl.rl.ppo import PPOConfig, gae, train  # noqa: E402


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


@pytest.mark.parametrize("agent", ["xl", "gru", "mlp"])
def test_a_short_ppo_run_improves_on_a_trivial_task(agent, tmp_path):
    """2,048 steps of PPO on Echo: the mean return of the last rollouts beats the first ones' (chance, 0.25)
    clearly, and the CSV log has a row per rollout."""
    config = PPOConfig(
        task="Echo",
        agent=agent,
        total_steps=2048,
        n_envs=8,
        n_steps=16,
        seq_len=8,
        n_minibatches=2,
        lr=3e-3,
        core=CoreConfig(n_layer=1, d_model=32, d_head=8, d_inner=32, mem_len=8),
    )
    rows = train(config, envs=make_vector_env(Echo, 8), out=tmp_path, progress=False)
    assert len(rows) == 16
    first = np.nanmean([r["return_mean"] for r in rows[:3]])
    last = np.nanmean([r["return_mean"] for r in rows[-3:]])
    assert first < 0.4 and last > first + 0.2, (first, last)
    lines = (tmp_path / f"Echo_{agent}_s1.csv").read_text().splitlines()
    assert len(lines) == 17 and lines[0].startswith("task,agent,seed")


def test_gae_against_a_hand_computed_case():
    import torch

    rewards = torch.tensor([[1.0, 0.0, 2.0]])
    values = torch.tensor([[0.5, 0.25, 1.0]])
    dones = torch.tensor([[False, True, False]])
    adv = gae(rewards, values, dones, torch.tensor([4.0]), gamma=0.5, lam=0.5)
    d2 = 2.0 + 0.5 * 4.0 - 1.0  # 3.0
    d1 = 0.0 - 0.25  # the episode ended: no bootstrap
    d0 = 1.0 + 0.5 * 0.25 - 0.5
    expected = torch.tensor([[d0 + 0.25 * d1, d1, d2]])
    assert torch.allclose(adv, expected)


@pytest.mark.parametrize(
    "task,shape", [("RepeatPreviousEasy", (4,)), ("RepeatFirstEasy", (4,)), ("CartPoleNoVelocity", (2,))]
)
def test_the_tasks(task, shape):
    pytest.importorskip("popgym", reason="the POPGym tasks need popgym: pip install 'transformer-xl[rl]'")
    envs = make_vector_env(task, 2)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (2, *shape) and obs.dtype == np.float32
    if task != "CartPoleNoVelocity":
        assert np.allclose(obs.sum(axis=1), 1.0)  # one-hot
    ended = False
    for _ in range(60):
        obs, _, terminated, truncated, _ = envs.step(envs.action_space.sample())
        ended |= bool(np.any(terminated | truncated))
    assert ended
    envs.close()


def test_plot_and_final_return_from_the_logs(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots need matplotlib: pip install 'transformer-xl[plots]'")
    from txl.rl.plot import final_return, plot_curves, read_runs

    header = "task,agent,seed,update,global_step,episodes,return_mean\n"
    for agent, values in (("xl", [0.1, 0.5, 0.9]), ("mlp", [-0.5, float("nan"), -0.4])):
        lines = [f"T,{agent},1,{i + 1},{(i + 1) * 100},3,{v}\n" for i, v in enumerate(values)]
        (tmp_path / f"T_{agent}_s1.csv").write_text(header + "".join(lines))
    paths = sorted(tmp_path.glob("*.csv"))
    runs = read_runs(paths)
    steps, returns = runs[("T", "xl")][0]
    assert final_return(steps, returns, last=2) == pytest.approx(0.7)
    assert final_return(steps, returns, at=200, last=1) == pytest.approx(0.5)
    assert final_return(*runs[("T", "mlp")][0]) == pytest.approx(-0.45)
    (png,) = plot_curves(paths, tmp_path / "png")
    assert png.name == "rl_T.png" and png.stat().st_size > 1000


def test_reward_scale_scales_what_the_values_learn_not_the_logged_returns(monkeypatch, tmp_path):
    """With ``reward_scale`` s, GAE sees s times the rewards of the same rollout, and the CSV's returns are
    the environment's own."""
    import txl.rl.ppo as ppo

    seen = []

    def spy(rewards, *args, **kwargs):
        seen.append(rewards.clone())
        return gae(rewards, *args, **kwargs)

    monkeypatch.setattr(ppo, "gae", spy)
    rows = {}
    for scale in (1.0, 10.0):
        config = PPOConfig(
            task="Echo",
            agent="mlp",
            total_steps=128,
            n_envs=8,
            n_steps=16,
            seq_len=8,
            n_minibatches=2,
            reward_scale=scale,
            core=CoreConfig(n_layer=1, d_model=16, d_head=8, d_inner=16, mem_len=4),
        )
        rows[scale] = train(config, envs=make_vector_env(Echo, 8), out=tmp_path / str(scale), progress=False)
    assert seen[0].abs().sum() > 0
    np.testing.assert_allclose(seen[1].numpy(), 10 * seen[0].numpy(), rtol=1e-6)
    assert rows[1.0][0]["return_mean"] == rows[10.0][0]["return_mean"]


@pytest.mark.parametrize("scale", [0, -1.0, float("nan"), True])
def test_reward_scale_must_be_a_positive_number(scale):
    with pytest.raises(ValueError, match="reward_scale"):
        PPOConfig(reward_scale=scale)
