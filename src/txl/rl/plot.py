"""Learning curves of the PPO runs' CSV logs (``python -m txl.rl.plot runs/rl/*.csv --out docs/rl``): one
figure per task, one line per agent, the seeds' range shaded; needs matplotlib (the ``plots`` extra).
"""

from __future__ import annotations

import argparse
import csv
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

__all__ = ["read_runs", "final_return", "plot_curves", "main"]

AGENT_COLOURS = {"xl": "tab:blue", "gru": "tab:orange", "mlp": "tab:gray"}


def read_runs(paths: Sequence[Path]) -> dict[tuple[str, str], list[tuple[np.ndarray, np.ndarray]]]:
    """(task, agent) -> one (global_step, return_mean) pair of arrays per run (seed)."""
    runs: dict[tuple[str, str], list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
    for path in paths:
        with open(path, newline="") as handle:
            rows = list(csv.DictReader(handle))
        if not rows:
            continue
        steps = np.array([int(r["global_step"]) for r in rows])
        returns = np.array([float(r["return_mean"]) for r in rows])
        runs[(rows[0]["task"], rows[0]["agent"])].append((steps, returns))
    return dict(runs)


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    """Trailing mean over ``window`` rollouts (fewer at the start), ignoring NaN (rollouts with no episode)."""
    out = np.empty_like(values)
    for i in range(len(values)):
        part = values[max(0, i - window + 1) : i + 1]
        out[i] = np.nanmean(part) if np.any(~np.isnan(part)) else math.nan
    return out


def final_return(steps: np.ndarray, returns: np.ndarray, *, at: int | None = None, last: int = 10) -> float:
    """The mean episode return of the ``last`` rollouts up to step ``at`` (default: the end of the run)."""
    keep = returns if at is None else returns[steps <= at]
    return float(np.nanmean(keep[-last:]))


def plot_curves(paths: Sequence[Path], out: Path, *, window: int = 10) -> list[Path]:
    """One PNG per task in ``out`` (``rl_{task}.png``); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = read_runs(paths)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for task in sorted({task for task, _ in runs}):
        fig, ax = plt.subplots(figsize=(6, 3.6), dpi=100)
        for (t, agent), seeds in sorted(runs.items()):
            if t != task:
                continue
            n = min(len(s) for s, _ in seeds)
            steps = seeds[0][0][:n]
            curves = np.stack([_smooth(r[:n], window) for _, r in seeds])  # (seeds, n)
            colour = AGENT_COLOURS.get(agent)
            ax.plot(
                steps,
                np.nanmean(curves, axis=0),
                label=f"{agent} ({len(seeds)} seed{'s' * (len(seeds) > 1)})",
                color=colour,
            )
            if len(seeds) > 1:
                ax.fill_between(
                    steps, np.nanmin(curves, axis=0), np.nanmax(curves, axis=0), alpha=0.2, color=colour
                )
        ax.set_title(task)
        ax.set_xlabel("environment steps")
        ax.set_ylabel("mean episode return")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        path = out / f"rl_{task}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m txl.rl.plot CSV... --out DIR``: the plots, and each run's final return printed."""
    parser = argparse.ArgumentParser(prog="python -m txl.rl.plot", description=__doc__.splitlines()[0])
    parser.add_argument("csv", nargs="+", type=Path, help="CSV logs of txl.rl.ppo")
    parser.add_argument("--out", type=Path, default=Path("runs/rl"), help="folder of the PNGs")
    parser.add_argument("--window", type=int, default=10, help="rollouts per smoothing window")
    args = parser.parse_args(argv)
    for (task, agent), seeds in sorted(read_runs(args.csv).items()):
        for steps, returns in seeds:
            print(f"{task} {agent}: {steps[-1]} steps, final return {final_return(steps, returns):.3f}")
    for path in plot_curves(args.csv, args.out, window=args.window):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
