"""Sessions of ``txl serve`` against independent readings: a session completion's echoed prompt is scored after
the session's memory (as a second session that reads the same texts scores it); a completion continues the
last memory positions of a long reading; after a completion the session holds exactly the text its client
received (a stop string left out), read with the evaluation lengths, as one pass over that text."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="txl serve needs fastapi: pip install 'transformer-xl[serve]'")
pytest.importorskip("httpx", reason="the API tests need httpx")

from fastapi.testclient import TestClient  # noqa: E402

from serve_helpers import eventually, held_post, in_process, sse_data, train_char_run  # noqa: E402
from txl.evaluation import EvalSettings, segment_losses  # noqa: E402
from txl.inference import SamplingParams, generate  # noqa: E402
from txl.model import Memory  # noqa: E402
from txl.runs import load_run  # noqa: E402
from txl.serve.app import create_app  # noqa: E402
from txl.serve.score import score_tokens, scoring_lengths  # noqa: E402
from txl.serve.state import ServeSettings  # noqa: E402

SOURCE = (Path(__file__).parent / "serve_helpers.py").read_text(encoding="utf-8")
READ = SOURCE[:129]  # two evaluation segments (64 targets each), more than the evaluation memory (48)
PROMPT = SOURCE[129:149]  # read after it, as the third segment of one pass


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    # readings remember 48 positions, generation 16: a completion continues the last 16 of a reading's memory
    return train_char_run(tmp_path_factory.mktemp("sessions"), steps=30, overrides=("eval.mem_len=48",))


@pytest.fixture(scope="module")
def run(run_dir):
    return load_run(run_dir)


@pytest.fixture(scope="module")
def client(run_dir):
    with TestClient(create_app(load_run(run_dir), run_dir=run_dir)) as c:
        yield c


def _session(client, *texts: str) -> str:
    sid = client.post("/v1/sessions").json()["id"]
    for text in texts:
        assert client.post(f"/v1/sessions/{sid}/score", json={"text": text}).status_code == 200
    return sid


def _one_pass(run, text: str) -> list[float]:
    """-loss of every token of ``text`` but the first, read in one pass with the evaluation lengths."""
    lengths = scoring_lengths(run.config, memory=True)
    ids = torch.as_tensor(run.vocab.encode(text), dtype=torch.long)
    return (-score_tokens(run.model, ids, lengths).losses).tolist()


def test_a_session_echo_scores_the_prompt_after_what_it_read(client, run):
    sid = _session(client, READ)
    body = {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
    echoed = client.post(f"/v1/sessions/{sid}/completions", json=body).json()
    logprobs = echoed["choices"][0]["logprobs"]["token_logprobs"][: len(PROMPT)]
    other = _session(client, READ)
    scored = client.post(f"/v1/sessions/{other}/score", json={"text": PROMPT}).json()
    expected = [t["logprob"] for t in scored["tokens"]]
    assert logprobs[0] is not None and logprobs == pytest.approx(expected, abs=1e-6)
    assert logprobs == pytest.approx(_one_pass(run, READ + PROMPT)[-len(PROMPT) :], abs=1e-5)


def test_a_session_completion_continues_the_last_positions_of_a_long_reading(client, run):
    sid = _session(client, READ)
    body = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "logprobs": 0}
    choice = client.post(f"/v1/sessions/{sid}/completions", json=body).json()["choices"][0]
    # the reference: the reading's memory (48 positions of READ but its last token), its last 16 kept, then
    # READ's last token and the prompt fed after it, and greedy generation
    lengths = scoring_lengths(run.config, memory=True)
    tgt_len, span = lengths.tgt_len, lengths.span
    ids = torch.as_tensor(run.vocab.encode(READ), dtype=torch.long)
    segments = list(
        segment_losses(
            run.model, ids[None], EvalSettings(tgt_len=tgt_len, span=span, batch_size=1, reuse_keys=False)
        )
    )
    memory = segments[-1].memory
    assert memory.length == 48 > run.config.model.mem_len == 16
    kept = Memory(tuple(state[:, -16:] for state in memory.states))
    prompt = torch.cat([ids[-1:], torch.as_tensor(run.vocab.encode(PROMPT), dtype=torch.long)])
    settings = SamplingParams(max_new_tokens=24, temperature=0)
    out = generate(run.model, prompt[None], settings, memory=kept, return_scores=True)
    assert choice["text"] == run.vocab.decode(out.new_tokens[0].tolist())
    expected = out.scores[0].gather(-1, out.new_tokens[0][:, None])[:, 0]  # (24,)
    assert choice["logprobs"]["token_logprobs"] == pytest.approx(expected.tolist(), abs=1e-5)


def test_after_a_completion_the_session_holds_what_its_client_received(client, run):
    plain = _session(client, READ)
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 1.0, "seed": 3}
    full = client.post(f"/v1/sessions/{plain}/completions", json=body).json()["choices"][0]["text"]
    stop = next(
        full[i : i + n]
        for n in (1, 2, 3)
        for i in range(3, len(full) - n)
        if full[i : i + n] not in full[: i + n - 1]
    )
    sid = _session(client, READ)
    out = client.post(f"/v1/sessions/{sid}/completions", json={**body, "stop": stop}).json()
    returned = out["choices"][0]["text"]
    assert returned == full[: full.index(stop)] and out["choices"][0]["finish_reason"] == "stop"
    received = READ + PROMPT + returned
    assert out["session"]["tokens_read"] == len(received)  # one token per character: the stop string left out
    after = client.post(f"/v1/sessions/{sid}/score", json={"text": "xy"}).json()
    # as a session that reads the same texts in the same pieces (the prompt, then the text returned)
    reader = _session(client, READ, PROMPT, returned)
    expected = client.post(f"/v1/sessions/{reader}/score", json={"text": "xy"}).json()
    assert [t["logprob"] for t in after["tokens"]] == pytest.approx(
        [t["logprob"] for t in expected["tokens"]], abs=1e-6
    )
    assert client.get(f"/v1/sessions/{sid}").json()["memory_length"] == 48  # the evaluation memory, not 16


def test_an_echoed_prompt_longer_than_a_segment_is_read_with_memory(client, run):
    text = SOURCE[:200]  # four evaluation segments: the later ones see the memory of the earlier
    body = {"prompt": text, "echo": True, "logprobs": 0, "max_tokens": 0}
    echoed = client.post("/v1/completions", json=body).json()["choices"][0]["logprobs"]["token_logprobs"]
    assert echoed[0] is None
    assert echoed[1:] == pytest.approx(_one_pass(run, text), abs=1e-5)


def test_a_session_in_use_outlives_its_ttl(run_dir):
    """A session busy with a request longer than its ttl (a streamed completion whose client does not read) is
    not forgotten under it: a session made after it, idle, expires; the busy one then ends its request and holds
    what it read."""
    app = create_app(
        load_run(run_dir), run_dir=run_dir, settings=ServeSettings(session_ttl=3, stream_buffer=4)
    )
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "stream": True}

    async def scenario() -> tuple[int, bytes]:
        reading = asyncio.Event()

        async def client(chunk: bytes) -> None:
            if b"data:" in chunk:
                await reading.wait()

        async def health() -> dict:
            return (await c.get("/v1/health")).json()

        async with in_process(app) as c:
            busy = (await c.post("/v1/sessions")).json()["id"]
            path = f"/v1/sessions/{busy}/completions"
            stream = asyncio.create_task(held_post(app, path, body, on_write=client))

            async def parked() -> bool:
                return (await health())["parks"] == 1

            await eventually(parked, what="the completion to wait for its client")
            idle = (await c.post("/v1/sessions")).json()["id"]

            async def idle_expired() -> bool:
                return (await health())["sessions_expired"] >= 1

            await eventually(idle_expired, what="the idle session to expire")
            assert (await c.get(f"/v1/sessions/{idle}")).status_code == 404
            assert (await c.get(f"/v1/sessions/{busy}")).status_code == 200
            assert (await health())["sessions_expired"] == 1
            reading.set()
            return await stream

    status, raw = asyncio.run(scenario())
    assert status == 200
    final = json.loads(sse_data(raw.decode("utf-8"))[-2])
    assert final["session"]["tokens_read"] == len(PROMPT) + 12
