"""Data parallelism under torchrun (CPU, gloo, 2 processes): the loss trajectory of 2 processes x B/2 streams
is that of 1 process x B streams; a run stopped by SIGTERM on one rank resumes on the uninterrupted trajectory
with 2 processes and with 1 (the memory rows split anew); with dropout, each rank resumes its own random
state; evaluation under 2 processes equals evaluation in one; a rank that raises ends the whole run within
seconds, naming the rank and the error.

Tolerance: training is float32. With 2 processes each forward sees B/2 rows and DistributedDataParallel adds
the two halves' gradients, so sums are taken in another order than in one process: the losses differ by a
few float32 roundings (about 1e-7 relative; measured at most 1.2e-7 over 40 steps). 1e-5 relative leaves room
for Adam to carry those roundings over the steps, and is far below what a wrong split changes (a process
reading another's rows, or memory given to the wrong streams, moves the loss in the second or third digit).
A process count kept across a resume is compared exactly."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import run_config, train_losses, write_documents_corpus, write_text_corpus
from txl.checkpoint import ResumeWarning
from txl.data import prepare_data
from txl.distributed import SINGLE, Distributed, launch_command
from txl.errors import TxlError
from txl.evaluation import EvalSettings, evaluate
from txl.runs import latest_checkpoint, load_run, read_metrics
from txl.train.trainer import resume, train

pytestmark = pytest.mark.slow

SRC = Path(__file__).resolve().parents[1] / "src"
STEPS = 40
RELATIVE = 1e-5  # see the module's docstring
COMMON = (
    "train.log_every=1",
    "train.eval_every=20",
    "train.checkpoint_every=10",
    "train.batch_size=4",
    "train.tgt_len=16",
    "eval.batch_size=8",
    "eval.tgt_len=32",
    "train.eval_tokens=1000",
)


def _env() -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        "OMP_NUM_THREADS": "1",
    }


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *args]


def _train_args(corpus: Path, out: Path, *overrides: str) -> list[str]:
    args = [
        "train",
        "--config",
        "tiny",
        "--out",
        str(out),
        "--quiet",
        "--json",
        "--set",
        f"data.corpus={json.dumps(str(corpus))}",
    ]
    for item in (*COMMON, *overrides):
        args += ["--set", item]
    return args


def _close(a: dict[int, float], b: dict[int, float]) -> bool:
    return a.keys() == b.keys() and all(abs(a[k] - b[k]) <= RELATIVE * abs(b[k]) for k in a)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The same 40 steps trained by 2 processes (``txl train --nproc 2``, which launches torchrun) and by 1."""
    folder = tmp_path_factory.mktemp("ddp")
    corpus = write_text_corpus(folder / "corpus.txt")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "txl",
            *_train_args(corpus, folder / "two", f"train.steps={STEPS}"),
            "--nproc",
            "2",
        ],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count('"status": "completed"') == 1  # rank 0 alone prints the summary
    torch.manual_seed(0)
    config = run_config(corpus, *COMMON, f"train.steps={STEPS}")
    train(config, folder / "one", progress=False)
    return {"corpus": corpus, "two": folder / "two", "one": folder / "one"}


