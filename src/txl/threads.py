"""The CPU thread policy of txl's entry points: how many OpenMP threads, and whether an idle one sleeps or spins,
chosen before torch starts its thread pool. It imports no torch; library use changes nothing unless asked.

OpenMP (libgomp, which PyTorch's CPU builds use) reads ``OMP_NUM_THREADS`` and ``OMP_WAIT_POLICY`` once, when
torch is imported. With its default wait policy an idle worker thread spins for a while before it sleeps; when
another process holds a core, every parallel region then waits for a thread that is not running: on a 2-core
machine with two competing processes, training was measured 10 times slower than with
``OMP_WAIT_POLICY=PASSIVE``, and generation at batch 1 84 times (``benchmarks/threads.py``). So ``txl ...``, ``python -m txl`` and the torchrun workers set, unless the user did:

- ``OMP_WAIT_POLICY=PASSIVE``: idle threads sleep at once;
- ``OMP_NUM_THREADS``: the cores this process may use (the physical cores of its CPU affinity, capped by a
  cgroup v2 ``cpu.max`` or v1 CFS quota, rounded up), divided among the local processes under torchrun
  (``LOCAL_WORLD_SIZE``).

What the user set always wins: an ``OMP_NUM_THREADS`` or ``OMP_WAIT_POLICY`` of their own is left as it is
(torchrun's own ``OMP_NUM_THREADS=1`` for its workers, set when there is none, counts as the user's: give one,
or use ``txl train --nproc N``, whose workers divide the cores), and ``torch.set_num_threads`` later on sets
the count. The values txl wrote are recorded in ``TXL_THREADS_CHOSEN``, so that a txl process started by one
(torchrun's workers) chooses again for itself instead of taking its parent's choice for the user's.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

__all__ = [
    "ThreadSettings",
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

_NUM, _WAIT = "OMP_NUM_THREADS", "OMP_WAIT_POLICY"


@dataclass(frozen=True)
class ThreadSettings:
    """What txl sets before torch starts: ``num_threads`` (``OMP_NUM_THREADS``) and ``wait_policy``
    (``OMP_WAIT_POLICY``), each ``None`` where the user's own setting stands."""

    num_threads: int | None
    wait_policy: str | None

    def environ(self) -> dict[str, str]:
        """The environment variables to write: txl's choices and their record in :data:`CHOSEN_VAR`."""
        chosen = {}
        if self.num_threads is not None:
            chosen[_NUM] = str(self.num_threads)
        if self.wait_policy is not None:
            chosen[_WAIT] = self.wait_policy
        return {**chosen, CHOSEN_VAR: ",".join(f"{name}={value}" for name, value in chosen.items())}


def _users(env: Mapping[str, str], name: str) -> bool:
    """Whether ``env`` holds a value of ``name`` that the user set: present, not empty, and not the value a txl
    process recorded as its own choice."""
    value = env.get(name, "").strip()
    if not value:
        return False
    ours = dict(pair.split("=", 1) for pair in env.get(CHOSEN_VAR, "").split(",") if "=" in pair)
    return ours.get(name) != value


def choose_threads(env: Mapping[str, str], *, cores: int) -> ThreadSettings:
    """txl's thread policy for a process with environment ``env`` that may use ``cores`` cores: a passive wait
    policy and ``cores`` threads, divided by ``LOCAL_WORLD_SIZE`` (torchrun's processes on this machine; at
    least one thread each), except where ``env`` holds the user's own ``OMP_WAIT_POLICY`` or
    ``OMP_NUM_THREADS``. Pure: it reads only its arguments."""
    if cores < 1:
        raise ValueError(f"cores must be at least 1, got {cores}")
    try:
        local = max(1, int(env.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return ThreadSettings(
        num_threads=None if _users(env, _NUM) else max(1, cores // local),
        wait_policy=None if _users(env, _WAIT) else "PASSIVE",
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


def configure_threads(num_threads: int | None = None) -> ThreadSettings:
    """Apply txl's thread policy to this process, for library use (txl's entry points do it by themselves):
    ``num_threads`` threads if given, else :func:`choose_threads`'s count, and a passive wait policy unless
    ``OMP_WAIT_POLICY`` is set. Returns what it set.

    Called before torch is imported, it writes the environment variables, which OpenMP reads when torch loads
    (subprocesses inherit them). Once torch is imported, OpenMP has read its wait policy and only the count
    can change: it calls ``torch.set_num_threads``."""
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)):
        raise TypeError(f"num_threads must be an int, got {num_threads!r}")
    if num_threads is not None and num_threads < 1:
        raise ValueError(f"num_threads must be at least 1, got {num_threads}")
    settings = choose_threads(os.environ, cores=usable_cores())
    if num_threads is not None:
        settings = replace(settings, num_threads=num_threads)
    if "torch" in sys.modules:
        torch = sys.modules["torch"]
        if settings.num_threads is not None:
            torch.set_num_threads(settings.num_threads)
        return ThreadSettings(num_threads=torch.get_num_threads(), wait_policy=None)
    os.environ.update(settings.environ())
    return settings


def at_launch() -> ThreadSettings | None:
    """What an entry point calls first: :func:`configure_threads` when torch is not imported yet; when it is
    (``txl.cli.main`` called from a program that uses torch), the host owns its threads and nothing changes
    (None)."""
    if "torch" in sys.modules:
        return None
    return configure_threads()
