"""The jobs of ``txl serve``'s model thread: a job's state and what its client is owed (its events, its result,
its backlog), and what a job's work yields to the scheduler (typed events: pause, or ready to decode as rows)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Generator
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

from torch import Tensor

from ..inference import SamplingParams
from ..model import Memory

__all__ = [
    "JobState",
    "Job",
    "Cancelled",
    "Stats",
    "Pause",
    "PAUSE",
    "Ready",
    "RowWork",
    "Work",
]


class JobState(Enum):
    """Where an admitted job is."""

    WAITING = "waiting"  # in the queue
    WORKING = "working"  # its work runs in slices between the steps
    DECODING = "decoding"  # its choices are rows of the batch
    PARKED = "parked"  # its client is behind: its rows wait outside the batch
    DONE = "done"


class Cancelled(Exception):
    """A job stopped because its client left or the server is closing."""


@dataclass
class Stats:
    """Counters shown by ``GET /v1/health`` (changed under the scheduler's lock or on its thread)."""

    requests: int = 0
    rejected: int = 0
    cancelled: int = 0
    failed: int = 0


@dataclass(frozen=True)
class Pause:
    """What a work yields to let the rows step before its next slice."""


PAUSE = Pause()


class RowWork(Protocol):
    """A completion as the scheduler decodes it: ``n`` choices, each one request of the engine."""

    n: int

    def prompt_of(self, choice: int) -> int:
        """Which prompt choice ``choice`` continues."""

    def sampling(self, choice: int) -> SamplingParams:
        """How choice ``choice`` samples (its own seed)."""

    def push(self, choice: int, token: int, log_probs: Tensor) -> bool:
        """Choice ``choice`` drew ``token`` from ``log_probs`` (V,): True when the choice is over."""

    def done(self) -> Work:
        """Every choice is over: the work that ends the job (its return value is the job's result)."""


@dataclass(frozen=True)
class Ready:
    """What a work yields when its choices are to decode: each choice is a request of the engine, its prompt
    (P,) ``prompts[work.prompt_of(c)]`` after ``memory`` (batch 1; one prefill per prompt)."""

    work: RowWork
    prompts: tuple[Tensor, ...]
    memory: Memory | None = None


Work = Generator[Pause | Ready, None, Any]
"""A job's work, run one slice per ``next`` on the model's thread; its return value is the job's result."""


class Job:
    """One admitted request: its state, cancellation flag, the rows it needs, its result, and (streaming) where
    its events go. ``backlog`` (thread-safe) counts events sent that its client has not taken yet."""

    def __init__(
        self, closing: threading.Event, *, rows: int, weight: int, on_event: Callable[[Any], None] | None
    ) -> None:
        self._closing = closing
        self._lock = threading.Lock()
        self._backlog = 0
        self.state = JobState.WAITING
        self.cancel_event = threading.Event()
        self.rows, self.weight, self.on_event = rows, weight, on_event
        self.future: Future = Future()
        self.outbox: list[tuple[Callable[[Any], None], Any]] | None = None
        self.on_drained: Callable[[], None] | None = None  # told when a parked job's client catches up
        self.resume_at = 0

    def cancel(self) -> None:
        """Stop the job (its client left): the scheduler ends it at its next turn."""
        self.cancel_event.set()
        if self.on_drained is not None:
            self.on_drained()

    @property
    def cancelled(self) -> bool:
        """Whether the job was cancelled or the server is closing."""
        return self.cancel_event.is_set() or self._closing.is_set()

    @property
    def backlog(self) -> int:
        """Events sent to the client that the server has not written to its connection yet."""
        with self._lock:
            return self._backlog

    def emit(self, event: Any) -> None:
        """Send an event to the client (through the scheduler's outbox, flushed once per step)."""
        if self.on_event is None:
            return
        with self._lock:
            self._backlog += 1
        if self.outbox is None:
            self.on_event(event)
        else:
            self.outbox.append((self.on_event, event))

    def read(self) -> None:
        """The server wrote one event to the client's connection."""
        with self._lock:
            self._backlog -= 1
            drained = self._backlog == self.resume_at
        if drained and self.state is JobState.PARKED and self.on_drained is not None:
            self.on_drained()
