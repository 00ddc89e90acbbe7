"""The memory experiment of txl.rl in one script: the same PPO, the same budget, three agents (Transformer-XL
memory, GRU, no memory) on one task, then the learning curves.

    PYTHONPATH=src python3 examples/rl_memory_tasks.py --task RepeatPreviousEasy --steps 400000 --seeds 1 2 3

Each run writes ``OUT/{task}_{agent}_s{seed}.csv``; the plot is ``OUT/rl_{task}.png``. The runs go one after
another on one thread; ``python -m txl.rl.ppo`` runs one of them alone (e.g. in parallel processes).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from txl.rl import CoreConfig
from txl.rl.plot import plot_curves
from txl.rl.ppo import PPOConfig, train

TASK_SETTINGS = {"CartPoleNoVelocity": {"n_envs": 8, "n_steps": 64, "reward_scale": 0.01}}
"""PPO settings a task needs, the same for every agent: CartPole's returns reach 500 and it learns from more,
smaller updates."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", default="RepeatPreviousEasy")
    parser.add_argument("--steps", type=int, default=400_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--mem-len", type=int, default=64, help="the XL core's memory (steps)")
    parser.add_argument("--out", type=Path, default=Path("runs/rl"))
    args = parser.parse_args()
    torch.set_num_threads(1)
    for seed in args.seeds:
        for agent in ("xl", "gru", "mlp"):
            config = PPOConfig(
                task=args.task,
                agent=agent,
                total_steps=args.steps,
                seed=seed,
                core=CoreConfig(mem_len=args.mem_len),
                **TASK_SETTINGS.get(args.task, {}),
            )
            rows = train(config, out=args.out)
            print(
                f"{agent} seed {seed}: return {rows[-1]['return_mean']:.3f} after {rows[-1]['global_step']} steps"
            )
    plot_curves(sorted(args.out.glob(f"{args.task}_*.csv")), args.out)


if __name__ == "__main__":
    main()
