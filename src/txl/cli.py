"""``txl <command>``: parses arguments, calls the library, prints. Errors a user can fix, bad flags included,
are printed as one line (``txl: error: ...``) with exit status 2, and so are an operating-system error and
running out of memory (``txl --debug`` or ``TXL_DEBUG=1`` adds the traceback); every command that writes checks
its output path before it starts. A run stopped by SIGINT or SIGTERM saves a checkpoint, says so in a
``txl: note: ...`` line and exits with 128 + the signal number.

    txl demo                                     # no corpus needed: trains XL and vanilla on Python's stdlib
    txl train --config shakespeare-char --out runs/shakespeare
    txl train --resume runs/shakespeare
    txl train --nproc 2 --config tiny --out runs/ddp   # data parallel: torchrun --nproc-per-node 2 -m txl train ...
    txl eval runs/shakespeare --split test --mem-len 512
    txl generate runs/shakespeare --prompt "ROMEO:"
    txl serve runs/shakespeare                   # http://127.0.0.1:8000/: completions API and a page
    txl data download wikitext-103
"""

from __future__ import annotations

import argparse
import copy
import errno
import json
import math
import os
import re
import signal
import sys
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from . import __version__
from .config import ConfigError, apply_overrides, load_config, preset_names
from .errors import OutputPathError, TxlError, TxlWarning
from .files import OutputKind, check_output
from .threads import at_launch

__all__ = ["main", "build_parser"]


def _note(message: str) -> None:
    print(f"txl: note: {message}", file=sys.stderr)


# ---------------------------------------------------------------------------------------------------------
# Flag values: checked while parsing, so that the message names the flag
# ---------------------------------------------------------------------------------------------------------


class _UsageError(Exception):
    """A command line that argparse refused; ``main`` prints it as one line."""


class _StatesDefaults(argparse.HelpFormatter):
    """Help that states every option's default: `` (default: X)`` is added to the help of an option with a
    default (not None, False or an empty list) whose help does not already say it."""

    @staticmethod
    def _has_default(action: argparse.Action) -> bool:
        default = action.default
        return bool(action.option_strings) and not (
            default is None or default is False or default is argparse.SUPPRESS or default == []
        )

    def _format_action(self, action: argparse.Action) -> str:
        if action.help is None and self._has_default(action):  # an option without help still shows it
            action = copy.copy(action)
            action.help = "default: %(default)s"
        return super()._format_action(action)

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help
        if text == argparse.SUPPRESS or not self._has_default(action) or "default" in (text or ""):
            return text
        return f"{text} (default: %(default)s)"


class _HelpFormatter(_StatesDefaults, argparse.HelpFormatter):
    """Every parser's help formatter (see :class:`_StatesDefaults`)."""


class _RawHelpFormatter(_StatesDefaults, argparse.RawDescriptionHelpFormatter):
    """The same for the commands whose description is laid out by hand."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line, ``txl: error: --tgt-len must be ..., got 0``, and whose
    help states the defaults."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        value = re.fullmatch(r"argument (\S+): (must .*)", message, flags=re.DOTALL)  # from the checks below
        if value:
            raise _UsageError(f"{value[1]} {value[2]}")
        raise _UsageError(f"{message} (see '{self.prog} --help')")


def _number(kind: type, accept: Callable[[Any], bool], expected: str) -> Callable[[str], Any]:
    """An argparse ``type=`` that parses a ``kind`` and refuses values ``accept`` rejects."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = None
        if value is None or not accept(value):
            raise argparse.ArgumentTypeError(f"must be {expected}, got {text}")
        return value

    parse.__name__ = expected
    return parse


_positive_int = _number(int, lambda v: v > 0, "a positive integer")
_non_negative_int = _number(int, lambda v: v >= 0, "an integer >= 0")
_positive_float = _number(float, lambda v: math.isfinite(v) and v > 0, "a positive number")
_temperature = _number(float, lambda v: math.isfinite(v) and v >= 0, "a number >= 0 (0 is greedy)")
_top_p = _number(float, lambda v: 0 < v <= 1, "a number in (0, 1]")
_port = _number(int, lambda v: 0 <= v <= 65535, "a port number in 0..65535")


def _device(name: str) -> None:
    """Refuse ``--device NAME`` when it names no device here; the library's message names the config field
    (``train.device: ...``), this one the flag."""
    from .device import resolve_device

    try:
        resolve_device(name)
    except ConfigError as exc:
        raise ConfigError(f"--device {name}: {str(exc).removeprefix('train.device: ')}") from None


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The settings given as flags (``--mem-len 64`` -> ``{"mem_len": 64}``); flags left out are not there, so
    the library takes the run's own. The one way flags become settings."""
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


@contextmanager
def _library_warnings(args: argparse.Namespace) -> Iterator[None]:
    """Say what the library warned about, the CLI's way: same-length attention turned off for want of memory
    as a note naming the flag; the others once each, as :func:`main` shows warnings."""
    from .config import SameLengthOff

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SameLengthOff)
        yield
    said = set()
    for warning in caught:
        message = str(warning.message)
        if message in said:  # the same warning for each sample: once
            continue
        said.add(message)
        if isinstance(warning.message, SameLengthOff):
            flag = "--" + warning.message.field.replace("_", "-")
            _note(warning.message.named(flag) if getattr(args, warning.message.field, None) == 0 else message)
        else:
            warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)


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
    from .distributed import Distributed, from_environment, launch, under_torchrun
    from .runs import load_config_to_resume, load_run_config
    from .train.trainer import resume, train

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


