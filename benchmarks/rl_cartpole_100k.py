"""txl's XL and LSTM agents on CartPole without velocities at a budget of 100k environment steps, beside
SB3-contrib's RecurrentPPO trained with rl-baselines3-zoo's settings (``benchmarks/rl_sb3.py``). One JSON
file per run in ``benchmarks/results/rl/`` (a run whose file exists is skipped) and one JSON line per run on
stdout.

    nice -n 10 python3 benchmarks/rl_cartpole_100k.py                       # the preset, XL and LSTM, seeds 1-3
    nice -n 10 python3 benchmarks/rl_cartpole_100k.py --variant zoo --agents xl --seeds 1
    python3 benchmarks/rl_cartpole_100k.py --draw            # the RL page's tables, from the result files

A variant is the preset ``CartPoleNoVelocity-100k`` with some fields overridden (:data:`VARIANTS`): ``zoo``
is rl-baselines3-zoo's settings for ``ppo_lstm`` on ``CartPoleNoVel-v1`` as txl's fields, without what
``VecNormalize`` and SB3 add; the others add or remove one thing at a time. Each run trains in a
temporary run folder with one CPU thread, then ``txl rl eval RUN --episodes 100 --json`` plays 100 fresh
episodes with the final agent (most likely actions; the run's frozen observation statistics). What is
recorded: the config, the per-update curve (metrics.jsonl without its timing fields), the final return as
summary.json defines it, the evaluation, the first env step at which an update's mean return reached 475
and 500, env steps per second, CPU time and the load average.

``--draw`` writes the two tables of this comparison (between ``<!-- rl-100k:NAME:start -->`` and ``end``
markers in docs/rl.md and docs/results.md) from the result files alone, SB3's included; ``--draw --check`` exits 1 where
the page differs from what the files draw.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from _common import render_marked

from txl.files import atomic_write_text
from txl.rl.config import apply_rl_overrides, load_rl_config, rl_config_to_dict
from txl.rl.run import TIMING_FIELDS, train

PRESET = "CartPoleNoVelocity-100k"

# rl-baselines3-zoo's ppo_lstm settings for CartPoleNoVel-v1 (8 envs x 32 steps, one minibatch of the whole
# rollout, 20 epochs, lr and clip annealed linearly from 1e-3 and 0.2, gamma 0.98, lambda 0.8, no entropy;
# SB3's value loss is the squared error without a half: vf_coef 0.5 there is 1.0 here) on txl's preset
ZOO = [
    "ppo.n_envs=8",
    "ppo.n_steps=32",
    "ppo.seq_len=32",
    "ppo.n_minibatches=1",
    "ppo.epochs=20",
    "ppo.lr=1e-3",
    "ppo.anneal_lr=true",
    "ppo.clip=0.2",
    "ppo.anneal_clip=true",
    "ppo.gamma=0.98",
    "ppo.gae_lambda=0.8",
    "ppo.ent_coef=0.0",
    "ppo.vf_coef=1.0",
    "ppo.max_grad_norm=0.5",
    "ppo.reward_scale=1.0",
    "ppo.normalize_obs=false",
    "ppo.normalize_reward=false",
    "ppo.bootstrap_truncated=false",
    "ppo.separate_critic=false",
]
VARIANTS: dict[str, list[str]] = {
    "preset": [],
    "zoo": ZOO,
    "zoo+norm_obs": [*ZOO, "ppo.normalize_obs=true"],
    "zoo+norm_reward": [*ZOO, "ppo.normalize_reward=true"],
    "zoo+norm": [*ZOO, "ppo.normalize_obs=true", "ppo.normalize_reward=true"],
    "preset+separate_critic": ["ppo.separate_critic=true"],
    "preset+recompute": ["ppo.memory_after_update=recompute"],
    "preset+lr3e-4": ["ppo.lr=3e-4"],
    "preset+epochs10": ["ppo.epochs=10"],
    "preset+mem16": ["core.mem_len=16"],
}
"""Each variant's overrides of the preset; the preset itself is ``zoo`` with the observations and rewards
normalised and time-limit cuts bootstrapped."""


RESULTS = Path(__file__).parent / "results" / "rl"
DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = (DOCS / "rl.md", DOCS / "results.md")
"""The pages that show the tables (each the markers it has)."""
MARK = "<!-- rl-100k:{}:{} -->"
FINAL_WINDOW = 20_480
"""The final return: the mean return of the episodes that ended in the run's last 20,480 steps (as txl's
``summary.json`` defines it; SB3's from its own episodes)."""

