"""Text in and out of the decoding loop: prompts, stop strings and streamed text (:class:`TextStream`), one
text generation (:func:`generate_text`) and sampling from a trained run (:func:`generate_from_run`)."""

# Text in and out of the decoding loop: prompts encoded once (:func:`read_prompt`, which ``txl serve`` uses
# too), stop strings and the streamed text (:class:`TextStream`), one text generation (:func:`generate_text`)
# and sampling from a trained run (:func:`generate_from_run`, what ``txl generate`` does).
#
# The engine is :mod:`.engine`'s, the params and settings :mod:`.params`', vocabularies :mod:`txl.data.vocab`'s.

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

import torch
from torch import Tensor, nn

from ..config import has_memory, positive_int, span_of
from ..data.vocab import start_token
from ..errors import TxlWarning
from ..limits import TOKEN_BYTES, cache_bytes, check_fits
from ..model import eval_mode
from ..model.transformer import config_of
from .engine import Engine
from .params import MAX_SEED, DecodeSettings, SamplingParams

if TYPE_CHECKING:
    from ..runs import LoadedRun

__all__ = [
    "UnknownTokensWarning",
    "read_prompt",
    "describe_unknown",
    "encode_prompt",
    "cut_at_stop",
    "TextStream",
    "generate_text",
    "TextSamples",
    "prompt_text",
    "run_settings",
    "generate_from_run",
    "MAX_NEW_TOKENS",
]

MAX_NEW_TOKENS = 100_000
"""The most tokens :func:`generate_from_run` samples per sample (``txl generate --max-new-tokens``), as txl
serve bounds a request's ``max_tokens``: a larger number is more likely a typo than a wish."""


class UnknownTokensWarning(TxlWarning):
    """A prompt held tokens the vocabulary does not know; they were read as ``<unk>``."""


class _Vocab(Protocol):
    """What :func:`generate_text` needs of a vocabulary (see :mod:`txl.data.vocab`). It also uses, when
    present, ``eos_id``, ``unknown_as_unk`` and ``unknown_tokens(text)``."""

    def __len__(self) -> int: ...

    def encode(self, text: str, *, strict: bool = False) -> Any: ...

    def decode(self, ids: Any) -> str: ...


def describe_unknown(missing: Sequence[str]) -> str:
    """The unknown tokens, as a message shows them: the first five and how many more."""
    shown = ", ".join(repr(t) for t in missing[:5])
    return shown + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")


def read_prompt(
    vocab: _Vocab, text: str, *, unknown: Literal["unk", "error"] = "unk"
) -> tuple[Tensor, list[str]]:
    """(P,) int64 ids of ``text`` and the tokens read as ``<unk>``: with ``unknown="unk"``, a vocabulary whose
    data reads unknown tokens as ``<unk>`` (``vocab.unknown_as_unk``: word vocabularies) does so; other
    vocabularies, and ``unknown="error"``, raise ValueError naming them. How the unknown tokens are reported
    (a warning, a note in a reply) is the caller's; ``txl generate`` and ``txl serve`` both read prompts here."""
    if unknown not in ("unk", "error"):
        raise ValueError(f"unknown must be 'unk' or 'error', got {unknown!r}")
    missing: list[str] = []
    if unknown == "unk" and getattr(vocab, "unknown_as_unk", False):
        missing = list(cast(Any, vocab).unknown_tokens(text))  # what vocabularies with unknown_as_unk have
        ids = vocab.encode(text)
    else:
        ids = vocab.encode(text, strict=True)
    return torch.as_tensor(ids, dtype=torch.long).reshape(-1), missing  # (P,)


def encode_prompt(vocab: _Vocab, prompt: str, *, unknown: Literal["unk", "error"] = "unk") -> Tensor:
    """(P,) int64 ids of ``prompt`` (:func:`read_prompt`; unknown tokens read as ``<unk>`` are named by an
    :class:`UnknownTokensWarning`); an empty prompt is the vocabulary's end-of-text token ``eos_id`` (a
    document boundary) when it has one (word vocabularies), else a ValueError that asks for a prompt."""
    ids, missing = read_prompt(vocab, prompt, unknown=unknown)
    if missing:
        message = (
            f"{len(missing)} prompt word(s) not in the vocabulary, read as <unk>: {describe_unknown(missing)}"
        )
        warnings.warn(UnknownTokensWarning(message), stacklevel=3)
    if ids.numel() == 0:  # a document boundary to start from: only a vocabulary with <eos> has one
        if getattr(vocab, "eos_id", None) is None:
            kind = getattr(vocab, "kind", "")
            raise ValueError(
                f"the prompt is empty, and this {kind + ' ' if kind else ''}vocabulary has no end-of-text "
                "token to start from: give a prompt of at least one character (a newline starts a new text)"
            )
        ids = torch.tensor([start_token(vocab)], dtype=torch.long)  # (1,)
    return ids


