"""The session routes of ``txl serve``: create, show and delete a session, read a text into it (each token
scored after everything it has read), complete from its memory, fork it, and move it to another server as one
file (download, upload)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from .checks import check_model, check_text, encode_text
from .completions import await_job, busy, complete
from .jobs import Cancelled
from .openai import (
    RequestError,
    SessionCompletionRequest,
    SessionNewRequest,
    SessionScoreRequest,
    body_bytes,
    error,
    json_body,
    json_of,
    parse,
    score_body,
)
from .state import ServeState, state_of
from .work import session_read_work

__all__ = ["router"]

router = APIRouter()


# -- sessions -------------------------------------------------------------------------------------------------


def _need_memory(state: ServeState) -> None:
    """400 for a model without memory (sessions need it)."""
    if not state.cached:
        raise RequestError(
            400, "sessions need a model with memory (this one has none: the vanilla baseline or mem_len 0)"
        )


def _is_session_file(body: bytes, content_type: str | None) -> bool:
    """Whether a ``POST /v1/sessions`` body is a session's file (safetensors: an 8-byte length, which holds a
    zero byte, then its header) rather than JSON (which never holds one)."""
    kind = (content_type or "").split(";")[0].strip().lower()
    return kind == "application/octet-stream" or b"\x00" in body[:8]


@router.post("/v1/sessions")
async def new_session(request: Request) -> dict[str, Any]:
    """``POST /v1/sessions``: a new session; with a session's file as the body (from ``GET
    /v1/sessions/{id}/state``), that session."""
    state = state_of(request)
    _need_memory(state)
    keeper = state.store
    body = await body_bytes(request, limit=max(state.body_limit, keeper.upload_limit))
    if _is_session_file(body, request.headers.get("content-type")):
        session = await keeper.upload(body)
    else:
        if len(body) > state.body_limit:
            raise RequestError(
                413,
                f"the request body has {len(body)} bytes, more than this server takes ({state.body_limit})",
            )
        if body.strip():  # a body (none is needed) must be an empty object
            check_model(parse(SessionNewRequest, json_of(body)).model, served=state.name)
        session = await keeper.create()
    return keeper.describe(session)


@router.get("/v1/sessions/{ident}")
async def get_session(ident: str, request: Request) -> dict[str, Any]:
    """``GET /v1/sessions/{id}``."""
    state = state_of(request)
    _need_memory(state)
    return state.store.describe(await state.store.open(ident))


@router.delete("/v1/sessions/{ident}")
async def delete_session(ident: str, request: Request) -> dict[str, Any]:
    """``DELETE /v1/sessions/{id}`` (409 while a request uses it)."""
    state = state_of(request)
    _need_memory(state)
    await state.store.delete(ident)
    return {"id": ident, "object": "session", "deleted": True}


@router.post("/v1/sessions/{ident}/fork")
async def fork_session(ident: str, request: Request) -> dict[str, Any]:
    """``POST /v1/sessions/{id}/fork``: a new session with a copy of the session's memory."""
    state = state_of(request)
    _need_memory(state)
    return state.store.describe(await state.store.fork(ident))


@router.get("/v1/sessions/{ident}/state")
async def session_state(ident: str, request: Request) -> Response:
    """``GET /v1/sessions/{id}/state``: the session as one file (``POST /v1/sessions`` takes it back)."""
    state = state_of(request)
    _need_memory(state)
    data = await state.store.download(ident)
    disposition = f'attachment; filename="{ident}.safetensors"'
    return Response(data, media_type="application/octet-stream", headers={"Content-Disposition": disposition})


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
    _need_memory(state)
    keeper = state.store
    session = await keeper.open(ident, claim=True)
    try:
        job = state.model.admit()
        if job is None:
            raise busy(state.model)
        state.model.submit(job, session_read_work(state.run, session, ids))
        try:
            result = await await_job(request, job)
        except Cancelled:
            return error(499, "the client closed the request", kind="cancelled")
        await keeper.save(session)
    finally:
        await keeper.finish(session)
    body = score_body(result, kind=state.run.vocab.kind)
    return {"object": "session.score", "model": state.name, "session": ident, **body, "warnings": notes}


@router.post("/v1/sessions/{ident}/completions")
async def session_completions(ident: str, request: Request) -> Any:
    """``POST /v1/sessions/{id}/completions``: complete from the session's memory."""
    state = state_of(request)
    req = parse(SessionCompletionRequest, await json_body(request, limit=state.body_limit))
    _need_memory(state)
    keeper = state.store
    session = await keeper.open(ident, claim=True)
    release = True
    try:
        response = await complete(request, state, req, session=session, settle=lambda: keeper.save(session))
        if hasattr(response, "on_close"):  # a stream: the session is free when it ends
            release, inner = False, response.on_close

            def close() -> None:
                inner()
                keeper.finish_later(session)

            response.on_close = close
        return response
    finally:
        if release:
            await keeper.finish(session)
