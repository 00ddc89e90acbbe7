"""The model's loop of ``txl serve``: continuous batching over the rows of one key/value cache, on one thread.
Every admitted completion decodes as rows of one shared :class:`~txl.model.KVCache`; a new request prefills
its prompt in chunks in a batch-1 cache between decode steps of the others, then joins free rows
(:meth:`KVCache.put_rows`); a row that ends (length, stop string, cancelled) is freed at once
(:meth:`KVCache.reset_rows`). Other work (scores, sessions' reading) runs in slices between the steps too.
The HTTP layer (:mod:`txl.serve.app`) admits, checks and answers; this module knows no HTTP.

Dimensions: R rows of the shared cache (``--max-batch``), V vocabulary, P prompt tokens, M memory length.

Each row samples with its own generator seeded from its request's seed (choice ``i`` of ``n``: seed + i),
so its text does not depend on its neighbours: every step decodes all R rows at once (a free row feeds a
dummy token that nothing attends), and a row sees only its own document (its reach).

    engine = Engine(run, max_batch=16, queue_size=8)
    job = engine.admit(rows=1)                      # None: full (429)
    future = engine.submit(job, engine.completion_work(job, ids, sampling, n=1))
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from ..evaluate import segment_losses
from ..inference import GenerationSettings, draw, stream
from ..inference.text import TextStream
from ..model import KVCache, Memory
from ..model.decode import Decoder, bind_memory
from ..runs import LoadedRun
from .score import scoring_lengths, token_pieces

__all__ = ["Engine", "Job", "Sampling", "Cancelled", "Stats", "Session", "SessionStore"]


CONTEXT_IDS = 8
"""How many ids before a new text its pieces are decoded after (a session's ``recent``, a completion's
context): enough for every vocabulary's spacing, and each token then costs the same however long the text
before it was."""


class Cancelled(Exception):
    """A job stopped because its client left or the server is closing."""


@dataclass(frozen=True)
class Sampling:
    """How one completion is generated (checked by the HTTP layer)."""

    max_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int
    stop: tuple[str, ...]
    logprobs: int | None = None
    """Report the log-probability of each token and the ``logprobs`` most likely ones (None: no)."""
    echo: bool = False
    """Return the prompt with the completion (with its log-probabilities when ``logprobs`` is set)."""


@dataclass
class Stats:
    """Counters shown by ``GET /v1/health``."""

    requests: int = 0
    rejected: int = 0
    cancelled: int = 0
    failed: int = 0
    tokens_generated: int = 0
    sessions_created: int = 0
    sessions_expired: int = 0


class Job:
    """One admitted request: its cancellation flag, the rows it needs, its result, and (streaming) where its
    events go. ``backlog`` counts events sent that the client has not read yet."""

    def __init__(
        self,
        closing: threading.Event,
        *,
        rows: int,
        weight: int,
        on_event: Callable[[Any], None] | None,
        outbox: list | None = None,
    ) -> None:
        self._closing = closing
        self._outbox = outbox
        self.cancel_event = threading.Event()
        self.rows = rows
        """Rows of the shared cache it takes (0: it runs between the steps)."""
        self.weight = weight
        """Places of the server's capacity it holds while admitted."""
        self.on_event = on_event
        self.future: Future = Future()
        self.backlog = 0
        self.started = False

    def cancel(self) -> None:
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set() or self._closing.is_set()

    def emit(self, event: Any) -> None:
        """Send an event to the client (through the engine's outbox, flushed once per step, when it has one)."""
        if self.on_event is not None:
            self.backlog += 1
            if self._outbox is None:
                self.on_event(event)
            else:
                self._outbox.append((self.on_event, event))

    def read(self) -> None:
        """The client read one event."""
        self.backlog -= 1


