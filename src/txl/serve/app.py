"""The HTTP application of ``txl serve`` (FastAPI): OpenAI-shaped completions, streamed as Server-Sent Events;
per-token surprisal of a text with and without memory; sessions whose memory persists across requests; the
model card; the static page. Requests are checked here (a 4xx JSON error names the field), then run on the
model's one thread, :class:`~txl.serve.engine.Engine` (continuous batching over the rows of one key/value
cache), behind a bounded queue. Prompts and streamed text are :mod:`txl.inference.text`'s (prompts are read as ``txl
generate`` reads them), scoring :mod:`txl.serve.score`'s.

    app = create_app(load_run(run_dir), run_dir=run_dir, settings=ServeSettings(max_batch=16, queue_size=4))
    # POST /v1/completions  {"prompt": "ROMEO:", "max_tokens": 50, "stream": true, "n": 2, "logprobs": 3}
    # POST /v1/score        {"text": "...", "memory": false}
    # POST /v1/sessions, /v1/sessions/{id}/score {"text": ...}, /v1/sessions/{id}/completions; GET, DELETE
    # GET  /v1/model, /v1/models, /v1/health, /
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import secrets
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import torch
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..config import config_to_dict
from ..inference.text import UnknownTokensWarning, describe_unknown, read_prompt
from ..runs import LoadedRun, RunPaths
from .engine import Cancelled, Engine, Job, Sampling, Session, SessionStore
from .score import score_segments, scores_of, scoring_lengths, token_pieces

__all__ = [
    "ServeSettings",
    "create_app",
    "CompletionRequest",
    "ScoreRequest",
    "SessionScoreRequest",
    "OPEN_ROUTES",
]

MAX_STOP = 4
"""Stop strings per request (OpenAI's limit)."""

MAX_LOGPROBS = 20
"""The most ``logprobs`` (best tokens per position) a request may ask for."""

OPEN_ROUTES = ("/", "/v1/health")
"""The routes that need no API key: the page (static, no data; it asks for the key) and the health check."""


@dataclass(frozen=True)
class ServeSettings:
    """Limits of one server; each is a ``txl serve`` flag."""

    max_tokens: int = 1024
    """The largest ``max_tokens`` a completion may ask for (``--max-tokens-limit``)."""
    max_prompt_chars: int = 20_000
    """The longest prompt or scored text, in characters (``--max-prompt-chars``)."""
    queue_size: int = 8
    """Requests that may wait while ``max_batch`` run on the model; more are refused with 429 (``--queue-size``)."""
    max_batch: int = 16
    """Rows decoded together: completions (choices) that run at once (``--max-batch``)."""
    stream_buffer: int = 32
    """Tokens generated ahead of a streaming client that has not read them yet; when every running row's
    client is that far behind, the model waits."""
    max_sessions: int = 1000
    """Sessions that may exist at once; more are refused with 429 (``--max-sessions``)."""
    session_ttl: float = 600.0
    """Seconds a session may stay idle before it is forgotten (``--session-ttl``)."""
    api_key: str | None = None
    """The key every request must carry as ``Authorization: Bearer KEY`` (``--api-key``, ``TXL_API_KEY``);
    None: no key (the routes of :data:`OPEN_ROUTES` never need one)."""

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_prompt_chars", "stream_buffer", "max_batch", "max_sessions"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.queue_size, bool) or not isinstance(self.queue_size, int) or self.queue_size < 0:
            raise ValueError(f"queue_size must be an integer >= 0, got {self.queue_size!r}")
        ttl = self.session_ttl
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0 or math.isinf(ttl):
            raise ValueError(f"session_ttl must be a positive number of seconds, got {ttl!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ValueError("api_key must be a non-empty string (or None: no key)")


# ---------------------------------------------------------------------------------------------------------
# Requests and errors
# ---------------------------------------------------------------------------------------------------------


class CompletionRequest(BaseModel):
    """``POST /v1/completions``, OpenAI's completions fields. Left out: the run's ``[generate]`` settings."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str | list[int]
    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)  # what torch.Generator.manual_seed takes
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(1, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    user: str | None = None


class SessionCompletionRequest(CompletionRequest):
    """``POST /v1/sessions/{id}/completions``: as a completion, continuing the session's memory; the prompt
    (default none) and the generated text join it. One choice (one memory)."""

    prompt: str | list[int] = ""
    n: int = Field(1, ge=1, le=1)


class SessionNewRequest(BaseModel):
    """``POST /v1/sessions``: no fields but the model's name (a body is optional)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    model: str | None = None


class SessionScoreRequest(BaseModel):
    """``POST /v1/sessions/{id}/score``: a text read as the continuation of what the session has read."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str
    model: str | None = None


class ScoreRequest(BaseModel):
    """``POST /v1/score``: a text and whether segments carry the memory of the previous ones."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str
    memory: bool = True
    model: str | None = None


class RequestError(Exception):
    """A request refused: its HTTP status, a message, and the field it is about."""

    def __init__(
        self, status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error"
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind

    def response(self) -> JSONResponse:
        return _error(self.status, self.message, param=self.param, kind=self.kind)


def _error(
    status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error"
) -> JSONResponse:
    """OpenAI's error shape."""
    return JSONResponse(
        {"error": {"message": message, "type": kind, "param": param, "code": None}}, status_code=status
    )


def _parse(model: type[BaseModel], body: Any) -> Any:
    """The request body validated as ``model``; the first problem as a 400 naming its field."""
    if not isinstance(body, dict):
        raise RequestError(400, f"the request body must be a JSON object, got {type(body).__name__}")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else None
        if first["type"] == "extra_forbidden":
            known = ", ".join(model.model_fields)
            raise RequestError(400, f"unknown field {name!r} (the fields are: {known})", param=name) from None
        if first["type"] == "missing":
            raise RequestError(400, f"{name}: required", param=name) from None
        shown = json.dumps(first.get("input"))[:60]
        raise RequestError(400, f"{name}: {first['msg']}, got {shown}", param=name) from None


async def _json_body(request: Request, *, limit: int) -> Any:
    """The JSON body, refusing (413) one longer than ``limit`` bytes before reading it all."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(
            413, f"the request body has {declared} bytes, more than this server takes ({limit})"
        )
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, f"the request body is longer than this server takes ({limit} bytes)")
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the request body is not valid JSON ({exc})") from None
    except RecursionError:
        raise RequestError(400, "the request body is nested too deeply") from None


def _check_text(text: str, *, field_name: str, limit: int) -> None:
    if len(text) > limit:
        raise RequestError(
            400,
            f"{field_name} has {len(text)} characters, more than this server takes ({limit}; "
            "txl serve --max-prompt-chars)",
            param=field_name,
        )


def _encode(run: LoadedRun, text: str, *, field_name: str) -> tuple[torch.Tensor, list[str]]:
    """(P,) ids of ``text``, and warnings: a word vocabulary reads unknown words as <unk> (as ``txl
    generate``), other vocabularies refuse characters they have never seen (400 naming the field)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UnknownTokensWarning)
            ids, missing = read_prompt(run.vocab, text)  # (P,), as txl generate reads its prompt
    except ValueError as exc:
        raise RequestError(400, f"{field_name}: {exc}", param=field_name) from None
    notes = []
    if missing:
        notes.append(
            f"{len(missing)} word(s) of {field_name} not in the vocabulary, read as <unk>: {describe_unknown(missing)}"
        )
    return ids, notes


def _prompt_ids(run: LoadedRun, prompt: str | list[int], *, limit: int) -> tuple[torch.Tensor, list[str]]:
    """(P,) ids of a prompt given as text or as token ids (each in the vocabulary: else a 400 naming it)."""
    if isinstance(prompt, str):
        _check_text(prompt, field_name="prompt", limit=limit)
        return _encode(run, prompt, field_name="prompt")
    size = len(run.vocab)
    if len(prompt) > limit:
        raise RequestError(
            400, f"prompt has {len(prompt)} token ids, more than this server takes ({limit})", param="prompt"
        )
    bad = [i for i in prompt if not 0 <= i < size]
    if bad:
        raise RequestError(400, f"prompt: token ids must be in [0, {size}), got {bad[:5]}", param="prompt")
    return torch.tensor(prompt, dtype=torch.long), []


def _score(run: LoadedRun, ids: torch.Tensor, *, memory: bool) -> Any:
    """The work of ``POST /v1/score``: one segment per slice (:func:`score_segments`), then the answer."""
    tgt_len, span = scoring_lengths(run.config, memory=memory)
    losses: list[torch.Tensor] = []
    yield from score_segments(run.model, ids, tgt_len=tgt_len, span=span, losses=losses)
    scores = scores_of(losses, tgt_len=tgt_len, span=span)
    id_list = ids.tolist()
    pieces = token_pieces(run.vocab.decode, id_list)
    values = scores.losses.tolist()
    tokens = [
        {"id": i, "text": p, "logprob": None if n == 0 else -values[n - 1]}
        for n, (i, p) in enumerate(zip(id_list, pieces, strict=True))
    ]
    mean = scores.mean_loss
    return {
        "memory": span.mem_len > 0,
        "tgt_len": tgt_len,
        "mem_len": span.mem_len,
        "same_length": span.same_length,
        "scored_tokens": len(values),
        "mean_loss": mean,
        "ppl": math.exp(mean) if mean < 700 else float("inf"),
        "bits_per_token": mean / math.log(2),
        "tokens": tokens,
    }


# ---------------------------------------------------------------------------------------------------------
# Responses
# ---------------------------------------------------------------------------------------------------------


def _sse(data: Any) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


class _EventStream(StreamingResponse):
    """Server-Sent Events whose ``on_close`` runs however the response ends: a client that disconnects
    stops the job at once, whichever way the server notices (a failed send, or a disconnect message)."""

    def __init__(self, content: AsyncIterator[str], *, on_close: Callable[[], None]) -> None:
        super().__init__(
            content,
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        )
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (ClientDisconnect, OSError):
            pass
        finally:
            self._on_close()
            await self.body_iterator.aclose()


def default_prompt(run: LoadedRun) -> str:
    """The page's default prompt: the run's ``generate.prompt``, else the first non-blank line of its corpus's
    training text (at most 60 characters, cut at a space), else a newline: text the model has seen."""
    if run.config.generate.prompt is not None:
        return run.config.generate.prompt
    from ..data import load_corpus

    data = run.config.data
    try:
        corpus = (
            None if data.corpus.startswith("hf:") else load_corpus(data.corpus, text_field=data.text_field)
        )
        lines = corpus.text("train").splitlines() if corpus is not None and corpus.has("train") else []
    except Exception:  # the corpus is not here (a converted run, another machine): no default from it
        lines = []
    line = next((line.strip() for line in lines if line.strip()), "")
    if len(line) > 60:
        line = line[: line.rfind(" ", 0, 60) + 1 or 60]
    try:
        _encode(run, line, field_name="prompt")
    except RequestError:
        line = ""
    return line or "\n"


def _model_card(run: LoadedRun, *, name: str, run_dir: Path, settings: ServeSettings) -> dict[str, Any]:
    summary_path = RunPaths(run_dir).summary
    try:
        summary = json.loads(summary_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        summary = None
    generate = run.config.generate
    tgt_len, span = scoring_lengths(run.config, memory=True)
    return {
        "id": name,
        "object": "model",
        "owned_by": "txl",
        "run_dir": str(run_dir),
        "checkpoint": run.checkpoint.name,
        "step": run.step,
        "parameters": sum(p.numel() for p in run.model.parameters()),
        "device": str(next(run.model.parameters()).device),
        "vocab": {"kind": run.vocab.kind, "size": len(run.vocab)},
        "attention": run.config.model.attention,
        "defaults": {
            "prompt": default_prompt(run),
            "max_tokens": min(generate.max_new_tokens, settings.max_tokens) or 1,
            "temperature": generate.temperature,
            "top_k": generate.top_k,
            "top_p": generate.top_p,
        },
        "score": {"tgt_len": tgt_len, "mem_len": span.mem_len},
        "limits": {
            "max_tokens": settings.max_tokens,
            "max_prompt_chars": settings.max_prompt_chars,
            "queue_size": settings.queue_size,
            "max_batch": settings.max_batch,
            "max_sessions": settings.max_sessions,
            "session_ttl": settings.session_ttl,
        },
        "config": config_to_dict(run.config),
        "summary": summary,
    }


def _page() -> str:
    return resources.files("txl.serve").joinpath("static/index.html").read_text(encoding="utf-8")


async def _await_job(request: Request, future: Future, job: Job) -> Any:
    """The job's result; stops it when the client disconnects while it waits or runs."""
    waiting = asyncio.wrap_future(future)
    while True:
        done, _ = await asyncio.wait({waiting}, timeout=0.25)
        if done:
            return waiting.result()
        if await request.is_disconnected():
            job.cancel()


def _deliver(items: list) -> None:
    for on_event, event in items:
        on_event(event)


def _post(loop: asyncio.AbstractEventLoop, items: list) -> None:
    """Hand a step's events to the event loop's thread in one call."""
    try:
        loop.call_soon_threadsafe(_deliver, items)
    except RuntimeError:  # the loop has closed: nobody is listening
        pass


def _unauthorized(message: str) -> JSONResponse:
    response = _error(401, message)
    body = json.loads(response.body)
    body["error"]["code"] = "invalid_api_key"
    return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})


def _authorized(header: str | None, key: bytes) -> bool:
    """Whether an ``Authorization`` header carries ``Bearer KEY`` (compared in constant time)."""
    if header is None:
        return False
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("utf-8"), key)


