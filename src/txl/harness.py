"""A trained txl run as a model of EleutherAI's lm-evaluation-harness, registered as ``"txl"`` (needs the
``harness`` extra; without it, importing this module raises :class:`HarnessMissing`, naming the extra).
What the harness asks and how it scores is the harness's; reading rows is :mod:`txl.evaluation`'s."""

# Dimensions: B batch (requests read together), L a request's tokens, T segment length, V vocabulary.
#     lm = TxlLM(run="runs/shakespeare", mem_len=192)
#     lm_eval.simple_evaluate(model=lm, tasks=["txl_wikitext_local"], task_manager=task_manager())

from __future__ import annotations

import hashlib
import logging
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from .config import ConfigError, Span, eval_lengths, eval_span, first_set, positive_int
from .data.vocab import start_token
from .errors import TxlError
from .evaluation import EvalSettings, RaggedSettings, score_rows
from .harness_tasks import check_task_names
from .inference import DecodeSettings, Engine, SamplingParams
from .inference.text import TextStream, UnknownTokensWarning, describe_unknown
from .model import eval_mode
from .runs import load_run, load_run_config


class HarnessMissing(TxlError, ImportError):
    """lm-evaluation-harness is not installed."""


try:
    from lm_eval.api.model import TemplateLM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise HarnessMissing(
        f"txl harness needs lm-evaluation-harness: pip install 'transformer-xl[harness]' ({_exc})"
    ) from None

__all__ = [
    "TxlLM",
    "ModelArgs",
    "MODEL_ARGS",
    "HarnessMissing",
    "HarnessSettings",
    "run_tasks",
    "TASKS_DIR",
    "task_manager",
    "DEFAULT_MAX_GEN_TOKS",
    "request_seed",
]

TASKS_DIR = Path(__file__).resolve().parent / "harness_tasks"
"""The folder of txl's own harness tasks (``txl_wikitext_local``): pass it as lm-eval's ``include_path``."""

DEFAULT_MAX_GEN_TOKS = 256
"""New tokens per ``generate_until`` request when the task gives no ``max_gen_toks`` (the harness's default)."""


def task_manager(
    include_path: str | Path | Sequence[str | Path] = (),
    *,
    metadata: dict[str, Any] | None = None,
    include_defaults: bool = True,
) -> Any:
    """lm-eval's TaskManager with txl's tasks (:data:`TASKS_DIR`) and the task folders ``include_path`` (one
    folder, or a list of them) added; ``metadata`` goes to every task it loads (over the task's own).
    ``include_defaults=False`` leaves out lm-eval's own tasks (their index takes a while to build)."""
    from lm_eval.tasks import TaskManager

    folders = [include_path] if isinstance(include_path, (str, Path)) else list(include_path)
    return TaskManager(
        include_path=[str(TASKS_DIR), *(str(p) for p in folders)],
        include_defaults=include_defaults,
        metadata=metadata,
    )


def _int_arg(name: str, value: Any, low: int) -> int | None:
    """A model argument given as an int or as text (``--model_args mem_len=0``), at least ``low``."""
    if value is None:
        return None
    text = str(value).strip()
    if isinstance(value, bool) or not text.lstrip("-").isdigit() or int(text) < low:
        raise ConfigError(f"model_args {name}: must be an integer >= {low}, got {value!r}")
    return int(text)


def _bool_arg(name: str, value: Any) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise ConfigError(f"model_args {name}: must be true or false, got {value!r}")


MODEL_ARGS = ("checkpoint", "device", "batch_size", "mem_len", "tgt_len", "clamp_len", "same_length", "seed")
"""The keywords of lm-eval's ``model_args`` that :class:`TxlLM` takes (:meth:`ModelArgs.parse`)."""