SEED_ROWS: list[tuple[str, str, str, str]] = [
    ("sb3", "lstm", "SB3 RecurrentPPO (LSTM)", "the zoo's, with `VecNormalize`"),
    ("preset", "lstm", "txl `lstm`", "`CartPoleNoVelocity-100k`"),
    ("preset", "xl", "txl `xl`", "`CartPoleNoVelocity-100k`"),
    ("zoo", "xl", "txl `xl`", "`zoo`: the zoo's settings without normalisation or bootstrap"),
    ("preset+epochs10", "xl", "txl `xl`", "`preset+epochs10`: the preset with 10 epochs per update"),
    ("preset+lr3e-4", "xl", "txl `xl`", "`preset+lr3e-4`: the preset with a learning rate of 3e-4"),
    ("preset+lr3e-4", "lstm", "txl `lstm`", "`preset+lr3e-4`: the preset with a learning rate of 3e-4"),
]
"""The rows of the three-seed table: (variant, agent, who, settings); ``sb3`` is SB3's files."""

WHAT: dict[str, str] = {
    "zoo": "the zoo's settings in txl's fields: raw observations and rewards, cuts as ends",
    "zoo+norm_obs": "+ observations normalised",
    "zoo+norm_reward": "+ rewards normalised",
    "zoo+norm": "+ observations and rewards normalised",
    "preset": "+ observations and rewards normalised, cuts bootstrapped (`CartPoleNoVelocity-100k`)",
    "preset+separate_critic": "+ a core of its own for the value head",
    "preset+recompute": "+ `ppo.memory_after_update=recompute`",
    "preset+lr3e-4": "+ a learning rate of 3e-4 (annealed) instead of 1e-3",
    "preset+epochs10": "+ 10 epochs per update instead of 20",
    "preset+mem16": "+ a memory of 16 steps instead of 64",
}
"""What each variant of the one-at-a-time table changes, in its order."""


def read_results(folder: Path = RESULTS) -> dict[tuple[str, str, int], dict[str, Any]]:
    """Every result file of this comparison by (variant, agent, seed); SB3's as variant ``sb3``."""
    found: dict[tuple[str, str, int], dict[str, Any]] = {}
    for path in sorted(folder.glob(f"txl_*_{PRESET}_s*.json")):
        result = json.loads(path.read_text(encoding="utf-8"))
        found[(result["variant"], result["agent"], int(result["seed"]))] = result
    for path in sorted(folder.glob("sb3_recurrentppo_CartPoleNoVelocity_s*.json")):
        result = json.loads(path.read_text(encoding="utf-8"))
        found[("sb3", "lstm", int(result["seed"]))] = result
    return found


def figures(result: dict[str, Any]) -> tuple[float | None, float, int | None, float]:
    """(final return, evaluation mean, first env step at 475, CPU seconds) of a txl or SB3 result."""
    if result.get("benchmark") == "rl_sb3":
        end = result["env_steps"]
        last = [ret for step, ret, _ in result["episodes"] if step > end - FINAL_WINDOW]
        final = statistics.fmean(last) if last else None
        return (
            final,
            result["final_eval"]["return_mean"],
            result["first_step_mean_ge_475"],
            result["train_cpu_s"],
        )
    return (
        result["final_return"],
        result["eval"]["mean_return"],
        result["first_step_mean_ge_475"],
        result["train_cpu_s"],
    )


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}"