def generate_text(
    model: nn.Module,
    vocab: _Vocab,
    prompt: str,
    params: SamplingParams = SamplingParams(),
    *,
    settings: DecodeSettings = DecodeSettings(),
    on_text: Callable[[str], None] | None = None,
) -> str:
    """Encode ``prompt`` with ``vocab``, generate as ``params`` says (one request of an
    :class:`~txl.inference.engine.Engine` decoding as ``settings`` say), and return the new text, cut before
    the first of ``params.stop`` it contains (the request ends there).

    Prompt tokens not in ``vocab`` (:func:`encode_prompt`): a vocabulary whose data reads them as ``<unk>``
    (``vocab.unknown_as_unk``: word vocabularies) does the same and warns with :class:`UnknownTokensWarning`
    naming them; other vocabularies (a char vocabulary has never seen an unknown character) raise ValueError
    naming them. An empty prompt starts from the vocabulary's ``eos_id`` (a document boundary) when it has
    one. ``max_new_tokens=0`` runs no model and returns "".

    ``on_text``: called once per generated token with the text that token made printable (see
    :class:`TextStream`: possibly empty, the last call flushes the rest), for printing as it is produced."""
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    _check_vocab(model, vocab)
    ids = encode_prompt(vocab, prompt)  # (P,)
    if params.max_new_tokens == 0:
        return ""
    show = None if on_text is None else (lambda _row, piece: on_text(piece))
    streams = [TextStream(vocab, ids.tolist(), stop=params.stop)]
    (pieces,) = _decode_rows(model, [(ids, params)], streams, settings, show)
    new = vocab.decode(pieces.new_ids)
    return cut_at_stop(new, params.stop) if pieces.stopped else new


def cut_at_stop(text: str, stop: Sequence[str]) -> str:
    """``text`` cut before the earliest occurrence of any of the ``stop`` strings (unchanged without one)."""
    cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
    return text[: min(cuts)] if cuts else text


def _check_vocab(model: nn.Module, vocab: _Vocab) -> None:
    vocab_size = config_of(model).vocab_size
    if len(vocab) != vocab_size:
        raise ValueError(
            f"the vocabulary has {len(vocab)} tokens but the model's vocab_size is {vocab_size}: they must match"
        )


def _common_prefix(a: str, b: str) -> int:
    if a.startswith(b):  # what a vocabulary whose decoding only appends gives: no loop
        return len(b)
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TextStream:
    """Generated token ids in, printable text out, as they come; cut at the first stop string.

    The new text is ``decode(prompt + new ids)`` after ``decode(prompt)``, so word vocabularies space it as
    one text. Held back until a later token (or the last) settles it: a trailing U+FFFD (an incomplete UTF-8
    character of a byte vocabulary) and a tail that could be the start of a stop string. A vocabulary whose
    decoding rewrites earlier text (rare BPE merges) may make the printed pieces differ from :attr:`text`;
    :attr:`text` is always the exact decoding.

        pieces = TextStream(vocab, prompt_ids, stop=["\\n\\n"])
        for token in stream(...): print(pieces.push(int(token[0])), end="", flush=True)
    """

    def __init__(
        self,
        vocab: _Vocab,
        prompt_ids: Sequence[int],
        *,
        stop: Sequence[str] = (),
        prompt_text: str | None = None,
    ) -> None:
        """``prompt_text``: ``vocab.decode(prompt_ids)`` when the caller has it already (decoded once)."""
        if isinstance(stop, str) or any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
        self.vocab = vocab
        self.stop = tuple(stop)
        self.ids = [int(i) for i in prompt_ids]
        self.new_ids: list[int] = []
        self.prompt_text = vocab.decode(self.ids) if prompt_text is None else prompt_text
        self.text = ""
        """The new text so far (cut before the stop string once :attr:`stopped`)."""
        self.stopped = False
        """True once the new text contains a stop string."""
        self._shown = ""

    def push(self, token_id: int, *, final: bool = False) -> str:
        """Add one generated id; return the text that became printable (``final``: print everything left)."""
        if self.stopped:
            return ""
        self.ids.append(int(token_id))
        self.new_ids.append(int(token_id))
        full = self.vocab.decode(self.ids)
        new = full[_common_prefix(full, self.prompt_text) :]
        if any(s in new for s in self.stop):
            new, final, self.stopped = cut_at_stop(new, self.stop), True, True
        self.text = new
        if not final:
            new = new.rstrip("\ufffd")
            hold = max((k for s in self.stop for k in range(1, len(s)) if new.endswith(s[:k])), default=0)
            new = new[: len(new) - hold]
        if not new.startswith(self._shown):  # the decoding changed text already shown: show only what follows
            return ""
        piece, self._shown = new[len(self._shown) :], new
        return piece

    def push_all(self, token_ids: Sequence[int]) -> str:
        """Add the last ids at once (one decoding, not one per id); return the rest of the text."""
        if self.stopped or not token_ids:
            return ""
        self.ids.extend(int(i) for i in token_ids[:-1])
        self.new_ids.extend(int(i) for i in token_ids[:-1])
        return self.push(token_ids[-1], final=True)


