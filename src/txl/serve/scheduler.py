"""The model's one thread of ``txl serve``: admission into a bounded queue, each job's state, and the step loop.
Every completion decodes as rows of one batch (continuous batching: a request joins free rows between two steps
and leaves its row when it ends); other work (prefills, scores, session readings) runs in slices between the
steps. It knows no HTTP and no wire format (:mod:`txl.serve.openai`), and no request's meaning
(:mod:`txl.serve.work`).

Dimensions: R rows (``--max-batch``), V vocabulary.

Back-pressure: a streaming job whose client is ``stream_buffer`` events behind what the server has written
to its connection is parked: its row's memory is kept aside and the row freed for others; it joins a row
again when its client has caught up (half the buffer), exactly where it stopped.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator
from concurrent.futures import Future
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from ..config import Span
from ..model import Memory
from ..sampling import SamplingSettings, draw
from .rows import CacheRows, WindowRows, make_rows

__all__ = ["JobState", "Job", "Cancelled", "Stats", "Pause", "PAUSE", "Ready", "RowWork", "Scheduler", "Work"]


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
    tokens_generated: int = 0


@dataclass(frozen=True)
class Pause:
    """What a work yields to let the rows step before its next slice."""


PAUSE = Pause()


class RowWork(Protocol):
    """A completion as the scheduler decodes it: ``n`` choices, each one row."""

    n: int
    settings: SamplingSettings

    def prompt_of(self, choice: int) -> int:
        """Which prompt choice ``choice`` continues."""

    def generator(self, choice: int) -> torch.Generator:
        """Choice ``choice``'s own random generator."""

    def push(self, choice: int, token: int, log_probs: Tensor) -> bool:
        """Choice ``choice`` drew ``token`` from ``log_probs`` (V,): True when the choice is over."""

    def resume_prompt(self, choice: int) -> Tensor:
        """(P,) the tokens a parked choice is prefilled with to go on: its last token (with memory) or its
        whole window (without)."""

    def done(self) -> Work:
        """Every choice is over: the work that ends the job (its return value is the job's result)."""


@dataclass(frozen=True)
class Ready:
    """What a work yields when its choices are to decode: each prompt (P,) is prefilled alone after ``memory``
    (batch 1), then the choices join free rows (choice c continues prompt ``work.prompt_of(c)``)."""

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
        self.cancel_event.set()
        if self.on_drained is not None:
            self.on_drained()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set() or self._closing.is_set()

    @property
    def backlog(self) -> int:
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


@dataclass
class _Row:
    job: Job
    work: RowWork
    choice: int
    generator: torch.Generator
    log_probs: Tensor  # (1, V) of the next token


@dataclass
class _Parked:
    job: Job
    work: RowWork
    choice: int
    generator: torch.Generator
    memory: Memory | None


@dataclass
class _Side:
    job: Job
    work: Work
    reserved: int  # rows promised to it


