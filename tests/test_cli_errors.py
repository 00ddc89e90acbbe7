"""Bad input: a clear one-line error, a non-zero exit status, and nothing overwritten."""

from __future__ import annotations

import json
import math
import signal
import tomllib
from pathlib import Path

import pytest
import torch

import txl
from conftest import snapshot
from txl.cli import main
from txl.train import trainer


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
    args = [
        "train",
        "--config",
        "tiny",
        "--out",
        str(out),
        "--quiet",
        "--set",
        f"data.corpus={json.dumps(corpus)}",
    ]
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
    _fails(capsys, _train_args(tmp_path / "out", str(bad), 'data.vocab="word"'), "UTF-8", "latin1.txt")


def test_unknown_preset_field_and_invalid_values(tmp_path, capsys, text_corpus):
    _fails(
        capsys,
        ["train", "--config", "no-such-preset", "--out", str(tmp_path / "o")],
        "no-such-preset",
        "tiny",
    )
    _fails(capsys, _train_args(tmp_path / "o", str(text_corpus), "model.d_modle=64"), "model.d_modle")
    _fails(capsys, _train_args(tmp_path / "o", str(text_corpus), "optimizer.lr=1"), "optimizer")
    _fails(capsys, _train_args(tmp_path / "o", str(text_corpus), "model.d_model=33"), "model.d_model")
    _fails(capsys, _train_args(tmp_path / "o", str(text_corpus), "train.lr=-1"), "train.lr")
    _fails(
        capsys, _train_args(tmp_path / "o", str(text_corpus), 'model.attention="sliding"'), "model.attention"
    )
    _fails(capsys, _train_args(tmp_path / "o", str(text_corpus), "train.steps=many"), "train.steps")
    assert not (tmp_path / "o").exists()


def test_output_folder_with_another_run_is_refused(tmp_path, capsys, text_corpus, trained_run_copy):
    before = snapshot(trained_run_copy)
    _fails(
        capsys,
        _train_args(trained_run_copy, str(text_corpus), "train.steps=3"),
        "already holds a run",
        "--resume",
    )
    assert snapshot(trained_run_copy) == before
    assert main(_train_args(trained_run_copy, str(text_corpus), "train.steps=3") + ["--overwrite"]) == 0
    assert json.loads((trained_run_copy / "summary.json").read_text())["steps"] == 3


