"""The API key of ``txl serve``: every route but the open ones needs ``Authorization: Bearer KEY``. The key is
compared as bytes, in constant time: the key's UTF-8 encoding against the header's value as sent (so a client
sends a non-ASCII key as UTF-8)."""

from __future__ import annotations

import hmac
from typing import Any

from .openai import unauthorized

__all__ = ["KeyCheck"]


def _authorized(header: bytes | None, key: bytes) -> bool:
    """Whether an ``Authorization`` header's raw value carries ``Bearer KEY`` (compared in constant time)."""
    if header is None:
        return False
    scheme, _, given = header.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), key)


class KeyCheck:
    """ASGI middleware: a request to any route but ``open_routes`` without ``Authorization: Bearer KEY`` (``key``:
    the key's UTF-8 bytes) gets a 401 in OpenAI's error shape (plain ASGI, so that disconnects still reach the
    routes)."""

    def __init__(self, app: Any, *, key: bytes, open_routes: tuple[str, ...]) -> None:
        self.app, self.key, self.open_routes = app, key, open_routes

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"] not in self.open_routes:
            header = None
            for name, value in scope.get("headers", ()):
                if name.lower() == b"authorization":
                    header = bytes(value)
            if not _authorized(header, self.key):
                said = "no Authorization header" if header is None else "a wrong API key"
                message = (
                    f"this server needs an API key: send 'Authorization: Bearer KEY' (the request had {said})"
                )
                await unauthorized(message)(scope, receive, send)
                return
        await self.app(scope, receive, send)
