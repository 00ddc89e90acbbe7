"""Fault injection: a training process SIGKILLed at random moments (also while it writes a checkpoint and
while a second process tries the same run folder), a disk that fills up during a checkpoint write, a byte
flipped in a saved checkpoint, and CUDA random states restored on a machine with another GPU count.
Every time the run either continues exactly or says clearly why it cannot."""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError

from conftest import run_config, train_losses
from txl import TransformerXLConfig
from txl import checkpoint as ckpt
from txl.checkpoint import (
    CheckpointContents,
    DamagedCheckpoint,
    ResumeWarning,
    load_checkpoint,
    save_checkpoint,
)
from txl.cli import main
from txl.errors import CheckpointError, RunError
from txl.model import TransformerXL
from txl.runs import list_checkpoints, load_run, lock_run
from txl.train.trainer import resume, train

REPO = Path(__file__).resolve().parents[1]


def _sets(corpus: Path, *extra: str) -> list[str]:
    out = []
    for item in (f"data.corpus={json.dumps(str(corpus))}", *extra):
        out += ["--set", item]
    return out


def _leftovers(run_dir: Path) -> list[str]:
    """Temporary folders of checkpoint writes, temporary files of the run's files, and the lock, left in a
    run folder."""
    found = (
        [p.name for p in (run_dir / "checkpoints").glob(".*")] if (run_dir / "checkpoints").is_dir() else []
    )
    found += sorted(p.name for p in run_dir.glob(".*.tmp"))
    return found + ([".lock"] if (run_dir / ".lock").exists() else [])


# The fork server: imports txl and warms torch up once, then forks each training process, so that 40 starts
# cost milliseconds instead of seconds each. A forked child runs `txl.cli.main(argv)`: the very code that
# `python3 -m txl train ...` runs, with its own pid, files and exit status, and it can be SIGKILLed like it.
# torch runs on one thread (forking a process whose OpenMP pool has started is unsafe; one thread also keeps
# the reference and the resumed runs on the same arithmetic).
# Slow writes: `save_file` and `save_model` are wrapped to sleep before and after writing, so that most of
# each step is spent with a half-written `.tmp-*` checkpoint folder on disk, and a kill drawn uniformly over
# the run's duration lands in a checkpoint write most of the time. The patch is made in this test's own
# process (the server) and touches no library code; it only slows the writes, it changes no number.
FORK_SERVER = textwrap.dedent("""
    import json, os, random, signal, sys, time, traceback
    from pathlib import Path

    plan = json.loads(Path(sys.argv[1]).read_text())
    import torch
    torch.set_num_threads(1)
    import txl.checkpoint as ckpt
    from txl.cli import main

    def slow(write):
        def wrapper(*args, **kwargs):
            time.sleep(plan["write_delay"])
            result = write(*args, **kwargs)
            time.sleep(plan["write_delay"])
            return result
        return wrapper

    ckpt.save_file, ckpt.save_model = slow(ckpt.save_file), slow(ckpt.save_model)
    runs = Path(plan["runs"])

    def spawn(argv, name, *, stop_before_first_checkpoint=False):
        pid = os.fork()
        if pid == 0:
            code = 99
            try:
                if stop_before_first_checkpoint:  # stop itself, so the parent finds it there every time
                    import txl.train.trainer as trainer
                    save = trainer.save_checkpoint

                    def stop_then_save(*args, **kwargs):
                        os.kill(os.getpid(), signal.SIGSTOP)
                        return save(*args, **kwargs)

                    trainer.save_checkpoint = stop_then_save
                err = os.open(runs / f"{name}.err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
                os.dup2(err, 2)
                os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
                code = main(argv)
            except BaseException:
                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        return pid

    def wait(pid):
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])

    def train_argv(name):
        return ["train", "--config", "tiny", "--out", str(runs / name), "--quiet", *plan["sets"]]

    def resume_argv(name):
        return ["train", "--resume", str(runs / name), "--quiet"]

    def complete(name):
        folder = runs / name / "checkpoints"
        if not folder.is_dir():
            return []
        return sorted(p.name for p in folder.iterdir() if not p.name.startswith(".") and (p / "state.json").is_file())

    def running_out(pid):  # whether the process has ended (without reaping it)
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def hidden(name):
        folder = runs / name / "checkpoints"
        return sorted(p.name for p in folder.glob(".*")) if folder.is_dir() else []

    main(train_argv("warmup"))  # in this process: later children start warm
    start = time.monotonic()
    reference = wait(spawn(train_argv("reference"), "reference"))
    duration = time.monotonic() - start
    trials = []

    # a kill after the start has written its files, before its first checkpoint; while that process is
    # stopped there (alive, holding the run), a second resume and an --overwrite start are refused
    pid = spawn(train_argv("early"), "early", stop_before_first_checkpoint=True)
    assert os.WIFSTOPPED(os.waitpid(pid, os.WUNTRACED)[1])
    second = wait(spawn(resume_argv("early"), "early-second"))
    overwrite = wait(spawn(train_argv("early") + ["--overwrite"], "early-overwrite"))
    at_kill = complete("early")
    os.kill(pid, signal.SIGKILL)
    trials.append({"name": "early", "holder": pid, "killed": wait(pid), "complete": at_kill,
                   "hidden": hidden("early"), "second": second, "overwrite": overwrite,
                   "resumed": wait(spawn(resume_argv("early"), "early-resume"))})

    rng = random.Random(plan["seed"])
    for i in range(plan["kills"]):
        name = f"kill-{i:02d}"
        at = rng.uniform(0.0, duration)
        after = rng.randint(1, 6)  # odd trials: killed once this many checkpoints are complete
        begin = time.monotonic()
        pid = spawn(train_argv(name), name)
        if i % 2:  # by the run's own progress, so that a slow machine still kills after checkpoints
            while len(complete(name)) < after and not running_out(pid):
                time.sleep(0.001)
            time.sleep(rng.uniform(0.0, 0.05))
        else:  # at a moment of the reference run's duration
            time.sleep(max(0.0, begin + at - time.monotonic()))
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            killed = os.waitstatus_to_exitcode(status)
        else:
            os.kill(pid, signal.SIGKILL)
            killed = wait(pid)
        trials.append({"name": name, "at": at, "killed": killed, "complete": complete(name),
                       "hidden": hidden(name), "resumed": wait(spawn(resume_argv(name), f"{name}-resume"))})
    Path(plan["out"]).write_text(json.dumps({"reference": reference, "duration": duration, "trials": trials}))
""")


