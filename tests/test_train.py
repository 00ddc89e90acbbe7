"""Training end to end: the loop learns, checkpoints round-trip, a SIGKILLed run resumes onto the exact
loss trajectory of an uninterrupted one, SIGTERM saves and exits cleanly, NaN stops the run, and
evaluation with a longer memory works from the CLI."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest
import torch

from txl.cli import main
from txl.config import apply_overrides, load_config
from txl.runs import load_run
from txl.train.checkpoint import latest_checkpoint
from txl.train.trainer import TrainingDiverged, resume, train

STDLIB = Path(sysconfig.get_paths()["stdlib"])


@pytest.fixture
def text_corpus(tmp_path) -> Path:
    """Real text available on every machine: a few of Python's own source files, about 200 KB."""
    parts = [(STDLIB / name).read_text(encoding="utf-8") for name in ("argparse.py", "textwrap.py", "shlex.py")]
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def _config(corpus: Path, *extra: str):
    return apply_overrides(load_config("tiny"), [f"data.corpus={json.dumps(str(corpus))}", *extra])


def _train_losses(run_dir: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in records if r["split"] == "train"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src") + os.pathsep + env.get("PYTHONPATH", "")
    return env


def test_training_learns_and_writes_the_run(tmp_path, text_corpus):
    config = _config(text_corpus, "train.steps=60", "train.eval_every=30", "train.log_every=10", "train.lr=5e-3")
    summary = train(config, tmp_path / "run", progress=False)
    for key in ("best_val_loss", "val_loss", "val_ppl", "val_bpc", "test_loss", "steps", "tokens",
                "train_tokens_per_s", "params"):
        assert key in summary, key
    assert summary["steps"] == 60 and summary["tokens"] == 60 * 4 * 16
    losses = _train_losses(tmp_path / "run")
    assert losses[60] < losses[10] - 0.5  # it learns (byte entropy starts near ln 256 = 5.5)
    assert summary["val_loss"] < 4.0
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert {r["split"] for r in records} == {"train", "valid"}
    assert all({"step", "split", "loss"} <= r.keys() for r in records)
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    assert saved["model"]["vocab_size"] == 256 and saved["train"]["steps"] == 60
    assert json.loads((tmp_path / "run" / "summary.json").read_text()) == json.loads(json.dumps(summary))


def test_checkpoint_round_trip_gives_identical_outputs(tmp_path, text_corpus):
    train(_config(text_corpus, "train.steps=10"), tmp_path / "run", progress=False)
    run = load_run(tmp_path / "run", checkpoint="latest")
    again = load_run(tmp_path / "run", checkpoint="latest")
    tokens = torch.randint(0, 256, (2, 12))
    assert torch.equal(run.model(tokens).logits, again.model(tokens).logits)
    assert run.step == 10


def test_killed_run_resumes_on_the_same_loss_trajectory(tmp_path, text_corpus):
    common = ["train.schedule=\"constant\"", "train.log_every=1", "train.eval_every=0", "train.checkpoint_every=10",
              "train.batch_size=8", "train.tgt_len=32", "model.dropout=0.1", "train.varlen=true"]
    reference = train(_config(text_corpus, "train.steps=50", *common), tmp_path / "reference", progress=False)
    assert reference["steps"] == 50

    killed = tmp_path / "killed"
    cmd = [sys.executable, "-m", "txl", "train", "--config", "tiny", "--out", str(killed), "--quiet",
           "--set", f"data.corpus={json.dumps(str(text_corpus))}", "--set", "train.steps=100000"]
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
    assert _train_losses(killed)  # it had logged steps (maybe beyond the checkpoint) before dying
    summary = resume(killed, overrides=("train.steps=50",), progress=False)
    assert summary["steps"] == 50
    assert _train_losses(killed) == _train_losses(tmp_path / "reference")  # identical floats, every step


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_saves_a_checkpoint_and_exits_cleanly(tmp_path, text_corpus, signum):
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "txl", "train", "--config", "tiny", "--out", str(out), "--quiet",
           "--set", f"data.corpus={json.dumps(str(text_corpus))}", "--set", "train.steps=100000",
           "--set", "train.checkpoint_every=100000", "--set", "train.eval_every=0", "--set", "train.log_every=1"]
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
    folder = latest_checkpoint(out)
    assert folder is not None
    step = int(folder.name.split("-")[1])
    summary = resume(out, overrides=(f"train.steps={step + 3}",), progress=False)
    assert summary["steps"] == step + 3


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path, text_corpus):
    config = _config(text_corpus, "train.steps=50", "train.lr=1e30", "train.clip=null", "train.checkpoint_every=1",
                     "train.eval_every=0", "train.schedule=\"constant\"", "train.warmup_steps=0", "train.log_every=1")
    with pytest.raises(TrainingDiverged, match="loss became"):
        train(config, tmp_path / "run", progress=False)
    folder = latest_checkpoint(tmp_path / "run")
    assert folder is not None
    state = json.loads((folder / "state.json").read_text())
    losses = _train_losses(tmp_path / "run")
    assert all(v == v and abs(v) != float("inf") for v in losses.values())  # only finite losses were logged
    assert state["state"]["step"] == max(losses)


