"""Encoded splits on disk: the token ids of one corpus split under one vocabulary, memory-mapped ``.npy`` (the
cache key, the dtype), and where its documents begin. Reading corpora and encoding text are
:mod:`txl.data.corpora`'s and :mod:`txl.data.vocab`'s.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np

from ..files import atomic_open
from .corpora import Corpus, cache_root
from .vocab import Vocab

__all__ = [
    "CACHE_FORMAT",
    "DOCUMENTS_FORMAT",
    "default_cache_dir",
    "token_dtype",
    "cache_key",
    "cache_path",
    "encode_split",
    "encode_documents",
    "split_starts",
]

CACHE_FORMAT = 1
DOCUMENTS_FORMAT = 1
"""The format of a split encoded document by document (keyed apart from the format-1 files of whole splits,
so a cache written before documents were known is never read as one)."""


def default_cache_dir() -> Path:
    """`~/.cache/txl/encoded` (XDG aware)."""
    return cache_root() / "encoded"


def token_dtype(vocab_size: int) -> np.dtype:
    """The smallest unsigned integer dtype that holds ids 0..vocab_size-1."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if vocab_size - 1 <= np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.uint64)


def cache_key(corpus: Corpus, split: str, vocab: Vocab) -> str:
    """sha256 over (cache format, corpus fingerprint, split, vocabulary fingerprint), and for a split with
    documents also the documents format and their byte offsets."""
    key: list[object] = [CACHE_FORMAT, corpus.fingerprint, split, vocab.fingerprint]
    if split in corpus.documents:
        key += ["documents", DOCUMENTS_FORMAT, list(corpus.documents[split])]
    return hashlib.sha256(json.dumps(key).encode()).hexdigest()


def cache_path(corpus: Corpus, split: str, vocab: Vocab, *, cache_dir: Path | None = None) -> Path:
    """Where the encoded split of ``corpus`` for ``vocab`` is cached (under :func:`cache_key`)."""
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", corpus.name)[:64] or "corpus"
    key = cache_key(corpus, split, vocab)
    return Path(cache_dir or default_cache_dir()) / f"{safe}.{split}.{vocab.kind}.{key[:24]}.npy"


def _starts_path(path: Path) -> Path:
    return path.with_name(path.name[: -len(".npy")] + ".starts.npy")


def _encode(corpus: Corpus, split: str, vocab: Vocab) -> tuple[np.ndarray, np.ndarray | None]:
    """Ids of the split and (with documents) the index of each document's first token. A document is encoded
    on its own, so that its tokens are those it has when read alone; a document of no tokens begins none."""
    data = corpus.require(split)
    text = None if vocab.kind == "byte" else corpus.text(split)  # validates UTF-8, naming the file
    if split not in corpus.documents:
        return vocab.encode(data if text is None else text), None
    offsets = [*corpus.documents[split], len(data)]
    pieces = [data[a:b] for a, b in zip(offsets, offsets[1:], strict=False)]
    ids = [vocab.encode(p if text is None else p.decode("utf-8")) for p in pieces]
    lengths = np.array([len(i) for i in ids], dtype=np.int64)
    starts = (np.cumsum(lengths) - lengths)[lengths > 0]
    return (np.concatenate(ids) if ids else np.zeros(0, np.int64)), starts


def _load(path: Path) -> np.ndarray | None:
    if path.is_file():
        try:
            return np.load(path, mmap_mode="r")
        except (OSError, ValueError):  # a damaged cache file is rebuilt
            path.unlink(missing_ok=True)
    return None


def encode_documents(
    corpus: Corpus, split: str, vocab: Vocab, *, cache_dir: Path | None = None
) -> tuple[np.ndarray, np.ndarray | None]:
    """Token ids of `split` (1-D, read-only memory map of the smallest fitting unsigned dtype) and, for a
    corpus with documents, the token index where each begins (1-D int64, increasing, the first 0; None without
    documents). Encoded once and cached (the starts beside the ids, ``*.starts.npy``); a missing split raises
    CorpusError (from `Corpus.require`). Byte vocabularies encode raw bytes; the others decode the split as
    strict UTF-8 first."""
    corpus.require(split)
    path = cache_path(corpus, split, vocab, cache_dir=cache_dir)
    documents = split in corpus.documents
    ids = _load(path)
    starts = _load(_starts_path(path)) if documents else None
    if ids is not None and (starts is not None or not documents):
        return ids, None if starts is None else np.asarray(starts, dtype=np.int64)
    raw, starts = _encode(corpus, split, vocab)
    raw = raw.astype(token_dtype(len(vocab)))
    if raw.size == 0:  # nothing to map; an empty memory map cannot be opened
        raw.setflags(write=False)
        return raw, starts
    path.parent.mkdir(parents=True, exist_ok=True)
    if starts is not None:  # the starts first: ids without their starts are encoded again
        with atomic_open(_starts_path(path), "wb") as fh:
            np.save(fh, starts, allow_pickle=False)
    with atomic_open(path, "wb") as fh:
        np.save(fh, raw, allow_pickle=False)
    return np.load(path, mmap_mode="r"), starts


def encode_split(corpus: Corpus, split: str, vocab: Vocab, *, cache_dir: Path | None = None) -> np.ndarray:
    """Token ids of `split` (1-D, read-only memory map of the smallest fitting unsigned dtype): those of
    :func:`encode_documents`."""
    return encode_documents(corpus, split, vocab, cache_dir=cache_dir)[0]


def split_starts(
    corpus: Corpus, split: str, vocab: Vocab, *, cache_dir: Path | None = None
) -> np.ndarray | None:
    """The token index where each document of `split` begins (None for a corpus without documents): those of
    :func:`encode_documents`."""
    return encode_documents(corpus, split, vocab, cache_dir=cache_dir)[1]
