"""What ``txl serve`` decodes at once: an :class:`~txl.inference.Engine` (its rows, its queue, a generator per
choice), which job's choice each request is, and the parking policy (back-pressure) over it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import nn

from ..inference import DecodeSettings, Engine
from .jobs import Cancelled, Job, JobState, Ready, RowWork, Work

__all__ = ["Batch"]


@dataclass
class _Choice:
    job: Job
    work: RowWork
    choice: int


class Batch:
    """The engine of ``settings.rows`` rows and the choices it decodes. ``end(job, error)`` ends a job that
    failed or was cancelled; ``follow(job, work)`` runs a job's last work once all its choices are over;
    ``generated`` counts the tokens drawn, ``parks`` the choices parked.

    Back-pressure: a streaming job whose client is ``stream_buffer`` events behind what the server has
    written to its connection is parked (:meth:`Engine.park`: its row's memory is kept aside and the row
    freed for others); it joins a row again when its client has caught up half of them, exactly where it
    stopped."""

    def __init__(
        self,
        model: nn.Module,
        settings: DecodeSettings,
        *,
        stream_buffer: int,
        end: Callable[[Job, BaseException], None],
        follow: Callable[[Job, Work], None],
    ) -> None:
        self.model, self.settings, self.stream_buffer = model, settings, stream_buffer
        self.end, self.follow = end, follow
        self.generated = 0
        self.parks = 0
        self.engine = Engine(model, settings)
        self.running: dict[int, _Choice] = {}  # request -> its choice (waiting, prefilling or decoding)
        self.parked: dict[int, _Choice] = {}

    @property
    def in_use(self) -> int:
        """The rows promised to choices: held, or waiting in the engine's queue."""
        return self.engine.rows_in_use + self.engine.waiting

    def add(self, job: Job, ready: Ready) -> None:
        """A request's choices join the engine (each prompt prefilled once, its choices from that prefill;
        the rows were reserved for them)."""
        work = ready.work
        for choice in range(work.n):
            prompt = ready.prompts[work.prompt_of(choice)]
            request = self.engine.add(prompt, work.sampling(choice), memory=ready.memory)
            self.running[request] = _Choice(job, work, choice)
        job.state = JobState.DECODING

    def step(self, flush: Callable[[], None]) -> None:
        """One engine step: every choice draws its next token and its events go out (then ``flush``); a
        finished one leaves, a streaming one whose client is ``stream_buffer`` events behind is parked."""
        for request, choice in list(self.running.items()):
            if choice.job.cancelled:
                self.engine.finish(request)
                self._leave(request)
        if not self.running:
            return
        try:
            events = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - every choice in the engine fails; the server goes on
            self.fail(exc)
            return
        for event in events:
            request = event.request
            choice = self.running[request]
            self.generated += 1
            over = choice.work.push(choice.choice, event.token, event.log_probs)
            if over or event.finish is not None:
                self.engine.finish(request)
                self._leave(request)
            elif choice.job.on_event is not None and choice.job.backlog >= self.stream_buffer:
                self.engine.park(request)
                self.parked[request] = self.running.pop(request)
                self.parks += 1
                choice.job.state = JobState.PARKED
        flush()  # the tokens drawn go to their clients before the model computes the next step

    def _leave(self, request: int) -> None:
        """A choice is over (or cancelled): its job ends when it was its last."""
        choice = self.running.pop(request, None) or self.parked.pop(request)
        job = choice.job
        if job.cancelled:
            self.end(job, Cancelled())
        elif not any(c.job is job for c in (*self.running.values(), *self.parked.values())):
            job.state = JobState.WORKING
            self.follow(job, choice.work.done())  # every choice is over

    def resume(self, free: int) -> None:
        """Parked choices whose client caught up wait for ``free`` rows again, before any waiting job."""
        for request, choice in list(self.parked.items()):
            job = choice.job
            if job.cancelled:
                self.engine.finish(request)
                self._leave(request)
                continue
            if job.backlog > job.resume_at or free < 1:
                continue
            free -= 1
            self.engine.resume(request)
            self.running[request] = self.parked.pop(request)
            job.state = JobState.DECODING

    def resumable(self, free: int) -> bool:
        """Whether a parked choice is cancelled, or can join one of ``free`` rows again."""
        return any(
            c.job.cancelled or (free and c.job.backlog <= c.job.resume_at) for c in self.parked.values()
        )

    def fail(self, exc: BaseException) -> None:
        """Every choice in the engine or parked fails with ``exc``; the engine is made anew."""
        for choice in (*self.running.values(), *self.parked.values()):
            self.end(choice.job, exc)
        self.running, self.parked = {}, {}
        self.engine = Engine(self.model, self.settings)  # a failed step leaves it unknown