@dataclass(frozen=True)
class ModelArgs:
    """How :class:`TxlLM` reads a run (lm-eval's ``model_args``, parsed by :meth:`parse`)."""

    checkpoint: str = "best"
    """As :func:`txl.runs.find_checkpoint` names them."""
    device: str = "cpu"
    """Where the model runs."""
    reading: EvalSettings = EvalSettings()
    """``batch_size``: the requests read together; ``tgt_len`` and ``span``: the lengths to read with (each
    None: the run's, as ``txl eval`` reads it, :func:`~txl.config.eval_lengths`); a span of memory 0 reads
    without memory, the harness's way for a fixed-context model."""
    seed: int = 1234
    """The seed of sampled generations (each request's is derived from it and the request's text)."""

    def __post_init__(self) -> None:
        if not isinstance(self.reading, EvalSettings):
            raise ConfigError(f"reading: must be an EvalSettings, got {type(self.reading).__name__}")
        _int_arg("seed", self.seed, 0)

    @classmethod
    def parse(cls, model_args: dict[str, Any], run: str | Path) -> ModelArgs:
        """The keywords of :data:`MODEL_ARGS`, values as given or as text (``--model_args mem_len=0``), for
        the run folder ``run``: the lengths given one by one replace the run's own (:func:`txl.config.eval_span`
        reads its config). ``max_batch_size`` (which ``simple_evaluate`` passes) is dropped: batches here have
        the given size."""
        args = {k: v for k, v in model_args.items() if k != "max_batch_size" and v is not None}
        unknown = sorted(set(args) - set(MODEL_ARGS))
        if unknown:
            raise ConfigError(f"model_args {unknown[0]}: unknown (known: {', '.join(sorted(MODEL_ARGS))})")
        if str(args.get("batch_size")).startswith("auto"):
            raise ConfigError("model_args batch_size: 'auto' is not supported; give a number of requests")
        ints = {"batch_size": 1, "mem_len": 0, "tgt_len": 1, "clamp_len": 1, "seed": 0}
        parsed: dict[str, Any] = {k: _int_arg(k, v, ints[k]) if k in ints else v for k, v in args.items()}
        if "same_length" in parsed:
            parsed["same_length"] = _bool_arg("same_length", parsed["same_length"])
        lengths = {k: parsed.pop(k) for k in ("mem_len", "clamp_len", "same_length") if k in parsed}
        span = eval_span(load_run_config(Path(run)), **lengths) if lengths else None
        reading = EvalSettings(
            tgt_len=parsed.pop("tgt_len", None), batch_size=parsed.pop("batch_size", None), span=span
        )
        typed: dict[str, Any] = {k: str(v) if k in ("checkpoint", "device") else v for k, v in parsed.items()}
        return cls(**typed, reading=reading)


# ---------------------------------------------------------------------------------------------------------
# The harness's model
# ---------------------------------------------------------------------------------------------------------