# ---------------------------------------------------------------------------------------------------------
# Sessions: a memory that persists across requests
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Session:
    """What a session has read: its memory (batch 1, or None before anything was fed), the last token read
    and not yet fed (it is the context of the next text's first token), and a few ids before it (to decode
    the next pieces as one text)."""

    id: str
    created: float
    last_used: float
    memory: Memory | None = None
    pending: int | None = None
    recent: list[int] = field(default_factory=list)
    tokens_read: int = 0
    busy: bool = False

    def describe(self, *, ttl: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "session",
            "created": int(self.created),
            "tokens_read": self.tokens_read,
            "memory_length": 0 if self.memory is None else self.memory.length,
            "expires_in": max(0.0, round(self.last_used + ttl - time.monotonic(), 1)),
        }

    def read(self, ids: Sequence[int], *, memory: Memory | None, skip: int = 0) -> None:
        """``ids`` were read (after the first ``skip``, read already); ``memory`` now holds all but the last."""
        new = [int(i) for i in ids[skip:]]
        if new:
            self.pending = new[-1]
            self.recent = (self.recent + new)[-CONTEXT_IDS:]
            self.tokens_read += len(new)
        self.memory = memory


class SessionStore:
    """At most ``limit`` sessions; one idle for ``ttl`` seconds expires. Thread-safe."""

    def __init__(self, *, limit: int, ttl: float, stats: Stats) -> None:
        self.limit, self.ttl, self.stats = limit, ttl, stats
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, ident: str) -> Session | None:
        """A new session, or None when there are ``limit`` already."""
        self.expire()
        now = time.monotonic()
        with self._lock:
            if len(self._sessions) >= self.limit:
                return None
            session = Session(id=ident, created=time.time(), last_used=now)
            self._sessions[ident] = session
            self.stats.sessions_created += 1
            return session

    def get(self, ident: str) -> Session | None:
        self.expire()
        with self._lock:
            session = self._sessions.get(ident)
            if session is not None:
                session.last_used = time.monotonic()
            return session

    def delete(self, ident: str) -> bool:
        with self._lock:
            return self._sessions.pop(ident, None) is not None

    def expire(self) -> int:
        """Forget the sessions idle for longer than the ttl (not one in use); how many went."""
        deadline = time.monotonic() - self.ttl
        with self._lock:
            old = [k for k, s in self._sessions.items() if s.last_used < deadline and not s.busy]
            for key in old:
                del self._sessions[key]
            self.stats.sessions_expired += len(old)
        return len(old)


# ---------------------------------------------------------------------------------------------------------
# Rows of the shared cache
# ---------------------------------------------------------------------------------------------------------


@dataclass
class _Choice:
    """One generated choice's result so far."""

    index: int
    stream: TextStream
    finish: str = "length"
    count: int = 0
    ids: list[int] = field(default_factory=list)
    entries: dict[str, list] = field(default_factory=lambda: _empty_entries())
    """OpenAI's logprobs object of the tokens generated (filled with ``logprobs``)."""
    chars: int = 0
    done: bool = False


@dataclass
class _Join:
    """What a prefill yields when its prompt is read: the batch-1 cache and the next-token log-probs (1, V)."""

    cache: KVCache
    logprobs: Tensor


