"""``txl serve``'s HTTP API on a run trained here: completions (plain, streamed, stop strings) equal to the
library's sampling; the score equal to ``txl eval`` with and without memory; the model card and the page;
every bad input a 400 naming its field; the queue bound (429); a client that disconnects stops its
generation; a failing request leaves the server serving."""

from __future__ import annotations

import io
import json
import math
import sys
import threading
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest

pytest.importorskip("fastapi", reason="txl serve needs fastapi: pip install 'transformer-xl[serve]'")
pytest.importorskip("httpx", reason="the API tests need httpx (fastapi.testclient)")

import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from serve_helpers import live_server, sse_data, train_char_run, wait_for  # noqa: E402
from txl.cli import main  # noqa: E402
from txl.data import encode_split, load_corpus  # noqa: E402
from txl.inference import SamplingParams  # noqa: E402
from txl.inference.text import generate_text  # noqa: E402
from txl.runs import load_run  # noqa: E402
from txl.serve.app import create_app  # noqa: E402
from txl.serve.state import ServeSettings  # noqa: E402

PROMPT = "def wrap(text, "


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train_char_run(tmp_path_factory.mktemp("serve"))


@pytest.fixture(scope="module")
def client(run_dir):
    app = create_app(
        load_run(run_dir), run_dir=run_dir, settings=ServeSettings(max_tokens=300, max_prompt_chars=5000)
    )
    with TestClient(app) as c:
        yield c


def _reference(run_dir: Path, prompt: str, n: int, *, seed: int = 0, **sampling) -> str:
    """The library's text for the same settings (one generator seeded with ``seed``)."""
    run = load_run(run_dir)
    return generate_text(
        run.model,
        run.vocab,
        prompt,
        SamplingParams(max_new_tokens=n, seed=seed, **sampling),
    )


def _stream(client, **body) -> tuple[list[dict], list[str]]:
    response = client.post("/v1/completions", json={**body, "stream": True})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    data = sse_data(response.text)
    assert data[-1] == "[DONE]"
    return [json.loads(d) for d in data[:-1]], data


# -- completions ---------------------------------------------------------------------------------------------


def test_completion_equals_the_library(client, run_dir):
    response = client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "model": "run"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    [choice] = body["choices"]
    assert choice["text"] == _reference(run_dir, PROMPT, 40, temperature=0)
    assert choice["finish_reason"] == "length" and choice["index"] == 0
    assert body["usage"] == {
        "prompt_tokens": len(PROMPT),
        "completion_tokens": 40,
        "total_tokens": len(PROMPT) + 40,
    }
    assert body["tokens_per_s"] > 0

    sampled = client.post(
        "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 30, "temperature": 1.2, "top_k": 20, "top_p": 0.95, "seed": 7},
    ).json()
    assert sampled["seed"] == 7
    assert sampled["choices"][0]["text"] == _reference(
        run_dir, PROMPT, 30, seed=7, temperature=1.2, top_k=20, top_p=0.95
    )
    other = client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 30, "temperature": 1.2, "seed": 8}
    )
    assert other.json()["choices"][0]["text"] != sampled["choices"][0]["text"]


def test_a_temperature_too_small_to_divide_by_is_greedy(client, run_dir):
    """1e-46 and 1e-300 are 0 in float32: greedy, as every temperature below 1e-5 is (never a 500)."""
    greedy = _reference(run_dir, PROMPT, 20, temperature=0)
    for temperature in (1e-46, 1e-300, 5e-6):
        body = {"prompt": PROMPT, "max_tokens": 20, "temperature": temperature, "top_p": 0.9, "seed": 1}
        response = client.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["text"] == greedy
        events, _ = _stream(client, **body)
        assert "".join(e["choices"][0]["text"] for e in events[:-1]) == greedy


def test_stream_sends_one_event_per_token_then_usage(client, run_dir):
    events, _ = _stream(client, prompt=PROMPT, max_tokens=25, temperature=1.0, seed=3)
    tokens, final = events[:-1], events[-1]
    assert len(tokens) == 25
    assert all(e["choices"][0]["finish_reason"] is None for e in tokens)
    assert len({e["id"] for e in events}) == 1
    text = "".join(e["choices"][0]["text"] for e in tokens)
    assert text == _reference(run_dir, PROMPT, 25, seed=3, temperature=1.0)
    assert final["choices"][0]["finish_reason"] == "length" and final["choices"][0]["text"] == ""
    assert final["usage"]["completion_tokens"] == 25 and final["tokens_per_s"] > 0
    plain = client.post(
        "/v1/completions", json={"prompt": PROMPT, "max_tokens": 25, "seed": 3, "temperature": 1.0}
    )
    assert plain.json()["choices"][0]["text"] == text


