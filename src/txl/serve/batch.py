"""The rows ``txl serve`` decodes at once: which job's choice each row holds, the choices parked while their
clients catch up, and one step of them all (draw, emit, feed), on :mod:`txl.inference`'s rows."""

# Dimensions: R rows (``--max-batch``), V vocabulary.

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import Span
from ..inference import GenerationSettings, Prefilled, RowBatch, WindowRows, draw, rows_for
from ..model import Memory
from .jobs import JOINED, PAUSE, Cancelled, Job, JobState, Pause, Ready, RowWork, Work

__all__ = ["Batch"]


def _paused(steps: Generator[None, None, Prefilled]) -> Generator[Pause, None, Prefilled]:
    """A prefill's steps as a work's pauses; its :class:`Prefilled` at the end."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value
        yield PAUSE


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


class Batch:
    """R rows of one batch and the parked choices. ``end(job, error)`` ends a job that failed or was cancelled;
    ``follow(job, work)`` runs a job's last work once all its choices are over; ``generated`` counts the
    tokens drawn, ``parks`` the choices parked.

    Back-pressure: a streaming job whose client is ``stream_buffer`` events behind what the server has
    written to its connection is parked: its row's memory is kept aside and the row freed for others; it
    joins a row again when its client has caught up half of them, exactly where it stopped."""

    def __init__(
        self,
        model: nn.Module,
        *,
        span: Span,
        size: int,
        stream_buffer: int,
        end: Callable[[Job, BaseException], None],
        follow: Callable[[Job, Work], None],
    ) -> None:
        self.model, self.span, self.size, self.stream_buffer = model, span, size, stream_buffer
        self.device = next(model.parameters()).device
        self.end, self.follow = end, follow
        self.generated = 0
        self.parks = 0
        self.slots: list[_Row | None] = [None] * size
        self.parked: list[_Parked] = []
        self.rows: RowBatch | WindowRows | None = None

    @property
    def in_use(self) -> int:
        """The rows holding a choice."""
        return sum(row is not None for row in self.slots)

    def _rows(self) -> RowBatch | WindowRows:
        if self.rows is None:
            self.rows = rows_for(self.model, self.size, GenerationSettings(span=self.span))
        return self.rows

    def prefill(self, job: Job, ready: Ready) -> Work:
        """The work of prefilling a request's prompts (a pause between two chunks, so that the rows step
        meanwhile), then putting its choices into free rows (reserved for it)."""
        rows, work = self._rows(), ready.work
        prefilled = []
        for prompt in ready.prompts:
            prefilled.append((yield from _paused(rows.prefill_steps(prompt, ready.memory))))
        self._place(job, work, prefilled)
        return JOINED

    def _place(self, job: Job, work: RowWork, prefilled: list[Prefilled]) -> None:
        rows = self._rows()
        free = [r for r, row in enumerate(self.slots) if row is None][: work.n]
        for choice, r in zip(range(work.n), free, strict=True):
            start = prefilled[work.prompt_of(choice)]
            rows.join(r, start)
            self.slots[r] = _Row(job, work, choice, work.generator(choice), start.log_probs)
        job.state = JobState.DECODING

    def _leave(self, r: int, *, park: bool = False) -> None:
        """Row ``r``'s choice leaves the batch: over, cancelled, or parked (its memory kept aside)."""
        row = self.slots[r]
        assert row is not None and self.rows is not None
        self.slots[r] = None
        if park:
            memory = self.rows.row_memory(r)
            self.parked.append(_Parked(row.job, row.work, row.choice, row.generator, memory))
            self.parks += 1
            row.job.state = JobState.PARKED
        self.rows.free(r)
        if row.job.cancelled:
            self.end(row.job, Cancelled())
        elif (
            not park
            and not any(s is not None and s.job is row.job for s in self.slots)
            and not any(p.job is row.job for p in self.parked)
        ):
            row.job.state = JobState.WORKING
            self.follow(row.job, row.work.done())  # every choice is over

    def resume(self, free: int) -> None:
        """Parked choices whose client caught up join ``free`` rows again (before any waiting job)."""
        for parked in list(self.parked):
            job = parked.job
            if job.cancelled:
                self.parked.remove(parked)
                self.end(job, Cancelled())
                continue
            if job.backlog > job.resume_at or free < 1:
                continue
            free -= 1
            self.parked.remove(parked)
            prefilled = self._rows().prefill(parked.work.resume_prompt(parked.choice), parked.memory)
            r = self.slots.index(None)
            self._rows().join(r, prefilled)
            self.slots[r] = _Row(job, parked.work, parked.choice, parked.generator, prefilled.log_probs)
            job.state = JobState.DECODING

    def step(self, flush: Callable[[], None]) -> None:
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
        feed = [0] * self.size
        fed = []
        for r in active:
            row = self.slots[r]
            assert row is not None
            self.generated += 1
            if row.work.push(row.choice, tokens[r], row.log_probs[0]):
                self._leave(r)
            elif row.job.on_event is not None and row.job.backlog >= self.stream_buffer:
                self._leave(r, park=True)
            else:
                feed[r] = tokens[r]
                fed.append(r)
        flush()  # the tokens drawn go to their clients while the model computes the next step
        if fed:
            self._feed(feed, fed)

    def _feed(self, feed: list[int], fed: list[int]) -> None:
        assert self.rows is not None
        try:
            log_probs = self.rows.step(torch.tensor(feed, dtype=torch.long, device=self.device))  # (R, V)
        except Exception as exc:  # noqa: BLE001 - every row in the step fails; the server goes on
            self.fail(exc)
            return
        for r in fed:
            row = self.slots[r]
            assert row is not None
            row.log_probs = log_probs[r : r + 1]

    def _draw(self, active: list[int]) -> dict[int, int]:
        """The next token of each active row: the greedy rows in one draw over them all (no generator), the
        others each from its own generator."""
        rows = {r: row for r in active if (row := self.slots[r]) is not None}
        greedy = [r for r, row in rows.items() if row.work.settings.greedy]
        tokens: dict[int, int] = {}
        if greedy:
            joined = torch.cat([rows[r].log_probs for r in greedy])  # (G, V)
            best = draw(joined, rows[greedy[0]].work.settings).tolist()  # greedy: the argmax
            tokens.update(zip(greedy, best, strict=True))
        for r, row in rows.items():
            if r not in tokens:
                tokens[r] = int(draw(row.log_probs, row.work.settings, generator=row.generator)[0])
        return tokens

    def resumable(self, free: int) -> bool:
        """Whether a parked choice is cancelled, or can join one of ``free`` rows again."""
        return any(p.job.cancelled or (free and p.job.backlog <= p.job.resume_at) for p in self.parked)

    def fail(self, exc: BaseException) -> None:
        """Every choice in a row or parked fails with ``exc``; the rows are made anew."""
        for r, row in enumerate(self.slots):
            if row is not None:
                self.slots[r] = None
                self.end(row.job, exc)
        for parked in self.parked:
            self.end(parked.job, exc)
        self.parked = []
        self.rows = None  # made anew: a failed step leaves it unknown