# A process that takes a run's lock, stopped by itself (SIGSTOP) at the moment it writes the lock's record:
# the parent SIGKILLs it there, the widest form of a kill that lands between creating the lock and filling it.
KILLED_WHILE_LOCKING = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    from txl.runs import lock_run

    fdopen = os.fdopen

    def stop_then_fdopen(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGSTOP)
        return fdopen(*args, **kwargs)

    os.fdopen = stop_then_fdopen
    with lock_run(Path(sys.argv[1])):
        pass
""")


@pytest.mark.slow
def test_a_process_killed_while_it_takes_the_lock_leaves_no_lock(tmp_path, text_corpus):
    """Killed while writing its lock's record, a process leaves no lock (an empty one was taken for a live
    owner and refused the next command); its draft is swept by the next process that locks the run."""
    run = tmp_path / "run"
    train(
        run_config(text_corpus, "train.steps=2", "train.checkpoint_every=1", "train.eval_every=0"),
        run,
        progress=False,
    )
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WHILE_LOCKING, str(run)], env=env)
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert not (run / ".lock").exists()
    assert resume(run, overrides=("train.steps=3",), progress=False)["steps"] == 3
    assert _leftovers(run) == [] and not list(run.glob(".lock*")), sorted(p.name for p in run.iterdir())


# A process that says when it started (seconds since boot), takes a run's lock, says so, and holds it until
# it is killed.
HOLDS_THE_LOCK = textwrap.dedent("""
    import sys, time
    print(time.clock_gettime(time.CLOCK_BOOTTIME), flush=True)
    from pathlib import Path
    from txl.runs import lock_run

    with lock_run(Path(sys.argv[1])):
        print("locked", flush=True)
        time.sleep(600)