def test_stop_cuts_the_text_and_ends_the_generation(client, run_dir):
    full = _reference(run_dir, PROMPT, 60, seed=5, temperature=1.0)
    stop = next(full[i : i + 2] for i in range(5, len(full) - 2) if full[i : i + 2] not in full[: i + 1])
    cut = full.index(stop)
    body = client.post(
        "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 60, "temperature": 1.0, "seed": 5, "stop": stop},
    ).json()
    assert body["choices"][0] == {"text": full[:cut], "index": 0, "logprobs": None, "finish_reason": "stop"}
    assert body["usage"]["completion_tokens"] == cut + len(stop)  # one token per character
    events, _ = _stream(client, prompt=PROMPT, max_tokens=60, temperature=1.0, seed=5, stop=["\x00", stop])
    assert "".join(e["choices"][0]["text"] for e in events) == full[:cut]
    assert len(events) - 1 == cut + len(stop) and events[-1]["choices"][0]["finish_reason"] == "stop"


def test_a_stream_flushes_its_held_back_text_at_the_end(client, run_dir):
    """A stop string that starts with the last generated character (and can never match: NUL is not in the
    vocabulary) holds that character back; the last token must release it, so the streamed text is the
    whole text."""
    full = _reference(run_dir, PROMPT, 30, seed=11, temperature=1.0)
    stop = full[-1] + "\x00"
    events, _ = _stream(client, prompt=PROMPT, max_tokens=30, temperature=1.0, seed=11, stop=[stop])
    assert "".join(e["choices"][0]["text"] for e in events) == full
    assert events[-1]["choices"][0]["finish_reason"] == "length"
    plain = client.post(
        "/v1/completions",
        json={"prompt": PROMPT, "max_tokens": 30, "temperature": 1.0, "seed": 11, "stop": stop},
    )
    assert plain.json()["choices"][0]["text"] == full


# -- score ---------------------------------------------------------------------------------------------------


def _txl_eval(run_dir: Path, *flags: str) -> dict:
    out = io.StringIO()
    with redirect_stdout(out):
        assert (
            main(["eval", str(run_dir), "--split", "valid", "--batch-size", "1", "--quiet", "--json", *flags])
            == 0
        )
    return json.loads(out.getvalue())


def test_score_equals_txl_eval_with_and_without_memory(client, run_dir):
    run = load_run(run_dir)
    corpus = load_corpus(run.config.data.corpus)
    ids = encode_split(corpus, "valid", run.vocab)
    text = run.vocab.decode(ids)
    assert run.vocab.encode(text).tolist() == list(ids)  # the text is exactly the split

    with_memory = client.post("/v1/score", json={"text": text}).json()
    without = client.post("/v1/score", json={"text": text, "memory": False}).json()
    reference = _txl_eval(run_dir)
    reference_without = _txl_eval(run_dir, "--mem-len", "0")
    for scored, evaluated in ((with_memory, reference), (without, reference_without)):
        assert scored["scored_tokens"] == evaluated["tokens"] == len(ids) - 1
        assert scored["tgt_len"] == evaluated["tgt_len"] and scored["mem_len"] == evaluated["mem_len"]
        assert math.isclose(scored["mean_loss"], evaluated["loss"], rel_tol=1e-9, abs_tol=1e-9)
        logprobs = [t["logprob"] for t in scored["tokens"]]
        assert logprobs[0] is None and len(logprobs) == len(ids)
        assert math.isclose(-sum(logprobs[1:]) / (len(ids) - 1), scored["mean_loss"], rel_tol=1e-6)
    assert with_memory["memory"] is True and with_memory["mem_len"] == run.config.model.mem_len
    assert without["memory"] is False and without["mem_len"] == 0
    # The first segment has no memory either way; the later ones see it, and the loss differs.
    first = with_memory["tgt_len"] + 1
    assert [t["logprob"] for t in with_memory["tokens"][:first]] == [
        t["logprob"] for t in without["tokens"][:first]
    ]
    assert abs(with_memory["mean_loss"] - without["mean_loss"]) > 1e-4
    assert "".join(t["text"] for t in with_memory["tokens"]) == text
    assert [t["id"] for t in with_memory["tokens"]] == list(ids)


