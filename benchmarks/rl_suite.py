"""txl's RL agents compared the way architectures are compared: a learning-rate sweep per agent, then three
seeds of each agent at its own best on every task of the table. Runs, results and drawing in one script:

    # the sweep (4 learning rates x 4 agents x 3 tasks, seed 1), then the table's seeds, 2 runs at a time
    nice -n 19 python3 benchmarks/rl_suite.py run --jobs 2
    # the tables (written into docs/rl.md and docs/results.md between their markers) and the plots, from the
    # result files alone
    python3 benchmarks/rl_suite.py draw
    python3 benchmarks/rl_suite.py draw --check    # exit 1 when a page differs from the files
    python3 benchmarks/rl_suite.py plan            # every run as the txl rl train command it is

Every run is ``txl rl train`` of the task's preset (its budget, PPO's settings, the XL core's sizes) with only
the agent, ``ppo.lr`` and the seed changed, in a run folder under ``--runs``; one thread per run. A run whose
result file exists is skipped; a run folder left unfinished (killed, deadline) is resumed. The result file of a
run (``benchmarks/results/rl/suite/<task>_<agent>_lr<lr>_s<seed>.json``) holds its command, the final return as
``summary.json`` defines it (the episodes that ended in the last 20,480 environment steps), the curve of the
mean return per update, the env steps per second, the state bytes per environment, the machine and its load.

How the table's learning rate is chosen, per agent: on a swept task, its best final return in the sweep (ties:
the larger mean return over the whole run, then the smaller rate); on the other POPGym tasks, the rate with the
best mean final return over the two swept POPGym tasks; on PendulumNoVelocity, its CartPoleNoVelocity rate.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from _common import render_marked

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "rl" / "suite"
DOCS = (ROOT / "docs" / "rl.md", ROOT / "docs" / "results.md")  # the pages the tables are drawn into
SWEEP_PNG = ROOT / "docs" / "rl_sweep.png"
TABLE_PNG = ROOT / "docs" / "rl_table.png"

AGENTS = ("xl", "gru", "lstm", "mlp")
LRS = (3e-4, 1e-3, 3e-3, 1e-2)
SWEEP_TASKS = ("RepeatPreviousEasy", "RepeatPreviousMedium", "CartPoleNoVelocity")
TABLE_TASKS = (
    "RepeatPreviousEasy",
    "RepeatPreviousMedium",
    "RepeatPreviousHard",
    "RepeatFirstEasy",
    "RepeatFirstMedium",
    "AutoencodeEasy",
    "CartPoleNoVelocity",
    "PendulumNoVelocity",
)
SEEDS = (1, 2, 3)
POPGYM_SWEPT = ("RepeatPreviousEasy", "RepeatPreviousMedium")
# Where an unswept task takes its learning rate from (the tasks whose sweeps decide it).
LR_SOURCE: dict[str, tuple[str, ...]] = {
    task: (task,) if task in SWEEP_TASKS else POPGYM_SWEPT for task in TABLE_TASKS
}
LR_SOURCE["PendulumNoVelocity"] = ("CartPoleNoVelocity",)
# Rough cost of one environment step, relative to the MLP's (orders the queue: longest first).
COST = {"xl": 6.0, "gru": 1.7, "lstm": 1.8, "mlp": 1.0}

MARK = "<!-- rl-suite:{}:{} -->"


@dataclass(frozen=True)
class Run:
    """One ``txl rl train`` run of the suite."""

    task: str
    agent: str
    lr: float
    seed: int

    @property
    def name(self) -> str:
        return f"{self.task}_{self.agent}_lr{self.lr:g}_s{self.seed}"

    def args(self, out: Path, steps: int | None = None) -> list[str]:
        """The run's ``txl rl train`` arguments (``steps``: instead of the preset's budget)."""
        return [
            "rl", "train", "--task", self.task, "--agent", self.agent, "--set", f"ppo.lr={self.lr:g}",
            "--seed", str(self.seed), "--out", str(out), *(["--steps", str(steps)] if steps else []),
        ]  # fmt: skip

    def command(self) -> str:
        """The command a user types (run folder runs/rl/<name>)."""
        return "txl " + shlex.join(self.args(Path("runs/rl") / self.name))


def sweep_runs() -> list[Run]:
    """The learning-rate sweep: every agent at every rate on the swept tasks, seed 1."""
    return [Run(t, a, lr, 1) for t in SWEEP_TASKS for a in AGENTS for lr in LRS]


_READ: dict[Path, tuple[float, dict[str, Any]]] = {}
"""Result files read in this process, by path: their modification time and content (the runner looks every
second; a file is parsed again only when it changed)."""


def read_results(folder: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Every result file, by run name."""
    found = {}
    for path in sorted(folder.glob("*.json")):
        stamp = path.stat().st_mtime
        seen = _READ.get(path)
        if seen is None or seen[0] != stamp:
            seen = _READ[path] = (stamp, json.loads(path.read_text()))
        found[path.stem] = seen[1]
    return found


