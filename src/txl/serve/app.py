"""The HTTP application of ``txl serve`` (FastAPI): OpenAI-shaped completions, streamed as Server-Sent Events;
per-token surprisal of a text with and without memory; the model card; the static page. Requests are checked
here (a 4xx JSON error names the field) and run one at a time on the model, on one worker thread, behind a
bounded queue. Decoding is :mod:`txl.generate`'s, prompts and streamed text :mod:`txl.text`'s (prompts are
read as ``txl generate`` reads them), scoring :mod:`txl.serve.score`'s.

    app = create_app(load_run(run_dir), run_dir=run_dir, settings=ServeSettings(queue_size=4))
    # POST /v1/completions  {"prompt": "ROMEO:", "max_tokens": 50, "stream": true}
    # POST /v1/score        {"text": "...", "memory": false}
    # GET  /v1/model, /v1/models, /v1/health, /
"""

from __future__ import annotations

import asyncio
import json
import math
import secrets
import threading
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
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
from ..generate import stream
from ..runs import LoadedRun, RunPaths
from ..text import TextStream, UnknownTokensWarning, describe_unknown, read_prompt
from .score import score_tokens, scoring_lengths, token_pieces

__all__ = ["ServeSettings", "create_app", "CompletionRequest", "ScoreRequest"]

MAX_STOP = 4
"""Stop strings per request (OpenAI's limit)."""


@dataclass(frozen=True)
class ServeSettings:
    """Limits of one server; each is a ``txl serve`` flag."""

    max_tokens: int = 1024
    """The largest ``max_tokens`` a completion may ask for (``--max-tokens-limit``)."""
    max_prompt_chars: int = 20_000
    """The longest prompt or scored text, in characters (``--max-prompt-chars``)."""
    queue_size: int = 8
    """Requests that may wait while one runs on the model; more are refused with 429 (``--queue-size``)."""
    stream_buffer: int = 32
    """Tokens generated ahead of a streaming client that has not read them yet; the model then waits."""

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_prompt_chars", "stream_buffer"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.queue_size, bool) or not isinstance(self.queue_size, int) or self.queue_size < 0:
            raise ValueError(f"queue_size must be an integer >= 0, got {self.queue_size!r}")


# ---------------------------------------------------------------------------------------------------------
# Requests and errors
# ---------------------------------------------------------------------------------------------------------


class CompletionRequest(BaseModel):
    """``POST /v1/completions``, OpenAI's completions fields. Left out: the run's ``[generate]`` settings."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str
    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)  # what torch.Generator.manual_seed takes
    stop: str | list[str] | None = None
    stream: bool = False
    n: int = Field(1, ge=1, le=1)
    user: str | None = None


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


# ---------------------------------------------------------------------------------------------------------
# The model's worker: one request at a time, a bounded queue
# ---------------------------------------------------------------------------------------------------------


class Cancelled(Exception):
    """A job stopped because its client left or the server is closing."""


@dataclass
class _Job:
    """One admitted request: its cancellation flag."""

    closing: threading.Event
    cancel_event: threading.Event = field(default_factory=threading.Event)

    def cancel(self) -> None:
        self.cancel_event.set()

    @property
    def cancelled(self) -> bool:
        return self.cancel_event.is_set() or self.closing.is_set()


@dataclass
class Stats:
    """Counters shown by ``GET /v1/health``."""

    requests: int = 0
    rejected: int = 0
    cancelled: int = 0
    failed: int = 0
    tokens_generated: int = 0


class ModelWorker:
    """Runs jobs on the model one at a time on a single thread. At most ``1 + queue_size`` admitted jobs
    exist at once (one running, the rest waiting); :meth:`admit` refuses more."""

    def __init__(self, *, queue_size: int) -> None:
        self.capacity = 1 + queue_size
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="txl-model")
        self.closing = threading.Event()
        self.stats = Stats()
        self._lock = threading.Lock()
        self._admitted = 0

    @property
    def admitted(self) -> int:
        return self._admitted

    def admit(self) -> _Job | None:
        """A new job, or None when the queue is full (the caller answers 429)."""
        with self._lock:
            if self._admitted >= self.capacity or self.closing.is_set():
                self.stats.rejected += 1
                return None
            self._admitted += 1
            self.stats.requests += 1
        return _Job(closing=self.closing)

    def run(self, job: _Job, work: Callable[[], Any]) -> Future:
        """Queue ``work`` for the model's thread; the job's place is given back when it ends."""

        def guarded() -> Any:
            try:
                if job.cancelled:
                    raise Cancelled
                return work()
            except Cancelled:
                with self._lock:
                    self.stats.cancelled += 1
                raise
            except Exception:
                with self._lock:
                    self.stats.failed += 1
                raise
            finally:
                with self._lock:
                    self._admitted -= 1

        try:
            return self.executor.submit(guarded)
        except RuntimeError:  # shut down meanwhile
            with self._lock:
                self._admitted -= 1
            raise RequestError(503, "the server is shutting down", kind="server_error") from None

    def count_token(self) -> None:
        with self._lock:
            self.stats.tokens_generated += 1

    def close(self) -> None:
        self.closing.set()
        self.executor.shutdown(wait=False, cancel_futures=True)


# ---------------------------------------------------------------------------------------------------------
# Jobs (run on the model's thread)
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Sampling:
    max_tokens: int
    temperature: float
    top_k: int | None
    top_p: float | None
    seed: int
    stop: tuple[str, ...]


def _complete(
    run: LoadedRun,
    ids: torch.Tensor,
    sampling: _Sampling,
    *,
    job: _Job,
    worker: ModelWorker,
    emit: Callable[[str], None],
) -> dict[str, Any]:
    """Generate after ``ids`` (P,); ``emit`` each token's printable text as it comes (see :class:`TextStream`)."""
    model = run.model
    device = next(model.parameters()).device
    start = time.perf_counter()
    generator = torch.Generator(device=device).manual_seed(sampling.seed)
    pieces = TextStream(run.vocab, ids.tolist(), stop=sampling.stop)
    tokens = stream(
        model,
        ids,
        max_new_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        generator=generator,
    )
    count, finish = 0, "length"
    try:
        for step, token in enumerate(tokens):
            count += 1
            worker.count_token()
            emit(pieces.push(int(token[0]), final=step == sampling.max_tokens - 1))
            if pieces.stopped:
                finish = "stop"
                break
            if job.cancelled:
                raise Cancelled
    finally:
        tokens.close()
    seconds = time.perf_counter() - start
    return {"text": pieces.text, "finish_reason": finish, "completion_tokens": count, "seconds": seconds}