def seeds_table(results: dict[tuple[str, str, int], dict[str, Any]]) -> str:
    """The three-seed table: mean and per-seed final return and evaluation, the first step at 475, CPU."""
    head = (
        "| agent | settings | final return: mean (seeds 1, 2, 3) | evaluation: mean (seeds 1, 2, 3) "
        "| first reaching 475 (env steps; txl: an update's mean, SB3: the last 100 episodes' mean) "
        "| CPU per run |\n| --- | --- | --- | --- | --- | --- |"
    )
    lines = [head]
    for variant, agent, who, settings in SEED_ROWS:
        runs = [results.get((variant, agent, seed)) for seed in (1, 2, 3)]
        got = [figures(r) for r in runs if r is not None]
        if not got:
            lines.append(f"| {who} | {settings} | not run | not run | not run | - |")
            continue
        per = [figures(r) if r is not None else None for r in runs]

        def cell(i: int, per: list = per, got: list = got) -> str:
            values = [g[i] for g in got if g[i] is not None]
            mean = _num(statistics.fmean(values)) if len(values) == 3 else "-"
            seeds = ", ".join("not run" if f is None else _num(f[i]) for f in per)
            return f"{mean} ({seeds})"

        first = "; ".join("not run" if f is None else ("never" if f[2] is None else f"{f[2]:,}") for f in per)
        cpu = statistics.fmean(g[3] for g in got) / 60
        lines.append(f"| {who} | {settings} | {cell(0)} | {cell(1)} | {first} | {cpu:.1f} min |")
    return "\n".join(lines)