""")


@pytest.mark.skipif(not Path("/proc/self/stat").is_file(), reason="needs Linux's /proc")
def test_a_lock_is_live_only_while_the_very_process_that_took_it_runs(tmp_path):
    """A lock's pid alone does not say that its process runs: a lock whose pid the kernel has since given to
    another process (pids wrap around) and the lock of a process killed but not yet waited for by its
    parent (a zombie) hold nothing, and are replaced; the lock of the live holder is refused. The lock
    records when its holder started as this boot's id and the clock tick of the start."""
    run = tmp_path / "run"
    run.mkdir()
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    before = time.clock_gettime(time.CLOCK_BOOTTIME)
    proc = subprocess.Popen([sys.executable, "-c", HOLDS_THE_LOCK, str(run)], env=env, stdout=subprocess.PIPE)
    try:
        running = float(proc.stdout.readline())
        assert proc.stdout.readline() == b"locked\n"
        record = json.loads((run / ".lock").read_text())
        assert record["pid"] == proc.pid
        boot, _, ticks = record["started"].rpartition(":")
        assert boot == Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        assert before - 0.02 <= int(ticks) / os.sysconf("SC_CLK_TCK") <= running  # ticks are whole 1/100 s
        with pytest.raises(RunError, match=rf"another process \(pid {proc.pid} on .*\) holds the run"):
            with lock_run(run):
                pass
        # as left by an earlier process that had the same pid: the live process is not its owner
        (run / ".lock").write_text(json.dumps({**record, "started": "when an earlier process started"}))
        with lock_run(run) as lock:
            assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert not list(run.glob(".lock*")), sorted(p.name for p in run.iterdir())
        # the holder's own lock again, then the holder killed and left unreaped (a zombie)
        (run / ".lock").write_text(json.dumps(record))
        os.kill(proc.pid, signal.SIGKILL)
        os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # it has died; it is not waited for
        with lock_run(run) as lock:
            assert json.loads(lock.read_text())["pid"] == os.getpid()
        assert not list(run.glob(".lock*")), sorted(p.name for p in run.iterdir())
    finally:
        proc.kill()
        proc.wait()


# `txl train` stopped by itself (SIGSTOP) while it writes config.json, its temporary file just created: it has
# made the run folder, taken its lock and written vocab.json. The parent tries the run while it is stopped
# there, then SIGKILLs it.
STOPPED_WRITING_CONFIG = textwrap.dedent("""
    import os, signal, sys
    import txl.files as files
    from txl.cli import main

    create = files._create_temporary

    def create_then_stop(path):
        created = create(path)
        if path.name == "config.json":
            os.kill(os.getpid(), signal.SIGSTOP)
        return created

    files._create_temporary = create_then_stop
    sys.exit(main(sys.argv[1:]))
""")