class Scheduler:
    """The model's one thread. Admitted jobs wait in a bounded queue, start in order when their rows are free,
    and run as rows of the batch or in slices between its steps.

    At most ``max_batch + queue_size`` requests are admitted at once (a completion of ``n`` choices counts
    ``n``); :meth:`admit` refuses more."""

    def __init__(
        self, model: nn.Module, *, span: Span, max_batch: int, queue_size: int, stream_buffer: int
    ) -> None:
        self.model, self.span = model.eval(), span
        self.max_batch, self.capacity, self.stream_buffer = max_batch, max_batch + queue_size, stream_buffer
        self.device = next(model.parameters()).device
        self.closing = threading.Event()
        self.stats = Stats()
        self._cond = threading.Condition()
        self._admitted = 0
        self._waiting: deque[tuple[Job, Work]] = deque()
        self._side: list[_Side] = []
        self._parked: list[_Parked] = []
        self.slots: list[_Row | None] = [None] * max_batch
        self.batch: CacheRows | WindowRows | None = None
        self._outbox: list[tuple[Callable[[Any], None], Any]] = []
        self.post: Callable[[list], None] | None = None
        """Where the events of a step go at once (the HTTP layer hands them to its event loop in one call);
        None: each job's ``on_event`` is called in turn."""
        self._thread = threading.Thread(target=self._loop, name="txl-model", daemon=True)
        self._thread.start()

    # -- from the HTTP layer's threads --------------------------------------------------------------------

    @property
    def admitted(self) -> int:
        return self._admitted

    @property
    def rows_in_use(self) -> int:
        return sum(row is not None for row in self.slots)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def parked(self) -> int:
        return len(self._parked)

    def admit(
        self, *, rows: int = 0, weight: int = 1, on_event: Callable[[Any], None] | None = None
    ) -> Job | None:
        """A new job that will take ``rows`` rows (0: work between the steps only) and holds ``weight``
        places, or None when the server is full (the caller answers 429)."""
        with self._cond:
            if self._admitted + weight > self.capacity or self.closing.is_set():
                self.stats.rejected += 1
                return None
            self._admitted += weight
            self.stats.requests += 1
        job = Job(self.closing, rows=rows, weight=weight, on_event=on_event)
        job.outbox, job.on_drained, job.resume_at = self._outbox, self.wake, self.stream_buffer // 2
        return job

    def submit(self, job: Job, work: Work) -> Future:
        """Queue ``work`` for ``job``; its future holds the result."""
        with self._cond:
            self._waiting.append((job, work))
            self._cond.notify()
        return job.future

    def wake(self) -> None:
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        self.closing.set()
        self.wake()
        self._thread.join(timeout=10)

    # -- on the model's thread ----------------------------------------------------------------------------

    def end(self, job: Job, result: Any = None, *, error: BaseException | None = None) -> None:
        """The job is over: give its places back and set its result."""
        if job.state is JobState.DONE:
            return
        job.state = JobState.DONE
        self._flush()  # the events sent so far go before the end
        with self._cond:
            self._admitted -= job.weight
            if isinstance(error, Cancelled):
                self.stats.cancelled += 1
            elif error is not None:
                self.stats.failed += 1
        if error is not None:
            job.future.set_exception(error)
        else:
            job.future.set_result(result)

    def _rows(self) -> CacheRows | WindowRows:
        if self.batch is None:
            self.batch = make_rows(self.model, rows=self.max_batch, span=self.span)
        return self.batch

    def _free_rows(self) -> int:
        return self.max_batch - self.rows_in_use - sum(side.reserved for side in self._side)

    def _start_waiting(self) -> None:
        """Move waiting jobs whose rows are free to the side work, in order (a job needing more rows than are
        free waits, and so do those behind it)."""
        with self._cond:
            for job, work in [item for item in self._waiting if item[0].cancelled]:
                self._waiting.remove((job, work))
                work.close()
                self.end(job, error=Cancelled())
            while self._waiting:
                job, work = self._waiting[0]
                if job.rows > self._free_rows():
                    return
                self._waiting.popleft()
                job.state = JobState.WORKING
                self._side.append(_Side(job, work, job.rows))

    def _slice(self, side: _Side) -> bool:
        """One slice of side work; True when it is over."""
        job, work = side.job, side.work
        try:
            if job.cancelled:
                raise Cancelled
            event = next(work)
        except StopIteration as stop:
            self.end(job, stop.value)
            return True
        except BaseException as exc:  # noqa: BLE001 - the job fails, the server goes on
            work.close()
            self.end(job, error=exc if isinstance(exc, Exception) else Cancelled())
            return True
        if isinstance(event, Ready):
            side.reserved = 0
            work.close()
            self._place(job, event)
            return True
        return False

    def _place(self, job: Job, ready: Ready) -> None:
        """Prefill a request's prompt and put its choices into free rows."""
        rows, work = self._rows(), ready.work
        prefilled = [rows.prefill(prompt, ready.memory) for prompt in ready.prompts]
        free = [r for r, row in enumerate(self.slots) if row is None][: work.n]
        for choice, r in zip(range(work.n), free, strict=True):
            start = prefilled[work.prompt_of(choice)]
            rows.join(r, start)
            self.slots[r] = _Row(job, work, choice, work.generator(choice), start.log_probs)
        job.state = JobState.DECODING

    def _leave(self, r: int, *, park: bool = False) -> None:
        """Row ``r``'s choice leaves the batch: over, cancelled, or parked (its memory kept aside)."""
        row = self.slots[r]
        assert row is not None and self.batch is not None
        self.slots[r] = None
        if park:
            memory = self.batch.row_memory(r)
            self._parked.append(_Parked(row.job, row.work, row.choice, row.generator, memory))
            row.job.state = JobState.PARKED
        self.batch.free(r)
        if row.job.cancelled:
            self.end(row.job, error=Cancelled())
        elif (
            not park
            and not any(s is not None and s.job is row.job for s in self.slots)
            and not any(p.job is row.job for p in self._parked)
        ):
            self._side.append(_Side(row.job, row.work.done(), 0))  # every choice is over
            row.job.state = JobState.WORKING

    def _resume(self) -> None:
        """Parked choices whose client caught up join free rows again (before any waiting job)."""
        for parked in list(self._parked):
            job = parked.job
            if job.cancelled:
                self._parked.remove(parked)
                self.end(job, error=Cancelled())
                continue
            if job.backlog > job.resume_at or self._free_rows() < 1:
                continue
            self._parked.remove(parked)
            prefilled = self._rows().prefill(parked.work.resume_prompt(parked.choice), parked.memory)
            r = self.slots.index(None)
            self._rows().join(r, prefilled)
            self.slots[r] = _Row(job, parked.work, parked.choice, parked.generator, prefilled.log_probs)
            job.state = JobState.DECODING

    def _step(self) -> None:
        """Every row draws its next token and its events go out; those that go on are fed, all rows at once.
        A streaming row whose client is ``stream_buffer`` events behind is parked instead of fed."""
        active = []
        for r, row in enumerate(self.slots):
            if row is not None and row.job.cancelled:
                self._leave(r)
            elif row is not None:
                active.append(r)
        if not active:
            return
        tokens = self._draw(active)
        feed = [0] * self.max_batch
        fed = []
        for r in active:
            row = self.slots[r]
            assert row is not None
            self.stats.tokens_generated += 1
            if row.work.push(row.choice, tokens[r], row.log_probs[0]):
                self._leave(r)
            elif row.job.on_event is not None and row.job.backlog >= self.stream_buffer:
                self._leave(r, park=True)
            else:
                feed[r] = tokens[r]
                fed.append(r)
        self._flush()  # the tokens drawn go to their clients while the model computes the next step
        if fed:
            self._feed(feed, fed)

    def _feed(self, feed: list[int], fed: list[int]) -> None:
        assert self.batch is not None
        try:
            log_probs = self.batch.step(torch.tensor(feed, dtype=torch.long, device=self.device))  # (R, V)
        except Exception as exc:  # noqa: BLE001 - every row in the step fails; the server goes on
            self._fail_rows(exc)
            return
        for r in fed:
            row = self.slots[r]
            assert row is not None
            row.log_probs = log_probs[r : r + 1]

    def _draw(self, active: list[int]) -> dict[int, int]:
        """The next token of each active row: the greedy rows in one draw over them all (no generator), the
        others each from its own generator."""
        rows = {r: row for r in active if (row := self.slots[r]) is not None}
        greedy = [r for r, row in rows.items() if row.work.settings.temperature == 0]
        tokens: dict[int, int] = {}
        if greedy:
            joined = torch.cat([rows[r].log_probs for r in greedy])  # (G, V)
            best = draw(joined, rows[greedy[0]].work.settings).tolist()  # temperature 0: the argmax
            tokens.update(zip(greedy, best, strict=True))
        for r, row in rows.items():
            if r not in tokens:
                tokens[r] = int(draw(row.log_probs, row.work.settings, generator=row.generator)[0])
        return tokens

    def _startable(self) -> bool:
        if not self._waiting:
            return False
        job = self._waiting[0][0]
        return job.cancelled or job.rows <= self._free_rows()

    def _resumable(self) -> bool:
        return any(p.job.cancelled or p.job.backlog <= p.job.resume_at for p in self._parked) and bool(
            self._free_rows()
        )

    def _idle(self) -> bool:
        """Nothing to do now: no side work, no job that can start or resume, no row."""
        return not self._side and not self._startable() and not self._resumable() and not self.rows_in_use

    def _loop(self) -> None:
        """The model's thread, in inference mode (the works are interleaved: none may change the grad mode
        across a slice)."""
        with torch.inference_mode():
            while True:
                with self._cond:
                    while not self.closing.is_set() and self._idle():
                        self._cond.wait(timeout=1.0)
                if self.closing.is_set():
                    self._shutdown()
                    return
                try:
                    self._turn()
                except Exception as exc:  # noqa: BLE001 - a bug here fails the running jobs, not the server
                    self._fail_all(exc)

    def _turn(self) -> None:
        """One turn of the loop: resume, start, one slice of each side work, one step."""
        self._resume()
        self._start_waiting()
        for side in list(self._side):
            if self._slice(side):
                self._side.remove(side)
        if self.rows_in_use:
            self._step()
        self._flush()

    def _fail_rows(self, exc: BaseException) -> None:
        for r, row in enumerate(self.slots):
            if row is not None:
                self.slots[r] = None
                self.end(row.job, error=exc)
        for parked in self._parked:
            self.end(parked.job, error=exc)
        self._parked = []
        self.batch = None  # made anew: a failed step leaves it unknown

    def _fail_all(self, exc: Exception) -> None:
        """Every running job fails with ``exc`` (the waiting ones go on)."""
        self._fail_rows(exc)
        for side in self._side:
            side.work.close()
            self.end(side.job, error=exc)
        self._side = []

    def _flush(self) -> None:
        if not self._outbox:
            return
        items = self._outbox[:]
        del self._outbox[:]
        if self.post is not None:
            self.post(items)
        else:
            for on_event, event in items:
                on_event(event)

    def _shutdown(self) -> None:
        self._fail_rows(Cancelled())
        for side in self._side:
            side.work.close()
            self.end(side.job, error=Cancelled())
        for job, work in self._waiting:
            work.close()
            self.end(job, error=Cancelled())
        self._side, self._waiting = [], deque()
