"""Every wire shape of ``txl serve``: the request models (OpenAI's completions fields, scores, sessions), the
error object, Server-Sent Events, the logprobs object, usage, and the bodies of completions and scores.
No model here: the values come from :mod:`txl.serve.work`'s plain results.
"""

from __future__ import annotations

import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.requests import ClientDisconnect, Request

from ..evaluate import metrics_from_loss
from .events import ChoiceResult, CompletionResult, ScoreResult, TokenInfo

__all__ = [
    "MAX_LOGPROBS",
    "StreamOptions",
    "CompletionRequest",
    "SessionCompletionRequest",
    "SessionNewRequest",
    "SessionScoreRequest",
    "ScoreRequest",
    "RequestError",
    "error",
    "unauthorized",
    "parse",
    "body_bytes",
    "json_body",
    "json_of",
    "sse",
    "EventStream",
    "logprobs_object",
    "choice_object",
    "usage",
    "score_body",
]

MAX_LOGPROBS = 20
"""The most ``logprobs`` (best tokens per position) a request may ask for."""


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last event with no choices and the usage."""

    model_config = ConfigDict(extra="forbid", strict=True)

    include_usage: bool = False


class CompletionRequest(BaseModel):
    """``POST /v1/completions``, OpenAI's completions fields. Left out: the run's ``[generate]`` settings.
    ``presence_penalty``, ``frequency_penalty``, ``logit_bias``, ``suffix`` and ``best_of`` are accepted at
    their no-op values (0, 0, empty, empty, ``n``); other values are refused, naming the field."""

    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: str | list[int] | list[str] | list[list[int]]
    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    temperature: float | None = Field(None, ge=0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0, le=1, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=1)
    seed: int | None = Field(None, ge=-(2**63), lt=2**64)  # what torch.Generator.manual_seed takes
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(1, ge=1)
    best_of: int | None = Field(None, ge=1)
    echo: bool = False
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    presence_penalty: float | None = Field(None, allow_inf_nan=False)
    frequency_penalty: float | None = Field(None, allow_inf_nan=False)
    logit_bias: dict[str, float] | None = None
    suffix: str | None = None
    user: str | None = None


class SessionCompletionRequest(CompletionRequest):
    """``POST /v1/sessions/{id}/completions``: as a completion, continuing the session's memory; the prompt
    (default none) and the text returned join it. One prompt, one choice (one memory)."""

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
        """The error as a JSON response."""
        return error(self.status, self.message, param=self.param, kind=self.kind)


def error(
    status: int, message: str, *, param: str | None = None, kind: str = "invalid_request_error"
) -> JSONResponse:
    """OpenAI's error shape."""
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def unauthorized(message: str) -> JSONResponse:
    """A 401 in OpenAI's shape, with ``code: invalid_api_key``."""
    body = {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
    }
    return JSONResponse(body, status_code=401, headers={"WWW-Authenticate": "Bearer"})


def parse(model: type[BaseModel], body: Any) -> Any:
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


async def body_bytes(request: Request, *, limit: int) -> bytes:
    """The body, refusing (413) one longer than ``limit`` bytes before reading it all."""
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
    return bytes(body)


async def json_body(request: Request, *, limit: int) -> Any:
    """The JSON body, refusing (413) one longer than ``limit`` bytes before reading it all."""
    return json_of(await body_bytes(request, limit=limit))


def json_of(body: bytes) -> Any:
    """A request body read as JSON (400 when it is not)."""
    try:
        return json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(400, f"the request body is not valid JSON ({exc})") from None
    except RecursionError:
        raise RequestError(400, "the request body is nested too deeply") from None


def sse(data: Any) -> str:
    """One Server-Sent Event of ``data`` (a string as it is, anything else as compact JSON)."""
    return f"data: {data if isinstance(data, str) else json.dumps(data, separators=(',', ':'))}\n\n"


class EventStream(StreamingResponse):
    """Server-Sent Events whose ``on_close`` runs however the response ends: a client that disconnects stops
    the job at once, whichever way the server notices (a failed send, or a disconnect message)."""

    def __init__(self, content: AsyncIterator[str], *, on_close: Callable[[], None]) -> None:
        headers = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
        super().__init__(content, media_type="text/event-stream", headers=headers)
        self.on_close = on_close

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        except (ClientDisconnect, OSError):
            pass
        finally:
            self.on_close()
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


def logprobs_object(tokens: tuple[TokenInfo, ...] | None) -> dict[str, list] | None:
    """OpenAI's logprobs object of ``tokens`` (None: not asked)."""
    if tokens is None:
        return None
    return {
        "tokens": [t.piece for t in tokens],
        "token_logprobs": [t.logprob for t in tokens],
        "top_logprobs": [t.top for t in tokens],
        "text_offset": [t.offset for t in tokens],
    }


def choice_object(choice: ChoiceResult) -> dict[str, Any]:
    """One choice of a completion's answer."""
    return {
        "text": choice.text,
        "index": choice.index,
        "logprobs": logprobs_object(choice.tokens),
        "finish_reason": choice.finish,
    }


def usage(prompt_tokens: int, result: CompletionResult) -> dict[str, Any]:
    """OpenAI's usage object, and the rate (``tokens_per_s``) txl adds."""
    rate = result.completion_tokens / result.seconds if result.seconds > 0 else 0.0
    counts = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": result.completion_tokens,
        "total_tokens": prompt_tokens + result.completion_tokens,
    }
    return {"usage": counts, "tokens_per_s": rate}


def score_body(result: ScoreResult, *, kind: str | None) -> dict[str, Any]:
    """The fields of a score's answer: every token, the mean loss, and its perplexity and bits."""
    scored = len(result.losses)
    mean = math.fsum(result.losses) / scored if scored else float("nan")
    tokens = [{"id": i, "text": text, "logprob": lp} for i, text, lp in result.tokens]
    metrics = (
        metrics_from_loss(mean, kind=kind)
        if scored
        else {"ppl": float("nan"), "bits_per_token": float("nan")}
    )
    body = {
        "tgt_len": result.tgt_len,
        "mem_len": result.span.mem_len,
        "scored_tokens": scored,
        "mean_loss": mean,
        **metrics,
        "tokens": tokens,
    }
    if result.tokens_read is not None:
        body["tokens_read"] = result.tokens_read
    return body
