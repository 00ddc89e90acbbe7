"""A trained txl run as a model of EleutherAI's lm-evaluation-harness (``lm-eval``), registered as ``"txl"``:
log-likelihoods read segment by segment with the memory, rolling log-likelihoods with every token predicted
once, and generation through txl's key/value cache. What the harness asks and how it scores is the harness's;
reading a run is :mod:`txl.runs`', the model's maths :mod:`txl.model`'s, decoding :mod:`txl.inference`'s.

Dimensions: B batch (requests read together), L a request's tokens, T segment length, V vocabulary.

    lm = TxlLM(run="runs/shakespeare", mem_len=192)
    lm_eval.simple_evaluate(model=lm, tasks=["txl_wikitext_local"], task_manager=task_manager())

Needs the ``harness`` extra (``pip install 'transformer-xl[harness]'``); without it, importing this module raises
:class:`HarnessMissing`, whose message names the extra.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from .config import ConfigError, Span, eval_span, first_set
from .errors import TxlError
from .inference import PAD_ID, GenerationSettings, stream
from .inference.text import TextStream
from .model import KVCache
from .runs import load_run


class HarnessMissing(TxlError, ImportError):
    """lm-evaluation-harness is not installed."""


try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
    from lm_eval.utils import get_rolling_token_windows
except ImportError as _exc:  # pragma: no cover - depends on the environment
    raise HarnessMissing(
        f"txl harness needs lm-evaluation-harness: pip install 'transformer-xl[harness]' ({_exc})"
    ) from None

__all__ = [
    "TxlLM",
    "HarnessMissing",
    "HarnessSettings",
    "run_tasks",
    "TASKS_DIR",
    "task_manager",
    "start_token",
    "DEFAULT_MAX_GEN_TOKS",
]

TASKS_DIR = Path(__file__).resolve().parent / "harness_tasks"
"""The folder of txl's own harness tasks (``txl_wikitext_local``): pass it as lm-eval's ``include_path``."""

DEFAULT_MAX_GEN_TOKS = 256
"""New tokens per ``generate_until`` request when the task gives no ``max_gen_toks`` (the harness's default)."""

PAD = 0
"""The input and target id of padding positions (any id of the vocabulary: their losses are never read)."""


def task_manager(include_path: Sequence[str | Path] = (), *, metadata: dict[str, Any] | None = None) -> Any:
    """lm-eval's TaskManager with txl's tasks (:data:`TASKS_DIR`) and the folders ``include_path`` added;
    ``metadata`` goes to every task it loads (over the task's own)."""
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=[str(TASKS_DIR), *(str(p) for p in include_path)], metadata=metadata)


def start_token(vocab: Any) -> int:
    """The token a document starts from, so that its first token is predicted too: the vocabulary's
    end-of-text token ``<eos>`` (``vocab.eos_id``: word vocabularies, which end every line with it), else the
    newline, the boundary that char, byte and BPE vocabularies (which have no ``<eos>``) see between texts."""
    if getattr(vocab, "eos_id", None) is not None:
        return int(vocab.eos_id)
    ids = vocab.encode("\n")
    if len(ids) != 1 or (getattr(vocab, "unk_id", None) is not None and int(ids[0]) == vocab.unk_id):
        raise TxlError(
            f"the {vocab.kind} vocabulary has no <eos> and no newline token to start a document from"
        )
    return int(ids[0])


# ---------------------------------------------------------------------------------------------------------
# Scoring token rows segment by segment (the one loop; to be swapped for txl.evaluate's segment_losses)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _RowScores:
    """The negative log-likelihood (L - 1,) float64 of tokens 1..L-1 of a row, and (with ``greedy``)
    whether each was the model's most likely next token."""

    losses: np.ndarray
    greedy: np.ndarray | None


