"""The decoding engine: requests in, token events out. It owns the rows (:mod:`.rows`), the waiting queue and
one random generator per request; every face (generate, text, the harness, ``txl serve``) is a client."""

# Dimensions: R rows, P prompt length, V vocabulary.
#
#     engine = Engine(model, DecodeSettings(rows=8))
#     a = engine.add(prompt_ids, SamplingParams(max_new_tokens=20, temperature=0.8, seed=1))
#     while engine.unfinished:
#         for event in engine.step():        # TokenEvent(request, token, log_probs (V,), finish)
#             ...                            # engine.finish(a) ends a request early (a stop string)
#
# A step: the requests that finished at the step before leave their rows; the tokens drawn at the step
# before are fed (one decoding step of every row at once); waiting requests take the free rows and are
# prefilled, a chunk per step (those admitted together as one batch, the choices of one prompt from one
# prefill); then every running request draws its next token from its own generator (greedy ones by one
# argmax over them all) and the events go out. Between two steps a request's last token is drawn but not
# fed yet: that is when the faces read it, end it, take its memory, or park it (back-pressure: its row is
# freed and its memory kept aside; resumed, it is prefilled with its last token after that memory and goes
# on exactly where it stopped).

from __future__ import annotations

from collections import deque
from collections.abc import Generator, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Literal

import torch
from torch import Tensor, nn

from ..config import has_memory
from ..model import Memory
from ..model.transformer import config_of
from ..threads import threads_for
from .params import DecodeSettings, SamplingParams
from .rows import Prefilled, RowBatch, WindowRows, _no_memory_why, prepare_rows, rows_for
from .sampling import draw

__all__ = ["Engine", "TokenEvent", "Finish"]

Finish = Literal["stop", "length"]
"""Why a request ended with a token: one of its ``stop_ids`` (``"stop"``) or its ``max_new_tokens``
(``"length"``)."""


@dataclass(frozen=True)
class TokenEvent:
    """One token drawn for one request at one :meth:`Engine.step`."""

    request: int
    """The request's id (what :meth:`Engine.add` returned)."""
    token: int
    """The token drawn."""
    log_probs: Tensor
    """(V,) the model's log-probabilities it was drawn from (before temperature and filters)."""
    finish: Finish | None
    """Why the request ended with this token (None: it goes on)."""


class _State(Enum):
    WAITING = "waiting"  # in the queue
    PREFILLING = "prefilling"  # holds a row; its prompt is read, a chunk per step
    RUNNING = "running"  # decodes in its row
    PARKED = "parked"  # out of the rows, its memory kept aside
    FINISHED = "finished"  # leaves its row at the next step


@dataclass(eq=False)
class _Request:
    id: int
    prompt: Tensor  # (P,) what the next prefill reads
    first: Tensor  # (P,) the prompt as added
    params: SamplingParams
    memory: Memory | None  # what the next prefill reads after
    generator: torch.Generator | None
    state: _State = _State.WAITING
    row: int | None = None
    tokens: list[int] = field(default_factory=list)
    pending: Tensor | None = None  # (V,) what the next token is drawn from
    fed: bool = True  # whether its last token went through the model
    stop_ids: frozenset[int] = frozenset()
    given: object = None  # the prompt and memory as given: choices of one prompt share one prefill


@dataclass(eq=False)
class _Prefill:
    steps: Generator[None, None, Prefilled]
    requests: list[_Request]
    sources: list[int]  # the prefilled row of each request


