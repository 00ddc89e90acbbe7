"""The session routes of ``txl serve``: create, show and delete a session, read a text into it (each token
scored after everything it has read), and complete from its memory."""

from __future__ import annotations

import uuid
from typing import Any

from fastapi import APIRouter, Request

from .checks import check_model, check_text, encode_text
from .completions import await_job, busy, complete
from .jobs import Cancelled
from .openai import (
    RequestError,
    SessionCompletionRequest,
    SessionNewRequest,
    SessionScoreRequest,
    error,
    json_body,
    parse,
    score_body,
)
from .sessions import Session
from .state import ServeState, state_of
from .work import session_read_work

__all__ = ["router"]

router = APIRouter()


# -- sessions -------------------------------------------------------------------------------------------------


def session_of(state: ServeState, ident: str, *, claim: bool = False) -> Session:
    """The session ``ident`` (400 without memory, 404 unknown; ``claim``: 409 when busy)."""
    if not state.cached:
        raise RequestError(
            400, "sessions need a model with memory (this one has none: the vanilla baseline or mem_len 0)"
        )
    session = state.store.get(ident)
    if session is None:
        raise RequestError(
            404, f"no session {ident!r} (never made, deleted, or expired)", kind="not_found_error"
        )
    if claim and not state.store.claim(session):
        raise RequestError(409, f"session {ident!r} is busy with another request; retry when it ends")
    return session


@router.post("/v1/sessions")
async def new_session(request: Request) -> dict[str, Any]:
    """``POST /v1/sessions``."""
    state = state_of(request)
    if (await request.body())[:1].strip():  # a body (none is needed) must be an empty object
        req = parse(SessionNewRequest, await json_body(request, limit=state.body_limit))
        check_model(req.model, served=state.name)
    if not state.cached:
        session_of(state, "")
    session = state.store.create(f"sess-{uuid.uuid4().hex[:24]}")
    if session is None:
        raise RequestError(
            429,
            f"there are {state.settings.max_sessions} sessions already (txl serve --max-sessions); delete one "
            "or wait for idle ones to expire",
            kind="rate_limit_error",
        )
    return session.describe(ttl=state.settings.session_ttl)


@router.get("/v1/sessions/{ident}")
async def get_session(ident: str, request: Request) -> dict[str, Any]:
    """``GET /v1/sessions/{id}``."""
    state = state_of(request)
    return session_of(state, ident).describe(ttl=state.settings.session_ttl)


@router.delete("/v1/sessions/{ident}")
async def delete_session(ident: str, request: Request) -> dict[str, Any]:
    """``DELETE /v1/sessions/{id}`` (409 while a request uses it)."""
    state = state_of(request)
    session_of(state, ident)
    if state.store.delete(ident) is None:
        raise RequestError(409, f"session {ident!r} is busy with another request; retry when it ends")
    return {"id": ident, "object": "session", "deleted": True}


@router.post("/v1/sessions/{ident}/score")
async def session_score(ident: str, request: Request) -> Any:
    """``POST /v1/sessions/{id}/score``: read a text into the session."""
    state = state_of(request)
    req = parse(SessionScoreRequest, await json_body(request, limit=state.body_limit))
    check_model(req.model, served=state.name)
    check_text(req.text, field_name="text", limit=state.settings.max_prompt_chars)
    ids, notes = encode_text(state.run, req.text, field_name="text")
    if ids.numel() == 0:
        raise RequestError(400, "text: empty", param="text")
    session = session_of(state, ident, claim=True)
    try:
        job = state.model.admit()
        if job is None:
            raise busy(state.model)
        state.model.submit(job, session_read_work(state.run, session, ids))
        try:
            result = await await_job(request, job)
        except Cancelled:
            return error(499, "the client closed the request", kind="cancelled")
    finally:
        state.store.release(session)
    body = score_body(result, kind=state.run.vocab.kind)
    return {"object": "session.score", "model": state.name, "session": ident, **body, "warnings": notes}


@router.post("/v1/sessions/{ident}/completions")
async def session_completions(ident: str, request: Request) -> Any:
    """``POST /v1/sessions/{id}/completions``: complete from the session's memory."""
    state = state_of(request)
    req = parse(SessionCompletionRequest, await json_body(request, limit=state.body_limit))
    session = session_of(state, ident, claim=True)
    release = True
    try:
        response = await complete(request, state, req, session=session)
        if hasattr(response, "on_close"):  # a stream: the session is free when it ends
            release, inner = False, response.on_close

            def close() -> None:
                inner()
                state.store.release(session)

            response.on_close = close
        return response
    finally:
        if release:
            state.store.release(session)