@register_model("txl")
class TxlLM(TemplateLM):
    """A trained txl run, for lm-evaluation-harness (a ``TemplateLM``: lm-eval splits each request's text into
    context and continuation ids with :meth:`tok_encode`; an empty context is :attr:`prefix_token_id`).

    ``run``: the run folder; ``checkpoint``: as :func:`txl.runs.find_checkpoint` names them; ``device``.
    ``batch_size``: requests read together (default: the run's ``eval.batch_size``). ``mem_len``,
    ``tgt_len``, ``clamp_len``, ``same_length``: the lengths to read with (:class:`ModelArgs`), by default the
    run's evaluation settings (as ``txl eval``); ``mem_len=0`` reads without memory, the harness's way for a fixed-context
    model: windows of ``tgt_len`` tokens, each alone. Arguments given as text (``--model_args``) are parsed.

    - ``loglikelihood``: context and continuation are read as one row, segment by segment of ``tgt_len`` with
      the memory (:func:`txl.evaluation.ragged_losses`, rows of different lengths read together), so the
      continuation is scored after the whole context has been read through the memory; ``is_greedy`` is true
      when every continuation token was the model's most likely one. Without memory, the last ``tgt_len``
      tokens are read as one window (the context cut on the left, as the harness does).
    - ``loglikelihood_rolling``: the document after :func:`start_token`, every token predicted once; with
      memory, segment by segment, each with the memory of the previous ones; without, the harness's rolling
      windows (``lm_eval.utils.get_rolling_token_windows``), each read alone.
    - ``generate_until``: txl's decoding engine (:class:`txl.inference.Engine`: a key/value cache with memory,
      recomputed windows without), the requests as rows that join and leave; greedy unless the task asks
      ``do_sample`` with a temperature (each request then draws from a generator seeded from ``seed`` and its
      own text), up to ``max_gen_toks`` tokens, cut before the first ``until`` string.

    Text the vocabulary does not know is treated as ``txl generate`` and ``txl serve`` treat a prompt: a word
    vocabulary reads unknown words as ``<unk>``, as its training data does, and says how many with an
    :class:`UnknownTokensWarning` after each kind of request; other vocabularies (a char vocabulary never saw
    an unknown character) refuse the text with a :class:`~txl.errors.TxlError` naming the characters, before
    anything is scored.
    """

    backend = "causal"

    def __init__(self, run: str | Path, settings: ModelArgs | None = None, **model_args: Any) -> None:
        """``settings``, or the same fields as keywords (``model_args``, as lm-eval passes them: text values
        parsed, see :meth:`ModelArgs.parse`)."""
        super().__init__()
        if settings is not None and model_args:
            raise ConfigError("model_args: give a ModelArgs or keywords, not both")
        asked = ModelArgs.parse(model_args, run) if settings is None else settings
        loaded = load_run(Path(run), checkpoint=asked.checkpoint, device=asked.device)
        config, reading = loaded.config, asked.reading
        self.run = loaded
        self.model = loaded.model.eval()
        self.vocab = loaded.vocab
        lengths = eval_lengths(config, tgt_len=reading.tgt_len)
        self.span: Span = first_set(reading.span, lengths.span)
        self.tgt_len = lengths.tgt_len
        self.batch_size: int = first_set(reading.batch_size, config.eval.batch_size)
        self.seed = asked.seed
        self.start = start_token(self.vocab)
        self.unknown: dict[str, None] = {}
        """The distinct words read as ``<unk>`` since the last warning (word vocabularies)."""

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    @property
    def eot_token_id(self) -> int:
        """The end-of-text token: :func:`start_token` (``<eos>``, else the newline)."""
        return self.start

    @property
    def prefix_token_id(self) -> int:
        """What an empty context is read as: :func:`start_token`."""
        return self.start

    # -- text to tokens ---------------------------------------------------------------------------------

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs: Any) -> list[int]:
        """The ids of ``string`` (txl's vocabularies add no special tokens). A word vocabulary that ends every
        line with ``<eos>`` ends the last line with it only when the text ends with a newline, so that a
        context and its continuation encode as their join. Unknown tokens: see the class."""
        del add_special_tokens, kwargs
        vocab = self.vocab
        if getattr(vocab, "unknown_as_unk", False):
            self.unknown.update(dict.fromkeys(vocab.unknown_tokens(string)))
            ids = [int(i) for i in vocab.encode(string)]
        else:
            try:
                ids = [int(i) for i in vocab.encode(string, strict=True)]
            except ValueError as exc:
                raise TxlError(
                    f"the task's text has {exc}; the run has never seen them and cannot score them "
                    "(txl generate and txl serve refuse them too): choose tasks whose text the run's "
                    "vocabulary covers"
                ) from None
        eos = getattr(vocab, "eos_id", None)
        if ids and eos is not None and getattr(vocab, "eos_per_line", False):
            if ids[-1] == eos and not string.endswith("\n"):
                ids.pop()
        return ids

    def _warn_unknown(self) -> None:
        """One :class:`UnknownTokensWarning` with the words read as ``<unk>`` since the last one."""
        if self.unknown:
            missing = list(self.unknown)
            self.unknown = {}
            warnings.warn(
                UnknownTokensWarning(
                    f"{len(missing)} distinct word(s) of the task's text are not in the vocabulary and were "
                    f"read as <unk>, as the training data reads them: {describe_unknown(missing)}"
                ),
                stacklevel=3,
            )

    # -- the three requests -----------------------------------------------------------------------------

    def _settings(self, *, greedy: bool = False) -> RaggedSettings:
        return RaggedSettings(tgt_len=self.tgt_len, span=self.span, batch_size=self.batch_size, greedy=greedy)

    def _loglikelihood_tokens(
        self, requests: list[tuple[Any, list[int], list[int]]], disable_tqdm: bool = False, **kwargs: Any
    ) -> list[tuple[float, bool]]:
        """(log-likelihood, is_greedy) of each continuation after its context, ids as ``loglikelihood`` made
        them: ``requests`` of ((context, continuation) text or None, context ids, continuation ids)."""
        self._warn_unknown()
        rows = []
        for _, context, continuation in requests:
            row = [*context, *continuation]
            if not self.span.mem_len and len(row) > self.tgt_len + 1:
                if len(continuation) > self.tgt_len:
                    raise TxlError(
                        f"a continuation of {len(continuation)} tokens does not fit one window of tgt_len "
                        f"{self.tgt_len} (mem_len 0): give a longer tgt_len or a memory"
                    )
                row = row[-(self.tgt_len + 1) :]  # the window: the context cut on the left
            rows.append(row)
        scores = score_rows(self.model, rows, self._settings(greedy=True))
        results: list[tuple[float, bool]] = []
        for (key, _, continuation), score in zip(requests, scores, strict=True):
            n = len(continuation)
            value = (0.0, True)
            if n:
                assert score.greedy is not None
                value = (-float(score.loss[-n:].sum()), bool(score.greedy[-n:].all()))
            results.append(value)
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, value)
        return results

    def _rolling_rows(self, ids: list[int]) -> list[tuple[list[int], int]]:
        """The rows that score ``ids`` once each after the start token, with how many of their last targets
        count: one row read with memory, or the harness's windows of ``tgt_len`` without."""
        if self.span.mem_len > 0:
            return [([self.start, *ids], len(ids))]
        windows = get_rolling_token_windows(
            token_list=ids, prefix_token=self.start, max_seq_len=self.tgt_len, context_len=1
        )
        return [([*inputs, predicted[-1]], len(predicted)) for inputs, predicted in windows]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each request's whole text, every token predicted once (see the class)."""
        rows: list[list[int]] = []
        owner: list[tuple[int, int]] = []  # (request, targets counted) of each row
        for index, request in enumerate(requests):
            for row, counted in self._rolling_rows(self.tok_encode(request.args[0])):
                rows.append(row)
                owner.append((index, counted))
        self._warn_unknown()
        totals = [0.0] * len(requests)
        for (index, counted), score in zip(
            owner, score_rows(self.model, rows, self._settings()), strict=True
        ):
            totals[index] -= float(score.loss[len(score.loss) - counted :].sum())
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Each request's text continued until one of its ``until`` strings or ``max_gen_toks`` tokens (see the
        class): the requests of one :class:`~txl.inference.Engine` of ``batch_size`` rows (a request that
        finishes makes room for the next); each decodes as its prompt alone, and a sampled one draws from its
        own generator, seeded from ``seed`` and its own text (:func:`request_seed`), so that its text never
        depends on the other requests or their order."""
        texts = [request.args[0] for request in requests]
        prompts = [self.tok_encode(text) or [self.start] for text in texts]
        params = [
            _gen_params(request.args[1], seed=request_seed(self.seed, text))
            for request, text in zip(requests, texts, strict=True)
        ]
        self._warn_unknown()
        results = self._generate(prompts, params)
        for request, text in zip(requests, results, strict=True):
            self.cache_hook.add_partial("generate_until", request.args, text)
        return results

    def _generate(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[str]:
        """The requests through one engine, longest prompts first; a request ends at its first stop string
        (its :class:`~txl.inference.text.TextStream`) or its last token."""
        rows = max(1, min(self.batch_size, len(prompts)))
        engine = Engine(self.model, DecodeSettings(span=self.span, context=self.tgt_len, rows=rows))
        streams: dict[int, tuple[int, TextStream]] = {}
        for index in sorted(range(len(prompts)), key=lambda i: -len(prompts[i])):
            ids = torch.tensor(prompts[index], dtype=torch.long)
            text = TextStream(self.vocab, prompts[index], stop=params[index].stop)
            streams[engine.add(ids, params[index])] = (index, text)
        results = [""] * len(prompts)
        with eval_mode(self.model):
            while engine.unfinished:
                for event in engine.step():
                    index, text = streams[event.request]
                    text.push(event.token, final=event.finish is not None)
                    if text.stopped and event.finish is None:
                        engine.finish(event.request)
                    if text.stopped or event.finish is not None:
                        results[index] = text.text
        return results


def request_seed(seed: int, text: str) -> int:
    """The seed of a ``generate_until`` request: derived from lm-eval's ``seed`` and the request's own text
    alone (SHA-256), so that the same request samples the same text in any batch, at any place."""
    digest = hashlib.sha256(f"{seed}\n{text}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1  # 63 bits


def _gen_params(kwargs: dict[str, Any], *, seed: int) -> SamplingParams:
    """The :class:`SamplingParams` of a ``generate_until`` request's generation arguments: its ``until``
    strings, ``max_gen_toks`` tokens; sampled only when ``do_sample`` is true with a positive temperature,
    else greedy."""
    kwargs = dict(kwargs or {})
    until = kwargs.pop("until", None)
    if isinstance(until, str):
        until = [until]
    until = tuple(s for s in (until or ()) if s)
    max_gen_toks = int(kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
    temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
    if not kwargs.pop("do_sample", False):
        temperature = 0.0
    positive_int(max_gen_toks, "generate_until: max_gen_toks", error=TxlError, field=False)
    return SamplingParams(max_new_tokens=max_gen_toks, temperature=temperature, stop=until, seed=seed)


# ---------------------------------------------------------------------------------------------------------
# Running tasks (what ``txl harness`` does)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HarnessSettings:
    """What ``txl harness`` asks of ``lm_eval.simple_evaluate`` besides the model."""

    tasks: tuple[str, ...]
    """Task names (or groups) as lm-eval knows them, txl's own (:data:`TASKS_DIR`) included."""
    include_path: tuple[str, ...] = ()
    """More folders of task YAML files."""
    num_fewshot: int | None = None
    """Examples put before each request (None: each task's own)."""
    limit: int | None = None
    """Documents per task (None: all)."""
    metadata: dict[str, Any] | None = None
    """Passed to the tasks (``txl_wikitext_local`` reads ``corpus`` and ``split`` from it)."""
    seed: int = 1234
    """The harness's random, numpy, torch and few-shot seeds."""