def test_cli_eval_with_longer_memory_prints_one_json_line(tmp_path, text_corpus, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "--config", "tiny", "--out", str(run_dir), "--quiet",
                 "--set", f"data.corpus={json.dumps(str(text_corpus))}", "--set", "train.steps=20"]) == 0
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--split", "test", "--mem-len", "48", "--tgt-len", "8", "--quiet"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    record = json.loads(lines[0])
    assert record["split"] == "test" and record["mem_len"] == 48 and record["tgt_len"] == 8
    assert 0 < record["loss"] < 6 and record["tokens"] > 1000
    assert main(["eval", str(run_dir), "--split", "valid", "--quiet"]) == 0
    default = json.loads(capsys.readouterr().out)
    assert default["mem_len"] == 16 and default["loss"] != record["loss"]


def test_cli_generate_and_python_m(tmp_path, text_corpus, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "--config", "tiny", "--out", str(run_dir), "--quiet",
                 "--set", f"data.corpus={json.dumps(str(text_corpus))}", "--set", "train.steps=5"]) == 0
    capsys.readouterr()
    assert main(["generate", str(run_dir), "--prompt", "def ", "--max-new-tokens", "20"]) == 0
    assert capsys.readouterr().out.startswith("def ")
    proc = subprocess.run([sys.executable, "-m", "txl", "--help"], env=_env(), capture_output=True, text=True)
    assert proc.returncode == 0 and "train" in proc.stdout and "demo" in proc.stdout


def test_vanilla_baseline_trains_from_the_cli(tmp_path, text_corpus, capsys):
    run_dir = tmp_path / "vanilla"
    assert main(["train", "--config", "tiny", "--out", str(run_dir), "--quiet",
                 "--set", f"data.corpus={json.dumps(str(text_corpus))}", "--set", "train.steps=10",
                 "--set", "model.attention=\"absolute\""]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["steps"] == 10 and summary["val_loss"] > 0
    assert load_run(run_dir).model.config.attention == "absolute"


def test_early_stopping_after_patience_evaluations_without_improvement(tmp_path, text_corpus, monkeypatch):
    from txl.evaluate import EvalResult
    from txl.train.trainer import Trainer

    losses = iter([3.0, 2.5, 2.6, 2.7, 2.4, 2.3])
    calls = []

    def fake_evaluate(self, split, *, max_tokens=None):
        calls.append(split)
        loss = next(losses) if split == "valid" else 2.0
        return EvalResult(loss=loss, ppl=math.exp(loss), bpc=loss / math.log(2), tokens=100)

    monkeypatch.setattr(Trainer, "evaluate", fake_evaluate)
    config = _config(text_corpus, "train.steps=50", "train.eval_every=2", "train.patience=2")
    summary = train(config, tmp_path / "run", progress=False)
    # evaluations at steps 2 (3.0), 4 (2.5, best), 6 (2.6), 8 (2.7: second without improvement -> stop)
    assert summary["status"] == "early_stopped" and summary["steps"] == 8
    assert summary["best_val_loss"] == 2.4  # the final full evaluation (2.4) still counts
    best = json.loads((tmp_path / "run" / "checkpoints" / "best" / "state.json").read_text())
    assert best["state"]["step"] == 8


def test_cli_end_to_end_on_tiny_shakespeare(tmp_path, shared_data, capsys):
    """The real corpus by name, character level: train briefly, evaluate the whole validation split."""
    run_dir = tmp_path / "shakespeare"
    assert main(["train", "--config", "tiny", "--out", str(run_dir), "--quiet",
                 "--set", "data.corpus=tinyshakespeare", "--set", f"data.data_dir={json.dumps(str(shared_data))}",
                 "--set", "data.vocab=char", "--set", "train.steps=60", "--set", "train.lr=1e-2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["vocab_size"] == 66 and summary["val_tokens"] == 111_539 and "test_loss" not in summary
    assert summary["val_loss"] < math.log(66) - 1.0  # well below a uniform guess over the 66 symbols
    assert main(["eval", str(run_dir), "--split", "valid", "--mem-len", "64", "--quiet"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["tokens"] == 111_539 and record["loss"] < math.log(66) - 1.0


@pytest.mark.parametrize("extra", [[], ["model.cutoffs=[64, 128]", "model.div_val=2"]], ids=["softmax", "adaptive"])
def test_bf16_autocast_trains(tmp_path, text_corpus, extra):
    summary = train(_config(text_corpus, "train.precision=\"bf16\"", "train.steps=4", *extra), tmp_path / "run",
                    progress=False)
    assert summary["steps"] == 4 and math.isfinite(summary["val_loss"])


def test_cli_eval_defaults_to_the_runs_eval_settings(tmp_path, text_corpus, capsys):
    run_dir = tmp_path / "run"
    assert main(["train", "--config", "tiny", "--out", str(run_dir), "--quiet",
                 "--set", f"data.corpus={json.dumps(str(text_corpus))}", "--set", "train.steps=5",
                 "--set", "eval.mem_len=40", "--set", "eval.same_length=true"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert main(["eval", str(run_dir), "--quiet"]) == 0
    saved = json.loads(capsys.readouterr().out)
    assert (saved["mem_len"], saved["same_length"]) == (40, True)
    assert saved["loss"] == pytest.approx(summary["val_loss"], abs=1e-12)  # what training reported
    assert main(["eval", str(run_dir), "--quiet", "--mem-len", "8", "--no-same-length"]) == 0
    chosen = json.loads(capsys.readouterr().out)
    assert (chosen["mem_len"], chosen["same_length"]) == (8, False)