def _score(result: dict[str, Any]) -> tuple[float, float]:
    final = result["final_return"]
    curve = [r for _, r in result["curve"] if r is not None]
    return (-1e18 if final is None else final, sum(curve) / len(curve) if curve else -1e18)


def best_lr(results: dict[str, dict[str, Any]], agent: str, tasks: Sequence[str]) -> float | None:
    """The agent's learning rate for a table task whose rate comes from ``tasks``' sweeps (None until all of
    those sweep runs have results)."""
    scores: list[tuple[float, float, float]] = []
    for lr in LRS:
        found = [results.get(Run(t, agent, lr, 1).name) for t in tasks]
        if any(r is None for r in found):
            return None
        parts = [_score(r) for r in found if r is not None]
        scores.append((sum(p[0] for p in parts) / len(parts), sum(p[1] for p in parts) / len(parts), -lr))
    return -max(scores)[2]


def table_runs(results: dict[str, dict[str, Any]]) -> tuple[list[Run], list[tuple[str, str]]]:
    """The table's runs whose rate is known, and the (task, agent) pairs still waiting for their sweep."""
    runs, waiting = [], []
    for task in TABLE_TASKS:
        for agent in AGENTS:
            lr = best_lr(results, agent, LR_SOURCE[task])
            if lr is None:
                waiting.append((task, agent))
            else:
                runs.extend(Run(task, agent, lr, s) for s in SEEDS)
    return runs, waiting


def _state_bytes(folder: Path) -> tuple[float, int]:
    """The core's state bytes per environment and the agent's parameters, for the run's config."""
    from txl.rl.agent import Agent
    from txl.rl.ppo import check_vector_env
    from txl.rl.run import make_envs, read_rl_config

    config = read_rl_config(folder)
    envs = make_envs(config.task, 1)
    actions = check_vector_env(envs, 1)
    model = Agent(config.agent, envs.single_observation_space.shape[0], actions, config.core)
    envs.close()
    state = model.core.initial_state(1)
    size = sum(t.element_size() * t.numel() for t in state.tensors())
    return float(size), sum(p.numel() for p in model.parameters())


