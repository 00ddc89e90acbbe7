"""Bad input: a clear one-line error, a non-zero exit status, and nothing overwritten."""

from __future__ import annotations

import hashlib
import json
import sysconfig
from pathlib import Path

import pytest

from txl.cli import main

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture
def text_corpus(tmp_path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text((STDLIB / "textwrap.py").read_text(encoding="utf-8") * 3, encoding="utf-8")
    return path


@pytest.fixture
def trained_run(tmp_path, text_corpus, capsys) -> Path:
    run_dir = tmp_path / "run"
    assert main(["train", "--config", "tiny", "--out", str(run_dir), "--quiet", "--set",
                 f"data.corpus={json.dumps(str(text_corpus))}", "--set", "train.steps=10"]) == 0
    capsys.readouterr()
    return run_dir


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _fails(capsys, argv: list[str], *fragments: str) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code != 0, captured
    assert len(lines) == 1 and lines[0].startswith("txl: error: "), captured.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def _train_args(out: Path, corpus: str, *sets: str) -> list[str]:
    args = ["train", "--config", "tiny", "--out", str(out), "--quiet", "--set", f"data.corpus={json.dumps(corpus)}"]
    for item in sets:
        args += ["--set", item]
    return args


def test_missing_corpus(tmp_path, capsys):
    _fails(capsys, _train_args(tmp_path / "out", str(tmp_path / "nowhere.txt")), "nowhere.txt")
    _fails(capsys, _train_args(tmp_path / "out", "wikitext-103"), "wikitext-103")


def test_empty_corpus(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    _fails(capsys, _train_args(tmp_path / "out", str(empty)), "empty")


def test_split_shorter_than_one_segment(tmp_path, capsys):
    short = tmp_path / "short.txt"
    short.write_text("too short\n" * 4, encoding="utf-8")
    _fails(capsys, _train_args(tmp_path / "out", str(short)), "fewer than one segment")


def test_non_utf8_word_corpus(tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\u00e9 au lait\n".encode("latin-1") * 200)
    _fails(capsys, _train_args(tmp_path / "out", str(bad), "data.vocab=\"word\""), "UTF-8", "latin1.txt")


def test_unknown_preset_field_and_invalid_values(tmp_path, capsys, text_corpus):
    _fails(capsys, ["train", "--config", "no-such-preset", "--out", str(tmp_path / "o")], "no-such-preset", "tiny")
    _fails(capsys, _train_args(tmp_path / "o", str(text_corpus), "model.d_modle=64"), "model.d_modle")
    _fails(capsys, _train_args(tmp_path / "o", str(text_corpus), "optimizer.lr=1"), "optimizer")
    _fails(capsys, _train_args(tmp_path / "o", str(text_corpus), "model.d_model=33"), "model.d_model")
    _fails(capsys, _train_args(tmp_path / "o", str(text_corpus), "train.lr=-1"), "train.lr")
    _fails(capsys, _train_args(tmp_path / "o", str(text_corpus), "model.attention=\"sliding\""), "model.attention")
    _fails(capsys, _train_args(tmp_path / "o", str(text_corpus), "train.steps=many"), "train.steps")
    assert not (tmp_path / "o").exists()


def test_output_folder_with_another_run_is_refused(tmp_path, capsys, text_corpus, trained_run):
    before = _snapshot(trained_run)
    _fails(capsys, _train_args(trained_run, str(text_corpus), "train.steps=3"), "already holds a run", "--resume")
    assert _snapshot(trained_run) == before
    assert main(_train_args(trained_run, str(text_corpus), "train.steps=3") + ["--overwrite"]) == 0
    assert json.loads((trained_run / "summary.json").read_text())["steps"] == 3


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_damaged_checkpoint(trained_run, capsys, damage):
    for folder in (trained_run / "checkpoints").iterdir():
        weights = folder / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(b"\x00garbage" * 10 if damage == "corrupt" else data[: len(data) // 2])
    before = _snapshot(trained_run)
    _fails(capsys, ["eval", str(trained_run), "--quiet"], "model.safetensors")
    _fails(capsys, ["train", "--resume", str(trained_run), "--quiet", "--set", "train.steps=20"], "model.safetensors")
    assert _snapshot(trained_run) == before


def test_checkpoint_from_another_vocabulary(trained_run, capsys):
    vocab = json.loads((trained_run / "vocab.json").read_text())
    assert vocab["kind"] == "byte"
    other = {"format": 1, "kind": "char", "symbols": [chr(c) for c in range(32, 32 + 255)]}
    (trained_run / "vocab.json").write_text(json.dumps(other))
    _fails(capsys, ["eval", str(trained_run), "--quiet"])
    (trained_run / "vocab.json").write_text("{not json")
    _fails(capsys, ["eval", str(trained_run), "--quiet"], "vocab")
    (trained_run / "vocab.json").write_text(json.dumps(vocab))
    assert main(["eval", str(trained_run), "--quiet"]) == 0


def test_checkpoint_from_another_model_size(trained_run, capsys):
    config = json.loads((trained_run / "config.json").read_text())
    config["model"]["d_model"] = 64
    (trained_run / "config.json").write_text(json.dumps(config))
    _fails(capsys, ["eval", str(trained_run), "--quiet"], "another model size", "d_model")
    _fails(capsys, ["train", "--resume", str(trained_run), "--quiet", "--set", "train.steps=20"], "another model size")


def test_generate_with_unknown_prompt_tokens(tmp_path, capsys, text_corpus):
    run_dir = tmp_path / "charrun"
    assert main(_train_args(run_dir, str(text_corpus), "data.vocab=\"char\"", "train.steps=2")) == 0
    capsys.readouterr()
    _fails(capsys, ["generate", str(run_dir), "--prompt", "\u2603 snowman"], "\u2603")


def test_runs_that_do_not_exist(tmp_path, capsys):
    _fails(capsys, ["eval", str(tmp_path / "none")], "not found")
    (tmp_path / "empty").mkdir()
    _fails(capsys, ["train", "--resume", str(tmp_path / "empty")], "no run")
    _fails(capsys, ["train", "--config", "tiny"], "--out")


def test_resuming_a_finished_run_asks_for_more_steps(trained_run, capsys):
    before = _snapshot(trained_run)
    _fails(capsys, ["train", "--resume", str(trained_run), "--quiet"], "already finished 10 steps", "train.steps")
    assert _snapshot(trained_run) == before
    _fails(capsys, ["train", "--resume", str(trained_run), "--quiet", "--set", "model.d_model=64"], "model")
    assert main(["train", "--resume", str(trained_run), "--quiet", "--set", "train.steps=12"]) == 0
    assert json.loads(capsys.readouterr().out)["steps"] == 12
    finals = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in finals if r.get("final") and r["split"] == "valid"] == [12]
