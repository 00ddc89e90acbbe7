"""``txl serve`` on runs without memory (the vanilla baseline, ``attention="absolute"``, and ``mem_len=0``):
completions plain, streamed, echoed with log-probabilities, ``n`` choices, and concurrent requests each equal
to the same request alone and to the library; the log-probabilities against one forward pass of the model."""

from __future__ import annotations

import json
import threading

import pytest
import torch

pytest.importorskip("fastapi", reason="txl serve needs fastapi: pip install 'transformer-xl[serve]'")
pytest.importorskip("httpx", reason="the API tests need httpx")

import httpx  # noqa: E402

from serve_helpers import library_text, live_server, sse_data, train_char_run  # noqa: E402
from txl.runs import load_run  # noqa: E402
from txl.serve.app import create_app  # noqa: E402
from txl.serve.state import ServeSettings  # noqa: E402

PROMPT = "def wrap(text, "

KINDS = {
    "vanilla": ("model.attention='absolute'", "model.mem_len=0"),
    "mem_len0": ("model.mem_len=0",),
}


@pytest.fixture(scope="module", params=sorted(KINDS))
def served(request, tmp_path_factory):
    """(url, app) of a live server of a run without memory, and the loaded run."""
    run_dir = train_char_run(tmp_path_factory.mktemp(request.param), steps=20, overrides=KINDS[request.param])
    run = load_run(run_dir)
    assert run.config.model.mem_len == 0
    app = create_app(load_run(run_dir), run_dir=run_dir, settings=ServeSettings(max_tokens=200))
    with live_server(app) as url:
        yield url, app, run


def _post(url: str, body: dict) -> dict:
    with httpx.Client(base_url=url, timeout=120) as c:
        response = c.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    if not body.get("stream"):
        return response.json()
    data = sse_data(response.text)
    assert data[-1] == "[DONE]"
    events = [json.loads(d) for d in data[:-1]]
    texts: dict[int, str] = {}
    for event in events:
        for choice in event["choices"]:
            texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
    return {"texts": [texts[i] for i in sorted(texts)], "events": events}


def _text(result: dict) -> str:
    return result["texts"][0] if "texts" in result else result["choices"][0]["text"]


def test_plain_and_streamed_equal_the_library(served):
    url, _, run = served
    greedy = _post(url, {"prompt": PROMPT, "max_tokens": 30, "temperature": 0})
    assert greedy["choices"][0]["text"] == library_text(run, PROMPT, 30, temperature=0)
    assert greedy["usage"]["completion_tokens"] == 30
    body = {"prompt": PROMPT, "max_tokens": 25, "temperature": 1.1, "top_k": 20, "seed": 4}
    sampled = _post(url, body)["choices"][0]["text"]
    assert sampled == library_text(run, PROMPT, 25, seed=4, temperature=1.1, top_k=20)
    streamed = _post(url, {**body, "stream": True})
    assert streamed["texts"] == [sampled]
    assert streamed["events"][-1]["choices"][0]["finish_reason"] == "length"


def test_echo_and_logprobs_are_one_forward_pass(served):
    url, _, run = served
    result = _post(url, {"prompt": PROMPT, "max_tokens": 10, "temperature": 0, "echo": True, "logprobs": 2})
    [choice] = result["choices"]
    generated = library_text(run, PROMPT, 10, temperature=0)
    assert choice["text"] == PROMPT + generated
    lp = choice["logprobs"]
    assert lp["token_logprobs"][0] is None and len(lp["token_logprobs"]) == len(PROMPT) + 10
    ids = run.vocab.encode(PROMPT + generated).tolist()
    with torch.no_grad():  # no memory: every position sees the whole text before it (it fits one window)
        rows = run.model.eval()(torch.tensor([ids])).log_probs[0]  # (N, V)
    expected = [float(rows[t - 1, ids[t]]) for t in range(1, len(ids))]
    assert lp["token_logprobs"][1:] == pytest.approx(expected, abs=1e-4)
    at = len(PROMPT) + 3
    best = torch.topk(rows[at - 1], 2)
    assert list(lp["top_logprobs"][at]) == [run.vocab.decode([int(i)]) for i in best.indices]


def test_n_choices_are_seeded_one_by_one(served):
    url, _, run = served
    body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 1.0, "seed": 40}
    many = _post(url, {**body, "n": 3})
    texts = [c["text"] for c in many["choices"]]
    assert texts == [library_text(run, PROMPT, 20, seed=40 + i, temperature=1.0) for i in range(3)]
    assert len(set(texts)) == 3 and many["usage"]["completion_tokens"] == 60
    assert _post(url, {**body, "n": 3, "stream": True})["texts"] == texts


REQUESTS = [
    {"prompt": PROMPT, "max_tokens": 40, "temperature": 0},
    {"prompt": "import ", "max_tokens": 25, "temperature": 0.9, "seed": 3},
    {"prompt": "    return " * 4, "max_tokens": 30, "temperature": 1.0, "top_k": 12, "seed": 11},
    {"prompt": "class TextWrapper:\n", "max_tokens": 45, "temperature": 1.1, "top_p": 0.9, "seed": 5},
    {"prompt": "x", "max_tokens": 15, "temperature": 0},
    {"prompt": PROMPT, "max_tokens": 50, "temperature": 1.0, "seed": 7, "stop": ["\n\n", "ee"]},
    {"prompt": "# wrap the text", "max_tokens": 35, "temperature": 0.7, "seed": 1, "stream": True},
    {"prompt": "def ", "max_tokens": 40, "temperature": 0, "stream": True, "logprobs": 1},
]


def test_eight_concurrent_requests_each_equal_alone(served):
    url, app, _ = served
    alone = [_text(_post(url, body)) for body in REQUESTS]
    batch = app.state.txl.scheduler.batch
    most: list[int] = []
    step = batch.step

    def counting_step(flush) -> None:
        most.append(batch.in_use)
        step(flush)

    batch.step = counting_step
    together: list[str | None] = [None] * len(REQUESTS)
    barrier = threading.Barrier(len(REQUESTS))

    def send(i: int) -> None:
        barrier.wait()
        together[i] = _text(_post(url, REQUESTS[i]))

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(REQUESTS))]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    finally:
        batch.step = step
    assert together == alone
    assert max(most) >= 4  # they shared the batch (rows of recomputed windows)
    with httpx.Client(base_url=url) as c:
        health = c.get("/v1/health").json()
    assert health["admitted"] == 0 and health["failed"] == 0
