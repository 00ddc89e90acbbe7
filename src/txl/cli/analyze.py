"""``txl compare`` (Transformer-XL against the vanilla baseline) and ``txl analyze ...`` (one subcommand per claim
of the paper): thin wrappers of :mod:`txl.analysis` that print a table and write results.json and figures."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..config import ConfigError, apply_overrides, load_config, preset_names
from . import _positive_int
from .command import Command, Group
from .options import RESULTS, add_output_options, add_run_options, loaded_run, reading_from, settings_from

__all__ = ["ANALYZE", "COMPARE", "ANALYSES"]

ANALYZE = Group(
    name="analyze",
    help="check the paper's claims: memory, speed, recl, recall, attention, documents",
    dest="analysis",
)
"""``txl analyze``."""

_LOWER = "--batch-size, --tgt-len, --mem-len or --lengths"


def _report(args: argparse.Namespace, result: Any) -> int:
    """Print an analysis's table, write results.json and its figures into --out."""
    from ..analysis.report import write_report

    print(result.table(), flush=True)
    files = write_report(Path(args.out), result, plots=not args.no_plots)
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from ..analysis.compare import CompareSettings, compare

    config = apply_overrides(load_config(args.config), args.set)
    settings = settings_from(
        CompareSettings,
        args,
        config_name=args.config,
        overrides=tuple(args.set),
        prompts=args.prompt,
        progress=not args.quiet,
    )
    return _report(args, compare(config, Path(args.out), settings))


def _cmd_analyze_memory(args: argparse.Namespace) -> int:
    from ..analysis.common import parse_ints
    from ..analysis.memory import MemorySettings, analyze_memory

    lengths = parse_ints(args.lengths, name="--lengths") if args.lengths else None
    run = loaded_run(args)
    # the clamp and same-length attention asked for, over the run's, at a memory (each length replaces it)
    reading = reading_from(args, run.config, mem_len=max(1, run.config.model.mem_len))
    settings = MemorySettings(lengths=lengths, split=args.split, reading=reading)
    return _report(args, analyze_memory(run, settings))


def _cmd_analyze_documents(args: argparse.Namespace) -> int:
    from ..analysis.documents import DocumentsResult, DocumentsSettings, analyze_documents

    splits = tuple(s.strip() for s in args.splits.split(",") if s.strip())
    if not splits or any(s not in ("train", "valid", "test") for s in splits):
        raise ConfigError(
            f"--splits: expected a comma-separated list of train, valid, test, got {args.splits!r}"
        )
    runs = [loaded_run(args, run_dir) for run_dir in args.run_dir]
    parts = [
        analyze_documents([run], DocumentsSettings(splits=splits, reading=reading_from(args, run.config)))
        for run in runs
    ]  # one by one: a memory asked for replaces each run's own, with its other lengths
    return _report(args, DocumentsResult(runs=tuple(part for result in parts for part in result.runs)))


def _cmd_analyze_speed(args: argparse.Namespace) -> int:
    from ..analysis.common import parse_ints
    from ..analysis.speed import SpeedSettings, speed_benchmark
    from ..config import TransformerXLConfig

    settings = settings_from(
        SpeedSettings,
        args,
        lengths=parse_ints(args.lengths, name="--lengths", minimum=1),
        model=settings_from(TransformerXLConfig, args),  # the sizes: --n-layer, --d-model, ...
        progress=not args.quiet,
    )
    return _report(args, speed_benchmark(settings, device=args.device))


def _cmd_analyze_recl(args: argparse.Namespace) -> int:
    from ..analysis.common import parse_floats, parse_ints
    from ..analysis.recl import ReclSettings, analyze_recl

    fractions = parse_floats(args.r, name="--r")
    if any(not 0 < v <= 1 for v in fractions):
        raise ConfigError(f"--r: fractions of the targets in (0, 1], got {args.r!r}")
    settings = settings_from(
        ReclSettings,
        args,
        lengths=parse_ints(args.lengths, name="--lengths", minimum=1) if args.lengths else None,
        r=fractions,
        reading=reading_from(args),
    )
    return _report(args, analyze_recl([loaded_run(args, run_dir) for run_dir in args.run_dirs], settings))


