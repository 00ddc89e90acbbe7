"""A run's data, ready to use: its corpus loaded, its vocabulary built (or the run's own reused), its splits
encoded (memory-mapped from the cache) with their document starts. What the splits are used for is the
caller's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..config import ConfigError, DataConfig
from .corpora import Corpus, load_corpus
from .encoded import encode_documents
from .vocab import Vocab, build_vocab

__all__ = ["PreparedData", "prepare_data", "check_documents", "SPLITS"]

SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class PreparedData:
    """A corpus, its vocabulary and the encoded splits (1-D token ids, memory-mapped), by split name.
    ``starts``: for a corpus with documents, the token index where each document of a split begins (1-D int64,
    increasing, the first 0), by split name; empty for a corpus without (:attr:`Corpus.documents`)."""

    corpus: Corpus
    vocab: Vocab
    splits: dict[str, np.ndarray]
    starts: dict[str, np.ndarray] = field(default_factory=dict)


def check_documents(corpus: Corpus, documents: str, *, name: str = "data.documents") -> None:
    """Refuse ``documents="reset"`` on a corpus that does not say where its documents begin (ConfigError
    naming the setting ``name``)."""
    if documents == "reset" and not corpus.has_documents:
        raise ConfigError(
            f"{name}: 'reset' needs a corpus with document boundaries, and corpus '{corpus.name}' has none "
            "(a single text file is one document); use 'continue', or a corpus of documents (books, "
            "python-stdlib, WikiText, a folder of files, a .jsonl file)",
            fields=(name,),
        )


def prepare_data(
    config: DataConfig, *, vocab: Vocab | None = None, splits: Sequence[str] | None = None
) -> PreparedData:
    """Load the corpus of ``config``, build the vocabulary (or use ``vocab``, a run's own) and encode
    ``splits``: each one named must exist (CorpusError otherwise); None encodes every split the corpus has.
    ``data.documents = "reset"`` on a corpus without documents is a ConfigError (:func:`check_documents`)."""
    corpus = load_corpus(
        config.corpus,
        data_dir=Path(config.data_dir) if config.data_dir else None,
        text_field=config.text_field,
    )
    check_documents(corpus, config.documents)
    if vocab is None:
        vocab = build_vocab(
            config.vocab or corpus.level,
            corpus,
            min_freq=config.min_freq,
            max_size=config.max_size,
            bpe_vocab_size=config.bpe_vocab_size,
            tokenizer=config.tokenizer,
        )
    cache_dir = Path(config.cache_dir) if config.cache_dir else None
    names = [s for s in SPLITS if corpus.has(s)] if splits is None else list(splits)
    encoded = {s: encode_documents(corpus, s, vocab, cache_dir=cache_dir) for s in names}
    return PreparedData(
        corpus,
        vocab,
        splits={s: ids for s, (ids, _) in encoded.items()},
        starts={s: starts for s, (_, starts) in encoded.items() if starts is not None},
    )
