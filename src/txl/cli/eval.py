"""``txl eval``: a run's figures over a whole split, printed for a person or as one JSON record."""

from __future__ import annotations

import argparse
import json
from typing import Any

from . import _positive_int
from .command import Command
from .common import check_device, check_same_length, figures, library_warnings
from .options import CHECKPOINT_HELP, add_span_flags, eval_lengths_from, given, loaded_run, settings_from

__all__ = ["EVAL"]


def _cmd_eval(args: argparse.Namespace) -> int:
    from ..evaluation import EvalSettings, evaluate_run

    check_device(args.device)
    check_same_length(args)
    with library_warnings(args):
        run = loaded_run(args)
        lengths = eval_lengths_from(args, run.config)
        settings = settings_from(
            EvalSettings, args, tgt_len=lengths.tgt_len, span=lengths.span, progress=not args.quiet
        )
        record = evaluate_run(run, settings, **given(args, "split", "documents"))
    print(json.dumps(record) if args.json else _eval_summary(record))
    return 0


def _eval_summary(record: dict[str, Any]) -> str:
    """Two lines for a person at the end of ``txl eval`` (``--json`` prints the record instead)."""
    clamp = "" if record["clamp_len"] is None else f", clamp_len {record['clamp_len']}"
    return (
        f"{record['split']} of {record['run']} (checkpoint {record['checkpoint']}, step {record['step']}): "
        f"{figures(record)} over {record['tokens']:,} tokens\n"
        f"read in segments of {record['tgt_len']} with a memory of {record['mem_len']}{clamp}, same_length "
        f"{'on' if record['same_length'] else 'off'}, {record['batch_size']} streams, documents "
        f"{record['documents']}"
    )


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument(
        "--tgt-len", type=_positive_int, help="segment length (default: the run's eval/train tgt_len)"
    )
    add_span_flags(p)
    p.add_argument(
        "--batch-size", type=_positive_int, help="parallel streams (default: the run's eval.batch_size)"
    )
    p.add_argument("--max-tokens", type=_positive_int, help="evaluate only the first N tokens")
    p.add_argument(
        "--documents",
        choices=["continue", "reset"],
        help="at a document boundary read on (continue) or start anew (reset; needs a corpus of documents); "
        "default: the run's data.documents",
    )
    p.add_argument("--checkpoint", default="best", help=CHECKPOINT_HELP)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, or auto")
    p.add_argument("--quiet", action="store_true")
    p.add_argument(
        "--json", action="store_true", help="print the figures and settings as one JSON line instead"
    )


EVAL = Command(
    name="eval",
    help="evaluate a run over a whole split; prints the figures (--json: a record)",
    arguments=_arguments,
    handler=_cmd_eval,
    lower="--batch-size, --tgt-len or --mem-len",
)
"""``txl eval``."""