def _cmd_analyze_recall(args: argparse.Namespace) -> int:
    from ..analysis.recall import RecallSettings, recall_task

    settings = settings_from(RecallSettings, args, progress=not args.quiet)
    return _report(args, recall_task(Path(args.out), settings))


def _cmd_analyze_attention(args: argparse.Namespace) -> int:
    from ..analysis.attention import AttentionSettings, analyze_attention

    run = loaded_run(args)
    settings = AttentionSettings(split=args.split, reading=reading_from(args, run.config))
    return _report(args, analyze_attention(run, settings))


_COMPARE_HELP = """\
Train the Transformer-XL of --config and the paper's vanilla baseline (absolute positions, no memory;
the same sizes, data, steps and seed) as two run folders, OUT/xl and OUT/vanilla, and compare them:
validation and test loss, perplexity (and bits per character for character and byte corpora), the
relative difference, and each model's training throughput. Every token of a split is predicted once.
The vanilla model is evaluated two ways: 'vanilla' on disjoint segments of its training length, as it
was trained, and 'vanilla_sliding' with the paper's sliding window (every prediction from a window of its
training length; with --stride s each window predicts its last s tokens; 1 is the paper's protocol, the
default a quarter of the window: each prediction from at least 3/4 of a window, a figure a little higher,
in about 4/window of the time; the windows and the time they take here are said before it starts).
Writes OUT/results.json, OUT/samples.md (200 tokens from each model after the same prompts) and the
figures valid_curves.png and train_curves.png. Run it again after an interruption: unfinished runs
continue from their last checkpoint, finished ones are reused."""

_MEMORY_HELP = """\
Evaluate one trained Transformer-XL over a whole split with evaluation memories from 0 up to 8x its
training memory (--lengths to choose), every token predicted once: the loss against the memory it gets.
It starts from the settings of 'txl eval' on the run (its [eval] clamp_len and same_length, else the
model's). Each length is also evaluated with clamp_len at the training attention length (training memory
+ segment), beside the unclamped figure: a gain lost to distances never seen in training shows there.
Writes OUT/results.json ({"rows": [{"mem_len", "loss", "ppl", "clamped_loss", ...}]}) and memory.png."""

_DOCUMENTS_HELP = """\
Evaluate each run over its validation and test splits twice: reading across document boundaries (continue,
the authors' way) and starting each document anew (reset: it attends to nothing before it), overall and by
position within a document (0-9, 10-99, 100-999, ...). Give one run trained with data.documents=continue
and one with reset for the 2 x 2 of trained and evaluated each way. The corpus must have documents.
Writes OUT/results.json ({"runs": [{"run", "trained", "splits": [{"split", "continue_loss", "reset_loss",
"buckets": [...]}]}]}) and documents.png."""

_SPEED_HELP = """\
The paper's Table 9: evaluation time per token of the vanilla Transformer against the Transformer-XL at
attention lengths L (--lengths), the same sizes (--n-layer, --d-model, ...; random weights and tokens).
The vanilla model predicts every token from a window of the L tokens before it, recomputed (the window
slides one position per prediction; only its last position goes through the softmax), timed two ways:
one window per forward (batch 1, the paper's protocol) and batched (--windows-per-batch windows per
forward, default about 16k positions). The Transformer-XL reads one stream (batch 1) in segments of
--segment tokens with a memory of L and same-length attention, so every prediction attends to exactly L
positions (as the paper evaluates); its memory is filled before timing. Each time is the fastest of
--repeats. Writes OUT/results.json ({"model", "params", "threads", "rows": [{"length", "xl_ms_per_token",
"vanilla_ms_per_token", "vanilla_batched_ms_per_token", "windows_per_batch", "ratio", "batched_ratio"}]})
and speed.png."""

_RECL_HELP = """\
The paper's relative effective context length (Dai et al. 2019, Appendix C) of a group of trained models
(same corpus and vocabulary). With l_i(c, t) the loss of model i on target t given c tokens of context:
the group's baseline b(c, t) = min_i l_i(c, t); T the top-r fraction of targets with the largest b(c, t)
(r = 0.1, 0.5, 1.0: the hardest 10%, 50%, all); f_i(c, c') = mean over T of min(b(c, t), l_i(c', t));
the relative perplexity gain g_i(c, c') = (exp f_i(c, c) - exp f_i(c, c')) / exp f_i(c, c). From the
shortest context c, step c -> c + delta while g_i(c, c + delta) >= 0.01; the model's RECL is the c where it
stops (">=" when it still gains at the longest measured context). Context c: a Transformer-XL reads with
memory c and same-length attention (every query attends to exactly c positions in every layer); a vanilla
model slides a window of min(c, its training segment) tokens. Writes OUT/results.json ({"models": [{"run",
"recl": {"0.1": c, ...}, "at_least": {...}, "gains": {"0.1": {"c": g}}}]}) and recl.png."""