def _figures(record: dict[str, Any], prefix: str = "") -> str:
    """``loss 2.3451, ppl 10.43, bpc 1.8812`` from a record's ``{prefix}loss``, ppl and bits (bpc, bpb, or
    bits per token where a token is neither a character nor a byte)."""
    bits = next((name for name in ("bpc", "bpb") if f"{prefix}{name}" in record), "bits_per_token")
    label = "bits/token" if bits == "bits_per_token" else bits
    return (
        f"loss {record[prefix + 'loss']:.4f}, ppl {record[prefix + 'ppl']:.2f}, "
        f"{label} {record[prefix + bits]:.4f}"
    )


def _duration(seconds: float) -> str:
    """``12.3 s``, ``4 min 05 s``, ``2 h 03 min``."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes} min {secs:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


_ENDED = {
    "completed": "trained",
    "early_stopped": "stopped early (train.patience: no better validation loss) after",
    "time_limit": "stopped at train.time_limit after",
}


def _train_summary(summary: dict[str, Any], run_dir: Path) -> str:
    """A few lines for a person at the end of ``txl train`` (``--json`` prints the record instead)."""
    ended = _ENDED.get(summary["status"], summary["status"])
    lines = [
        f"{ended} {summary['steps']:,} steps in {_duration(summary['elapsed_s'])} "
        f"({summary['tokens']:,} tokens, {summary['train_tokens_per_s']:,.0f} tokens/s), "
        f"{summary['params']:,} parameters"
    ]
    if "val_loss" in summary:
        best = summary.get("best_val_loss")
        kept = f"; best checkpoint at loss {best:.4f}" if best is not None else ""
        lines.append(f"valid: {_figures(summary, 'val_')} over {summary['val_tokens']:,} tokens{kept}")
    if "test_loss" in summary:
        lines.append(f"test:  {_figures(summary, 'test_')} over {summary['test_tokens']:,} tokens")
    lines.append(
        f"run folder: {run_dir} (summary.json holds these figures; metrics.jsonl every one measured)"
    )
    return "\n".join(lines)


def _eval_summary(record: dict[str, Any]) -> str:
    """Two lines for a person at the end of ``txl eval`` (``--json`` prints the record instead)."""
    clamp = "" if record["clamp_len"] is None else f", clamp_len {record['clamp_len']}"
    return (
        f"{record['split']} of {record['run']} (checkpoint {record['checkpoint']}, step {record['step']}): "
        f"{_figures(record)} over {record['tokens']:,} tokens\n"
        f"read in segments of {record['tgt_len']} with a memory of {record['mem_len']}{clamp}, same_length "
        f"{'on' if record['same_length'] else 'off'}, {record['batch_size']} streams, documents "
        f"{record['documents']}"
    )


def _new_run_config(args: argparse.Namespace) -> Any:
    """--config with the --set overrides. A new run's model.vocab_size is its data's (set when training
    starts), so cutoffs that do not fit are refused naming that size, not the config's placeholder."""
    base = load_config(args.config)
    try:
        return apply_overrides(base, args.set)
    except ConfigError as exc:
        if not str(exc).startswith("model.cutoffs:"):
            raise
    from .data import prepare_data

    loose = apply_overrides(base, ["model.vocab_size=1000000000", *args.set])
    size = len(prepare_data(loose.data, splits=("train",)).vocab)
    return apply_overrides(base, [f"model.vocab_size={size}", *args.set])


def _cmd_eval(args: argparse.Namespace) -> int:
    from .evaluate import evaluate_run

    _device(args.device)
    if args.mem_len == 0 and args.same_length:
        raise ConfigError("--same-length needs a memory: it cannot be used with --mem-len 0")
    with _library_warnings(args):
        record = evaluate_run(
            args.run_dir,
            split=args.split,
            checkpoint=args.checkpoint,
            device=args.device,
            max_tokens=args.max_tokens,
            progress=not args.quiet,
            **_given(args, "tgt_len", "batch_size", "mem_len", "clamp_len", "same_length", "documents"),
        )
    print(json.dumps(record) if args.json else _eval_summary(record))
    return 0


def _read_prompt_file(name: str) -> list[str]:
    """The prompts of ``--prompt-file``: a ``.jsonl`` file holds one per line (a JSON string, or an object
    with a "prompt" string; blank lines skipped), any other file is one prompt (its whole UTF-8 text)."""
    try:
        text = Path(name).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--prompt-file {name}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--prompt-file {name}: cannot read it as UTF-8 text ({exc})") from None
    if not name.endswith(".jsonl"):
        return [text]
    prompts = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--prompt-file {name}: line {number} is not JSON ({exc.msg})") from None
        prompt = record.get("prompt") if isinstance(record, dict) else record
        if not isinstance(prompt, str):
            raise ConfigError(
                f'--prompt-file {name}: line {number} must be a JSON string or an object with a "prompt" string'
            )
        prompts.append(prompt)
    if not prompts:
        raise ConfigError(f"--prompt-file {name}: no prompt in it (one JSON string per line)")
    return prompts


def _generate_prompts(args: argparse.Namespace) -> list[str]:
    """The prompts of every --prompt and --prompt-file, in the order given (none: the run's)."""
    prompts: list[str] = []
    for kind, value in args.prompts or ():
        prompts.extend([value] if kind == "text" else _read_prompt_file(value))
    return prompts


class _PromptFlag(argparse.Action):
    """--prompt TEXT and --prompt-file FILE append to one list, in the order given."""

    def __call__(self, parser, namespace, values, option_string=None):  # type: ignore[no-untyped-def]
        kind = "file" if option_string == "--prompt-file" else "text"
        items = list(getattr(namespace, self.dest) or [])
        items.append((kind, values))
        setattr(namespace, self.dest, items)


