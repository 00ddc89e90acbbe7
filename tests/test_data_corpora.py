"""Corpus loading: real corpora (skipped when absent), plain paths, and bad-input errors."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from txl.data import CORPUS_NAMES, CorpusError, data_search_dirs, load_corpus
from txl.data.corpora import STDLIB_EXCLUDED_DIRS, strip_gutenberg


def test_corpus_names_are_the_agreed_ones():
    assert CORPUS_NAMES == (
        "tinyshakespeare",
        "books",
        "wikitext-2",
        "wikitext-103",
        "enwik8",
        "text8",
        "ptb",
        "python-stdlib",
    )


def test_search_dirs_env_then_xdg_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("TXL_DATA_DIR", os.pathsep.join([str(tmp_path / "a"), "", str(tmp_path / "b")]))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data_search_dirs() == [tmp_path / "a", tmp_path / "b", tmp_path / "xdg" / "txl"]
    monkeypatch.delenv("TXL_DATA_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert data_search_dirs() == [Path.home() / ".cache" / "txl"]


def test_env_var_is_used_to_find_named_corpora(monkeypatch, tmp_path):
    (tmp_path / "ptb").mkdir()
    (tmp_path / "ptb" / "ptb.valid.txt").write_text("a b\n")
    monkeypatch.setenv("TXL_DATA_DIR", os.pathsep.join([str(tmp_path / "nothing"), str(tmp_path)]))
    c = load_corpus("ptb")
    assert c.splits == {"valid": b"a b\n"}


# -- real corpora ---------------------------------------------------------------------------------


def test_tinyshakespeare_90_10_like_nanogpt(shared_corpus):
    root = shared_corpus("tinyshakespeare")
    c = load_corpus("tinyshakespeare", data_dir=root)
    assert (len(c.text("train")), len(c.text("valid"))) == (1_003_854, 111_540)
    assert not c.has("test") and c.level == "char" and not c.eos_per_line
    assert c.splits["train"] + c.splits["valid"] == (root / "tinyshakespeare" / "input.txt").read_bytes()


def test_wikitext2_without_train_loads_and_reports_absence_when_needed(shared_corpus):
    c = load_corpus("wikitext-2", data_dir=shared_corpus("wikitext-2"))
    assert set(c.splits) == {"valid", "test"}
    assert c.level == "word" and c.eos_per_line
    assert c.text("valid").startswith(" \n = Homarus gammarus = \n")
    with pytest.raises(CorpusError, match=r"no 'train' split.*txl data download wikitext-2"):
        c.require("train")


def test_books_split_by_novel_and_gutenberg_stripped(shared_corpus):
    root = shared_corpus("books")
    c = load_corpus("books", data_dir=root)
    names = {s: [Path(p).name for p in c.sources[s]] for s in c.sources}
    assert names["valid"] == ["emma.txt"]
    assert names["test"] == ["the_last_of_the_mohicans.txt"]
    assert names["train"] == sorted(
        p.name
        for p in (root / "books").glob("*.txt")
        if p.name not in ("emma.txt", "the_last_of_the_mohicans.txt")
    )
    assert len(names["train"]) == 6
    assert c.level == "word" and not c.eos_per_line
    train = c.text("train")
    assert "\r" not in train and all(b"\r" not in v for v in c.splits.values())
    assert "PROJECT GUTENBERG EBOOK" not in train  # START/END lines gone
    assert "Project Gutenberg Literary Archive Foundation" not in train  # licence footer gone
    assert "Well, Prince, so Genoa and Lucca are now just family estates" in train  # body kept
    assert train.count("Chancery") > 10  # Bleak House is there too


def test_python_stdlib_is_offline_and_has_three_splits():
    c = load_corpus("python-stdlib")
    assert set(c.splits) == {"train", "valid", "test"}
    assert all(len(v) > 10_000 for v in c.splits.values())
    assert c.level == "byte"
    n = {s: len(f) for s, f in c.sources.items()}
    assert n["train"] > 8 * n["valid"] and n["train"] > 8 * n["test"]  # ~90/5/5 by file
    for files in c.sources.values():
        assert list(files) == sorted(files)
        for f in files:
            assert f.endswith(".py")
            assert not STDLIB_EXCLUDED_DIRS & set(Path(f).parts)
    assert load_corpus("python-stdlib").fingerprint == c.fingerprint


# -- plain paths ----------------------------------------------------------------------------------


def test_single_file_splits_90_5_5_at_line_ends(tmp_path):
    lines = [f"line {i} " + "x" * (i % 13) + "\n" for i in range(2000)]
    data = "".join(lines).encode()
    (tmp_path / "f.txt").write_bytes(data)
    c = load_corpus(str(tmp_path / "f.txt"))
    assert c.splits["train"] + c.splits["valid"] + c.splits["test"] == data
    for s in ("train", "valid"):
        assert c.splits[s].endswith(b"\n")
    n = len(data)
    assert abs(len(c.splits["train"]) - 0.9 * n) < 100
    assert abs(len(c.splits["valid"]) - 0.05 * n) < 100
    assert c.level == "char" and c.name == "f.txt"


def test_folder_with_split_files(tmp_path):
    for s in ("train", "valid", "test"):
        (tmp_path / f"{s}.txt").write_text(f"{s} text\n")
    c = load_corpus(str(tmp_path))
    assert {k: v.decode() for k, v in c.splits.items()} == {
        s: f"{s} text\n" for s in ("train", "valid", "test")
    }
    other = tmp_path / "o"
    other.mkdir()
    (other / "wiki.train.tokens").write_text("t\n")
    (other / "wiki.valid.tokens").write_text("v\n")
    c = load_corpus(str(other))
    assert c.splits == {"train": b"t\n", "valid": b"v\n"}


def test_folder_of_files_split_deterministically_by_file(tmp_path):
    for i in range(60):
        (tmp_path / f"doc{i:02d}.txt").write_text(f"document {i}\n")
    (tmp_path / ".hidden").write_text("not me\n")
    a, b = load_corpus(str(tmp_path)), load_corpus(str(tmp_path))
    assert a.fingerprint == b.fingerprint and a.sources == b.sources
    files = sorted(f for fs in a.sources.values() for f in fs)
    assert files == sorted(str(p) for p in tmp_path.glob("doc*.txt"))
    assert len(a.sources["train"]) > 40
    joined = b"".join(a.splits.values())
    assert joined.count(b"document") == 60 and b"not me" not in joined


def test_fingerprint_follows_content(tmp_path):
    p = tmp_path / "f.txt"
    p.write_text("hello\n" * 100)
    f1 = load_corpus(str(p)).fingerprint
    p.write_text("hellO\n" * 100)
    assert load_corpus(str(p)).fingerprint != f1


def test_strip_gutenberg():
    raw = (
        b"Title\r\n*** START OF THIS PROJECT GUTENBERG EBOOK X ***\r\n\r\nBody one.\r\nBody two.\r\n"
        b"*** END OF THIS PROJECT GUTENBERG EBOOK X ***\r\nLicence\r\n"
    )
    assert strip_gutenberg(raw) == b"Body one.\nBody two.\n"
    assert strip_gutenberg(b"No header\r\nat all\r\n") == b"No header\nat all\n"


# -- errors ---------------------------------------------------------------------------------------


def test_missing_downloadable_corpus_lists_dirs_and_suggests_download(tmp_path):
    with pytest.raises(CorpusError) as err:
        load_corpus("wikitext-103", data_dir=tmp_path)
    msg = str(err.value)
    assert str(tmp_path / "wikitext-103") in msg and "txl data download wikitext-103" in msg
    assert "\n" not in msg


def test_missing_books_does_not_suggest_download(tmp_path):
    with pytest.raises(CorpusError, match="not found") as err:
        load_corpus("books", data_dir=tmp_path)
    assert "download" not in str(err.value)


def test_empty_files_are_errors(tmp_path):
    (tmp_path / "empty.txt").write_bytes(b"")
    with pytest.raises(CorpusError, match=r"empty\.txt is empty"):
        load_corpus(str(tmp_path / "empty.txt"))
    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_bytes(b"")
    with pytest.raises(CorpusError, match="input.txt is empty"):
        load_corpus("tinyshakespeare", data_dir=tmp_path)
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.txt").write_bytes(b"")
    with pytest.raises(CorpusError, match="empty"):
        load_corpus(str(tmp_path / "folder"))


def test_bad_paths_and_names(tmp_path):
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(str(tmp_path / "nope.txt"))
    with pytest.raises(CorpusError, match="unknown corpus 'shakespear'"):
        load_corpus("shakespear")


def test_non_utf8_text_names_file_and_offset(tmp_path):
    (tmp_path / "ptb").mkdir()
    bad = tmp_path / "ptb" / "ptb.valid.txt"
    bad.write_bytes(b"good line\nbad \xff here\n")
    c = load_corpus("ptb", data_dir=tmp_path)
    with pytest.raises(CorpusError) as err:
        c.text("valid")
    assert str(bad) in str(err.value) and "byte offset 14" in str(err.value)


def test_data_list_names_every_corpus_a_config_accepts(capsys):
    from txl.cli import main

    assert main(["data", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["corpora"] == list(CORPUS_NAMES)
    assert listed["generated"] == ["synthetic-recall"]
    for name in listed["generated"]:  # generated in memory: loads with no data folder at all
        assert load_corpus(name, data_dir=Path("/nonexistent")).splits["train"]
    with pytest.raises(CorpusError, match="synthetic-recall"):  # the error lists it among the known names
        load_corpus("no-such-corpus")
