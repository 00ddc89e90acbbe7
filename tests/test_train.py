"""Training end to end: the loop learns, checkpoints round-trip, a SIGKILLed run resumes onto the exact
loss trajectory of an uninterrupted one, SIGTERM saves and exits cleanly, NaN stops the run, evaluation with
a longer memory works from the CLI; memory is dropped when the stream wraps; resume honours or refuses each
override; a failed start leaves nothing; one process at a time trains in a run folder; checkpoints are found
by name and only complete ones are read."""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import STDLIB, run_config, snapshot, train_losses, write_documents_corpus
from txl import checkpoint as ckpt
from txl.checkpoint import ResumeWarning, TrainingState
from txl.cli import main
from txl.config import apply_overrides
from txl.data import prepare_data
from txl.errors import CheckpointError, RunError
from txl.model import TransformerXL
from txl.runs import latest_checkpoint, load_run
from txl.train.checks import train_stream
from txl.train.trainer import (
    Interrupted,
    Trainer,
    TrainingDiverged,
    resume,
    train,
)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = (
        str(Path(__file__).resolve().parents[1] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    )
    return env


def test_training_learns_and_writes_the_run(tmp_path, text_corpus):
    config = run_config(
        text_corpus, "train.steps=60", "train.eval_every=30", "train.log_every=10", "train.lr=5e-3"
    )
    summary = train(config, tmp_path / "run", progress=False)
    for key in (
        "best_val_loss",
        "val_loss",
        "val_ppl",
        "val_bits_per_token",
        "val_bpb",
        "test_loss",
        "steps",
        "tokens",
        "train_tokens_per_s",
        "params",
    ):
        assert key in summary, key
    assert summary["steps"] == 60 and summary["tokens"] == 60 * 4 * 16
    losses = train_losses(tmp_path / "run")
    assert losses[60] < losses[10] - 0.5  # it learns (byte entropy starts near ln 256 = 5.5)
    assert summary["val_loss"] < 4.0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in records} == {"train", "valid"}
    assert all({"step", "split", "loss"} <= r.keys() for r in records)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model"]["vocab_size"] == 256 and saved["train"]["steps"] == 60
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == json.loads(json.dumps(summary))


def test_checkpoint_round_trip_gives_identical_outputs(trained_run):
    run = load_run(trained_run, checkpoint="latest")
    again = load_run(trained_run, checkpoint="latest")
    tokens = torch.randint(0, 256, (2, 12))
    assert torch.equal(run.model(tokens).log_probs, again.model(tokens).log_probs)
    assert run.step == 10


