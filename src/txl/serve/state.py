"""What one ``txl serve`` application holds: its settings (each a flag of the command), and the state its
routes read (``app.state.txl``): the run, the model card, the limits, the model's thread and the sessions."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from starlette.requests import Request

from ..config import ConfigError, has_memory, positive_int
from ..runs import LoadedRun
from .checks import Limits
from .scheduler import Scheduler
from .session_files import RunIdentity, SessionFiles
from .session_store import SessionKeeper

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
    """Sessions held in memory at once (``--max-sessions``): without ``sessions_dir`` every session, more
    refused with 429; with it, the ones in use and the most recently used (the others are on disk)."""
    session_ttl: float = 600.0
    """Seconds a session may stay idle before it is forgotten, in memory and on disk (``--session-ttl``)."""
    sessions_dir: Path | None = None
    """A folder that keeps every session, written after each request that changes it, so that sessions
    survive a restart and servers of one run may share them (``--sessions-dir``); None: in memory only."""
    sessions_max_bytes: int = 4 << 30
    """The most bytes of session files in ``sessions_dir``; the oldest idle sessions are deleted to stay under
    it (``--sessions-max-bytes``)."""
    compiled: bool = False
    """Decode with the step compiled ahead of time (``--compiled``, :attr:`txl.inference.DecodeSettings.compiled`):
    compiled (about a minute of CPU, once per set of sizes, then kept on disk) or loaded when the server
    starts, before its first request; CPU and float32 only, elsewhere the eager step."""
    api_key: str | None = None
    """The key every request must carry as ``Authorization: Bearer KEY`` (``--api-key``, ``TXL_API_KEY``),
    compared as UTF-8 bytes with the header's value as sent (a non-ASCII key is sent as UTF-8); None: no key
    (the routes of :data:`OPEN_ROUTES` never need one)."""

    def __post_init__(self) -> None:
        counts = ("max_tokens", "max_prompt_chars", "stream_buffer", "max_batch", "max_sessions")
        for name in (*counts, "sessions_max_bytes"):
            value = getattr(self, name)
            positive_int(value, name, field=False)
        if not isinstance(self.compiled, bool):
            raise ConfigError(f"compiled must be True or False, got {self.compiled!r}")
        if isinstance(self.queue_size, bool) or not isinstance(self.queue_size, int) or self.queue_size < 0:
            raise ConfigError(f"queue_size must be an integer >= 0, got {self.queue_size!r}")
        ttl = self.session_ttl
        if isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0 or math.isinf(ttl):
            raise ConfigError(f"session_ttl must be a positive number of seconds, got {ttl!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key.strip()):
            raise ConfigError("api_key must be a non-empty string (or None: no key)")
        if self.api_key is not None and self.api_key != self.api_key.strip():
            raise ConfigError("api_key must not start or end with spaces (a header's value cannot)")
        if self.sessions_dir is not None:
            if not isinstance(self.sessions_dir, (str, os.PathLike)) or not str(self.sessions_dir):
                raise ConfigError(
                    f"sessions_dir must be a folder's path (or None), got {self.sessions_dir!r}"
                )
            object.__setattr__(self, "sessions_dir", Path(self.sessions_dir))


@dataclass
class ServeState:
    """What the routes read (``app.state.txl``); ``scheduler`` and ``sessions`` exist while the app runs.
    ``identity``: the run as session files name it; ``files``: the sessions' folder (None: in memory only)."""

    run: LoadedRun
    name: str
    settings: ServeSettings
    card: dict[str, Any]
    limits: Limits
    body_limit: int
    identity: RunIdentity
    files: SessionFiles | None = None
    scheduler: Scheduler | None = None
    sessions: SessionKeeper | None = None

    @property
    def model(self) -> Scheduler:
        """The model's thread (while the application runs)."""
        assert self.scheduler is not None, "the application has not started (its lifespan runs the model)"
        return self.scheduler

    @property
    def store(self) -> SessionKeeper:
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
