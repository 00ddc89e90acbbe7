"""The HTTP routes of ``txl serve`` (FastAPI), reading ``app.state.txl``; the model's thread starts with the
application. Requests are checked by :mod:`txl.serve.checks`, answered in :mod:`txl.serve.openai`'s shapes."""

# The HTTP routes of ``txl serve`` (FastAPI), reading ``app.state.txl``; the model's thread starts with the
# application (its lifespan), not on the first request. Requests are checked by :mod:`txl.serve.checks` and
# answered in :mod:`txl.serve.openai`'s shapes.
#
#     app = create_app(load_run(run_dir), run_dir=run_dir, settings=ServeSettings(max_batch=16, queue_size=4))
#     # POST /v1/completions  {"prompt": "ROMEO:", "max_tokens": 50, "stream": true, "n": 2, "logprobs": 3}
#     # POST /v1/score        {"text": "...", "memory": false}
#     # POST /v1/sessions, /v1/sessions/{id}/score {"text": ...}, /v1/sessions/{id}/completions; GET, DELETE
#     # GET  /v1/model, /v1/models, /v1/models/{id}, /v1/health, /
#     # POST /v1/chat/completions: a 404 that points to /v1/completions (a base language model)

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..config import has_memory
from ..errors import TxlError
from ..runs import LoadedRun
from .auth import KeyCheck
from .card import model_card, page
from .checks import Limits, check_model, check_text, encode_text
from .completions import await_job, busy, complete
from .jobs import Cancelled
from .openai import (
    CompletionRequest,
    RequestError,
    ScoreRequest,
    error,
    json_body,
    parse,
    score_body,
)
from .scheduler import Scheduler
from .session_files import RunIdentity, SessionFiles, run_identity
from .session_store import SessionKeeper
from .sessions import SessionStore
from .sessions_api import router as sessions_router
from .state import ServeSettings, ServeState, state_of
from .work import score_work

__all__ = ["create_app", "OPEN_ROUTES", "router", "lifespan"]

OPEN_ROUTES = ("/", "/v1/health")
"""The routes that need no API key: the page (static, no data; it asks for the key) and the health check."""


router = APIRouter()


@router.get("/", response_class=HTMLResponse)
async def index() -> HTMLResponse:
    """The page."""
    policy = "default-src 'self'; style-src 'self' 'unsafe-inline'; script-src 'self' 'unsafe-inline'; img-src 'self' data:"
    return HTMLResponse(page(), headers={"Content-Security-Policy": policy})


@router.get("/v1/model")
async def model_route(request: Request) -> dict[str, Any]:
    """``GET /v1/model``: the model card."""
    return state_of(request).card


def _model_entry(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "txl"}


@router.get("/v1/models")
async def models(request: Request) -> dict[str, Any]:
    """``GET /v1/models``: the one model served, as OpenAI lists models."""
    return {"object": "list", "data": [_model_entry(state_of(request).name)]}


@router.get("/v1/models/{ident}")
async def one_model(ident: str, request: Request) -> dict[str, Any]:
    """``GET /v1/models/{id}``: the model served, or a 404 for another name."""
    name = state_of(request).name
    if ident != name:
        raise RequestError(404, f"no model {ident!r} (this server serves {name!r})", kind="not_found_error")
    return _model_entry(name)


@router.get("/v1/health")
async def health(request: Request) -> dict[str, Any]:
    """``GET /v1/health``: the queue, the rows, the sessions and the counters."""
    state = state_of(request)
    scheduler, sessions = state.model, state.store
    stats = scheduler.stats
    counts = sessions.health()
    return {
        "status": "ok",
        "admitted": scheduler.admitted,
        "capacity": scheduler.capacity,
        "rows_in_use": scheduler.rows_in_use,
        "max_batch": scheduler.max_batch,
        "waiting": scheduler.waiting,
        "parked": scheduler.parked,
        "parks": scheduler.batch.parks,
        "sessions": counts.pop("sessions"),
        "max_sessions": state.settings.max_sessions,
        "requests": stats.requests,
        "rejected": stats.rejected,
        "cancelled": stats.cancelled,
        "failed": stats.failed,
        "tokens_generated": scheduler.batch.generated,
        **counts,
    }


@router.post("/v1/completions")
async def completions(request: Request) -> Any:
    """``POST /v1/completions``."""
    state = state_of(request)
    req = parse(CompletionRequest, await json_body(request, limit=state.body_limit))
    return await complete(request, state, req, session=None)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Any:
    """``POST /v1/chat/completions``: a 404 that points to ``/v1/completions`` (the model is not a chat model)."""
    name = state_of(request).name
    raise RequestError(
        404,
        f"{name!r} is a base language model, not a chat model: it continues a text and knows no messages or "
        "roles. Use POST /v1/completions with a prompt (the text to continue).",
        param="model",
    )