@pytest.mark.parametrize("damage", ["corrupt", "truncated"])
def test_damaged_checkpoint(trained_run_copy, capsys, damage):
    for folder in (trained_run_copy / "checkpoints").iterdir():
        weights = folder / "model.safetensors"
        data = weights.read_bytes()
        weights.write_bytes(b"\x00garbage" * 10 if damage == "corrupt" else data[: len(data) // 2])
    before = snapshot(trained_run_copy)
    _fails(capsys, ["eval", str(trained_run_copy), "--quiet"], "model.safetensors")
    _fails(
        capsys,
        ["train", "--resume", str(trained_run_copy), "--quiet", "--set", "train.steps=20"],
        "model.safetensors",
    )
    assert snapshot(trained_run_copy) == before


def test_checkpoint_from_another_vocabulary(trained_run_copy, capsys):
    vocab = json.loads((trained_run_copy / "vocab.json").read_text())
    assert vocab["kind"] == "byte"
    other = {"format": 1, "kind": "char", "symbols": [chr(c) for c in range(32, 32 + 255)]}
    (trained_run_copy / "vocab.json").write_text(json.dumps(other))
    _fails(capsys, ["eval", str(trained_run_copy), "--quiet"])
    (trained_run_copy / "vocab.json").write_text("{not json")
    _fails(capsys, ["eval", str(trained_run_copy), "--quiet"], "vocab")
    (trained_run_copy / "vocab.json").write_text(json.dumps(vocab))
    assert main(["eval", str(trained_run_copy), "--quiet"]) == 0


def test_checkpoint_from_another_model_size(trained_run_copy, capsys):
    config = json.loads((trained_run_copy / "config.json").read_text())
    config["model"]["d_model"] = 64
    (trained_run_copy / "config.json").write_text(json.dumps(config))
    _fails(capsys, ["eval", str(trained_run_copy), "--quiet"], "another model size", "d_model")
    _fails(
        capsys,
        ["train", "--resume", str(trained_run_copy), "--quiet", "--set", "train.steps=20"],
        "another model size",
    )


def test_generate_with_unknown_prompt_tokens(tmp_path, capsys, text_corpus):
    run_dir = tmp_path / "charrun"
    assert main(_train_args(run_dir, str(text_corpus), 'data.vocab="char"', "train.steps=2")) == 0
    capsys.readouterr()
    _fails(capsys, ["generate", str(run_dir), "--prompt", "\u2603 snowman"], "\u2603")


def test_runs_that_do_not_exist(tmp_path, capsys):
    _fails(capsys, ["eval", str(tmp_path / "none")], "not found")
    (tmp_path / "empty").mkdir()
    _fails(capsys, ["train", "--resume", str(tmp_path / "empty")], "no run")
    _fails(capsys, ["train", "--config", "tiny"], "--out")


def test_resuming_a_finished_run_asks_for_more_steps(trained_run_copy, capsys):
    before = snapshot(trained_run_copy)
    _fails(
        capsys,
        ["train", "--resume", str(trained_run_copy), "--quiet"],
        "already finished 10 steps",
        "train.steps",
    )
    assert snapshot(trained_run_copy) == before
    _fails(
        capsys, ["train", "--resume", str(trained_run_copy), "--quiet", "--set", "model.d_model=64"], "model"
    )
    assert (
        main(["train", "--resume", str(trained_run_copy), "--quiet", "--json", "--set", "train.steps=12"])
        == 0
    )
    captured = capsys.readouterr()
    assert json.loads(captured.out)["steps"] == 12
    # The schedule changes under the resumed run: said in one line, not a Python warning with its source line
    assert captured.err.startswith(
        "txl: warning: resuming at step 10 with train.steps 10 -> 12: the learning rate"
    )
    assert captured.err.splitlines()[1:] == [f"resuming {trained_run_copy} from step 10 (step-00000010)"]
    finals = [json.loads(line) for line in (trained_run_copy / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in finals if r.get("final") and r["split"] == "valid"] == [12]


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (["eval", "RUN", "--tgt-len", "0"], "--tgt-len must be a positive integer, got 0"),
        (["eval", "RUN", "--batch-size", "0"], "--batch-size must be a positive integer, got 0"),
        (["eval", "RUN", "--max-tokens", "-5"], "--max-tokens must be a positive integer, got -5"),
        (["eval", "RUN", "--max-tokens", "0"], "--max-tokens must be a positive integer, got 0"),
        (["eval", "RUN", "--mem-len", "-1"], "--mem-len must be an integer >= 0, got -1"),
        (["eval", "RUN", "--clamp-len", "0"], "--clamp-len must be a positive integer, got 0"),
        (["eval", "RUN", "--tgt-len", "abc"], "--tgt-len must be a positive integer, got abc"),
        (["generate", "RUN", "--max-new-tokens", "-1"], "--max-new-tokens must be an integer >= 0, got -1"),
        (["generate", "RUN", "--top-k", "0"], "--top-k must be a positive integer, got 0"),
        (["generate", "RUN", "--top-p", "1.5"], "--top-p must be a number in (0, 1], got 1.5"),
        (["generate", "RUN", "--top-p", "nan"], "--top-p must be a number in (0, 1], got nan"),
        (
            ["generate", "RUN", "--temperature", "-1"],
            "--temperature must be a number >= 0 (0 is greedy), got -1",
        ),
        (["generate", "RUN", "--mem-len", "-1"], "--mem-len must be an integer >= 0, got -1"),
        (["demo", "--steps", "0"], "--steps must be a positive integer, got 0"),
        (["demo", "--minutes", "0"], "--minutes must be a positive number, got 0"),
    ],
)
def test_bad_flag_values_are_refused_naming_the_flag(tmp_path, capsys, argv, line):
    argv = [str(tmp_path / "run") if a == "RUN" else a for a in argv]
    assert _fails(capsys, argv) == f"txl: error: {line}"
    assert not (tmp_path / "run").exists()


def test_usage_errors_are_one_line(capsys):
    _fails(capsys, ["demo", "--steps", "3", "--minutes", "1"], "--minutes", "--steps")
    _fails(capsys, ["eval", "x", "--split", "dev"], "--split", "'txl eval --help'")
    _fails(capsys, [], "command")


def test_version_help_and_pyproject_agree(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out == f"txl {txl.__version__}\n"
    pyproject = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert pyproject["project"]["version"] == txl.__version__ == "0.1.0"
    for command in ("eval", "generate"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        assert "step-00001750" in capsys.readouterr().out


def test_no_new_tokens_prints_the_prompt_only(trained_run, capsys):
    assert main(["generate", str(trained_run), "--prompt", "def f", "--max-new-tokens", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.out == "def f\n" and captured.err == ""


def test_no_memory_turns_same_length_off_with_a_note(tmp_path, text_corpus, capsys):
    run_dir = tmp_path / "same"
    assert (
        main(
            _train_args(
                run_dir, str(text_corpus), "train.steps=2", "model.same_length=true", "eval.same_length=true"
            )
        )
        == 0
    )
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--quiet", "--json", "--mem-len", "0"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "txl: note: --mem-len 0: same_length turned off (it needs a memory)\n"
    record = json.loads(captured.out)
    assert record["mem_len"] == 0 and record["same_length"] is False and math.isfinite(record["loss"])
    assert main(["eval", str(run_dir), "--quiet", "--json", "--mem-len", "0", "--no-same-length"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and json.loads(captured.out)["loss"] == record["loss"]
    _fails(
        capsys,
        ["eval", str(run_dir), "--quiet", "--mem-len", "0", "--same-length"],
        "--same-length",
        "--mem-len 0",
    )
    assert (
        main(["generate", str(run_dir), "--mem-len", "0", "--max-new-tokens", "5", "--temperature", "0"]) == 0
    )
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "txl: note: --mem-len 0: same_length turned off (it needs a memory)"
    assert len(err) == 2 and err[1].startswith("txl: 5 tokens in")


def test_interrupted_run_is_reported_as_a_note(tmp_path, monkeypatch, capsys):
    message = f"SIGTERM at step 12: checkpoint saved; continue with 'resume {tmp_path}'"

    def interrupted(*args, **kwargs):
        raise trainer.Interrupted(message, signum=signal.SIGTERM)

    monkeypatch.setattr(trainer, "train", interrupted)
    assert main(["train", "--config", "tiny", "--out", str(tmp_path), "--quiet"]) == 128 + signal.SIGTERM
    note = f"SIGTERM at step 12: checkpoint saved; continue with 'txl train --resume {tmp_path}'"
    assert capsys.readouterr().err == f"txl: note: {note}\n"


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_unavailable_device_names_the_flag(trained_run, text_corpus, tmp_path, capsys):
    for command in ("eval", "generate"):
        assert (
            _fails(capsys, [command, str(trained_run), "--device", "cuda"])
            == "txl: error: --device cuda: CUDA is not available on this machine"
        )
    _fails(capsys, ["eval", str(trained_run), "--device", "gpu0"], "--device gpu0")
    _fails(
        capsys,
        _train_args(tmp_path / "cuda", str(text_corpus), 'train.device="cuda"'),
        "train.device: CUDA is not available",
    )


def test_generate_reads_unknown_words_as_unk_with_a_warning(tmp_path, capsys, text_corpus):
    run_dir = tmp_path / "wordrun"
    assert main(_train_args(run_dir, str(text_corpus), 'data.vocab="word"', "train.steps=2")) == 0
    capsys.readouterr()
    assert (
        main(["generate", str(run_dir), "--prompt", "import zzyzx textwrap qwxq", "--max-new-tokens", "3"])
        == 0
    )
    captured = capsys.readouterr()
    assert captured.out.startswith(
        "import <unk> textwrap <unk> "
    )  # the prompt as the model reads it, new words
    err = captured.err.splitlines()
    assert err[0] == "txl: warning: 2 prompt word(s) not in the vocabulary, read as <unk>: 'zzyzx', 'qwxq'"
    assert len(err) == 2 and err[1].startswith("txl: 3 tokens in")
    # Words are spaced as one text: what is printed is the vocabulary's decoding of prompt and new ids together,
    # streamed or not, with the warning once for two samples
    from txl.runs import load_run

    vocab = load_run(run_dir).vocab
    argv = [
        "generate",
        str(run_dir),
        "--prompt",
        "import zzyzx textwrap",
        "--max-new-tokens",
        "6",
        "--greedy",
    ]
    assert main(argv) == 0
    plain = capsys.readouterr().out
    new_words = plain.split()[3:]
    assert (
        len(new_words) >= 1
        and plain == vocab.decode(vocab.encode("import zzyzx textwrap " + " ".join(new_words))) + "\n"
    )
    assert main([*argv, "--stream", "--num-samples", "2"]) == 0
    captured = capsys.readouterr()
    samples = captured.out.split("=== sample 2/2 ===\n")
    assert samples[0] == "=== sample 1/2 ===\n" + plain and samples[1] == plain
    assert captured.err.count("txl: warning:") == 1


def test_eval_sizes_its_batch_by_the_rows_the_data_fills(trained_run, capsys, monkeypatch):
    """``--batch-size 1000000 --max-tokens 500``: 500 targets fill 500 rows of one target each, so the stream
    and the cache are built with 500 rows (not a million) and the figures are those of ``--batch-size 500``."""
    import txl.evaluation as evaluate

    built = []

    class Spy(evaluate.SegmentStream):
        def __init__(self, tokens, settings, **kwargs):
            built.append(settings.batch_size)
            super().__init__(tokens, settings, **kwargs)

    monkeypatch.setattr(evaluate, "SegmentStream", Spy)
    records = []
    for batch in ("1000000", "500", "7"):
        assert (
            main(
                ["eval", str(trained_run), "--batch-size", batch, "--max-tokens", "500", "--quiet", "--json"]
            )
            == 0
        )
        records.append(json.loads(capsys.readouterr().out))
    assert built == [500, 500, 7]
    huge, exact, seven = records
    assert huge["tokens"] == exact["tokens"] == seven["tokens"] == 500
    assert huge["loss"] == exact["loss"] and huge["batch_size"] == 1000000
    # rows of ceil(499 / 7) = 72 targets: 7 rows are filled; with 300 streams rows of 2 targets fill 250
    assert [evaluate.eval_rows(501, b) for b in (7, 300, 500, 10**6)] == [7, 250, 500, 500]
    assert evaluate.eval_rows(501, 300, world_size=4) == 252 and evaluate.eval_rows(3, 10**6) == 2


def test_eval_refuses_a_batch_that_cannot_fit_with_one_line(trained_run, capsys, monkeypatch):
    import txl.evaluation as evaluate

    config = txl.TransformerXLConfig(vocab_size=100, n_layer=2, n_head=2, d_head=8, d_model=16, d_inner=32)
    model = txl.TransformerXL(config)
    # 2 x 10 x 30 x (16 + 32) + 2 x 10 x 2 x 20 x 30 + 10 x 20 x 100 floats = 72,800 floats = 291,200 bytes
    sizes = dict(rows=10, steps=20, mem_len=10, cached=False)
    asked = evaluate.EvalSettings(batch_size=12, tgt_len=20)
    monkeypatch.setattr(txl.limits, "available_bytes", lambda device="cpu": 291_200)
    evaluate.check_eval_fits(model, asked, **sizes)
    monkeypatch.setattr(txl.limits, "available_bytes", lambda device="cpu": 291_199)
    with pytest.raises(
        txl.errors.TxlError,
        match=r"^batch_size 12 \(10 rows filled\) tgt_len 20 mem_len 10: .*lower batch_size",
    ):
        evaluate.check_eval_fits(model, asked, **sizes)
    monkeypatch.setattr(txl.limits, "available_bytes", lambda device="cpu": 2**20)
    before = snapshot(trained_run)
    line = _fails(capsys, ["eval", str(trained_run), "--batch-size", "1000000", "--quiet"], "--batch-size")
    assert "1 MiB is available on cpu; lower --batch-size" in line
    assert snapshot(trained_run) == before
