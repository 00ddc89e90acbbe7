"""SB3-contrib's RecurrentPPO (an LSTM agent) on CartPole without velocities, trained with rl-baselines3-zoo's
published settings for ``CartPoleNoVel-v1``, as the reference figure beside txl's agents. One JSON file per
seed in ``benchmarks/results/rl/`` (a seed whose file exists is skipped) and one JSON line per seed on stdout.

    pip install -e ".[rl-bench]"
    nice -n 10 python3 benchmarks/rl_sb3.py --steps 100000 --seeds 1 2 3

The settings are read from the ``hyperparams/ppo_lstm.yml`` that ships inside the installed ``rl_zoo3``
package, and the zoo's own ``ExperimentManager`` turns them into the run exactly as ``python -m rl_zoo3.train
--algo ppo_lstm --env CartPoleNoVel-v1`` does: ``lin_*`` values become linear schedules, ``normalize: true``
a ``VecNormalize`` (observations and rewards, with the run's gamma), the ``policy_kwargs`` string the
policy's arguments; the environment is the zoo's ``CartPoleNoVel-v1`` (CartPole-v1 with the cart and pole
velocities set to 0 by its ``MaskVelocityWrapper``) in a ``DummyVecEnv`` of ``Monitor``-wrapped copies. The
zoo's periodic evaluation during training is off (it does not change the training).

What is recorded: the settings as read, the library versions, the training curve (after each rollout: the env
steps and the mean return of the last 100 episodes the ``Monitor`` wrappers reported, as SB3's
``ep_rew_mean`` and the zoo's training plot), every episode (env step at its end, return, length), the final
evaluation (100 fresh episodes, deterministic actions, the ``VecNormalize`` statistics frozen and rewards
unnormalised, as the zoo's ``enjoy``), wall and CPU time, env steps per second and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import importlib.resources
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from txl.files import atomic_write_text

TASK = "CartPoleNoVelocity"
ZOO_ENV = "CartPoleNoVel-v1"
ZOO_ALGO = "ppo_lstm"
WINDOW = 100  # episodes in the curve's running mean (SB3's stats_window_size, the zoo's plot window)
LIBRARIES = ("sb3-contrib", "stable-baselines3", "rl-zoo3", "gymnasium", "torch", "numpy")


def hyperparams_file() -> Path:
    """The ``hyperparams/ppo_lstm.yml`` inside the installed rl_zoo3 package."""
    path = Path(str(importlib.resources.files("rl_zoo3") / "hyperparams" / f"{ZOO_ALGO}.yml"))
    if not path.is_file():
        raise SystemExit(
            f"rl_zoo3 ships no {path}; install the benchmark extra: pip install -e '.[rl-bench]'"
        )
    return path


def first_step_at(curve: list[dict[str, float]], level: float) -> int | None:
    """The first env step at which the curve's running mean reached ``level`` (None if never)."""
    return next((int(p["env_steps"]) for p in curve if p["return_mean"] >= level), None)


