"""The thread policy (issue 23): the pure choice against constructed environments, commands and loads, the
cgroup, topology and ``/proc/stat`` readers against constructed files, ``import txl`` without torch, what OpenMP
itself read in a ``txl`` process (libgomp's ``OMP_DISPLAY_ENV`` report), per command and machine, with and
without the user's own settings, and the same weights trained under either machine's wait."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import txl
from txl.cli import build_parser
from txl.cli.commands import COMMANDS, find
from txl.threads import (
    CHOSEN_VAR,
    MACHINE_VAR,
    POLICIES,
    SHARED_AT,
    ThreadSettings,
    busy_cores,
    cgroup_cpu_limit,
    choose_threads,
    machine_state,
    needs_load,
    other_load,
    physical_cores,
)

SRC = Path(__file__).resolve().parents[1] / "src"
_OURS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", CHOSEN_VAR, MACHINE_VAR)
"""The variables of the thread policy: cleared from the environment of the processes these tests start."""


def work(command: str | None) -> str:
    """The workload the ``txl`` command ``command`` declares (None: library use, the default ``batches``)."""
    return "batches" if command is None else find(command).workload


# -- the choice: env + cores + command + load -> settings -----------------------------------------------------

Q = 10_000  # GOMP_SPINCOUNT of the batches policy (train, eval, ...) on a quiet machine; a shared one: passive


def batches(threads: int | None) -> ThreadSettings:
    """The batches policy on a shared machine (or one whose load is unknown: ``busy=None``)."""
    return ThreadSettings(threads, "PASSIVE", None, "shared")


def quiet(threads: int | None) -> ThreadSettings:
    return ThreadSettings(threads, None, Q, "quiet")


TOKENS = ThreadSettings(
    1, "PASSIVE", None
)  # generate, serve: one thread (passive where the user asks for more), whatever the load


@pytest.mark.parametrize(
    ("env", "cores", "command", "want"),
    [
        ({}, 2, "train", batches(2)),
        ({}, 1, "eval", batches(1)),
        ({}, 2, None, batches(2)),  # library use: the batches policy
        ({}, 2, "generate", TOKENS),
        ({}, 8, "serve", TOKENS),
        ({"OMP_NUM_THREADS": "3"}, 2, "train", batches(None)),  # the user's count stands
        ({"OMP_NUM_THREADS": "1"}, 8, "train", batches(None)),  # torchrun's own 1 counts as theirs
        ({"OMP_NUM_THREADS": "2"}, 2, "generate", ThreadSettings(None, "PASSIVE", None)),
        # the user's wait policy or spin count: both stand (a spin count of txl's would override the policy)
        ({"OMP_WAIT_POLICY": "active"}, 2, "train", ThreadSettings(2, None, None)),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, 2, "generate", ThreadSettings(1, None, None)),
        ({"GOMP_SPINCOUNT": "5k"}, 2, "train", ThreadSettings(2, None, None)),
        ({"OMP_NUM_THREADS": "4", "GOMP_SPINCOUNT": "0"}, 2, "train", ThreadSettings(None, None, None)),
        ({"OMP_NUM_THREADS": " "}, 2, "train", batches(2)),  # empty: OpenMP ignores it, so does txl
        ({"LOCAL_WORLD_SIZE": "2"}, 16, "train", batches(8)),  # torchrun: divided among the processes
        ({"LOCAL_WORLD_SIZE": "2"}, 3, "train", batches(1)),
        ({"LOCAL_WORLD_SIZE": "4"}, 2, "train", batches(1)),  # at least one each
        # a worker of `txl train --nproc 2`: its parent's choice (recorded) is chosen again, for this process
        (
            {
                "OMP_NUM_THREADS": "2",
                "OMP_WAIT_POLICY": "PASSIVE",
                CHOSEN_VAR: "OMP_NUM_THREADS=2,OMP_WAIT_POLICY=PASSIVE",
                "LOCAL_WORLD_SIZE": "2",
            },
            2,
            "train",
            batches(1),
        ),
        # a value changed after txl recorded its own is the user's
        ({"OMP_NUM_THREADS": "4", CHOSEN_VAR: "OMP_NUM_THREADS=2"}, 2, "train", batches(None)),
        (
            {"GOMP_SPINCOUNT": "7", CHOSEN_VAR: f"GOMP_SPINCOUNT={Q}"},
            2,
            "train",
            ThreadSettings(2, None, None),
        ),
        ({"OMP_WAIT_POLICY": "ACTIVE", CHOSEN_VAR: "OMP_WAIT_POLICY=PASSIVE"}, 2, "eval", ThreadSettings(2)),
    ],
)
def test_choice_follows_the_cores_and_the_command_and_leaves_the_users_settings(env, cores, command, want):
    before = dict(env)
    assert choose_threads(env, cores=cores, workload=work(command)) == want
    busy = choose_threads(env, cores=cores, workload=work(command), busy=99.0)
    assert busy == want  # other work on every core: the shared machine's policy, as for an unknown load
    assert env == before  # pure: the environment given is not changed


@pytest.mark.parametrize(
    ("env", "cores", "command", "busy", "want"),
    [
        ({}, 2, "train", 0.0, quiet(2)),
        ({}, 2, "eval", SHARED_AT - 0.01, quiet(2)),
        ({}, 2, "train", SHARED_AT, batches(2)),
        ({}, 8, None, 1.0, batches(8)),  # one busy core of 8 is taken: this process would use all 8
        ({}, 2, "generate", 0.0, TOKENS),  # decoding: one thread on any machine
        ({"OMP_NUM_THREADS": "3"}, 2, "train", 0.0, quiet(None)),  # the user's count, txl's wait
        ({"GOMP_SPINCOUNT": "5"}, 2, "train", 0.0, ThreadSettings(2, None, None)),  # the user's wait
        # torchrun's other local processes start at the same time: their load is not another job's
        ({"LOCAL_WORLD_SIZE": "2"}, 16, "train", 1.2, quiet(8)),
        ({"LOCAL_WORLD_SIZE": "2"}, 16, "train", 1.6, batches(8)),
        # said instead of looked at
        ({MACHINE_VAR: "shared"}, 2, "train", 0.0, batches(2)),
        ({MACHINE_VAR: "Quiet"}, 2, "train", 2.0, quiet(2)),
        ({MACHINE_VAR: "quiet"}, 2, "train", None, quiet(2)),
        ({MACHINE_VAR: "auto"}, 2, "train", 0.0, quiet(2)),
        ({MACHINE_VAR: "auto"}, 2, "train", None, batches(2)),
    ],
)
def test_the_load_chooses_the_wait(env, cores, command, busy, want):
    assert choose_threads(env, cores=cores, workload=work(command), busy=busy) == want


@pytest.mark.parametrize("command", ["train", "eval", None, "generate", "serve"])
@pytest.mark.parametrize(
    "env", [{}, {"LOCAL_WORLD_SIZE": "3"}, {"OMP_NUM_THREADS": "2"}, {"OMP_WAIT_POLICY": "ACTIVE"}]
)
@pytest.mark.parametrize("cores", [1, 2, 7, 64])
def test_the_load_never_changes_the_thread_count(command, env, cores):
    """The thread count can change the order of floating-point sums: it must not depend on the load."""
    counts = {
        choose_threads(env, cores=cores, workload=work(command), busy=b).num_threads for b in (None, 0, 1, 99)
    }
    assert len(counts) == 1
    for policies in POLICIES.values():
        assert policies["quiet"].threads == policies["shared"].threads


def test_when_the_load_is_looked_at():
    assert (
        needs_load({}, work("train")) and needs_load({}) and needs_load({MACHINE_VAR: "auto"}, work("eval"))
    )
    assert needs_load({"OMP_NUM_THREADS": "4"}, work("train"))  # the wait is still txl's
    assert not needs_load({}, work("generate"))  # one policy for both machines: no 50 ms spent looking
    assert not needs_load({"GOMP_SPINCOUNT": "0"}, work("train"))  # the user's wait
    assert not needs_load({MACHINE_VAR: "quiet"}, work("train"))  # said, not looked at
    with pytest.raises(ValueError, match=f"{MACHINE_VAR} must be quiet, shared or auto, got 'sometimes'"):
        machine_state({MACHINE_VAR: "sometimes"}, 0.0)
    with pytest.raises(ValueError, match=MACHINE_VAR):
        choose_threads({MACHINE_VAR: "busy"}, cores=2, workload=work("train"))


def _stat(*cpus: tuple[int, int, int, int]) -> str:
    """A /proc/stat text: the total line, then one ``cpuN user nice system idle iowait irq softirq steal`` line
    per (user, system, idle, iowait)."""
    lines = ["cpu  1 2 3 4 5 6 7 8 0 0"]
    for n, (user, system, idle, iowait) in enumerate(cpus):
        lines.append(f"cpu{n} {user} 0 {system} {idle} {iowait} 0 0 0 0 0")
    return "\n".join([*lines, "intr 1 2 3", "ctxt 99", "procs_running 3"]) + "\n"


def test_busy_cores_from_two_proc_stat_texts():
    before = _stat((100, 10, 1000, 5), (200, 20, 2000, 0), (0, 0, 10, 0))
    # cpu0: 5 busy ticks of 10 (user 4, system 1; idle 4, iowait 1: iowait counts as idle); cpu1: all 10
    # busy; cpu2: 10 idle ticks
    after = _stat((104, 11, 1004, 6), (208, 22, 2000, 0), (0, 0, 20, 0))
    assert busy_cores(before, after, {0}) == pytest.approx(0.5)
    assert busy_cores(before, after, {1}) == pytest.approx(1.0)
    assert busy_cores(before, after, {0, 1, 2}) == pytest.approx(1.5)
    assert busy_cores(before, after, {2, 9}) == pytest.approx(0.0)  # cpu9: not in the texts
    assert busy_cores(before, after, {9}) is None
    assert busy_cores(before, before, {0, 1}) is None  # no time passed


def test_other_load_reads_its_file_twice(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(_stat(*[(1, 1, 1, 1)] * 64))
    assert other_load(0.0, stat) is None  # the same text twice: no time passed
    assert other_load(0.0, tmp_path / "missing") is None


@pytest.mark.slow
def test_other_load_sees_a_competing_process():
    """A CPU-bound process on this process's core keeps it busy; the reading is taken while this one sleeps."""
    if not Path("/proc/stat").is_file():
        pytest.skip("no /proc/stat here")
    cpu = min(os.sched_getaffinity(0))
    spinner = subprocess.Popen(
        [sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, {cpu})
    )
    try:
        code = "import os; os.sched_setaffinity(0, {%d}); from txl.threads import other_load; print(other_load())"
        readings = [_python(code % cpu).stdout.strip() for _ in range(3)]
    finally:
        spinner.kill()
        spinner.wait()
    assert all(float(r) >= 0.9 for r in readings), readings


