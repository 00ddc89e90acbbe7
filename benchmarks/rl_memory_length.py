"""Success against memory length: bsuite's memory-length task (``MemoryLength-L``: a cue at the first step, the
question L - 1 steps later, return +1 or -1, chance 0) for L in {16, ..., 512}, with five agents:

- ``xl-cover``: the XL agent (2 layers) with ``mem_len = L``: one layer's memory covers the episode;
- ``xl-relay``: ``mem_len = L / 2``: mem_len < L <= 2 x mem_len, so only the stack of two layers reaches the cue
  (layer 1 must carry it into a step that layer 2 can see);
- ``xl-short``: ``mem_len = L / 4``: 2 x mem_len < L, the cue is out of the stack's reach;
- ``gru``, ``lstm``: the recurrent baselines (at ``--baseline-lr``).

From a clone of the repository. Each run is a real ``txl rl train`` (with ``nice -n 10``, one thread, one at a
time) then ``txl rl eval --episodes 100 --json``; its result is one JSON file in ``--results`` named after the
cell (``L048-xl-relay-s1.json``), and a cell whose file exists is skipped, so the grid resumes where it
stopped. ``--draw`` reads only those files and writes the figure and a markdown table.

    PYTHONPATH=src python3 benchmarks/rl_memory_length.py --lengths 16 32 64 --seeds 1
    PYTHONPATH=src python3 benchmarks/rl_memory_length.py --draw --out docs/rl_memory_length.png --page docs/rl.md docs/results.md

``--page docs/rl.md docs/results.md`` writes the two tables into each page between ``<!-- rl-memory-length:NAME:start -->`` and
``end`` markers (NAME ``grid`` and ``others``); with ``--check`` nothing is written, and the exit status is 1
where the page differs from what the files draw.

Budget: ``--episodes`` episodes per run (steps = L x episodes, rounded up to whole rollouts), at least
``--min-steps`` and at most ``--max-steps`` steps; the result file records the steps a cell ran.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from _common import render_marked

LENGTHS = (16, 32, 64, 128, 256, 512)
VARIANTS = ("xl-cover", "xl-relay", "xl-short", "gru", "lstm")
LABELS = {
    "xl-cover": "XL, mem_len = L",
    "xl-relay": "XL, mem_len = L/2 (reach 2 x mem_len = L)",
    "xl-short": "XL, mem_len = L/4 (reach L/2 < L)",
    "gru": "GRU",
    "lstm": "LSTM",
}
ROLLOUT = 16 * 128  # the preset's steps per update (ppo.n_envs x ppo.n_steps)
RESULTS = Path("benchmarks/results/rl/memory_length")


def cell_name(length: int, variant: str, seed: int) -> str:
    """The result file's stem of one cell."""
    return f"L{length:03d}-{variant}-s{seed}"


def budget(length: int, episodes: int, min_steps: int, max_steps: int) -> int:
    """Environment steps of a run on MemoryLength-``length``: ``length x episodes`` within the bounds, rounded
    up to whole rollouts."""
    steps = min(max(length * episodes, min_steps), max_steps)
    return math.ceil(steps / ROLLOUT) * ROLLOUT