def _cmd_serve(args: argparse.Namespace) -> int:
    from .serve import require_server_packages, serve

    require_server_packages()
    from .serve.state import ServeSettings

    _device(args.device)
    key = args.api_key if args.api_key is not None else os.environ.get("TXL_API_KEY") or None
    if key is not None and not key.strip():
        raise ConfigError("--api-key must not be empty")
    settings = ServeSettings(
        max_tokens=args.max_tokens_limit,
        max_prompt_chars=args.max_prompt_chars,
        queue_size=args.queue_size,
        max_batch=args.max_batch,
        max_sessions=args.max_sessions,
        session_ttl=args.session_ttl,
        api_key=key,
    )
    serve(
        Path(args.run_dir),
        host=args.host,
        port=args.port,
        device=args.device,
        checkpoint=args.checkpoint,
        settings=settings,
        log_level=args.log_level,
    )
    return 0


def _check_generation_fits(args: argparse.Namespace, run: Any) -> None:
    """Refuse a memory or generation length whose buffers cannot fit, before the first token."""
    from .limits import TOKEN_BYTES, cache_bytes, check_fits

    model = run.config.model
    param = next(run.model.parameters())
    mem_len = model.mem_len if args.mem_len is None else args.mem_len
    if model.attention == "relative" and mem_len > 0:
        setting = f"--mem-len {mem_len}" if args.mem_len is not None else f"the model's mem_len {mem_len}"
        check_fits(
            cache_bytes(model, batch=1, mem_len=mem_len, dtype_bytes=param.element_size()),
            setting=setting,
            what=f"the key/value cache of {model.n_layer} layers, d_model {model.d_model}",
            lower="--mem-len",
            device=param.device,
        )
    new = run.config.generate.max_new_tokens if args.max_new_tokens is None else args.max_new_tokens
    check_fits(
        new * TOKEN_BYTES,
        setting=f"--max-new-tokens {new}",
        what="the tokens of one sample",
        lower="--max-new-tokens",
    )