def _score(run: LoadedRun, ids: torch.Tensor, *, memory: bool, job: _Job) -> dict[str, Any]:
    tgt_len, span = scoring_lengths(run.config, memory=memory)
    scores = score_tokens(run.model, ids, tgt_len=tgt_len, span=span, should_stop=lambda: job.cancelled)
    if job.cancelled:
        raise Cancelled
    id_list = ids.tolist()
    pieces = token_pieces(run.vocab.decode, id_list)
    losses = scores.losses.tolist()
    tokens = [
        {"id": i, "text": p, "logprob": None if n == 0 else -losses[n - 1]}
        for n, (i, p) in enumerate(zip(id_list, pieces, strict=True))
    ]
    mean = scores.mean_loss
    return {
        "memory": span.mem_len > 0,
        "tgt_len": tgt_len,
        "mem_len": span.mem_len,
        "same_length": span.same_length,
        "scored_tokens": len(losses),
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
        },
        "config": config_to_dict(run.config),
        "summary": summary,
    }


def _page() -> str:
    return resources.files("txl.serve").joinpath("static/index.html").read_text(encoding="utf-8")


async def _await_job(request: Request, future: Future, job: _Job) -> Any:
    """The job's result; stops it when the client disconnects while it waits or runs."""
    waiting = asyncio.wrap_future(future)
    while True:
        done, _ = await asyncio.wait({waiting}, timeout=0.25)
        if done:
            return waiting.result()
        if await request.is_disconnected():
            job.cancel()