@pytest.mark.slow
@pytest.mark.parametrize("documents", ["continue", "reset"])
def test_killed_run_resumes_on_the_same_loss_trajectory(tmp_path, text_corpus, documents):
    common = [
        'train.schedule="constant"',
        "train.log_every=1",
        "train.eval_every=0",
        "train.checkpoint_every=10",
        "train.batch_size=8",
        "train.tgt_len=32",
        "model.dropout=0.1",
        "train.varlen=true",
    ]
    if documents == "reset":  # a corpus of documents, the memory checkpointed with each row's reach
        text_corpus = write_documents_corpus(tmp_path / "docs")
        common += ["data.documents=reset", "model.mem_len=96"]
    reference = train(
        run_config(text_corpus, "train.steps=50", *common), tmp_path / "reference", progress=False
    )
    assert reference["steps"] == 50

    killed = tmp_path / "killed"
    cmd = [
        sys.executable,
        "-m",
        "txl",
        "train",
        "--config",
        "tiny",
        "--out",
        str(killed),
        "--quiet",
        "--set",
        f"data.corpus={json.dumps(str(text_corpus))}",
        "--set",
        "train.steps=100000",
    ]
    for item in common:
        cmd += ["--set", item]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    try:
        while time.time() < deadline:
            folder = latest_checkpoint(killed)
            if folder is not None and folder.name >= "step-00000020":
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.01)
        else:
            pytest.fail("the run did not reach its second checkpoint in time")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert train_losses(killed)  # it had logged steps (maybe beyond the checkpoint) before dying
    if documents == "reset":  # some row resumes inside a document that began within its memory
        reach = load_file(str(latest_checkpoint(killed) / "state.safetensors"))
        assert min(reach["memory.reach"].tolist()) < 96
    summary = resume(killed, overrides=("train.steps=50",), progress=False)
    assert summary["steps"] == 50
    assert train_losses(killed) == train_losses(tmp_path / "reference")  # identical floats, every step


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_saves_a_checkpoint_and_exits_cleanly(tmp_path, text_corpus, signum):
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "txl",
        "train",
        "--config",
        "tiny",
        "--out",
        str(out),
        "--quiet",
        "--set",
        f"data.corpus={json.dumps(str(text_corpus))}",
        "--set",
        "train.steps=100000",
        "--set",
        "train.checkpoint_every=100000",
        "--set",
        "train.eval_every=0",
        "--set",
        "train.log_every=1",
    ]
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() or len((out / "metrics.jsonl").read_text().splitlines()) < 5:
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.01)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + signum
    assert err.decode().startswith("txl: note: ") and err.decode().endswith("\n")
    assert "checkpoint saved" in err.decode() and "Traceback" not in err.decode()
    assert not (out / ".lock").exists()  # released on the way out
    folder = latest_checkpoint(out)
    assert folder is not None
    step = int(folder.name.split("-")[1])
    summary = resume(out, overrides=(f"train.steps={step + 3}",), progress=False)
    assert summary["steps"] == step + 3


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, text_corpus):
    config = run_config(
        text_corpus,
        "train.steps=50",
        "train.lr=1e30",
        "train.clip=null",
        "train.checkpoint_every=1",
        "train.eval_every=0",
        'train.schedule="constant"',
        "train.warmup_steps=0",
        "train.log_every=1",
    )
    with pytest.raises(TrainingDiverged, match="loss became"):
        train(config, tmp_path / "run", progress=False)
    folder = latest_checkpoint(tmp_path / "run")
    assert folder is not None
    state = json.loads((folder / "state.json").read_text())
    losses = train_losses(tmp_path / "run")
    assert all(v == v and abs(v) != float("inf") for v in losses.values())  # only finite losses were logged
    assert state["state"]["step"] == max(losses)


def test_cli_eval_with_longer_memory_prints_one_json_line(trained_run, capsys):
    """The same split, the same segment length: a longer memory changes the loss of a model trained with
    memory, and asking for the memory it already has changes nothing."""

    def evaluate(*flags: str) -> dict:
        argv = ["eval", str(trained_run), "--split", "test", "--tgt-len", "8", "--quiet", "--json", *flags]
        assert main(argv) == 0
        lines = capsys.readouterr().out.strip().splitlines()
        assert len(lines) == 1
        return json.loads(lines[0])

    longer = evaluate("--mem-len", "48")
    assert longer["split"] == "test" and longer["mem_len"] == 48 and longer["tgt_len"] == 8
    assert 0 < longer["loss"] < 6 and longer["tokens"] > 1000
    default = evaluate()
    assert default["mem_len"] == 16 and default["tokens"] == longer["tokens"]
    assert default["loss"] != longer["loss"]
    assert evaluate("--mem-len", "16")["loss"] == default["loss"]