_RECALL_HELP = """\
The fastest demonstration that the memory works. On synthetic-recall, a task txl generates (every symbol
of a line's second half repeats the one exactly D positions earlier, D > the segment), train the
Transformer-XL (memory D) and the vanilla baseline for a short budget (OUT/xl, OUT/vanilla), then report
each one's exact-recall accuracy on the test split. Expected: the XL near 100%, the vanilla model at
chance (1/64), since it never sees D positions back. Writes OUT/results.json ({"distance", "segment",
"xl_accuracy", "vanilla_accuracy", "chance"}) and recall.png."""

_ATTENTION_HELP = """\
Where each layer of a trained Transformer-XL looks: on a sample of a split read with memory, the mean
attention probability at each relative distance and the share of attention given to the memory rather
than the current segment, per layer (and head, in the JSON). Writes OUT/results.json and attention.png."""


def _compare_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        required=True,
        help=f"the Transformer-XL: a preset ({', '.join(preset_names())}) or a TOML file",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a config field of both runs (repeatable)",
    )
    p.add_argument(
        "--stride",
        type=_positive_int,
        help="vanilla sliding window: predictions per window (default: a quarter of the training segment, "
        "so that each prediction sees at least 3/4 of a window; 1 is the paper's protocol, every prediction "
        "from a whole window, a lower figure at about window/4 times the time); the time it will take is "
        "said before it starts",
    )
    p.add_argument(
        "--prompt",
        action="append",
        help="a text to continue in samples.md (repeatable; default: three passages of the test split)",
    )
    p.add_argument(
        "--sample-tokens", type=int, default=200, help="tokens each model writes per prompt (0: none)"
    )
    p.add_argument("--seed", type=int, default=0, help="sampling seed (the same for both models)")
    p.add_argument("--overwrite", action="store_true", help="train both runs again from scratch")
    add_output_options(p, default_out=None)


def _memory_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")
    p.add_argument("--lengths", help="comma-separated memory lengths (default: 0, M/4, M/2, M, 2M, 4M, 8M)")
    p.add_argument(
        "--clamp-len", type=int, help="clamp relative distances (default: the run's eval.clamp_len)"
    )
    p.add_argument(
        "--same-length",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="every query attends to the same number of keys (default: the run's eval setting, as txl "
        "eval; off at memory 0)",
    )
    p.add_argument("--tgt-len", type=int, help="segment length (default: the run's eval/train tgt_len)")
    p.add_argument("--batch-size", type=int, help="parallel streams (default: the run's eval.batch_size)")
    add_run_options(p, max_tokens=None)
    add_output_options(p, default_out=None)


def _speed_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--lengths", default="128,256,512,800", help="attention lengths (default: 128,256,512,800)"
    )
    p.add_argument("--segment", type=int, default=64, help="Transformer-XL segment length (default: 64)")
    p.add_argument(
        "--tokens", type=int, default=128, help="vanilla predictions timed per length (default: 128)"
    )
    p.add_argument(
        "--xl-tokens", type=int, default=2048, help="XL predictions timed per length (default: 2048)"
    )
    p.add_argument(
        "--windows-per-batch",
        type=_positive_int,
        help="vanilla windows per forward of the batched timing (default: 16384 / L)",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed runs per measurement; the fastest counts")
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--d-head", type=int, default=32)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--d-inner", type=int, default=512)
    p.add_argument("--vocab-size", type=int, default=256)
    p.add_argument("--device", default="cpu")
    add_output_options(p, default_out="runs/speed")