def test_two_processes_follow_the_one_process_loss_trajectory(runs):
    two, one = train_losses(runs["two"]), train_losses(runs["one"])
    assert sorted(two) == list(range(1, STEPS + 1))  # every step logged once: rank 0 alone writes
    assert _close(two, one), max(abs(two[k] - one[k]) / one[k] for k in one)
    # The same initial weights and rows split without overlap: step 1 agrees to float32 summation order (the
    # fused output-layer loss sums each rank's rows in its own blocks; overlapping rows give another loss)
    assert abs(two[1] - one[1]) <= 1e-6 * one[1]
    valid_two = [r for r in read_metrics(runs["two"]) if r["split"] == "valid"]
    valid_one = [r for r in read_metrics(runs["one"]) if r["split"] == "valid"]
    assert [r["tokens"] for r in valid_two] == [r["tokens"] for r in valid_one]
    assert all(
        abs(a["loss"] - b["loss"]) <= RELATIVE * b["loss"] for a, b in zip(valid_two, valid_one, strict=True)
    )
    summary = json.loads((runs["two"] / "summary.json").read_text())
    assert summary["tokens"] == STEPS * 4 * 16 and summary["status"] == "completed"
    folder = latest_checkpoint(runs["two"])
    state = json.loads((folder / "state.json").read_text())["state"]
    tensors = load_file(str(folder / "state.safetensors"))
    assert state["world_size"] == 2
    assert tensors["memory.0"].shape[0] == 4  # the memory of all B streams, gathered from both processes
    assert {"rng.rank.0.torch", "rng.rank.1.torch"} <= tensors.keys()


def _worker_pid(root: int, rank: int, timeout: float = 120) -> int:
    """The pid of the torchrun worker of ``rank`` among the descendants of ``root``."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        parents = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(stat.parent.name)] = int(fields[1])
        for pid in parents:
            ancestor = parents.get(pid)
            while ancestor and ancestor != root:
                ancestor = parents.get(ancestor)
            if ancestor != root:
                continue
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if f"RANK={rank}".encode() in environ and any(
                e.startswith(b"TORCHELASTIC_RUN_ID=") for e in environ
            ):
                return pid
        time.sleep(0.05)
    raise AssertionError(f"no worker of rank {rank} under pid {root}")


def test_sigterm_on_one_rank_saves_once_and_resumes_on_two_or_one_process(runs, tmp_path):
    stopped = tmp_path / "stopped"
    cmd = _torchrun("-m", "txl", *_train_args(runs["corpus"], stopped, f"train.steps={STEPS}"))
    proc = subprocess.Popen(cmd, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        rank1 = _worker_pid(proc.pid, 1)
        deadline = time.time() + 120
        while len(train_losses(stopped) if (stopped / "metrics.jsonl").exists() else {}) < 3:
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.01)
        os.kill(rank1, signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode != 0
    assert "checkpoint saved" in err and err.count("txl: note: SIGTERM") == 1  # rank 0 says it, once
    assert "exitcode  : 143" in err  # 128 + SIGTERM: stopped, not failed
    folder = latest_checkpoint(stopped)
    step = json.loads((folder / "state.json").read_text())["state"]["step"]
    assert 3 <= step < STEPS and folder.name == f"step-{step:08d}"
    assert max(train_losses(stopped)) == step  # every rank stopped at the same step

    again = Path(shutil.copytree(stopped, tmp_path / "again"))
    proc = subprocess.run(
        _torchrun("-m", "txl", "train", "--resume", str(again), "--quiet"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert train_losses(again) == train_losses(runs["two"])  # identical floats, every step

    single = Path(shutil.copytree(stopped, tmp_path / "single"))
    resume(single, progress=False)  # the memory of the 4 streams now in one process
    losses, reference = train_losses(single), train_losses(runs["two"])
    assert all(losses[k] == reference[k] for k in range(1, step + 1))
    assert _close(losses, reference)


def test_with_dropout_each_rank_resumes_its_own_random_state(runs, tmp_path):
    """A 2-process run with dropout, and a copy cut back to its step-10 checkpoint (what a SIGKILL after that
    checkpoint leaves) resumed on 2 processes: the same floats, so each rank's dropout draws continued; on
    1 process a warning says that they cannot."""
    args = _train_args(
        runs["corpus"], tmp_path / "run", "train.steps=20", "model.dropout=0.2", "train.eval_every=0"
    )
    proc = subprocess.run(
        _torchrun("-m", "txl", *args), env=_env(), capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    states = load_file(str(tmp_path / "run" / "checkpoints" / "step-00000010" / "state.safetensors"))
    assert not torch.equal(states["rng.rank.0.torch"], states["rng.rank.1.torch"])  # each rank its own masks
    for name in ("cut", "single"):
        cut = Path(shutil.copytree(tmp_path / "run", tmp_path / name))
        shutil.rmtree(cut / "checkpoints" / "step-00000020")
        shutil.rmtree(cut / "checkpoints" / "best")
        (cut / "summary.json").unlink()
    proc = subprocess.run(
        _torchrun("-m", "txl", "train", "--resume", str(tmp_path / "cut"), "--quiet"),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert train_losses(tmp_path / "cut") == train_losses(tmp_path / "run")
    with pytest.warns(ResumeWarning, match="saved by 2 process.*resumed on 1.*dropout masks"):
        resume(tmp_path / "single", progress=False)


EVALUATE = """
import json, sys
from txl.checkpoint import ResumeWarning
from txl.data import prepare_data
from txl.distributed import from_environment
from txl.evaluation import EvalSettings, evaluate
from txl.runs import load_run

