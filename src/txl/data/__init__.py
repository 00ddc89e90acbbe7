"""txl.data: corpora, vocabularies, encoded-split cache, a run's prepared data, the ordered segment stream,
downloads."""

from .corpora import (
    CORPUS_NAMES,
    GENERATED_CORPUS_NAMES,
    Corpus,
    CorpusError,
    cache_root,
    data_search_dirs,
    load_corpus,
)
from .download import DOWNLOADS, DownloadSpec, RemoteFile, UnverifiedDownloadWarning, download_corpus
from .encoded import default_cache_dir, encode_documents, encode_split, split_starts, token_dtype
from .prepare import PreparedData, check_documents, prepare_data
from .stream import Batch, BatchSettings, SegmentStream
from .vocab import (
    BPEVocab,
    ByteVocab,
    CharVocab,
    Vocab,
    WordVocab,
    build_vocab,
    load_vocab,
    vocab_from_dict,
)

__all__ = [
    "CORPUS_NAMES",
    "GENERATED_CORPUS_NAMES",
    "DOWNLOADS",
    "BPEVocab",
    "Batch",
    "ByteVocab",
    "CharVocab",
    "Corpus",
    "CorpusError",
    "DownloadSpec",
    "PreparedData",
    "RemoteFile",
    "SegmentStream",
    "BatchSettings",
    "UnverifiedDownloadWarning",
    "Vocab",
    "WordVocab",
    "build_vocab",
    "check_documents",
    "cache_root",
    "data_search_dirs",
    "default_cache_dir",
    "download_corpus",
    "encode_documents",
    "encode_split",
    "load_corpus",
    "load_vocab",
    "prepare_data",
    "split_starts",
    "token_dtype",
    "vocab_from_dict",
]
