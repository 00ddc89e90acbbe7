"""Encoded splits on disk: token ids of one corpus split under one vocabulary, as memory-mapped `.npy` (a
cache of the encoding, kept next to the data; named for what it holds, apart from ``model/cache.py``).

Owns the cache key and the dtype choice; files are written with :func:`txl.files.atomic_open`. Reading corpora and encoding text are left to
`corpora.py` and `vocab.py`.
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
    "default_cache_dir",
    "token_dtype",
    "cache_key",
    "cache_path",
    "encode_split",
]

CACHE_FORMAT = 1


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
    """sha256 over (cache format, corpus fingerprint, split, vocabulary fingerprint)."""
    blob = json.dumps([CACHE_FORMAT, corpus.fingerprint, split, vocab.fingerprint])
    return hashlib.sha256(blob.encode()).hexdigest()


def cache_path(corpus: Corpus, split: str, vocab: Vocab, *, cache_dir: Path | None = None) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", corpus.name)[:64] or "corpus"
    key = cache_key(corpus, split, vocab)
    return Path(cache_dir or default_cache_dir()) / f"{safe}.{split}.{vocab.kind}.{key[:24]}.npy"


def encode_split(corpus: Corpus, split: str, vocab: Vocab, *, cache_dir: Path | None = None) -> np.ndarray:
    """Token ids of `split` (1-D, read-only memory map of the smallest fitting unsigned dtype).

    Encoded once and cached; a missing split raises CorpusError (from `Corpus.require`).
    Byte vocabularies encode raw bytes; the others decode the split as strict UTF-8 first.
    """
    data = corpus.require(split)
    path = cache_path(corpus, split, vocab, cache_dir=cache_dir)
    if path.is_file():
        try:
            return np.load(path, mmap_mode="r")
        except (OSError, ValueError):  # a damaged cache file is rebuilt
            path.unlink(missing_ok=True)
    ids = vocab.encode(data) if vocab.kind == "byte" else vocab.encode(corpus.text(split))
    ids = ids.astype(token_dtype(len(vocab)))
    if ids.size == 0:  # nothing to map; an empty memory map cannot be opened
        ids.setflags(write=False)
        return ids
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_open(path, "wb") as fh:
        np.save(fh, ids, allow_pickle=False)
    return np.load(path, mmap_mode="r")
