"""``txl serve``'s flow to its clients: a streaming client that stops reading stops its generation exactly
``stream_buffer`` tokens on and frees its row (a neighbour runs while it is parked), then gets exactly its text
when it reads again, however often it was parked; one that leaves while parked is cancelled; through uvicorn's
sockets, a stalled client holds no more than the buffers do. The clients that decide when each write returns
call the application in process (their timing is the test's, not the machine's). OpenAI's ordinary client
calls (a list of prompts, ``stream_options``, the no-op values of penalties, ``best_of``, ``logit_bias``,
``suffix``, ``GET /v1/models/{id}``, an unknown model, the chat route) through the official client."""

from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="txl serve needs fastapi: pip install 'transformer-xl[serve]'")
pytest.importorskip("httpx", reason="the API tests need httpx")

import httpx  # noqa: E402

from serve_helpers import (  # noqa: E402
    eventually,
    held_post,
    in_process,
    library_text,
    live_server,
    sse_data,
    train_char_run,
    wait_for,
)
from txl.runs import load_run  # noqa: E402
from txl.serve.app import create_app  # noqa: E402
from txl.serve.server import SEND_BUFFER, WRITE_BUFFER  # noqa: E402
from txl.serve.state import ServeSettings  # noqa: E402

PROMPT = "def wrap(text, "
CLIENT_BUFFER = 4096


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train_char_run(tmp_path_factory.mktemp("flow"), steps=20)


def _stalled_client(url: str, body: bytes) -> tuple[socket.socket, bytes]:
    """A raw HTTP client with a small receive buffer that sends ``body`` and reads only the status line."""
    client = socket.socket()
    client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_BUFFER)
    client.connect(("127.0.0.1", int(url.rsplit(":", 1)[1])))
    head = b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
    client.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return client, client.recv(64)


async def _parks(client, count: int) -> bool:
    return (await client.get("/v1/health")).json()["parks"] >= count


def test_a_parked_client_that_leaves_is_cancelled(run_dir):
    """A client that takes no event, then leaves while its generation is parked: the job is cancelled and
    leaves nothing parked, without one more token."""
    buffer = 4
    settings = ServeSettings(max_tokens=3000, stream_buffer=buffer)
    app = create_app(load_run(run_dir), run_dir=run_dir, settings=settings)
    body = {"prompt": PROMPT, "max_tokens": 3000, "stream": True}

    async def scenario() -> dict:
        leave, never = asyncio.Event(), asyncio.Event()

        async def client(chunk: bytes) -> None:
            if b"data:" in chunk:
                await never.wait()

        async with in_process(app) as c:

            async def health() -> dict:
                return (await c.get("/v1/health")).json()

            stream = asyncio.create_task(
                held_post(app, "/v1/completions", body, on_write=client, leave=leave)
            )
            await eventually(lambda: _parks(c, 1), what="the generation to be parked")
            assert (await health())["parked"] == 1
            leave.set()
            await stream

            async def ended() -> bool:
                return (await health())["admitted"] == 0

            await eventually(ended, what="the parked job to end")
            return await health()

    health = asyncio.run(scenario())
    assert health["cancelled"] == 1 and health["parked"] == 0 and health["parks"] == 1
    assert health["tokens_generated"] == buffer and health["rows_in_use"] == 0


def test_through_uvicorn_a_client_that_stops_reading_holds_what_the_buffers_hold(run_dir):
    """Through uvicorn's sockets: a client that reads nothing stops its generation within what the server's
    small buffers, its own receive buffer and ``stream_buffer`` hold; when it leaves, the job is cancelled."""
    buffer = 4
    settings = ServeSettings(max_tokens=3000, stream_buffer=buffer)
    app = create_app(load_run(run_dir), run_dir=run_dir, settings=settings)
    body = json.dumps({"prompt": PROMPT, "max_tokens": 3000, "stream": True}).encode()
    # what the buffers in between hold (Linux doubles the sizes asked; an event is over 100 bytes)
    in_flight = (WRITE_BUFFER + 2 * SEND_BUFFER + 2 * CLIENT_BUFFER) // 100
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        client, _ = _stalled_client(url, body)
        wait_for(lambda: c.get("/v1/health").json()["parks"] >= 1, timeout=300, what="a park")
        assert c.get("/v1/health").json()["tokens_generated"] <= buffer + in_flight < 3000
        client.close()
        wait_for(lambda: c.get("/v1/health").json()["admitted"] == 0, timeout=300, what="the job to end")
        health = c.get("/v1/health").json()
        assert health["cancelled"] == 1 and health["parked"] == 0


