"""``txl rl train | eval | plot``: reinforcement-learning runs in run folders (a config, its overrides and
flags in; :mod:`txl.rl.run` trains or resumes), the evaluation of a saved agent over fresh episodes, and the
learning curves of several runs."""

from __future__ import annotations

import argparse
import json
from importlib import resources
from pathlib import Path
from typing import Any

from ..config import ConfigError
from ..errors import RunError
from . import _positive_int
from .command import Command, Group, Output
from .common import duration

__all__ = ["RL", "RL_TRAIN", "RL_EVAL", "RL_PLOT"]

RL = Group(name="rl", help="reinforcement learning: train, eval, plot", dest="rl_command")
"""``txl rl``."""

_LOWER = "ppo.n_envs, ppo.n_steps or core.mem_len (--set)"


def _presets() -> list[str]:
    """The RL presets' names (``txl.rl.config.rl_preset_names``, read without importing torch)."""
    folder = resources.files("txl") / "configs" / "rl"
    return sorted(entry.name[: -len(".toml")] for entry in folder.iterdir() if entry.name.endswith(".toml"))


def _needs_extra(exc: ImportError) -> RunError:
    return RunError(f"{exc}" if "pip install" in str(exc) else f"{exc}; pip install 'transformer-xl[rl]'")


def _flags(args: argparse.Namespace) -> list[str]:
    """The overrides the flags make (``--steps 2048`` -> ``steps=2048``), applied after ``--set``."""
    made = []
    for name in ("task", "agent", "steps", "seed"):
        value = getattr(args, name)
        if value is not None:
            made.append(f"{name}={json.dumps(value)}")
    return made


def _new_config(args: argparse.Namespace) -> Any:
    """--config (else the preset of --task or of its family when there is one, else the defaults) with --set,
    then the flags."""
    from ..rl.config import RLConfig, apply_rl_overrides, load_rl_config, rl_preset_for_task

    preset = None if args.task is None else rl_preset_for_task(args.task, _presets())
    if args.config:
        base = load_rl_config(args.config)
    elif preset is not None:
        base = load_rl_config(preset)
    else:
        base = RLConfig()
    return apply_rl_overrides(base, [*args.set, *_flags(args)])


def _cmd_rl_train(args: argparse.Namespace) -> int:
    if args.resume:
        fixed = [f"--{n}" for n in ("config", "out", "task", "agent", "seed") if getattr(args, n)]
        if fixed:
            raise ConfigError(
                f"--resume continues a run with its saved config; do not pass {', '.join(fixed)} "
                "(--steps and --set steps=N, checkpoint_every=N may change)"
            )
    elif not args.out:
        raise ConfigError("txl rl train needs --out DIR (or --resume DIR)")
    try:
        from ..rl.run import resume, train

        if args.resume:
            rows = resume(Path(args.resume), overrides=[*args.set, *_flags(args)], progress=not args.quiet)
        else:
            rows = train(_new_config(args), Path(args.out), overwrite=args.overwrite, progress=not args.quiet)
    except ImportError as exc:
        raise _needs_extra(exc) from None
    run = Path(args.resume or args.out)
    summary = json.loads((run / "summary.json").read_text(encoding="utf-8"))
    print(json.dumps(summary) if args.json else _train_summary(summary, run, len(rows)))
    return 0


def _train_summary(summary: dict[str, Any], run: Path, rows: int) -> str:
    final = summary["final_return"]
    said = "no episode ended" if final is None else f"{final:.4g}"
    return "\n".join(
        [
            f"trained {summary['task']} {summary['agent']} (seed {summary['seed']}): {summary['env_steps']:,} "
            f"steps in {summary['updates']:,} updates, {duration(summary['elapsed_s'])} "
            f"({summary['params']:,} parameters)",
            f"final return {said} (the episodes of the last {summary['final_steps']:,} steps)",
            f"run folder: {run} ({rows} rows in metrics.jsonl; 'txl rl eval {run}' evaluates the agent)",
        ]
    )


