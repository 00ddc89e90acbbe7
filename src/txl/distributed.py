"""Data parallelism with ``torch.distributed`` (as launched by ``torchrun``): which process this is, which of
the B streams of a batch (and their memory) it owns, and the few collectives the trainer and evaluation
need; one process is :data:`SINGLE`, on which every method returns its input.
"""

from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from .config import ConfigError, positive_int
from .device import resolve_device

__all__ = [
    "Distributed",
    "SINGLE",
    "LAUNCHED_BY_TXL",
    "from_environment",
    "launch_command",
    "launch",
    "under_torchrun",
]

COLLECTIVE_TIMEOUT = timedelta(minutes=10)
"""How long a collective waits for a rank that stopped answering before it fails. A rank that exits closes
its connections, so its peers' collectives fail at once and torchrun ends the group; this bounds the case
of a rank that hangs without exiting."""


@dataclass(frozen=True)
class Distributed:
    """This process's place in the group: ``rank`` of ``world_size``, ``local_rank`` on this machine."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        """More than one process."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that writes logs, metrics, checkpoints and the progress bar."""
        return self.rank == 0

    def rows(self, batch_size: int, *, field: str = "train.batch_size") -> slice:
        """This rank's contiguous batch rows ``[r·B/N, (r+1)·B/N)``; ``field`` names the setting in the error
        raised when B is not divisible by N."""
        if batch_size % self.world_size:
            raise ConfigError(
                f"{field}={batch_size} cannot be split over {self.world_size} processes: it must "
                f"be a multiple of the number of processes"
            )
        per = batch_size // self.world_size
        return slice(self.rank * per, (self.rank + 1) * per)

    def device(self, name: str) -> torch.device:
        """The device of this process for a ``train.device`` setting (checked by :func:`resolve_device`):
        under data parallelism on GPUs, the GPU of the local rank."""
        device = resolve_device(name)
        if self.enabled and device.type == "cuda" and device.index is None:
            return torch.device("cuda", self.local_rank)
        return device

    # -- collectives (identity in one process) --------------------------------------------------------------

    def all_reduce_sum(self, tensor: Tensor) -> Tensor:
        """The sum of ``tensor`` over the ranks (a new tensor; the input is untouched)."""
        if not self.enabled:
            return tensor
        out = tensor.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def any(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on any rank (so that all ranks take the same branch)."""
        if not self.enabled:
            return bool(flag)
        return bool(
            self.all_reduce_sum(torch.tensor([int(bool(flag))], device=self._collective_device())) > 0
        )

    def gather_rows(self, tensor: Tensor) -> Tensor:
        """Every rank's ``tensor`` (rows of one shape) concatenated along dim 0 in rank order, on every rank."""
        if not self.enabled:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous())
        return torch.cat(parts, dim=0)

    def gather_objects(self, value: Any) -> list[Any]:
        """Every rank's ``value`` (picklable, of this program's own making) in rank order, on every rank."""
        if not self.enabled:
            return [value]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out

    def barrier(self) -> None:
        """Wait until every rank is here."""
        if self.enabled:
            dist.barrier()

    def close(self) -> None:
        """Leave the process group (at the end of a command, after a final :meth:`barrier` on success).

        Garbage is collected first: DistributedDataParallel's reducer sits in reference cycles and holds the
        gloo group; freed only at interpreter shutdown, its worker threads could be torn down while a peer
        closes its connections, and the rank aborted after finishing its work (``terminate called without
        an active exception``, about 1 run in 10 of ``txl train --nproc 2`` on 2 busy cores)."""
        if self.enabled and dist.is_initialized():
            gc.collect()
            dist.destroy_process_group()

    def _collective_device(self) -> torch.device:
        return torch.device("cuda", self.local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")


SINGLE = Distributed()


def under_torchrun() -> bool:
    """Whether this process was started by torchrun with more than one process in the group."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def from_environment(device: str = "cpu") -> Distributed:
    """The group this process was launched in (``torchrun`` sets RANK, WORLD_SIZE and LOCAL_RANK), with the
    process group initialised: NCCL when this rank trains on a GPU, gloo otherwise. :data:`SINGLE` when not
    launched by torchrun or with one process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size <= 1:
        return SINGLE
    group = Distributed(
        rank=int(os.environ["RANK"]), world_size=world_size, local_rank=int(os.environ.get("LOCAL_RANK", "0"))
    )
    if not dist.is_initialized():
        on_gpu = group.device(device).type == "cuda"
        if on_gpu:
            torch.cuda.set_device(group.local_rank)
        dist.init_process_group("nccl" if on_gpu else "gloo", timeout=COLLECTIVE_TIMEOUT)
    return group


def launch_command(nproc: int, argv: list[str]) -> list[str]:
    """The torchrun command line that runs ``txl <argv>`` on ``nproc`` processes of this machine."""
    positive_int(nproc, "--nproc")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        "txl",
        *argv,
    ]


LAUNCHED_BY_TXL = "TXL_LAUNCHED"
"""Set by :func:`launch` in the environment of its ranks: a rank stopped by a signal then exits with 0, so that
torchrun reports no failure; the launcher reports the signal."""


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc; none where there is no /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return found


def launch(nproc: int, argv: list[str]) -> int:
    """Run ``txl <argv>`` under torchrun on ``nproc`` local processes; returns its exit status.

    torchrun runs in a session of its own, so a Ctrl-C at the terminal reaches this process only (torchrun,
    given SIGINT, prints its own traceback and stops the ranks before they can save). SIGINT and SIGTERM sent
    to this process are passed on to the ranks (torchrun's children; torchrun itself where it has none yet),
    which save a checkpoint, say so once (rank 0) and exit with 0 (see :data:`LAUNCHED_BY_TXL`); the status is
    then 128 + the signal number, as for one process."""
    import signal
    import subprocess

    env = {**os.environ, LAUNCHED_BY_TXL: "1"}
    proc = subprocess.Popen(launch_command(nproc, argv), env=env, start_new_session=True)
    forwarded: list[int] = []

    def forward(signum, _frame):
        forwarded.append(signum)
        ranks = _children(proc.pid)
        for pid in ranks:
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
        if not ranks:
            proc.send_signal(signum)

    previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        status = proc.wait()
        return 128 + forwarded[0] if forwarded and status in (0, 1) else status
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
