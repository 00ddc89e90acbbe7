"""What a user reads: the messages of ``txl`` that must not mislead (an existing file given as a run folder,
advice that does not fit the command, the vocabulary size a run really has, a checkpoint of a newer format,
PyTorch's unsafe advice), ``txl data list`` saying which corpora this machine has, a resumed run saying
where it resumes."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import torch

from conftest import run_config, write_text_corpus
from txl.cli import main
from txl.train.trainer import train


def _error(capsys, argv: list[str]) -> str:
    """The one error line of a command that fails."""
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("txl: error: "), captured
    return lines[0]


def test_an_existing_file_given_as_a_run_folder_is_called_a_file(tmp_path, capsys):
    afile = tmp_path / "afile"
    afile.write_text("not a run\n")
    line = _error(capsys, ["eval", str(afile)])
    assert "not found" not in line and f"{afile} is a file, not a run folder" in line, line
    line = _error(capsys, ["train", "--resume", str(afile)])
    assert "not found" not in line and "not a folder" in line, line
    assert "run folder not found" in _error(capsys, ["eval", str(tmp_path / "none")])


def test_convert_onto_a_run_does_not_advise_training(trained_run, tmp_path, capsys):
    target = Path(shutil.copytree(trained_run, tmp_path / "x"))
    source = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, source)
    line = _error(capsys, ["convert", str(source), str(target), "--from", "original", "--mem-len", "8"])
    assert "already holds a run" in line and "--overwrite" in line and "txl train" not in line, line
    # txl train still advises resuming
    corpus = write_text_corpus(tmp_path / "c.txt")
    flags = ["--set", f"data.corpus={json.dumps(str(corpus))}", "--quiet"]
    line = _error(capsys, ["train", "--config", "tiny", "--out", str(target), *flags])
    assert (
        f"{target} already holds a run; use 'txl train --resume {target}' to continue it or --overwrite"
        in line
    )


def test_cutoffs_are_checked_against_the_vocabulary_the_data_gives(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("abcdefghij klmnop\n" * 400)
    flags = ["--set", f"data.corpus={json.dumps(str(corpus))}", "--set", 'data.vocab="char"']
    line = _error(
        capsys,
        [
            "train",
            "--config",
            "tiny",
            "--out",
            str(tmp_path / "r"),
            *flags,
            "--set",
            "model.cutoffs=[2000,10000]",
        ],
    )
    assert "model.cutoffs" in line and "256" not in line and "vocab_size=19" in line, line


def test_a_checkpoint_of_a_newer_format_says_so(trained_run_copy, capsys):
    for meta in (trained_run_copy / "checkpoints").glob("*/state.json"):
        document = json.loads(meta.read_text())
        document["format"] = 7
        meta.write_text(json.dumps(document))
    line = _error(capsys, ["eval", str(trained_run_copy), "--quiet"])
    assert "format 7" in line and "reads format 1" in line and "newer" in line, line


def test_convert_never_passes_on_pytorchs_unsafe_advice(tmp_path, capsys):
    pickled = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(2), "args": argparse.Namespace(lr=1.0)}, pickled)
    vocab = tmp_path / "vocab.json"
    vocab.write_text('["a", "b"]')
    argv = ["convert", str(pickled), str(tmp_path / "out"), "--from", "original", "--mem-len", "8"]
    line = _error(capsys, [*argv, "--vocab", str(vocab)])
    assert "weights_only" not in line and "trust" not in line and "\x1b" not in line, line
    assert "tensors" in line and "state_dict" in line and "does not unpickle" in line, line
    from txl.errors import TxlError
    from txl.interop.checkpoints import read_hf_state

    hf = tmp_path / "hf"
    hf.mkdir()
    shutil.copy(pickled, hf / "pytorch_model.bin")
    try:
        read_hf_state(hf)
    except TxlError as exc:
        assert "weights_only" not in str(exc) and "does not unpickle" in str(exc), exc
    else:
        raise AssertionError("read a pickled object")


def test_data_list_says_which_corpora_are_here(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("TXL_DATA_DIR", str(tmp_path))
    (tmp_path / "ptb").mkdir()
    for split in ("train", "valid", "test"):
        (tmp_path / "ptb" / f"ptb.{split}.txt").write_text("a b c\n")
    assert main(["data", "list"]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line[:1].strip()}
    assert "present" in rows["ptb"] and str(tmp_path / "ptb") in rows["ptb"]
    assert "missing" in rows["wikitext-103"] and "txl data download wikitext-103" in rows["wikitext-103"]
    assert "present" in rows["python-stdlib"] and "generated" in rows["synthetic-recall"]
    assert main(["data", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["present"]["ptb"] == str(tmp_path / "ptb") and listed["present"]["wikitext-103"] is None


def test_a_resumed_run_says_from_which_step(tmp_path, capsys):
    corpus = write_text_corpus(tmp_path / "c.txt")
    run = tmp_path / "run"
    train(run_config(corpus, "train.steps=4", "train.eval_every=0"), run, progress=False)
    assert main(["train", "--resume", str(run), "--set", "train.steps=6", "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"resuming {run} from step 4" in err, err