def _cmd_rl_eval(args: argparse.Namespace) -> int:
    try:
        from ..rl.saved import evaluate_agent, load_agent

        agent = load_agent(Path(args.run), checkpoint=args.checkpoint)
        seed = args.seed if args.seed is not None else agent.config.seed + 1_000_000
        modes = {"deterministic": [True], "sample": [False], None: [True, False]}[args.mode]
        results = {
            deterministic: evaluate_agent(
                agent, args.episodes, seed=seed, deterministic=deterministic, n_envs=args.envs
            )
            for deterministic in modes
        }
    except ImportError as exc:
        raise _needs_extra(exc) from None
    head = {
        "run": str(args.run),
        "checkpoint": agent.checkpoint.name,
        "update": agent.step,
        "task": agent.config.task,
        "agent": agent.config.agent,
        "seed": seed,
    }
    first = modes[0]
    record = {**head, "actions": "deterministic" if first else "sampled", **results[first].as_dict()}
    if len(modes) == 2:
        record["sampled"] = results[False].as_dict()
    if args.json:
        print(json.dumps(record))
        return 0
    print(
        f"{args.run} ({agent.checkpoint.name}, update {agent.step}): {agent.config.task}, {agent.config.agent}"
    )
    for deterministic, result in results.items():
        figures = result.as_dict()
        print(
            f"{'deterministic' if deterministic else 'sampled':>13}: return {figures['mean_return']:.4g} "
            f"± {figures['std_return']:.4g} (std) over {figures['episodes']} episodes, 95% CI "
            f"[{figures['ci95_low']:.4g}, {figures['ci95_high']:.4g}], mean length {figures['mean_length']:.1f}"
        )
    return 0


def _cmd_rl_plot(args: argparse.Namespace) -> int:
    from ..rl.plot import plot_runs

    try:
        path = plot_runs(args.runs, Path(args.out), window=args.window, title=args.title)
    except ImportError as exc:
        raise RunError(f"txl rl plot needs matplotlib: pip install 'transformer-xl[plots]' ({exc})") from None
    print(f"wrote {path}")
    return 0


def _train_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help=f"a preset ({', '.join(_presets())}) or a TOML file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help="override a config field, e.g. --set ppo.lr=1e-3 --set core.mem_len=32 (repeatable)",
    )
    p.add_argument(
        "--task",
        help="a named task of txl.rl.envs, a registered gymnasium id, or module:factory (without --config, "
        "the task's preset, or its family's (MemoryLength for MemoryLength-48), when it has one)",
    )
    p.add_argument(
        "--agent",
        help="the core: xl (Transformer-XL memory), gru, lstm, or mlp (none); default: the config's",
    )
    p.add_argument("--steps", type=_positive_int, help="environment steps, all environments together")
    p.add_argument("--seed", type=int, help="seeds the agent and the environments")
    p.add_argument("--out", help="run folder to create")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its newest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="end by printing summary.json as one JSON line")


def _eval_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run", help="a run folder of txl rl train")
    p.add_argument("--episodes", type=_positive_int, default=100, help="fresh episodes to play")
    p.add_argument("--seed", type=int, help="the episodes' seed (default: the run's seed + 1,000,000)")
    p.add_argument("--envs", type=_positive_int, help="environments stepped together (default: up to 16)")
    p.add_argument(
        "--checkpoint", default="latest", help="latest, a checkpoint name such as step-00000010, or a folder"
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument(
        "--deterministic",
        dest="mode",
        action="store_const",
        const="deterministic",
        help="the policy's most likely actions only (default: report both)",
    )
    mode.add_argument(
        "--sample", dest="mode", action="store_const", const="sample", help="sampled actions only"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON line: mean_return, std_return, ci95_low, ci95_high, mean_length, episodes "
        "(and the sampled actions' figures under 'sampled' when both are reported)",
    )


def _plot_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("runs", nargs="+", metavar="RUN", help="run folders of txl rl train")
    p.add_argument("--out", required=True, help="the figure to write (.png, .svg or .pdf)")
    p.add_argument("--window", type=_positive_int, default=10, help="updates per smoothing window")
    p.add_argument("--title", help="the figure's title (default: the tasks)")


RL_TRAIN = Command(
    name="train",
    parent="rl",
    help="train an agent with PPO on a task (or --resume a run)",
    arguments=_train_arguments,
    handler=_cmd_rl_train,
    writes=(Output("out", "--out"), Output("resume", "--resume")),
    workload="tokens",
    lower=_LOWER,
)
"""``txl rl train``."""

RL_EVAL = Command(
    name="eval",
    parent="rl",
    help="play fresh episodes with a trained agent: mean, std and 95%% CI of the return",
    arguments=_eval_arguments,
    handler=_cmd_rl_eval,
    workload="tokens",
    lower="--envs",
)
"""``txl rl eval``."""

RL_PLOT = Command(
    name="plot",
    parent="rl",
    help="draw the learning curves of several runs in one figure",
    arguments=_plot_arguments,
    handler=_cmd_rl_plot,
    writes=(Output("out", "--out", "file"),),
    lower="the number of runs",
)
"""``txl rl plot``."""
