"""The argument groups several commands share (span flags, analysis outputs, run options), the one way parsed
arguments become settings values (:func:`settings_from`, :func:`given`, :func:`eval_lengths_from`) and the one
way a command loads the run it reads (:func:`loaded_run`)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from . import _non_negative_int, _positive_int
from .command import Output

if TYPE_CHECKING:
    from ..config import EvalLengths, RunConfig
    from ..evaluation import EvalSettings
    from ..runs import LoadedRun

__all__ = [
    "CHECKPOINT_HELP",
    "RESULTS",
    "settings_from",
    "given",
    "add_span_flags",
    "add_output_options",
    "add_run_options",
    "loaded_run",
    "eval_lengths_from",
    "reading_from",
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
    return {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}


def loaded_run(args: argparse.Namespace, run_dir: str | Path | None = None) -> LoadedRun:
    """The run a command reads, loaded as its flags say: ``run_dir`` (default: the ``run_dir`` argument),
    ``--checkpoint`` and ``--device`` (checked first, naming the flag)."""
    from ..runs import load_run
    from .common import check_device

    check_device(args.device)
    where = args.run_dir if run_dir is None else run_dir
    return load_run(Path(where), checkpoint=args.checkpoint, device=args.device)


def eval_lengths_from(args: argparse.Namespace, config: RunConfig) -> EvalLengths:
    """The lengths to read a run with: ``--tgt-len``, ``--mem-len``, ``--clamp-len`` and ``--same-length``
    where given (a command without one of these flags leaves it to the run), else the run's
    (:func:`txl.config.eval_lengths`)."""
    from ..config import eval_lengths

    return eval_lengths(config, **given(args, "tgt_len", "mem_len", "clamp_len", "same_length"))


def reading_from(args: argparse.Namespace, config: RunConfig | None = None, **span: Any) -> EvalSettings:
    """How a command reads a run's text (:class:`txl.evaluation.EvalSettings`): ``--tgt-len``,
    ``--batch-size`` and ``--max-tokens`` as given (a flag the command lacks, or leaves out, is the run's),
    progress bars unless ``--quiet``, and the span of the run's ``config`` with the ``--mem-len``,
    ``--clamp-len`` and ``--same-length`` given over it (and the lengths of ``span`` where no flag gives
    them; :func:`txl.config.eval_span`); None, the run's own, when no span flag is given."""
    from ..config import eval_span
    from ..evaluation import EvalSettings

    asked = given(args, "mem_len", "clamp_len", "same_length")
    chosen = eval_span(config, **{**span, **asked}) if asked and config is not None else None
    values = given(args, "tgt_len", "batch_size", "max_tokens")
    return EvalSettings(**values, span=chosen, progress=not getattr(args, "quiet", False))


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
