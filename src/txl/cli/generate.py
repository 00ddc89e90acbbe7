"""``txl generate``: samples from a trained run, its prompts read from flags and files; Ctrl-C prints what
exists."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from ..config import ConfigError
from ..errors import TxlError
from . import _non_negative_int, _positive_int, _temperature, _top_p
from .command import Command
from .common import library_warnings
from .options import CHECKPOINT_HELP, given, loaded_run

__all__ = ["GENERATE"]


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

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        kind = "file" if option_string == "--prompt-file" else "text"
        items = list(getattr(namespace, self.dest) or [])
        items.append((kind, values))
        setattr(namespace, self.dest, items)


def _cmd_generate(args: argparse.Namespace) -> int:
    from ..inference import SamplingParams
    from ..inference.text import generate_from_run, prompt_text, run_settings
    from ..serve.card import default_prompt

    prompts = _generate_prompts(args)
    if args.greedy and args.temperature not in (None, 0):
        raise ConfigError(f"--greedy decoding has temperature 0, not {args.temperature}")
    run = loaded_run(args)
    if not prompts:
        prompts = [default_prompt(run)]
    rows = len(prompts) * args.num_samples
    shown = 0 if args.stream else -1  # the row printed as it is produced (the others when all are done)
    made: dict[int, list[str]] = {}  # each row's prompt as read, then its pieces: printed if interrupted

    def header(row: int) -> None:
        prompt, sample = divmod(row, args.num_samples)
        parts = [f"prompt {prompt + 1}/{len(prompts)}"] if len(prompts) > 1 else []
        parts += [f"sample {sample + 1}/{args.num_samples}"] if args.num_samples > 1 else []
        if parts:
            print(f"=== {', '.join(parts)} ===")

    def show(row: int, piece: str) -> None:
        if not made:  # the first piece: every row begins with its prompt as the model reads it
            read = [prompt_text(run.vocab, prompt) for prompt in prompts]
            made.update({r: [read[r // args.num_samples]] for r in range(rows)})
            if shown >= 0:  # --stream
                header(shown)
                print(made[shown][0], end="", flush=True)
        made[row].append(piece)
        if row == shown:
            print(piece, end="", flush=True)

    try:
        with library_warnings(args), _signals_stop():
            sampling = given(args, "max_new_tokens", "temperature", "top_k", "top_p", "seed")
            if args.greedy:
                sampling["temperature"] = 0.0
            params = SamplingParams.from_config(run.config.generate, **sampling, stop=tuple(args.stop))
            result = generate_from_run(
                run,
                prompts,
                params,
                settings=run_settings(run, **given(args, "mem_len"), compiled=args.compiled),
                num_samples=args.num_samples,
                on_text=show,
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
    except TxlError:  # a size that cannot fit (SizeError, before the first token): as it is
        raise
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

    def handler(signum: int, _frame: Any) -> NoReturn:
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


def _arguments(p: argparse.ArgumentParser) -> None:
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
    p.add_argument(
        "--temperature", type=_temperature, help="divide the scores by this; 0 (or below 1e-5) is greedy"
    )
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
        help="samples of each prompt, drawn in one batch, sample i of every prompt with seed + i (default: 1)",
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
    p.add_argument(
        "--compiled",
        action="store_true",
        help="decode with the step compiled ahead of time (C++, once per set of sizes, kept in "
        "~/.cache/txl/compiled): faster per token, for long generations; CPU and float32 only",
    )
    p.add_argument("--checkpoint", default="best", help=CHECKPOINT_HELP)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda, cuda:N, or auto")


GENERATE = Command(
    name="generate",
    help="sample text from a trained run, with a key/value cache of the memory",
    arguments=_arguments,
    handler=_cmd_generate,
    workload="tokens",
    lower="--mem-len or --max-new-tokens",
)
"""``txl generate``."""
