"""Shared by the tests of ``txl serve``: a tiny run trained on a small text (a character vocabulary), Server-Sent
Events parsing, and a live uvicorn server on a free 127.0.0.1 port in a thread of the test process."""

from __future__ import annotations

import json
import sysconfig
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
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