def run_seed(seed: int, *, steps: int, eval_episodes: int, eval_envs: int) -> dict[str, Any]:
    """Train one seed with the zoo's settings and evaluate it; the result as a JSON-ready dict."""
    import rl_zoo3.import_envs  # noqa: F401  (registers CartPoleNoVel-v1, as rl_zoo3.train imports it)
    from rl_zoo3.exp_manager import ExperimentManager
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.utils import set_random_seed
    from stable_baselines3.common.vec_env import sync_envs_normalization

    episodes: list[list[float]] = []  # [env step at its end, return, length]
    curve: list[dict[str, float]] = []

    class Recorder(BaseCallback):
        """Every episode the Monitor wrappers report, and the running mean after each rollout."""

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    episode = info["episode"]
                    episodes.append([self.num_timesteps, float(episode["r"]), int(episode["l"])])
            return True

        def _on_rollout_end(self) -> None:
            if episodes:
                last = [r for _, r, _ in episodes[-WINDOW:]]
                curve.append(
                    {
                        "env_steps": self.num_timesteps,
                        "return_mean": float(np.mean(last)),
                        "episodes": len(episodes),
                    }
                )

    config = hyperparams_file()
    set_random_seed(seed)  # as rl_zoo3.train does before building the experiment
    with tempfile.TemporaryDirectory() as log, contextlib.redirect_stdout(sys.stderr):
        zoo_args = argparse.Namespace(
            algo=ZOO_ALGO, env=ZOO_ENV, seed=seed, n_timesteps=steps, conf_file=str(config)
        )
        manager = ExperimentManager(
            zoo_args,
            ZOO_ALGO,
            ZOO_ENV,
            log,
            n_timesteps=steps,
            eval_freq=-1,
            seed=seed,
            log_interval=-1,
            verbose=0,
            config=str(config),
        )
        setup = manager.setup_experiment()
        assert setup is not None
        model, settings = setup
        recorder = Recorder()
        manager.callbacks.append(recorder)
        load_start = os.getloadavg()
        wall0, cpu0 = time.perf_counter(), time.process_time()
        manager.learn(model)
        train_wall, train_cpu = time.perf_counter() - wall0, time.process_time() - cpu0
        load_end = os.getloadavg()

        # the final evaluation: fresh environments (their own seed), deterministic actions, the training
        # statistics of VecNormalize copied and frozen, rewards unnormalised
        eval_env = manager.create_envs(eval_envs, eval_env=True, no_log=True)
        eval_seed = 10_000 + seed
        eval_env.seed(eval_seed)
        train_env = model.get_env()
        assert train_env is not None
        sync_envs_normalization(train_env, eval_env)
        wall1, cpu1 = time.perf_counter(), time.process_time()
        returns, lengths = evaluate_policy(
            model, eval_env, n_eval_episodes=eval_episodes, deterministic=True, return_episode_rewards=True
        )
        eval_wall, eval_cpu = time.perf_counter() - wall1, time.process_time() - cpu1
        eval_env.close()
        vec_normalize = model.get_vec_normalize_env()

    returns_array = np.asarray(returns, dtype=np.float64)
    return {
        "benchmark": "rl_sb3",
        "agent": "sb3_recurrentppo",
        "task": TASK,
        "env_id": ZOO_ENV,
        "env_source": "rl_zoo3.import_envs (CartPole-v1 with MaskVelocityWrapper: velocities set to 0)",
        "seed": seed,
        "settings_file": f"rl_zoo3/hyperparams/{ZOO_ALGO}.yml",
        "settings": dict(settings),
        "n_timesteps_requested": steps,
        "run": {
            "n_envs": manager.n_envs,
            "n_steps": model.n_steps,
            "batch_size": model.batch_size,
            "n_epochs": model.n_epochs,
            "gamma": model.gamma,
            "gae_lambda": model.gae_lambda,
            "ent_coef": model.ent_coef,
            "vf_coef": model.vf_coef,
            "max_grad_norm": model.max_grad_norm,
            "normalize_advantage": model.normalize_advantage,
            "clip_range_vf": None if model.clip_range_vf is None else repr(model.clip_range_vf),
            "target_kl": model.target_kl,
            "learning_rate": repr(model.learning_rate),
            "clip_range": repr(model.clip_range),
            "optimizer": repr(model.policy.optimizer.defaults),
            "vec_normalize": None
            if vec_normalize is None
            else {
                "norm_obs": vec_normalize.norm_obs,
                "norm_reward": vec_normalize.norm_reward,
                "clip_obs": vec_normalize.clip_obs,
                "clip_reward": vec_normalize.clip_reward,
                "gamma": vec_normalize.gamma,
                "epsilon": vec_normalize.epsilon,
                # the running statistics at the end of training (what the evaluation froze)
                "obs_mean": vec_normalize.obs_rms.mean.tolist(),
                "obs_var": vec_normalize.obs_rms.var.tolist(),
                "return_var": float(vec_normalize.ret_rms.var),
            },
            "policy": str(model.policy),
            "parameters": sum(p.numel() for p in model.policy.parameters()),
            "torch_threads": torch.get_num_threads(),
        },
        "versions": {name: importlib.metadata.version(name) for name in LIBRARIES}
        | {"python": platform.python_version()},
        "env_steps": int(model.num_timesteps),
        "curve_window": WINDOW,
        "curve": curve,
        "episodes": episodes,
        "first_step_mean_ge_475": first_step_at(curve, 475.0),
        "first_step_mean_ge_500": first_step_at(curve, 500.0),
        "final_eval": {
            "episodes": len(returns),
            "return_mean": float(returns_array.mean()),
            "return_std": float(returns_array.std()),
            "return_min": float(returns_array.min()),
            "returns": [float(r) for r in returns],
            "lengths": [int(n) for n in lengths],
            "deterministic": True,
            "vec_normalize": "training statistics, frozen; rewards not normalised",
            "eval_envs": eval_envs,
            "eval_seed": eval_seed,
            "wall_s": eval_wall,
            "cpu_s": eval_cpu,
        },
        "train_wall_s": train_wall,
        "train_cpu_s": train_cpu,
        "env_steps_per_s": model.num_timesteps / train_wall,
        "load_avg_start": list(load_start),
        "load_avg_end": list(load_end),
        "cpu_count": os.cpu_count(),
    }


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The one-line figures of a result."""
    final = result["final_eval"]
    return {
        "agent": result["agent"],
        "task": result["task"],
        "seed": result["seed"],
        "env_steps": result["env_steps"],
        "final_return_mean": round(final["return_mean"], 2),
        "final_return_std": round(final["return_std"], 2),
        "first_step_mean_ge_475": result["first_step_mean_ge_475"],
        "first_step_mean_ge_500": result["first_step_mean_ge_500"],
        "env_steps_per_s": round(result["env_steps_per_s"], 1),
        "train_wall_s": round(result["train_wall_s"], 1),
        "train_cpu_s": round(result["train_cpu_s"], 1),
        "load_avg_start": result["load_avg_start"][0],
        "load_avg_end": result["load_avg_end"][0],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per seed (default 100000)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--eval-episodes", type=int, default=100)
    parser.add_argument(
        "--eval-envs", type=int, default=10, help="environments the evaluation steps together"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "rl")
    args = parser.parse_args()
    if args.steps < 1 or args.eval_episodes < 1 or args.eval_envs < 1:
        parser.error("--steps, --eval-episodes and --eval-envs must be positive")
    torch.set_num_threads(1)
    hyperparams_file()
    args.out.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        path = args.out / f"sb3_recurrentppo_{TASK}_s{seed}.json"
        if path.exists():
            result = json.loads(path.read_text())
            print(json.dumps({**summary(result), "skipped": f"{path.name} exists"}), flush=True)
            continue
        result = run_seed(seed, steps=args.steps, eval_episodes=args.eval_episodes, eval_envs=args.eval_envs)
        atomic_write_text(path, json.dumps(result, indent=1) + "\n")
        print(json.dumps(summary(result)), flush=True)


if __name__ == "__main__":
    main()