# -- model card and page -------------------------------------------------------------------------------------


def test_model_card(client, run_dir):
    card = client.get("/v1/model").json()
    run = load_run(run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert card["id"] == "run" and card["step"] == run.step == summary["steps"]
    assert card["parameters"] == sum(p.numel() for p in run.model.parameters()) == summary["params"]
    assert card["vocab"] == {"kind": "char", "size": len(run.vocab)}
    assert card["config"]["model"]["mem_len"] == run.config.model.mem_len
    assert card["summary"] == summary
    assert card["limits"] == {
        "max_tokens": 300,
        "max_prompt_chars": 5000,
        "queue_size": 8,
        "max_batch": 16,
        "max_sessions": 1000,
        "session_ttl": 600.0,
    }
    assert card["defaults"]["prompt"] == "\n"  # the run has no generate.prompt
    models = client.get("/v1/models").json()
    assert models["data"][0]["id"] == "run"


def test_the_default_prompt_comes_from_the_run_never_the_corpus(run_dir, monkeypatch):
    """The page's default prompt is the run's ``generate.prompt`` (else a newline); starting the server never
    reads the corpus (its loader is made to fail here, and the corpus file is gone)."""
    import dataclasses

    import txl.data
    from txl.serve.card import default_prompt

    run = load_run(run_dir)
    generate = dataclasses.replace(run.config.generate, prompt="ROMEO:")
    prompted = dataclasses.replace(run, config=dataclasses.replace(run.config, generate=generate))
    assert default_prompt(prompted) == "ROMEO:"
    assert default_prompt(run) == "\n"

    reads = []

    def no_corpus(*args, **kwargs):
        reads.append(args)
        raise AssertionError("txl serve read the corpus")

    monkeypatch.setattr(txl.data, "load_corpus", no_corpus)
    monkeypatch.setattr(txl.data, "encode_split", no_corpus)
    corpus = Path(run.config.data.corpus)
    hidden = corpus.with_suffix(".hidden")
    corpus.rename(hidden)
    try:
        with TestClient(create_app(prompted, run_dir=run_dir)) as c:
            assert c.get("/v1/model").json()["defaults"]["prompt"] == "ROMEO:"
            assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2}).status_code == 200
    finally:
        hidden.rename(corpus)
    assert reads == []


def test_page_is_one_offline_file(client):
    response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    assert "http://" not in page and "https://" not in page and "//cdn" not in page
    assert "<script src" not in page and "<link" not in page
    assert "default-src 'self'" in response.headers["content-security-policy"]
    assert 'name="viewport"' in page
    for path in ("/v1/completions", "/v1/score", "/v1/model"):
        assert path in page


# -- bad input -----------------------------------------------------------------------------------------------