run = load_run(sys.argv[1], checkpoint="latest")
tokens = prepare_data(run.config.data, vocab=run.vocab, splits=("valid",)).splits["valid"]
group = from_environment("cpu")
result = evaluate(run.model, tokens, EvalSettings(batch_size=6, tgt_len=24, max_tokens=2999), group=group)
if group.is_main:
    open(sys.argv[2], "w").write(json.dumps(result.as_dict()))
group.close()
"""


def test_evaluation_under_two_processes_equals_one_process(runs, tmp_path):
    script = tmp_path / "evaluate.py"
    script.write_text(EVALUATE)
    proc = subprocess.run(
        _torchrun(str(script), str(runs["two"]), str(tmp_path / "result.json")),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    two = json.loads((tmp_path / "result.json").read_text())
    run = load_run(runs["two"], checkpoint="latest")
    tokens = prepare_data(run.config.data, vocab=run.vocab, splits=("valid",)).splits["valid"]
    one = evaluate(run.model, tokens, EvalSettings(batch_size=6, tgt_len=24, max_tokens=2999)).as_dict()
    assert two["tokens"] == one["tokens"] == 2999  # every token once; the last rows padded and masked
    assert two["loss"] == pytest.approx(one["loss"], rel=1e-6)  # float32 forward on 3 rows instead of 6


FAILING = """
import sys, time
from pathlib import Path
from torch.distributed.elastic.multiprocessing.errors import record
from txl.cli import main
from txl.train.trainer import Trainer

original = Trainer.train_step

def train_step(self, batch):
    if self.group.rank == 1 and self.state.step == 3:
        Path(sys.argv[1]).write_text(str(time.time()))
        raise RuntimeError("injected failure in rank 1")
    return original(self, batch)

