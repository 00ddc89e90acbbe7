"""``txl convert`` (a pretrained checkpoint as a txl run) and ``txl export`` (a run's model as ONNX)."""

from __future__ import annotations

import argparse
import errno
import json
import sys
from pathlib import Path

from ..errors import OutputPathError
from . import _non_negative_int, _positive_int
from .command import Command, Output
from .common import check_device
from .options import add_span_flags, eval_lengths_from, loaded_run, settings_from

__all__ = ["CONVERT", "EXPORT"]


def _cmd_convert(args: argparse.Namespace) -> int:
    from ..analysis.common import parse_ints
    from ..interop.convert import ConvertSettings, convert

    cutoffs = tuple(parse_ints(args.cutoffs, name="--cutoffs", minimum=1)) if args.cutoffs else None
    from ..config import EvalConfig

    lengths = settings_from(EvalConfig, args, batch_size=EvalConfig().batch_size)
    settings = settings_from(ConvertSettings, args, lengths=lengths, cutoffs=cutoffs)
    folder = convert(Path(args.src), Path(args.dst), settings, overwrite=args.overwrite)
    print(folder)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from ..interop.onnx import ExportSettings, check_export_fits, export_onnx
    from ..runs import load_run_config

    check_device(args.device)
    config = load_run_config(Path(args.run_dir))  # the lengths are resolved and sized before the model loads
    lengths = eval_lengths_from(args, config)
    check_export_fits(config.model, lengths)
    print(
        f"txl export: loading {args.run_dir} (checkpoint {args.checkpoint}) (0 s)",
        file=sys.stderr,
        flush=True,
    )
    run = loaded_run(args)
    try:
        settings = ExportSettings(lengths=lengths, opset=args.opset, check=not args.no_check)
        result = export_onnx(run, Path(args.out), settings, progress=True)
    except OSError as exc:  # writing the file failed (a full disk): one line naming the flag
        if exc.filename != str(Path(args.out)):
            raise
        reason = (exc.strerror or str(exc)).lower()
        advice = "; free some space or give --out on another disk" if exc.errno == errno.ENOSPC else ""
        raise OutputPathError(
            f"--out {args.out}: {reason} while writing the ONNX file (nothing was left there){advice}"
        ) from None
    print(json.dumps(result))
    return 0


def _convert_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "src",
        help="a Hugging Face TransfoXL folder (config.json + weights + vocab.pkl) or the "
        "authors' state_dict file",
    )
    p.add_argument("dst", help="the run folder to write")
    p.add_argument(
        "--from",
        dest="source",
        choices=("original", "hf"),
        help="the checkpoint's layout (default: hf for a folder with config.json, else original)",
    )
    p.add_argument("--vocab", help="vocab.pkl, vocab.txt or vocab.json (default: the one next to SRC)")
    p.add_argument(
        "--corpus",
        default="wikitext-103",
        help="the run's data.corpus, which txl eval reads (default: wikitext-103)",
    )
    p.add_argument(
        "--tgt-len", type=_positive_int, help="evaluation segment length (default: the config's, else 128)"
    )
    p.add_argument("--mem-len", type=_non_negative_int, help="memory length (required --from original)")
    p.add_argument("--clamp-len", type=_positive_int, help="clamp of relative distances")
    p.add_argument(
        "--same-length",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="every query sees the same number of keys",
    )
    p.add_argument(
        "--pre-norm", action="store_true", help="--from original: the model was trained with pre_lnorm"
    )
    p.add_argument(
        "--cutoffs", help="--from original, div_val 1: the adaptive softmax cutoffs, e.g. 20000,40000,200000"
    )
    p.add_argument("--overwrite", action="store_true", help="replace a run already in DST")


def _export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")
    p.add_argument("--format", choices=("onnx",), default="onnx", help="onnx (the only format)")
    p.add_argument("--out", required=True, help="the .onnx file to write")
    p.add_argument(
        "--tgt-len", type=_positive_int, help="segment length traced (default: the run's eval tgt_len)"
    )
    add_span_flags(p, export=True)
    p.add_argument("--opset", type=_positive_int, default=18, help="ONNX opset (default: 18)")
    p.add_argument("--checkpoint", default="best", help="best (default), latest, a step or a folder")
    p.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime check of the exported file")


CONVERT = Command(
    name="convert",
    help="a pretrained checkpoint (the authors' or Hugging Face's) as a txl run",
    arguments=_convert_arguments,
    handler=_cmd_convert,
    writes=(Output("dst", "DST"),),
    lower="the memory in use by other programs (the whole checkpoint is read at once)",
)
"""``txl convert``."""

EXPORT = Command(
    name="export",
    help="a run's model as ONNX, with the memory as inputs and outputs",
    arguments=_export_arguments,
    handler=_cmd_export,
    writes=(Output("out", "--out", "file"),),
    lower="--tgt-len or --mem-len",
)
"""``txl export``."""