@router.post("/v1/score")
async def score(request: Request) -> Any:
    """``POST /v1/score``: every token's log-probability, with or without memory."""
    state = state_of(request)
    req = parse(ScoreRequest, await json_body(request, limit=state.body_limit))
    check_model(req.model, served=state.name)
    check_text(req.text, field_name="text", limit=state.settings.max_prompt_chars)
    ids, notes = encode_text(state.run, req.text, field_name="text")
    if ids.numel() < 2:
        raise RequestError(
            400,
            f"text: needs at least 2 tokens to score (the first has no context), got {ids.numel()}",
            param="text",
        )
    job = state.model.admit()
    if job is None:
        raise busy(state.model)
    state.model.submit(job, score_work(state.run, ids, memory=req.memory))
    try:
        result = await await_job(request, job)
    except Cancelled:
        return error(499, "the client closed the request", kind="cancelled")
    body = score_body(result, kind=state.run.vocab.kind)
    return {
        "object": "score",
        "model": state.name,
        "memory": result.span.mem_len > 0,
        "same_length": result.span.same_length,
        **body,
        "warnings": notes,
    }


# -- the application ------------------------------------------------------------------------------------------


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    """Start the model's thread and the sessions' sweeper; stop both when the server stops."""
    state: ServeState = app.state.txl
    settings, run = state.settings, state.run
    state.scheduler = Scheduler(
        run.model,
        span=run.config.model.span,
        max_batch=settings.max_batch,
        queue_size=settings.queue_size,
        stream_buffer=settings.stream_buffer,
        compiled=settings.compiled,
    )
    store = SessionStore(limit=settings.max_sessions, ttl=settings.session_ttl)
    device = next(run.model.parameters()).device
    state.sessions = SessionKeeper(store, identity=state.identity, files=state.files, device=device)
    loop = asyncio.get_running_loop()
    state.scheduler.post = lambda items: _post(loop, items)
    period = min(1.0 if state.files is None else 10.0, settings.session_ttl / 4)

    async def sweep() -> None:
        while True:
            await asyncio.sleep(period)
            await state.store.sweep()

    sweeper = asyncio.create_task(sweep())
    try:
        yield
    finally:
        sweeper.cancel()
        await asyncio.to_thread(state.scheduler.close)


def _deliver(items: list) -> None:
    for on_event, event in items:
        on_event(event)


def _post(loop: asyncio.AbstractEventLoop, items: list) -> None:
    """Hand a step's events to the event loop's thread in one call."""
    try:
        loop.call_soon_threadsafe(_deliver, items)
    except RuntimeError:  # the loop has closed: nobody is listening
        pass


def create_app(
    run: LoadedRun, *, run_dir: Path, settings: ServeSettings | None = None, name: str | None = None
) -> FastAPI:
    """The application serving ``run`` (loaded from ``run_dir``); ``app.state.txl`` is its :class:`ServeState`.
    The model's thread starts with the application (``with TestClient(app)``, or uvicorn's lifespan)."""
    settings = ServeSettings() if settings is None else settings
    name = name or Path(run_dir).resolve().name
    card = model_card(run, name=name, run_dir=Path(run_dir), limits=_limits_shown(settings))
    limits = Limits(
        max_tokens=settings.max_tokens,
        max_prompt_chars=settings.max_prompt_chars,
        max_batch=settings.max_batch,
        default_max_tokens=card["defaults"]["max_tokens"],
    )
    app = FastAPI(title="txl serve", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    body_limit = 4 * settings.max_prompt_chars + 65_536  # JSON escapes, other fields
    identity = run_identity(run)
    files = _folder(settings, identity) if has_memory(run.config.model) else None
    app.state.txl = ServeState(run, name, settings, card, limits, body_limit, identity, files)
    if settings.api_key is not None:
        app.add_middleware(KeyCheck, key=settings.api_key.encode("utf-8"), open_routes=OPEN_ROUTES)
    app.add_exception_handler(RequestError, _refused)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _internal)
    app.include_router(router)
    app.include_router(sessions_router)
    return app


def _folder(settings: ServeSettings, identity: RunIdentity) -> SessionFiles | None:
    """The sessions' folder (made when missing), or None; refuses a bound that holds no session."""
    if settings.sessions_dir is None:
        return None
    largest = identity.file_limit
    if settings.sessions_max_bytes < largest:
        raise TxlError(
            f"sessions_max_bytes: {settings.sessions_max_bytes} bytes cannot hold one session of this model "
            f"(up to {largest} bytes)",
            fields=("sessions_max_bytes",),
        )
    return SessionFiles(
        settings.sessions_dir, identity, max_bytes=settings.sessions_max_bytes, ttl=settings.session_ttl
    )


def _limits_shown(settings: ServeSettings) -> dict[str, Any]:
    names = ("max_tokens", "max_prompt_chars", "queue_size", "max_batch", "max_sessions", "session_ttl")
    return {key: getattr(settings, key) for key in names}


async def _refused(request: Request, exc: RequestError) -> JSONResponse:
    return exc.response()


async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    return error(exc.status_code, str(exc.detail), kind=kind)


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    return error(500, f"internal error: {type(exc).__name__}: {exc}", kind="server_error")