Trainer.train_step = train_step
sys.exit(record(main)(sys.argv[2:]))
"""


def test_a_rank_that_raises_ends_the_run_within_seconds_naming_rank_and_error(runs, tmp_path):
    script = tmp_path / "failing.py"
    script.write_text(FAILING)
    raised = tmp_path / "raised_at"
    cmd = _torchrun(
        str(script), str(raised), *_train_args(runs["corpus"], tmp_path / "run", "train.steps=100000")
    )
    proc = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
    ended = time.time()
    assert proc.returncode != 0
    assert (
        ended - float(raised.read_text()) < 20
    )  # not the 10-minute collective timeout, nor torchrun's kill grace
    root_cause = proc.stderr.split("Root Cause (first observed failure)")[1]
    assert "rank      : 1 (local_rank: 1)" in root_cause
    assert "RuntimeError: injected failure in rank 1" in root_cause


def test_rows_are_split_evenly_or_refused_naming_the_field():
    assert [Distributed(rank=r, world_size=2).rows(8) for r in range(2)] == [slice(0, 4), slice(4, 8)]
    assert SINGLE.rows(5) == slice(0, 5)
    with pytest.raises(TxlError, match=r"train\.batch_size=6 cannot be split over 4 processes"):
        Distributed(rank=0, world_size=4).rows(6)
    with pytest.raises(TxlError, match=r"eval\.batch_size=3"):
        Distributed(rank=1, world_size=2).rows(3, field="eval.batch_size")
    assert launch_command(2, ["train", "--resume", "x"])[-6:] == [
        "--nproc-per-node=2",
        "-m",
        "txl",
        "train",
        "--resume",
        "x",
    ]


def test_nproc_refuses_a_batch_it_cannot_split_before_launching(tmp_path, capsys):
    from txl.cli import main

    assert (
        main(
            [
                "train",
                "--nproc",
                "2",
                "--config",
                "tiny",
                "--out",
                str(tmp_path / "run"),
                "--set",
                "train.batch_size=3",
            ]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        "txl: error: train.batch_size=3 cannot be split over 2 processes: it must be "
        "a multiple of the number of processes\n"
    )
    assert not (tmp_path / "run").exists()


def test_ctrl_c_under_nproc_saves_and_says_so_without_a_torchrun_traceback(runs, tmp_path):
    """Ctrl-C reaches the whole foreground process group (sent here with killpg): ``txl train --nproc 2``
    passes SIGINT to its ranks, which save one checkpoint and stop; the user sees txl's note, not torchrun's
    traceback or failure report, and the exit status is 130 as for one process."""
    stopped = tmp_path / "stopped"
    argv = [
        sys.executable,
        "-m",
        "txl",
        *_train_args(runs["corpus"], stopped, "train.steps=100000"),
        "--nproc",
        "2",
    ]
    proc = subprocess.Popen(
        argv, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        deadline = time.time() + 120
        while len(train_losses(stopped) if (stopped / "metrics.jsonl").exists() else {}) < 3:
            assert time.time() < deadline and proc.poll() is None
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 130, err[-3000:]
    assert err.count("txl: note: SIGINT") == 1 and "checkpoint saved" in err, err[-3000:]
    for alarming in ("Traceback", "SignalException", "ChildFailedError", "exitcode", "Root Cause"):
        assert alarming not in err, err[-3000:]
    assert latest_checkpoint(stopped) is not None and not (stopped / ".lock").exists()


def test_a_reset_run_on_two_processes_follows_one_and_checkpoints_every_rows_reach(tmp_path):
    """``data.documents = "reset"`` under 2 processes: each rank passes its rows' starts, the loss trajectory
    is the one process's, and the checkpoint holds the reach of all B rows (gathered), equal to one process's;
    resumed on one process from the 2-process checkpoint it continues the one-process trajectory."""
    corpus = write_documents_corpus(tmp_path / "docs")
    reset = ("data.documents=reset", "model.mem_len=48", 'train.schedule="constant"')
    proc = subprocess.run(
        _torchrun("-m", "txl", *_train_args(corpus, tmp_path / "two", "train.steps=20", *reset)),
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    torch.manual_seed(0)
    train(run_config(corpus, *COMMON, "train.steps=30", *reset), tmp_path / "one", progress=False)
    two, one = train_losses(tmp_path / "two"), train_losses(tmp_path / "one")
    assert _close(two, {k: one[k] for k in two}), max(abs(two[k] - one[k]) / one[k] for k in two)
    reach_two = load_file(str(tmp_path / "two" / "checkpoints" / "step-00000020" / "state.safetensors"))
    reach_one = load_file(str(tmp_path / "one" / "checkpoints" / "step-00000020" / "state.safetensors"))
    assert reach_two["memory.reach"].tolist() == reach_one["memory.reach"].tolist()
    assert reach_two["memory.reach"].shape == (4,) and min(reach_two["memory.reach"].tolist()) < 48
    resume(tmp_path / "two", overrides=("train.steps=30",), progress=False)
    resumed = train_losses(tmp_path / "two")
    assert _close({k: resumed[k] for k in range(21, 31)}, {k: one[k] for k in range(21, 31)})