def test_commands_and_their_workloads():
    parse = build_parser().parse_args
    assert parse(["generate", "runs/x", "--prompt", "a"]).txl_command.name == "generate"
    assert parse(["--debug", "serve", "runs/x"]).txl_command.name == "serve"
    assert work("generate") == work("serve") == work("rl train") == work("rl eval") == "tokens"
    tokens = ("generate", "serve", "rl train", "rl eval")
    assert {c.workload for c in COMMANDS if f"{c.parent or ''} {c.name}".strip() not in tokens} == {"batches"}
    assert {work(c) for c in ("train", "eval", "analyze memory", "demo", "harness", None)} == {"batches"}
    with pytest.raises(ValueError, match="workload must be one of batches, tokens, got 'generate'"):
        choose_threads({}, cores=2, workload="generate")


def test_settings_write_their_values_and_the_record():
    assert ThreadSettings(3, None, 2000).environ() == {
        "OMP_NUM_THREADS": "3",
        "GOMP_SPINCOUNT": "2000",
        CHOSEN_VAR: "OMP_NUM_THREADS=3,GOMP_SPINCOUNT=2000",
    }
    assert ThreadSettings(None, "PASSIVE").environ() == {
        "OMP_WAIT_POLICY": "PASSIVE",
        CHOSEN_VAR: "OMP_WAIT_POLICY=PASSIVE",
    }
    with pytest.raises(ValueError, match="cores"):
        choose_threads({}, cores=0)


