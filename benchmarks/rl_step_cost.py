"""What a step of txl.rl's MemoryCore costs deep into one unbounded episode: the state after step 100 and the
state after step 10,000 of the same episode are kept, and rounds alternate a block of steps from each in one
process; prints one JSON line with the median wall-clock and CPU time per step of each and their ratios
(10,000 / 100).

    PYTHONPATH=src python3 benchmarks/rl_step_cost.py --rounds 21

The memory has ``mem_len`` slots from the first step on and slides, so both steps attend the same number of
keys; the ratio should be 1 up to noise. Shape: CoreConfig's defaults (2 GTrXL layers, d_model 64, memory 64),
16 environments, observations of 8.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

from txl.rl import CoreConfig, CoreState, MemoryCore

E, OBS = 16, 8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--block", type=int, default=50, help="steps timed per block")
    parser.add_argument("--far", type=int, default=10_000, help="the deep step (a multiple of 100)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    core = MemoryCore(OBS, CoreConfig()).eval()
    no_start = torch.zeros(E, dtype=torch.bool)
    saved: dict[int, CoreState] = {}
    state = core.initial_state(E)
    start = time.perf_counter()
    with torch.no_grad():  # the episode in windows of 100 steps (equal to steps: tests/test_rl_core.py)
        for step in range(0, args.far, 100):
            starts = torch.zeros(E, 100, dtype=torch.bool)
            starts[:, 0] = step == 0
            _, state = core.window(torch.randn(E, 100, OBS), state, starts)
            if step + 100 in (100, args.far):
                saved[step + 100] = state
    episode_s = time.perf_counter() - start
    obs = torch.randn(args.block, E, OBS)

    def block(state: CoreState) -> tuple[float, float]:
        """Wall-clock and CPU seconds per step of a block of steps from ``state``."""
        begin, cpu = time.perf_counter(), time.process_time()
        with torch.no_grad():
            for t in range(args.block):
                _, state = core.step(obs[t], state, no_start)
        return (time.perf_counter() - begin) / args.block, (time.process_time() - cpu) / args.block

    times: dict[int, list[tuple[float, float]]] = {100: [], args.far: []}
    for _ in range(args.rounds):
        for at in times:
            times[at].append(block(saved[at]))
    near, far = (statistics.median(w for w, _ in times[at]) for at in (100, args.far))
    near_cpu, far_cpu = (statistics.median(c for _, c in times[at]) for at in (100, args.far))
    print(
        json.dumps(
            {
                "case": "step cost in one episode",
                "envs": E,
                "mem_len": core.config.mem_len,
                "step_100_ms": round(near * 1e3, 4),
                f"step_{args.far}_ms": round(far * 1e3, 4),
                "ratio": round(far / near, 4),
                "step_100_cpu_ms": round(near_cpu * 1e3, 4),
                f"step_{args.far}_cpu_ms": round(far_cpu * 1e3, 4),
                "cpu_ratio": round(far_cpu / near_cpu, 4),
                "reach": [int(saved[100].reach[0]), int(saved[args.far].reach[0])],
                "episode_s": round(episode_s, 2),
                "rounds": args.rounds,
                "block": args.block,
                "threads": args.threads,
                "load_avg": list(os.getloadavg()),
            }
        )
    )


if __name__ == "__main__":
    main()