@torch.inference_mode()
def _score_rows(
    model: nn.Module, rows: Sequence[Sequence[int]], *, tgt_len: int, span: Span, greedy: bool = False
) -> list[_RowScores]:
    """Score tokens 1..L-1 of every row (each row at least 2 tokens) given those before it, all rows together:
    segments of ``tgt_len`` inputs, each attending over the memory of the previous segments of its row
    (``span.mem_len``; 0 reads each segment alone). With memory, a :class:`~txl.model.KVCache` keeps the keys
    and values of the remembered positions, projected once, as :func:`txl.evaluate.evaluate` does (the same
    losses as passing the memory, up to float rounding). Rows are right-padded to the longest; a causal model
    never looks ahead, so padding changes no real position's score, and a row leaves the batch (with its
    memory) after its last segment."""
    order = sorted(range(len(rows)), key=lambda r: -len(rows[r]))  # longest first: finished rows at the end
    lengths = [len(rows[r]) - 1 for r in order]  # targets per row
    device = next(model.parameters()).device
    width = lengths[0]
    inputs = torch.full((len(rows), width), PAD, dtype=torch.long)  # (B, L - 1)
    targets = torch.full((len(rows), width), PAD, dtype=torch.long)  # (B, L - 1)
    for b, r in enumerate(order):
        ids = torch.as_tensor(rows[r], dtype=torch.long)
        inputs[b, : lengths[b]] = ids[:-1]
        targets[b, : lengths[b]] = ids[1:]
    inputs, targets = inputs.to(device), targets.to(device)
    losses = torch.zeros((len(rows), width), dtype=torch.float64)
    hits = torch.zeros((len(rows), width), dtype=torch.bool)
    cache = None
    cached = model.config.attention == "relative" and span.mem_len > 0
    dtype = next(model.parameters()).dtype
    for start in range(0, width, tgt_len):
        live = sum(n > start for n in lengths)  # rows that still have targets here (a prefix)
        if cached and (cache is None or cache.batch_size != live):
            kept = None if cache is None else cache.memory()
            kept = None if kept is None else kept.select(slice(0, live))
            cache = KVCache(model.config, batch_size=live, span=span, memory=kept, dtype=dtype, device=device)
        stop = min(start + tgt_len, width)
        seg_targets = targets[:live, start:stop]  # (B', T)
        where = {"cache": cache} if cached else {"span": span}
        if greedy:  # the log-probabilities (B', T, V), for the losses and the model's top choices
            log_probs = model(inputs[:live, start:stop], **where).log_probs
            loss = -log_probs.gather(-1, seg_targets[..., None])[..., 0]  # (B', T)
            hits[:live, start:stop] = (log_probs.argmax(dim=-1) == seg_targets).cpu()
        else:
            loss = model(inputs[:live, start:stop], targets=seg_targets, **where).loss  # (B', T)
        losses[:live, start:stop] = loss.double().cpu()
    result: list[_RowScores | None] = [None] * len(rows)
    for b, r in enumerate(order):
        result[r] = _RowScores(
            losses=losses[b, : lengths[b]].numpy(), greedy=hits[b, : lengths[b]].numpy() if greedy else None
        )
    return result  # type: ignore[return-value]


def _batches(items: Sequence[Any], *, size: int, length: Callable[[Any], int]) -> list[list[int]]:
    """Indices of ``items`` in batches of ``size``, longest first, so that a batch holds rows of similar
    lengths."""
    order = sorted(range(len(items)), key=lambda i: -length(items[i]))
    return [order[i : i + size] for i in range(0, len(order), size)]


def _int_arg(name: str, value: Any, *, low: int) -> int | None:
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


# ---------------------------------------------------------------------------------------------------------
# The harness's model
# ---------------------------------------------------------------------------------------------------------


