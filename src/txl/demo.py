"""``txl demo``: the main job on any machine, with no network and no corpus to fetch: a small Transformer-XL and
the vanilla baseline trained on the byte-level Python standard library found here, their validation bits per
byte side by side, and a sample from the Transformer-XL. Imports torch when it runs, not when imported."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .config import (
    DataConfig,
    EvalConfig,
    RunConfig,
    TrainConfig,
    TransformerXLConfig,
    eval_span,
    positive_int,
    vanilla_baseline,
)
from .errors import TxlError
from .files import atomic_write_text

if TYPE_CHECKING:
    from .data import PreparedData

__all__ = [
    "DEFAULT_STEPS",
    "DemoCosts",
    "choose_steps",
    "comparison_table",
    "demo_config",
    "measure_costs",
    "plan_minutes",
    "run_demo",
]

DEFAULT_STEPS = 2600
"""Training steps of each model. How long they take here is measured and said before training starts."""

LOOP_OVERHEAD = 1.15
"""Training steps in the trainer cost this much more than the bare steps :func:`measure_costs` times
(batches, logging, the progress display)."""

MIN_STEPS = 20
"""The fewest training steps of each model that ``minutes`` may leave room for."""


@dataclass(frozen=True)
class DemoCosts:
    """What the demo's work costs on this machine now, by model name ("transformer-xl", "vanilla")."""

    train_s_per_step: dict[str, float]
    """Seconds of one bare training step."""
    eval_s: dict[str, float]
    """Seconds of the final evaluation over the whole validation and test splits."""

    def training_s(self, steps: int) -> float:
        """Seconds to train both models ``steps`` steps in the trainer."""
        return steps * LOOP_OVERHEAD * sum(self.train_s_per_step.values())

    def total_s(self, steps: int) -> float:
        """Seconds of the whole demo after the measurement: training and evaluating both models."""
        return self.training_s(steps) + sum(self.eval_s.values())


