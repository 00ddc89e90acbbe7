"""Vocabularies: word, char and byte symbol tables and byte-level BPE (Hugging Face ``tokenizers``); text <-> id
and their JSON form, never pickled. Reading corpora is :mod:`txl.data.corpora`'s job, caching encoded splits
:mod:`txl.data.encoded`'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..config import positive_int
from ..errors import TxlError
from ..files import atomic_write_text
from .corpora import Corpus, CorpusError

__all__ = [
    "UNK",
    "EOS",
    "TOKENIZERS",
    "Vocab",
    "WordVocab",
    "CharVocab",
    "ByteVocab",
    "BPEVocab",
    "vocab_from_dict",
    "load_vocab",
    "build_vocab",
    "start_token",
]

UNK = "<unk>"
EOS = "<eos>"
FORMAT_VERSION = 1
TOKENIZERS = ("whitespace", "regex")
_REGEX = re.compile(r"\w+|[^\w\s]")


def _as_text(text: str | bytes) -> str:
    if isinstance(text, bytes):
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise ValueError(f"input is not valid UTF-8 at byte offset {err.start}") from None
    return text


def _ids_array(ids: Sequence[int] | np.ndarray) -> np.ndarray:
    arr = np.asarray(ids)
    if arr.ndim != 1:
        arr = arr.reshape(-1)
    return arr.astype(np.int64, copy=False)


def _id_list(ids: Sequence[int] | np.ndarray, size: int, kind: str) -> list[int]:
    """``ids`` as a list of ints, each checked in [0, size): a list as it is (no array made for the few ids of
    a streamed token), anything else through an array."""
    values = ids if isinstance(ids, list) else _ids_array(ids).tolist()
    if values and (min(values) < 0 or max(values) >= size):
        raise ValueError(f"ids out of range for a {kind} vocabulary of size {size}")
    return values


def _unknown_error(unknown: Sequence[str], kind: str) -> ValueError:
    shown = ", ".join(repr(t) for t in list(dict.fromkeys(unknown))[:10])
    more = f" (and {len(set(unknown)) - 10} more)" if len(set(unknown)) > 10 else ""
    return ValueError(f"{len(unknown)} token(s) not in the {kind} vocabulary: {shown}{more}")


class Vocab(ABC):
    """A mapping between text and int64 ids. Subclasses set `kind`, `unk_id` and `eos_id`."""

    kind: str = ""
    unk_id: int | None = None
    eos_id: int | None = None
    unknown_as_unk: bool = False
    """Whether a prompt's unknown tokens may be read as `<unk>`, as unknown tokens are in the data: true for
    word vocabularies (rare and unseen words are `<unk>`). A char vocabulary's `<unk>` never occurs in its
    training text, so a prompt with an unknown character is refused instead."""

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def encode(self, text: str | bytes, *, strict: bool = False) -> np.ndarray:
        """Ids (int64, 1-D). `strict=True` raises ValueError naming unknown tokens instead of `<unk>`."""

    @abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str: ...

    def unknown_tokens(self, text: str | bytes) -> list[str]:
        """The distinct tokens of `text` that are not in the vocabulary, in order of first appearance
        (none for byte and BPE vocabularies, which encode any text)."""
        return []

    @abstractmethod
    def to_dict(self) -> dict[str, Any]:
        """JSON-able description, including "kind" and "format"; `vocab_from_dict` inverts it."""

    @property
    def fingerprint(self) -> str:
        """sha256 of the canonical JSON of `to_dict()`."""
        canon = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        return hashlib.sha256(canon.encode("utf-8")).hexdigest()

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write JSON atomically (:func:`txl.files.atomic_write_text`)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(self.to_dict(), ensure_ascii=False))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(size={len(self)})"


class _TableVocab(Vocab):
    """A vocabulary that is a list of symbols (word and char)."""

    def __init__(self, symbols: Sequence[str]) -> None:
        self.symbols: tuple[str, ...] = tuple(symbols)
        self.index: dict[str, int] = {s: i for i, s in enumerate(self.symbols)}
        if len(self.index) != len(self.symbols):
            raise ValueError(f"{self.kind} vocabulary has duplicate symbols")

    def __len__(self) -> int:
        return len(self.symbols)


class WordVocab(_TableVocab):
    """Words (by frequency desc, then alphabetically) after the specials `<unk>`=0 and `<eos>`=1.

    tokenizer: "whitespace" (pre-tokenized corpora such as WikiText) or "regex" (words and
    punctuation marks of raw text). eos_per_line: append `<eos>` after every line, empty lines
    included, as the original Transformer-XL does for WikiText and PTB.
    """

    kind = "word"
    unk_id: int | None = 0
    eos_id: int | None = 1
    unknown_as_unk = True

    def __init__(
        self,
        words: Sequence[str],
        *,
        tokenizer: str = "whitespace",
        eos_per_line: bool = False,
        as_given: bool = False,
    ):
        """``as_given``: keep ``words`` in their order, specials wherever they are (a vocabulary imported
        with a pretrained model, whose ids must not move); a missing ``<unk>`` makes unknown words an error."""
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
        if as_given:
            super().__init__(words)
            self.unk_id, self.eos_id = self.index.get(UNK), self.index.get(EOS)
            self.unknown_as_unk = self.unk_id is not None
        else:
            super().__init__([UNK, EOS, *(w for w in words if w not in (UNK, EOS))])
        self.tokenizer = tokenizer
        self.eos_per_line = eos_per_line
        self.as_given = as_given

    @staticmethod
    def split_words(line: str, tokenizer: str) -> list[str]:
        return line.split() if tokenizer == "whitespace" else _REGEX.findall(line)

    def tokens(self, text: str) -> Iterator[str]:
        """The token stream of `text`, with `<eos>` after each line if `eos_per_line`."""
        if not self.eos_per_line:
            if self.tokenizer == "whitespace":
                yield from text.split()
            else:
                yield from _REGEX.findall(text)
            return
        lines = text.split("\n")
        if lines and lines[-1] == "":  # a final newline ends the last line; it does not open one
            lines.pop()
        for line in lines:
            yield from self.split_words(line, self.tokenizer)
            yield EOS

    @classmethod
    def build(
        cls,
        text: str,
        *,
        min_freq: int = 1,
        max_size: int | None = None,
        tokenizer: str = "whitespace",
        eos_per_line: bool = False,
    ) -> WordVocab:
        """Count the words of `text`; keep those seen `min_freq` times, at most `max_size` in all
        (specials included)."""
        positive_int(min_freq, "min_freq", error=ValueError, field=False)
        if tokenizer not in TOKENIZERS:
            raise ValueError(f"tokenizer must be one of {TOKENIZERS}, got {tokenizer!r}")
        counts = Counter(text.split() if tokenizer == "whitespace" else _REGEX.findall(text))
        counts.pop(UNK, None)
        counts.pop(EOS, None)
        words = sorted((w for w, c in counts.items() if c >= min_freq), key=lambda w: (-counts[w], w))
        if max_size is not None:
            if max_size < 2:
                raise ValueError(f"max_size must be >= 2 (room for <unk> and <eos>), got {max_size}")
            words = words[: max_size - 2]
        return cls(words, tokenizer=tokenizer, eos_per_line=eos_per_line)

    def encode(self, text: str | bytes, *, strict: bool = False) -> np.ndarray:
        toks = list(self.tokens(_as_text(text)))
        get = self.index.get
        if strict or self.unk_id is None:
            unknown = [t for t in toks if t not in self.index]
            if unknown:
                raise _unknown_error(unknown, self.kind)
        return np.fromiter((get(t, self.unk_id) for t in toks), dtype=np.int64, count=len(toks))

    def unknown_tokens(self, text: str | bytes) -> list[str]:
        return [t for t in dict.fromkeys(self.tokens(_as_text(text))) if t not in self.index]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        out: list[str] = []
        line: list[str] = []
        for i in _id_list(ids, len(self), self.kind):
            if i == self.eos_id:
                out.append(" ".join(line) + "\n")
                line = []
            else:
                line.append(self.symbols[i])
        out.append(" ".join(line))
        return "".join(out)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "format": FORMAT_VERSION,
            "kind": self.kind,
            "tokenizer": self.tokenizer,
            "eos_per_line": self.eos_per_line,
            "symbols": list(self.symbols),
        }
        if self.as_given:  # written only then, so that other vocabularies keep their fingerprints
            d["as_given"] = True
        return d


class CharVocab(_TableVocab):
    """`<unk>`=0, then the characters of the training text sorted by code point.
    An unknown character decodes as U+FFFD."""

    kind = "char"
    unk_id = 0

    def __init__(self, chars: Sequence[str]) -> None:
        chars = sorted(set(chars) - {UNK})
        if any(len(c) != 1 for c in chars):
            raise ValueError("char vocabulary symbols must be single characters")
        super().__init__([UNK, *chars])
        # sorted code points -> ids, for a vectorised encode; id -> text, for decode
        self._points = np.array([ord(c) for c in chars], dtype=np.uint32)
        self._texts = ["\ufffd", *chars]

    @classmethod
    def build(cls, text: str) -> CharVocab:
        return cls(list(set(text)))

    def encode(self, text: str | bytes, *, strict: bool = False) -> np.ndarray:
        text = _as_text(text)
        points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        if not len(self._points):
            pos = np.zeros(len(points), dtype=np.int64)
            known = np.zeros(len(points), dtype=bool)
        else:
            pos = np.searchsorted(self._points, points)
            known = self._points[np.minimum(pos, len(self._points) - 1)] == points
        if strict and not known.all():
            raise _unknown_error([chr(p) for p in points[~known].tolist()], self.kind)
        return np.where(known, pos + 1, 0).astype(np.int64)

    def unknown_tokens(self, text: str | bytes) -> list[str]:
        return [c for c in dict.fromkeys(_as_text(text)) if c not in self.index]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        texts = self._texts
        return "".join([texts[i] for i in _id_list(ids, len(self), self.kind)])

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "kind": self.kind, "symbols": list(self.symbols[1:])}


class ByteVocab(Vocab):
    """The 256 byte values; text is encoded as UTF-8, decoded with errors="replace"."""

    kind = "byte"

    def __len__(self) -> int:
        return 256

    def encode(self, text: str | bytes, *, strict: bool = False) -> np.ndarray:
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        return np.frombuffer(data, dtype=np.uint8).astype(np.int64)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        arr = _ids_array(ids)
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise ValueError("byte ids must be in 0..255")
        return arr.astype(np.uint8).tobytes().decode("utf-8", errors="replace")

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "kind": self.kind}


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(
            "BPE vocabularies need Hugging Face `tokenizers`: pip install 'transformer-xl[bpe]'"
        ) from None
    return tokenizers


class BPEVocab(Vocab):
    """Byte-level BPE (GPT-2 style) trained and run by Hugging Face `tokenizers`.
    Every byte is in the alphabet, so there is no `<unk>`."""

    kind = "bpe"

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer

    @classmethod
    def build(cls, text: str, *, vocab_size: int = 8000) -> BPEVocab:
        tk = _tokenizers()
        tok = tk.Tokenizer(tk.models.BPE())
        tok.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tk.decoders.ByteLevel()
        trainer = tk.trainers.BpeTrainer(
            vocab_size=vocab_size,
            initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train_from_iterator(_chunks(text), trainer=trainer)
        return cls(tok)

    @classmethod
    def from_json(cls, data: str) -> BPEVocab:
        return cls(_tokenizers().Tokenizer.from_str(data))

    def __len__(self) -> int:
        return int(self._tok.get_vocab_size())

    def encode(self, text: str | bytes, *, strict: bool = False) -> np.ndarray:
        encs = self._tok.encode_batch(list(_chunks(_as_text(text))))
        ids = [i for e in encs for i in e.ids]
        return np.asarray(ids, dtype=np.int64)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        return str(self._tok.decode(_ids_array(ids).tolist(), skip_special_tokens=False))

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT_VERSION, "kind": self.kind, "tokenizer": self._tok.to_str()}


def _chunks(text: str, size: int = 1 << 16) -> Iterator[str]:
    """Pieces of `text` of about `size` characters, cut after a newline so that they concatenate
    back to `text` (each piece is encoded independently)."""
    start = 0
    while start < len(text):
        end = text.find("\n", start + size)
        end = len(text) if end == -1 else end + 1
        yield text[start:end]
        start = end


def vocab_from_dict(d: dict[str, Any]) -> Vocab:
    """Rebuild a vocabulary from `Vocab.to_dict()`."""
    kind = d.get("kind")
    if d.get("format", FORMAT_VERSION) != FORMAT_VERSION:
        raise ValueError(f"unsupported vocabulary format {d.get('format')!r} (expected {FORMAT_VERSION})")
    if kind == "word":
        return WordVocab(
            d["symbols"],
            tokenizer=d["tokenizer"],
            eos_per_line=bool(d["eos_per_line"]),
            as_given=bool(d.get("as_given", False)),
        )
    if kind == "char":
        return CharVocab(d["symbols"])
    if kind == "byte":
        return ByteVocab()
    if kind == "bpe":
        return BPEVocab.from_json(d["tokenizer"])
    raise ValueError(f"unknown vocabulary kind {kind!r}; expected word, char, byte or bpe")


def load_vocab(path: str | os.PathLike[str]) -> Vocab:
    """Read a vocabulary written by `Vocab.save`."""
    try:
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as err:
        raise CorpusError(f"cannot read vocabulary {path}: {err}") from None
    try:
        return vocab_from_dict(d)
    except (KeyError, TypeError, ValueError) as err:
        raise CorpusError(f"{path}: not a valid txl vocabulary ({type(err).__name__}: {err})") from None


def build_vocab(
    kind: str,
    corpus: Corpus,
    *,
    min_freq: int = 1,
    max_size: int | None = None,
    bpe_vocab_size: int = 8000,
    tokenizer: str | None = None,
) -> Vocab:
    """Build a vocabulary of `kind` ("word", "char", "byte", "bpe") from the corpus's train split.

    The word tokenizer defaults to "whitespace" for pre-tokenized corpora (those with
    `eos_per_line`, i.e. WikiText and PTB) and "regex" otherwise. A byte vocabulary needs no data.
    """
    if kind == "byte":
        return ByteVocab()
    if kind not in ("word", "char", "bpe"):
        raise ValueError(f"unknown vocabulary kind {kind!r}; expected word, char, byte or bpe")
    if not corpus.has("train"):
        present = ", ".join(sorted(corpus.splits)) or "none"
        raise CorpusError(
            f"cannot build a {kind} vocabulary: corpus '{corpus.name}' has no train split "
            f"(present: {present}); add the train file or use a byte vocabulary"
        )
    text = corpus.text("train")
    if kind == "word":
        tok = tokenizer or ("whitespace" if corpus.eos_per_line else "regex")
        return WordVocab.build(
            text, min_freq=min_freq, max_size=max_size, tokenizer=tok, eos_per_line=corpus.eos_per_line
        )
    if kind == "char":
        return CharVocab.build(text)
    return BPEVocab.build(text, vocab_size=bpe_vocab_size)


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