# -- cores: cgroup quotas and the topology --------------------------------------------------------------------


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_quota_is_the_smallest_on_the_path(tmp_path):
    _write(tmp_path / "a" / "b" / "cpu.max", "150000 100000\n")  # 1.5 CPUs
    _write(tmp_path / "a" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit("0::/a/b\n", tmp_path) == 1.5
    _write(tmp_path / "a" / "cpu.max", "100000 100000\n")  # an ancestor allows 1
    assert cgroup_cpu_limit("0::/a/b\n", tmp_path) == 1.0
    _write(tmp_path / "cpu.max", "50000 100000\n")  # the root too (a container's own root)
    assert cgroup_cpu_limit("0::/a/b\n", tmp_path) == 0.5


def test_cgroup_without_quota_is_none(tmp_path):
    _write(tmp_path / "x" / "cpu.max", "max 100000\n")
    assert cgroup_cpu_limit("0::/x\n", tmp_path) is None
    assert cgroup_cpu_limit("0::/missing\n", tmp_path) is None
    assert cgroup_cpu_limit("", tmp_path) is None


def test_cgroup_v1_cfs_quota(tmp_path):
    folder = tmp_path / "cpu,cpuacct" / "docker" / "c1"
    _write(folder / "cpu.cfs_quota_us", "300000\n")
    _write(folder / "cpu.cfs_period_us", "100000\n")
    text = "12:memory:/docker/c1\n3:cpu,cpuacct:/docker/c1\n"
    assert cgroup_cpu_limit(text, tmp_path) == 3.0
    _write(folder / "cpu.cfs_quota_us", "-1\n")  # no quota
    assert cgroup_cpu_limit(text, tmp_path) is None


def test_hyperthreads_of_one_core_count_once(tmp_path):
    for cpu, (package, core) in enumerate([(0, 0), (0, 1), (0, 0), (0, 1), (1, 0)]):  # 0 and 2 are siblings
        _write(tmp_path / f"cpu{cpu}" / "topology" / "core_id", f"{core}\n")
        _write(tmp_path / f"cpu{cpu}" / "topology" / "physical_package_id", f"{package}\n")
    assert physical_cores({0, 1, 2, 3, 4}, tmp_path) == 3
    assert physical_cores({0, 2}, tmp_path) == 1
    assert physical_cores({0, 9}, tmp_path) == 2  # cpu9 has no topology: the logical count


# -- the package: import txl without torch, every name as before ---------------------------------------------


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in _OURS}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**base, "PYTHONPATH": str(SRC), **env},
        timeout=120,
    )


