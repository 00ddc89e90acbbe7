"""Text in and out of the decoding loop: prompts encoded once (:func:`read_prompt`, which ``txl serve`` uses
too), stop strings and the streamed text (:class:`TextStream`), one text generation (:func:`generate_text`)
and sampling from a trained run (:func:`generate_from_run`, what ``txl generate`` does).

The loop is :mod:`txl.generate`'s, drawing a token :mod:`txl.sampling`'s, vocabularies :mod:`txl.data.vocab`'s.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch import Tensor, nn

from .config import Span, first_set, span_of
from .errors import TxlWarning
from .generate import GenerationSettings, generate, stream
from .sampling import SamplingSettings

if TYPE_CHECKING:
    from .runs import LoadedRun

__all__ = [
    "UnknownTokensWarning",
    "read_prompt",
    "describe_unknown",
    "encode_prompt",
    "TextStream",
    "generate_text",
    "TextSamples",
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
        missing = list(vocab.unknown_tokens(text))
        ids = vocab.encode(text)
    else:
        ids = vocab.encode(text, strict=True)
    return torch.as_tensor(ids, dtype=torch.long).reshape(-1), missing  # (P,)


def encode_prompt(vocab: _Vocab, prompt: str, *, unknown: Literal["unk", "error"] = "unk") -> Tensor:
    """(P,) int64 ids of ``prompt`` (:func:`read_prompt`; unknown tokens read as ``<unk>`` are named by an
    :class:`UnknownTokensWarning`); an empty prompt is the vocabulary's ``eos_id`` (a document boundary) when it
    has one."""
    ids, missing = read_prompt(vocab, prompt, unknown=unknown)
    if missing:
        message = (
            f"{len(missing)} prompt word(s) not in the vocabulary, read as <unk>: {describe_unknown(missing)}"
        )
        warnings.warn(UnknownTokensWarning(message), stacklevel=3)
    if ids.numel() == 0:
        eos = getattr(vocab, "eos_id", None)
        if eos is None:
            raise ValueError("the prompt is empty and the vocabulary has no eos_id to start from")
        ids = torch.tensor([eos], dtype=torch.long)  # (1,)
    return ids


def generate_text(
    model: nn.Module,
    vocab: _Vocab,
    prompt: str,
    *,
    max_new_tokens: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    span: Span | None = None,
    settings: GenerationSettings | None = None,
    include_prompt: bool = False,
    unknown: Literal["unk", "error"] = "unk",
    stop: Sequence[str] = (),
    on_text: Callable[[str], None] | None = None,
) -> str:
    """Encode ``prompt`` with ``vocab``, generate with :func:`~txl.generate.generate` (``max_new_tokens``,
    sampling, ``generator`` and ``span`` as there; or all the settings as one ``settings``), and return the new
    text (or, with ``include_prompt``, the prompt and the new text decoded together, which spaces words
    correctly).

    Prompt tokens not in ``vocab``: with ``unknown="unk"``, a vocabulary whose data reads them as ``<unk>``
    (``vocab.unknown_as_unk``: word vocabularies) does the same and warns with :class:`UnknownTokensWarning`
    naming them; other vocabularies (a char vocabulary has never seen an unknown character), and
    ``unknown="error"``, raise ValueError naming them.

    An empty prompt starts from the vocabulary's ``eos_id`` (a document boundary) when it has one.
    ``max_new_tokens=0`` runs no model: it returns "" (or the prompt as the vocabulary decodes it).

    ``stop``: strings that end the generation as soon as the new text contains one; the text is cut before it.
    ``on_text``: called once per generated token with the text that token made printable (see
    :class:`TextStream`: possibly empty, the last call flushes the rest), for printing as it is produced."""
    _check_vocab(model, vocab)
    ids = encode_prompt(vocab, prompt, unknown=unknown)  # (P,)
    if settings is None and type(max_new_tokens) is int and max_new_tokens == 0:  # False is refused below
        return vocab.decode(ids.tolist()) if include_prompt else ""
    if settings is None:
        sampling = SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p)
        settings = GenerationSettings(max_new_tokens=max_new_tokens, sampling=sampling, span=span)
    elif (max_new_tokens, top_k, top_p, span) != (None,) * 4 or temperature != 1.0:
        raise ValueError("give settings= or its fields (max_new_tokens=, temperature=, ...), not both")
    pieces = _generate_row(model, vocab, ids, settings, generator=generator, stop=stop, on_text=on_text)
    if include_prompt:
        text = vocab.decode(pieces.ids)
        if pieces.stopped:
            text = text[: _common_prefix(text, pieces.prompt_text)] + pieces.text
        return text
    text = vocab.decode(pieces.new_ids)
    if pieces.stopped:
        cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
        text = text[: min(cuts)] if cuts else text
    return text


def _check_vocab(model: nn.Module, vocab: _Vocab) -> None:
    if len(vocab) != model.config.vocab_size:
        raise ValueError(
            f"the vocabulary has {len(vocab)} tokens but the model's vocab_size is "
            f"{model.config.vocab_size}: they must match"
        )


def _common_prefix(a: str, b: str) -> int:
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
        cuts = [i for i in (new.find(s) for s in self.stop) if i >= 0]
        if cuts:
            new, final, self.stopped = new[: min(cuts)], True, True
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


def _generate_row(
    model: nn.Module,
    vocab: _Vocab,
    ids: Tensor,
    settings: GenerationSettings,
    *,
    generator: torch.Generator | None,
    stop: Sequence[str],
    on_text: Callable[[str], None] | None,
    prompt_text: str | None = None,
) -> TextStream:
    """Generate one row after the prompt ids (P,); the returned :class:`TextStream` holds the new ids and the
    new text (cut before a stop string), which ``on_text`` received piece by piece."""
    pieces = TextStream(vocab, ids.tolist(), stop=stop, prompt_text=prompt_text)
    if not stop and on_text is None:
        pieces.push_all(generate(model, ids, generator=generator, settings=settings).new_tokens[0].tolist())
        return pieces
    stop_ids = set(settings.stop_ids or ())
    tokens = stream(model, ids, generator=generator, settings=settings)
    last = settings.max_new_tokens - 1
    for step, token in enumerate(tokens):
        token_id = int(token[0])
        piece = pieces.push(token_id, final=step == last or token_id in stop_ids)
        if on_text is not None:
            on_text(piece)
        if pieces.stopped:
            tokens.close()
            break
    return pieces


# ---------------------------------------------------------------------------------------------------------
# A trained run
# ---------------------------------------------------------------------------------------------------------


@dataclass
class TextSamples:
    """What :func:`generate_from_run` returns."""

    prompt: str
    """The prompt text as given."""
    prompt_text: str
    """The prompt as the vocabulary reads it back (``decode(encode(prompt))``: unknown words as ``<unk>``,
    a word vocabulary's spacing): the text that ``texts`` continue, so ``prompt_text + texts[i]`` is the
    whole sample as one text."""
    texts: list[str]
    """The new text of each sample (cut before a stop string)."""
    new_tokens: int
    """Tokens generated over all samples (the stop string's tokens included)."""
    seconds: float
    """Time spent generating (prompt feeding included, loading the run not)."""

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def generate_from_run(
    run: LoadedRun,
    prompt: str,
    *,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    mem_len: int | None = None,
    seed: int = 0,
    stop: Sequence[str] = (),
    num_samples: int = 1,
    unknown: Literal["unk", "error"] = "unk",
    on_start: Callable[[int, str], None] | None = None,
    on_text: Callable[[int, str], None] | None = None,
) -> TextSamples:
    """Sample ``num_samples`` continuations of ``prompt`` from a loaded run (what ``txl generate`` does).

    Settings left as None come from the run's ``[generate]`` config; ``greedy`` means temperature 0;
    ``mem_len`` replaces the model's memory length (0 also turns same-length attention off, with a
    :class:`~txl.config.SameLengthOff` warning). Unknown prompt
    tokens: see ``unknown`` in :func:`generate_text`. The samples are drawn one after the other from one
    generator seeded with ``seed`` (so streamed and collected output are the same). ``on_text(i, piece)`` is
    called once per generated token of sample i with the text it made printable (see :class:`TextStream`),
    after ``on_start(i, prompt_text)`` (the prompt as the vocabulary reads it, which the new text continues).
    ``max_new_tokens=0`` generates nothing. Bad settings and unknown prompt tokens raise ValueError."""
    if greedy:
        if temperature not in (None, 0):
            raise ValueError(f"greedy decoding has temperature 0, not {temperature}")
        temperature = 0.0
    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    defaults = replace(run.config.generate, **{k: v for k, v in given.items() if v is not None})
    max_new_tokens = first_set(max_new_tokens, defaults.max_new_tokens)
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if max_new_tokens > MAX_NEW_TOKENS:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} is above the limit of {MAX_NEW_TOKENS} tokens per sample "
            "(as txl serve bounds max_tokens); generate in several runs"
        )
    span = None
    if mem_len is not None:
        if run.config.model.attention != "relative":
            raise ValueError(
                "a memory length applies to the Transformer-XL only (this run is the vanilla baseline)"
            )
        base = run.config.model.span
        span = span_of(mem_len=mem_len, clamp_len=base.clamp_len, same_length=base.same_length)
    model, vocab = run.model, run.vocab
    ids = encode_prompt(vocab, prompt, unknown=unknown)  # (P,): once, so unknown words are reported once
    prompt_text = vocab.decode(ids.tolist())  # once, for every sample's TextStream
    if max_new_tokens == 0:
        return TextSamples(prompt, prompt_text, texts=[""] * num_samples, new_tokens=0, seconds=0.0)
    sampling = SamplingSettings(temperature=defaults.temperature, top_k=defaults.top_k, top_p=defaults.top_p)
    settings = GenerationSettings(max_new_tokens=max_new_tokens, sampling=sampling, span=span)
    param = next(model.parameters(), None)
    generator = torch.Generator(device=param.device if param is not None else "cpu").manual_seed(seed)
    texts, count, seconds = [], 0, 0.0
    for index in range(num_samples):
        if on_start is not None:
            on_start(index, prompt_text)
        show = None if on_text is None else (lambda piece, index=index: on_text(index, piece))
        start = time.perf_counter()
        pieces = _generate_row(
            model, vocab, ids, settings, generator=generator, stop=stop, on_text=show, prompt_text=prompt_text
        )
        seconds += time.perf_counter() - start
        count += len(pieces.new_ids)
        texts.append(pieces.text)  # the exact decoding, which the printed pieces may only approach
    return TextSamples(prompt=prompt, prompt_text=prompt_text, texts=texts, new_tokens=count, seconds=seconds)
