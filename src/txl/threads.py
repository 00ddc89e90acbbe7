"""The CPU thread policy of txl's entry points: how many OpenMP threads, and how long an idle one spins before
it sleeps, chosen per command before torch starts its thread pool. It imports no torch; library use changes
nothing unless asked.

OpenMP (libgomp, which PyTorch's Linux CPU wheels ship and use) reads ``OMP_NUM_THREADS``, ``OMP_WAIT_POLICY``
and ``GOMP_SPINCOUNT`` once, when torch is imported. An idle worker thread spins ``GOMP_SPINCOUNT`` times
before it sleeps: 300,000 spins (a few milliseconds) by default, none with ``OMP_WAIT_POLICY=PASSIVE``. Long
spins are ruinous when another process holds a core (every parallel region waits for a thread that is not
running); no spin at all costs on a quiet machine (each parallel region pays for waking its threads). So
``txl ...``, ``python -m txl`` and the torchrun workers set, per :data:`POLICIES` and unless the user did:

- for training, evaluation and every command but two (:data:`Workload` ``batches``): ``OMP_NUM_THREADS``, the
  cores this process may use (the physical cores of its CPU affinity, capped by a cgroup v2 ``cpu.max`` or v1
  CFS quota, rounded up), divided among the local processes under torchrun (``LOCAL_WORLD_SIZE``);
  ``GOMP_SPINCOUNT=1000``, a spin of about 10 microseconds (libgomp's estimate) before sleeping; and
  ``OMP_WAIT_POLICY=PASSIVE`` for the runtimes that do not read ``GOMP_SPINCOUNT`` (LLVM's libomp);
- for ``generate`` and ``serve`` (``tokens``: one position at a time, many tiny parallel regions):
  ``OMP_NUM_THREADS=1`` (and ``OMP_WAIT_POLICY=PASSIVE``, for a count of the user's).

Nothing is measured at launch (the machine's load): a command's results never depend on it. On 2 cores,
with 2 competing processes, PyTorch's default trained 2.3 times and generated 110 times slower than these
choices; they cost 20% of the fastest policy's training speed on a quieter machine, and lose to a passive
wait under load by 10% (``benchmarks/threads.py``; ``docs/benchmarks.md`` has the figures and the goals left
unmet).

What the user set always wins: an ``OMP_NUM_THREADS`` of their own is left as it is, and so are both wait
variables when they set either ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` (a spin count of txl's would
override their wait policy); torchrun's own ``OMP_NUM_THREADS=1`` for its workers, set when there is none,
counts as the user's: give one, or use ``txl train --nproc N``, whose workers divide the cores; and
``torch.set_num_threads`` later on sets the count. The values txl wrote are recorded in
``TXL_THREADS_CHOSEN``, so that a txl process started by one (torchrun's workers) chooses again for itself
instead of taking its parent's choice for the user's.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

__all__ = [
    "ThreadSettings",
    "Workload",
    "WorkloadPolicy",
    "POLICIES",
    "DECODING_COMMANDS",
    "workload",
    "command_of",
    "choose_threads",
    "usable_cores",
    "physical_cores",
    "cgroup_cpu_limit",
    "configure_threads",
    "at_launch",
    "CHOSEN_VAR",
]

CHOSEN_VAR = "TXL_THREADS_CHOSEN"
"""The environment variable where txl records the values it wrote, as ``NAME=VALUE`` pairs joined by ``,``."""

_NUM, _WAIT, _SPIN = "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"

Workload = Literal["batches", "tokens"]
"""What a command's parallel regions look like: ``batches`` (training, evaluation: large matrix products over a
batch of segments) or ``tokens`` (decoding one position at a time at a small batch: many tiny regions)."""

DECODING_COMMANDS = frozenset({"generate", "serve"})
"""The ``txl`` commands whose work is :data:`Workload` ``tokens``; every other command's is ``batches``."""