@pytest.mark.slow
def test_import_txl_imports_no_torch_and_changes_no_environment():
    code = (
        "import os, sys; before = dict(os.environ); import txl, txl.cli, txl.threads;"
        "print('torch' in sys.modules, os.environ == before)"
    )
    out = _python(code)
    assert out.stdout.split() == ["False", "True"], out.stderr
    code = "import sys, txl; print([m for m in sys.modules if m.startswith('txl.interop')])"
    assert _python(code).stdout.split() == ["[]"]  # the importers are imported when first used
    code = "import sys, txl.interop.safe_pickle; print('torch' in sys.modules)"
    assert _python(code).stdout.split() == ["False"]  # reading a pickled vocabulary needs no torch
    code = "import txl; print(txl.model.KVCache.__name__, callable(txl.evaluation.evaluate))"  # as the README does
    assert _python(code).stdout.split() == ["KVCache", "True"]


def test_every_public_name_resolves_to_its_module():
    from txl import config, evaluation, inference, interop, model, threads

    names = {
        config: (
            "TransformerXLConfig",
            "DataConfig",
            "TrainConfig",
            "EvalConfig",
            "GenerateConfig",
            "RunConfig",
            "Span",
            "ConfigError",
            "load_config",
        ),
        model: ("TransformerXL", "ModelOutput", "Memory", "update_memory", "KVCache"),
        evaluation: ("evaluate", "segment_losses"),
        inference: ("generate", "stream", "SamplingParams", "DecodeSettings", "Engine", "Step"),
        threads: ("configure_threads",),
    }
    for module, exported in names.items():
        for name in exported:
            assert getattr(txl, name) is getattr(module, name), name
    assert txl.interop is interop and txl.evaluate is evaluation.evaluate and callable(txl.evaluate)
    modules = {"interop"}
    assert {n for exported in names.values() for n in exported} | modules == set(txl.__all__)
    assert set(txl.__all__) == set(txl._EXPORTS) and set(txl.__all__) <= set(dir(txl))
    namespace: dict = {}
    exec("from txl import *", namespace)
    assert {name for name in namespace if not name.startswith("__")} == set(txl.__all__)
    with pytest.raises(AttributeError, match="no_such_name"):
        txl.no_such_name  # noqa: B018