def variants_table(results: dict[tuple[str, str, int], dict[str, Any]]) -> str:
    """One change at a time, seed 1: final return / evaluation of XL and of the LSTM per variant."""
    lines = ["| variant | what it changes | `xl` | `lstm` |", "| --- | --- | --- | --- |"]
    for variant, what in WHAT.items():
        cells = []
        for agent in ("xl", "lstm"):
            result = results.get((variant, agent, 1))
            if result is None:
                cells.append("not run")
            else:
                final, evaluation, _, _ = figures(result)
                cells.append(f"{_num(final)} / {_num(evaluation)}")
        lines.append(f"| `{variant}` | {what} | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def render(doc: str, drawn: dict[str, str]) -> str:
    """``doc`` with each of its marked blocks (:data:`MARK`) replaced by its drawing."""
    return render_marked(doc, drawn, MARK)


def draw(check: bool, pages: Sequence[Path] = PAGES, folder: Path = RESULTS) -> int:
    """Write the pages' tables from the result files (``check``: only compare; 1 where one differs)."""
    results = read_results(folder)
    tables = {"seeds": seeds_table(results), "variants": variants_table(results)}
    differs = False
    for page in pages:
        doc = page.read_text(encoding="utf-8")
        drawn = render(doc, tables)
        differs |= drawn != doc
        if drawn != doc and not check:
            page.write_text(drawn, encoding="utf-8")
    return 1 if check and differs else 0


def first_step_at(rows: list[dict[str, Any]], level: float) -> int | None:
    """The first env step at which an update's mean return reached ``level`` (None if never)."""
    return next(
        (int(r["env_steps"]) for r in rows if r["return_mean"] is not None and r["return_mean"] >= level),
        None,
    )


def evaluate(run: Path, episodes: int) -> dict[str, Any]:
    """``txl rl eval RUN --episodes N --json`` in a child process, its JSON line."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "txl", "rl", "eval", str(run), "--episodes", str(episodes), "--json"]
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_one(variant: str, agent: str, seed: int, *, steps: int, episodes: int) -> dict[str, Any]:
    """Train one run of a variant and evaluate it; the result as a JSON-ready dict."""
    overrides = [*VARIANTS[variant], f"agent={agent}", f"seed={seed}", f"steps={steps}"]
    config = apply_rl_overrides(load_rl_config(PRESET), overrides)
    with tempfile.TemporaryDirectory() as folder:
        run = Path(folder) / "run"
        load_start = os.getloadavg()
        wall, cpu = time.perf_counter(), time.process_time()
        rows = train(config, run, progress=False)
        train_wall, train_cpu = time.perf_counter() - wall, time.process_time() - cpu
        load_end = os.getloadavg()
        summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
        evaluation = evaluate(run, episodes)
    env_steps = summary["env_steps"]
    return {
        "benchmark": "rl_cartpole_100k",
        "variant": variant,
        "overrides": overrides,
        "preset": PRESET,
        "task": config.task,
        "agent": agent,
        "seed": seed,
        "config": rl_config_to_dict(config),
        "env_steps": env_steps,
        "params": summary["params"],
        "curve": [{k: v for k, v in row.items() if k not in TIMING_FIELDS} for row in rows],
        "final_return": summary["final_return"],
        "final_steps": summary["final_steps"],
        "best_update_return": max(
            (r["return_mean"] for r in rows if r["return_mean"] is not None), default=None
        ),
        "first_step_mean_ge_475": first_step_at(rows, 475.0),
        "first_step_mean_ge_500": first_step_at(rows, 500.0),
        "eval": {k: v for k, v in evaluation.items() if k != "run"},
        "train_wall_s": train_wall,
        "train_cpu_s": train_cpu,
        "env_steps_per_s": env_steps / train_wall,
        "torch_threads": torch.get_num_threads(),
        "load_avg_start": list(load_start),
        "load_avg_end": list(load_end),
        "cpu_count": os.cpu_count(),
    }


def summary_line(result: dict[str, Any]) -> dict[str, Any]:
    """The one-line figures of a result."""
    return {
        "variant": result["variant"],
        "agent": result["agent"],
        "seed": result["seed"],
        "env_steps": result["env_steps"],
        "final_return": round(result["final_return"], 1) if result["final_return"] is not None else None,
        "best_update_return": result["best_update_return"],
        "eval_mean_return": round(result["eval"]["mean_return"], 1),
        "eval_std_return": round(result["eval"]["std_return"], 1),
        "first_step_mean_ge_475": result["first_step_mean_ge_475"],
        "env_steps_per_s": round(result["env_steps_per_s"], 1),
        "load_avg_start": result["load_avg_start"][0],
        "load_avg_end": result["load_avg_end"][0],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", choices=sorted(VARIANTS), default="preset")
    parser.add_argument("--agents", nargs="+", choices=["xl", "lstm", "gru", "mlp"], default=["xl", "lstm"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=100_000, help="env steps per run (default 100000)")
    parser.add_argument("--episodes", type=int, default=100, help="evaluation episodes (default 100)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--draw", action="store_true", help="write the RL page's tables from the result files"
    )
    parser.add_argument("--check", action="store_true", help="with --draw: exit 1 where the page differs")
    args = parser.parse_args(argv)
    if args.draw:
        return draw(args.check, folder=args.out)
    if args.steps < 1 or args.episodes < 1:
        parser.error("--steps and --episodes must be positive")
    torch.set_num_threads(1)
    args.out.mkdir(parents=True, exist_ok=True)
    for agent in args.agents:
        for seed in args.seeds:
            path = args.out / f"txl_{args.variant}_{agent}_{PRESET}_s{seed}.json"
            if path.exists():
                result = json.loads(path.read_text(encoding="utf-8"))
                print(json.dumps({**summary_line(result), "skipped": f"{path.name} exists"}), flush=True)
                continue
            result = run_one(args.variant, agent, seed, steps=args.steps, episodes=args.episodes)
            atomic_write_text(path, json.dumps(result, indent=1) + "\n")
            print(json.dumps(summary_line(result)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