class Engine:
    """Requests in, token events out, over the rows of one model (:func:`~txl.inference.rows.rows_for`: a
    key/value cache with memory, recomputed windows without).

    :meth:`add` queues a request (its prompt, its :class:`~txl.inference.params.SamplingParams`, optionally a
    memory to continue); :meth:`step` runs one step of every request and returns their
    :class:`TokenEvent` s. Each request draws from a generator of its own: seeded with its ``seed``, or
    without one from a seed drawn from ``generator`` (torch's global generator when None) when it is added;
    each row attends only to its own tokens. So a request gets exactly the tokens it gets alone, whatever
    else is decoded beside it and whenever it joins. ``settings`` (:class:`~txl.inference.params.DecodeSettings`)
    say how the rows decode; ``settings.rows`` None: as many as the requests waiting at the first step.

    The model should be in eval mode (``txl.model.eval_mode``); the steps run in inference mode."""

    def __init__(
        self,
        model: nn.Module,
        settings: DecodeSettings = DecodeSettings(),
        *,
        generator: torch.Generator | None = None,
    ) -> None:
        if not isinstance(settings, DecodeSettings):
            raise ValueError(f"settings must be a DecodeSettings, got {type(settings).__name__}")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        self.model, self.settings, self.generator = model, settings, generator
        self.config = config_of(model)
        span = self.config.span if settings.span is None else settings.span
        self.has_memory = has_memory(self.config, span)
        param = next(model.parameters(), None)
        self.device = param.device if param is not None else torch.device("cpu")
        self.rows: RowBatch | WindowRows | None = None
        """The rows (made at the first admission)."""
        self._requests: dict[int, _Request] = {}
        self._waiting: deque[_Request] = deque()
        self._slots: list[_Request | None] = []
        self._prefills: list[_Prefill] = []
        self._leaving: list[_Request] = []
        self._next_id = 0

    # -- requests in --------------------------------------------------------------------------------------

    def add(
        self,
        prompt_ids: Tensor | Sequence[int],
        params: SamplingParams = SamplingParams(),
        *,
        memory: Memory | None = None,
        generator: torch.Generator | None = None,
    ) -> int:
        """Queue a request: continue ``prompt_ids`` ((P,) token ids, at least one) as ``params`` says, after
        ``memory`` (a batch-1 :class:`Memory`, e.g. what :meth:`memory` returned; a model with memory only).
        ``generator``: the request's own generator (the caller's, in its state), instead of one seeded with
        ``params.seed``. Returns the request's id, which its events carry."""
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if params.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1 to generate (0 generates nothing)")
        if params.stop_ids is not None and max(params.stop_ids) >= self.config.vocab_size:
            raise ValueError(
                f"stop_ids must be token ids in [0, {self.config.vocab_size}), got {list(params.stop_ids)}"
            )
        ids = prompt_ids if isinstance(prompt_ids, Tensor) else torch.as_tensor(prompt_ids)
        if ids.dim() != 1 or ids.numel() == 0:
            raise ValueError(f"prompt_ids must be 1-D (time,) and not empty, got shape {tuple(ids.shape)}")
        (prompt,) = prepare_rows([ids], vocab_size=self.config.vocab_size, device=self.device)
        if memory is not None:
            if not self.has_memory:
                raise ValueError(
                    f"memory was given but the model has none ({_no_memory_why(self.model)}): pass memory=None"
                )
            if not isinstance(memory, Memory):
                raise ValueError(f"memory must be a txl Memory, got {type(memory).__name__}")
            if memory.batch_size != 1:
                raise ValueError(f"memory has {memory.batch_size} batch rows, a request 1")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        if generator is None and not params.greedy:
            seed = params.seed
            if seed is None:  # once, now: the request's draws never depend on later requests
                device = None if self.generator is None else self.generator.device
                seed = int(torch.randint(2**62, (), generator=self.generator, device=device))
            generator = torch.Generator(device=self.device).manual_seed(seed)
        request = _Request(self._next_id, prompt, prompt, params, memory, generator)
        request.stop_ids = frozenset(params.stop_ids or ())
        request.given = (prompt_ids, memory)
        self._next_id += 1
        self._requests[request.id] = request
        self._waiting.append(request)
        return request.id

    # -- the state, between two steps ----------------------------------------------------------------------

    @property
    def unfinished(self) -> bool:
        """Whether a request is waiting, prefilling or running (a parked one waits for :meth:`resume`)."""
        return any(r.state not in (_State.PARKED, _State.FINISHED) for r in self._requests.values())

    @property
    def rows_in_use(self) -> int:
        """The rows held by a request prefilling or running (a request that finished at the last step leaves
        its row at the next)."""
        return sum(slot is not None and slot.state is not _State.FINISHED for slot in self._slots)

    @property
    def waiting(self) -> int:
        """The requests waiting for a row."""
        return len(self._waiting)

    @property
    def parked(self) -> int:
        """The requests parked."""
        return sum(r.state is _State.PARKED for r in self._requests.values())

    def memory(self, request: int) -> Memory | None:
        """``request``'s own memory (batch 1, a copy): the positions its row attends, i.e. its prompt (after
        the memory it was given) and its tokens but the last (drawn, not fed). Between two steps, for a
        running request, one that finished at the last step, or a parked one; None for a model without
        memory or a row that remembers nothing."""
        req = self._get(request, "memory")
        if req.state is _State.PARKED:
            return req.memory
        if req.state not in (_State.RUNNING, _State.FINISHED) or req.row is None:
            raise ValueError(f"memory: request {request} has no row yet ({req.state.value})")
        assert self.rows is not None
        return self.rows.row_memory(req.row)

    # -- what the faces do between two steps --------------------------------------------------------------

    def finish(self, request: int) -> None:
        """``request`` ends now (a stop string its face met, a client that left): it is not fed again, and
        leaves its row at the next step. A request that has ended already is left as it is."""
        req = self._requests.get(request)
        if req is None or req.state is _State.FINISHED:
            return
        if req.state is _State.WAITING:
            self._waiting.remove(req)
        if req.state in (_State.WAITING, _State.PARKED):
            del self._requests[req.id]
        req.state = _State.FINISHED
        if req.row is not None and req.id in self._requests:
            self._leaving.append(req)

    def park(self, request: int) -> None:
        """Take running ``request`` out of its row at once (its client is behind): its memory is kept aside and
        the row is free for others; :meth:`resume` brings it back exactly where it stopped."""
        req = self._get(request, "park")
        if req.state is not _State.RUNNING or req.fed:
            raise ValueError(f"park: request {request} is not running with a token drawn ({req.state.value})")
        assert self.rows is not None and req.row is not None
        req.memory = self.rows.row_memory(req.row)
        self._release(req)
        req.state = _State.PARKED

    def resume(self, request: int) -> None:
        """Parked ``request`` waits for a row again, before every other waiting request."""
        req = self._get(request, "resume")
        if req.state is not _State.PARKED:
            raise ValueError(f"resume: request {request} is not parked ({req.state.value})")
        if self.has_memory:  # its last token, after its memory
            req.prompt = torch.tensor(req.tokens[-1:], dtype=torch.long, device=self.device)
        else:  # its whole text: the window is recomputed
            req.prompt = torch.cat(
                [req.first, torch.tensor(req.tokens, dtype=torch.long, device=self.device)]
            )
        req.state, req.given = _State.WAITING, (req.prompt, req.memory)
        self._waiting.appendleft(req)

    # -- one step ------------------------------------------------------------------------------------------

    def step(self) -> list[TokenEvent]:
        """One step of every request (see the module): the events of the tokens drawn, in row order (none
        while the requests admitted are still being prefilled). The step runs on txl's thread count for decoding
        (:func:`~txl.threads.threads_for`), the caller's count given back after it."""
        with torch.inference_mode(), threads_for("tokens"):
            for req in self._leaving:
                self._release(req)
                del self._requests[req.id]
            self._leaving = []
            self._feed()
            self._admit()
            self._prefill()
            return self._draw()

    def _get(self, request: int, what: str) -> _Request:
        req = self._requests.get(request)
        if req is None:
            raise ValueError(f"{what}: no request {request} (unknown, or ended and gone)")
        return req

    def _release(self, req: _Request) -> None:
        assert self.rows is not None and req.row is not None
        if req.row in self.rows.active:
            self.rows.free(req.row)
        self._slots[req.row] = None
        req.row, req.pending, req.fed = None, None, True

    def _feed(self) -> None:
        """The tokens drawn at the step before through the model, every row at once."""
        fed = [req for req in self._slots if req is not None and req.state is _State.RUNNING and not req.fed]
        if not fed:
            return
        assert self.rows is not None
        tokens = [0] * self.rows.size
        for req in fed:
            assert req.row is not None
            tokens[req.row] = req.tokens[-1]
        log_probs = self.rows.step(torch.tensor(tokens, dtype=torch.long, device=self.device))  # (R, V)
        for req in fed:
            req.pending, req.fed = log_probs[req.row], True

    def _admit(self) -> None:
        """Waiting requests take the free rows, in order; those admitted together start one prefill per
        memory length (one for those without), the choices of one prompt read once."""
        if not self._waiting:
            return
        if self.rows is None:
            rows = self.settings.rows or len(self._waiting)
            self.rows = rows_for(self.model, replace(self.settings, rows=rows))
            self._slots = [None] * rows
        free = [r for r, slot in enumerate(self._slots) if slot is None]
        admitted = []
        for r in free:
            if not self._waiting:
                break
            req = self._waiting.popleft()
            req.row, req.state = r, _State.PREFILLING
            self._slots[r] = req
            admitted.append(req)
        groups: dict[int, list[_Request]] = {}
        for req in admitted:
            groups.setdefault(-1 if req.memory is None else req.memory.length, []).append(req)
        for group in groups.values():
            self._start(group)

    def _start(self, group: list[_Request]) -> None:
        assert self.rows is not None
        prompts: list[Tensor] = []
        memories: list[Memory] = []
        sources: list[int] = []
        seen: dict[tuple[int, int], int] = {}
        for req in group:
            given = req.given
            assert isinstance(given, tuple)
            key = (id(given[0]), id(given[1]))  # choices of one prompt (the same objects) share one prefill
            if key not in seen:
                seen[key] = len(prompts)
                prompts.append(req.prompt)
                if req.memory is not None:
                    memories.append(req.memory)
            sources.append(seen[key])
        memory = Memory.cat_rows(memories) if memories else None
        steps = self.rows.prefill_steps(prompts, memory)
        self._prefills.append(_Prefill(steps, group, sources))

    def _prefill(self) -> None:
        """One chunk of every prefill; a prefill that ends joins its rows."""
        for prefill in list(self._prefills):
            try:
                next(prefill.steps)
                continue
            except StopIteration as done:
                prefilled: Prefilled = done.value
            self._prefills.remove(prefill)
            rows, sources = [], []
            for req, k in zip(prefill.requests, prefill.sources, strict=True):
                if req.row is None:  # ended while it was read, and gone
                    continue
                if req.state is not _State.PREFILLING:
                    self._slots[req.row], req.row = None, None
                    continue
                rows.append(req.row)
                sources.append(k)
                req.state, req.pending, req.memory = _State.RUNNING, prefilled.log_probs[k], None
            if rows:
                assert self.rows is not None
                self.rows.join(rows, prefilled, sources=sources)

    def _draw(self) -> list[TokenEvent]:
        """Every running request with a distribution draws its next token: the greedy ones by one argmax over
        them all, the others each from its own generator."""
        drawing = [req for req in self._slots if req is not None and req.pending is not None]
        if not drawing:
            return []
        greedy = [req for req in drawing if req.params.greedy]
        tokens: dict[int, int] = {}
        if greedy:
            joined = torch.stack([req.pending for req in greedy if req.pending is not None])  # (G, V)
            best = joined.argmax(dim=-1).tolist()
            tokens.update((req.id, token) for req, token in zip(greedy, best, strict=True))
        events = []
        for req in drawing:
            log_probs = req.pending
            assert log_probs is not None
            token = tokens.get(req.id)
            if token is None:
                token = int(draw(log_probs[None], req.params, generator=req.generator)[0])
            req.tokens.append(token)
            req.pending, req.fed = None, False
            finish: Finish | None = None
            if token in req.stop_ids:
                finish = "stop"
            elif len(req.tokens) >= req.params.max_new_tokens:
                finish = "length"
            if finish is not None:
                req.state = _State.FINISHED
                self._leaving.append(req)
            events.append(TokenEvent(req.id, token, log_probs, finish))
        return events
