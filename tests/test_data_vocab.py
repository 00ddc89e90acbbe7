"""Vocabularies: encoding rules, round trips, strict mode, JSON persistence, and real-text counts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from txl.data import (
    BPEVocab,
    ByteVocab,
    CharVocab,
    CorpusError,
    WordVocab,
    build_vocab,
    load_corpus,
    load_vocab,
    vocab_from_dict,
)


def _corpus(tmp_path, files: dict[str, bytes]):
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return load_corpus(str(tmp_path))


def test_word_vocab_order_specials_and_limits():
    text = "b a c a b a d\n"
    v = WordVocab.build(text)
    assert v.symbols == ("<unk>", "<eos>", "a", "b", "c", "d")  # freq desc, then alphabetical
    assert (v.unk_id, v.eos_id) == (0, 1)
    assert WordVocab.build(text, min_freq=2).symbols == ("<unk>", "<eos>", "a", "b")
    assert WordVocab.build(text, max_size=3).symbols == ("<unk>", "<eos>", "a")
    assert WordVocab.build("x <unk> y <unk>\n").symbols == ("<unk>", "<eos>", "x", "y")


def test_word_eos_per_line_encode_decode():
    v = WordVocab.build("a b c", eos_per_line=True)
    ids = v.encode("a b\n\nc\n")
    assert ids.dtype == np.int64
    assert [v.symbols[i] for i in ids] == ["a", "b", "<eos>", "<eos>", "c", "<eos>"]
    assert v.decode(ids) == "a b\n\nc\n"
    assert v.encode("a zzz").tolist() == [v.index["a"], 0, 1]
    with pytest.raises(ValueError, match="'zzz'"):
        v.encode("a zzz", strict=True)


def test_regex_tokenizer_splits_punctuation():
    v = WordVocab.build("Hello, world!", tokenizer="regex")
    assert set(v.symbols[2:]) == {"Hello", ",", "world", "!"}
    assert v.decode(v.encode("world, Hello!")) == "world , Hello !"


def test_char_vocab():
    v = CharVocab.build("hello wörld")
    assert v.symbols[0] == "<unk>" and list(v.symbols[1:]) == sorted(set("hello wörld"))
    ids = v.encode("wörld hello")
    assert v.decode(ids) == "wörld hello"
    assert v.encode("hez").tolist()[-1] == 0 and v.decode(v.encode("z")) == "\ufffd"
    with pytest.raises(ValueError, match="'z'"):
        v.encode("hez", strict=True)
    assert v.encode(b"he").tolist() == v.encode("he").tolist()


def test_byte_vocab():
    v = ByteVocab()
    assert len(v) == 256 and v.unk_id is None and v.eos_id is None
    ids = v.encode("é!")
    assert ids.tolist() == [0xC3, 0xA9, 0x21] and v.decode(ids) == "é!"
    assert v.decode([0xFF, 0x41]) == "\ufffdA"
    assert v.encode(b"\xff").tolist() == [255]


def test_bpe_round_trip_and_persistence(tmp_path):
    text = ("the quick brown fox jumps over the lazy dog. " * 40 + "\n") * 20 + "naïve café ☃\n"
    v = BPEVocab.build(text, vocab_size=300)
    assert 256 < len(v) <= 300
    ids = v.encode(text)
    assert len(ids) < len(text.encode()) / 2  # merges happened
    assert v.decode(ids) == text
    v.save(tmp_path / "bpe.json")
    w = load_vocab(tmp_path / "bpe.json")
    assert isinstance(w, BPEVocab) and w.fingerprint == v.fingerprint
    assert w.encode("lazy fox ☃").tolist() == v.encode("lazy fox ☃").tolist()


@pytest.mark.parametrize(
    "vocab",
    [
        WordVocab.build("x y y\nz", tokenizer="regex", eos_per_line=True),
        CharVocab.build("abc"),
        ByteVocab(),
    ],
    ids=["word", "char", "byte"],
)
def test_save_load_round_trip(tmp_path, vocab):
    path = tmp_path / "sub" / "vocab.json"
    vocab.save(path)
    assert json.loads(path.read_text())["kind"] == vocab.kind
    assert [p.name for p in path.parent.iterdir()] == ["vocab.json"]  # no temp files left
    back = load_vocab(path)
    assert type(back) is type(vocab) and back.fingerprint == vocab.fingerprint and len(back) == len(vocab)
    assert back.encode("x y z\n").tolist() == vocab.encode("x y z\n").tolist()
    assert vocab_from_dict(vocab.to_dict()).fingerprint == vocab.fingerprint


def test_fingerprint_differs_between_vocabs():
    assert CharVocab.build("ab").fingerprint != CharVocab.build("abc").fingerprint
    a = WordVocab.build("a b", eos_per_line=True)
    assert a.fingerprint != WordVocab.build("a b", eos_per_line=False).fingerprint


def test_vocab_from_dict_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown vocabulary kind 'pickle'"):
        vocab_from_dict({"kind": "pickle"})


def test_build_vocab_kinds_and_defaults(tmp_path):
    c = _corpus(tmp_path, {"train.txt": b"Hi, there. Hi!\n", "valid.txt": b"Hi\n"})
    w = build_vocab("word", c)
    assert isinstance(w, WordVocab) and w.tokenizer == "regex" and not w.eos_per_line
    assert w.symbols[2] == "Hi"
    assert isinstance(build_vocab("char", c), CharVocab)
    assert isinstance(build_vocab("byte", c), ByteVocab)
    with pytest.raises(ValueError, match="unknown vocabulary kind"):
        build_vocab("morse", c)


def test_build_vocab_without_train_split(tmp_path):
    c = _corpus(tmp_path, {"valid.txt": b"a\n", "test.txt": b"b\n"})
    with pytest.raises(CorpusError, match="has no train split"):
        build_vocab("word", c)
    assert isinstance(build_vocab("byte", c), ByteVocab)  # needs no data


def test_word_vocab_on_non_utf8_names_file_and_offset(tmp_path):
    # a folder split by file: the bad byte is in the second train file, 6 bytes in
    for i in range(40):
        (tmp_path / f"f{i:02d}.txt").write_bytes(b"fine text\n")
    c0 = load_corpus(str(tmp_path))
    second = c0.sources["train"][1]
    with open(second, "wb") as f:
        f.write(b"fine \xfe\n")
    c = load_corpus(str(tmp_path))
    with pytest.raises(CorpusError) as err:
        build_vocab("word", c)
    msg = str(err.value)
    assert second in msg and "byte offset 5" in msg and "\n" not in msg


def test_wikitext2_valid_tokens_with_eos_per_line(shared_corpus):
    c = load_corpus("wikitext-2", data_dir=shared_corpus("wikitext-2"))
    text = c.text("valid")
    v = WordVocab.build(text, tokenizer="whitespace", eos_per_line=True)
    ids = v.encode(text)
    assert len(ids) == 217_646  # the canonical WikiText-2 valid size
    assert int((ids == v.eos_id).sum()) == 3_760  # one per line, empty lines included
    assert int((ids == v.unk_id).sum()) == 11_718  # the corpus's own <unk> tokens
    assert len(v) == 13_776 + 1  # its 13,776 types (<unk> among them) plus <eos>


def test_tinyshakespeare_char_vocab(shared_corpus):
    c = load_corpus("tinyshakespeare", data_dir=shared_corpus("tinyshakespeare"))
    v = build_vocab("char", c)
    assert len(v) == 65 + 1  # 65 characters plus <unk>
    ids = v.encode(c.text("valid")[:5000], strict=True)
    assert v.decode(ids) == c.text("valid")[:5000]


def test_unknown_tokens_and_which_vocabularies_read_them_as_unk():
    word = WordVocab.build("the cat sat\n", eos_per_line=True)
    assert word.unknown_tokens("the dog sat, the dog ran\n") == ["dog", "sat,", "ran"]  # distinct, in order
    assert word.unknown_tokens("the cat\n") == []
    char = CharVocab.build("abc")
    assert char.unknown_tokens("abzcyz") == ["z", "y"]
    assert ByteVocab().unknown_tokens("☃ anything") == []
    assert [v.unknown_as_unk for v in (word, char, ByteVocab())] == [True, False, False]
