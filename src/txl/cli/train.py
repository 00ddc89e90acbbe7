"""``txl train``: a new run from a config, or ``--resume`` one; ``--nproc N`` launches it data-parallel."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..config import ConfigError, apply_overrides, load_config, preset_names
from . import _positive_int
from .command import Command, Output
from .common import duration, figures

__all__ = ["TRAIN"]


def _without_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` less its ``--nproc N`` (or ``--nproc=N``): what each process launched by torchrun runs."""
    out, skip = [], False
    for item in argv:
        if skip:
            skip = False
        elif item == "--nproc":
            skip = True
        elif not item.startswith("--nproc="):
            out.append(item)
    return out


def _cmd_train(args: argparse.Namespace) -> int:
    from ..distributed import Distributed, from_environment, launch, under_torchrun
    from ..runs import load_config_to_resume, load_run_config
    from ..train.trainer import resume, train

    if args.resume and (args.config or args.out):
        raise ConfigError("--resume continues a run with its saved config; do not pass --config or --out")
    if not args.resume and (not args.config or not args.out):
        raise ConfigError("txl train needs --config NAME|PATH and --out DIR (or --resume DIR)")
    if args.resume:
        # under the run's lock, so that a start killed before its config.json leaves no lock behind (under
        # torchrun the launching process has read it so, and the ranks must not contend for the lock)
        read = load_run_config if under_torchrun() else load_config_to_resume
        config = apply_overrides(read(Path(args.resume)), args.set)
    else:
        config = _new_run_config(args)
    if args.nproc is not None and args.nproc > 1 and not under_torchrun():
        for field in (
            "train.batch_size",
            "eval.batch_size",
        ):  # refused here in one line, not by every process
            section, name = field.split(".")
            Distributed(world_size=args.nproc).rows(getattr(getattr(config, section), name), field=field)
        return launch(args.nproc, _without_nproc(args.argv))
    group = from_environment(config.train.device)
    if args.nproc is not None and args.nproc != group.world_size:
        raise ConfigError(
            f"--nproc {args.nproc}: this command runs in a group of {group.world_size} processes "
            "started by torchrun; leave --nproc out under torchrun"
        )
    try:
        if args.resume:
            summary = resume(
                Path(args.resume), overrides=tuple(args.set), progress=not args.quiet, group=group
            )
        else:
            summary = train(
                config, Path(args.out), overwrite=args.overwrite, progress=not args.quiet, group=group
            )
        group.barrier()  # every process is done with its collectives before any leaves the group
    finally:
        group.close()
    if group.is_main:
        print(json.dumps(summary) if args.json else _train_summary(summary, Path(args.resume or args.out)))
    return 0


_ENDED = {
    "completed": "trained",
    "early_stopped": "stopped early (train.patience: no better validation loss) after",
    "time_limit": "stopped at train.time_limit after",
}


def _train_summary(summary: dict[str, Any], run_dir: Path) -> str:
    """A few lines for a person at the end of ``txl train`` (``--json`` prints the record instead)."""
    ended = _ENDED.get(summary["status"], summary["status"])
    lines = [
        f"{ended} {summary['steps']:,} steps in {duration(summary['elapsed_s'])} "
        f"({summary['tokens']:,} tokens, {summary['train_tokens_per_s']:,.0f} tokens/s), "
        f"{summary['params']:,} parameters"
    ]
    if "val_loss" in summary:
        lines.append(
            f"valid (whole split, step {summary['steps']:,}): {figures(summary, 'val_')} "
            f"over {summary['val_tokens']:,} tokens"
        )
    if "test_loss" in summary:
        lines.append(f"test:  {figures(summary, 'test_')} over {summary['test_tokens']:,} tokens")
    best = _best_record(run_dir, summary.get("best_val_loss"))
    if best is not None:
        where = (
            "the whole split"
            if best.get("final")
            else f"the first {best['tokens']:,} tokens (train.eval_tokens)"
        )
        lines.append(
            f"best checkpoint: step {best['step']:,}, validation loss {best['loss']:.4f} over {where}"
        )
    lines.append(
        f"run folder: {run_dir} (summary.json holds these figures; metrics.jsonl every one measured)"
    )
    return "\n".join(lines)


def _best_record(run_dir: Path, best: float | None) -> dict[str, Any] | None:
    """The validation record of metrics.jsonl that chose the best checkpoint (the last one of loss ``best``):
    a periodic evaluation, over ``train.eval_tokens`` tokens when that is set, or the final one over the whole
    split. None without one."""
    path = run_dir / "metrics.jsonl"
    if best is None or not path.is_file():
        return None
    found = None
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line) if line.strip() else {}
        if record.get("split") == "valid" and record.get("loss") == best:
            found = record
    return found


def _new_run_config(args: argparse.Namespace) -> Any:
    """--config with the --set overrides. A new run's model.vocab_size is its data's (set when training
    starts), so cutoffs that do not fit are refused naming that size, not the config's placeholder."""
    base = load_config(args.config)
    try:
        return apply_overrides(base, args.set)
    except ConfigError as exc:
        if not str(exc).startswith("model.cutoffs:"):
            raise
    from ..data import prepare_data

    loose = apply_overrides(base, ["model.vocab_size=1000000000", *args.set])
    size = len(prepare_data(loose.data, splits=("train",)).vocab)
    return apply_overrides(base, [f"model.vocab_size={size}", *args.set])


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help=f"a preset ({', '.join(preset_names())}) or a TOML file")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a config field, e.g. --set train.steps=500 (repeatable)",
    )
    p.add_argument("--out", help="run folder to create")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument(
        "--json",
        action="store_true",
        help="end by printing the summary as one JSON line (as the run folder's summary.json) instead of "
        "a few lines for a person",
    )
    p.add_argument(
        "--nproc",
        type=_positive_int,
        metavar="N",
        help="train data-parallel on N processes of this machine (launches torchrun; the "
        "train.batch_size streams are split over them)",
    )


TRAIN = Command(
    name="train",
    help="train a model (or --resume a run)",
    arguments=_arguments,
    handler=_cmd_train,
    writes=(Output("out", "--out"), Output("resume", "--resume")),
    lower="train.batch_size, train.tgt_len or model.mem_len (--set), or raise train.accum_steps",
)
"""``txl train``."""
