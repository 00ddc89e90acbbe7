"""What one ``txl serve`` application holds: its settings (each a flag of the command), and the state its
routes read (``app.state.txl``): the run, the model card, the limits, the model's thread and the sessions."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from ..config import has_memory, positive_int
from ..runs import LoadedRun
from .checks import Limits
from .scheduler import Scheduler
from .sessions import SessionStore

__all__ = ["ServeSettings", "ServeState", "state_of"]


@dataclass(frozen=True)
class ServeSettings:
    """Where one server listens and its limits; each is a ``txl serve`` flag."""

    host: str = "127.0.0.1"
    """The address to listen on (``--host``)."""
    port: int = 8000
    """The port to listen on; 0: any free port (``--port``)."""
    log_level: str = "info"
    """uvicorn's log level (``--log-level``)."""

    max_tokens: int = 1024
    """The largest ``max_tokens`` a completion may ask for (``--max-tokens-limit``)."""
    max_prompt_chars: int = 20_000
    """The longest prompt or scored text, in characters (``--max-prompt-chars``)."""
    queue_size: int = 8
    """Requests that may wait while ``max_batch`` run on the model; more are refused with 429 (``--queue-size``)."""
    max_batch: int = 16
    """Rows decoded together: completions (choices) that run at once (``--max-batch``)."""
    stream_buffer: int = 32
    """Events a streaming client may be behind what the server has written to its connection; then its
    generation is parked (its row freed for others) until the client has caught up half of them."""
    max_sessions: int = 1000
    """Sessions that may exist at once; more are refused with 429 (``--max-sessions``)."""
    session_ttl: float = 600.0
    """Seconds a session may stay idle before it is forgotten (``--session-ttl``)."""
    api_key: str | None = None
    """The key every request must carry as ``Authorization: Bearer KEY`` (``--api-key``, ``TXL_API_KEY``),
    compared as UTF-8 bytes with the header's value as sent (a non-ASCII key is sent as UTF-8); None: no key
    (the routes of :data:`OPEN_ROUTES` never need one)."""

    def __post_init__(self) -> None:
        for name in ("max_tokens", "max_prompt_chars", "stream_buffer", "max_batch", "max_sessions"):
            value = getattr(self, name)
            positive_int(value, name, error=ValueError, field=False)
        if isinstance(self.queue_size, bool) or not isinstance(self.queue_size, int) or self.queue_size < 0:
            raise ValueError(f"queue_size must be an integer >= 0, got {self.queue_size!r}")
        ttl = self.session_ttl
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0 or math.isinf(ttl):
            raise ValueError(f"session_ttl must be a positive number of seconds, got {ttl!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ValueError("api_key must be a non-empty string (or None: no key)")
        if self.api_key is not None and self.api_key != self.api_key.strip():
            raise ValueError("api_key must not start or end with spaces (a header's value cannot)")


@dataclass
class ServeState:
    """What the routes read (``app.state.txl``); ``scheduler`` and ``sessions`` exist while the app runs."""

    run: LoadedRun
    name: str
    settings: ServeSettings
    card: dict[str, Any]
    limits: Limits
    body_limit: int
    scheduler: Scheduler | None = None
    sessions: SessionStore | None = None

    @property
    def model(self) -> Scheduler:
        """The model's thread (while the application runs)."""
        assert self.scheduler is not None, "the application has not started (its lifespan runs the model)"
        return self.scheduler

    @property
    def store(self) -> SessionStore:
        """The sessions (while the application runs)."""
        assert self.sessions is not None, "the application has not started"
        return self.sessions

    @property
    def cached(self) -> bool:
        """Whether the model has memory (sessions need it)."""
        return has_memory(self.run.config.model)


def state_of(request: Request) -> ServeState:
    """The state of the application serving ``request``."""
    return request.app.state.txl