class _Completion:
    """One completion request's choices, shared by its rows; its result once every row has finished."""

    def __init__(
        self, engine: Engine, job: Job, ids: Tensor, sampling: Sampling, *, n: int, session: Session | None
    ) -> None:
        self.engine, self.job, self.ids, self.sampling, self.n, self.session = (
            engine,
            job,
            ids,
            sampling,
            n,
            session,
        )
        vocab = engine.run.vocab
        context = ids.tolist() if session is None else session.recent + ids.tolist()
        self.context = context[-CONTEXT_IDS:]
        """The context's last ids, that the text of a new token is decoded after."""
        self.skip = int(session is not None and session.pending is not None)
        self.fed = ids if not self.skip else torch.cat([torch.tensor([session.pending]), ids])
        """The ids the prefill feeds: a session's last token read (the context of the prompt's first), then
        the prompt."""
        self.prompt_text = vocab.decode(ids.tolist())
        self.choices = [_Choice(i, TextStream(vocab, self.context, stop=sampling.stop)) for i in range(n)]
        self.settings = GenerationSettings(
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
        )
        self.prompt_logprobs: list[tuple[float | None, dict[str, float] | None]] | None = None
        self.start = time.perf_counter()
        self.remaining = n
        self.memory: Memory | None = None  # a session's memory after the completion

    def token_info(self, logprobs: Tensor, token: int) -> tuple[float, dict[str, float]]:
        """(log-probability of ``token``, the ``logprobs`` best as {text: log-probability}) from (V,)."""
        k = min(self.sampling.logprobs or 0, logprobs.shape[-1])
        best = {}
        if k:
            values, ids = torch.topk(logprobs.float(), k)
            decode = self.engine.run.vocab.decode
            best = {decode([int(i)]): float(v) for v, i in zip(values.tolist(), ids.tolist(), strict=True)}
        return float(logprobs[token]), best

    def push(self, choice: _Choice, token: int, logprobs: Tensor | None) -> None:
        """A row drew ``token`` from ``logprobs`` (V,; needed only with ``logprobs`` asked for): record it, emit
        it, and mark the choice done when it met a stop string or ``max_tokens``."""
        choice.count += 1
        choice.ids.append(token)
        self.engine.stats.tokens_generated += 1
        entries = None
        if self.sampling.logprobs is not None:
            assert logprobs is not None
            logprob, best = self.token_info(logprobs, token)
            ids = (self.context + choice.ids[-CONTEXT_IDS - 1 :])[-CONTEXT_IDS - 1 :]
            piece = token_pieces(self.engine.run.vocab.decode, ids)[-1]
            entries = {
                "tokens": [piece],
                "token_logprobs": [logprob],
                "top_logprobs": [best],
                "text_offset": [len(self.prompt_text) + choice.chars],
            }
            choice.chars += len(piece)
            for key, value in entries.items():
                choice.entries[key].extend(value)
        text = choice.stream.push(token, final=choice.count == self.sampling.max_tokens)
        self.job.emit(("token", choice.index, text, entries))
        if choice.stream.stopped:
            choice.finish, choice.done = "stop", True
        elif choice.count >= self.sampling.max_tokens:
            choice.done = True

    def echo_entries(self) -> dict[str, Any] | None:
        """OpenAI's logprobs object of the prompt's tokens (the first has none), or None."""
        if self.prompt_logprobs is None:
            return None
        ids = self.ids.tolist()
        pieces = token_pieces(self.engine.run.vocab.decode, ids)
        offsets, at = [], 0
        for p in pieces:
            offsets.append(at)
            at += len(p)
        return {
            "tokens": pieces,
            "token_logprobs": [lp for lp, _ in self.prompt_logprobs],
            "top_logprobs": [best for _, best in self.prompt_logprobs],
            "text_offset": offsets,
        }

    def finished(self, choice: _Choice) -> None:
        self.remaining -= 1
        if self.remaining == 0:
            if self.session is not None:  # what was fed, and the last token drawn, join the session
                self.session.read(self.fed.tolist() + choice.ids, memory=self.memory, skip=self.skip)
            self.engine.end(self.job, self.result())

    def result(self) -> dict[str, Any]:
        seconds = time.perf_counter() - self.start
        choices = []
        echo = self.echo_entries() if self.sampling.echo else None
        for choice in self.choices:
            logprobs = None
            if self.sampling.logprobs is not None:
                logprobs = choice.entries
                if echo is not None:
                    logprobs = {key: echo[key] + logprobs[key] for key in echo}
            text = choice.stream.text
            choices.append(
                {
                    "text": self.prompt_text + text if self.sampling.echo else text,
                    "index": choice.index,
                    "logprobs": logprobs,
                    "finish_reason": choice.finish,
                }
            )
        count = sum(c.count for c in self.choices)
        return {"choices": choices, "completion_tokens": count, "seconds": seconds}