@pytest.mark.slow
def test_cli_generate_and_python_m(trained_run, capsys):
    assert main(["generate", str(trained_run), "--prompt", "def ", "--max-new-tokens", "20"]) == 0
    assert capsys.readouterr().out.startswith("def ")
    proc = subprocess.run([sys.executable, "-m", "txl", "--help"], env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0 and "train" in proc.stdout and "demo" in proc.stdout


def test_vanilla_baseline_trains_from_the_cli(tmp_path, text_corpus, capsys):
    run_dir = tmp_path / "vanilla"
    assert (
        main(
            [
                "train",
                "--config",
                "tiny",
                "--out",
                str(run_dir),
                "--quiet",
                "--json",
                "--set",
                f"data.corpus={json.dumps(str(text_corpus))}",
                "--set",
                "train.steps=10",
                "--set",
                'model.attention="absolute"',
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 10 and summary["val_loss"] > 0
    assert load_run(run_dir).model.config.attention == "absolute"


def test_early_stopping_after_patience_evaluations_without_improvement(tmp_path, text_corpus, monkeypatch):
    from txl.evaluation import EvalResult
    from txl.train.trainer import Trainer

    losses = iter([3.0, 2.5, 2.6, 2.7, 2.4, 2.3])
    calls = []

    def fake_evaluate(self, split, *, max_tokens=None):
        calls.append(split)
        loss = next(losses) if split == "valid" else 2.0
        return EvalResult(loss=loss, ppl=math.exp(loss), bits_per_token=loss / math.log(2), tokens=100)

    monkeypatch.setattr(Trainer, "evaluate", fake_evaluate)
    config = run_config(text_corpus, "train.steps=50", "train.eval_every=2", "train.patience=2")
    summary = train(config, tmp_path / "run", progress=False)
    # evaluations at steps 2 (3.0), 4 (2.5, best), 6 (2.6), 8 (2.7: second without improvement -> stop)
    assert summary["status"] == "early_stopped" and summary["steps"] == 8
    assert summary["best_val_loss"] == 2.4  # the final full evaluation (2.4) still counts
    best = json.loads((tmp_path / "run" / "checkpoints" / "best" / "state.json").read_text())
    assert best["state"]["step"] == 8


def test_cli_end_to_end_on_tiny_shakespeare(tmp_path, shared_corpus, capsys):
    """The real corpus by name, character level: train briefly, evaluate the whole validation split."""
    shared_data = shared_corpus("tinyshakespeare")
    run_dir = tmp_path / "shakespeare"
    assert (
        main(
            [
                "train",
                "--config",
                "tiny",
                "--out",
                str(run_dir),
                "--quiet",
                "--json",
                "--set",
                "data.corpus=tinyshakespeare",
                "--set",
                f"data.data_dir={json.dumps(str(shared_data))}",
                "--set",
                "data.vocab=char",
                "--set",
                "train.steps=60",
                "--set",
                "train.lr=1e-2",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert summary["vocab_size"] == 66 and summary["val_tokens"] == 111_539 and "test_loss" not in summary
    assert summary["val_loss"] < math.log(66) - 1.0  # well below a uniform guess over the 66 symbols
    assert main(["eval", str(run_dir), "--split", "valid", "--mem-len", "64", "--quiet", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["tokens"] == 111_539 and record["loss"] < math.log(66) - 1.0


@pytest.mark.parametrize(
    "extra", [[], ["model.cutoffs=[64, 128]", "model.div_val=2"]], ids=["softmax", "adaptive"]
)
def test_bf16_autocast_trains(tmp_path, text_corpus, extra):
    summary = train(
        run_config(text_corpus, 'train.precision="bf16"', "train.steps=4", *extra),
        tmp_path / "run",
        progress=False,
    )
    assert summary["steps"] == 4 and math.isfinite(summary["val_loss"])


def test_cli_eval_defaults_to_the_runs_eval_settings(tmp_path, text_corpus, capsys):
    run_dir = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--config",
                "tiny",
                "--out",
                str(run_dir),
                "--quiet",
                "--json",
                "--set",
                f"data.corpus={json.dumps(str(text_corpus))}",
                "--set",
                "train.steps=5",
                "--set",
                "eval.mem_len=40",
                "--set",
                "eval.same_length=true",
            ]
        )
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert main(["eval", str(run_dir), "--quiet", "--json"]) == 0
    saved = json.loads(capsys.readouterr().out)
    assert (saved["mem_len"], saved["same_length"]) == (40, True)
    assert saved["loss"] == pytest.approx(summary["val_loss"], abs=1e-12)  # what training reported
    assert main(["eval", str(run_dir), "--quiet", "--json", "--mem-len", "8", "--no-same-length"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert (chosen["mem_len"], chosen["same_length"]) == (8, False)


def _small_corpus(tmp_path: Path) -> Path:
    """About 3 KB of text: an epoch of 8 rows x 32 tokens is a dozen steps."""
    path = tmp_path / "small.txt"
    path.write_text((STDLIB / "textwrap.py").read_text(encoding="utf-8")[:3000], encoding="utf-8")
    return path


def test_memory_is_dropped_when_the_stream_wraps_to_a_new_epoch(tmp_path, monkeypatch):
    """The first segment of epoch 2 starts the split again: it must not attend to the end of the split.
    Resuming from a checkpoint taken right before the wrap keeps the run exact."""
    common = [
        "train.batch_size=8",
        "train.tgt_len=32",
        'train.schedule="constant"',
        "train.eval_every=0",
        "train.log_every=1",
        "model.dropout=0.1",
    ]
    config = run_config(_small_corpus(tmp_path), *common)
    epoch = train_stream(config, prepare_data(config.data).splits).n_batches
    assert 5 < epoch < 20

    calls = []
    forward = TransformerXL.forward

    def spy(self, tokens, *, memory=None, **kwargs):
        if self.training:
            calls.append(memory is None)
        return forward(self, tokens, memory=memory, **kwargs)

    monkeypatch.setattr(TransformerXL, "forward", spy)
    train(apply_overrides(config, [f"train.steps={epoch + 2}"]), tmp_path / "reference", progress=False)
    assert calls == [True] + [False] * (epoch - 1) + [True, False]  # empty at step 1 and at the wrap

    calls.clear()
    run = tmp_path / "run"
    train(
        apply_overrides(config, [f"train.steps={epoch}", f"train.checkpoint_every={epoch}"]),
        run,
        progress=False,
    )
    resume(run, overrides=(f"train.steps={epoch + 2}",), progress=False)
    assert calls[epoch:] == [True, False]  # the restored memory (the end of the split) is dropped too
    assert train_losses(run) == train_losses(tmp_path / "reference")


def test_resume_applies_optimizer_overrides_and_refuses_what_it_cannot_change(tmp_path, text_corpus):
    run = tmp_path / "run"
    train(
        run_config(
            text_corpus,
            "train.steps=3",
            "train.checkpoint_every=1",
            "train.eval_every=0",
            'train.schedule="constant"',
        ),
        run,
        progress=False,
    )
    before = snapshot(run)
    fixed = re.escape("train.batch_size: cannot be changed when resuming (the run has 4, asked 2)")
    with pytest.raises(RunError, match=f"^{fixed}$"):
        resume(run, overrides=("train.steps=5", "train.batch_size=2"), progress=False)
    with pytest.raises(RunError) as refused:
        resume(
            run,
            overrides=(
                "train.steps=5",
                "model.d_model=64",
                'data.vocab="char"',
                "train.seed=1",
                "train.tgt_len=8",
                "train.varlen=true",
            ),
            progress=False,
        )
    for field in ("model.d_model", "data.vocab", "train.seed", "train.tgt_len", "train.varlen"):
        assert f"{field}: cannot be changed when resuming" in str(refused.value)
    assert "\n" not in str(refused.value) and "(the run has 16, asked 8)" in str(refused.value)
    assert snapshot(run) == before

    resume(
        run,
        overrides=(
            "train.steps=5",
            "train.weight_decay=0.1",
            "train.beta1=0.8",
            "train.beta2=0.99",
            "train.accum_steps=2",
            "train.clip=0.5",
        ),
        progress=False,
    )
    groups = json.loads((run / "checkpoints" / "step-00000005" / "state.json").read_text())["optimizer"][
        "param_groups"
    ]
    assert [g["weight_decay"] for g in groups] == [0.1, 0.0]  # the no-decay group keeps none
    assert all(g["betas"] == [0.8, 0.99] for g in groups)
    saved = json.loads((run / "config.json").read_text())["train"]
    assert (saved["weight_decay"], saved["beta1"], saved["beta2"], saved["accum_steps"]) == (
        0.1,
        0.8,
        0.99,
        2,
    )


def test_resume_warns_when_new_steps_move_the_learning_rate(tmp_path, text_corpus):
    cosine = tmp_path / "cosine"
    train(run_config(text_corpus, "train.steps=4", "train.eval_every=0"), cosine, progress=False)
    with pytest.warns(
        ResumeWarning,
        match=r"resuming at step 4 with train\.steps 4 -> 8: the learning rate "
        r"jumps from 0 to 0\.00225 ",
    ):
        resume(cosine, overrides=("train.steps=8",), progress=False)
    constant = tmp_path / "constant"
    train(
        run_config(text_corpus, "train.steps=4", "train.eval_every=0", 'train.schedule="constant"'),
        constant,
        progress=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeWarning)
        resume(constant, overrides=("train.steps=6",), progress=False)  # the same rate: nothing to say


def test_a_start_that_fails_leaves_nothing_behind(tmp_path, text_corpus):
    short = tmp_path / "short.txt"
    short.write_text("too short\n" * 4, encoding="utf-8")
    out = tmp_path / "new" / "run"
    for _ in range(2):  # the same call fails the same way: nothing was left to say "already holds a run"
        with pytest.raises(RunError, match="fewer than one segment"):
            train(run_config(short), out, progress=False)
        assert not (tmp_path / "new").exists()

    mine = tmp_path / "mine"  # a folder the user made, with a file of theirs
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    diverges = run_config(
        text_corpus,
        "train.steps=50",
        "train.lr=1e30",
        "train.clip=null",
        "train.eval_every=0",
        "train.checkpoint_every=0",
        'train.schedule="constant"',
        "train.warmup_steps=0",
    )
    with pytest.raises(TrainingDiverged, match="no checkpoint was written yet"):
        train(diverges, mine, progress=False)
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt"]
    with pytest.raises(TrainingDiverged):  # the folders it made are removed too
        train(diverges, tmp_path / "fresh" / "run", progress=False)
    assert not (tmp_path / "fresh").exists()
    assert train(run_config(text_corpus, "train.steps=2"), mine, progress=False)["steps"] == 2


def test_sigterm_outside_the_training_steps_stops_cleanly(tmp_path, text_corpus, monkeypatch):
    """Between the start and the loop (and in the final evaluation) SIGTERM is an exception: the lock is
    released and a start without a checkpoint leaves nothing."""

    def terminated(self):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(10)
        raise AssertionError("SIGTERM did not stop the run")

    monkeypatch.setattr(Trainer, "fit", terminated)
    with pytest.raises(Interrupted, match="SIGTERM outside the training steps") as info:
        train(run_config(text_corpus), tmp_path / "run", progress=False)
    assert info.value.signum == signal.SIGTERM and not (tmp_path / "run").exists()


@pytest.mark.slow
def test_cli_start_that_fails_on_data_can_be_run_again(tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("too short\n" * 4, encoding="utf-8")
    out = tmp_path / "run"
    cmd = [
        sys.executable,
        "-m",
        "txl",
        "train",
        "--config",
        "tiny",
        "--out",
        str(out),
        "--quiet",
        "--set",
        f"data.corpus={json.dumps(str(short))}",
    ]
    for _ in range(2):
        proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "fewer than one segment" in lines[0], proc.stderr
        assert not out.exists()


def test_an_empty_validation_slice_is_refused_before_anything_is_written(tmp_path, text_corpus):
    """A file is cut 90/5/5 at line ends: with one long last line both cuts land on its end and the
    validation slice is empty; training would end with best_val_loss null."""
    corpus = tmp_path / "long-last-line.txt"
    corpus.write_text("short line\n" * 50 + "x" * 1000 + "\n", encoding="utf-8")
    out = tmp_path / "run"
    with pytest.raises(
        RunError, match=r"split 'valid' of corpus .*long-last-line\.txt' is empty \(0 tokens\)"
    ):
        train(run_config(corpus), out, progress=False)
    assert not out.exists()
    with pytest.raises(RunError, match=r"train\.patience=2 .* train\.eval_every=0"):
        train(run_config(text_corpus, "train.patience=2", "train.eval_every=0"), out, progress=False)
    assert not out.exists()


def test_one_process_at_a_time_trains_in_a_run_folder(tmp_path, text_corpus):
    run = tmp_path / "run"
    config = run_config(text_corpus, "train.steps=2", "train.checkpoint_every=1", "train.eval_every=0")
    train(config, run, progress=False)
    assert not (run / ".lock").exists()
    host = socket.gethostname()
    holder = subprocess.Popen(["sleep", "60"])
    try:
        (run / ".lock").write_text(json.dumps({"pid": holder.pid, "host": host, "since": 0.0}))
        before = snapshot(run)
        held = re.escape(f"another process (pid {holder.pid} on {host}) holds the run")
        with pytest.raises(RunError, match=held):
            resume(run, overrides=("train.steps=4",), progress=False)
        with pytest.raises(RunError, match=held):
            train(config, run, overwrite=True, progress=False)
        assert snapshot(run) == before
    finally:
        holder.kill()
        holder.wait()
    # its process is gone: the lock is stale and replaced, then released
    assert resume(run, overrides=("train.steps=4",), progress=False)["steps"] == 4
    assert not (run / ".lock").exists()
    with pytest.raises(RunError, match="already finished"):
        resume(run, progress=False)
    assert not (run / ".lock").exists()  # released after a refusal too
    (run / ".lock").write_text(json.dumps({"pid": 1, "host": "another-host", "since": 0.0}))
    with pytest.raises(RunError, match=re.escape("(pid 1 on another-host)")):  # cannot be checked: refused
        resume(run, overrides=("train.steps=6",), progress=False)


def test_checkpoints_are_found_by_name_and_only_complete_ones_are_read(tmp_path, text_corpus, capsys):
    run = tmp_path / "run"
    train(
        run_config(
            text_corpus,
            "train.steps=4",
            "train.checkpoint_every=1",
            "train.keep_last=3",
            "train.eval_every=0",
        ),
        run,
        progress=False,
    )
    checkpoints = run / "checkpoints"
    shutil.copytree(
        checkpoints / "step-00000004", checkpoints / ".tmp-step-00000009-123"
    )  # a write in progress
    (checkpoints / "step-00000008").mkdir()  # a folder without state.json
    assert load_run(run, checkpoint="latest").checkpoint.name == "step-00000004"
    assert load_run(run, checkpoint="step-00000003").step == 3
    assert load_run(run, checkpoint="2").step == 2
    assert load_run(run, checkpoint=str(checkpoints / "step-00000003")).step == 3
    assert load_run(run, checkpoint="best").checkpoint.name == "best"
    with pytest.raises(
        CheckpointError,
        match=re.escape(
            "no checkpoint 'step-00000099' in "
            f"{checkpoints} (available: best, step-00000002, step-00000003, "
            "step-00000004;"
        ),
    ):
        load_run(run, checkpoint="step-00000099")
    for name in (".tmp-step-00000009-123", str(checkpoints / ".tmp-step-00000009-123")):
        with pytest.raises(CheckpointError, match="no checkpoint"):
            load_run(run, checkpoint=name)
    assert (
        main(["eval", str(run), "--checkpoint", "step-00000003", "--max-tokens", "200", "--quiet", "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["step"] == 3


def test_load_run_reads_again_a_checkpoint_replaced_while_it_is_read(tmp_path, text_corpus, monkeypatch):
    """Another process saves a new best while `txl eval` reads the old one: the half-old, half-new read is
    noticed and the new best is read whole."""
    run = tmp_path / "run"
    train(run_config(text_corpus, "train.steps=2", "train.eval_every=0"), run, progress=False)
    best = run / "checkpoints" / "best"
    document = json.loads((best / "state.json").read_text())
    meta = {k: v for k, v in document.items() if k not in ("format", "state", "optimizer", "files")}
    newer = load_run(run).model
    with torch.no_grad():
        for p in newer.parameters():
            p.add_(1.0)
    real_load_model = ckpt.load_model

    def racing_load_model(model, filename, **kwargs):
        result = real_load_model(model, filename, **kwargs)
        if not racing_load_model.raced:
            racing_load_model.raced = True
            ckpt.save_checkpoint(
                best, ckpt.CheckpointContents(newer, state=TrainingState(step=99), meta=meta)
            )
        return result

    racing_load_model.raced = False
    monkeypatch.setattr(ckpt, "load_model", racing_load_model)
    loaded = load_run(run)
    assert racing_load_model.raced and loaded.step == 99
    assert all(torch.equal(a, b) for a, b in zip(loaded.model.parameters(), newer.parameters(), strict=True))


def test_flipped_byte_in_weights_is_a_clear_error(tmp_path, text_corpus):
    run = tmp_path / "run"
    train(
        run_config(text_corpus, "train.steps=2", "train.checkpoint_every=1", "train.eval_every=0"),
        run,
        progress=False,
    )
    weights = run / "checkpoints" / "step-00000002" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-100] ^= 0x01
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"step-00000002/model\.safetensors: checksum mismatch"):
        load_run(run, checkpoint="latest")
    assert load_run(run, checkpoint="step-00000001").step == 1


def test_every_run_file_has_the_permissions_of_the_umask(tmp_path, text_corpus):
    """One permission for every file of a run, the umask's (0666 less it; folders 0777 less it): the atomic
    writes once came out 0600 (tempfile.mkstemp's) next to 0644 ones."""
    previous = os.umask(0o027)
    try:
        run = tmp_path / "run"
        config = run_config(text_corpus, "train.steps=2", "train.checkpoint_every=1", "train.eval_every=1")
        train(config, run, progress=False)
    finally:
        os.umask(previous)
    modes = {str(p.relative_to(run)): p.stat().st_mode & 0o777 for p in run.rglob("*")}
    assert {"config.json", "vocab.json", "metrics.jsonl", "summary.json"} <= modes.keys()
    assert any(name.endswith(".safetensors") for name in modes) and any(
        n.endswith("state.json") for n in modes
    )
    wrong = {
        name: oct(mode) for name, mode in modes.items() if mode != (0o750 if (run / name).is_dir() else 0o640)
    }
    assert not wrong, wrong


@pytest.mark.parametrize(("vocab", "name"), [("word", None), ("char", "bpc"), ("byte", "bpb")])
def test_bits_are_named_for_what_a_token_is(tmp_path, text_corpus, capsys, vocab, name):
    """``bits_per_token`` everywhere; ``bpc`` only where a token is a character, ``bpb`` where it is a byte
    (a word run once wrote bits per word as ``bpc``)."""
    from txl.cli import main

    run = tmp_path / "run"
    config = run_config(text_corpus, f'data.vocab="{vocab}"', "train.steps=2", "train.eval_every=1")
    summary = train(config, run, progress=False)
    assert main(["eval", str(run), "--quiet", "--json"]) == 0
    evaluated = json.loads(capsys.readouterr().out)
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in records} == {"train", "valid"}
    others = {"bpc", "bpb"} - {name}
    for figures, prefix in [
        *((r, "") for r in records),
        (summary, "val_"),
        (summary, "test_"),
        (evaluated, ""),
    ]:
        bits = figures[f"{prefix}loss"] / math.log(2)
        assert figures[f"{prefix}bits_per_token"] == pytest.approx(bits, rel=1e-12)
        assert not {f"{prefix}{other}" for other in others} & figures.keys(), figures
        if name:
            assert figures[f"{prefix}{name}"] == figures[f"{prefix}bits_per_token"]
