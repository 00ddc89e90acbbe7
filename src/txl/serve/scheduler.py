"""The model's one thread of ``txl serve``: admission into a bounded queue, and the loop that starts waiting jobs,
runs their side work in slices (scores, readings) between the engine's steps (:class:`~txl.serve.batch.Batch`:
continuous batching). It knows no HTTP, no wire format and no request's meaning."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from ..config import Span
from ..inference import DecodeSettings
from .batch import Batch
from .jobs import Cancelled, Job, JobState, Ready, Stats, Work

__all__ = ["Scheduler"]


@dataclass
class _Side:
    job: Job
    work: Work
    reserved: int  # rows promised to it


class Scheduler:
    """The model's one thread. Admitted jobs wait in a bounded queue, start in order when their rows are free,
    and run as rows of the batch or in slices between its steps.

    At most ``max_batch + queue_size`` requests are admitted at once (a completion of ``n`` choices counts
    ``n``); :meth:`admit` refuses more. ``compiled``: the batch decodes with the step compiled ahead of time
    (:attr:`~txl.inference.DecodeSettings.compiled`), compiled or loaded by the thread before its first job."""

    def __init__(
        self,
        model: nn.Module,
        *,
        span: Span,
        max_batch: int,
        queue_size: int,
        stream_buffer: int,
        compiled: bool = False,
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
        self.batch = Batch(
            model,
            DecodeSettings(span=span, rows=max_batch, compiled=compiled),
            stream_buffer=stream_buffer,
            end=self._fail,
            follow=self._follow,
        )
        self._outbox: list[tuple[Callable[[Any], None], Any]] = []
        self.post: Callable[[list], None] | None = None
        """Where the events of a step go at once (the HTTP layer hands them to its event loop in one call);
        None: each job's ``on_event`` is called in turn."""
        self._thread = threading.Thread(target=self._loop, name="txl-model", daemon=True)
        self._thread.start()

    # -- from the HTTP layer's threads --------------------------------------------------------------------

    @property
    def admitted(self) -> int:
        """Places held by admitted jobs."""
        return self._admitted

    @property
    def rows_in_use(self) -> int:
        """Rows of the engine holding a choice or promised to one in its queue."""
        return self.batch.in_use

    @property
    def waiting(self) -> int:
        """Jobs in the queue."""
        return len(self._waiting)

    @property
    def parked(self) -> int:
        """Choices parked while their clients catch up."""
        return len(self.batch.parked)

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
        """Let the model's thread look again (a client caught up, a job was cancelled)."""
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        """Stop the model's thread: every job ends cancelled."""
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
        """One slice of side work; True when it is over. A work that is ``Ready`` is over: its choices join the
        engine (which prefills them between its steps)."""
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
            work.close()
            self.batch.add(job, event)
            return True
        return False

    def _startable(self) -> bool:
        if not self._waiting:
            return False
        job = self._waiting[0][0]
        return job.cancelled or job.rows <= self._free_rows()

    def _idle(self) -> bool:
        """Nothing to do now: no side work, no job that can start or resume, no row."""
        return (
            not self._side
            and not self._startable()
            and not self.batch.resumable(self._free_rows())
            and not self.rows_in_use
        )

    def _loop(self) -> None:
        """The model's thread, in inference mode (the works are interleaved: none may change the grad mode
        across a slice)."""
        with torch.inference_mode():
            if self.batch.settings.compiled:
                self._warm()
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

    def _warm(self) -> None:
        """Compile (or load from disk) the compiled step for the batch's sizes before the first job: two
        greedy tokens (one step) of ``max_batch`` one-token prompts through an engine of the batch's settings. Jobs
        admitted meanwhile wait; a failure here leaves the batch to compile on its first step."""
        from ..inference import SamplingParams, generate

        prompt = torch.zeros(self.max_batch, 1, dtype=torch.long, device=self.device)
        try:
            generate(
                self.model,
                prompt,
                SamplingParams(max_new_tokens=2, temperature=0),
                settings=self.batch.settings,
            )
        except Exception:  # noqa: BLE001 - the batch's own first step will meet (and report) the same error
            pass

    def _turn(self) -> None:
        """One turn of the loop: resume, start, one slice of each side work, one engine step."""
        self.batch.resume(self._free_rows())
        self._start_waiting()
        for side in list(self._side):
            if self._slice(side):
                self._side.remove(side)
        if self.rows_in_use:
            self.batch.step(self._flush)
        self._flush()

    def _fail(self, job: Job, error: BaseException) -> None:
        self.end(job, error=error)

    def _follow(self, job: Job, work: Work) -> None:
        self._side.append(_Side(job, work, 0))

    def _fail_all(self, exc: Exception) -> None:
        """Every running job fails with ``exc`` (the waiting ones go on)."""
        self.batch.fail(exc)
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
        self.batch.fail(Cancelled())
        for side in self._side:
            side.work.close()
            self.end(side.job, error=Cancelled())
        for job, work in self._waiting:
            work.close()
            self.end(job, error=Cancelled())
        self._side, self._waiting = [], deque()
