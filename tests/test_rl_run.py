"""Reinforcement-learning runs in run folders: the files a run writes, resuming onto exactly the rows of an
uninterrupted run (from a finished half, and from a process killed with SIGKILL), fresh episodes (and a
warning) where the environments cannot be saved, what a resume refuses, a saved agent acting in a loop of
one's own, the evaluation's figures, the presets and overrides, and the plot."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

gym = pytest.importorskip(
    "gymnasium", reason="txl.rl's runs need gymnasium: pip install 'transformer-xl[rl]'"
)

from txl.checkpoint import ResumeWarning  # noqa: E402
from txl.config import ConfigError  # noqa: E402
from txl.errors import RunError  # noqa: E402
from txl.rl import CoreConfig, PPOConfig, RLConfig, load_agent  # noqa: E402
from txl.rl.config import (  # noqa: E402
    apply_rl_overrides,
    load_rl_config,
    rl_config_to_dict,
    rl_preset_for_task,
    rl_preset_names,
)
from txl.rl.envs import is_named_task, make_vector_env  # noqa: E402
from txl.rl.run import KEEP_LAST, TIMING_FIELDS, resume, train  # noqa: E402
from txl.rl.saved import Returns, evaluate_agent, t_quantile  # noqa: E402
from txl.runs import latest_checkpoint, list_checkpoints, read_metrics  # noqa: E402

SRC = Path(__file__).resolve().parents[1] / "src"
TINY = CoreConfig(n_layer=2, n_head=2, d_head=8, d_model=16, d_inner=16, mem_len=4)


pytestmark = pytest.mark.usefixtures("one_thread")  # as txl rl train runs: see conftest


def _config(task: str = "MemoryLength-3", **fields) -> RLConfig:
    ppo = PPOConfig(n_envs=4, n_steps=16, seq_len=8, n_minibatches=2, epochs=2, anneal_lr=False)
    values = {"task": task, "steps": 8 * 64, "checkpoint_every": 2, "ppo": ppo, "core": TINY, **fields}
    return RLConfig(**values)


def _deterministic(rows: list[dict]) -> list[dict]:
    """The rows without their timings (which vary with the machine's load)."""
    return [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in rows]


def test_a_run_folder_holds_its_config_rows_checkpoints_and_summary(tmp_path):
    config = _config()
    rows = train(config, tmp_path / "run", progress=False)
    run = tmp_path / "run"
    assert json.loads((run / "config.json").read_text()) == rl_config_to_dict(config)
    assert read_metrics(run) == rows and [r["step"] for r in rows] == list(range(1, 9))
    assert [r["env_steps"] for r in rows] == [64 * i for i in range(1, 9)]
    assert [c.name for c in list_checkpoints(run)] == ["step-00000006", "step-00000008"][-KEEP_LAST:]
    summary = json.loads((run / "summary.json").read_text())
    ended = [(r["return_mean"], r["episodes"]) for r in rows if r["episodes"]]  # all 8 rows: 512 <= 20,480
    assert summary["final_return"] == pytest.approx(sum(m * n for m, n in ended) / sum(n for _, n in ended))
    assert summary["updates"] == 8 and summary["env_steps"] == 512
    with pytest.raises(RunError, match="already holds a run; use 'resume .*' to continue it"):
        train(config, run, progress=False)


@pytest.mark.parametrize(
    "agent,rule",
    [
        ("xl", "keep"),
        ("xl", "recompute"),
        ("xl", "reset"),
        ("gru", "keep"),
        ("lstm", "recompute"),
        ("mlp", "keep"),
    ],
)
def test_a_resumed_run_logs_the_rows_of_an_uninterrupted_one(tmp_path, agent, rule):
    """Half a run, then resumed to the whole: every row (returns, losses, KL, ...) is the uninterrupted run's,
    bit for bit: the weights, the optimizer, the RNG states, the environments and the collector's memory
    (with its history for ``recompute``) all come back."""
    ppo = dataclasses.replace(_config().ppo, memory_after_update=rule)
    whole = _config("RepeatPreviousEasy", agent=agent, ppo=ppo)
    reference = train(whole, tmp_path / "whole", progress=False)
    train(dataclasses.replace(whole, steps=whole.steps // 2), tmp_path / "half", progress=False)
    resumed = resume(tmp_path / "half", overrides=[f"steps={whole.steps}"], progress=False)
    assert len(resumed) == 8 and _deterministic(resumed) == _deterministic(reference)
    assert len({r["policy_loss"] for r in resumed}) == 8  # the rows differ from one another


def test_a_resumed_run_warns_when_more_steps_move_an_annealed_learning_rate(tmp_path):
    config = _config(ppo=dataclasses.replace(_config().ppo, anneal_lr=True))
    train(config, tmp_path / "run", progress=False)
    with pytest.warns(ResumeWarning, match="learning rate jumps from"):
        rows = resume(tmp_path / "run", overrides=["steps=1024"], progress=False)
    assert len(rows) == 16 and rows[8]["lr"] == pytest.approx(3e-4 * (1 - 8 / 16))


@pytest.mark.slow
def test_a_killed_run_resumes_onto_the_rows_of_an_uninterrupted_one(tmp_path):
    """``txl rl train`` killed with SIGKILL after a checkpoint (maybe with rows logged after it), then
    ``resume``: the run's rows are those of a run never interrupted."""
    pytest.importorskip("popgym", reason="RepeatPreviousEasy needs popgym: pip install 'transformer-xl[rl]'")
    sets = [
        "ppo.n_envs=4",
        "ppo.n_steps=16",
        "ppo.seq_len=8",
        "ppo.n_minibatches=2",
        "ppo.epochs=2",
        "ppo.anneal_lr=false",
        "ppo.memory_after_update=recompute",
        "checkpoint_every=2",
        "core.n_layer=2",
        "core.d_model=16",
        "core.d_head=8",
        "core.d_inner=16",
        "core.mem_len=4",
    ]
    config = apply_rl_overrides(load_rl_config("RepeatPreviousEasy"), [*sets, "steps=768"])  # 12 updates
    reference = train(config, tmp_path / "reference", progress=False)
    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "txl", "rl", "train", "--task", "RepeatPreviousEasy", "--steps", "100000000"]
    cmd += [item for s in sets for item in ("--set", s)] + ["--out", str(killed), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 180
    try:
        while time.time() < deadline:
            folder = latest_checkpoint(killed)
            if folder is not None and folder.name >= "step-00000004":
                break
            assert proc.poll() is None, f"the run ended with status {proc.returncode}"
            time.sleep(0.01)
        else:
            pytest.fail("the run did not reach its second checkpoint in time")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert read_metrics(killed)
    rows = resume(killed, overrides=["steps=768"], progress=False)
    assert _deterministic(rows) == _deterministic(reference)


class Echo(gym.Env):
    """Say the bit shown now (10 steps): an environment txl cannot save."""

    observation_space = gym.spaces.Box(0.0, 1.0, (2,), dtype=np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t, self.bit = 0, int(self.np_random.integers(2))
        return np.eye(2, dtype=np.float32)[self.bit], {}

    def step(self, action):
        reward = float(int(action) == self.bit)
        self.t, self.bit = self.t + 1, int(self.np_random.integers(2))
        return np.eye(2, dtype=np.float32)[self.bit], reward, self.t >= 10, False, {}


def test_a_task_whose_environments_cannot_be_saved_resumes_on_fresh_episodes_and_says_so(tmp_path):
    config = _config("Echo")
    assert not is_named_task("Echo")
    train(
        dataclasses.replace(config, steps=256),
        tmp_path / "run",
        envs=make_vector_env(Echo, 4),
        progress=False,
    )
    with pytest.warns(
        ResumeWarning, match="cannot be saved: the run resumes from update 4 on fresh episodes"
    ):
        rows = resume(
            tmp_path / "run", overrides=["steps=512"], envs=make_vector_env(Echo, 4), progress=False
        )
    assert [r["step"] for r in rows] == list(range(1, 9)) and rows[4]["episodes"] == 4


def test_resume_refuses_other_settings_and_a_finished_run(tmp_path):
    train(_config(), tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match=r"core.mem_len cannot change when a run resumes \(only steps"):
        resume(tmp_path / "run", overrides=["core.mem_len=8", "steps=1024"], progress=False)
    with pytest.raises(RunError, match="already finished 8 updates .* resume with steps N"):
        resume(tmp_path / "run", progress=False)
    with pytest.raises(RunError, match="not a reinforcement-learning run"):
        (tmp_path / "lm").mkdir()
        (tmp_path / "lm" / "config.json").write_text('{"model": {}}')
        load_agent(tmp_path / "lm")


def test_a_saved_agent_acts_in_a_loop_of_ones_own(tmp_path):
    """An agent trained on MemoryLength-1 (name the cue shown now), loaded from its folder, plays it in a
    plain gymnasium loop: right every time with its most likely actions (an untrained one is at chance)."""
    config = RLConfig(
        task="MemoryLength-1",
        agent="mlp",
        steps=4096,
        ppo=PPOConfig(n_envs=8, n_steps=16, seq_len=8, n_minibatches=2, lr=1e-2),
        core=TINY,
    )
    train(config, tmp_path / "run", progress=False)
    agent = load_agent(tmp_path / "run")
    assert agent.step == 32 and agent.checkpoint.name == "step-00000032"
    envs = make_vector_env("MemoryLength-1", 4)
    obs, _ = envs.reset(seed=123)
    state, start = agent.initial_state(4), np.ones(4, dtype=bool)
    total = np.zeros(4)
    for _ in range(25):
        action, state = agent.act(obs, state, start)
        assert action.shape == (4,) and action.dtype.kind == "i"
        obs, reward, terminated, truncated, _ = envs.step(action)
        start = terminated | truncated
        total += reward
    assert start.all() and total.tolist() == [25.0] * 4
    with pytest.raises(ValueError, match=r"obs must be \(E, 4\)"):
        agent.act(obs[:, :2], state, start)


def test_the_evaluation_reports_the_mean_std_and_a_t_interval_of_fresh_episodes(tmp_path):
    # Student's t, 97.5% quantiles, from a published table
    for df, value in ((1, 12.7062), (4, 2.7764), (9, 2.2622), (29, 2.0452), (1000, 1.9623)):
        assert t_quantile(0.975, df) == pytest.approx(value, abs=2e-4)
    returns = Returns((1.0, -1.0, 1.0, 1.0, 0.5), (2, 2, 2, 2, 2))
    low, high = returns.ci95
    half = 2.7764 * statistics.stdev(returns.returns) / math.sqrt(5)
    assert returns.mean == pytest.approx(0.5) and returns.std == pytest.approx(
        statistics.stdev(returns.returns)
    )
    assert (low, high) == pytest.approx((0.5 - half, 0.5 + half), abs=1e-3)
    train(_config("MemoryLength-2"), tmp_path / "run", progress=False)
    agent = load_agent(tmp_path / "run")
    before = torch.get_rng_state()
    result = evaluate_agent(agent, 7, seed=5, deterministic=False, n_envs=3)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's random state is left alone
    assert len(result.returns) == 7 and set(result.lengths) == {2} and set(result.returns) <= {-1.0, 1.0}
    assert evaluate_agent(agent, 7, seed=5, deterministic=False, n_envs=3) == result  # seeded


def test_the_presets_name_txls_tasks_and_overrides_name_their_fields():
    names = rl_preset_names()
    assert {"RepeatPreviousEasy", "RepeatFirstEasy", "CartPoleNoVelocity", "PendulumNoVelocity"} <= set(names)
    for name in names:  # a task's preset has its name; another of its presets, its name and a suffix
        config = load_rl_config(name)
        assert is_named_task(config.task)
        assert (
            config.task == name
            or name.startswith(f"{config.task}-")  # another preset of the task
            or re.fullmatch(rf"{name}-[1-9][0-9]*", config.task)  # a family's preset
        )
    cartpole = load_rl_config("CartPoleNoVelocity")
    assert (cartpole.ppo.n_envs, cartpole.ppo.n_steps, cartpole.ppo.reward_scale, cartpole.steps) == (
        8,
        64,
        0.01,
        501_760,
    )
    changed = apply_rl_overrides(RLConfig(), ["core.mem_len=32", "ppo.lr=1e-3", "steps=2048", "agent=gru"])
    assert (changed.core.mem_len, changed.ppo.lr, changed.steps, changed.agent) == (32, 1e-3, 2048, "gru")
    for override, message in (
        ("ppo.lrr=1", "ppo.lrr: unknown field"),
        ("model.mem_len=1", "model.mem_len: unknown config section"),
        ("ppo=1", "ppo: unknown field"),
        ("core.mem_len=-1", "core.mem_len: must be a non-negative integer"),
        ("ppo.seq_len=5", "ppo.seq_len: must divide n_steps"),
        (
            "ppo.memory_after_update=stale",
            "ppo.memory_after_update: must be one of 'keep', 'recompute', 'reset'",
        ),
        ("agent=rnn", "agent: must be one of"),
        ("ppo.gamma=1.5", "ppo.gamma: must be a finite number at least 0 and at most 1"),
    ):
        with pytest.raises(ConfigError, match=message):
            apply_rl_overrides(RLConfig(), [override])


def test_a_task_of_a_family_starts_from_the_familys_preset():
    assert "MemoryLength" in rl_preset_names()
    assert rl_preset_for_task("MemoryLength-48") == "MemoryLength"
    assert rl_preset_for_task("MemoryLength-512") == "MemoryLength"
    assert rl_preset_for_task("RepeatFirstEasy") == "RepeatFirstEasy"
    for task in (
        "MemoryLength-0",
        "MemoryLength-048",
        "MemoryLength-4x",
        "MemoryLength-",
        "x-3",
    ):
        assert rl_preset_for_task(task) is None, task
    assert rl_preset_for_task("CartPole-v1") is None  # a gymnasium id: no preset
    assert rl_preset_for_task("Foo-3", ["Foo"]) == "Foo"
    assert rl_preset_for_task("Foo-3", ["Foo", "Foo-3"]) == "Foo-3"  # the task's own preset first
    assert rl_preset_for_task("Foo-Bar-12", ["Foo-Bar"]) == "Foo-Bar"
    preset = load_rl_config("MemoryLength")
    assert (preset.task, preset.steps, preset.core.n_layer, preset.core.mem_len) == (
        "MemoryLength-48",
        307_200,
        2,
        64,
    )
    assert preset.ppo == PPOConfig() and preset.updates == 150  # PPO's defaults, 150 rollouts of 2,048 steps

    from txl.cli import build_parser
    from txl.cli.rl import _new_config

    def config_of(*argv: str) -> RLConfig:
        return _new_config(build_parser().parse_args(["rl", "train", *argv, "--out", "o"]))

    made = config_of("--task", "MemoryLength-128", "--set", "core.mem_len=32")
    assert (made.task, made.steps, made.core.mem_len) == ("MemoryLength-128", 307_200, 32)
    assert config_of("--task", "MemoryLength-128", "--config", "RepeatFirstEasy").steps == 401_408
    assert config_of("--task", "CartPole-v1") == RLConfig(task="CartPole-v1")


@pytest.mark.parametrize("scale", [0, -1.0, float("nan"), True])
def test_reward_scale_must_be_a_positive_number(scale):
    with pytest.raises(ValueError, match="reward_scale"):
        PPOConfig(reward_scale=scale)


def test_the_plot_draws_several_runs_in_one_figure(tmp_path):
    pytest.importorskip("matplotlib", reason="the plots need matplotlib: pip install 'transformer-xl[plots]'")
    from txl.rl.plot import plot_runs, read_curve, smooth

    for seed in (1, 2):
        train(_config(seed=seed, steps=256), tmp_path / f"s{seed}", progress=False)
    curve = read_curve(tmp_path / "s1")
    assert (curve.task, curve.agent, curve.seed, curve.steps.tolist()) == (
        "MemoryLength-3",
        "xl",
        1,
        [64, 128, 192, 256],
    )
    values = np.array([1.0, math.nan, 3.0, 5.0])
    np.testing.assert_allclose(smooth(values, 2), [1.0, 1.0, 3.0, 4.0])
    png = plot_runs([tmp_path / "s1", tmp_path / "s2"], tmp_path / "curves.png")
    assert png.stat().st_size > 1000