class _KeyCheck:
    """ASGI middleware: a request to any route but :data:`OPEN_ROUTES` without ``Authorization: Bearer KEY``
    gets a 401 in OpenAI's error shape (plain ASGI, so that disconnects still reach the routes)."""

    def __init__(self, app: Any, *, key: bytes) -> None:
        self.app, self.key = app, key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] not in OPEN_ROUTES:
            header = None
            for name, value in scope.get("headers", ()):
                if name == b"authorization":
                    header = value.decode("latin-1")
            if not _authorized(header, self.key):
                said = "no Authorization header" if header is None else "a wrong API key"
                response = _unauthorized(
                    f"this server needs an API key: send 'Authorization: Bearer KEY' (the request had {said})"
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(
    run: LoadedRun, *, run_dir: Path, settings: ServeSettings | None = None, name: str | None = None
) -> FastAPI:
    """The application serving ``run`` (loaded from ``run_dir``). ``app.state.engine`` is its
    :class:`~txl.serve.engine.Engine`, ``app.state.sessions`` its :class:`~txl.serve.engine.SessionStore`."""
    settings = ServeSettings() if settings is None else settings
    name = name or Path(run_dir).resolve().name
    engine = Engine(
        run,
        max_batch=settings.max_batch,
        queue_size=settings.queue_size,
        stream_buffer=settings.stream_buffer,
    )
    sessions = SessionStore(limit=settings.max_sessions, ttl=settings.session_ttl, stats=engine.stats)
    card = _model_card(run, name=name, run_dir=Path(run_dir), settings=settings)
    page = _page()
    body_limit = 4 * settings.max_prompt_chars + 65_536  # JSON escapes, other fields
    key = None if settings.api_key is None else settings.api_key.encode("utf-8")

    async def lifespan(app: FastAPI):
        async def sweep() -> None:
            while True:
                await asyncio.sleep(min(1.0, settings.session_ttl / 4))
                sessions.expire()

        sweeper = asyncio.create_task(sweep())
        yield
        sweeper.cancel()
        await asyncio.to_thread(engine.close)

    app = FastAPI(title="txl serve", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.engine = engine
    app.state.sessions = sessions
    app.state.run = run

    if key is not None:
        app.add_middleware(_KeyCheck, key=key)

    @app.exception_handler(RequestError)
    async def _refused(request: Request, exc: RequestError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(
            exc.status_code,
            str(exc.detail),
            kind="not_found_error" if exc.status_code == 404 else "invalid_request_error",
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        return _error(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")

    @app.get("/", response_class=HTMLResponse)
    async def index() -> HTMLResponse:
        return HTMLResponse(
            page,
            headers={
                "Content-Security-Policy": "default-src 'self'; style-src 'self' "
                "'unsafe-inline'; script-src 'self' 'unsafe-inline'; img-src 'self' data:"
            },
        )

    @app.get("/v1/model")
    async def model_card() -> dict[str, Any]:
        return card

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "created": 0, "owned_by": "txl"}]}

    @app.get("/v1/health")
    async def health() -> dict[str, Any]:
        stats = engine.stats
        sessions.expire()
        return {
            "status": "ok",
            "admitted": engine.admitted,
            "capacity": engine.capacity,
            "rows_in_use": engine.rows_in_use,
            "max_batch": engine.max_batch,
            "waiting": engine.waiting,
            "sessions": len(sessions),
            "max_sessions": settings.max_sessions,
            "requests": stats.requests,
            "rejected": stats.rejected,
            "cancelled": stats.cancelled,
            "failed": stats.failed,
            "tokens_generated": stats.tokens_generated,
            "sessions_created": stats.sessions_created,
            "sessions_expired": stats.sessions_expired,
        }

    def busy() -> RequestError:
        return RequestError(
            429,
            f"the model is busy: {engine.capacity} request(s) are running or waiting already "
            "(txl serve --max-batch, --queue-size); retry later",
            kind="rate_limit_error",
        )

    def sampling_of(req: CompletionRequest, *, prompt_tokens: int) -> Sampling:
        defaults = run.config.generate
        max_tokens = req.max_tokens if req.max_tokens is not None else card["defaults"]["max_tokens"]
        if max_tokens > settings.max_tokens:
            raise RequestError(
                400,
                f"max_tokens: {max_tokens} is above this server's limit of {settings.max_tokens} "
                "(txl serve --max-tokens-limit)",
                param="max_tokens",
            )
        if max_tokens == 0 and not req.echo:
            raise RequestError(
                400,
                "max_tokens: 0 generates nothing; it needs echo (to score the prompt)",
                param="max_tokens",
            )
        if req.n > settings.max_batch:
            raise RequestError(
                400,
                f"n: {req.n} choices are more than the rows this server decodes at once ({settings.max_batch}; "
                "txl serve --max-batch)",
                param="n",
            )
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        if len(stop) > MAX_STOP or any(not s for s in stop):
            raise RequestError(
                400,
                f"stop: at most {MAX_STOP} non-empty strings, got {json.dumps(req.stop)[:60]}",
                param="stop",
            )
        return Sampling(
            max_tokens=max_tokens,
            temperature=req.temperature if req.temperature is not None else defaults.temperature,
            top_k=req.top_k if req.top_k is not None else defaults.top_k,
            top_p=req.top_p if req.top_p is not None else defaults.top_p,
            seed=req.seed if req.seed is not None else secrets.randbits(63),
            stop=stop,
            logprobs=req.logprobs,
            echo=req.echo,
        )

    def start_ids(ids: torch.Tensor, *, session: Session | None) -> torch.Tensor:
        """An empty prompt starts from the end-of-text token (a session: from what it has read)."""
        if ids.numel() or (session is not None and session.pending is not None):
            return ids
        eos = getattr(run.vocab, "eos_id", None)
        if eos is None:
            raise RequestError(
                400, "prompt: empty (this vocabulary has no end-of-text token to start from)", param="prompt"
            )
        return torch.tensor([eos], dtype=torch.long)

    async def complete(request: Request, req: CompletionRequest, *, session: Session | None):
        ids, notes = _prompt_ids(run, req.prompt, limit=settings.max_prompt_chars)
        ids = start_ids(ids, session=session)
        sampling = sampling_of(req, prompt_tokens=int(ids.numel()))
        rows = req.n if sampling.max_tokens > 0 else 0
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()

        def put(item: tuple) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:  # the loop has closed: nobody is listening
                pass

        if engine.post is None:  # the events of a step reach this loop in one call
            engine.post = lambda items: _post(loop, items)
        job = engine.admit(rows=rows, weight=req.n, on_event=events.put_nowait if req.stream else None)
        if job is None:
            raise busy()
        future = engine.submit(job, engine.completion_work(job, ids, sampling, n=req.n, session=session))
        ident, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        head = {"id": ident, "object": "text_completion", "created": created, "model": name}

        def tail(result: dict[str, Any]) -> dict[str, Any]:
            prompt_tokens = int(ids.numel())
            usage = {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": result["completion_tokens"],
                "total_tokens": prompt_tokens + result["completion_tokens"],
            }
            rate = result["completion_tokens"] / result["seconds"] if result["seconds"] > 0 else 0.0
            extra = {"session": session.describe(ttl=settings.session_ttl)} if session is not None else {}
            return {"usage": usage, "tokens_per_s": rate, "seed": sampling.seed, "warnings": notes, **extra}

        if not req.stream:
            try:
                result = await _await_job(request, future, job)
            except Cancelled:
                return _error(499, "the client closed the request", kind="cancelled")
            return {**head, "choices": result["choices"], **tail(result)}

        future.add_done_callback(lambda f: put(("end", f)))

        async def sse() -> AsyncIterator[str]:
            yield ": txl\n\n"  # the headers go out now; a client that left while waiting is noticed
            while True:
                if events.empty():
                    try:
                        item = await asyncio.wait_for(events.get(), timeout=1.0)
                    except TimeoutError:
                        yield ": waiting for the model\n\n"
                        continue
                else:
                    item = events.get_nowait()
                chunks = []  # the events waiting go out in one write
                while item is not None and item[0] != "end":
                    _, index, text, logprobs = item
                    job.read()
                    if job.backlog == settings.stream_buffer:
                        engine.wake()
                    choice = {"text": text, "index": index, "logprobs": logprobs, "finish_reason": None}
                    chunks.append(_sse({**head, "choices": [choice]}))
                    item = None if events.empty() else events.get_nowait()
                if chunks:
                    yield "".join(chunks)
                if item is None:
                    continue
                try:
                    result = item[1].result()
                except Cancelled:
                    return
                except Exception as exc:  # noqa: BLE001 - reported to the client, the server goes on
                    yield _sse(
                        {
                            "error": {
                                "message": f"generation failed: {type(exc).__name__}: {exc}",
                                "type": "server_error",
                                "param": None,
                                "code": None,
                            }
                        }
                    )
                    yield _sse("[DONE]")
                    return
                ends = [
                    {
                        "text": "",
                        "index": c["index"],
                        "logprobs": None,
                        "finish_reason": c["finish_reason"],
                    }
                    for c in result["choices"]
                ]
                yield _sse({**head, "choices": ends, **tail(result)})
                yield _sse("[DONE]")
                return

        return _EventStream(sse(), on_close=job.cancel)

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = _parse(CompletionRequest, await _json_body(request, limit=body_limit))
        return await complete(request, req, session=None)

    @app.post("/v1/score")
    async def score(request: Request):
        req = _parse(ScoreRequest, await _json_body(request, limit=body_limit))
        _check_text(req.text, field_name="text", limit=settings.max_prompt_chars)
        ids, notes = _encode(run, req.text, field_name="text")
        if ids.numel() < 2:
            raise RequestError(
                400,
                f"text: needs at least 2 tokens to score (the first has no context), got {ids.numel()}",
                param="text",
            )
        job = engine.admit()
        if job is None:
            raise busy()
        future = engine.submit(job, _score(run, ids, memory=req.memory))
        try:
            result = await _await_job(request, future, job)
        except Cancelled:
            return _error(499, "the client closed the request", kind="cancelled")
        return {"object": "score", "model": name, **result, "warnings": notes}

    # -- sessions -------------------------------------------------------------------------------------------

    def session_of(ident: str, *, claim: bool = False) -> Session:
        if not engine.cached:
            raise RequestError(
                400,
                "sessions need a model with memory (this one has none: the vanilla baseline or mem_len 0)",
            )
        session = sessions.get(ident)
        if session is None:
            raise RequestError(
                404, f"no session {ident!r} (never made, deleted, or expired)", kind="not_found_error"
            )
        if claim:
            if session.busy:
                raise RequestError(409, f"session {ident!r} is busy with another request; retry when it ends")
            session.busy = True
        return session

    @app.post("/v1/sessions")
    async def new_session(request: Request):
        if (await request.body())[:1].strip():  # a body (none is needed) must be an empty object
            _parse(SessionNewRequest, await _json_body(request, limit=body_limit))
        if not engine.cached:
            session_of("")
        session = sessions.create(f"sess-{uuid.uuid4().hex[:24]}")
        if session is None:
            raise RequestError(
                429,
                f"there are {settings.max_sessions} sessions already (txl serve --max-sessions); delete one "
                "or wait for idle ones to expire",
                kind="rate_limit_error",
            )
        return session.describe(ttl=settings.session_ttl)

    @app.get("/v1/sessions/{ident}")
    async def get_session(ident: str):
        return session_of(ident).describe(ttl=settings.session_ttl)

    @app.delete("/v1/sessions/{ident}")
    async def delete_session(ident: str):
        session = session_of(ident)
        if session.busy:
            raise RequestError(409, f"session {ident!r} is busy with another request; retry when it ends")
        sessions.delete(ident)
        return {"id": ident, "object": "session", "deleted": True}

    @app.post("/v1/sessions/{ident}/score")
    async def session_score(ident: str, request: Request):
        req = _parse(SessionScoreRequest, await _json_body(request, limit=body_limit))
        _check_text(req.text, field_name="text", limit=settings.max_prompt_chars)
        ids, notes = _encode(run, req.text, field_name="text")
        if ids.numel() == 0:
            raise RequestError(400, "text: empty", param="text")
        session = session_of(ident, claim=True)
        try:
            job = engine.admit()
            if job is None:
                raise busy()
            future = engine.submit(job, engine.score_work(session, ids))
            try:
                result = await _await_job(request, future, job)
            except Cancelled:
                return _error(499, "the client closed the request", kind="cancelled")
        finally:
            session.busy = False
            session.last_used = time.monotonic()
        return {"object": "session.score", "model": name, "session": ident, **result, "warnings": notes}

    @app.post("/v1/sessions/{ident}/completions")
    async def session_completions(ident: str, request: Request):
        req = _parse(SessionCompletionRequest, await _json_body(request, limit=body_limit))
        session = session_of(ident, claim=True)
        release = True
        try:
            response = await complete(request, req, session=session)
            if isinstance(response, _EventStream):  # the session is free when the stream ends
                release = False
                inner = response._on_close

                def close() -> None:
                    inner()
                    session.busy = False
                    session.last_used = time.monotonic()

                response._on_close = close
            return response
        finally:
            if release:
                session.busy = False
                session.last_used = time.monotonic()

    return app