def _recl_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    p.add_argument(
        "--lengths", help="contexts c (default: delta, 2 delta, ..., 8T; T the shortest training segment)"
    )
    p.add_argument("--delta", type=int, help="extension c -> c + delta (default: T/2)")
    p.add_argument(
        "--r", default="0.1,0.5,1.0", help="fractions of hardest targets, in (0, 1] (default: 0.1,0.5,1.0)"
    )
    p.add_argument("--batch-size", type=int, default=8, help="rows read in parallel by the Transformer-XL")
    add_run_options(p, max_tokens=20_000)
    add_output_options(p, default_out=None)


def _recall_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--segment", type=int, default=16, help="training segment of both models (default: 16)")
    p.add_argument(
        "--distance", type=int, help="D, positions between a symbol and its repeat (default: 2 x segment)"
    )
    p.add_argument("--steps", type=int, default=400, help="training steps of each model (default: 400)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--overwrite", action="store_true", help="train both runs again from scratch")
    add_output_options(p, default_out="runs/recall")


def _attention_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir")
    p.add_argument("--mem-len", type=int, help="memory length (default: the run's evaluation memory)")
    p.add_argument("--tgt-len", type=int, help="segment length (default: the run's eval/train tgt_len)")
    p.add_argument("--batch-size", type=int, default=4, help="rows of the sample read in parallel")
    add_run_options(p, max_tokens=8192)
    add_output_options(p, default_out=None)


def _documents_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", nargs="+", help="one run, or several (e.g. one trained each way: the 2 x 2)")
    p.add_argument(
        "--splits", default="valid,test", help="comma-separated splits to evaluate (default: valid,test)"
    )
    p.add_argument("--mem-len", type=int, help="memory length (default: the run's evaluation memory)")
    p.add_argument("--tgt-len", type=int, help="segment length (default: the run's eval/train tgt_len)")
    p.add_argument("--batch-size", type=int, help="parallel streams (default: the run's eval.batch_size)")
    p.add_argument("--max-tokens", type=int, help="use the first N targets of each split (default: all)")
    p.add_argument("--checkpoint", default="best", help="best, latest, or a checkpoint folder")
    p.add_argument("--device", default="cpu")
    add_output_options(p, default_out=None)


COMPARE = Command(
    name="compare",
    help="train Transformer-XL and the vanilla baseline, compare them side by side",
    description=_COMPARE_HELP,
    arguments=_compare_arguments,
    handler=_cmd_compare,
    writes=RESULTS,
    lower="train.batch_size or train.tgt_len (--set)",
)
"""``txl compare``."""

ANALYSES = (
    Command(
        name="memory",
        parent="analyze",
        help="loss of a trained Transformer-XL against its evaluation memory",
        description=_MEMORY_HELP,
        arguments=_memory_arguments,
        handler=_cmd_analyze_memory,
        writes=RESULTS,
        lower=_LOWER,
    ),
    Command(
        name="speed",
        parent="analyze",
        help="per-token evaluation time, vanilla sliding window vs XL (Table 9)",
        description=_SPEED_HELP,
        arguments=_speed_arguments,
        handler=_cmd_analyze_speed,
        writes=RESULTS,
        lower=_LOWER,
    ),
    Command(
        name="recl",
        parent="analyze",
        help="relative effective context length of a group of runs",
        description=_RECL_HELP,
        arguments=_recl_arguments,
        handler=_cmd_analyze_recl,
        writes=RESULTS,
        lower=_LOWER,
    ),
    Command(
        name="recall",
        parent="analyze",
        help="exact recall D positions back: XL near 100%%, vanilla at chance",
        description=_RECALL_HELP,
        arguments=_recall_arguments,
        handler=_cmd_analyze_recall,
        writes=RESULTS,
        lower=_LOWER,
    ),
    Command(
        name="attention",
        parent="analyze",
        help="attention by distance and memory share, per layer",
        description=_ATTENTION_HELP,
        arguments=_attention_arguments,
        handler=_cmd_analyze_attention,
        writes=RESULTS,
        lower=_LOWER,
    ),
    Command(
        name="documents",
        parent="analyze",
        help="loss reading across documents or starting each anew, and by position in a document",
        description=_DOCUMENTS_HELP,
        arguments=_documents_arguments,
        handler=_cmd_analyze_documents,
        writes=RESULTS,
        lower=_LOWER,
    ),
)
"""``txl analyze memory|speed|recl|recall|attention|documents``, in the order of ``txl analyze --help``."""