@pytest.mark.slow
def test_a_start_killed_before_its_config_leaves_no_lock_and_resume_says_why(tmp_path, text_corpus, capsys):
    """Between taking the lock and writing config.json, a starting run is alive and its folder holds no
    run yet: a resume is refused as in use (it was told the folder holds no run). Killed there, it leaves a
    lock and a half-written config.json's temporary file, which `txl train --resume` clears (it left them
    behind) while it says, in one line, that the folder holds no run; the same start then runs again
    without --overwrite and leaves no temporary file."""
    run = tmp_path / "run"
    argv = ["train", "--config", "tiny", "--out", str(run), "--quiet"]
    argv += _sets(text_corpus, "train.steps=2", "train.eval_every=0", "train.log_every=1")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-c", STOPPED_WRITING_CONFIG, *argv], env=env)
    try:
        _, status = os.waitpid(proc.pid, os.WUNTRACED)
        assert os.WIFSTOPPED(status), status
        assert (run / ".lock").is_file() and (run / "vocab.json").is_file()
        assert not (run / "config.json").exists() and len(list(run.glob(".config.json.*.tmp"))) == 1
        capsys.readouterr()
        assert main(["train", "--resume", str(run), "--quiet"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"another process (pid {proc.pid} on " in err[0], err
        assert "holds the run" in err[0], err
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert (run / ".lock").is_file()  # the killed start's
    assert main(["train", "--resume", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"txl: error: {run} holds no run (no config.json)"]
    assert sorted(p.name for p in run.iterdir()) == ["vocab.json"]
    assert main(argv) == 0
    assert sorted(train_losses(run)) == [1, 2] and not list(run.glob(".*")), sorted(run.glob(".*"))


@pytest.mark.slow
def test_sigkill_at_random_moments_resumes_exactly_or_says_why(tmp_path, text_corpus):
    """20 SIGKILLs drawn with a seeded random.Random (checkpoint every step, checkpoint writes slowed: see
    FORK_SERVER): half at a moment of an uninterrupted run's duration, half a moment after a drawn number of
    checkpoints are complete (so that a slow or loaded machine still kills after checkpoints), plus one kill
    just before the first checkpoint while a second process tries the run. After each, `txl train --resume`
    reproduces the uninterrupted run's losses float for float, or, when no checkpoint was complete, fails with one line that says so. No `.tmp-*`
    folder is ever taken as a checkpoint (the losses would differ) and none is left behind."""
    runs = tmp_path / "runs"
    runs.mkdir()
    sets = _sets(
        text_corpus,
        "train.steps=8",
        "train.checkpoint_every=1",
        "train.eval_every=0",
        "train.log_every=1",
        "train.varlen=true",
        "model.dropout=0.1",
        "train.keep_last=2",
    )
    plan = {
        "runs": str(runs),
        "out": str(tmp_path / "result.json"),
        "sets": sets,
        "seed": 1234,
        "kills": 20,
        "write_delay": 0.01,
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    env = dict(os.environ, PYTHONPATH=str(REPO / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run(
        [sys.executable, "-c", FORK_SERVER, str(tmp_path / "plan.json")],
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,  # about 20 s on a quiet machine; minutes on a loaded one
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["reference"] == 0, (runs / "reference.err").read_text()
    reference = train_losses(runs / "reference")
    reference_summary = json.loads((runs / "reference" / "summary.json").read_text())
    assert sorted(reference) == list(range(1, 9))

    early = result["trials"][0]
    for attempt in ("second", "overwrite"):
        err = (runs / f"early-{attempt}.err").read_text().strip().splitlines()
        assert early[attempt] == 2 and len(err) == 1, err
        assert f"another process (pid {early['holder']} on " in err[0] and "holds the run" in err[0]
    assert not early["complete"] and early["killed"] == -9  # stopped on its way to the first checkpoint

    resumed_from_checkpoint, saw_half_written = 0, 0
    for trial in result["trials"]:
        run = runs / trial["name"]
        err = (runs / f"{trial['name']}-resume.err").read_text().strip().splitlines()
        saw_half_written += any(name.startswith(".tmp-") for name in trial["hidden"])
        if trial["complete"]:
            if trial["resumed"] == 2:  # killed after it had finished and written its summary
                assert (run / "summary.json").exists() and "already finished 8 steps" in err[0], err
            else:
                assert trial["resumed"] == 0, (trial, err)
                resumed_from_checkpoint += 1
            assert train_losses(run) == reference, trial  # identical floats, every step
            assert json.loads((run / "summary.json").read_text())["val_loss"] == reference_summary["val_loss"]
        else:
            assert trial["resumed"] == 2 and len(err) == 1 and err[0].startswith("txl: error: "), (trial, err)
            assert "no checkpoint" in err[0] or "holds no run" in err[0] or "not found" in err[0], err
        assert _leftovers(run) == [], trial
    assert resumed_from_checkpoint >= 5 and saw_half_written >= 1, result["trials"]


def test_the_temporaries_of_killed_writes_go_with_the_next_process_that_holds_the_run(tmp_path, text_corpus):
    """A process killed while it wrote summary.json, metrics.jsonl (a resume truncating it) or config.json
    leaves that write's temporary file (``.NAME.RANDOM.tmp``, see the test above); the next resume or start
    in the folder deletes them, and nothing else of the folder's (a user's own hidden file stays)."""
    run = tmp_path / "run"
    common = ("train.checkpoint_every=1", "train.eval_every=0")
    train(run_config(text_corpus, "train.steps=2", *common), run, progress=False)
    left = [".config.json.00ff00ff.tmp", ".metrics.jsonl.89abcdef.tmp", ".summary.json.0123abcd.tmp"]
    users = [".notes.0123abcd.tmp", ".summary.json.notes.tmp"]
    for name in (*left, *users):
        (run / name).write_text('{"step"')
    assert resume(run, overrides=("train.steps=3",), progress=False)["steps"] == 3
    assert sorted(p.name for p in run.glob(".*")) == users
    for name in left:
        (run / name).write_text('{"step"')
    train(run_config(text_corpus, "train.steps=1", *common), run, overwrite=True, progress=False)
    assert sorted(p.name for p in run.glob(".*")) == users


class _Killed(BaseException):
    """Stands for a SIGKILL in the middle of a deletion (nothing catches it, as nothing catches a kill)."""


def test_a_prune_killed_while_it_deletes_a_checkpoint_leaves_nothing_of_it(
    tmp_path, text_corpus, monkeypatch
):
    """Keeping the last ``train.keep_last`` checkpoints deletes the older ones file by file: killed after
    state.json of step 1 is gone and before its tensor files are, the process left a ``step-00000001``
    folder that no longer counted as a checkpoint and so was never pruned again. Nothing of it may stay
    once the run is resumed."""
    common = ("train.checkpoint_every=1", "train.eval_every=0", "train.keep_last=2")
    rmtree = shutil.rmtree

    def killed_midway(path, *args, **kwargs):
        if "step-00000001" in Path(path).name:  # by name, whatever the name it is deleted under
            (Path(path) / "state.json").unlink()
            raise _Killed
        return rmtree(path, *args, **kwargs)

    run = tmp_path / "run"
    monkeypatch.setattr(shutil, "rmtree", killed_midway)
    with pytest.raises(_Killed):  # pruning step 1 once step 3 is saved
        train(run_config(text_corpus, "train.steps=4", *common), run, progress=False)
    assert [p.name for p in list_checkpoints(run)] == ["step-00000002", "step-00000003"]
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    assert resume(run, overrides=("train.steps=4",), progress=False)["steps"] == 4
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [
        "best",
        "step-00000003",
        "step-00000004",
    ]


def test_a_full_disk_fails_cleanly_and_keeps_the_previous_checkpoint(
    tmp_path, text_corpus, monkeypatch, capsys
):
    run = tmp_path / "run"
    real_save_file = ckpt.save_file
    calls = []

    def fills_up(tensors, filename, *args, **kwargs):
        calls.append(filename)
        if len(calls) == 3:  # the state file of the third checkpoint
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), filename)
        return real_save_file(tensors, filename, *args, **kwargs)

    monkeypatch.setattr(ckpt, "save_file", fills_up)
    argv = [
        "train",
        "--config",
        "tiny",
        "--out",
        str(run),
        "--quiet",
        *_sets(text_corpus, "train.steps=5", "train.checkpoint_every=1", "train.eval_every=0"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"txl: error: cannot write checkpoint step-00000003 in {run / 'checkpoints'}: No space left on device"
    ]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-00000001", "step-00000002"]
    assert _leftovers(run) == []
    assert load_run(run, checkpoint="latest").step == 2  # intact and loadable
    monkeypatch.setattr(ckpt, "save_file", real_save_file)
    assert resume(run, progress=False)["steps"] == 5


def test_a_failed_write_reported_by_safetensors_is_a_checkpoint_error(tmp_path, monkeypatch):
    """safetensors reports its own I/O errors (a full disk, a file-size limit) as SafetensorError."""

    def fails(tensors, filename, *args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(ckpt, "save_file", fails)
    model = TransformerXL(TransformerXLConfig(vocab_size=20, n_layer=1, d_model=8, d_head=4, d_inner=8))
    with pytest.raises(
        CheckpointError,
        match=r"^cannot write checkpoint best in .*: Error while serializing: "
        r"I/O error: No space left on device \(os error 28\)$",
    ):
        save_checkpoint(tmp_path / "best", CheckpointContents(model))
    assert list(tmp_path.iterdir()) == []


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) - 100] ^= 0x01  # in the tensor data, past the header: safetensors itself cannot tell
    path.write_bytes(bytes(data))


def test_a_flipped_byte_is_detected_and_resume_falls_back(tmp_path, text_corpus, capsys):
    common = (
        'train.schedule="constant"',
        "train.checkpoint_every=1",
        "train.eval_every=0",
        "train.log_every=1",
        "model.dropout=0.1",
    )
    reference = train(
        run_config(text_corpus, "train.steps=6", *common), tmp_path / "reference", progress=False
    )
    run = tmp_path / "run"
    train(run_config(text_corpus, "train.steps=4", *common), run, progress=False)
    for name in ("step-00000004", "best"):  # both at step 4
        _flip_byte(run / "checkpoints" / name / "model.safetensors")
    with pytest.raises(DamagedCheckpoint, match=r"step-00000004/model\.safetensors: checksum mismatch"):
        load_run(run, checkpoint="latest")
    assert main(["eval", str(run), "--quiet"]) == 2
    assert "best/model.safetensors: checksum mismatch" in capsys.readouterr().err
    with pytest.warns(
        ResumeWarning,
        match=r"step-00000004/model\.safetensors: checksum mismatch.*"
        r"resuming from the newest intact checkpoint step-00000003 \(step 3\)",
    ):
        summary = resume(run, overrides=("train.steps=6",), progress=False)
    assert summary["steps"] == 6 and summary["val_loss"] == reference["val_loss"]
    assert train_losses(run) == train_losses(tmp_path / "reference")

    # nothing intact: a clear error, and nothing changes
    for folder in (run / "checkpoints").iterdir():
        _flip_byte(folder / "state.safetensors")
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    with pytest.raises(
        DamagedCheckpoint, match=r"state\.safetensors: checksum mismatch.*no intact checkpoint"
    ):
        resume(run, overrides=("train.steps=8",), progress=False)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_checkpoints_without_checksums_still_load(tmp_path, text_corpus):
    run = tmp_path / "run"
    train(
        run_config(text_corpus, "train.steps=2", "train.checkpoint_every=1", "train.eval_every=0"),
        run,
        progress=False,
    )
    meta = run / "checkpoints" / "step-00000002" / "state.json"
    document = json.loads(meta.read_text())
    assert set(document["files"]) == {"model.safetensors", "state.safetensors"}
    del document["files"]  # as written before checksums were recorded
    meta.write_text(json.dumps(document))
    assert load_run(run, checkpoint="latest").step == 2
    assert resume(run, overrides=("train.steps=3",), progress=False)["steps"] == 3


def test_cuda_random_states_for_another_gpu_count_warn(tmp_path, monkeypatch):
    """A checkpoint written on 2 GPUs: restored on 1 GPU or on none, its CUDA RNG states cannot be set, and
    the resumed run is not exact; on 2 GPUs they are set and nothing is said."""
    model = TransformerXL(TransformerXLConfig(vocab_size=20, n_layer=1, d_model=8, d_head=4, d_inner=8))
    fake = [torch.full((16,), i, dtype=torch.uint8) for i in range(2)]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: fake)
    save_checkpoint(tmp_path / "ck", CheckpointContents(model))
    restored = []
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.warns(ResumeWarning, match=r"CUDA random state of 2 GPU\(s\), this machine has 1.*not exact"):
        load_checkpoint(tmp_path / "ck", model=model)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.warns(ResumeWarning, match="this machine has 0"):
        load_checkpoint(tmp_path / "ck", model=model)
    assert restored == []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResumeWarning)
        load_checkpoint(tmp_path / "ck", model=model)
    assert len(restored) == 1 and all(torch.equal(a, b) for a, b in zip(restored[0], fake, strict=True))