@pytest.mark.slow
def test_configure_threads_in_a_library():
    """Before torch: the environment, which OpenMP reads when torch loads; after: only the count."""
    before = _python(
        "import txl; s = txl.configure_threads(1); import os, torch;"
        "print(s.num_threads, torch.get_num_threads(), 'GOMP_SPINCOUNT' in os.environ, os.environ['OMP_WAIT_POLICY'])",
        TXL_THREADS_MACHINE="shared",
    )
    assert before.stdout.split() == ["1", "1", "False", "PASSIVE"], before.stderr
    calm = _python(
        "import txl, os; s = txl.configure_threads();"
        "print(s.machine, os.environ['GOMP_SPINCOUNT'], 'OMP_WAIT_POLICY' in os.environ)",
        TXL_THREADS_MACHINE="quiet",
    )
    assert calm.stdout.split() == ["quiet", str(Q), "False"], calm.stderr
    parents = {"OMP_WAIT_POLICY": "PASSIVE", CHOSEN_VAR: "OMP_NUM_THREADS=2,OMP_WAIT_POLICY=PASSIVE"}
    child = _python(  # a txl parent's passive wait is not carried into a quiet child's choice
        f"import txl, os; txl.configure_threads(); print(os.environ.get('OMP_WAIT_POLICY'), os.environ['{CHOSEN_VAR}'])",
        TXL_THREADS_MACHINE="quiet",
        **parents,
    )
    wait, record = child.stdout.split()
    assert wait == "None" and "OMP_WAIT_POLICY" not in record and f"GOMP_SPINCOUNT={Q}" in record, (
        child.stderr
    )
    users = _python(
        "import txl, os; txl.configure_threads(); print(os.environ.get('OMP_WAIT_POLICY'))",
        TXL_THREADS_MACHINE="quiet",
        **{**parents, "OMP_WAIT_POLICY": "ACTIVE"},  # changed after the parent: the user's
    )
    assert users.stdout.split() == ["ACTIVE"], users.stderr
    decoding = _python(
        "import txl, os; txl.configure_threads(workload='tokens');"
        "print(os.environ['OMP_NUM_THREADS'], 'GOMP_SPINCOUNT' in os.environ)"
    )
    assert decoding.stdout.split() == ["1", "False"], decoding.stderr
    after = _python(
        "import torch, txl, os; torch.set_num_threads(2); s = txl.configure_threads(1);"
        "print(s, torch.get_num_threads(), 'GOMP_SPINCOUNT' in os.environ)"
    )
    assert after.stdout.split()[-2:] == ["1", "False"], after.stderr
    users = _python(
        "import txl, torch; txl.configure_threads(); print(torch.get_num_threads())", OMP_NUM_THREADS="1"
    )
    assert users.stdout.split() == ["1"], users.stderr


# -- end to end: what OpenMP read in a txl process ------------------------------------------------------------


def _openmp_read(command: list[str], *, cpus: set[int] | None = None, **env: str) -> dict[str, str]:
    """OMP_NUM_THREADS, OMP_WAIT_POLICY and GOMP_SPINCOUNT as libgomp reports them (``OMP_DISPLAY_ENV``) when
    torch loads in ``command``, run with the CPU affinity ``cpus``. libgomp reports its default wait policy as
    ``PASSIVE`` too: the spin count tells them apart (0 when passive, 300000 by default)."""
    base = {k: v for k, v in os.environ.items() if k not in _OURS}
    out = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**base, "PYTHONPATH": str(SRC), "OMP_DISPLAY_ENV": "VERBOSE", **env},
        preexec_fn=None if cpus is None else (lambda: os.sched_setaffinity(0, cpus)),
        timeout=300,
    )
    found = dict(
        re.findall(
            r"^\s*(OMP_NUM_THREADS|OMP_WAIT_POLICY|GOMP_SPINCOUNT) = '([^']*)'", out.stderr, flags=re.M
        )
    )
    if not found:
        pytest.skip(f"this OpenMP runtime does not report its settings: {out.stderr[-300:]}")
    assert "txl: error: run folder not found" in out.stderr, out.stderr  # the command itself ran
    return found


def _module(command: str) -> list[str]:
    """``python -m txl COMMAND /nonexistent-run``: imports torch, then refuses the folder."""
    return [sys.executable, "-m", "txl", command, "/nonexistent-run"]


def _script(command: str) -> list[str]:
    """The same through ``txl.cli.main``, as pip's console script calls it."""
    return [
        sys.executable,
        "-c",
        "import sys; from txl.cli import main; sys.exit(main())",
        command,
        "/nonexistent-run",
    ]


