"""Hugging Face datasets as corpora, offline: a DatasetDict built here and saved with ``save_to_disk`` is read
as ``hf-disk:PATH`` (splits renamed, one line per row, the encoded-split cache used), trains and evaluates
from the CLI; ``hf:NAME`` with the hub unreachable fails with one clear line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from txl.cli import main
from txl.data import encode_split, load_corpus
from txl.data.corpora import CorpusError
from txl.data.vocab import WordVocab

datasets = pytest.importorskip(
    "datasets", reason="hf: corpora need Hugging Face datasets: pip install 'transformer-xl[datasets]'"
)

ROWS = {
    "train": ["", " = Valkyria Chronicles = \n", "", " the game is a tactical role @-@ playing game . \n"]
    * 30,
    "validation": ["", " the game began development in 2010 . \n"] * 10,
    "test": [" the music was composed by Hitoshi Sakimoto . \n", ""] * 10,
}


def _save(tmp_path, name="wikitext-tiny", field="text", rows=ROWS):
    data = datasets.DatasetDict(
        {
            split: datasets.Dataset.from_dict({field: r, "id": list(range(len(r)))})
            for split, r in rows.items()
        }
    )
    path = tmp_path / name
    data.save_to_disk(str(path))
    return path


def test_hf_disk_corpus_reads_splits_and_caches(tmp_path):
    path = _save(tmp_path)
    corpus = load_corpus(f"hf-disk:{path}")
    assert sorted(corpus.splits) == ["test", "train", "valid"]
    assert corpus.text("train") == "".join(r if r.endswith("\n") else r + "\n" for r in ROWS["train"])
    assert corpus.level == "word" and corpus.eos_per_line  # a WikiText dataset: words, <eos> per line
    vocab = WordVocab.build(corpus.text("train"), eos_per_line=True)
    cache = tmp_path / "cache"
    ids = encode_split(corpus, "valid", vocab, cache_dir=cache)
    assert len(ids) == 10 * (1 + 7 + 1)  # an empty row is one <eos>; a line is its words and <eos>
    assert any(cache.rglob("*.npy"))
    again = encode_split(load_corpus(f"hf-disk:{path}"), "valid", vocab, cache_dir=cache)
    assert (again == ids).all()
    assert load_corpus(f"hf-disk:{path}").fingerprint == corpus.fingerprint


def test_text_field_and_bad_folders(tmp_path):
    path = _save(tmp_path, name="notes", field="content")
    with pytest.raises(CorpusError, match="has no column 'text' .*content, id.*data.text_field"):
        load_corpus(f"hf-disk:{path}")
    corpus = load_corpus(f"hf-disk:{path}", text_field="content")
    assert corpus.level == "char" and not corpus.eos_per_line
    with pytest.raises(CorpusError, match="does not exist"):
        load_corpus(f"hf-disk:{tmp_path / 'missing'}")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="not a dataset saved with save_to_disk"):
        load_corpus(f"hf-disk:{tmp_path / 'empty'}")


def test_train_and_eval_on_an_hf_disk_corpus(tmp_path, capsys):
    path = _save(tmp_path, name="notes", field="content")
    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            "--config",
            "tiny",
            "--out",
            str(run_dir),
            "--quiet",
            "--set",
            f"data.corpus={json.dumps(f'hf-disk:{path}')}",
            "--set",
            'data.text_field="content"',
            "--set",
            "train.steps=2",
            "--set",
            "train.tgt_len=8",
            "--set",
            "train.batch_size=2",
            "--set",
            f"data.cache_dir={json.dumps(str(tmp_path / 'cache'))}",
        ]
    )
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--split", "test", "--quiet", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["tokens"] > 0


def test_hub_unreachable_is_one_clear_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "txl",
            "train",
            "--config",
            "tiny",
            "--out",
            str(tmp_path / "run"),
            "--quiet",
            "--set",
            'data.corpus="hf:txl-no-such-dataset:none"',
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("txl: error: cannot load the Hugging Face dataset 'txl-no-such-dataset:none'")
    assert "hub cannot be reached" in lines[0] and "hf-disk:PATH" in lines[0]
    assert not (tmp_path / "run").exists()


def test_without_datasets_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(CorpusError, match=r"pip install 'transformer-xl\[datasets\]'"):
        load_corpus("hf:wikitext:wikitext-2-raw-v1")
    with pytest.raises(CorpusError, match="expected hf:NAME"):
        monkeypatch.undo()
        load_corpus("hf:")
