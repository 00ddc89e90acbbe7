"""The CPU thread policy of txl's entry points: how many OpenMP threads, and how long an idle one waits, for a
:data:`Workload` on this machine, set before torch starts its thread pool (imports no torch; the user's own
settings win); and :func:`threads_for`, the count for a block of work in a program that imported torch
itself (the decoding loop runs in it). Why and how: the threads guide of the documentation."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

__all__ = [
    "ThreadSettings",
    "Workload",
    "WorkloadPolicy",
    "Machine",
    "POLICIES",
    "MACHINE_VAR",
    "SHARED_AT",
    "choose_threads",
    "usable_cores",
    "physical_cores",
    "cgroup_cpu_limit",
    "other_load",
    "busy_cores",
    "machine_state",
    "needs_load",
    "configure_threads",
    "at_launch",
    "threads_for",
    "CHOSEN_VAR",
]

CHOSEN_VAR = "TXL_THREADS_CHOSEN"
"""The environment variable where txl records the values it wrote, as ``NAME=VALUE`` pairs joined by ``,``."""

_NUM, _WAIT, _SPIN = "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"

Workload = Literal["batches", "tokens"]
"""What a command's parallel regions look like: ``batches`` (training, evaluation: large matrix products over a
batch of segments) or ``tokens`` (decoding one position at a time at a small batch: many tiny regions)."""


@dataclass(frozen=True)
class WorkloadPolicy:
    """txl's choice for one :data:`Workload`: ``threads`` (``"cores"``: the cores this process may use; or a
    fixed count), ``wait_policy`` (``OMP_WAIT_POLICY``, which every OpenMP runtime reads) and ``spin_count``
    (libgomp's ``GOMP_SPINCOUNT``, which bounds the spin where the wait policy alone would not; None: the wait
    policy's own)."""

    threads: int | Literal["cores"]
    wait_policy: str | None
    spin_count: int | None


Machine = Literal["quiet", "shared"]
"""What the cores were doing when a command started: ``quiet`` (free for this process) or ``shared`` (other work
kept at least :data:`SHARED_AT` of a core busy)."""

MACHINE_VAR = "TXL_THREADS_MACHINE"
"""The environment variable that says which :data:`Machine` it is instead of looking: ``quiet``, ``shared``, or
``auto`` (the default: :func:`other_load` looks)."""

SHARED_AT = 0.5
"""How much of a core other work must keep busy (:func:`other_load`) for the machine to count as shared."""

_BATCH_QUIET = WorkloadPolicy(threads="cores", wait_policy=None, spin_count=10_000)
_BATCH_SHARED = WorkloadPolicy(threads="cores", wait_policy="PASSIVE", spin_count=None)
_TOKENS = WorkloadPolicy(threads=1, wait_policy="PASSIVE", spin_count=None)

POLICIES: dict[Workload, dict[Machine, WorkloadPolicy]] = {
    "batches": {"quiet": _BATCH_QUIET, "shared": _BATCH_SHARED},
    "tokens": {"quiet": _TOKENS, "shared": _TOKENS},
}
"""txl's policy per workload and machine, chosen on the figures of ``benchmarks/threads.py``
(``docs/results.md``): for batches, every core, with a spin of 10,000 before sleeping on a quiet machine
(about 100 microseconds by libgomp's own estimate of 100,000 spins a millisecond) and no spin on a shared one;
for tokens, one thread (and, where the user asks for more, a passive wait). Within a workload the thread
count is the same on both machines: the load never changes a result."""


@dataclass(frozen=True)
class ThreadSettings:
    """What txl sets before torch starts: ``num_threads`` (``OMP_NUM_THREADS``), ``wait_policy``
    (``OMP_WAIT_POLICY``) and ``spin_count`` (``GOMP_SPINCOUNT``), each ``None`` where txl leaves it (the
    user's own setting, or OpenMP's default), and the ``machine`` they were chosen for."""

    num_threads: int | None
    wait_policy: str | None = None
    spin_count: int | None = None
    machine: Machine | None = None
    """The :data:`Machine` the wait settings were chosen for (None: not looked at); not written anywhere."""

    def environ(self) -> dict[str, str]:
        """The environment variables to write: txl's choices and their record in :data:`CHOSEN_VAR`."""
        values = {_NUM: self.num_threads, _WAIT: self.wait_policy, _SPIN: self.spin_count}
        chosen = {name: str(value) for name, value in values.items() if value is not None}
        return {**chosen, CHOSEN_VAR: ",".join(f"{name}={value}" for name, value in chosen.items())}


def _recorded(env: Mapping[str, str]) -> dict[str, str]:
    """The values a txl process recorded in :data:`CHOSEN_VAR` as its own choice."""
    return dict(pair.split("=", 1) for pair in env.get(CHOSEN_VAR, "").split(",") if "=" in pair)


def _users(env: Mapping[str, str], name: str) -> bool:
    """Whether ``env`` holds a value of ``name`` that the user set: present, not empty, and not the value a txl
    process recorded as its own choice."""
    value = env.get(name, "").strip()
    if not value:
        return False
    return _recorded(env).get(name) != value


def _local_processes(env: Mapping[str, str]) -> int:
    try:
        return max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _users_wait(env: Mapping[str, str]) -> bool:
    return _users(env, _WAIT) or _users(env, _SPIN)


def _told(env: Mapping[str, str]) -> str:
    """:data:`MACHINE_VAR`'s value in ``env``, stripped and lower-cased ("" when absent)."""
    return env.get(MACHINE_VAR, "").strip().lower()


def needs_load(env: Mapping[str, str], workload: Workload = "batches") -> bool:
    """Whether :func:`choose_threads` for ``workload`` in ``env`` depends on the machine's load: the wait
    settings are txl's to choose, they differ between the two :data:`Machine` states, and :data:`MACHINE_VAR`
    does not say which it is."""
    policies = _policies(workload)
    told = _told(env) not in ("", "auto")
    return not told and not _users_wait(env) and policies["quiet"] != policies["shared"]


def machine_state(env: Mapping[str, str], busy: float | None) -> Machine:
    """The :data:`Machine` of a process with environment ``env`` when other work kept ``busy`` of its cores busy
    (:func:`other_load`; None: unknown, taken as shared): :data:`MACHINE_VAR` where it says ``quiet`` or
    ``shared``; else shared from :data:`SHARED_AT` of a core, less the ``LOCAL_WORLD_SIZE - 1`` other
    processes of a torchrun launch, which start at the same time. Raises ValueError for another value of
    :data:`MACHINE_VAR`."""
    told = _told(env)
    if told in ("quiet", "shared"):
        return told  # type: ignore[return-value]
    if told not in ("", "auto"):
        raise ValueError(f"{MACHINE_VAR} must be quiet, shared or auto, got {env[MACHINE_VAR]!r}")
    if busy is None:
        return "shared"
    return "shared" if busy - (_local_processes(env) - 1) >= SHARED_AT else "quiet"


def choose_threads(
    env: Mapping[str, str], *, cores: int, workload: Workload = "batches", busy: float | None = None
) -> ThreadSettings:
    """txl's thread policy for work of the kind ``workload`` in a process with environment ``env`` that may use
    ``cores`` cores, while other work keeps ``busy`` of them busy (:func:`other_load`; None: unknown): the
    :data:`POLICIES` entry of ``workload`` and :func:`machine_state`, its ``"cores"`` divided by ``LOCAL_WORLD_SIZE`` (torchrun's processes on this
    machine; at least one thread each), except where ``env`` holds the user's own ``OMP_NUM_THREADS`` (the
    count stands) or ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` (both wait settings stand). Pure: it reads only
    its arguments."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    users_wait = _users_wait(env)
    policies = _policies(workload)
    state = machine_state(env, busy)
    machine = None if users_wait or policies["quiet"] == policies["shared"] else state
    policy = policies[machine or "shared"]
    threads = max(1, cores // _local_processes(env)) if policy.threads == "cores" else policy.threads
    return ThreadSettings(
        num_threads=None if _users(env, _NUM) else threads,
        wait_policy=None if users_wait else policy.wait_policy,
        spin_count=None if users_wait else policy.spin_count,
        machine=machine,
    )


def _cpu_times(stat: str) -> dict[int, tuple[int, int]]:
    """Per CPU of a ``/proc/stat`` text: (all its time, its idle and iowait time), in clock ticks."""
    times = {}
    for line in stat.splitlines():
        name, _, rest = line.partition(" ")
        if not (name.startswith("cpu") and name[3:].isdigit()):
            continue
        fields = [int(value) for value in rest.split()[:8]]  # user nice system idle iowait irq softirq steal
        if len(fields) >= 5:
            times[int(name[3:])] = (sum(fields), fields[3] + fields[4])
    return times


def busy_cores(before: str, after: str, cpus: Iterable[int]) -> float | None:
    """How many of the CPUs ``cpus`` were busy between two ``/proc/stat`` texts: the sum over them of the share
    of their time not idle; None when none of them is in both texts or no time passed."""
    first, second = _cpu_times(before), _cpu_times(after)
    shares = []
    for cpu in cpus:
        if cpu in first and cpu in second:
            total = second[cpu][0] - first[cpu][0]
            idle = second[cpu][1] - first[cpu][1]
            if total > 0:
                shares.append(min(1.0, max(0.0, 1 - idle / total)))
    return sum(shares) if shares else None


def other_load(window: float = 0.05, stat: Path = Path("/proc/stat")) -> float | None:
    """How many of the cores this process may use other work kept busy over ``window`` seconds, while this
    process sleeps (:func:`busy_cores` of ``stat`` read before and after); None where it cannot be read (not
    Linux). The Linux kernel accounts idle time to the microsecond, so 50 ms is enough to tell a free core from
    a taken one."""
    try:
        cpus = os.sched_getaffinity(0)
        before = stat.read_text()
        time.sleep(window)
        after = stat.read_text()
    except (AttributeError, OSError):
        return None
    return busy_cores(before, after, cpus)


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


def configure_threads(num_threads: int | None = None, *, workload: Workload = "batches") -> ThreadSettings:
    """Apply txl's thread policy to this process, for library use (txl's entry points do it by themselves):
    ``num_threads`` threads if given, else :func:`choose_threads`'s count, and the wait settings of
    ``workload`` (``"tokens"`` for decoding) on this machine (:func:`other_load`
    looks at its cores for 50 ms when they matter) unless ``OMP_WAIT_POLICY`` or ``GOMP_SPINCOUNT`` is set.
    Returns what it set.

    Called before torch is imported, it writes the environment variables, which OpenMP reads when torch loads
    (subprocesses inherit them). Once torch is imported, OpenMP has read its wait settings and only the count
    can change: it calls ``torch.set_num_threads``."""
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)):
        raise TypeError(f"num_threads must be an int, got {num_threads!r}")
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        count = num_threads or choose_threads(os.environ, cores=usable_cores(), workload=workload).num_threads
        if count is not None:
            torch.set_num_threads(count)
        return ThreadSettings(num_threads=torch.get_num_threads())
    busy = other_load() if needs_load(os.environ, workload) else None
    settings = choose_threads(os.environ, cores=usable_cores(), workload=workload, busy=busy)
    if num_threads is not None:
        settings = replace(settings, num_threads=num_threads)
    chosen = settings.environ()
    for name in _recorded(os.environ):  # a txl parent's choice that this process's choice does not repeat
        if name not in chosen and not _users(os.environ, name):
            os.environ.pop(name, None)
    os.environ.update(chosen)
    return settings


def at_launch(workload: Workload = "batches") -> ThreadSettings | None:
    """What an entry point calls once it knows its command's ``workload``, before anything imports torch:
    :func:`configure_threads` for it; when torch is imported already (``txl.cli.main`` called from a program
    that uses torch), the host owns its threads and nothing changes (None)."""
    if "torch" in sys.modules:
        return None
    try:
        return configure_threads(workload=workload)
    except ValueError as exc:  # TXL_THREADS_MACHINE's value
        raise SystemExit(f"txl: error: {exc}") from None


@contextmanager
def threads_for(workload: Workload = "tokens") -> Iterator[int]:
    """Run the block with txl's thread count for ``workload`` (:data:`POLICIES`: one thread for ``"tokens"``),
    then give the caller's count back; yields the count in force. The decoding loop runs each step in it, so
    a program that imported torch without :func:`configure_threads` decodes as fast beside other busy programs
    as ``txl generate`` does: with several threads, every tiny parallel region of a decoding step waits for a
    thread that another program's work keeps off its core.

    Only the count changes (``torch.set_num_threads``, for the calling thread's OpenMP regions); the wait
    settings are OpenMP's from when torch loaded. An ``OMP_NUM_THREADS`` you set stands: nothing changes."""
    if workload not in POLICIES:
        raise ValueError(f"workload must be one of {', '.join(POLICIES)}, got {workload!r}")
    import torch

    before = torch.get_num_threads()
    count = _count_for(workload)
    if count is None or count == before:
        yield before
        return
    torch.set_num_threads(count)
    try:
        yield count
    finally:
        torch.set_num_threads(before)


def _count_for(workload: Workload) -> int | None:
    """txl's thread count for ``workload`` in this process (the same on a quiet and a shared machine), or None
    where the user's ``OMP_NUM_THREADS`` stands."""
    if _users(os.environ, _NUM):
        return None
    threads = POLICIES[workload]["shared"].threads
    return threads if threads != "cores" else max(1, usable_cores() // _local_processes(os.environ))


def _policies(workload: Workload) -> dict[Machine, WorkloadPolicy]:
    """The :data:`POLICIES` of ``workload``; ValueError for another value."""
    if workload not in POLICIES:
        raise ValueError(f"workload must be one of {', '.join(POLICIES)}, got {workload!r}")
    return POLICIES[workload]
