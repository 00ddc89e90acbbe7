"""Sessions of ``txl serve``: a memory that persists across requests, and the store that bounds and expires them.

Dimensions: M memory positions (the evaluation memory length), D model size.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..model import Memory

__all__ = ["CONTEXT_IDS", "Session", "SessionStore", "SessionCounts"]

CONTEXT_IDS = 8
"""How many ids before a new text its pieces are decoded after (a session's ``recent``, a completion's
context): enough for every vocabulary's spacing, and each token then costs the same however long the text
before it was."""


@dataclass
class SessionCounts:
    """How many sessions were made, expired, and deleted to make room on disk (shown by ``GET /v1/health``)."""

    created: int = 0
    expired: int = 0
    evicted: int = 0


@dataclass
class Session:
    """A session is the text it has read: its memory is always what reading that text with the evaluation
    lengths gives (as ``/v1/score`` reads), whether the text came from a reading or from a completion (a
    completion adds its prompt and the text its client received: a stop string is left out).

    What it holds: its memory (batch 1, (1, M, D) per layer, or None before anything was fed),
    the last token read and not yet fed (the context of the next text's first token), and a few ids before it
    (to decode the next pieces as one text). ``busy``: a request is using it (another is refused).
    ``revision``: the revision of its files that it holds (``txl serve --sessions-dir``; "" before any)."""

    id: str
    created: float
    last_used: float
    memory: Memory | None = None
    pending: int | None = None
    recent: list[int] = field(default_factory=list)
    tokens_read: int = 0
    busy: bool = False
    revision: str = ""

    def describe(self, *, ttl: float) -> dict[str, Any]:
        """The session as ``GET /v1/sessions/{id}`` shows it."""
        return {
            "id": self.id,
            "object": "session",
            "created": int(self.created),
            "tokens_read": self.tokens_read,
            "memory_length": 0 if self.memory is None else self.memory.length,
            "expires_in": max(0.0, round(self.last_used + ttl - time.monotonic(), 1)),
        }

    def read(self, ids: Sequence[int], *, memory: Memory | None) -> None:
        """``ids`` were read; ``memory`` now holds every token read but the last (which is pending)."""
        new = [int(i) for i in ids]
        if new:
            self.pending = new[-1]
            self.recent = (self.recent + new)[-CONTEXT_IDS:]
            self.tokens_read += len(new)
        self.memory = memory


class SessionStore:
    """At most ``limit`` sessions; one idle for ``ttl`` seconds expires. Thread-safe."""

    def __init__(self, *, limit: int, ttl: float) -> None:
        self.limit, self.ttl = limit, ttl
        self.counts = SessionCounts()
        self._sessions: dict[str, Session] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._sessions)

    def create(self, ident: str) -> Session | None:
        """A new session, or None when there are ``limit`` already."""
        self.expire()
        now = time.monotonic()
        with self._lock:
            if len(self._sessions) >= self.limit:
                return None
            session = Session(id=ident, created=time.time(), last_used=now)
            self._sessions[ident] = session
            self.counts.created += 1
            return session

    def get(self, ident: str) -> Session | None:
        """The session ``ident`` (its idle time starts again), or None."""
        self.expire()
        with self._lock:
            session = self._sessions.get(ident)
            if session is not None:
                session.last_used = time.monotonic()
            return session

    def claim(self, session: Session) -> bool:
        """Mark ``session`` busy; False when another request has it."""
        with self._lock:
            if session.busy:
                return False
            session.busy = True
            return True

    def release(self, session: Session) -> None:
        """The request using ``session`` is over."""
        with self._lock:
            session.busy = False
            session.last_used = time.monotonic()

    def delete(self, ident: str) -> bool | None:
        """Forget ``ident``: True, False when there is none, None when it is busy."""
        with self._lock:
            session = self._sessions.get(ident)
            if session is None:
                return False
            if session.busy:
                return None
            del self._sessions[ident]
            return True

    def expire(self) -> int:
        """Forget the sessions idle for longer than the ttl (not one in use); how many went."""
        deadline = time.monotonic() - self.ttl
        with self._lock:
            old = [k for k, s in self._sessions.items() if s.last_used < deadline and not s.busy]
            for key in old:
                del self._sessions[key]
            self.counts.expired += len(old)
        return len(old)

    def add(self, session: Session) -> bool:
        """Hold ``session`` (read from elsewhere: a file, an upload, a fork); False when there are ``limit``."""
        with self._lock:
            if len(self._sessions) >= self.limit:
                return False
            self._sessions[session.id] = session
            return True

    def forget(self, ident: str) -> None:
        """Let ``ident`` go from memory without counting it (it lives on disk, or nowhere any more)."""
        with self._lock:
            self._sessions.pop(ident, None)

    def make_room(self) -> bool:
        """Let the least recently used idle sessions go (kept on disk) until one more fits; False when the
        ``limit`` sessions held are all in use."""
        with self._lock:
            idle = sorted((s for s in self._sessions.values() if not s.busy), key=lambda s: s.last_used)
            while len(self._sessions) >= self.limit and idle:
                del self._sessions[idle.pop(0).id]
            return len(self._sessions) < self.limit