def _decode_rows(
    model: nn.Module,
    rows: list[tuple[Tensor, SamplingParams]],
    pieces: list[TextStream],
    settings: DecodeSettings,
    on_text: Callable[[int, str], None] | None,
) -> list[TextStream]:
    """Generate each row (its prompt ids (P_r,) and params) as a request of one engine into its
    :class:`TextStream` of ``pieces`` (made from those ids), which then holds its new ids and its new text
    (cut before a stop string), which ``on_text(row, piece)`` received piece by piece, rows in order at
    every step. A row that meets a stop string ends there."""
    engine = Engine(model, settings)
    index = {engine.add(ids, params): r for r, (ids, params) in enumerate(rows)}
    quiet = on_text is None and not any(p.stop for p in pieces)  # the text is decoded once, at the end
    new: list[list[int]] = [[] for _ in rows]
    with eval_mode(model):
        while engine.unfinished:
            for event in engine.step():
                r = index[event.request]
                if quiet:
                    new[r].append(event.token)
                    continue
                text = pieces[r]
                piece = text.push(event.token, final=event.finish is not None)
                if on_text is not None:
                    on_text(r, piece)
                if text.stopped and event.finish is None:
                    engine.finish(event.request)
    if quiet:
        for text, ids in zip(pieces, new, strict=True):
            text.push_all(ids)
    return pieces


# ---------------------------------------------------------------------------------------------------------
# A trained run
# ---------------------------------------------------------------------------------------------------------