MODULE = _module("eval")


def _read(threads: int, spins: int) -> dict[str, str]:
    """What libgomp reports for ``threads`` threads, a passive wait policy and a spin count of ``spins``."""
    return {"OMP_NUM_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": str(spins)}


SHARED = {MACHINE_VAR: "shared"}
QUIET = {MACHINE_VAR: "quiet"}


@pytest.mark.slow
@pytest.mark.parametrize("launch", [_module, _script], ids=["python -m txl", "console script"])
def test_txl_process_runs_with_its_commands_policy(launch):
    assert _openmp_read(launch("eval"), cpus={0}, **SHARED) == _read(1, 0)
    assert _openmp_read(launch("generate"), cpus={0}) == _read(1, 0)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("one CPU here")
    assert _openmp_read(launch("eval"), cpus=set(cpus), **SHARED) == _read(2, 0)
    # quiet: libgomp's default wait policy (reported as PASSIVE too), the longer spin
    assert _openmp_read(launch("eval"), cpus=set(cpus), **QUIET) == _read(2, Q)
    assert _openmp_read(launch("serve"), cpus=set(cpus), **QUIET) == _read(1, 0)  # decoding: one thread


@pytest.mark.slow
def test_txl_process_sees_a_shared_machine():
    """Left to look (the default), a txl process whose cores another process keeps busy takes the shared wait."""
    cpus = set(sorted(os.sched_getaffinity(0))[:2])
    spinners = [
        subprocess.Popen(
            [sys.executable, "-c", "while True: pass"], preexec_fn=lambda: os.sched_setaffinity(0, cpus)
        )
        for _ in cpus
    ]
    try:
        read = _openmp_read(MODULE, cpus=cpus)
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
    assert read == _read(len(cpus), 0)


@pytest.mark.slow
def test_txl_process_refuses_a_bad_machine_value():
    base = {k: v for k, v in os.environ.items() if k not in _OURS}
    out = subprocess.run(
        MODULE,
        capture_output=True,
        text=True,
        env={**base, "PYTHONPATH": str(SRC), MACHINE_VAR: "sometimes"},
        timeout=120,
    )
    assert out.returncode != 0
    assert out.stderr.strip() == f"txl: error: {MACHINE_VAR} must be quiet, shared or auto, got 'sometimes'"


