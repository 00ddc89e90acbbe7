"""``txl <command>``: parses arguments, calls the library, prints. Errors a user can fix are printed as one
line (``txl: error: ...``) with exit status 2; an interrupted run exits with 128 + the signal number.

    txl demo                                     # no corpus needed: trains XL and vanilla on Python's stdlib
    txl train --config shakespeare-char --out runs/shakespeare
    txl train --resume runs/shakespeare
    txl eval runs/shakespeare --split test --mem-len 512
    txl generate runs/shakespeare --prompt "ROMEO:"
    txl data download wikitext-103
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from .config import ConfigError, apply_overrides, eval_span, load_config, preset_names
from .errors import TxlError

__all__ = ["main", "build_parser"]


def _cmd_train(args: argparse.Namespace) -> int:
    from .train.trainer import resume, train

    if args.resume:
        if args.config or args.out:
            raise ConfigError("--resume continues a run with its saved config; do not pass --config or --out")
        summary = resume(Path(args.resume), overrides=tuple(args.set), progress=not args.quiet)
    else:
        if not args.config or not args.out:
            raise ConfigError("txl train needs --config NAME|PATH and --out DIR (or --resume DIR)")
        config = apply_overrides(load_config(args.config), args.set)
        summary = train(config, Path(args.out), overwrite=args.overwrite, progress=not args.quiet)
    print(json.dumps(summary))
    return 0


def _eval_lengths(args: argparse.Namespace) -> dict:
    """The length flags given on the command line, as ``eval`` fields."""
    chosen = (("mem_len", args.mem_len), ("clamp_len", args.clamp_len), ("same_length", args.same_length))
    return {k: flag for k, flag in chosen if flag is not None}


def _cmd_eval(args: argparse.Namespace) -> int:
    from .data import encode_split, load_corpus
    from .evaluate import evaluate
    from .runs import load_run

    run = load_run(Path(args.run_dir), checkpoint=args.checkpoint, device=args.device)
    config = run.config
    corpus = load_corpus(config.data.corpus, data_dir=Path(config.data.data_dir) if config.data.data_dir else None)
    tokens = encode_split(corpus, args.split, run.vocab,
                          cache_dir=Path(config.data.cache_dir) if config.data.cache_dir else None)
    lengths = _eval_lengths(args)
    if lengths and config.model.attention != "relative":
        raise ConfigError("--mem-len, --clamp-len and --same-length apply to the Transformer-XL only "
                          "(this run is the vanilla baseline)")
    span = eval_span(dataclasses.replace(config, eval=dataclasses.replace(config.eval, **lengths)))
    tgt_len = args.tgt_len or config.eval.tgt_len or config.train.tgt_len
    batch_size = args.batch_size or config.eval.batch_size
    result = evaluate(run.model, tokens, batch_size=batch_size, tgt_len=tgt_len, span=span,
                      max_tokens=args.max_tokens, progress=not args.quiet, desc=args.split)
    record = {"run": str(args.run_dir), "split": args.split, "checkpoint": run.checkpoint.name, "step": run.step,
              **result.as_dict(), "tgt_len": tgt_len, "batch_size": batch_size,
              "mem_len": span.mem_len, "clamp_len": span.clamp_len, "same_length": span.same_length}
    print(json.dumps(record))
    return 0


def _generate_prompt(args: argparse.Namespace) -> str:
    """The prompt text: --prompt, or the contents of --prompt-file, or a newline."""
    if args.prompt_file is None:
        return "\n" if args.prompt is None else args.prompt
    if args.prompt is not None:
        raise ConfigError("give --prompt or --prompt-file, not both")
    try:
        return Path(args.prompt_file).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--prompt-file {args.prompt_file}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--prompt-file {args.prompt_file}: cannot read it as UTF-8 text ({exc})") from None


def _cmd_generate(args: argparse.Namespace) -> int:
    from .generate import generate_from_run
    from .runs import load_run

    prompt = _generate_prompt(args)
    if args.num_samples < 1:
        raise ConfigError(f"--num-samples must be at least 1, got {args.num_samples}")
    run = load_run(Path(args.run_dir), checkpoint=args.checkpoint, device=args.device)
    shown = -1  # the sample being streamed

    def header(index: int) -> None:
        if args.num_samples > 1:
            print(f"=== sample {index + 1}/{args.num_samples} ===")

    def show(index: int, piece: str) -> None:  # --stream: print each piece as it comes
        nonlocal shown
        if index != shown:
            if shown >= 0:
                print()
            header(index)
            print(prompt, end="")
            shown = index
        print(piece, end="", flush=True)

    try:
        result = generate_from_run(run, prompt, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                   top_k=args.top_k, top_p=args.top_p, greedy=args.greedy, mem_len=args.mem_len,
                                   seed=args.seed, stop=args.stop, num_samples=args.num_samples,
                                   on_text=show if args.stream else None)
    except ValueError as exc:  # unknown prompt tokens, bad sampling settings
        raise TxlError(f"generate: {exc}") from None
    for index, text in enumerate(result.texts):
        if args.stream and index <= shown:
            continue
        header(index)
        print(prompt + text, end="")
        print()
    if args.stream and shown >= 0:
        print()
    print(f"txl: {result.new_tokens} tokens in {result.seconds:.2f} s ({result.tokens_per_s:.1f} tokens/s)",
          file=sys.stderr)
    return 0


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(Path(args.out), minutes=args.minutes, overwrite=args.overwrite, progress=not args.quiet)
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from .data import CORPUS_NAMES, DOWNLOADS, data_search_dirs, download_corpus

    if args.data_command == "download":
        folder = download_corpus(args.name, dest=Path(args.dest) if args.dest else None, url=args.url,
                                 sha256=args.sha256, progress=not args.quiet)
        print(folder)
    else:
        print(json.dumps({"corpora": list(CORPUS_NAMES), "downloadable": sorted(DOWNLOADS),
                          "search_dirs": [str(p) for p in data_search_dirs()]}, indent=1))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="txl", description="Transformer-XL language modelling.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("train", help="train a model (or --resume a run)")
    p.add_argument("--config", help=f"a preset ({', '.join(preset_names())}) or a TOML file")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override a config field, e.g. --set train.steps=500 (repeatable)")
    p.add_argument("--out", help="run folder to create")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its latest checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a run already in --out")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("eval", help="evaluate a run over a whole split; prints one JSON line")
    p.add_argument("run_dir")
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument("--tgt-len", type=int, help="segment length (default: the run's eval/train tgt_len)")
    p.add_argument("--mem-len", type=int, help="memory length (default: the run's eval.mem_len, else the model's)")
    p.add_argument("--clamp-len", type=int, help="clamp relative distances (default: the run's eval.clamp_len)")
    p.add_argument("--same-length", action=argparse.BooleanOptionalAction, default=None,
                   help="every query attends to the same number of keys (default: the run's eval setting)")
    p.add_argument("--batch-size", type=int, help="parallel streams")
    p.add_argument("--max-tokens", type=int, help="evaluate only the first N tokens")
    p.add_argument("--checkpoint", default="best", help="best, latest, or a checkpoint folder")
    p.add_argument("--device", default="cpu")
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser("generate", help="sample text from a trained run, with a key/value cache of the memory")
    p.add_argument("run_dir")
    p.add_argument("--prompt", help="text to continue (default: a newline)")
    p.add_argument("--prompt-file", metavar="FILE", help="continue the text of this UTF-8 file")
    p.add_argument("--max-new-tokens", type=int)
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--top-p", type=float)
    p.add_argument("--greedy", action="store_true", help="always the most likely token (temperature 0)")
    p.add_argument("--stop", action="append", default=[], metavar="TEXT",
                   help="end a sample when its new text contains TEXT, cut before it (repeatable)")
    p.add_argument("--num-samples", type=int, default=1, metavar="N", help="samples, one after the other")
    p.add_argument("--stream", action="store_true", help="print the text as it is produced")
    p.add_argument("--mem-len", type=int, help="memory length while generating (default: the model's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", default="best")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("demo", help="train Transformer-XL and the vanilla baseline on Python's stdlib, compare")
    p.add_argument("--out", default="runs/demo")
    p.add_argument("--minutes", type=float, default=2.5, help="training time for each of the two models")
    p.add_argument("--overwrite", action="store_true", default=True, help=argparse.SUPPRESS)
    p.add_argument("--quiet", action="store_true")
    p.set_defaults(func=_cmd_demo)

    p = sub.add_parser("data", help="corpora: list, download")
    data_sub = p.add_subparsers(dest="data_command", required=True)
    d = data_sub.add_parser("download", help="download and verify a corpus archive")
    d.add_argument("name")
    d.add_argument("--dest", help="folder to put it in (default: $TXL_DATA_DIR or ~/.cache/txl)")
    d.add_argument("--url", help="another address for the archive (a mirror)")
    d.add_argument("--sha256", help="the expected SHA-256 of that archive (default: the pinned one)")
    d.add_argument("--quiet", action="store_true")
    data_sub.add_parser("list", help="known corpora and where they are looked for")
    p.set_defaults(func=_cmd_data)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except TxlError as exc:
        from .train.trainer import Interrupted

        print(f"txl: error: {exc}", file=sys.stderr)
        if isinstance(exc, Interrupted):
            return 128 + exc.signum
        return 2
    except (ConfigError, FileNotFoundError) as exc:
        print(f"txl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("txl: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