BAD = [
    ("/v1/completions", {"prompt": "def", "max_tokens": 5, "frequency_penalty": 1}, "frequency_penalty"),
    ("/v1/completions", {"max_tokens": 5}, "prompt"),
    ("/v1/completions", {"prompt": 5}, "prompt"),
    ("/v1/completions", {"prompt": [["def"]]}, "prompt"),
    ("/v1/completions", {"prompt": "def", "max_tokens": "5"}, "max_tokens"),
    ("/v1/completions", {"prompt": "def", "max_tokens": 2.5}, "max_tokens"),
    ("/v1/completions", {"prompt": "def", "max_tokens": True}, "max_tokens"),
    ("/v1/completions", {"prompt": "def", "max_tokens": 0}, "max_tokens"),
    ("/v1/completions", {"prompt": "def", "max_tokens": 301}, "max_tokens"),
    ("/v1/completions", {"prompt": "def", "temperature": "hot"}, "temperature"),
    ("/v1/completions", {"prompt": "def", "temperature": -1}, "temperature"),
    ("/v1/completions", {"prompt": "def", "top_p": 1.5}, "top_p"),
    ("/v1/completions", {"prompt": "def", "top_p": 0}, "top_p"),
    ("/v1/completions", {"prompt": "def", "top_k": 0}, "top_k"),
    ("/v1/completions", {"prompt": "def", "seed": 1.5}, "seed"),
    ("/v1/completions", {"prompt": "def", "seed": 2**64}, "seed"),
    ("/v1/completions", {"prompt": "def", "stream": "yes"}, "stream"),
    ("/v1/completions", {"prompt": "def", "stop": 5}, "stop"),
    ("/v1/completions", {"prompt": "def", "stop": [""]}, "stop"),
    ("/v1/completions", {"prompt": "def", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ("/v1/completions", {"prompt": "def", "n": 17}, "n"),
    ("/v1/completions", {"prompt": "def", "n": 0}, "n"),
    ("/v1/completions", {"prompt": [1, 2, 10**6]}, "prompt"),
    ("/v1/completions", {"prompt": [1, -1]}, "prompt"),
    ("/v1/completions", {"prompt": "def", "logprobs": 21}, "logprobs"),
    ("/v1/completions", {"prompt": "def", "echo": "yes"}, "echo"),
    ("/v1/completions", {"prompt": "x" * 5001}, "prompt"),
    ("/v1/completions", {"prompt": "caf\u00e9 \u2603"}, "prompt"),
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/score", {"text": "def", "memory": "no"}, "memory"),
    ("/v1/score", {"text": "def", "segment": 4}, "segment"),
    ("/v1/score", {}, "text"),
    ("/v1/score", {"text": "x" * 5001}, "text"),
    ("/v1/score", {"text": "snowman \u2603 here"}, "text"),
    ("/v1/score", {"text": "d"}, "text"),
]


@pytest.mark.parametrize(
    ("path", "body", "param"), BAD, ids=[f"{p.rsplit('/', 1)[1]}-{f}-{i}" for i, (p, _, f) in enumerate(BAD)]
)
def test_bad_input_is_a_400_naming_the_field(client, path, body, param):
    response = client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and error["type"] == "invalid_request_error"
    assert param in error["message"]
    if "\u2603" in json.dumps(body, ensure_ascii=False):
        assert "\u2603" in error["message"]


def test_an_unknown_model_is_a_404_and_chat_points_to_completions(client):
    """The model served is the run folder's name ("run"); any other name is a 404 naming ``model``, on every
    route that takes one, as ``GET /v1/models/{id}`` says; left out, it is the one served. The chat route
    says the model is a base language model and points to ``/v1/completions``."""
    assert client.get("/v1/models").json()["data"][0]["id"] == "run"
    assert client.get("/v1/models/other").status_code == 404
    for path, body in [
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2}),
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "stream": True}),
        ("/v1/score", {"text": PROMPT}),
        ("/v1/sessions", {}),
    ]:
        for model, status in [("other", 404), ("run", 200), (None, 200)]:
            sent = body if model is None else {**body, "model": model}
            response = client.post(path, json=sent)
            assert response.status_code == status, (path, model, response.text)
            if status == 404:
                error = response.json()["error"]
                assert set(error) == {"message", "type", "param", "code"}
                assert error["param"] == "model" and error["type"] == "not_found_error"
                assert "'other'" in error["message"] and "'run'" in error["message"]
    sid = client.post("/v1/sessions").json()["id"]
    for path, body in [
        (f"/v1/sessions/{sid}/score", {"text": PROMPT}),
        (f"/v1/sessions/{sid}/completions", {"max_tokens": 2}),
    ]:
        refused = client.post(path, json={**body, "model": "other"})
        assert refused.status_code == 404 and refused.json()["error"]["param"] == "model"
        assert client.post(path, json={**body, "model": "run"}).status_code == 200
    messages = [{"role": "user", "content": "hello"}]
    chat = client.post("/v1/chat/completions", json={"model": "run", "messages": messages})
    assert chat.status_code == 404
    error = chat.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"
    assert "base language model" in error["message"] and "/v1/completions" in error["message"]


def test_bad_bodies(client):
    for raw in (b"{not json", b"[1, 2]", b"\xff\xfe", b"[" * 20_000 + b"]" * 20_000):
        response = client.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
        assert response.status_code == 400 and "error" in response.json()
    huge = client.post(
        "/v1/score", content=b"{" + b" " * 200_000 + b"}", headers={"content-type": "application/json"}
    )
    assert huge.status_code == 413
    assert client.get("/v1/nothing").status_code == 404
    assert client.get("/v1/completions").status_code == 405
    assert client.get("/v1/health").json()["admitted"] == 0


