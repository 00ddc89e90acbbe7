"""What each agent of txl.rl costs: the bytes of its state per environment (what a collector, a checkpoint
or a server keeps per environment), environment steps per second while collecting (the core's ``step``, the
heads and the environments) and with PPO's update (a whole PPO iteration), and for the XL agent the cost of
each rule for the memory after an update (``keep``, ``reset``, ``recompute``). Rounds alternate the agents
in one process; prints one JSON document with the medians and the load average.

    PYTHONPATH=src python3 benchmarks/rl_agents.py --rounds 5

Shape: PPO's defaults (16 environments x 128 steps, windows of 32), CoreConfig's defaults (2 GTrXL layers,
d_model 64, memory 64; the baselines 64 wide), on RepeatPreviousEasy, one thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from txl.rl import CoreConfig, PPOConfig
from txl.rl.agent import Agent
from txl.rl.ppo import Collector, check_vector_env, collect, refresh_memory, update
from txl.rl.run import make_envs

AGENTS = ("xl", "gru", "lstm", "mlp")


def state_bytes(agent: Agent, n_envs: int) -> float:
    """Bytes of the core's state per environment."""
    state = agent.core.initial_state(n_envs)
    return sum(t.element_size() * t.numel() for t in state.tensors()) / n_envs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--task", default="RepeatPreviousEasy")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ppo, core = PPOConfig(), CoreConfig()
    steps = ppo.n_envs * ppo.n_steps
    setups = {}
    for kind in AGENTS:
        envs = make_envs(args.task, ppo.n_envs)
        actions = check_vector_env(envs, ppo.n_envs)
        torch.manual_seed(0)
        agent = Agent(kind, envs.single_observation_space.shape[0], actions, core)
        optimizer = torch.optim.Adam(agent.parameters(), lr=ppo.lr, eps=1e-5)
        collector = Collector.begin(envs, agent, seed=0, history=core.n_layer * core.mem_len)
        collect(agent, collector, ppo)  # warm up
        setups[kind] = (agent, optimizer, collector)
    collect_s: dict[str, list[float]] = {k: [] for k in AGENTS}
    update_s: dict[str, list[float]] = {k: [] for k in AGENTS}
    memory_s: dict[str, list[float]] = {r: [] for r in ("keep", "reset", "recompute")}
    load = [os.getloadavg()]
    for _ in range(args.rounds):
        for kind in AGENTS:
            agent, optimizer, collector = setups[kind]
            begin = time.perf_counter()
            rollout = collect(agent, collector, ppo)
            collected = time.perf_counter()
            update(agent, optimizer, rollout, ppo)
            collect_s[kind].append(collected - begin)
            update_s[kind].append(time.perf_counter() - collected)
        agent, _, collector = setups["xl"]
        for rule in memory_s:
            begin = time.perf_counter()
            refresh_memory(agent, collector, rule)  # type: ignore[arg-type]
            memory_s[rule].append(time.perf_counter() - begin)
        load.append(os.getloadavg())
    collect_median = {k: statistics.median(v) for k, v in collect_s.items()}
    record = {
        "case": "txl.rl agents: state size and speed",
        "task": args.task,
        "envs": ppo.n_envs,
        "steps_per_rollout": steps,
        "agents": {
            kind: {
                "state_bytes_per_env": state_bytes(setups[kind][0], ppo.n_envs),
                "params": sum(p.numel() for p in setups[kind][0].parameters()),
                "collect_steps_per_s": round(steps / collect_median[kind], 1),
                "ppo_steps_per_s": round(
                    steps / (collect_median[kind] + statistics.median(update_s[kind])), 1
                ),
            }
            for kind in AGENTS
        },
        "xl_memory_after_update_ms": {
            rule: round(statistics.median(v) * 1e3, 3) for rule, v in memory_s.items()
        },
        "xl_collect_ms": round(collect_median["xl"] * 1e3, 1),
        "rounds": args.rounds,
        "threads": args.threads,
        "load_avg_1min": [round(x[0], 2) for x in load],
    }
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
