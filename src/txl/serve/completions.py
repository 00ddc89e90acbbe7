"""The completion routes of ``txl serve``: a request's prompts and settings become a job on the model's thread,
answered whole or streamed as Server-Sent Events. A streamed event counts as sent to its client once the server
has written it to the connection (the scheduler parks a generation whose client is too far behind)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import torch
from starlette.requests import Request

from ..data.vocab import start_token
from .checks import check_model, params_of, prompt_ids, prompts_of
from .events import CompletionResult, TextEvent
from .jobs import Cancelled, Job
from .openai import (
    CompletionRequest,
    EventStream,
    RequestError,
    choice_object,
    error,
    logprobs_object,
    sse,
    usage,
)
from .scheduler import Scheduler
from .sessions import Session
from .state import ServeState
from .work import Completion, completion_work

__all__ = ["complete", "await_job", "busy"]


def _prompts(
    state: ServeState, req: CompletionRequest, session: Session | None
) -> tuple[list[torch.Tensor], list[str]]:
    """(P,) ids of each prompt, and the warnings about them. An empty prompt starts from the end-of-text token
    (a session's: from what it has read)."""
    ids, notes = [], []
    for prompt in prompts_of(req.prompt):
        tokens, warned = prompt_ids(state.run, prompt, limit=state.settings.max_prompt_chars)
        if not tokens.numel() and (session is None or session.pending is None):
            if getattr(state.run.vocab, "eos_id", None) is None:
                message = "prompt: empty (this vocabulary has no end-of-text token to start from)"
                raise RequestError(400, message, param="prompt")
            tokens = torch.tensor([start_token(state.run.vocab)], dtype=torch.long)
        ids.append(tokens)
        notes.extend(warned)
    return ids, notes


async def complete(
    request: Request,
    state: ServeState,
    req: CompletionRequest,
    *,
    session: Session | None,
    settle: Callable[[], Awaitable[None]] | None = None,
) -> Any:
    """Answer a completion request (a session's continues its memory): the whole answer, or a stream.
    ``settle`` is awaited when the work is done, before the answer (or the stream's last event) goes out: a
    session is saved there; a :class:`RequestError` it raises is the answer instead."""
    check_model(req.model, served=state.name)
    prompts, notes = _prompts(state, req, session)
    params = params_of(req, defaults=state.run.config.generate, limits=state.limits, prompts=len(prompts))
    scheduler = state.model
    events: asyncio.Queue = asyncio.Queue()
    weight = len(prompts) * req.n
    rows = weight if params.max_new_tokens > 0 else 0
    job = scheduler.admit(rows=rows, weight=weight, on_event=events.put_nowait if req.stream else None)
    if job is None:
        raise busy(scheduler)
    completion = Completion(state.run, prompts, params, req, session=session, emit=job.emit)
    scheduler.submit(job, completion_work(completion, mem_len=state.run.config.model.mem_len))
    head = {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time())}
    head["model"] = state.name
    prompt_tokens = sum(int(p.numel()) for p in prompts)

    def tail(result: CompletionResult) -> dict[str, Any]:
        extra = {"session": session.describe(ttl=state.settings.session_ttl)} if session is not None else {}
        seed = req.seed if req.seed is not None else params.seed
        return {**usage(prompt_tokens, result), "seed": seed, "warnings": notes, **extra}

    if not req.stream:
        try:
            result = await await_job(request, job)
        except Cancelled:
            return error(499, "the client closed the request", kind="cancelled")
        if settle is not None:
            await settle()
        return {**head, "choices": [choice_object(c) for c in result.choices], **tail(result)}
    loop = asyncio.get_running_loop()
    job.future.add_done_callback(lambda f: _put(loop, events, ("end", f)))
    include_usage = req.stream_options is not None and req.stream_options.include_usage
    body = _stream(job, events, head, tail, include_usage, settle)
    return EventStream(body, on_close=job.cancel)


def busy(scheduler: Scheduler) -> RequestError:
    """The 429 of a full server."""
    return RequestError(
        429,
        f"the model is busy: {scheduler.capacity} request(s) are running or waiting already "
        "(its max_batch and queue_size); retry later",
        kind="rate_limit_error",
    )


async def await_job(request: Request, job: Job) -> Any:
    """The job's result; stops it when the client disconnects while it waits or runs."""
    waiting = asyncio.wrap_future(job.future)
    while True:
        done, _ = await asyncio.wait({waiting}, timeout=0.25)
        if done:
            return waiting.result()
        if await request.is_disconnected():
            job.cancel()


def _put(loop: asyncio.AbstractEventLoop, events: asyncio.Queue, item: Any) -> None:
    try:
        loop.call_soon_threadsafe(events.put_nowait, item)
    except RuntimeError:  # the loop has closed: nobody is listening
        pass


def _chunks(head: dict[str, Any]) -> Callable[[TextEvent], str]:
    """The event of a token, as ``sse({**head, "choices": [choice]})`` writes it, with the head's JSON written
    once per stream (an event per token of every choice)."""
    start = sse({**head, "choices": []})[: -len("]}\n\n")]

    def chunk(event: TextEvent) -> str:
        logprobs = logprobs_object(event.tokens)
        text, shown = (
            json.dumps(event.text),
            "null" if logprobs is None else json.dumps(logprobs, separators=(",", ":")),
        )
        return (
            f'{start}{{"text":{text},"index":{event.index},"logprobs":{shown},"finish_reason":null}}]}}\n\n'
        )

    return chunk


async def _stream(
    job: Job,
    events: asyncio.Queue,
    head: dict[str, Any],
    tail: Callable[[CompletionResult], dict[str, Any]],
    include_usage: bool,
    settle: Callable[[], Awaitable[None]] | None,
) -> AsyncIterator[str]:
    """The events of a streamed completion: the events waiting go out in one write; each counts as sent when
    the write has returned (the generator is resumed after it)."""
    chunk = _chunks(head)
    yield ": txl\n\n"  # the headers go out now; a client that left while waiting is noticed
    while True:
        try:
            item = await asyncio.wait_for(events.get(), timeout=1.0)
        except TimeoutError:
            yield ": waiting for the model\n\n"
            continue
        chunks: list[str] = []
        while isinstance(item, TextEvent):
            chunks.append(chunk(item))
            item = None if events.empty() else events.get_nowait()
        if chunks:
            yield "".join(chunks)
            for _ in chunks:
                job.read()
        if item is None:
            continue
        try:
            result: CompletionResult = item[1].result()
            if settle is not None:
                await settle()
        except Cancelled:
            return
        except RequestError as exc:
            yield sse({"error": {"message": exc.message, "type": exc.kind, "param": None, "code": None}})
            yield sse("[DONE]")
            return
        except Exception as exc:  # noqa: BLE001 - reported to the client, the server goes on
            message = f"generation failed: {type(exc).__name__}: {exc}"
            yield sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})
            yield sse("[DONE]")
            return
        ends = [
            {"text": "", "index": c.index, "logprobs": None, "finish_reason": c.finish}
            for c in result.choices
        ]
        yield sse({**head, "choices": ends, **tail(result)})
        if include_usage:
            yield sse({**head, "choices": [], "usage": tail(result)["usage"]})
        yield sse("[DONE]")
        return