def test_a_failing_request_is_a_500_and_the_server_goes_on(run_dir, monkeypatch):
    run = load_run(run_dir)
    app = create_app(run, run_dir=run_dir)
    with TestClient(app, raise_server_exceptions=False) as c:

        def broken(*args, **kwargs):
            raise RuntimeError("injected failure")

        monkeypatch.setattr(run.model, "forward", broken)
        response = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3})
        assert response.status_code == 500 and "injected failure" in response.json()["error"]["message"]
        events = sse_data(
            c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3, "stream": True}).text
        )
        assert "injected failure" in json.loads(events[0])["error"]["message"] and events[-1] == "[DONE]"
        monkeypatch.undo()
        assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 3}).status_code == 200
        assert c.get("/v1/health").json()["failed"] == 2


def test_missing_server_packages_give_one_line(run_dir, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "uvicorn", None)
    assert main(["serve", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["txl: error: txl serve needs uvicorn: pip install 'transformer-xl[serve]'"]


# -- a live server: the queue bound, disconnects ---------------------------------------------------------------


class _Gate:
    """Wraps the model's forward: each call waits for the gate to be open (and sleeps ``delay``), counted."""

    def __init__(self, model, *, delay: float = 0.0, open_: bool = True) -> None:
        self.calls = 0
        self.delay = delay
        self.open = threading.Event()
        if open_:
            self.open.set()
        original = model.forward

        def forward(*args, **kwargs):
            self.calls += 1
            assert self.open.wait(timeout=60), "the gate was never opened"
            if self.delay:
                time.sleep(self.delay)
            return original(*args, **kwargs)

        model.forward = forward


def test_requests_over_the_queue_bound_get_429(run_dir):
    run = load_run(run_dir)
    gate = _Gate(run.model, open_=False)
    app = create_app(run, run_dir=run_dir, settings=ServeSettings(queue_size=1, max_batch=1))
    results: dict[str, int] = {}

    def request(key: str, body: dict) -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            results[key] = c.post("/v1/completions", json=body).status_code

    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        first = threading.Thread(
            target=request, args=("running", {"prompt": PROMPT, "max_tokens": 5, "stream": True})
        )
        first.start()
        wait_for(lambda: gate.calls >= 1, what="the first request to reach the model")
        second = threading.Thread(target=request, args=("queued", {"prompt": PROMPT, "max_tokens": 5}))
        second.start()
        wait_for(lambda: c.get("/v1/health").json()["admitted"] == 2, what="the second request to wait")
        refused = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5})
        assert refused.status_code == 429 and refused.json()["error"]["type"] == "rate_limit_error"
        assert c.post("/v1/score", json={"text": PROMPT}).status_code == 429
        assert c.post("/v1/completions", json={"prompt": PROMPT, "stream": True}).status_code == 429
        gate.open.set()
        first.join(timeout=60)
        second.join(timeout=60)
        assert results == {"running": 200, "queued": 200}
        health = c.get("/v1/health").json()
        assert health["admitted"] == 0 and health["rejected"] == 3 and health["requests"] == 2
        assert c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5}).status_code == 200


def test_a_client_that_disconnects_stops_its_generation(run_dir):
    run = load_run(run_dir)
    gate = _Gate(run.model, delay=0.01)
    app = create_app(run, run_dir=run_dir, settings=ServeSettings(max_tokens=3000, stream_buffer=4))
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        with c.stream(
            "POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 3000, "stream": True}
        ) as response:
            assert response.status_code == 200
            seen = 0
            for line in response.iter_lines():
                seen += line.startswith("data:")
                if seen == 3:
                    break
        # the response is closed: the connection is gone
        wait_for(lambda: c.get("/v1/health").json()["cancelled"] == 1, what="the generation to be cancelled")
        calls = gate.calls
        generated = c.get("/v1/health").json()["tokens_generated"]
        time.sleep(0.5)
        assert gate.calls == calls and c.get("/v1/health").json()["tokens_generated"] == generated
        assert generated < 100  # of the 3000 asked for
        health = c.get("/v1/health").json()
        assert health["admitted"] == 0
        done = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 5}).json()
        assert done["usage"]["completion_tokens"] == 5