@dataclass(frozen=True)
class WorkloadPolicy:
    """txl's choice for one :data:`Workload`: ``threads`` (``"cores"``: the cores this process may use; or a
    fixed count), ``wait_policy`` (``OMP_WAIT_POLICY``, which every OpenMP runtime reads) and ``spin_count``
    (libgomp's ``GOMP_SPINCOUNT``, which bounds the spin where the wait policy alone would not; None: the wait
    policy's own)."""

    threads: int | Literal["cores"]
    wait_policy: str
    spin_count: int | None


POLICIES: dict[Workload, WorkloadPolicy] = {
    "batches": WorkloadPolicy(threads="cores", wait_policy="PASSIVE", spin_count=1000),
    "tokens": WorkloadPolicy(threads=1, wait_policy="PASSIVE", spin_count=None),
}
"""txl's policy per workload, chosen on the figures of ``benchmarks/threads.py`` (``docs/benchmarks.md``): for
batches, every core and a spin of 1,000 (about 10 microseconds by libgomp's own estimate of 100,000 spins a
millisecond) before sleeping; for tokens, one thread (and, where the user asks for more, a passive wait)."""


def workload(command: str | None) -> Workload:
    """The workload of the ``txl`` subcommand ``command`` (None: library use, ``batches``)."""
    return "tokens" if command in DECODING_COMMANDS else "batches"


def command_of(argv: Sequence[str]) -> str | None:
    """The subcommand in a ``txl`` command line without the program name: its first word that is not an option
    (txl's top-level options take no values), or None."""
    return next((word for word in argv if not word.startswith("-")), None)


@dataclass(frozen=True)
class ThreadSettings:
    """What txl sets before torch starts: ``num_threads`` (``OMP_NUM_THREADS``), ``wait_policy``
    (``OMP_WAIT_POLICY``) and ``spin_count`` (``GOMP_SPINCOUNT``), each ``None`` where txl leaves it (the
    user's own setting, or OpenMP's default)."""

    num_threads: int | None
    wait_policy: str | None = None
    spin_count: int | None = None

    def environ(self) -> dict[str, str]:
        """The environment variables to write: txl's choices and their record in :data:`CHOSEN_VAR`."""
        values = {_NUM: self.num_threads, _WAIT: self.wait_policy, _SPIN: self.spin_count}
        chosen = {name: str(value) for name, value in values.items() if value is not None}
        return {**chosen, CHOSEN_VAR: ",".join(f"{name}={value}" for name, value in chosen.items())}


def _users(env: Mapping[str, str], name: str) -> bool:
    """Whether ``env`` holds a value of ``name`` that the user set: present, not empty, and not the value a txl
    process recorded as its own choice."""
    value = env.get(name, "").strip()
    if not value:
        return False
    ours = dict(pair.split("=", 1) for pair in env.get(CHOSEN_VAR, "").split(",") if "=" in pair)
    return ours.get(name) != value


def choose_threads(env: Mapping[str, str], *, cores: int, command: str | None = None) -> ThreadSettings:
    """txl's thread policy for the ``txl`` subcommand ``command`` (None: library use) in a process with
    environment ``env`` that may use ``cores`` cores: the :data:`POLICIES` entry of its :func:`workload`, its
    ``"cores"`` divided by ``LOCAL_WORLD_SIZE`` (torchrun's processes on this machine; at least one thread
    each), except where ``env`` holds the user's own ``OMP_NUM_THREADS`` (the count stands) or
    ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` (both wait settings stand). Pure: it reads only its arguments."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    try:
        local = max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    policy = POLICIES[workload(command)]
    threads = max(1, cores // local) if policy.threads == "cores" else policy.threads
    users_wait = _users(env, _WAIT) or _users(env, _SPIN)
    return ThreadSettings(
        num_threads=None if _users(env, _NUM) else threads,
        wait_policy=None if users_wait else policy.wait_policy,
        spin_count=None if users_wait else policy.spin_count,
    )


def cgroup_cpu_limit(proc_cgroup: str, root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The CPUs a cgroup quota allows this process (``quota / period``, the smallest along the path from its
    cgroup up to the root), or None when no quota applies. ``proc_cgroup`` is the text of
    ``/proc/self/cgroup``; ``root`` where the cgroup file systems are mounted. cgroup v2: ``cpu.max``
    (``"max 100000"`` or ``"200000 100000"``); v1: ``cpu.cfs_quota_us`` (-1: none) and ``cpu.cfs_period_us``
    in the ``cpu`` controller's hierarchy."""
    limits: list[float] = []
    for line in proc_cgroup.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers == "":  # v2, the unified hierarchy
            bases = [root, root / "unified"]
            read = _cpu_max
        elif "cpu" in controllers.split(","):
            bases = [root / controllers, root / "cpu", root / "cpu,cpuacct"]
            read = _cfs_quota
        else:
            continue
        for base in bases:
            if not base.is_dir():
                continue
            folder = base / path.lstrip("/")
            while True:  # this cgroup and its ancestors up to the mount root
                limit = read(folder)
                if limit is not None:
                    limits.append(limit)
                if folder == base or base not in folder.parents:
                    break
                folder = folder.parent
            break
    return min(limits) if limits else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpu_max(folder: Path) -> float | None:
    text = _read(folder / "cpu.max")
    if not text:
        return None
    quota, _, period = text.partition(" ")
    if quota == "max":
        return None
    try:
        return int(quota) / int(period or "100000")
    except (ValueError, ZeroDivisionError):
        return None


