"""The thread policy (issue 23): the pure choice against constructed environments and commands, the cgroup and
topology readers against constructed trees, ``import txl`` without torch, and what OpenMP itself read in a
``txl`` process (libgomp's ``OMP_DISPLAY_ENV`` report), per command, with and without the user's own
settings."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import txl
from txl.threads import (
    CHOSEN_VAR,
    ThreadSettings,
    cgroup_cpu_limit,
    choose_threads,
    command_of,
    physical_cores,
    workload,
)

SRC = Path(__file__).resolve().parents[1] / "src"
_OURS = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", CHOSEN_VAR)
"""The variables of the thread policy: cleared from the environment of the processes these tests start."""

# -- the choice: env + cores + command -> settings ------------------------------------------------------------

B = 1000  # GOMP_SPINCOUNT of the batches policy (train, eval, ...): every core, a short spin, then sleep


def batches(threads: int | None) -> ThreadSettings:
    return ThreadSettings(threads, "PASSIVE", B)


TOKENS = ThreadSettings(
    1, "PASSIVE", None
)  # generate, serve: one thread (passive where the user asks for more)


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
                "GOMP_SPINCOUNT": str(B),
                CHOSEN_VAR: f"OMP_NUM_THREADS=2,OMP_WAIT_POLICY=PASSIVE,GOMP_SPINCOUNT={B}",
                "LOCAL_WORLD_SIZE": "2",
            },
            2,
            "train",
            batches(1),
        ),
        # a value changed after txl recorded its own is the user's
        ({"OMP_NUM_THREADS": "4", CHOSEN_VAR: "OMP_NUM_THREADS=2"}, 2, "train", batches(None)),
        (
            {"GOMP_SPINCOUNT": "7", CHOSEN_VAR: f"GOMP_SPINCOUNT={B}"},
            2,
            "train",
            ThreadSettings(2, None, None),
        ),
        ({"OMP_WAIT_POLICY": "ACTIVE", CHOSEN_VAR: "OMP_WAIT_POLICY=PASSIVE"}, 2, "eval", ThreadSettings(2)),
    ],
)
def test_choice_follows_the_cores_and_the_command_and_leaves_the_users_settings(env, cores, command, want):
    before = dict(env)
    assert choose_threads(env, cores=cores, command=command) == want
    assert env == before  # pure: the environment given is not changed


def test_commands_and_their_workloads():
    assert command_of(["generate", "runs/x", "--prompt", "a"]) == "generate"
    assert command_of(["--debug", "serve", "runs/x"]) == "serve"
    assert command_of(["--version"]) is None and command_of([]) is None
    assert workload("generate") == workload("serve") == "tokens"
    assert {workload(c) for c in ("train", "eval", "analyze", "demo", "harness", None)} == {"batches"}


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
    code = "import sys, txl.safe_pickle, txl.interop.safe_pickle; print('torch' in sys.modules)"
    assert _python(code).stdout.split() == ["False"]  # reading a pickled vocabulary needs no torch
    code = (
        "import txl; print(txl.model.KVCache.__name__, callable(txl.evaluate.evaluate))"  # as the README does
    )
    assert _python(code).stdout.split() == ["KVCache", "True"]


def test_every_public_name_resolves_to_its_module():
    from txl import config, evaluate, generate, interop, model, threads

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
        evaluate: ("segment_losses",),
        threads: ("configure_threads",),
    }
    for module, exported in names.items():
        for name in exported:
            assert getattr(txl, name) is getattr(module, name), name
    assert txl.interop is interop and txl.evaluate is evaluate and txl.generate is generate
    modules = {"interop", "evaluate", "generate"}
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
        "print(s.num_threads, torch.get_num_threads(), os.environ['GOMP_SPINCOUNT'], os.environ['OMP_WAIT_POLICY'])"
    )
    assert before.stdout.split() == ["1", "1", str(B), "PASSIVE"], before.stderr
    decoding = _python(
        "import txl, os; txl.configure_threads(command='generate');"
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


@pytest.mark.slow
@pytest.mark.parametrize("launch", [_module, _script], ids=["python -m txl", "console script"])
def test_txl_process_runs_with_its_commands_policy(launch):
    assert _openmp_read(launch("eval"), cpus={0}) == _read(1, B)
    assert _openmp_read(launch("generate"), cpus={0}) == _read(1, 0)
    cpus = sorted(os.sched_getaffinity(0))[:2]
    if len(cpus) < 2:
        pytest.skip("one CPU here")
    assert _openmp_read(launch("eval"), cpus=set(cpus)) == _read(2, B)
    assert _openmp_read(launch("serve"), cpus=set(cpus)) == _read(1, 0)  # decoding: one thread on any cores


@pytest.mark.slow
def test_users_settings_win_in_a_txl_process():
    read = _openmp_read(MODULE, cpus={0}, OMP_NUM_THREADS="3", OMP_WAIT_POLICY="ACTIVE")
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
        "GOMP_SPINCOUNT": str(B),
        CHOSEN_VAR: f"OMP_NUM_THREADS=2,OMP_WAIT_POLICY=PASSIVE,GOMP_SPINCOUNT={B}",
    }
    read = _openmp_read(MODULE, cpus=set(cpus), LOCAL_WORLD_SIZE="2", **parent)
    assert read == _read(1, B)
