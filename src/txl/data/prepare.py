"""A run's data, ready to use: its corpus loaded, its vocabulary built (or the run's own reused) and its
splits encoded (memory-mapped from the cache). What the splits are used for is left to the caller: the
trainer checks them against the training settings, ``txl eval`` reads one split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..config import DataConfig
from .corpora import Corpus, load_corpus
from .encoded import encode_split
from .vocab import Vocab, build_vocab

__all__ = ["PreparedData", "prepare_data", "SPLITS"]

SPLITS = ("train", "valid", "test")


@dataclass(frozen=True)
class PreparedData:
    """A corpus, its vocabulary and the encoded splits (1-D token ids, memory-mapped), by split name."""

    corpus: Corpus
    vocab: Vocab
    splits: dict[str, np.ndarray]


def prepare_data(
    config: DataConfig, *, vocab: Vocab | None = None, splits: Sequence[str] | None = None
) -> PreparedData:
    """Load the corpus of ``config``, build the vocabulary (or use ``vocab``, a run's own) and encode
    ``splits``: each one named must exist (CorpusError otherwise); None encodes every split the corpus has."""
    corpus = load_corpus(
        config.corpus,
        data_dir=Path(config.data_dir) if config.data_dir else None,
        text_field=config.text_field,
    )
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
    return PreparedData(
        corpus=corpus,
        vocab=vocab,
        splits={s: encode_split(corpus, s, vocab, cache_dir=cache_dir) for s in names},
    )