def _cmd_generate(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from .inference.text import generate_from_run, run_settings
    from .runs import load_run

    prompts = _generate_prompts(args)
    if args.greedy and args.temperature not in (None, 0):
        raise ConfigError(f"--greedy decoding has temperature 0, not {args.temperature}")
    _device(args.device)
    run = load_run(Path(args.run_dir), checkpoint=args.checkpoint, device=args.device)
    _check_generation_fits(args, run)
    if not prompts:
        prompts = ["\n" if run.config.generate.prompt is None else run.config.generate.prompt]
    rows = len(prompts) * args.num_samples
    shown = 0 if args.stream else -1  # the row printed as it is produced (the others when all are done)
    made: dict[int, list[str]] = {}  # each row's prompt as read, then its pieces: printed if interrupted

    def header(row: int) -> None:
        prompt, sample = divmod(row, args.num_samples)
        parts = [f"prompt {prompt + 1}/{len(prompts)}"] if len(prompts) > 1 else []
        parts += [f"sample {sample + 1}/{args.num_samples}"] if args.num_samples > 1 else []
        if parts:
            print(f"=== {', '.join(parts)} ===")

    def start(row: int, prompt_text: str) -> None:
        made[row] = [prompt_text]
        if row == shown:  # --stream: the prompt as the model reads it, then the pieces
            header(row)
            print(prompt_text, end="", flush=True)

    def show(row: int, piece: str) -> None:
        made[row].append(piece)
        if row == shown:
            print(piece, end="", flush=True)

    try:
        with _library_warnings(args), _signals_stop():
            settings = replace(
                run_settings(run, mem_len=args.mem_len),
                **_given(args, "max_new_tokens", "temperature", "top_k", "top_p"),
                **({"temperature": 0.0} if args.greedy else {}),
                stop=tuple(args.stop),
                seed=args.seed,
            )
            result = generate_from_run(
                run, prompts, settings, num_samples=args.num_samples, on_start=start, on_text=show
            )
    except _Stopped as stop:  # Ctrl-C or SIGTERM: what exists is printed, then the usual note
        for row, pieces in made.items():
            if row == shown:
                print()  # the text is on screen already
                continue
            header(row)
            print("".join(pieces))
        print("txl: interrupted", file=sys.stderr)
        return 128 + stop.signum
    except (
        ValueError
    ) as exc:  # unknown prompt tokens (char vocabularies), bad settings (a vanilla run's memory)
        raise TxlError(f"generate: {exc}") from None
    for row in range(rows):
        if row == shown:
            print()
            continue
        header(row)
        print(result.prompt_texts[row] + result.texts[row])
    if result.new_tokens:
        print(
            f"txl: {result.new_tokens} tokens in {result.seconds:.2f} s ({result.tokens_per_s:.1f} tokens/s)",
            file=sys.stderr,
        )
    return 0


class _Stopped(Exception):
    """SIGINT or SIGTERM while generating."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextmanager
def _signals_stop() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into :class:`_Stopped` for the block (in the main thread; elsewhere, nothing)."""

    def handler(signum, _frame):
        raise _Stopped(signum)

    previous = {}
    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not the main thread
        pass
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .demo import run_demo

    run_demo(
        Path(args.out),
        steps=args.steps,
        minutes=args.minutes,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    return 0


def _cmd_data(args: argparse.Namespace) -> int:
    from .data import CORPUS_NAMES, DOWNLOADS, GENERATED_CORPUS_NAMES, data_search_dirs, download_corpus

    if args.data_command == "download":
        from .data.download import default_download_dir

        check_output(Path(args.dest) if args.dest else default_download_dir(), flag="--dest")
        folder = download_corpus(
            args.name,
            dest=Path(args.dest) if args.dest else None,
            url=args.url,
            sha256=args.sha256,
            progress=not args.quiet,
        )
        print(folder)
    else:
        from .data.corpora import corpus_location

        present = {name: corpus_location(name) for name in CORPUS_NAMES}
        if args.json:
            record = {
                "corpora": list(CORPUS_NAMES),
                "generated": list(GENERATED_CORPUS_NAMES),
                "downloadable": sorted(DOWNLOADS),
                "search_dirs": [str(p) for p in data_search_dirs()],
                "present": {name: None if p is None else str(p) for name, p in present.items()},
            }
            print(json.dumps(record, indent=1))
            return 0
        width = max(map(len, (*CORPUS_NAMES, *GENERATED_CORPUS_NAMES)))
        print(f"{'corpus':<{width}}  {'here':<9}  where, or how to get it")
        for name, where in present.items():
            if where is not None:
                print(f"{name:<{width}}  {'present':<9}  {where}")
            else:
                place = data_search_dirs()[0] / name
                how = f"txl data download {name}" if name in DOWNLOADS else f"put its files in {place}"
                print(f"{name:<{width}}  {'missing':<9}  {how}")
        for name in GENERATED_CORPUS_NAMES:
            print(f"{name:<{width}}  {'generated':<9}  made in memory, nothing to fetch")
        folders = ", ".join(str(p) for p in data_search_dirs())
        print(f"\nsearch folders ($TXL_DATA_DIR, then the cache): {folders}")
        print("any text file, folder or hf:NAME dataset is also a corpus (data.corpus=PATH)")
    return 0


def _cmd_convert(args: argparse.Namespace) -> int:
    from .analysis.common import parse_ints
    from .interop.convert import ConvertSettings, convert

    cutoffs = tuple(parse_ints(args.cutoffs, name="--cutoffs", minimum=1)) if args.cutoffs else None
    settings = ConvertSettings(
        source=args.source,
        vocab=args.vocab,
        corpus=args.corpus,
        tgt_len=args.tgt_len,
        mem_len=args.mem_len,
        clamp_len=args.clamp_len,
        same_length=args.same_length,
        pre_norm=args.pre_norm,
        cutoffs=cutoffs,
    )
    folder = convert(Path(args.src), Path(args.dst), settings, overwrite=args.overwrite)
    print(folder)
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .interop.onnx import ExportSettings, export_onnx

    _device(args.device)
    try:
        settings = ExportSettings(
            tgt_len=args.tgt_len,
            mem_len=args.mem_len,
            clamp_len=args.clamp_len,
            same_length=args.same_length,
            checkpoint=args.checkpoint,
            opset=args.opset,
            check=not args.no_check,
        )
        result = export_onnx(Path(args.run_dir), Path(args.out), settings, progress=True)
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


def _cmd_harness(args: argparse.Namespace) -> int:
    from .harness_tasks import check_task_names, lm_eval_tasks_dir

    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    if not tasks:
        raise ConfigError("--tasks must name at least one task")
    if args.mem_len == 0 and args.same_length:
        raise ConfigError("--same-length needs a memory: it cannot be used with --mem-len 0")
    if lm_eval_tasks_dir() is not None:  # the names first, before torch and lm-eval load (else: the extra)
        check_task_names(tasks, args.include_path)
    from .harness import HarnessSettings, TxlLM, run_tasks

    _device(args.device)
    metadata = None
    if args.metadata is not None:
        try:
            metadata = json.loads(args.metadata)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--metadata must be a JSON object, got {args.metadata!r} ({exc})") from None
        if not isinstance(metadata, dict):
            raise ConfigError(f"--metadata must be a JSON object, got {args.metadata!r}")
    with _library_warnings(args):
        lm = TxlLM(
            run=args.run_dir,
            checkpoint=args.checkpoint,
            device=args.device,
            seed=args.seed,
            **_given(args, "batch_size", "mem_len", "tgt_len", "clamp_len", "same_length"),
        )
        settings = HarnessSettings(
            tasks=tasks,
            include_path=tuple(args.include_path),
            num_fewshot=args.num_fewshot,
            limit=args.limit,
            metadata=metadata,
            seed=args.seed,
        )
        results = run_tasks(lm, settings)
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


def _add_harness_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "harness",
        help="evaluate a run with EleutherAI's lm-evaluation-harness (pip install 'transformer-xl[harness]'); "
        "prints one JSON line. Text as txl generate reads a prompt: words a word vocabulary does not know are "
        "read as <unk> (a warning counts them), characters a char vocabulary never saw are refused",
    )
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
    p.set_defaults(func=_cmd_harness)


def _add_span_flags(p: argparse.ArgumentParser, *, export: bool = False) -> None:
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


def _add_interop_commands(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "convert", help="a pretrained checkpoint (the authors' or Hugging Face's) as a txl run"
    )
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
    p.set_defaults(writes=(("dst", "DST", "folder"),))
    p.set_defaults(func=_cmd_convert)

    p = sub.add_parser("export", help="a run's model as ONNX, with the memory as inputs and outputs")
    p.add_argument("run_dir")
    p.add_argument("--format", choices=("onnx",), default="onnx", help="onnx (the only format)")
    p.add_argument("--out", required=True, help="the .onnx file to write")
    p.set_defaults(writes=(("out", "--out", "file"),))
    p.add_argument(
        "--tgt-len", type=_positive_int, help="segment length traced (default: the run's eval tgt_len)"
    )
    _add_span_flags(p, export=True)
    p.add_argument("--opset", type=_positive_int, default=18, help="ONNX opset (default: 18)")
    p.add_argument("--checkpoint", default="best", help="best (default), latest, a step or a folder")
    p.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime check of the exported file")
    p.set_defaults(func=_cmd_export)


# ---------------------------------------------------------------------------------------------------------
# txl compare, txl analyze: thin wrappers of txl.analysis
# ---------------------------------------------------------------------------------------------------------


def _report(args: argparse.Namespace, result) -> int:
    """Print an analysis's table, write results.json and its figures into --out."""
    from .analysis.report import write_report

    print(result.table(), flush=True)
    files = write_report(Path(args.out), result, plots=not args.no_plots)
    print("wrote " + ", ".join(str(f) for f in files))
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from .analysis.compare import compare

    config = apply_overrides(load_config(args.config), args.set)
    result = compare(
        config,
        Path(args.out),
        config_name=args.config,
        overrides=args.set,
        stride=args.stride,
        prompts=args.prompt,
        sample_tokens=args.sample_tokens,
        seed=args.seed,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    return _report(args, result)


def _cmd_analyze_memory(args: argparse.Namespace) -> int:
    from .analysis.common import parse_ints
    from .analysis.memory import analyze_memory

    lengths = parse_ints(args.lengths, name="--lengths") if args.lengths else None
    result = analyze_memory(
        Path(args.run_dir),
        lengths=lengths,
        clamp_len=args.clamp_len,
        same_length=args.same_length,
        split=args.split,
        max_tokens=args.max_tokens,
        tgt_len=args.tgt_len,
        batch_size=args.batch_size,
        checkpoint=args.checkpoint,
        device=args.device,
        progress=not args.quiet,
    )
    return _report(args, result)


def _cmd_analyze_documents(args: argparse.Namespace) -> int:
    from .analysis.documents import analyze_documents

    splits = [s.strip() for s in args.splits.split(",") if s.strip()]
    if not splits or any(s not in ("train", "valid", "test") for s in splits):
        raise ConfigError(
            f"--splits: expected a comma-separated list of train, valid, test, got {args.splits!r}"
        )
    result = analyze_documents(
        [Path(r) for r in args.run_dir],
        splits=splits,
        max_tokens=args.max_tokens,
        tgt_len=args.tgt_len,
        batch_size=args.batch_size,
        mem_len=args.mem_len,
        checkpoint=args.checkpoint,
        device=args.device,
        progress=not args.quiet,
    )
    return _report(args, result)


def _cmd_analyze_speed(args: argparse.Namespace) -> int:
    from .analysis.common import parse_ints
    from .analysis.speed import speed_benchmark
    from .config import TransformerXLConfig

    sizes = TransformerXLConfig(
        vocab_size=args.vocab_size,
        n_layer=args.n_layer,
        n_head=args.n_head,
        d_head=args.d_head,
        d_model=args.d_model,
        d_inner=args.d_inner,
    )
    result = speed_benchmark(
        lengths=parse_ints(args.lengths, name="--lengths", minimum=1),
        model=sizes,
        segment=args.segment,
        tokens=args.tokens,
        xl_tokens=args.xl_tokens,
        windows_per_batch=args.windows_per_batch,
        repeats=args.repeats,
        device=args.device,
        progress=not args.quiet,
    )
    return _report(args, result)


def _cmd_analyze_recl(args: argparse.Namespace) -> int:
    from .analysis.common import parse_floats, parse_ints
    from .analysis.recl import analyze_recl

    lengths = parse_ints(args.lengths, name="--lengths", minimum=1) if args.lengths else None
    r = parse_floats(args.r, name="--r")
    if any(not 0 < v <= 1 for v in r):
        raise ConfigError(f"--r: fractions of the targets in (0, 1], got {args.r!r}")
    result = analyze_recl(
        [Path(d) for d in args.run_dirs],
        lengths=lengths,
        delta=args.delta,
        r=r,
        split=args.split,
        max_tokens=args.max_tokens,
        batch_size=args.batch_size,
        checkpoint=args.checkpoint,
        device=args.device,
        progress=not args.quiet,
    )
    return _report(args, result)


def _cmd_analyze_recall(args: argparse.Namespace) -> int:
    from .analysis.recall import recall_task

    result = recall_task(
        Path(args.out),
        segment=args.segment,
        distance=args.distance,
        steps=args.steps,
        seed=args.seed,
        overwrite=args.overwrite,
        progress=not args.quiet,
    )
    return _report(args, result)


def _cmd_analyze_attention(args: argparse.Namespace) -> int:
    from .analysis.attention import analyze_attention

    result = analyze_attention(
        Path(args.run_dir),
        split=args.split,
        max_tokens=args.max_tokens,
        mem_len=args.mem_len,
        tgt_len=args.tgt_len,
        batch_size=args.batch_size,
        checkpoint=args.checkpoint,
        device=args.device,
        progress=not args.quiet,
    )
    return _report(args, result)


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


def _add_output_options(p: argparse.ArgumentParser, *, default_out: str | None) -> None:
    p.add_argument(
        "--out",
        required=default_out is None,
        default=default_out,
        help="folder for results.json and the figures"
        + (f" (default: {default_out})" if default_out else ""),
    )
    p.add_argument("--no-plots", action="store_true", help="write results.json only (no matplotlib needed)")
    p.set_defaults(writes=(("out", "--out", "folder"),))
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def _add_run_options(p: argparse.ArgumentParser, *, max_tokens: int | None) -> None:
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument(
        "--max-tokens",
        type=int,
        default=max_tokens,
        help=f"use the first N targets of the split (default: {max_tokens or 'all'})",
    )
    p.add_argument("--checkpoint", default="best", help="best, latest, or a checkpoint folder")
    p.add_argument("--device", default="cpu")


def _add_analysis_commands(sub: argparse._SubParsersAction) -> None:
    """``txl compare`` and ``txl analyze ...``."""
    raw = _RawHelpFormatter
    p = sub.add_parser(
        "compare",
        help="train Transformer-XL and the vanilla baseline, compare them side by side",
        description=_COMPARE_HELP,
        formatter_class=raw,
    )
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
    _add_output_options(p, default_out=None)
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser(
        "analyze", help="check the paper's claims: memory, speed, recl, recall, attention, documents"
    )
    analyses = p.add_subparsers(dest="analysis", required=True)

    a = analyses.add_parser(
        "memory",
        help="loss of a trained Transformer-XL against its evaluation memory",
        description=_MEMORY_HELP,
        formatter_class=raw,
    )
    a.add_argument("run_dir")
    a.add_argument("--lengths", help="comma-separated memory lengths (default: 0, M/4, M/2, M, 2M, 4M, 8M)")
    a.add_argument(
        "--clamp-len", type=int, help="clamp relative distances (default: the run's eval.clamp_len)"
    )
    a.add_argument(
        "--same-length",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="every query attends to the same number of keys (default: the run's eval setting, as txl "
        "eval; off at memory 0)",
    )
    a.add_argument("--tgt-len", type=int, help="segment length (default: the run's eval/train tgt_len)")
    a.add_argument("--batch-size", type=int, help="parallel streams (default: the run's eval.batch_size)")
    _add_run_options(a, max_tokens=None)
    _add_output_options(a, default_out=None)
    a.set_defaults(func=_cmd_analyze_memory)

    a = analyses.add_parser(
        "speed",
        help="per-token evaluation time, vanilla sliding window vs XL (Table 9)",
        description=_SPEED_HELP,
        formatter_class=raw,
    )
    a.add_argument(
        "--lengths", default="128,256,512,800", help="attention lengths (default: 128,256,512,800)"
    )
    a.add_argument("--segment", type=int, default=64, help="Transformer-XL segment length (default: 64)")
    a.add_argument(
        "--tokens", type=int, default=128, help="vanilla predictions timed per length (default: 128)"
    )
    a.add_argument(
        "--xl-tokens", type=int, default=2048, help="XL predictions timed per length (default: 2048)"
    )
    a.add_argument(
        "--windows-per-batch",
        type=_positive_int,
        help="vanilla windows per forward of the batched timing (default: 16384 / L)",
    )
    a.add_argument("--repeats", type=int, default=3, help="timed runs per measurement; the fastest counts")
    a.add_argument("--n-layer", type=int, default=2)
    a.add_argument("--n-head", type=int, default=4)
    a.add_argument("--d-head", type=int, default=32)
    a.add_argument("--d-model", type=int, default=128)
    a.add_argument("--d-inner", type=int, default=512)
    a.add_argument("--vocab-size", type=int, default=256)
    a.add_argument("--device", default="cpu")
    _add_output_options(a, default_out="runs/speed")
    a.set_defaults(func=_cmd_analyze_speed)

    a = analyses.add_parser(
        "recl",
        help="relative effective context length of a group of runs",
        description=_RECL_HELP,
        formatter_class=raw,
    )
    a.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    a.add_argument(
        "--lengths", help="contexts c (default: delta, 2 delta, ..., 8T; T the shortest training segment)"
    )
    a.add_argument("--delta", type=int, help="extension c -> c + delta (default: T/2)")
    a.add_argument(
        "--r", default="0.1,0.5,1.0", help="fractions of hardest targets, in (0, 1] (default: 0.1,0.5,1.0)"
    )
    a.add_argument("--batch-size", type=int, default=8, help="rows read in parallel by the Transformer-XL")
    _add_run_options(a, max_tokens=20_000)
    _add_output_options(a, default_out=None)
    a.set_defaults(func=_cmd_analyze_recl)

    a = analyses.add_parser(
        "recall",
        help="exact recall D positions back: XL near 100%%, vanilla at chance",
        description=_RECALL_HELP,
        formatter_class=raw,
    )
    a.add_argument("--segment", type=int, default=16, help="training segment of both models (default: 16)")
    a.add_argument(
        "--distance", type=int, help="D, positions between a symbol and its repeat (default: 2 x segment)"
    )
    a.add_argument("--steps", type=int, default=400, help="training steps of each model (default: 400)")
    a.add_argument("--seed", type=int, default=0)
    a.add_argument("--overwrite", action="store_true", help="train both runs again from scratch")
    _add_output_options(a, default_out="runs/recall")
    a.set_defaults(func=_cmd_analyze_recall)

    a = analyses.add_parser(
        "attention",
        help="attention by distance and memory share, per layer",
        description=_ATTENTION_HELP,
        formatter_class=raw,
    )
    a.add_argument("run_dir")
    a.add_argument("--mem-len", type=int, help="memory length (default: the run's evaluation memory)")
    a.add_argument("--tgt-len", type=int, help="segment length (default: the run's eval/train tgt_len)")
    a.add_argument("--batch-size", type=int, default=4, help="rows of the sample read in parallel")
    _add_run_options(a, max_tokens=8192)
    _add_output_options(a, default_out=None)
    a.set_defaults(func=_cmd_analyze_attention)

    a = analyses.add_parser(
        "documents",
        help="loss reading across documents or starting each anew, and by position in a document",
        description=_DOCUMENTS_HELP,
        formatter_class=raw,
    )
    a.add_argument("run_dir", nargs="+", help="one run, or several (e.g. one trained each way: the 2 x 2)")
    a.add_argument(
        "--splits", default="valid,test", help="comma-separated splits to evaluate (default: valid,test)"
    )
    a.add_argument("--mem-len", type=int, help="memory length (default: the run's evaluation memory)")
    a.add_argument("--tgt-len", type=int, help="segment length (default: the run's eval/train tgt_len)")
    a.add_argument("--batch-size", type=int, help="parallel streams (default: the run's eval.batch_size)")
    a.add_argument("--max-tokens", type=int, help="use the first N targets of each split (default: all)")
    a.add_argument("--checkpoint", default="best", help="best, latest, or a checkpoint folder")
    a.add_argument("--device", default="cpu")
    _add_output_options(a, default_out=None)
    a.set_defaults(func=_cmd_analyze_documents)


def build_parser() -> argparse.ArgumentParser:
    """The parser of every ``txl`` command, its flags and their help."""
    from .demo import DEFAULT_STEPS

    parser = _Parser(prog="txl", description="Transformer-XL language modelling.")
    parser.add_argument("--version", action="version", version=f"txl {__version__}")
    parser.add_argument(
        "--debug",
        action="store_true",
        help="with an operating-system error or out of memory, print the Python traceback too, for a bug "
        "report (default: off; TXL_DEBUG=1 does the same)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    checkpoint_help = (
        "which checkpoint: best (default; latest when the run has no best), latest, "
        "a checkpoint name such as step-00001750, or a checkpoint folder"
    )

    p = sub.add_parser("train", help="train a model (or --resume a run)")
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
    p.set_defaults(writes=(("out", "--out", "folder"), ("resume", "--resume", "folder")))
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
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser(
        "eval", help="evaluate a run over a whole split; prints the figures (--json: a record)"
    )
    p.add_argument("run_dir")
    p.add_argument("--split", default="valid", choices=["train", "valid", "test"])
    p.add_argument(
        "--tgt-len", type=_positive_int, help="segment length (default: the run's eval/train tgt_len)"
    )
    _add_span_flags(p)
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
    p.add_argument("--checkpoint", default="best", help=checkpoint_help)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, or auto")
    p.add_argument("--quiet", action="store_true")
    p.add_argument(
        "--json", action="store_true", help="print the figures and settings as one JSON line instead"
    )
    p.set_defaults(func=_cmd_eval)

    p = sub.add_parser(
        "generate", help="sample text from a trained run, with a key/value cache of the memory"
    )
    p.add_argument("run_dir")
    p.add_argument(
        "--prompt",
        dest="prompts",
        action=_PromptFlag,
        metavar="TEXT",
        help="text to continue (repeatable: the prompts run as one batch; default: the run's "
        "generate.prompt, else a newline)",
    )
    p.add_argument(
        "--prompt-file",
        dest="prompts",
        action=_PromptFlag,
        metavar="FILE",
        help="continue the text of this UTF-8 file; a .jsonl file holds many prompts, one JSON string (or "
        '{"prompt": ...}) per line (repeatable, with --prompt, in the order given)',
    )
    p.add_argument(
        "--max-new-tokens",
        type=_non_negative_int,
        help="tokens to sample, at most 100000 (default: the run's generate.max_new_tokens); 0 prints the prompt",
    )
    p.add_argument("--temperature", type=_temperature, help="divide the scores by this; 0 is greedy")
    p.add_argument("--top-k", type=_positive_int, help="sample among the k most likely tokens")
    p.add_argument(
        "--top-p", type=_top_p, help="sample among the most likely tokens whose probability reaches p"
    )
    p.add_argument("--greedy", action="store_true", help="always the most likely token (temperature 0)")
    p.add_argument(
        "--stop",
        action="append",
        default=[],
        metavar="TEXT",
        help="end a sample when its new text contains TEXT, cut before it (repeatable)",
    )
    p.add_argument(
        "--num-samples",
        type=_positive_int,
        default=1,
        metavar="N",
        help="samples of each prompt, drawn in one batch, sample i with seed + i (default: 1)",
    )
    p.add_argument(
        "--stream",
        action="store_true",
        help="print the text as it is produced (the first sample; the others when all are done)",
    )
    p.add_argument(
        "--mem-len", type=_non_negative_int, help="memory length while generating (default: the model's)"
    )
    p.add_argument(
        "--seed", type=_non_negative_int, default=0, help="sampling seed of the first sample (default: 0)"
    )
    p.add_argument("--checkpoint", default="best", help=checkpoint_help)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, or auto")
    p.set_defaults(func=_cmd_generate)

    p = sub.add_parser("serve", help="serve a run over HTTP: OpenAI-shaped completions, scores, a web page")
    p.add_argument("run_dir")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0: every interface)",
    )
    p.add_argument("--port", type=_port, default=8000, help="port (default: 8000; 0: any free port)")
    p.add_argument(
        "--max-tokens-limit",
        type=_positive_int,
        default=1024,
        help="the largest max_tokens a request may ask for (default: 1024)",
    )
    p.add_argument(
        "--max-prompt-chars",
        type=_positive_int,
        default=20_000,
        help="the longest prompt or scored text, in characters (default: 20000)",
    )
    p.add_argument(
        "--queue-size",
        type=_non_negative_int,
        default=8,
        help="requests that may wait while --max-batch run; more get 429 (default: 8)",
    )
    p.add_argument(
        "--max-batch",
        type=_positive_int,
        default=16,
        help="requests (rows) decoded together, each as a row of one cache (default: 16)",
    )
    p.add_argument(
        "--max-sessions",
        type=_positive_int,
        default=1000,
        help="sessions (memories kept across requests) that may exist at once; more get 429 (default: 1000)",
    )
    p.add_argument(
        "--session-ttl",
        type=_positive_float,
        default=600.0,
        help="seconds an idle session is kept (default: 600.0)",
    )
    p.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="every request (but the page and /v1/health) must send 'Authorization: Bearer KEY' "
        "(default: $TXL_API_KEY; none: no key)",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
        help="uvicorn's log level (default: info, one line per request)",
    )
    p.add_argument("--checkpoint", default="best", help=checkpoint_help)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, or auto")
    p.set_defaults(func=_cmd_serve)

    p = sub.add_parser(
        "demo", help="train Transformer-XL and the vanilla baseline on Python's stdlib, compare"
    )
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
    p.set_defaults(writes=(("out", "--out", "folder"),))
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
    d = data_sub.add_parser(
        "list", help="known corpora: which are present on this machine, where, and how to get the others"
    )
    d.add_argument("--json", action="store_true", help="print one JSON document instead of the table")
    p.set_defaults(func=_cmd_data)

    _add_analysis_commands(sub)
    _add_interop_commands(sub)
    _add_harness_command(sub)
    return parser