def test_a_client_that_stops_reading_stops_its_generation(run_dir):
    """The client takes the headers, then no write: the generation parks once exactly ``stream_buffer`` events
    are unwritten, a neighbour runs meanwhile without it, and once the client reads again the generation goes
    on to exactly the library's text."""
    run = load_run(run_dir)
    buffer = 8
    app = create_app(run, run_dir=run_dir, settings=ServeSettings(max_tokens=1000, stream_buffer=buffer))
    body = {"prompt": PROMPT, "max_tokens": 1000, "temperature": 0, "stream": True}

    async def scenario() -> tuple[int, bytes]:
        reading = asyncio.Event()

        async def client(chunk: bytes) -> None:
            if b"data:" in chunk:  # the headers and the first comment go through, then no event
                await reading.wait()

        async with in_process(app) as c:

            async def health() -> dict:
                return (await c.get("/v1/health")).json()

            stream = asyncio.create_task(held_post(app, "/v1/completions", body, on_write=client))
            await eventually(lambda: _parks(c, 1), what="the generation to be parked")
            stalled = await health()
            assert stalled["tokens_generated"] == buffer  # not one token more than the client may be behind
            assert stalled["parked"] == 1 and stalled["rows_in_use"] == 0
            neighbour = await c.post(
                "/v1/completions", json={"prompt": "import ", "max_tokens": 200, "temperature": 0}
            )
            assert neighbour.json()["usage"]["completion_tokens"] == 200
            after = await health()
            assert after["tokens_generated"] == buffer + 200  # the parked row did not step with its neighbour
            assert after["parked"] == 1 and after["parks"] == 1 and after["rows_in_use"] == 0
            reading.set()  # the client reads again: the generation goes on to its end
            answer = await stream
            assert (await health())["tokens_generated"] == 1200
            return answer

    status, raw = asyncio.run(scenario())
    assert status == 200
    events = sse_data(raw.decode("utf-8"))
    assert events[-1] == "[DONE]"
    texts = [json.loads(e)["choices"][0]["text"] for e in events[:-2]]
    assert "".join(texts) == library_text(run, PROMPT, 1000, temperature=0)


def test_a_stream_parked_again_and_again_gives_the_text_of_one_never_parked(run_dir):
    """A client that takes each write only once the generation has parked: the generation parks every
    ``stream_buffer`` tokens or sooner, and resumes each time exactly where it stopped (its memory with it),
    so the text, far longer than the memory, is the library's."""
    run = load_run(run_dir)
    buffer, n = 4, 400
    assert n > 10 * run.config.model.mem_len
    app = create_app(run, run_dir=run_dir, settings=ServeSettings(max_tokens=n, stream_buffer=buffer))
    body = {"prompt": PROMPT, "max_tokens": n, "temperature": 1.0, "seed": 3, "stream": True}

    async def scenario() -> tuple[int, bytes, dict]:
        async with in_process(app) as c:

            async def parked_or_over() -> bool:
                health = (await c.get("/v1/health")).json()
                return health["parked"] == 1 or health["tokens_generated"] == n

            async def client(chunk: bytes) -> None:
                if b"data:" in chunk:
                    await eventually(parked_or_over, what="the generation to park")

            status, raw = await held_post(app, "/v1/completions", body, on_write=client)
            return status, raw, (await c.get("/v1/health")).json()

    status, raw, health = asyncio.run(scenario())
    assert status == 200
    assert health["parks"] >= n // buffer - 1 and health["tokens_generated"] == n
    events = sse_data(raw.decode("utf-8"))
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-2])
    assert text == library_text(run, PROMPT, n, seed=3, temperature=1.0)


def test_ordinary_openai_client_calls(run_dir):
    openai = pytest.importorskip("openai", reason="needs openai: pip install 'transformer-xl[serve-test]'")
    run = load_run(run_dir)
    with live_server(create_app(run, run_dir=run_dir)) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        assert client.models.retrieve("run").id == "run"
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("other")
        with pytest.raises(openai.NotFoundError) as unknown:
            client.completions.create(model="other", prompt=PROMPT, max_tokens=2)
        assert unknown.value.body["param"] == "model" and "'run'" in unknown.value.body["message"]
        with pytest.raises(openai.NotFoundError) as chat:
            client.chat.completions.create(model="run", messages=[{"role": "user", "content": "hello"}])
        assert "base language model" in chat.value.body["message"]
        assert "/v1/completions" in chat.value.body["message"]
        no_ops = {"presence_penalty": 0, "frequency_penalty": 0, "best_of": 2, "logit_bias": {}, "suffix": ""}
        prompts = [PROMPT, "import "]
        many = client.completions.create(
            model="run", prompt=prompts, max_tokens=12, temperature=1.0, seed=5, n=2, **no_ops
        )
        assert [c.index for c in many.choices] == [0, 1, 2, 3]
        expected = [library_text(run, p, 12, seed=5 + j, temperature=1.0) for p in prompts for j in range(2)]
        assert [c.text for c in many.choices] == expected
        assert many.usage.prompt_tokens == len(PROMPT) + len("import ")
        chunks = list(
            client.completions.create(
                model="run",
                prompt=PROMPT,
                max_tokens=10,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert "".join(c.choices[0].text for c in chunks if c.choices) == library_text(
            run, PROMPT, 10, temperature=0
        )
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
        for field, value in [
            ("presence_penalty", 0.5),
            ("frequency_penalty", -1.0),
            ("logit_bias", {"5": 10}),
            ("suffix", "end"),
            ("best_of", 3),
        ]:
            with pytest.raises(openai.BadRequestError) as refused:
                client.completions.create(model="run", prompt=PROMPT, max_tokens=2, n=2, **{field: value})
            assert refused.value.body["param"] == field and field in refused.value.body["message"]