def test_a_client_that_leaves_the_queue_never_reaches_the_model(run_dir):
    run = load_run(run_dir)
    gate = _Gate(run.model, open_=False)
    app = create_app(run, run_dir=run_dir)
    answered = {}

    def running() -> None:
        with httpx.Client(base_url=url, timeout=60) as c:
            answered["tokens"] = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 4}).json()[
                "usage"
            ]

    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        first = threading.Thread(target=running)
        first.start()
        wait_for(lambda: gate.calls >= 1, what="the first request to reach the model")
        with c.stream(
            "POST", "/v1/completions", json={"prompt": PROMPT, "max_tokens": 50, "stream": True}
        ) as response:
            assert response.status_code == 200  # the headers come at once; the tokens would follow
            wait_for(
                lambda: c.get("/v1/health").json()["admitted"] == 2, what="the streaming request to wait"
            )
        with pytest.raises(httpx.ReadTimeout):  # a plain request whose client gives up after a second
            httpx.post(f"{url}/v1/completions", json={"prompt": PROMPT, "max_tokens": 50}, timeout=1.0)
        # Both left while waiting. The server notices within a second (a keep-alive comment to the streaming
        # client fails; the plain request's connection is polled), so when the model is free neither runs.
        time.sleep(2.5)
        gate.open.set()
        first.join(timeout=60)
        wait_for(lambda: c.get("/v1/health").json()["admitted"] == 0, what="the queue to empty")
        health = c.get("/v1/health").json()
        assert answered["tokens"]["completion_tokens"] == 4
        assert health["cancelled"] == 2 and health["tokens_generated"] == 4


# -- the command line, a word vocabulary -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--port", "70000"], "--port must be a port number"),
        (["--queue-size", "-1"], "--queue-size must be an integer >= 0"),
        (["--max-tokens-limit", "0"], "--max-tokens-limit must be a positive integer"),
        (["--max-prompt-chars", "x"], "--max-prompt-chars must be a positive integer"),
        (["--max-batch", "0"], "--max-batch must be a positive integer"),
        (["--max-sessions", "-3"], "--max-sessions must be a positive integer"),
        (["--session-ttl", "0"], "--session-ttl must be a positive number"),
        (["--session-ttl", "inf"], "--session-ttl must be a positive number"),
        (["--checkpoint", "step-99999999"], "no checkpoint 'step-99999999'"),
    ],
)
def test_bad_serve_flags_give_one_line(run_dir, capsys, flags, fragment):
    assert main(["serve", str(run_dir), *flags]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("txl: error: ") and fragment in err[0], err


def test_serve_refuses_a_missing_run_and_a_busy_port(run_dir, tmp_path, capsys):
    assert main(["serve", str(tmp_path / "nothing")]) == 2
    assert "run folder not found" in capsys.readouterr().err
    from txl.serve import bind

    taken = bind("127.0.0.1", 0)
    try:
        port = taken.getsockname()[1]
        taken_twice = main(["serve", str(run_dir), "--port", str(port)])
    finally:
        taken.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert taken_twice == 2 and len(err) == 1 and f"--port {port}: cannot listen there" in err[0], err


def test_a_word_vocabulary_reads_unknown_words_as_unk(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("the cat sat on the mat .\nthe dog sat on the log .\n" * 200, encoding="utf-8")
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "--config",
                "tiny",
                "--out",
                str(run),
                "--quiet",
                "--set",
                'data.vocab="word"',
                "--set",
                f"data.corpus={json.dumps(str(corpus))}",
                "--set",
                "train.steps=3",
            ]
        )
        == 0
    )
    with TestClient(create_app(load_run(run), run_dir=run)) as c:
        body = c.post("/v1/completions", json={"prompt": "the zebra sat", "max_tokens": 4, "seed": 0}).json()
        assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        assert len(body["warnings"]) == 1 and "'zebra'" in body["warnings"][0]
        scored = c.post("/v1/score", json={"text": "the zebra sat on the mat"}).json()
        assert scored["scored_tokens"] == 5 and "'zebra'" in scored["warnings"][0]
        assert [t["text"].strip() for t in scored["tokens"]] == ["the", "<unk>", "sat", "on", "the", "mat"]
        assert c.get("/v1/model").json()["vocab"]["kind"] == "word"
