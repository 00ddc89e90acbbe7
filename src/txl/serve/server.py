"""How ``txl serve`` runs its application under uvicorn: HTTP/1.1 connections whose buffers are kept small, so
that a streaming client that stops reading holds little text in flight (the scheduler's back-pressure counts
an event as sent when the server's write of it has returned; a write waits while these buffers are full)."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["SEND_BUFFER", "WRITE_BUFFER", "SmallBuffers", "server_config"]

SEND_BUFFER = 16 * 1024
"""Bytes asked for each connection's kernel send buffer (Linux doubles it for its bookkeeping)."""

WRITE_BUFFER = 16 * 1024
"""Bytes the server's own write buffer holds before a write waits for the connection to drain."""


class SmallBuffers(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with a small write buffer and kernel send buffer per connection."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """A new connection: its write buffer and kernel send buffer made small."""
        super().connection_made(transport)
        transport.set_write_buffer_limits(high=WRITE_BUFFER)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER)
            except OSError:  # a platform that refuses: the default buffer
                pass


def server_config(app: Any, *, log_level: str = "info") -> uvicorn.Config:
    """uvicorn's settings for ``app``: the small-buffer protocol, the lifespan on, a short graceful shutdown."""
    return uvicorn.Config(
        app, http=SmallBuffers, log_level=log_level, lifespan="on", timeout_graceful_shutdown=3
    )