@register_model("txl")
class TxlLM(LM):
    """A trained txl run, for lm-evaluation-harness.

    ``run``: the run folder; ``checkpoint``: as :func:`txl.runs.find_checkpoint` names them; ``device``.
    ``batch_size``: requests read together (default: the run's ``eval.batch_size``). ``mem_len``,
    ``tgt_len``, ``clamp_len``, ``same_length``: the lengths to read with, by default the run's evaluation
    settings (as ``txl eval``); ``mem_len=0`` reads without memory, the harness's way for a fixed-context
    model: windows of ``tgt_len`` tokens, each alone. Arguments given as text (``--model_args``) are parsed.

    - ``loglikelihood``: context and continuation are read as one row, segment by segment of ``tgt_len`` with
      the memory, so the continuation is scored after the whole context has been read through the memory;
      ``is_greedy`` is true when every continuation token was the model's most likely one. Without memory,
      the last ``tgt_len`` tokens are read as one window (the context cut on the left, as the harness does).
    - ``loglikelihood_rolling``: the document after :func:`start_token`, every token predicted once; with
      memory, segment by segment, each with the memory of the previous ones; without, the harness's rolling
      windows (``lm_eval.utils.get_rolling_token_windows``), each read alone.
    - ``generate_until``: txl's cached generation (:func:`txl.inference.stream`), greedy unless the task
      asks ``do_sample`` with a temperature, up to ``max_gen_toks`` tokens, cut before the first ``until``
      string.
    """

    def __init__(
        self,
        run: str | Path,
        checkpoint: str = "best",
        device: str = "cpu",
        batch_size: int | str | None = None,
        mem_len: int | str | None = None,
        tgt_len: int | str | None = None,
        clamp_len: int | str | None = None,
        same_length: bool | str | None = None,
        max_batch_size: int | None = None,
        seed: int | str = 1234,
    ) -> None:
        super().__init__()
        del max_batch_size  # passed by simple_evaluate; batches here have the given size
        if str(batch_size).startswith("auto"):
            raise ConfigError("model_args batch_size: 'auto' is not supported; give a number of requests")
        loaded = load_run(Path(run), checkpoint=str(checkpoint), device=str(device))
        config = loaded.config
        self.run = loaded
        self.model = loaded.model.eval()
        self.vocab = loaded.vocab
        self.span = eval_span(
            config,
            mem_len=_int_arg("mem_len", mem_len, low=0),
            clamp_len=_int_arg("clamp_len", clamp_len, low=1),
            same_length=_bool_arg("same_length", same_length),
        )
        self.tgt_len = first_set(
            _int_arg("tgt_len", tgt_len, low=1), config.eval.tgt_len, config.train.tgt_len
        )
        self.batch_size = first_set(_int_arg("batch_size", batch_size, low=1), config.eval.batch_size)
        self.seed = _int_arg("seed", seed, low=0)
        self.start = start_token(self.vocab)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    # -- text to tokens ---------------------------------------------------------------------------------

    def _encode(self, text: str) -> list[int]:
        """The ids of ``text``. A word vocabulary that ends every line with ``<eos>`` ends the last line with it
        only when the text ends with a newline, so that a context and its continuation encode as their join."""
        ids = [int(i) for i in self.vocab.encode(text)]
        eos = getattr(self.vocab, "eos_id", None)
        if ids and eos is not None and getattr(self.vocab, "eos_per_line", False):
            if ids[-1] == eos and not text.endswith("\n"):
                ids.pop()
        return ids

    def _pair(self, context: str, continuation: str) -> tuple[list[int], list[int]]:
        """Context and continuation ids, split as the harness does: spaces at the end of the context move to
        the continuation, the two are encoded joined and the continuation is what follows the context's ids.
        An empty context is the start token."""
        spaces = len(context) - len(context.rstrip())
        if spaces:
            context, continuation = context[:-spaces], context[-spaces:] + continuation
        whole = self._encode(context + continuation)
        head = self._encode(context)
        if not head:
            return [self.start], whole
        return whole[: len(head)], whole[len(head) :]

    # -- the three requests -----------------------------------------------------------------------------

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        pairs = [self._pair(*request.args) for request in requests]
        results: list[tuple[float, bool]] = [(0.0, True)] * len(pairs)
        rows, keep = [], []
        for context, continuation in pairs:
            row = context + continuation
            if not self.span.mem_len and len(row) > self.tgt_len + 1:
                if len(continuation) > self.tgt_len:
                    raise TxlError(
                        f"a continuation of {len(continuation)} tokens does not fit one window of tgt_len "
                        f"{self.tgt_len} (mem_len 0): give a longer tgt_len or a memory"
                    )
                row = row[-(self.tgt_len + 1) :]  # the window: the context cut on the left
            rows.append(row)
            keep.append(len(continuation))
        for batch in _batches(rows, size=self.batch_size, length=len):
            scores = _score_rows(
                self.model, [rows[i] for i in batch], tgt_len=self.tgt_len, span=self.span, greedy=True
            )
            for i, score in zip(batch, scores, strict=True):
                n = keep[i]
                if n == 0:
                    continue
                value = (-float(score.losses[-n:].sum()), bool(score.greedy[-n:].all()))
                results[i] = value
                self.cache_hook.add_partial("loglikelihood", requests[i].args, value)
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
        rows: list[list[int]] = []
        owner: list[tuple[int, int]] = []  # (request, targets counted) of each row
        for index, request in enumerate(requests):
            for row, counted in self._rolling_rows(self._encode(request.args[0])):
                rows.append(row)
                owner.append((index, counted))
        totals = [0.0] * len(requests)
        for batch in _batches(rows, size=self.batch_size, length=len):
            scores = _score_rows(self.model, [rows[i] for i in batch], tgt_len=self.tgt_len, span=self.span)
            for i, score in zip(batch, scores, strict=True):
                index, counted = owner[i]
                totals[index] -= float(score.losses[len(score.losses) - counted :].sum())
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        results = [""] * len(requests)
        settings = [_gen_settings(request.args[1]) for request in requests]
        prompts = [self._encode(request.args[0]) or [self.start] for request in requests]
        groups: dict[tuple[Any, ...], list[int]] = {}
        for index, setting in enumerate(settings):
            groups.setdefault(setting, []).append(index)
        generator = torch.Generator(device=self.device).manual_seed(self.seed)
        for (until, max_gen_toks, temperature), members in groups.items():
            for batch in _batches(members, size=self.batch_size, length=lambda i: len(prompts[i])):
                indices = [members[i] for i in batch]
                texts = self._generate(
                    [prompts[i] for i in indices], until, max_gen_toks, temperature, generator
                )
                for index, text in zip(indices, texts, strict=True):
                    results[index] = text
                    self.cache_hook.add_partial("generate_until", requests[index].args, text)
        return results

    def _generate(
        self,
        prompts: list[list[int]],
        until: tuple[str, ...],
        max_gen_toks: int,
        temperature: float,
        generator: torch.Generator,
    ) -> list[str]:
        """Continue the rows together until each has met an ``until`` string or ``max_gen_toks`` tokens."""
        pieces = [TextStream(self.vocab, prompt, stop=until) for prompt in prompts]
        settings = GenerationSettings(
            max_new_tokens=max_gen_toks, temperature=temperature, span=self.span, context=self.tgt_len
        )
        tokens = stream(
            self.model, [torch.tensor(p, dtype=torch.long) for p in prompts], settings, generator=generator
        )
        for step, token in enumerate(tokens):
            last = step == max_gen_toks - 1
            for piece, token_id in zip(pieces, token.tokens.tolist(), strict=True):
                if token_id != PAD_ID:
                    piece.push(token_id, final=last)
            if all(piece.stopped for piece in pieces):
                tokens.close()
                break
        return [piece.text for piece in pieces]