def demo_config(steps: int) -> RunConfig:
    """The demo's Transformer-XL: 4 layers, d_model 128, segments of 64 bytes, memory of 64 (128 at eval)."""
    return RunConfig(
        model=TransformerXLConfig(
            vocab_size=256, n_layer=4, n_head=4, d_head=32, d_model=128, d_inner=512, mem_len=64
        ),
        data=DataConfig(corpus="python-stdlib", vocab="byte"),
        train=TrainConfig(
            steps=steps,
            batch_size=12,
            tgt_len=64,
            lr=1e-3,
            min_lr=1e-4,
            warmup_steps=min(100, steps // 10),
            weight_decay=0.1,
            beta2=0.99,
            clip=1.0,
            log_every=25,
            eval_every=0,
            checkpoint_every=0,
            seed=0,
        ),
        eval=EvalConfig(batch_size=32, tgt_len=64, mem_len=128),
    )


def _step_seconds(config: RunConfig) -> float:
    """The median time of a bare training step of ``config``'s model here (3 timed after one warm-up)."""
    import torch

    from .model import TransformerXL
    from .train.optim import configure_optimizer

    torch.manual_seed(0)
    model = TransformerXL(config.model)
    optimizer = configure_optimizer(model, config.train)
    b, t = config.train.batch_size, config.train.tgt_len
    tokens = torch.randint(0, config.model.vocab_size, (b, t + 1))
    memory = None
    times = []
    for _ in range(4):
        start = time.perf_counter()
        out = model(tokens[:, :-1], memory=memory, targets=tokens[:, 1:])
        out.loss.mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        memory = out.memory
        times.append(time.perf_counter() - start)
    return sorted(times[1:])[len(times[1:]) // 2]


def _eval_seconds(config: RunConfig, data: PreparedData) -> float:
    """The time the final evaluation of ``config``'s model over the validation and test splits takes here:
    a slice of two evaluation segments of every stream read as the trainer reads them, scaled by the splits'
    length."""
    import torch

    from .evaluate import EvalSettings, evaluate
    from .model import TransformerXL

    torch.manual_seed(0)
    model = TransformerXL(config.model)
    ec = config.eval
    tgt_len = ec.tgt_len or config.train.tgt_len
    valid = data.splits["valid"]
    piece = valid[: min(len(valid), 2 * ec.batch_size * tgt_len + 1)]
    start = time.perf_counter()
    evaluate(model, piece, EvalSettings(batch_size=ec.batch_size, tgt_len=tgt_len, span=eval_span(config)))
    seconds = time.perf_counter() - start
    total = sum(len(data.splits[s]) for s in ("valid", "test") if s in data.splits)
    return seconds * total / max(len(piece), 1)


def measure_costs(config: RunConfig, data: PreparedData) -> DemoCosts:
    """Time training steps and an evaluation slice of the Transformer-XL ``config`` and of its vanilla
    baseline here and now (a few seconds): what the demo's estimate and ``minutes`` are based on."""
    configs = {"transformer-xl": config, "vanilla": vanilla_baseline(config)}
    return DemoCosts(
        train_s_per_step={name: _step_seconds(c) for name, c in configs.items()},
        eval_s={name: _eval_seconds(c, data) for name, c in configs.items()},
    )


def plan_minutes(minutes: float, costs: DemoCosts, *, spent: float) -> tuple[int, dict[str, float]]:
    """Steps of each model, and each model's training time limit in seconds, so that the whole demo fits
    ``minutes``: what is left after the ``spent`` seconds and both evaluations is shared between the two
    trainings in proportion to their step times. TxlError when the evaluations leave no room for
    :data:`MIN_STEPS` steps, naming the minutes that would."""
    evaluation = sum(costs.eval_s.values())
    left = minutes * 60 - spent - evaluation
    per_step = LOOP_OVERHEAD * sum(costs.train_s_per_step.values())
    if left < MIN_STEPS * per_step:
        need = (spent + evaluation + MIN_STEPS * per_step) / 60
        raise TxlError(
            f"--minutes {minutes:g}: evaluating both models over the whole validation and test splits "
            f"takes about {_duration(evaluation)} here (measured now), and {MIN_STEPS} training steps of "
            f"each {_duration(MIN_STEPS * per_step)}; give --minutes {need:.1f} or more, or --steps"
        )
    total = sum(costs.train_s_per_step.values())
    limits = {name: left * s / total for name, s in costs.train_s_per_step.items()}
    return int(left / per_step), limits


def choose_steps(steps: int | None, minutes: float | None) -> int:
    """The steps to train each model: ``steps`` or :data:`DEFAULT_STEPS` (``minutes`` is planned by
    :func:`plan_minutes`; giving both is an error)."""
    if steps is not None and minutes is not None:
        raise ValueError("give steps or minutes, not both")
    steps = DEFAULT_STEPS if steps is None else steps
    return positive_int(steps, "steps", error=ValueError, field=False)


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"


def comparison_table(results: dict[str, dict[str, Any]]) -> str:
    """The demo's table: validation and test bits per byte of both models, and the difference under
    :data:`~txl.analysis.report.SIGN_CONVENTION` (the same as ``txl compare``'s)."""
    from .analysis.report import SIGN_CONVENTION

    lines = [
        "validation and test bits per byte (lower is better), every byte of each split predicted once;",
        f"{SIGN_CONVENTION}:",
        f"{'model':<16}{'params':>10}{'steps':>8}{'val bpb':>9}{'test bpb':>10}",
    ]
    for name, summary in results.items():
        lines.append(
            f"{name:<16}{summary['params']:>10,}{summary['steps']:>8}"
            f"{summary['val_bpb']:>9.3f}{summary.get('test_bpb', float('nan')):>10.3f}"
        )
    xl, vanilla = results["transformer-xl"]["val_bpb"], results["vanilla"]["val_bpb"]
    lines.append(
        f"Transformer-XL - vanilla: {xl - vanilla:+.3f} val bits per byte "
        f"({'better' if xl < vanilla else 'not better'} with memory and relative positions)"
    )
    return "\n".join(lines)


def run_demo(
    out: Path,
    *,
    steps: int | None = None,
    minutes: float | None = None,
    overwrite: bool = True,
    progress: bool = True,
) -> dict[str, Any]:
    """Train both models for ``steps`` steps each (default :data:`DEFAULT_STEPS`), or for as many steps as
    let the whole command fit about ``minutes`` here (measured at start-up; each model's training also stops
    at its share of the time; not both), and print the comparison and a sample. Before training it says how
    long it will take, from training steps and an evaluation timed here (:func:`measure_costs`). Writes
    ``out/transformer-xl``, ``out/vanilla`` and ``out/demo.json``, replacing an earlier demo there."""
    import torch

    from .data import prepare_data
    from .inference import GenerationSettings
    from .inference.text import generate_text
    from .runs import load_run
    from .train.trainer import train

    started = time.perf_counter()
    out = Path(out)
    choose_steps(steps, minutes)  # refuses both, and a bad count, before any work
    print(
        "txl demo: byte-level language modelling of this machine's Python standard library "
        "(no network needed)",
        flush=True,
    )
    data = prepare_data(demo_config(1).data)
    sizes = {s: len(v) for s, v in data.splits.items()}
    print(
        f"corpus: {sizes['train']:,} train / {sizes['valid']:,} validation bytes "
        f"({len(data.corpus.sources['train'])} train files)",
        flush=True,
    )
    print("timing training steps and an evaluation of both models on this machine...", flush=True)
    costs = measure_costs(demo_config(1), data)
    limits: dict[str, float] = {}
    if minutes is None:
        steps = choose_steps(steps, None)
    else:
        steps, limits = plan_minutes(minutes, costs, spent=time.perf_counter() - started)
        print(
            f"{steps:,} steps fit --minutes {minutes:g} for the whole command: this count follows this "
            f"machine's speed and present load; for a result that is the same everywhere, use --steps "
            f"(default {DEFAULT_STEPS:,})",
            flush=True,
        )
    print(
        f"estimate: about {_duration(costs.total_s(steps))} from now: training both models "
        f"{_duration(costs.training_s(steps))}, then evaluating both models over the whole validation and "
        f"test splits {_duration(sum(costs.eval_s.values()))} (measured on this machine just now; a change "
        "in its load changes it)",
        flush=True,
    )
    xl_config = demo_config(steps)
    configs = {"transformer-xl": xl_config, "vanilla": vanilla_baseline(xl_config)}
    results: dict[str, dict[str, Any]] = {}
    for name, config in configs.items():
        if name in limits:  # --minutes: the training stops at its share of the time, whatever the load
            train_config = dataclasses.replace(config.train, time_limit=limits[name] / 60)
            config = dataclasses.replace(config, train=train_config)
        print(f"\ntraining {name} for {steps:,} steps, then evaluating it...", flush=True)
        results[name] = train(config, out / name, overwrite=overwrite, progress=progress)

    print("\n" + comparison_table(results))
    times = ", ".join(f"{name} {summary['elapsed_s']:.0f} s" for name, summary in results.items())
    print(f"training time here: {times} (this machine's speed and load)")

    run = load_run(out / "transformer-xl")
    generator = torch.Generator().manual_seed(0)
    prompt = "def "
    settings = GenerationSettings(max_new_tokens=300, temperature=0.8, top_k=40)
    sample = generate_text(run.model, run.vocab, prompt, settings, generator=generator)
    print("\nsample from the Transformer-XL (prompt 'def ', temperature 0.8, top-k 40):\n")
    print(prompt + sample)
    report = {"steps": steps, "results": results, "sample": prompt + sample}
    atomic_write_text(out / "demo.json", json.dumps(report, indent=1) + "\n")
    print(
        f"\nruns: {out / 'transformer-xl'} and {out / 'vanilla'}; figures and sample: {out / 'demo.json'}\n"
        f"more samples: txl generate {out / 'transformer-xl'} --prompt 'import ' --max-new-tokens 200"
    )
    print(
        f"took {_duration(time.perf_counter() - started)} in all "
        f"(estimated {_duration(costs.total_s(steps))} after the measurement)",
        flush=True,
    )
    return report