@dataclass
class TextSamples:
    """What :func:`generate_from_run` returns: one entry per row (prompt ``i // num_samples``, sample
    ``i % num_samples``) in each list."""

    prompts: list[str]
    """Each row's prompt text as given."""
    prompt_texts: list[str]
    """Each row's prompt as the vocabulary reads it back (``decode(encode(prompt))``: unknown words as
    ``<unk>``, a word vocabulary's spacing): the text that ``texts`` continue, so ``prompt_texts[i] +
    texts[i]`` is the whole sample as one text."""
    texts: list[str]
    """The new text of each row (cut before a stop string)."""
    new_tokens: int
    """Tokens generated over all rows (a stop string's tokens included)."""
    seconds: float
    """Time spent generating (prompt feeding included, loading the run not)."""

    @property
    def tokens_per_s(self) -> float:
        """Tokens generated per second over all rows."""
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def prompt_text(vocab: _Vocab, prompt: str) -> str:
    """``prompt`` as the vocabulary reads it back (unknown words as ``<unk>``, a word vocabulary's spacing;
    an empty prompt as its start token): the text that a run's samples continue. Unknown tokens are not
    warned about here (:func:`encode_prompt` does)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UnknownTokensWarning)
        return vocab.decode(encode_prompt(vocab, prompt).tolist())


def run_settings(
    run: LoadedRun, *, mem_len: int | None = None, rows: int | None = None, compiled: bool = False
) -> DecodeSettings:
    """How a run's model decodes: its memory length, clamp and same-length attention, or ``mem_len`` in its
    place (0 also turns same-length attention off, with a :class:`~txl.config.SameLengthOff` warning),
    ``rows`` rows (None: every request at once) and ``compiled``, the step compiled ahead of time
    (:attr:`DecodeSettings.compiled`). The run's ``[generate]`` section gives the :class:`SamplingParams`
    (:meth:`SamplingParams.from_config`)."""
    span = None
    if mem_len is not None:
        if run.config.model.attention != "relative":
            raise ValueError(
                "a memory length applies to the Transformer-XL only (this run is the vanilla baseline)"
            )
        base = run.config.model.span
        span = span_of(mem_len=mem_len, clamp_len=base.clamp_len, same_length=base.same_length)
    return DecodeSettings(span=span, rows=rows, compiled=compiled)


def _check_fits(run: LoadedRun, params: SamplingParams, settings: DecodeSettings) -> None:
    """Refuse (:class:`~txl.errors.SizeError`, one line) a memory or a generation length whose buffers cannot
    fit, before the first token: the key/value cache of ``settings.span`` (the model's when None) and the
    ``max_new_tokens`` of one sample."""
    model = run.config.model
    param = next(run.model.parameters())
    span = model.span if settings.span is None else settings.span
    if has_memory(model, span):
        m = span.mem_len
        check_fits(
            cache_bytes(model, batch=1, mem_len=m, dtype_bytes=param.element_size()),
            setting=f"model.mem_len {m}" if settings.span is None else f"mem_len {m}",
            what=f"the key/value cache of {model.n_layer} layers, d_model {model.d_model}",
            lower="mem_len",
            fields=("mem_len",),
            device=param.device,
        )
    new = params.max_new_tokens
    check_fits(
        new * TOKEN_BYTES,
        setting=f"max_new_tokens {new}",
        what="the tokens of one sample",
        lower="max_new_tokens",
        fields=("max_new_tokens",),
    )


def generate_from_run(
    run: LoadedRun,
    prompt: str | Sequence[str],
    params: SamplingParams | None = None,
    *,
    settings: DecodeSettings | None = None,
    num_samples: int = 1,
    on_text: Callable[[int, str], None] | None = None,
) -> TextSamples:
    """Sample ``num_samples`` continuations of each prompt from a loaded run, all rows as requests of one
    engine (what ``txl generate`` does): row ``i`` continues prompt ``i // num_samples``.

    ``prompt``: one text or a list of texts (of any lengths). ``params``: None is the run's ``[generate]``
    section (:meth:`SamplingParams.from_config`); ``params.seed`` (None: 0) gives sample j of every prompt
    the seed seed + j (as a completion of ``txl serve`` seeds its choices), so a row's text does not depend on
    the others: a prompt given alone or beside other prompts gets the same samples. ``settings``: None is :func:`run_settings` (the model's
    memory). Unknown prompt tokens: see :func:`generate_text`; :func:`prompt_text` gives the prompt as the
    vocabulary reads it (``TextSamples.prompt_texts``, which the new text continues). ``on_text(i, piece)`` is
    called once per generated token of row i with the text it made printable (see :class:`TextStream`), the
    rows in order at every step. ``max_new_tokens=0`` generates nothing. Bad params and unknown prompt tokens
    raise ValueError; a memory or ``max_new_tokens`` whose buffers cannot fit, a
    :class:`~txl.errors.SizeError` before the first token."""
    params = SamplingParams.from_config(run.config.generate) if params is None else params
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    settings = run_settings(run) if settings is None else settings
    if not isinstance(settings, DecodeSettings):
        raise ValueError(f"settings must be a DecodeSettings, got {type(settings).__name__}")
    _check_fits(run, params, settings)
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not prompts or any(not isinstance(p, str) for p in prompts):
        raise ValueError(f"prompt must be a text or a non-empty list of texts, got {prompt!r:.80}")
    positive_int(num_samples, "num_samples", error=ValueError, field=False)
    if params.max_new_tokens > MAX_NEW_TOKENS:
        raise ValueError(
            f"max_new_tokens={params.max_new_tokens} is above the limit of {MAX_NEW_TOKENS} tokens per "
            "sample (as txl serve bounds max_tokens); generate in several runs"
        )
    if settings.span is not None and run.config.model.attention != "relative":
        raise ValueError(
            "a memory length applies to the Transformer-XL only (this run is the vanilla baseline)"
        )
    model, vocab = run.model, run.vocab
    _check_vocab(model, vocab)
    encoded = [
        encode_prompt(vocab, p) for p in prompts
    ]  # (P_i,) each: unknown words reported once per prompt
    read_back = [vocab.decode(ids.tolist()) for ids in encoded]
    rows = [i for i in range(len(prompts)) for _ in range(num_samples)]
    texts = [read_back[i] for i in rows]
    given = [prompts[i] for i in rows]
    if params.max_new_tokens == 0:
        return TextSamples(given, texts, texts=[""] * len(rows), new_tokens=0, seconds=0.0)
    seed = 0 if params.seed is None else params.seed
    start = time.perf_counter()
    ids = [encoded[i] for i in rows]
    # sample j of every prompt draws from seed + j: a prompt's samples do not depend on the prompts beside it
    requests = [
        (row, replace(params, seed=(seed + r % num_samples) % (MAX_SEED + 1))) for r, row in enumerate(ids)
    ]
    streams = [
        TextStream(vocab, row.tolist(), stop=params.stop, prompt_text=t)
        for row, t in zip(ids, texts, strict=True)
    ]
    pieces = _decode_rows(model, requests, streams, settings, on_text)
    seconds = time.perf_counter() - start
    count = sum(len(p.new_ids) for p in pieces)
    # the exact decoding, which the printed pieces may only approach
    return TextSamples(given, texts, texts=[p.text for p in pieces], new_tokens=count, seconds=seconds)