def _gen_settings(kwargs: dict[str, Any]) -> tuple[tuple[str, ...], int, float]:
    """(until strings, max_gen_toks, temperature) of a ``generate_until`` request's generation arguments;
    sampling only when ``do_sample`` is true with a positive temperature, else greedy."""
    kwargs = dict(kwargs or {})
    until = kwargs.pop("until", None)
    if isinstance(until, str):
        until = [until]
    until = tuple(s for s in (until or ()) if s)
    max_gen_toks = int(kwargs.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
    temperature = float(kwargs.pop("temperature", 0.0) or 0.0)
    if not kwargs.pop("do_sample", False):
        temperature = 0.0
    if max_gen_toks < 1:
        raise TxlError(f"generate_until: max_gen_toks must be a positive integer, got {max_gen_toks}")
    return until, max_gen_toks, temperature


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
    (``results`` per task, ``configs``, ...), or raises TxlError naming an unknown task."""
    from lm_eval import simple_evaluate

    manager = task_manager(settings.include_path, metadata=settings.metadata)
    known = {*manager.all_tasks, *manager.all_groups, *manager.all_tags}
    unknown = [name for name in settings.tasks if name not in known]
    if unknown:
        raise TxlError(
            f"--tasks: unknown task {', '.join(unknown)} (add its folder with --include-path; "
            "txl's own: txl_wikitext_local)"
        )
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