def variant_settings(length: int, variant: str, baseline_lr: float) -> tuple[str, list[str]]:
    """The agent and the ``--set`` overrides of a variant on MemoryLength-``length``: one of
    :data:`VARIANTS`, or ``xl-mM`` (``core.mem_len=M``) with options ``-wS`` (training windows of S steps,
    ``ppo.seq_len=S``, rollouts of ``max(128, S)`` steps) and ``-recompute``
    (``ppo.memory_after_update=recompute``), e.g. ``xl-m32-w128``; or ``gru-lrX``, ``lstm-lrX`` (the baseline at
    ``ppo.lr=X``)."""
    if variant in ("gru", "lstm"):
        return variant, [f"ppo.lr={baseline_lr}"]
    baseline = re.fullmatch(r"(gru|lstm)-lr([0-9.e-]+)", variant)
    if baseline is not None:
        return baseline.group(1), [f"ppo.lr={float(baseline.group(2))}"]
    if variant in VARIANTS:
        mem_len = {"xl-cover": length, "xl-relay": length // 2, "xl-short": length // 4}[variant]
        return "xl", [f"core.mem_len={mem_len}"]
    match = re.fullmatch(r"xl-m([0-9]+)((?:-w[0-9]+|-recompute)*)", variant)
    if match is None:
        raise SystemExit(f"--variants: unknown variant {variant!r}")
    overrides = [f"core.mem_len={int(match.group(1))}"]
    for option in match.group(2).split("-")[1:]:
        if option == "recompute":
            overrides.append("ppo.memory_after_update=recompute")
        else:
            seq_len = int(option[1:])
            overrides += [f"ppo.seq_len={seq_len}", f"ppo.n_steps={max(128, seq_len)}"]
    return "xl", overrides


def run_cell(args: argparse.Namespace, length: int, variant: str, seed: int) -> dict:
    """Train and evaluate one cell with the real CLI; the result record."""
    agent, overrides = variant_settings(length, variant, args.baseline_lr)
    steps = args.steps or budget(length, args.episodes, args.min_steps, args.max_steps)
    run = Path(args.runs) / cell_name(length, variant, seed)
    task = f"MemoryLength-{length}"
    sets = [x for o in [*overrides, *args.set] for x in ("--set", o)]
    train = [
        "txl",
        "rl",
        "train",
        "--task",
        task,
        "--agent",
        agent,
        "--seed",
        str(seed),
        "--steps",
        str(steps),
    ]
    train += [*sets, "--out", str(run), "--overwrite", "--quiet", "--json"]
    evaluate = ["txl", "rl", "eval", str(run), "--episodes", "100", "--json"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    prefix = ["nice", "-n", "10", sys.executable, "-m"]
    load = [os.getloadavg()[0]]
    begin = time.time()
    summary = json.loads(_last_line(subprocess.run(prefix + train, env=env, check=True, capture_output=True)))
    load.append(os.getloadavg()[0])
    scores = json.loads(
        _last_line(subprocess.run(prefix + evaluate, env=env, check=True, capture_output=True))
    )
    config = json.loads((run / "config.json").read_text(encoding="utf-8"))
    curve = curve_of(run)
    return {
        "length": length,
        "variant": variant,
        "seed": seed,
        "agent": agent,
        "mem_len": config["core"]["mem_len"] if agent == "xl" else None,
        "n_layer": config["core"]["n_layer"],
        "steps": steps,
        "episodes": steps // length,
        "final_return": summary["final_return"],
        "final_steps": summary["final_steps"],
        "eval_mean_return": scores["mean_return"],
        "eval_sampled_mean_return": scores["sampled"]["mean_return"],
        "solved_at": solved_at(curve),
        "eval": scores,
        "summary": summary,
        "curve": curve,
        "config": config,
        "commands": [" ".join(["nice -n 10", *train]), " ".join(evaluate)],
        "wall_s": round(time.time() - begin, 1),
        "load_1min": load,
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


def curve_of(run: Path) -> list[list[float | None]]:
    """The run's learning curve from its ``metrics.jsonl``: [environment steps, mean return of the episodes
    that ended in the update (None where none did)] per update."""
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    return [[row["env_steps"], row["return_mean"]] for row in rows]


def solved_at(curve: Sequence[Sequence[float | None]], level: float = 0.9, window: int = 5) -> int | None:
    """The first environment step at which the mean return of the last ``window`` updates (an update with no
    episode counts as 0) reaches ``level``; None if it never does."""
    returns = [0.0 if r is None else float(r) for _, r in curve]
    for i in range(window - 1, len(returns)):
        if sum(returns[i - window + 1 : i + 1]) / window >= level:
            return int(curve[i][0])  # type: ignore[arg-type]
    return None


def _last_line(done: subprocess.CompletedProcess) -> str:
    return done.stdout.decode().strip().splitlines()[-1]


def run_grid(args: argparse.Namespace) -> None:
    """Every missing cell of the grid, one at a time; one result file each, written when the cell is done."""
    from txl.files import atomic_write_text

    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:
        for length in args.lengths:
            for variant in args.variants:
                path = results / f"{cell_name(length, variant, seed)}.json"
                if path.exists():
                    continue
                record = run_cell(args, length, variant, seed)
                atomic_write_text(path, json.dumps(record, indent=1) + "\n")
                shown = {
                    k: record[k] for k in ("length", "variant", "seed", "steps", "wall_s", "final_return")
                }
                print(json.dumps(shown | {"eval": record["eval_mean_return"]}), flush=True)


def read_results(folder: Path) -> list[dict]:
    """Every cell's record in ``folder``."""
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(folder.glob("L*-s*.json"))]


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def table(records: Sequence[dict]) -> str:
    """A markdown table: one row per L, one column per agent; each cell the mean over seeds of the
    evaluation's mean return (100 episodes, the policy's most likely action), with the final return of
    training, the steps and the seeds when not seed 1 alone."""
    by_cell: dict[tuple[int, str], list[dict]] = {}
    for r in records:
        by_cell.setdefault((r["length"], r["variant"]), []).append(r)
    head = "| L | " + " | ".join(LABELS[v] for v in VARIANTS) + " |"
    lines = [head, "| --- |" + " --- |" * len(VARIANTS)]
    for length in LENGTHS:
        cells = []
        for variant in VARIANTS:
            runs = sorted(by_cell.get((length, variant), []), key=lambda r: r["seed"])
            if not runs:
                cells.append("not run")
                continue
            mean = sum(r["eval_mean_return"] for r in runs) / len(runs)
            finals = ", ".join(_fmt(r["final_return"]) for r in runs)
            steps = "/".join(f"{s:,}" for s in sorted({r["steps"] for r in runs}))
            seeds = (
                ""
                if [r["seed"] for r in runs] == [1]
                else f"; seeds {','.join(str(r['seed']) for r in runs)}"
            )
            per_seed = "" if len(runs) == 1 else f" ({', '.join(_fmt(r['eval_mean_return']) for r in runs)})"
            cells.append(f"**{mean:.2f}**{per_seed} (train {finals}; {steps} steps{seeds})")
        lines.append(f"| {length} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def other_table(records: Sequence[dict]) -> str:
    """A markdown table of the runs outside the grid (another L or another agent), one row per run."""
    lines = [
        "| L | agent | seed | steps | eval mean return (100 episodes) | sampled actions | final return (training) "
        "| 0.9 reached at |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(records, key=lambda r: (r["length"], r["variant"], r["seed"])):
        lines.append(
            f"| {r['length']} | {r['variant']} | {r['seed']} | {r['steps']:,} | {r['eval_mean_return']:.2f} | "
            f"{r['eval_sampled_mean_return']:.2f} | {_fmt(r['final_return'])} | "
            f"{'never' if r.get('solved_at') is None else format(r['solved_at'], ',')} |"
        )
    return "\n".join(lines) + "\n"


def in_grid(record: dict) -> bool:
    """Whether a run is a cell of the figure's grid (L in :data:`LENGTHS`, an agent of :data:`VARIANTS`)."""
    return record["length"] in LENGTHS and record["variant"] in VARIANTS


MARK = "<!-- rl-memory-length:{}:{} -->"


def render(doc: str, drawn: dict[str, str]) -> str:
    """``doc`` with each of its marked blocks (:data:`MARK`) replaced by its drawing."""
    return render_marked(doc, drawn, MARK)


def draw(records: Sequence[dict], out: Path) -> None:
    """Success against L: the evaluation's mean return (mean over seeds, each seed a dot) of each agent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    markers = {"xl-cover": "o", "xl-relay": "s", "xl-short": "v", "gru": "^", "lstm": "D"}
    for i, variant in enumerate(VARIANTS):
        runs = [r for r in records if r["variant"] == variant]
        if not runs:
            continue
        lengths = sorted({r["length"] for r in runs})
        means = [
            sum(r["eval_mean_return"] for r in runs if r["length"] == n)
            / sum(1 for r in runs if r["length"] == n)
            for n in lengths
        ]
        shift = 1.0 + 0.06 * (i - 2)  # spread the agents' dots apart on the log axis
        (line,) = ax.plot([n * shift for n in lengths], means, marker=markers[variant], label=LABELS[variant])
        ax.scatter(
            [r["length"] * shift for r in runs],
            [r["eval_mean_return"] for r in runs],
            s=12,
            color=line.get_color(),
            alpha=0.5,
        )
    ax.axhline(0.0, color="grey", linewidth=0.8, linestyle=":")
    # the evaluation's episodes follow the run's seed, the same for every L: one answer every time scores at
    # most +-0.18 (seed 1's; +-0.16 and +-0.14 on seeds 2 and 3)
    ax.axhspan(-0.18, 0.18, color="grey", alpha=0.12, label="one answer every time (chance)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(LENGTHS), [str(n) for n in LENGTHS])
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("episode length L (the cue is L - 1 steps before the question)")
    ax.set_ylabel("mean return, 100 evaluation episodes")
    ax.set_title("MemoryLength-L: PPO, 2-layer XL agents, GRU, LSTM (chance 0)")
    ax.legend(fontsize=8, loc="lower left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def draw_curves(records: Sequence[dict], out: Path, *, window: int = 5) -> None:
    """The learning curves of ``records`` (the return of each update, a trailing mean over ``window``
    updates; an update with no episode counts as 0), one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for r in sorted(records, key=lambda r: (r["variant"], r["seed"])):
        steps = [row[0] for row in r["curve"]]
        returns = [0.0 if row[1] is None else row[1] for row in r["curve"]]
        smoothed = [
            sum(returns[max(0, i - window + 1) : i + 1]) / min(window, i + 1) for i in range(len(returns))
        ]
        ax.plot(steps, smoothed, label=f"L={r['length']} {r['variant']} seed {r['seed']}", linewidth=1.2)
    ax.axhline(0.0, color="grey", linewidth=0.8, linestyle=":")
    ax.set_ylim(-1.05, 1.05)
    ax.set_xlabel("environment steps")
    ax.set_ylabel(f"mean return (last {window} updates)")
    ax.set_title("MemoryLength-48, 2-layer XL: memory (m) and training windows (w)")
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), help="agents (see variant_settings)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1])
    parser.add_argument("--episodes", type=int, default=4096, help="episodes per run (steps = L x episodes)")
    parser.add_argument("--min-steps", type=int, default=98_304)
    parser.add_argument("--max-steps", type=int, default=393_216)
    parser.add_argument("--steps", type=int, default=None, help="the steps of every run (not by L)")
    parser.add_argument("--baseline-lr", type=float, default=3e-3, help="the GRU's and the LSTM's ppo.lr")
    parser.add_argument("--set", action="append", default=[], help="another override for every run")
    parser.add_argument("--runs", default="runs/rl/memory_length", help="the run folders")
    parser.add_argument("--results", default=str(RESULTS), help="one result file per cell")
    parser.add_argument("--draw", action="store_true", help="draw from the result files only")
    parser.add_argument("--out", default="docs/rl_memory_length.png", help="the figure (with --draw)")
    parser.add_argument("--table", default=None, help="also write the markdown table here (with --draw)")
    parser.add_argument(
        "--curves", default=None, help="also draw the curves of the runs outside the grid here"
    )
    parser.add_argument(
        "--page", nargs="+", default=[], help="write the tables into these pages, between their markers"
    )
    parser.add_argument("--check", action="store_true", help="with --page: exit 1 where the page differs")
    args = parser.parse_args(argv)
    if args.draw:
        records = read_results(Path(args.results))
        grid = [r for r in records if in_grid(r)]
        tables = {"grid": table(grid), "others": other_table([r for r in records if not in_grid(r)])}
        differs = False
        for page in map(Path, args.page):
            doc = page.read_text(encoding="utf-8")
            drawn = render(doc, tables)
            differs |= drawn != doc
            if drawn != doc and not args.check:
                page.write_text(drawn, encoding="utf-8")
        if args.check:
            raise SystemExit(1 if differs else 0)
        draw(grid, Path(args.out))
        text = table(grid)
        others = [r for r in records if not in_grid(r)]
        if others:
            text += "\n" + other_table(others)
            if args.curves:
                draw_curves([r for r in others if r["length"] == 48], Path(args.curves))
        if args.table:
            Path(args.table).write_text(text, encoding="utf-8")
        print(text, end="")
        return
    run_grid(args)


if __name__ == "__main__":
    main()