def _empty_entries() -> dict[str, Any]:
    return {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}


@dataclass
class _Row:
    completion: _Completion
    choice: _Choice
    generator: torch.Generator
    logprobs: Tensor  # (1, V) of the next token


# ---------------------------------------------------------------------------------------------------------
# The engine
# ---------------------------------------------------------------------------------------------------------


class Engine:
    """The model's one thread: admitted jobs wait in a bounded queue, start when their rows are free, and run
    as rows of the shared cache (completions of a Transformer-XL with memory) or in slices between its decode
    steps (scores, reading into sessions, and completions of a model without memory).

    At most ``max_batch + queue_size`` requests are admitted at once (a completion of ``n`` choices counts
    ``n``); :meth:`admit` refuses more."""

    def __init__(self, run: LoadedRun, *, max_batch: int, queue_size: int, stream_buffer: int = 32) -> None:
        self.run = run
        self.model = run.model
        self.model.eval()
        self.max_batch = max_batch
        self.capacity = max_batch + queue_size
        self.stream_buffer = stream_buffer
        self.closing = threading.Event()
        self.stats = Stats()
        config = run.config.model
        self.span = config.span
        self.cached = config.attention == "relative" and self.span.mem_len > 0
        param = next(self.model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._cond = threading.Condition()
        self._admitted = 0  # requests (choices) admitted and not yet ended
        self._waiting: deque[tuple[Job, Generator]] = deque()
        self._side: list[tuple[Job, Generator]] = []
        self._reserved = 0  # rows promised to jobs that are prefilling
        self.rows: list[_Row | None] = [None] * max_batch
        self._outbox: list[tuple[Callable[[Any], None], Any]] = []
        self.post: Callable[[list], None] | None = None
        """Where the events of a step go at once (the HTTP layer hands them to its event loop in one call, so
        a step wakes it once, not once per row); None: each job's ``on_event`` is called in turn."""
        self.cache: KVCache | None = None
        self.decoder: Decoder | None = None
        self._thread = threading.Thread(target=self._loop, name="txl-model", daemon=True)
        self._thread.start()

    # -- admission, from the HTTP layer's threads ----------------------------------------------------------

    @property
    def admitted(self) -> int:
        return self._admitted

    @property
    def rows_in_use(self) -> int:
        return sum(row is not None for row in self.rows)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def admit(
        self, *, rows: int = 0, weight: int = 1, on_event: Callable[[Any], None] | None = None
    ) -> Job | None:
        """A new job that will take ``rows`` rows of the shared cache (0: work between the steps) and holds
        ``weight`` places, or None when the server is full (the caller answers 429)."""
        with self._cond:
            if self._admitted + weight > self.capacity or self.closing.is_set():
                self.stats.rejected += 1
                return None
            self._admitted += weight
            self.stats.requests += 1
        return Job(
            self.closing,
            rows=rows if self.cached else 0,
            weight=weight,
            on_event=on_event,
            outbox=self._outbox,
        )

    def submit(self, job: Job, work: Generator) -> Future:
        """Queue ``work`` (a generator run one slice per ``next`` on the model's thread) for ``job``."""
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
        if job.future.done():
            return
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

    def _shared(self) -> KVCache:
        if self.cache is None:
            config = self.run.config.model
            zeros = Memory.zeros(
                config, self.max_batch, self.span.mem_len, dtype=self.dtype, device=self.device
            )
            self.cache = KVCache(config, span=self.span, memory=zeros)
            bind_memory(self.model, self.cache)
            self.decoder = Decoder(self.model, self.cache)
        return self.cache

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
                if job.rows and self.max_batch - self.rows_in_use - self._reserved < job.rows:
                    return
                self._waiting.popleft()
                if job.cancelled:
                    self.end(job, error=Cancelled())
                    continue
                self._reserved += job.rows
                job.started = True
                self._side.append((job, work))

    def _slice(self, job: Job, work: Generator) -> bool:
        """One slice of side work; True when it is over."""
        try:
            if job.cancelled:
                raise Cancelled
            value = next(work)
        except StopIteration as stop:
            self._reserved -= job.rows
            if job.rows == 0 or stop.value is not None:
                self.end(job, stop.value)
            return True
        except BaseException as exc:  # noqa: BLE001 - the job fails, the server goes on
            self._reserved -= job.rows
            work.close()
            self.end(job, error=exc if isinstance(exc, Exception) else Cancelled())
            return True
        if isinstance(value, tuple):  # (completion, join): its rows are ready
            completion, join = value
            self._reserved -= job.rows
            self._place(completion, join)
            work.close()
            return True
        return False

    def _place(self, completion: _Completion, join: _Join) -> None:
        """Put a prefilled request's choices into free rows."""
        cache = self._shared()
        free = [r for r, row in enumerate(self.rows) if row is None][: completion.n]
        for choice, r in zip(completion.choices, free, strict=True):
            cache.put_rows([r], join.cache)
            device = self.device
            generator = torch.Generator(device=device).manual_seed(
                _seed(completion.sampling.seed + choice.index)
            )
            self.rows[r] = _Row(completion, choice, generator, join.logprobs)

    def _free(self, r: int) -> None:
        row = self.rows[r]
        self.rows[r] = None
        assert self.cache is not None
        completion = row.completion
        if completion.session is not None and not completion.job.cancelled:
            completion.memory = _row_memory(self.cache, r)
        self.cache.reset_rows([r])
        if completion.job.cancelled:
            if not completion.job.future.done():
                self.end(completion.job, error=Cancelled())
            return
        completion.finished(row.choice)

    def _step(self) -> None:
        """Every active row draws its next token and its events go out; those that go on are fed, all rows at
        once."""
        active = []
        for r, row in enumerate(self.rows):
            if row is None:
                continue
            if row.completion.job.cancelled:
                self._free(r)
                continue
            active.append(r)
        if not active:
            return
        tokens = self._draw(active)
        feed = [0] * self.max_batch
        fed = []
        for r in active:
            row = self.rows[r]
            completion = row.completion
            logprobs = row.logprobs[0] if completion.sampling.logprobs is not None else None
            completion.push(row.choice, tokens[r], logprobs)
            if row.choice.done:
                self._free(r)
                continue
            feed[r] = tokens[r]
            fed.append(r)
        self._flush()  # the tokens drawn go to their clients while the model computes the next step
        if not fed:
            return
        assert self.decoder is not None
        try:
            logprobs = self.decoder.step(torch.tensor(feed, dtype=torch.long, device=self.device))  # (R, V)
        except Exception as exc:  # noqa: BLE001 - every row in the step fails; the server goes on
            for r in fed:
                row = self.rows[r]
                self.rows[r] = None
                self.end(row.completion.job, error=exc)
            self.cache, self.decoder = None, None
            return
        for r in fed:
            self.rows[r].logprobs = logprobs[r : r + 1]

    def _draw(self, active: list[int]) -> dict[int, int]:
        """The next token of each active row: the greedy rows in one draw over them all (no generator), the
        others each from its own generator."""
        tokens: dict[int, int] = {}
        greedy = [r for r in active if self.rows[r].completion.settings.temperature == 0]
        if greedy:
            rows = [self.rows[r].logprobs for r in greedy]  # each (1, V)
            settings = self.rows[greedy[0]].completion.settings  # temperature 0: draw takes the argmax
            best = draw(torch.cat(rows) if len(rows) > 1 else rows[0], settings).tolist()  # (G,)
            tokens.update(zip(greedy, best, strict=True))
        for r in active:
            if r not in tokens:
                row = self.rows[r]
                tokens[r] = int(draw(row.logprobs, row.completion.settings, generator=row.generator)[0])
        return tokens

    def _stalled(self) -> bool:
        """Whether every active row's client is behind by more than the stream buffer (then wait)."""
        rows = [row for row in self.rows if row is not None]
        return bool(rows) and all(
            row.completion.job.on_event is not None
            and row.completion.job.backlog > self.stream_buffer
            and not row.completion.job.cancelled
            for row in rows
        )

    def _startable(self) -> bool:
        if not self._waiting:
            return False
        job = self._waiting[0][0]
        return job.cancelled or not job.rows or self.max_batch - self.rows_in_use - self._reserved >= job.rows

    def _idle(self) -> bool:
        """Nothing to do now: no side work, no job that can start, no row that can step."""
        return not self._side and not self._startable() and (self.rows_in_use == 0 or self._stalled())

    def _loop(self) -> None:
        """The model's thread. Everything runs in inference mode (the work's generators are interleaved, so
        none of them may enter and leave a grad mode of its own across a slice)."""
        with torch.inference_mode():
            self._run()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self.closing.is_set() and self._idle():
                    self._cond.wait(timeout=0.05 if self.rows_in_use or self._waiting else 1.0)
            if self.closing.is_set():
                self._shutdown()
                return
            try:
                self._start_waiting()
                for job, work in list(self._side):
                    if self._slice(job, work):
                        self._side.remove((job, work))
                if self.rows_in_use and not self._stalled():
                    self._step()
                self._flush()
            except Exception as exc:  # noqa: BLE001 - a bug here fails the running jobs, not the server
                self._fail_all(exc)

    def _fail_all(self, exc: Exception) -> None:
        """Every running job fails with ``exc``; the shared cache is made anew (the waiting jobs go on)."""
        for r, row in enumerate(self.rows):
            if row is not None:
                self.rows[r] = None
                self.end(row.completion.job, error=exc)
        for job, work in self._side:
            work.close()
            self.end(job, error=exc)
        self._side, self._reserved = [], 0
        self.cache, self.decoder = None, None

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
        self._flush()
        for r, row in enumerate(self.rows):
            if row is not None:
                self.rows[r] = None
                self.end(row.completion.job, error=Cancelled())
        for job, work in self._side + list(self._waiting):
            work.close()
            self.end(job, error=Cancelled())
        self._side, self._waiting = [], deque()

    # -- the work -----------------------------------------------------------------------------------------

    def completion_work(
        self, job: Job, ids: Tensor, sampling: Sampling, *, n: int = 1, session: Session | None = None
    ) -> Generator:
        """The work of a completion of ``ids`` (P,): the prompt's log-probabilities when echoed with
        ``logprobs``, then the prefill (Transformer-XL with memory: it joins the shared cache's rows) or the
        whole decoding (a model without memory, choice after choice)."""
        completion = _Completion(self, job, ids, sampling, n=n, session=session)
        if sampling.echo and sampling.logprobs is not None:
            completion.prompt_logprobs = yield from self._prompt_logprobs(completion)
        if sampling.echo:
            for choice in completion.choices:
                job.emit(("echo", choice.index, completion.prompt_text, completion.echo_entries()))
        if sampling.max_tokens == 0:
            return completion.result()
        if not self.cached:
            return (yield from self._decode_alone(completion))
        memory = None if session is None else _last(session.memory, self.span.mem_len)
        cache = KVCache(
            self.run.config.model,
            batch_size=1,
            span=self.span,
            memory=memory,
            dtype=self.dtype,
            device=self.device,
        )
        chunk = self.span.mem_len  # as txl.inference prefills
        prompt = completion.fed.to(self.device)[None]  # (1, P)
        out = None
        for start in range(0, prompt.shape[1], chunk):
            if start:
                yield None  # the other rows step between two chunks (not after the last: the row joins at once)
            out = self.model(prompt[:, start : start + chunk], cache=cache, last_only=True)
        yield completion, _Join(cache, out.log_probs[:, -1].clone())  # (1, V)

    def _prompt_logprobs(self, completion: _Completion) -> Generator:
        ids = completion.ids
        result: list[tuple[float | None, dict[str, float] | None]] = [(None, None)]
        if ids.numel() >= 2:
            tgt_len, span = scoring_lengths(self.run.config, memory=True)
            segments = segment_losses(
                self.model,
                ids[None].to(self.device),
                tgt_len=tgt_len,
                span=span,
                batch_size=1,
                log_probs=True,
            )
            targets = ids.tolist()[1:]
            at = 0
            try:
                for segment in segments:
                    for t in range(segment.log_probs.shape[1]):
                        result.append(completion.token_info(segment.log_probs[0, t], targets[at]))
                        at += 1
                    yield None
            finally:
                segments.close()
        return result

    def _decode_alone(self, completion: _Completion) -> Generator:
        """A model without memory: each choice decoded by :func:`txl.inference.stream`, one token per slice."""
        sampling = completion.sampling
        settings = GenerationSettings(
            max_new_tokens=sampling.max_tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
        )
        for choice in completion.choices:
            generator = torch.Generator(device=self.device).manual_seed(_seed(sampling.seed + choice.index))
            steps = stream(self.model, completion.ids.to(self.device)[None], settings, generator=generator)
            try:
                for step in steps:
                    completion.push(choice, int(step.tokens[0]), step.log_probs[0])
                    if choice.done:
                        break
                    yield None
            finally:
                steps.close()
        return completion.result()

    def score_work(self, session: Session, ids: Tensor) -> Generator:
        """Read ``ids`` (N,) into a session: the log-probability of each given everything the session has read
        (segments of the evaluation length with its memory, as ``/v1/score``); the memory then holds them."""
        tgt_len, span = scoring_lengths(self.run.config, memory=True)
        context = [] if session.pending is None else [session.pending]
        seq = torch.tensor(context + ids.tolist(), dtype=torch.long, device=self.device)
        losses: list[float] = []
        memory = session.memory
        if seq.numel() >= 2:
            segments = segment_losses(
                self.model,
                seq[None],
                tgt_len=tgt_len,
                span=span,
                batch_size=1,
                memory=memory,
                reuse_keys=False,
            )
            try:
                for segment in segments:
                    losses.extend(segment.loss[0].tolist())
                    memory = segment.memory
                    yield None
            finally:
                segments.close()
        pieces = token_pieces(self.run.vocab.decode, session.recent + ids.tolist())[len(session.recent) :]
        first_null = session.pending is None
        logprobs: list[float | None] = ([None] if first_null else []) + [-x for x in losses]
        tokens = [
            {"id": i, "text": p, "logprob": lp}
            for i, p, lp in zip(ids.tolist(), pieces, logprobs, strict=True)
        ]
        session.read(ids.tolist(), memory=memory)
        mean = sum(losses) / len(losses) if losses else float("nan")
        return {
            "tgt_len": tgt_len,
            "mem_len": span.mem_len,
            "scored_tokens": len(losses),
            "mean_loss": mean,
            "ppl": math.exp(mean) if mean < 700 else float("inf"),
            "bits_per_token": mean / math.log(2) if losses else float("nan"),
            "tokens": tokens,
            "tokens_read": session.tokens_read,
        }


def _seed(seed: int) -> int:
    """A request's seed (or seed + choice) as torch.Generator.manual_seed takes it."""
    return seed % 2**64


def _last(memory: Memory | None, length: int) -> Memory | None:
    """The last ``length`` positions of a batch-1 memory (all of them are the session's)."""
    if memory is None or memory.length <= length:
        return memory
    return Memory(tuple(state[:, -length:].clone() for state in memory.states))


def _row_memory(cache: KVCache, r: int) -> Memory | None:
    """Row ``r``'s own remembered positions (those within its reach) as a batch-1 memory."""
    reach = int(cache.full_reach()[r])
    if reach == 0:
        return None
    index = torch.tensor([r], device=cache.device)
    return Memory(
        tuple(cache.hidden[i, index, cache.end - reach : cache.end].clone() for i in range(len(cache.layers)))
    )