@pytest.mark.slow
def test_users_settings_win_in_a_txl_process():
    read = _openmp_read(MODULE, cpus={0}, OMP_NUM_THREADS="3", OMP_WAIT_POLICY="ACTIVE", **QUIET)
    assert read == {"OMP_NUM_THREADS": "3", "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "30000000000"}
    cpus = set(sorted(os.sched_getaffinity(0))[:2])
    read = _openmp_read(_module("generate"), cpus=cpus, OMP_NUM_THREADS="2", OMP_WAIT_POLICY="ACTIVE")
    assert read == {"OMP_NUM_THREADS": "2", "OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "30000000000"}
    read = _openmp_read(MODULE, cpus={0}, GOMP_SPINCOUNT="123")  # libgomp's default wait policy, their spin
    assert read == _read(1, 123)


@pytest.mark.slow
def test_torchrun_worker_divides_the_cores_its_parent_chose_for():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("one CPU here")
    parent = {
        "OMP_NUM_THREADS": "2",
        "OMP_WAIT_POLICY": "PASSIVE",
        CHOSEN_VAR: "OMP_NUM_THREADS=2,OMP_WAIT_POLICY=PASSIVE",
    }
    read = _openmp_read(MODULE, cpus=set(cpus), LOCAL_WORLD_SIZE="2", **parent, **SHARED)
    assert read == _read(1, 0)
    read = _openmp_read(MODULE, cpus=set(cpus), LOCAL_WORLD_SIZE="2", **parent, **QUIET)
    assert read == _read(1, Q)  # the parent's shared wait was its own choice: this process chooses again


# -- results: the load chooses only the wait, and the wait changes no result ---------------------------------

_TRAIN = """
import hashlib, sys, torch
from txl import TransformerXL, TransformerXLConfig
torch.manual_seed(0)
config = TransformerXLConfig(vocab_size=500, n_layer=2, n_head=4, d_head=32, d_model=128, d_inner=512, mem_len=32)
model = TransformerXL(config)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, 500, (16, 4 * 64 + 1), generator=torch.Generator().manual_seed(1))
memory = None
for step in range(4):  # (16, 64) segments: (16, 64, 128) activations, well above one thread's grain
    x, y = data[:, step * 64 : (step + 1) * 64], data[:, step * 64 + 1 : (step + 1) * 64 + 1]
    out = model(x, targets=y, memory=memory)
    out.loss.mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    memory = out.memory
digest = hashlib.sha256()
for value in model.state_dict().values():
    digest.update(value.detach().contiguous().numpy().tobytes())
print(torch.get_num_threads(), digest.hexdigest())
"""


@pytest.mark.slow
def test_the_same_weights_under_either_machines_wait():
    """Four training steps with 2 threads under the quiet machine's wait and under the shared one's give the
    same weights, bit for bit: the load txl looks at cannot change what a command computes."""
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("one CPU here")
    code = f"import os; os.sched_setaffinity(0, {set(cpus)}); import txl; txl.configure_threads();" + _TRAIN
    runs = {machine: _python(code, TXL_THREADS_MACHINE=machine) for machine in ("quiet", "shared")}
    outs = {machine: run.stdout.split() for machine, run in runs.items()}
    errors = {machine: run.stderr[-500:] for machine, run in runs.items()}
    assert all(len(out) == 2 and out[0] == "2" for out in outs.values()), errors
    assert outs["quiet"] == outs["shared"]


def _decoding_model():
    import torch

    from txl import TransformerXL, TransformerXLConfig

    torch.manual_seed(0)
    config = TransformerXLConfig(
        vocab_size=30, n_layer=2, n_head=2, d_head=4, d_model=8, d_inner=16, mem_len=8
    )
    return TransformerXL(config).eval(), torch.tensor([[1, 2, 3, 4]])


@pytest.fixture
def two_threads():
    """The caller's count is 2 for the test (txl's own choice in the environment, as conftest made it); the
    count before is given back after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_decoding_steps_run_on_one_thread_and_give_the_callers_count_back(two_threads, monkeypatch):
    """A library user's program with torch's count at 2: every step of the decoding loop (generate, stream,
    generate_text) runs on one thread, and between the steps of a stream and after a call the count is the
    caller's again; an OMP_NUM_THREADS of the user's own stands."""
    import torch

    import txl.inference.engine as engine
    from txl.data.vocab import ByteVocab
    from txl.inference import SamplingParams
    from txl.inference.text import generate_text

    inside: list[int] = []
    real_draw = engine.draw

    def draw(*args, **kwargs):  # the engine draws each token inside its step
        inside.append(torch.get_num_threads())
        return real_draw(*args, **kwargs)

    monkeypatch.setattr(engine, "draw", draw)
    model, prompt = _decoding_model()
    settings = SamplingParams(max_new_tokens=5, temperature=0.8, seed=0)
    between = [torch.get_num_threads() for _ in txl.stream(model, prompt, settings)]
    assert inside == [1] * 5 and between == [2] * 5 and torch.get_num_threads() == 2
    inside.clear()
    txl.generate(model, prompt, settings)
    assert inside == [1] * 5 and torch.get_num_threads() == 2
    inside.clear()
    bytes_model = txl.TransformerXL(txl.TransformerXLConfig(vocab_size=256, n_layer=1, d_model=8, n_head=2,
                                                            d_head=4, d_inner=8, mem_len=4)).eval()  # fmt: skip
    generate_text(bytes_model, ByteVocab(), "class ", settings)
    assert inside == [1] * 5 and torch.get_num_threads() == 2

    inside.clear()
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's own (not the value txl recorded as its choice)
    monkeypatch.delenv(CHOSEN_VAR, raising=False)
    txl.generate(model, prompt, settings)
    assert inside == [2] * 5 and torch.get_num_threads() == 2


def test_threads_for_gives_the_count_back_when_the_block_fails(two_threads):
    import torch

    from txl.threads import threads_for

    with pytest.raises(RuntimeError, match="inside"), threads_for("tokens") as count:
        assert count == torch.get_num_threads() == 1
        raise RuntimeError("inside")
    assert torch.get_num_threads() == 2
    with pytest.raises(ValueError, match="workload must be one of batches, tokens, got 'words'"):
        with threads_for("words"):  # type: ignore[arg-type]
            pass
