"""Encoded-split cache: dtype choice, keying, reuse, atomic .npy files."""

from __future__ import annotations

import numpy as np
import pytest

from txl.data import ByteVocab, CharVocab, CorpusError, WordVocab, encode_split, load_corpus, token_dtype


@pytest.fixture
def corpus(tmp_path):
    d = tmp_path / "corpus"
    d.mkdir()
    (d / "train.txt").write_text("to be or not to be\n" * 50)
    (d / "valid.txt").write_text("to be is to do\n")
    return load_corpus(str(d))


def test_token_dtype_is_smallest_that_fits():
    assert token_dtype(2) == np.uint8 and token_dtype(256) == np.uint8
    assert token_dtype(257) == np.uint16 and token_dtype(65_536) == np.uint16
    assert token_dtype(65_537) == np.uint32


def test_encode_split_caches_and_reuses(tmp_path, corpus, monkeypatch):
    vocab = CharVocab.build(corpus.text("train"))
    cache = tmp_path / "cache"
    ids = encode_split(corpus, "valid", vocab, cache_dir=cache)
    assert isinstance(ids, np.memmap) and ids.dtype == np.uint8
    assert ids.tolist() == vocab.encode(corpus.text("valid")).tolist()
    files = list(cache.iterdir())
    assert len(files) == 1 and files[0].suffix == ".npy"  # no temp file left behind

    def boom(*args, **kwargs):
        raise AssertionError("encoded again instead of loading the cache")

    monkeypatch.setattr(vocab, "encode", boom)
    again = encode_split(corpus, "valid", vocab, cache_dir=cache)
    assert np.array_equal(again, ids)


def test_key_depends_on_split_vocab_and_content(tmp_path, corpus):
    cache = tmp_path / "cache"
    encode_split(corpus, "train", CharVocab.build(corpus.text("train")), cache_dir=cache)
    encode_split(corpus, "valid", CharVocab.build(corpus.text("train")), cache_dir=cache)
    encode_split(corpus, "valid", CharVocab.build(corpus.text("train") + "z"), cache_dir=cache)
    w = encode_split(corpus, "valid", WordVocab.build(corpus.text("train")), cache_dir=cache)
    assert len(list(cache.iterdir())) == 4
    assert w.dtype == np.uint8 and len(w) == 5


def test_wide_vocab_uses_uint16(tmp_path):
    words = " ".join(f"w{i}" for i in range(300))
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "train.txt").write_text(words)
    c = load_corpus(str(tmp_path / "f"))
    v = WordVocab.build(words)
    ids = encode_split(c, "train", v, cache_dir=tmp_path / "c")
    assert ids.dtype == np.uint16 and ids.max() == len(v) - 1


def test_byte_vocab_encodes_raw_bytes(tmp_path):
    (tmp_path / "f").mkdir()
    (tmp_path / "f" / "train.txt").write_bytes(b"ok \xff\xfe binary")
    c = load_corpus(str(tmp_path / "f"))
    ids = encode_split(c, "train", ByteVocab(), cache_dir=tmp_path / "c")
    assert bytes(ids.tolist()) == b"ok \xff\xfe binary"


def test_missing_split_raises(tmp_path, corpus):
    with pytest.raises(CorpusError, match="no 'test' split"):
        encode_split(corpus, "test", ByteVocab(), cache_dir=tmp_path / "c")