def write_result(run: Run, folder: Path, results: Path, jobs: int, load_start: float) -> dict[str, Any]:
    """The result file of a finished run folder."""
    import torch

    summary = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line]
    state, params = _state_bytes(folder)
    elapsed = sum(r["collect_s"] + r["update_s"] + r["memory_s"] for r in rows)
    result = {
        "name": run.name,
        "task": run.task,
        "agent": run.agent,
        "lr": run.lr,
        "seed": run.seed,
        "command": run.command(),
        "env_steps": summary["env_steps"],
        "final_return": summary["final_return"],
        "final_steps": summary["final_steps"],
        "curve": [[r["env_steps"], r["return_mean"] if r["episodes"] else None] for r in rows],
        "train_s": round(elapsed, 2),
        "cpu_s": round(summary["cpu_s"], 2),
        "steps_per_s": round(summary["env_steps"] / elapsed, 1) if elapsed else None,
        "state_bytes_per_env": state,
        "params": params,
        "machine": {
            "processor": _processor(),
            "cpus": os.cpu_count(),
            "parallel_runs": jobs,
            "load_avg_1min": [round(load_start, 2), round(os.getloadavg()[0], 2)],
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }
    results.mkdir(parents=True, exist_ok=True)
    from txl.files import atomic_write_text

    atomic_write_text(results / f"{run.name}.json", json.dumps(result, indent=None) + "\n")
    return result


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _launch(run: Run, runs_dir: Path, steps: int | None) -> subprocess.Popen[bytes]:
    folder = runs_dir / run.name
    if (folder / "config.json").is_file():
        args = ["rl", "train", "--resume", str(folder), "--quiet"]
    else:
        args = [*run.args(folder, steps), "--quiet", "--overwrite"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    log = open(runs_dir / f"{run.name}.log", "ab")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(
        [sys.executable, "-m", "txl", *args], env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
    )


def run_suite(args: argparse.Namespace) -> int:
    """Run every run without a result file, ``--jobs`` at a time, the sweep first and each table run as soon
    as its sweep has decided its rate; stop launching at ``--deadline`` seconds and stop (SIGTERM: a
    checkpoint) what still runs at ``--hard-deadline``."""
    runs_dir = Path(args.runs)
    runs_dir.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    running: dict[str, tuple[Run, subprocess.Popen[bytes], float]] = {}
    failed: set[str] = set()
    stages = set(args.stage)
    while True:
        results = read_results(Path(args.results))
        queue: list[Run] = []
        if "sweep" in stages:
            queue += sweep_runs()
        if "table" in stages:
            queue += table_runs(results)[0]
        steps = {t: _preset_steps(t) for t in TABLE_TASKS}
        todo = [r for r in dict.fromkeys(queue) if r.name not in results and r.name not in running]
        todo = [r for r in todo if r.name not in failed and (not args.tasks or r.task in args.tasks)]
        todo.sort(key=lambda r: _order(r, steps))
        elapsed = time.monotonic() - start
        for run in [r for r in todo if (runs_dir / r.name / "summary.json").is_file()]:
            write_result(run, runs_dir / run.name, Path(args.results), args.jobs, os.getloadavg()[0])
            todo.remove(run)  # finished while no runner watched it
        todo = [r for r in todo if not _busy(runs_dir / r.name)]
        while todo and len(running) < args.jobs and (args.deadline is None or elapsed < args.deadline):
            run = todo.pop(0)
            running[run.name] = (run, _launch(run, runs_dir, args.steps), os.getloadavg()[0])
            print(json.dumps({"t": round(elapsed), "start": run.name}), flush=True)
        if not running:
            waiting = table_runs(results)[1] if "table" in stages else []
            print(json.dumps({"t": round(elapsed), "done": True, "todo": len(todo), "waiting": waiting}))
            return 1 if failed else 0
        time.sleep(1.0)
        for name, (run, proc, load) in list(running.items()):
            if args.hard_deadline is not None and elapsed > args.hard_deadline and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            code = proc.poll()
            if code is None:
                continue
            del running[name]
            folder = runs_dir / name
            if code == 0 and (folder / "summary.json").is_file():
                result = write_result(run, folder, Path(args.results), args.jobs, load)
                print(json.dumps({"t": round(elapsed), "end": name, "final": result["final_return"]}))
            else:
                failed.add(name)
                print(json.dumps({"t": round(elapsed), "stopped": name, "code": code}), flush=True)
        if args.hard_deadline is not None and elapsed > args.hard_deadline + 60:
            for _, proc, _ in running.values():
                proc.kill()
            return 1


def _busy(folder: Path) -> bool:
    """Whether a process of this host still trains in the run folder (its lock names a live pid)."""
    try:
        pid = json.loads((folder / ".lock").read_text())["pid"]
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return False
    return True


def _order(run: Run, steps: dict[str, int]) -> tuple[int, int, int, float]:
    """The queue's order: the sweeps of the POPGym tasks, then their other seeds, then CartPole's sweep and
    seeds, then the other tasks seed by seed; the costliest run first within each group."""
    rank = (SWEEP_TASKS + TABLE_TASKS).index(run.task)
    cost = -COST[run.agent] * steps[run.task]
    if run.task in POPGYM_SWEPT:
        return (0, int(run.seed > 1), rank, cost)
    return (1, rank, run.seed, cost) if run.task in SWEEP_TASKS else (2, run.seed, rank, cost)


def _preset_steps(task: str) -> int:
    import tomllib

    text = (ROOT / "src" / "txl" / "configs" / "rl" / f"{task}.toml").read_text()
    return int(tomllib.loads(text)["steps"])


# Drawing: tables into docs/rl.md between markers, plots as PNG, from the result files alone.


def _fmt(x: float | None, digits: int = 3) -> str:
    """A return as the tables show it: whole above 100 (CartPole, Pendulum), one decimal above 10, else
    ``digits`` decimals (the POPGym tasks' returns, between -1 and 1)."""
    if x is None:
        return "–"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.1f}" if abs(x) >= 10 else f"{x:.{digits}f}"


def sweep_table(results: dict[str, dict[str, Any]]) -> str:
    """The sweep as markdown: final return per task, agent and learning rate, each agent's pick in bold."""
    lines = [
        "| task | agent | " + " | ".join(f"lr {lr:g}" for lr in LRS) + " |",
        "| --- | --- | " + " | ".join("---:" for _ in LRS) + " |",
    ]
    for task in SWEEP_TASKS:
        for agent in AGENTS:
            pick = best_lr(results, agent, (task,))
            cells = []
            for lr in LRS:
                r = results.get(Run(task, agent, lr, 1).name)
                cell = _fmt(None if r is None else r["final_return"])
                cells.append(f"**{cell}**" if lr == pick else cell)
            lines.append(f"| {task} | {agent} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main_table(results: dict[str, dict[str, Any]]) -> str:
    """The table: per task and agent, the mean final return over the seeds and each seed's, at its rate."""
    lines = [
        "| task | " + " | ".join(AGENTS) + " |",
        "| --- | " + " | ".join("---" for _ in AGENTS) + " |",
    ]
    for task in TABLE_TASKS:
        cells = []
        for agent in AGENTS:
            lr = best_lr(results, agent, LR_SOURCE[task])
            found = [] if lr is None else [results.get(Run(task, agent, lr, s).name) for s in SEEDS]
            finals = [r["final_return"] for r in found if r is not None]
            if not finals or any(f is None for f in finals):
                cells.append("not run" if lr is None else "not run (lr " + f"{lr:g})")
                continue
            mean = sum(finals) / len(finals)
            seeds = " / ".join(_fmt(f) for f in finals)
            note = "" if len(finals) == len(SEEDS) else f", {len(finals)} of {len(SEEDS)} seeds"
            cells.append(f"**{_fmt(mean)}** ({seeds}; lr {lr:g}{note})")
        lines.append(f"| {task} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(results: dict[str, dict[str, Any]]) -> str:
    """Env steps per CPU-second of a whole run (collection and updates; median over the agent's runs of a task)
    and state bytes per environment."""
    lines = [
        "| agent | parameters | state bytes / env | env steps per CPU-second, RepeatPreviousEasy | "
        "env steps per CPU-second, CartPoleNoVelocity |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for agent in AGENTS:
        mine = [r for r in results.values() if r["agent"] == agent]
        if not mine:
            lines.append(f"| {agent} | – | – | – | – |")
            continue
        speed = []
        for task in ("RepeatPreviousEasy", "CartPoleNoVelocity"):
            s = sorted(r["env_steps"] / r["cpu_s"] for r in mine if r["task"] == task and r["cpu_s"])
            speed.append(f"{s[len(s) // 2]:,.0f}" if s else "–")
        popgym = [r for r in mine if r["task"] == "RepeatPreviousEasy"] or mine
        lines.append(
            f"| {agent} | {popgym[0]['params']:,} | {popgym[0]['state_bytes_per_env']:,.0f} | "
            + " | ".join(speed)
            + " |"
        )
    machines = sorted({(r["machine"]["processor"], r["machine"]["parallel_runs"]) for r in results.values()})
    where = "; ".join(f"{p}, {n} runs at a time" for p, n in machines)
    return "\n".join(lines) + (f"\n\nMeasured on: {where}." if where else "")


def blocks(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    """The markdown drawn into docs/rl.md, by marker name."""
    return {"sweep": sweep_table(results), "table": main_table(results), "cost": cost_table(results)}


def render(doc: str, drawn: dict[str, str]) -> str:
    """``doc`` with each of its marked blocks (:data:`MARK`) replaced by its drawing."""
    return render_marked(doc, drawn, MARK)


CURVE_WINDOW = 10
"""Updates in the trailing mean of the plotted learning curves."""


def smoothed(returns: Sequence[float | None], window: int = CURVE_WINDOW) -> list[float | None]:
    """A run's learning curve as plotted: each update's mean return (None: no episode ended in it) carried
    forward to the updates without one, then the trailing mean over ``window`` updates (None before the first
    episode)."""
    carried: list[float | None] = []
    last: float | None = None
    for value in returns:
        last = value if value is not None else last
        carried.append(last)
    out: list[float | None] = []
    for i in range(len(carried)):
        seen = [v for v in carried[max(0, i - window + 1) : i + 1] if v is not None]
        out.append(sum(seen) / len(seen) if seen else None)
    return out


def plot(results: dict[str, dict[str, Any]]) -> None:
    """The sweep (final return against the learning rate) and the table's learning curves (mean over seeds)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, axes = plt.subplots(1, len(SWEEP_TASKS), figsize=(4 * len(SWEEP_TASKS), 3.2))
    for ax, task in zip(axes, SWEEP_TASKS, strict=True):
        for agent in AGENTS:
            pts = [
                (lr, results[n]["final_return"])
                for lr in LRS
                if (n := Run(task, agent, lr, 1).name) in results
            ]
            pts = [(x, y) for x, y in pts if y is not None]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=agent)
        ax.set_xscale("log")
        ax.set_xticks(LRS, labels=[f"{lr:g}" for lr in LRS])
        ax.minorticks_off()
        ax.set_xlim(LRS[0] / 1.5, LRS[-1] * 1.5)
        if not ax.lines:
            ax.text(0.5, 0.5, "not run yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("learning rate")
    axes[0].set_ylabel("final return (seed 1)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(SWEEP_PNG, dpi=90)
    plt.close(fig)

    fig, axes = plt.subplots(2, 4, figsize=(15, 6.4))
    for ax, task in zip(axes.flat, TABLE_TASKS, strict=True):
        for agent in AGENTS:
            lr = best_lr(results, agent, LR_SOURCE[task])
            found = [] if lr is None else [results.get(Run(task, agent, lr, s).name) for s in SEEDS]
            curves = [r["curve"] for r in found if r is not None]
            if not curves:
                continue
            n = min(len(c) for c in curves)
            xs = [curves[0][i][0] for i in range(n)]
            smooth = [smoothed([row[1] for row in c[:n]]) for c in curves]
            ys = []
            for i in range(n):
                vals = [c[i] for c in smooth if c[i] is not None]
                ys.append(sum(vals) / len(vals) if vals else float("nan"))
            ax.plot(xs, ys, label=f"{agent} ({len(curves)} seed{'s' if len(curves) > 1 else ''})")
        if not ax.lines:
            ax.text(0.5, 0.5, "not run yet", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(task, fontsize=9)
        ax.set_xlabel("env steps")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda x, _pos: f"{x / 1000:.0f}k"))
    axes[0][0].set_ylabel(f"mean return (last {CURVE_WINDOW} updates)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(TABLE_PNG, dpi=80)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run what has no result file yet")
    run.add_argument("--stage", nargs="+", choices=("sweep", "table"), default=["sweep", "table"])
    run.add_argument("--jobs", type=int, default=1, help="runs at a time (one thread each)")
    run.add_argument("--runs", default="runs/rl-suite", help="folder of the run folders")
    run.add_argument("--deadline", type=float, default=None, help="seconds after which no run starts")
    run.add_argument("--hard-deadline", type=float, default=None, help="seconds after which runs stop")
    run.add_argument("--results", default=str(RESULTS), help="folder of the result files")
    run.add_argument("--tasks", nargs="+", choices=TABLE_TASKS, default=None, help="only these tasks' runs")
    run.add_argument("--steps", type=int, default=None, help="a shorter budget, to try the script out")
    draw = sub.add_parser("draw", help="write the tables into the pages and the plots")
    draw.add_argument("--check", action="store_true", help="exit 1 when a page differs from the files")
    draw.add_argument("--no-plots", action="store_true")
    sub.add_parser("plan", help="print every run's command (the table's once the sweep decides its rates)")
    args = parser.parse_args(argv)
    if args.command == "run":
        return run_suite(args)
    results = read_results()
    if args.command == "plan":
        runs, waiting = table_runs(results)
        for r in dict.fromkeys(sweep_runs() + runs):
            print(r.command())
        for task, agent in waiting:
            print(f"# {task} {agent}: waiting for its sweep")
        return 0
    drawn = blocks(results)
    for name in drawn:
        if not any(MARK.format(name, "start") in page.read_text() for page in DOCS):
            raise SystemExit(f"no page has a {MARK.format(name, 'start')} block")
    for page in DOCS:
        doc = page.read_text()
        new = render(doc, drawn)
        if args.check and new != doc:
            print(f"{page} differs from what the result files draw: run benchmarks/rl_suite.py draw")
            return 1
        if new != doc:
            page.write_text(new)
    if args.check:
        return 0
    if not args.no_plots and results:
        plot(results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
