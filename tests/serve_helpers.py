"""Shared by the tests of ``txl serve``: a tiny run trained on a small text (a character vocabulary), Server-Sent
Events parsing, a live uvicorn server on a free 127.0.0.1 port in a thread of the test process, and the
application called in process (no socket) with a client whose every write the test holds or lets go."""

from __future__ import annotations

import asyncio
import json
import sysconfig
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

from txl.cli import main

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def train_char_run(folder: Path, *, steps: int = 12, overrides: tuple[str, ...] = ()) -> Path:
    """A run trained for ``steps`` steps on two copies of textwrap.py, character vocabulary (``overrides``:
    more ``--set`` values, e.g. ``model.mem_len=0``)."""
    corpus = folder / "corpus.txt"
    corpus.write_text((STDLIB / "textwrap.py").read_text(encoding="utf-8") * 2, encoding="utf-8")
    run_dir = folder / "run"
    code = main(
        [
            "train",
            "--config",
            "tiny",
            "--out",
            str(run_dir),
            "--quiet",
            "--set",
            'data.vocab="char"',
            "--set",
            f"data.corpus={json.dumps(str(corpus))}",
            "--set",
            f"train.steps={steps}",
            *[arg for value in overrides for arg in ("--set", value)],
        ]
    )
    assert code == 0
    return run_dir


def sse_data(body: str) -> list[str]:
    """The ``data:`` payloads of an event stream, in order (comments skipped)."""
    events = []
    for block in body.split("\n\n"):
        lines = [line[5:].lstrip() for line in block.splitlines() if line.startswith("data:")]
        if lines:
            events.append("\n".join(lines))
    return events


@contextmanager
def live_server(app) -> Iterator[str]:
    """Serve ``app`` with uvicorn on a free 127.0.0.1 port in a thread (as ``txl serve`` runs it); yields its
    base URL."""
    import uvicorn

    from txl.serve import bind
    from txl.serve.server import server_config

    sock = bind("127.0.0.1", 0)
    port = sock.getsockname()[1]
    server = uvicorn.Server(server_config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)
        sock.close()


def wait_for(predicate, *, timeout: float = 20.0, what: str = "a condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def library_text(run, prompt: str, n: int, *, seed: int = 0, **sampling) -> str:
    """The library's text for a prompt and sampling settings, seeded with ``seed``: what a request with the
    same fields must give."""
    from txl.inference import SamplingParams
    from txl.inference.text import generate_text

    return generate_text(
        run.model, run.vocab, prompt, SamplingParams(max_new_tokens=n, seed=seed, **sampling)
    )


@asynccontextmanager
async def in_process(app) -> AsyncIterator:
    """Run ``app``'s lifespan (its model thread) in this event loop; yields an ``httpx.AsyncClient`` that calls
    the application in process."""
    import httpx

    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://txl", timeout=60) as client:
            yield client


async def held_post(
    app,
    path: str,
    body: dict,
    *,
    on_write: Callable[[bytes], Awaitable[None]],
    leave: asyncio.Event | None = None,
) -> tuple[int, bytes]:
    """POST ``body`` to ``app`` in process (as uvicorn calls it) from a client that takes each write of the
    response's body only once ``on_write(chunk)`` has returned: the server counts a streamed event as sent when
    its write returns, so the test decides exactly when the client reads. The client disconnects when
    ``leave`` is set (else it stays until the response is over). Returns the status and the body."""
    payload = json.dumps(body).encode()
    over = leave if leave is not None else asyncio.Event()
    sent = False

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": payload, "more_body": False}
        await over.wait()
        return {"type": "http.disconnect"}

    status, chunks = 0, []

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body" and message.get("body"):
            await on_write(message["body"])
            chunks.append(message["body"])

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"txl"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 80),
    }
    try:
        await app(scope, receive, send)
    finally:
        over.set()
    return status, b"".join(chunks)


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout: float = 60.0, what: str) -> None:
    """Wait (in the event loop) until ``check()`` is true."""
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.005)
