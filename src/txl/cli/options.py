"""The argument groups several commands share (span flags, analysis outputs, run options) and the one way parsed
arguments become settings values (:func:`settings_from`, :func:`given`)."""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any, TypeVar, cast

from . import _non_negative_int, _positive_int
from .command import Output

__all__ = [
    "CHECKPOINT_HELP",
    "RESULTS",
    "settings_from",
    "given",
    "add_span_flags",
    "add_output_options",
    "add_run_options",
]

T = TypeVar("T")

CHECKPOINT_HELP = (
    "which checkpoint: best (default; latest when the run has no best), latest, "
    "a checkpoint name such as step-00001750, or a checkpoint folder"
)
"""The help of ``--checkpoint`` for the commands that read one run."""

RESULTS = (Output("out", "--out", "folder"),)
"""What an analysis writes: the ``--out`` folder of :func:`add_output_options`."""


def settings_from(cls: type[T], args: argparse.Namespace, **values: Any) -> T:
    """The frozen dataclass ``cls`` built from the attributes of ``args`` named like its fields (fields ``args``
    lacks keep their defaults), ``values`` overriding them."""
    names = [field.name for field in dataclasses.fields(cast(Any, cls)) if field.init]
    found = {name: getattr(args, name) for name in names if hasattr(args, name)}
    return cls(**{**found, **values})


def given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The settings given as flags (``--mem-len 64`` -> ``{"mem_len": 64}``); flags left out are not there, so
    the library takes the run's own."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def add_span_flags(p: argparse.ArgumentParser, *, export: bool = False) -> None:
    """--mem-len, --clamp-len and --same-length, as ``txl eval`` and ``txl export`` take them (defaults: the
    run's [eval] section, else its model's; :func:`txl.config.eval_span`). An export carries a memory."""
    p.add_argument(
        "--mem-len",
        type=_positive_int if export else _non_negative_int,
        help="memory length (default: the run's eval.mem_len, else the model's)"
        + ("" if export else "; 0: no memory"),
    )
    p.add_argument(
        "--clamp-len", type=_positive_int, help="clamp relative distances (default: the run's eval.clamp_len)"
    )
    p.add_argument(
        "--same-length",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="every query attends to the same number of keys (default: the run's eval setting"
        + ("" if export else "; turned off with a note when there is no memory")
        + ")",
    )


def add_output_options(p: argparse.ArgumentParser, *, default_out: str | None) -> None:
    """--out (the folder of results.json and the figures), --no-plots and --quiet of an analysis."""
    p.add_argument(
        "--out",
        required=default_out is None,
        default=default_out,
        help="folder for results.json and the figures"
        + (f" (default: {default_out})" if default_out else ""),
    )
    p.add_argument("--no-plots", action="store_true", help="write results.json only (no matplotlib needed)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def add_run_options(p: argparse.ArgumentParser, *, max_tokens: int | None) -> None:
    """--split, --max-tokens, --checkpoint and --device of an analysis that reads a run."""
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument(
        "--max-tokens",
        type=int,
        default=max_tokens,
        help=f"use the first N targets of the split (default: {max_tokens or 'all'})",
    )
    p.add_argument("--checkpoint", default="best", help="best, latest, or a checkpoint folder")
    p.add_argument("--device", default="cpu")
