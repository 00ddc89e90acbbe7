"""``txl harness``: a run evaluated with EleutherAI's lm-evaluation-harness, printed as one JSON line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..config import ConfigError
from . import _non_negative_int, _positive_int
from .command import Command
from .common import check_device, check_same_length, library_warnings
from .options import reading_from, settings_from

__all__ = ["HARNESS"]


def _cmd_harness(args: argparse.Namespace) -> int:
    from ..harness_tasks import check_task_names, lm_eval_tasks_dir

    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    if not tasks:
        raise ConfigError("--tasks must name at least one task")
    check_same_length(args)
    if lm_eval_tasks_dir() is not None:  # the names first, before torch and lm-eval load (else: the extra)
        check_task_names(tasks, args.include_path)
    from ..harness import HarnessSettings, ModelArgs, TxlLM, run_tasks
    from ..runs import load_run_config

    check_device(args.device)
    metadata = None
    if args.metadata is not None:
        try:
            metadata = json.loads(args.metadata)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--metadata must be a JSON object, got {args.metadata!r} ({exc})") from None
        if not isinstance(metadata, dict):
            raise ConfigError(f"--metadata must be a JSON object, got {args.metadata!r}")
    with library_warnings(args):
        reading = reading_from(args, load_run_config(Path(args.run_dir)))
        lm = TxlLM(args.run_dir, ModelArgs(args.checkpoint, args.device, reading, args.seed))
        asked = {"tasks": tasks, "include_path": tuple(args.include_path), "metadata": metadata}
        results = run_tasks(lm, settings_from(HarnessSettings, args, **asked))
    record = {
        "run": str(args.run_dir),
        "checkpoint": lm.run.checkpoint.name,
        "step": lm.run.step,
        "tgt_len": lm.tgt_len,
        "batch_size": lm.batch_size,
        "mem_len": lm.span.mem_len,
        "clamp_len": lm.span.clamp_len,
        "same_length": lm.span.same_length,
        "results": results["results"],
    }
    if not args.quiet:
        from lm_eval.utils import make_table

        print(make_table(results), file=sys.stderr)
    print(json.dumps(record))
    return 0


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")
    p.add_argument(
        "--tasks",
        required=True,
        help="comma-separated lm-eval task names, e.g. txl_wikitext_local (required; no default); checked "
        "first: an unknown name is refused with the closest known ones",
    )
    p.add_argument(
        "--include-path",
        action="append",
        default=[],
        metavar="DIR",
        help="a folder of task YAML files, added to lm-eval's tasks and txl's own (repeatable; default: none)",
    )
    p.add_argument("--limit", type=_positive_int, help="documents per task (default: all of them)")
    p.add_argument(
        "--num-fewshot",
        type=_non_negative_int,
        help="examples before each request (default: each task's own)",
    )
    p.add_argument(
        "--metadata",
        help='a JSON object passed to the tasks, e.g. \'{"corpus": "wikitext-103"}\' for txl_wikitext_local '
        "(default: none)",
    )
    p.add_argument(
        "--tgt-len", type=_positive_int, help="segment length (default: the run's eval/train tgt_len)"
    )
    p.add_argument(
        "--mem-len",
        type=_non_negative_int,
        help="memory length (default: the run's eval.mem_len, else the model's); 0: no memory, "
        "windows of --tgt-len read alone",
    )
    p.add_argument(
        "--clamp-len", type=_positive_int, help="clamp relative distances (default: the run's eval.clamp_len)"
    )
    p.add_argument(
        "--same-length",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="every query attends to the same number of keys (default: the run's eval setting)",
    )
    p.add_argument(
        "--batch-size",
        type=_positive_int,
        help="requests read together (default: the run's eval.batch_size)",
    )
    p.add_argument("--checkpoint", default="best", help="best (default), latest, a step or a folder")
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N")
    p.add_argument(
        "--seed",
        type=_non_negative_int,
        default=1234,
        help="the harness's seeds and the sampling seed of generate_until (default: 1234)",
    )
    p.add_argument("--quiet", action="store_true", help="do not print lm-eval's table on stderr")


HARNESS = Command(
    name="harness",
    help="evaluate a run with EleutherAI's lm-evaluation-harness (pip install 'transformer-xl[harness]'); "
    "prints one JSON line. Text as txl generate reads a prompt: words a word vocabulary does not know are "
    "read as <unk> (a warning counts them), characters a char vocabulary never saw are refused",
    arguments=_arguments,
    handler=_cmd_harness,
)
"""``txl harness``."""