def run_tasks(lm: TxlLM, settings: HarnessSettings) -> dict[str, Any]:
    """Evaluate ``lm`` on the tasks of ``settings`` with ``lm_eval.simple_evaluate``; returns its results
    (``results`` per task, ``configs``, ...; not lm-eval's git and environment record), or raises TxlError
    naming an unknown task (:func:`~txl.harness_tasks.check_task_names`). When every task is txl's own or in
    ``include_path`` (and none of lm-eval's has its name), lm-eval's own tasks are not indexed.
    lm-eval's notes about txl's own task files are not shown."""
    from lm_eval import simple_evaluate

    names = check_task_names(settings.tasks, settings.include_path)
    local = (
        all(t in names.local and t not in names.builtin for t in settings.tasks) and not names.local_groups
    )
    manager = task_manager(settings.include_path, metadata=settings.metadata, include_defaults=not local)
    with _quiet_lm_eval():
        return simple_evaluate(
            model=lm,
            tasks=list(settings.tasks),
            num_fewshot=settings.num_fewshot,
            limit=settings.limit,
            task_manager=manager,
            metadata=settings.metadata,
            log_samples=False,
            bootstrap_iters=0,
            random_seed=settings.seed,
            numpy_random_seed=settings.seed,
            torch_random_seed=settings.seed,
            fewshot_random_seed=settings.seed,
        )


_FOREIGN = ("Custom kwargs can be passed to `--metadata`",)
"""lm-eval's log lines that txl's own task files cause (they address lm-eval's users, not txl's)."""


class _Foreign(logging.Filter):
    """Drops the log records of :data:`_FOREIGN`."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not any(text in record.getMessage() for text in _FOREIGN)


@contextmanager
def _quiet_lm_eval() -> Iterator[None]:
    """``simple_evaluate`` without what is not the user's: its git hash and environment record (a ``git``
    subprocess that prints "not a git repository" outside one, torch's environment report, transformers'
    import warnings; :func:`run_tasks` returns neither) and lm-eval's notes about txl's task files."""
    from lm_eval import evaluator

    saved = evaluator.get_git_commit_hash, evaluator.add_env_info
    evaluator.get_git_commit_hash = lambda: None
    evaluator.add_env_info = lambda storage: None
    foreign = _Foreign()
    logger = logging.getLogger("lm_eval.api.task")  # where lm-eval logs them
    logger.addFilter(foreign)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning, module=r"transformers(\..*)?$")
            yield
    finally:
        evaluator.get_git_commit_hash, evaluator.add_env_info = saved
        logger.removeFilter(foreign)