def _cfs_quota(folder: Path) -> float | None:
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    try:
        quota_us, period_us = int(quota or "-1"), int(period or "100000")
    except ValueError:
        return None
    return quota_us / period_us if quota_us > 0 and period_us > 0 else None


def physical_cores(cpus: set[int], sysfs: Path = Path("/sys/devices/system/cpu")) -> int:
    """How many physical cores the logical CPUs ``cpus`` are on (``topology/core_id`` and
    ``physical_package_id`` under ``sysfs``): hyperthreads of one core count once, as in PyTorch's own default.
    ``len(cpus)`` when the topology cannot be read."""
    cores = set()
    for cpu in cpus:
        topology = sysfs / f"cpu{cpu}" / "topology"
        core, package = _read(topology / "core_id"), _read(topology / "physical_package_id")
        if core is None or package is None:
            return len(cpus)
        cores.add((package, core))
    return len(cores)


def usable_cores() -> int:
    """The cores this process may use: the physical cores of its CPU affinity (``os.sched_getaffinity``),
    capped by a cgroup CPU quota rounded up; at least 1."""
    try:
        cores = physical_cores(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    limit = cgroup_cpu_limit(_read(Path("/proc/self/cgroup")) or "")
    if limit is not None:
        cores = min(cores, math.ceil(limit))
    return max(1, cores)


def configure_threads(num_threads: int | None = None, *, command: str | None = None) -> ThreadSettings:
    """Apply txl's thread policy to this process, for library use (txl's entry points do it by themselves):
    ``num_threads`` threads if given, else :func:`choose_threads`'s count, and the wait settings of
    ``command``'s workload (None: ``batches``; ``"generate"`` for decoding) unless ``OMP_WAIT_POLICY`` or
    ``GOMP_SPINCOUNT`` is set. Returns what it set.

    Called before torch is imported, it writes the environment variables, which OpenMP reads when torch loads
    (subprocesses inherit them). Once torch is imported, OpenMP has read its wait settings and only the count
    can change: it calls ``torch.set_num_threads``."""
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)):
        raise TypeError(f"num_threads must be an int, got {num_threads!r}")
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    settings = choose_threads(os.environ, cores=usable_cores(), command=command)
    if num_threads is not None:
        settings = replace(settings, num_threads=num_threads)
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if settings.num_threads is not None:
            torch.set_num_threads(settings.num_threads)
        return ThreadSettings(num_threads=torch.get_num_threads())
    os.environ.update(settings.environ())
    return settings


def at_launch(argv: Sequence[str] = ()) -> ThreadSettings | None:
    """What an entry point calls first, with its command line ``argv`` (without the program name):
    :func:`configure_threads` for its subcommand when torch is not imported yet; when it is (``txl.cli.main``
    called from a program that uses torch), the host owns its threads and nothing changes (None)."""
    if "torch" in sys.modules:
        return None
    return configure_threads(command=command_of(argv))
