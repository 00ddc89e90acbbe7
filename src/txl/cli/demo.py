"""``txl demo``: Transformer-XL and the vanilla baseline trained on Python's stdlib and compared (:mod:`txl.demo`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..demo import DEFAULT_STEPS
from . import _positive_float, _positive_int
from .command import Command, Output
from .options import given

__all__ = ["DEMO"]


def _cmd_demo(args: argparse.Namespace) -> int:
    from ..demo import run_demo

    run_demo(Path(args.out), **given(args, "steps", "minutes", "overwrite"), progress=not args.quiet)
    return 0


def _arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out",
        default="runs/demo",
        help="folder for the two runs and demo.json (default: runs/demo); "
        "a second demo there replaces the first",
    )
    length = p.add_mutually_exclusive_group()
    length.add_argument(
        "--steps",
        type=_positive_int,
        help=f"training steps of each model (default: {DEFAULT_STEPS}; "
        "the same steps give the same result everywhere)",
    )
    length.add_argument(
        "--minutes",
        type=_positive_float,
        help="instead of --steps: time training and evaluation here and train as many steps as let the whole "
        "command (both models, trained and evaluated) end in about this many minutes (the result then follows "
        "this machine's speed)",
    )
    p.add_argument("--overwrite", action="store_true", default=True, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true")


DEMO = Command(
    name="demo",
    help="train Transformer-XL and the vanilla baseline on Python's stdlib, compare",
    arguments=_arguments,
    handler=_cmd_demo,
    writes=(Output("out", "--out"),),
    lower="the memory in use by other programs (the demo's sizes are fixed)",
)
"""``txl demo``."""