def create_app(
    run: LoadedRun, *, run_dir: Path, settings: ServeSettings | None = None, name: str | None = None
) -> FastAPI:
    """The application serving ``run`` (loaded from ``run_dir``). ``app.state.worker`` is its
    :class:`ModelWorker`."""
    settings = ServeSettings() if settings is None else settings
    name = name or Path(run_dir).resolve().name
    worker = ModelWorker(queue_size=settings.queue_size)
    card = _model_card(run, name=name, run_dir=Path(run_dir), settings=settings)
    page = _page()
    body_limit = 4 * settings.max_prompt_chars + 65_536  # JSON escapes, other fields

    async def lifespan(app: FastAPI):
        yield
        worker.close()

    app = FastAPI(title="txl serve", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.worker = worker
    app.state.run = run

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
        stats = worker.stats
        return {
            "status": "ok",
            "admitted": worker.admitted,
            "capacity": worker.capacity,
            "requests": stats.requests,
            "rejected": stats.rejected,
            "cancelled": stats.cancelled,
            "failed": stats.failed,
            "tokens_generated": stats.tokens_generated,
        }

    def busy() -> RequestError:
        return RequestError(
            429,
            f"the model is busy: {worker.capacity - 1} request(s) are already waiting "
            "(txl serve --queue-size); retry later",
            kind="rate_limit_error",
        )

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = _parse(CompletionRequest, await _json_body(request, limit=body_limit))
        defaults = run.config.generate
        max_tokens = req.max_tokens if req.max_tokens is not None else card["defaults"]["max_tokens"]
        if max_tokens > settings.max_tokens:
            raise RequestError(
                400,
                f"max_tokens: {max_tokens} is above this server's limit of {settings.max_tokens} "
                "(txl serve --max-tokens-limit)",
                param="max_tokens",
            )
        stop = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop or ())
        if len(stop) > MAX_STOP or any(not s for s in stop):
            raise RequestError(
                400,
                f"stop: at most {MAX_STOP} non-empty strings, got {json.dumps(req.stop)[:60]}",
                param="stop",
            )
        _check_text(req.prompt, field_name="prompt", limit=settings.max_prompt_chars)
        ids, notes = _encode(run, req.prompt, field_name="prompt")
        if ids.numel() == 0:
            eos = getattr(run.vocab, "eos_id", None)
            if eos is None:
                raise RequestError(
                    400,
                    "prompt: empty (this vocabulary has no end-of-text token to start from)",
                    param="prompt",
                )
            ids = torch.tensor([eos], dtype=torch.long)
        seed = req.seed if req.seed is not None else secrets.randbits(63)
        sampling = _Sampling(
            max_tokens=max_tokens,
            temperature=req.temperature if req.temperature is not None else defaults.temperature,
            top_k=req.top_k if req.top_k is not None else defaults.top_k,
            top_p=req.top_p if req.top_p is not None else defaults.top_p,
            seed=seed,
            stop=stop,
        )
        job = worker.admit()
        if job is None:
            raise busy()
        ident, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        head = {"id": ident, "object": "text_completion", "created": created, "model": name}

        def tail(result: dict[str, Any]) -> dict[str, Any]:
            usage = {
                "prompt_tokens": int(ids.numel()),
                "completion_tokens": result["completion_tokens"],
                "total_tokens": int(ids.numel()) + result["completion_tokens"],
            }
            rate = result["completion_tokens"] / result["seconds"] if result["seconds"] > 0 else 0.0
            return {"usage": usage, "tokens_per_s": rate, "seed": seed, "warnings": notes}

        if not req.stream:
            future = worker.run(
                job, lambda: _complete(run, ids, sampling, job=job, worker=worker, emit=lambda _: None)
            )
            try:
                result = await _await_job(request, future, job)
            except Cancelled:
                return _error(499, "the client closed the request", kind="cancelled")
            choice = {
                "text": result["text"],
                "index": 0,
                "logprobs": None,
                "finish_reason": result["finish_reason"],
            }
            return {**head, "choices": [choice], **tail(result)}

        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        credits = threading.Semaphore(settings.stream_buffer)

        def put(item: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(events.put_nowait, item)
            except RuntimeError:  # the loop has closed: nobody is listening
                job.cancel()

        def emit(piece: str) -> None:  # on the model's thread: wait while the client is behind
            while not credits.acquire(timeout=0.1):
                if job.cancelled:
                    raise Cancelled
            put(("token", piece))

        future = worker.run(job, lambda: _complete(run, ids, sampling, job=job, worker=worker, emit=emit))
        future.add_done_callback(lambda f: put(("end", f)))

        async def sse() -> AsyncIterator[str]:
            yield ": txl\n\n"  # the headers go out now; a client that left while waiting is noticed
            while True:
                try:
                    kind, value = await asyncio.wait_for(events.get(), timeout=1.0)
                except TimeoutError:
                    yield ": waiting for the model\n\n"
                    continue
                if kind == "token":
                    credits.release()
                    yield _sse(
                        {
                            **head,
                            "choices": [{"text": value, "index": 0, "logprobs": None, "finish_reason": None}],
                        }
                    )
                    continue
                try:
                    result = value.result()
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
                yield _sse(
                    {
                        **head,
                        "choices": [
                            {
                                "text": "",
                                "index": 0,
                                "logprobs": None,
                                "finish_reason": result["finish_reason"],
                            }
                        ],
                        **tail(result),
                    }
                )
                yield _sse("[DONE]")
                return

        return _EventStream(sse(), on_close=job.cancel)

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
        job = worker.admit()
        if job is None:
            raise busy()
        future = worker.run(job, lambda: _score(run, ids, memory=req.memory, job=job))
        try:
            result = await _await_job(request, future, job)
        except Cancelled:
            return _error(499, "the client closed the request", kind="cancelled")
        return {"object": "score", "model": name, **result, "warnings": notes}

    return app