def _one_line_warnings(show: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` that prints txl's own warnings as one ``txl: warning:`` line on stderr and
    passes the others to ``show``."""

    def show_warning(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, TxlWarning):
            print(f"txl: warning: {message}", file=sys.stderr)
        else:
            show(message, category, filename, lineno, file, line)

    return show_warning


def _rank() -> int | None:
    """This process's rank when torchrun started it in a group of several, else None."""
    from .distributed import under_torchrun

    return int(os.environ.get("RANK", "0")) if under_torchrun() else None


_LOWER = {
    "train": "train.batch_size, train.tgt_len or model.mem_len (--set), or raise train.accum_steps",
    "eval": "--batch-size, --tgt-len or --mem-len",
    "generate": "--mem-len or --max-new-tokens",
    "serve": "the requests' max_tokens (--max-tokens-limit)",
    "export": "--tgt-len or --mem-len",
    "analyze": "--batch-size, --tgt-len, --mem-len or --lengths",
    "compare": "train.batch_size or train.tgt_len (--set)",
    "demo": "the memory in use by other programs (the demo's sizes are fixed)",
    "convert": "the memory in use by other programs (the whole checkpoint is read at once)",
    "data": "the memory in use by other programs",
}
"""What to lower, per command, when an allocation fails deep inside."""


def _check_outputs(args: argparse.Namespace) -> None:
    """Check every output path the command writes (declared as ``writes``: attribute, flag, kind) before any
    work starts: one ``txl: error:`` line naming the flag and the path, and nothing made."""
    kind: OutputKind
    for name, flag, kind in getattr(args, "writes", ()):
        value = getattr(args, name, None)
        if value is not None:
            check_output(value, flag=flag, kind=kind)


def _out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed: MemoryError, or PyTorch's CPU or CUDA allocator."""
    if isinstance(exc, MemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def _os_error_line(exc: OSError) -> str:
    """``[Errno 28] No space left on device: 'runs/x/metrics.jsonl'`` -> ``runs/x/metrics.jsonl: no space
    left on device``."""
    if exc.filename is None:
        return str(exc)
    names = str(exc.filename) + ("" if exc.filename2 is None else f" -> {exc.filename2}")
    return f"{names}: {(exc.strerror or str(exc)).lower()}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``txl ARGV`` (default: the process's arguments) and return its exit status; errors are one line."""
    argv = list(sys.argv[1:] if argv is None else argv)
    at_launch(argv)  # the command's thread policy, before torch is imported (this module must not import it)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except _UsageError as exc:
        print(f"txl: error: {exc}", file=sys.stderr)
        return 2
    args.argv = argv
    debug = args.debug or os.environ.get("TXL_DEBUG", "") not in ("", "0")
    rank = _rank()
    where = "" if rank is None else f"[rank {rank}] "  # under torchrun: which process says it
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("default", TxlWarning)  # each message once per place, even when seen before
            if rank:  # the same warnings come from every process: rank 0 says them
                warnings.simplefilter("ignore", TxlWarning)
            warnings.showwarning = _one_line_warnings(warnings.showwarning)
            _check_outputs(args)
            return args.func(args)
    except TxlError as exc:
        from .train.trainer import Interrupted

        if isinstance(exc, Interrupted):  # the checkpoint is saved: the run can go on, this is no error
            if not rank:
                _note(str(exc))
            return _stopped_status(128 + exc.signum)
        print(f"txl: error: {where}{exc}", file=sys.stderr)
        return 2
    except FileNotFoundError as exc:
        if debug:
            traceback.print_exc()
        print(f"txl: error: {where}{exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # a full disk, a file system gone read-only, ... after the start
        if debug:
            traceback.print_exc()
        print(f"txl: error: {where}{_os_error_line(exc)}", file=sys.stderr)
        return 2
    except (MemoryError, RuntimeError) as exc:
        if not _out_of_memory(exc):
            raise
        if debug:
            traceback.print_exc()
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        lower = _LOWER.get(args.command, "the lengths and batch sizes")
        print(f"txl: error: {where}out of memory ({first}); lower {lower}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if not rank:
            print("txl: interrupted", file=sys.stderr)
        return _stopped_status(130)


def _stopped_status(status: int) -> int:
    """The exit status of a process stopped by a signal: 0 for a rank that ``txl train --nproc`` launched
    (its launcher reports the signal; a non-zero status would make torchrun print a failure report)."""
    from .distributed import LAUNCHED_BY_TXL

    return 0 if os.environ.get(LAUNCHED_BY_TXL) == "1" and _rank() is not None else status


if __name__ == "__main__":
    sys.exit(main())
