"""``txl serve`` for many users at once: concurrent requests decoded as rows of one cache each give exactly what
they give alone (and what the library gives); a disconnect frees its row; the OpenAI fields (``echo``,
``logprobs``, token-id prompts, ``n``, ``max_tokens: 0``) checked against the model's forward with memory and
``/v1/score``, through the official ``openai`` client, streamed and not; ``--api-key``; sessions whose memory
persists, against one pass of ``txl.evaluation``'s loop."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("fastapi", reason="txl serve needs fastapi: pip install 'transformer-xl[serve]'")
pytest.importorskip("httpx", reason="the API tests need httpx (fastapi.testclient)")

import httpx  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from serve_helpers import in_process, live_server, sse_data, train_char_run, wait_for  # noqa: E402
from txl.inference import SamplingParams  # noqa: E402
from txl.inference.text import generate_text  # noqa: E402
from txl.runs import load_run  # noqa: E402
from txl.serve import listening_note  # noqa: E402
from txl.serve.app import create_app  # noqa: E402
from txl.serve.score import score_tokens, scoring_lengths  # noqa: E402
from txl.serve.state import ServeSettings  # noqa: E402

PROMPT = "def wrap(text, "
KEY = "sk-test-0123456789"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return train_char_run(tmp_path_factory.mktemp("batching"), steps=40)


@pytest.fixture(scope="module")
def run(run_dir):
    return load_run(run_dir)


@pytest.fixture(scope="module")
def server(run_dir):
    """A live server (16 rows) and its application."""
    app = create_app(load_run(run_dir), run_dir=run_dir, settings=ServeSettings(max_tokens=400))
    with live_server(app) as url:
        yield url, app


def _reference(run, prompt: str, n: int, *, seed: int = 0, **sampling) -> str:
    return generate_text(
        run.model,
        run.vocab,
        prompt,
        SamplingParams(max_new_tokens=n, seed=seed, **sampling),
    )


def _completion(url: str, body: dict, *, headers: dict | None = None) -> dict:
    with httpx.Client(base_url=url, timeout=120) as c:
        response = c.post("/v1/completions", json=body, headers=headers)
    assert response.status_code == 200, response.text
    if body.get("stream"):
        events = [json.loads(d) for d in sse_data(response.text)[:-1]]
        texts: dict[int, str] = {}
        for event in events:
            for choice in event["choices"]:
                texts[choice["index"]] = texts.get(choice["index"], "") + choice["text"]
        return {"texts": [texts[i] for i in sorted(texts)], "events": events}
    return response.json()


# -- continuous batching ---------------------------------------------------------------------------------------

REQUESTS = [
    {"prompt": PROMPT, "max_tokens": 60, "temperature": 0},
    {"prompt": "import ", "max_tokens": 35, "temperature": 0.9, "seed": 3},
    {"prompt": "    return " * 6, "max_tokens": 50, "temperature": 1.0, "top_k": 12, "seed": 11},
    {"prompt": "class TextWrapper:\n", "max_tokens": 70, "temperature": 1.1, "top_p": 0.9, "seed": 5},
    {"prompt": "x", "max_tokens": 20, "temperature": 0},
    {"prompt": PROMPT, "max_tokens": 80, "temperature": 1.0, "seed": 7, "stop": ["\n\n", "ee"]},
    {"prompt": "# " + "wrap the text " * 3, "max_tokens": 45, "temperature": 0.7, "seed": 1, "stream": True},
    {"prompt": "def ", "max_tokens": 64, "temperature": 0, "stream": True},
]


def _text(result: dict) -> str:
    return result["texts"][0] if "texts" in result else result["choices"][0]["text"]


def test_concurrent_requests_give_exactly_what_each_gives_alone(server, run):
    url, app = server
    engine = app.state.txl.scheduler
    alone = [_text(_completion(url, body)) for body in REQUESTS]  # one at a time: nobody else in the batch
    for body, text in zip(REQUESTS, alone, strict=True):  # and that is the library's text
        if "stop" not in body:
            settings = {k: body[k] for k in ("temperature", "top_k", "top_p") if k in body}
            assert text == _reference(
                run, body["prompt"], body["max_tokens"], seed=body.get("seed", 0), **settings
            )
    most = []
    step = engine.batch.step

    def counting_step(flush) -> None:
        most.append(engine.rows_in_use)
        step(flush)

    engine.batch.step = counting_step
    try:
        together: list[str | None] = [None] * len(REQUESTS)
        barrier = threading.Barrier(len(REQUESTS))

        def send(i: int) -> None:
            barrier.wait()
            together[i] = _text(_completion(url, REQUESTS[i]))

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(REQUESTS))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        engine.batch.step = step
    assert together == alone
    assert max(most) >= 4  # they did share the batch
    with httpx.Client(base_url=url) as c:
        health = c.get("/v1/health").json()
    assert health["rows_in_use"] == 0 and health["admitted"] == 0 and health["max_batch"] == 16


def test_more_concurrent_requests_than_rows_all_succeed(run_dir, run):
    """32 requests at once on 8 rows (24 wait): the prompts, read in several chunks, hold rows promised to them
    while they are read, so no request starts without a row; each gets exactly its text alone."""
    app = create_app(run, run_dir=run_dir, settings=ServeSettings(max_batch=8, queue_size=24))
    prompt = (Path(__file__).parent / "serve_helpers.py").read_text(encoding="utf-8")[:90]  # 6 chunks
    bodies = [{"prompt": prompt[i:], "max_tokens": 6, "temperature": 1.0, "seed": i} for i in range(32)]

    async def scenario() -> tuple[list[httpx.Response], dict]:
        async with in_process(app) as c:
            answers = await asyncio.gather(*(c.post("/v1/completions", json=b) for b in bodies))
            return list(answers), (await c.get("/v1/health")).json()

    answers, health = asyncio.run(scenario())
    assert [a.status_code for a in answers] == [200] * 32, [a.text for a in answers if a.status_code != 200]
    texts = [a.json()["choices"][0]["text"] for a in answers]
    assert texts == [_reference(run, b["prompt"], 6, seed=b["seed"], temperature=1.0) for b in bodies]
    assert health["failed"] == 0 and health["rejected"] == 0 and health["requests"] == 32


def test_a_disconnect_frees_its_row_and_its_neighbour_goes_on(server, run):
    url, app = server
    engine = app.state.txl.scheduler
    body = {"prompt": PROMPT, "max_tokens": 300, "temperature": 0}
    expected = _reference(run, PROMPT, 300, temperature=0)
    result = {}
    neighbour = threading.Thread(target=lambda: result.update(_completion(url, body)))
    with httpx.Client(base_url=url, timeout=60) as c:
        step = engine.batch.step
        slow = threading.Event()

        def slowed(flush) -> None:  # keep the rows busy long enough to see them
            if not slow.is_set():
                time.sleep(0.005)
            step(flush)

        engine.batch.step = slowed
        try:
            neighbour.start()
            wait_for(lambda: engine.rows_in_use == 1, what="the neighbour to take a row")
            with c.stream(
                "POST", "/v1/completions", json={"prompt": "import ", "max_tokens": 300, "stream": True}
            ) as response:
                seen = 0
                for line in response.iter_lines():
                    seen += line.startswith("data:")
                    if seen == 3:
                        break
                assert engine.rows_in_use == 2
            wait_for(lambda: engine.rows_in_use == 1, what="the row of the client that left to be freed")
            assert c.get("/v1/health").json()["rows_in_use"] == 1
            slow.set()
        finally:
            engine.batch.step = step
        neighbour.join(timeout=120)
        assert result["choices"][0]["text"] == expected
        health = c.get("/v1/health").json()
        assert health["rows_in_use"] == 0 and health["admitted"] == 0 and health["cancelled"] >= 1


def test_n_choices_are_rows_seeded_one_by_one(server):
    url, _ = server
    body = {"prompt": PROMPT, "max_tokens": 30, "temperature": 1.0, "seed": 40}
    many = _completion(url, {**body, "n": 3})
    assert [c["index"] for c in many["choices"]] == [0, 1, 2]
    for i, choice in enumerate(many["choices"]):
        assert choice["text"] == _completion(url, {**body, "seed": 40 + i})["choices"][0]["text"]
    assert len({c["text"] for c in many["choices"]}) == 3
    assert many["usage"]["completion_tokens"] == 90
    streamed = _completion(url, {**body, "n": 3, "stream": True})
    assert streamed["texts"] == [c["text"] for c in many["choices"]]


# -- the OpenAI fields --------------------------------------------------------------------------------------------


def _forward_logprobs(run, ids: list[int], prompt_len: int) -> list[torch.Tensor]:
    """The log-probabilities (V,) after each position from the prompt's last on, by the model's forward with
    memory: the prompt in one segment, then one token at a time (as generation reads them; no cache)."""
    model = run.model.eval()
    with torch.no_grad():
        out = model(torch.tensor([ids[:prompt_len]]))
        rows = [out.log_probs[0, -1]]
        memory = out.memory
        for token in ids[prompt_len:-1]:
            out = model(torch.tensor([[token]]), memory=memory)
            memory = out.memory
            rows.append(out.log_probs[0, -1])
    return rows


def test_logprobs_and_echo_are_the_models(server, run):
    url, _ = server
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "logprobs": 3, "echo": True}
    result = _completion(url, body)
    [choice] = result["choices"]
    generated = _reference(run, PROMPT, 12, temperature=0)
    assert choice["text"] == PROMPT + generated
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == choice["text"] and len(lp["tokens"]) == len(PROMPT) + 12
    assert lp["text_offset"] == list(range(len(PROMPT) + 12))  # one character per token
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    with httpx.Client(base_url=url) as c:
        scored = c.post("/v1/score", json={"text": PROMPT}).json()
    expected = [t["logprob"] for t in scored["tokens"]][1:]
    assert lp["token_logprobs"][1 : len(PROMPT)] == pytest.approx(expected, abs=1e-5)
    ids = run.vocab.encode(PROMPT + generated).tolist()
    reference = _forward_logprobs(run, ids, len(PROMPT))
    for n, row in enumerate(reference):
        at = len(PROMPT) + n
        assert lp["token_logprobs"][at] == pytest.approx(float(row[ids[at]]), abs=1e-4)
        best = torch.topk(row, 3)
        top = lp["top_logprobs"][at]
        assert list(top) == [run.vocab.decode([int(i)]) for i in best.indices]
        assert list(top.values()) == pytest.approx(best.values.tolist(), abs=1e-4)
        assert max(top.values()) == pytest.approx(lp["token_logprobs"][at], abs=1e-6)  # greedy: the best

    streamed = _completion(url, {**body, "stream": True})
    assert streamed["texts"] == [choice["text"]]
    entries = [e["choices"][0]["logprobs"] for e in streamed["events"] if e["choices"][0]["logprobs"]]
    joined = {k: [v for e in entries for v in e[k]] for k in ("tokens", "token_logprobs", "text_offset")}
    assert joined["tokens"] == lp["tokens"] and joined["text_offset"] == lp["text_offset"]
    assert joined["token_logprobs"][1:] == pytest.approx(lp["token_logprobs"][1:], abs=1e-9)

    plain = _completion(url, {**body, "echo": False})["choices"][0]
    assert plain["text"] == generated and plain["logprobs"]["text_offset"][0] == len(PROMPT)
    assert plain["logprobs"]["token_logprobs"] == pytest.approx(lp["token_logprobs"][len(PROMPT) :], abs=1e-9)


def test_token_ids_and_scoring_only(server, run):
    url, _ = server
    ids = run.vocab.encode(PROMPT).tolist()
    as_ids = _completion(url, {"prompt": ids, "max_tokens": 20, "temperature": 0})
    as_text = _completion(url, {"prompt": PROMPT, "max_tokens": 20, "temperature": 0})
    assert as_ids["choices"][0]["text"] == as_text["choices"][0]["text"]
    assert as_ids["usage"]["prompt_tokens"] == len(ids)
    scoring = _completion(url, {"prompt": PROMPT, "max_tokens": 0, "echo": True, "logprobs": 0})
    [choice] = scoring["choices"]
    assert choice["text"] == PROMPT and scoring["usage"]["completion_tokens"] == 0
    assert choice["logprobs"]["top_logprobs"][1] == {}
    with httpx.Client(base_url=url) as c:
        scored = c.post("/v1/score", json={"text": PROMPT}).json()
    assert choice["logprobs"]["token_logprobs"][1:] == pytest.approx(
        [t["logprob"] for t in scored["tokens"]][1:], abs=1e-5
    )


def test_the_official_openai_client(run_dir, run):
    openai = pytest.importorskip(
        "openai", reason="the client test needs openai: pip install 'transformer-xl[serve-test]'"
    )
    app = create_app(load_run(run_dir), run_dir=run_dir, settings=ServeSettings(api_key=KEY))
    with live_server(app) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        generated = _reference(run, PROMPT, 16, temperature=0)
        plain = client.completions.create(
            model="run", prompt=PROMPT, max_tokens=16, temperature=0, logprobs=2, echo=True
        )
        assert plain.choices[0].text == PROMPT + generated
        assert plain.choices[0].finish_reason == "length" and plain.usage.completion_tokens == 16
        lp = plain.choices[0].logprobs
        assert (
            lp.token_logprobs[0] is None
            and len(lp.top_logprobs[1]) == 2
            and "".join(lp.tokens) == PROMPT + generated
        )
        chunks = list(
            client.completions.create(
                model="run", prompt=PROMPT, max_tokens=16, temperature=0, stream=True, logprobs=1
            )
        )
        assert "".join(c.choices[0].text for c in chunks if c.choices) == generated
        assert [
            c.choices[0].logprobs.tokens[0] for c in chunks if c.choices and c.choices[0].logprobs
        ] == list(generated)
        many = client.completions.create(model="run", prompt=[1, 2, 3], max_tokens=5, n=2, seed=9)
        assert [c.index for c in many.choices] == [0, 1]
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(model="run", prompt=[10**6], max_tokens=5)
        assert bad.value.body["param"] == "prompt"
        with pytest.raises(openai.BadRequestError) as bad:
            client.completions.create(model="run", prompt="x", max_tokens=5, n=17)
        assert bad.value.body["param"] == "n"
        wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError) as refused:
            wrong.completions.create(model="run", prompt=PROMPT, max_tokens=3)
        assert refused.value.body["code"] == "invalid_api_key"


# -- the API key ---------------------------------------------------------------------------------------------------


def test_the_api_key_guards_every_route_but_the_page_and_health(run_dir):
    app = create_app(load_run(run_dir), run_dir=run_dir, settings=ServeSettings(api_key=KEY))
    with TestClient(app) as c:
        good = {"Authorization": f"Bearer {KEY}"}
        for method, path, body in [
            ("post", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2}),
            ("post", "/v1/score", {"text": PROMPT}),
            ("get", "/v1/model", None),
            ("get", "/v1/models", None),
            ("post", "/v1/sessions", {}),
        ]:
            for headers in (
                {},
                {"Authorization": "Bearer sk-wrong"},
                {"Authorization": KEY},
                {"X-Api-Key": KEY},
            ):
                refused = getattr(c, method)(
                    path, headers=headers, **({"json": body} if body is not None else {})
                )
                assert refused.status_code == 401, (path, headers)
                error = refused.json()["error"]
                assert (
                    set(error) == {"message", "type", "param", "code"} and error["code"] == "invalid_api_key"
                )
                assert refused.headers["www-authenticate"] == "Bearer"
            kwargs = {"json": body} if body is not None else {}
            assert getattr(c, method)(path, headers=good, **kwargs).status_code == 200, path
        assert c.get("/").status_code == 200 and c.get("/v1/health").status_code == 200
    with TestClient(create_app(load_run(run_dir), run_dir=run_dir)) as c:  # no key: all open
        assert c.get("/v1/model").status_code == 200


def test_a_non_ascii_key_is_matched_by_its_utf8_bytes(run_dir):
    """A key is compared as UTF-8 bytes with the header's value as the client sent it (through uvicorn): a
    client sending the key's UTF-8 bytes gets in; its Latin-1 bytes or another key do not; a key with spaces
    at its ends, which no header value carries, is refused when the server is set up."""
    key = "clé-ключ-🔑"
    app = create_app(load_run(run_dir), run_dir=run_dir, settings=ServeSettings(api_key=key))
    body = {"prompt": PROMPT, "max_tokens": 2}
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        utf8 = c.post(
            "/v1/completions", json=body, headers={"Authorization": b"Bearer " + key.encode("utf-8")}
        )
        assert utf8.status_code == 200, utf8.text
        lower = c.get("/v1/model", headers={"authorization": b"bearer " + key.encode("utf-8")})
        assert lower.status_code == 200
        for headers in ({"Authorization": b"Bearer " + key[:-1].encode("utf-8")}, {}):
            refused = c.post("/v1/completions", json=body, headers=headers)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    latin = create_app(load_run(run_dir), run_dir=run_dir, settings=ServeSettings(api_key="clé"))
    with live_server(latin) as url, httpx.Client(base_url=url, timeout=60) as c:
        for sent, status in [("clé".encode(), 200), ("clé".encode("latin-1"), 401)]:
            assert c.get("/v1/model", headers={"Authorization": b"Bearer " + sent}).status_code == status
    with pytest.raises(ValueError, match="api_key must not start or end with spaces"):
        ServeSettings(api_key="key ")


def test_a_public_address_without_a_key_is_warned_about():
    assert "warning" not in listening_note("127.0.0.1", 8000, keyed=False)
    assert "warning" not in listening_note("::1", 8000, keyed=False)
    warned = listening_note("0.0.0.0", 8000, keyed=False)
    assert warned.startswith("txl: warning: ") and "--api-key" in warned and "TXL_API_KEY" in warned
    assert "warning" not in listening_note("0.0.0.0", 8000, keyed=True)


def test_the_key_comes_from_the_flag_or_the_environment(run_dir, monkeypatch, capsys):
    import txl.serve as serving
    from txl.cli import main

    seen = {}

    def fake_serve(run_dir, *, settings, **kwargs):
        seen["key"] = settings.api_key

    monkeypatch.setattr(serving, "serve", fake_serve)
    monkeypatch.setenv("TXL_API_KEY", "from-env")
    assert main(["serve", str(run_dir)]) == 0 and seen["key"] == "from-env"
    assert main(["serve", str(run_dir), "--api-key", "from-flag"]) == 0 and seen["key"] == "from-flag"
    monkeypatch.delenv("TXL_API_KEY")
    assert main(["serve", str(run_dir)]) == 0 and seen["key"] is None
    assert main(["serve", str(run_dir), "--api-key", " "]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["txl: error: --api-key must not be empty"]
    assert main(["serve", str(run_dir), "--api-key", "key "]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["txl: error: --api-key must not start or end with spaces (a header's value cannot)"]


# -- sessions ------------------------------------------------------------------------------------------------------


def test_a_text_read_in_two_session_calls_scores_as_one_pass(server, run):
    url, _ = server
    lengths = scoring_lengths(run.config, memory=True)
    tgt_len = lengths.tgt_len
    text = (Path(__file__).parent / "serve_helpers.py").read_text(encoding="utf-8")[: 2 * tgt_len + 40]
    ids = torch.as_tensor(run.vocab.encode(text), dtype=torch.long)
    cut = tgt_len + 1  # the first call's inputs fill one segment: the second starts where one pass does
    with httpx.Client(base_url=url, timeout=60) as c:
        session = c.post("/v1/sessions").json()
        sid = session["id"]
        assert sid.startswith("sess-") and session["tokens_read"] == 0
        first = c.post(f"/v1/sessions/{sid}/score", json={"text": text[:cut]}).json()
        second = c.post(f"/v1/sessions/{sid}/score", json={"text": text[cut:]}).json()
        assert first["tokens"][0]["logprob"] is None and second["tokens"][0]["logprob"] is not None
        read = [t["logprob"] for t in first["tokens"][1:] + second["tokens"]]
        one_pass = score_tokens(run.model, ids, lengths).losses
        assert read == pytest.approx((-one_pass).tolist(), abs=1e-5)
        # the memory mattered: the second part alone scores otherwise
        alone = c.post("/v1/score", json={"text": text[cut - 1 :]}).json()
        assert abs(alone["mean_loss"] - second["mean_loss"]) > 1e-5  # rounding is ~1e-9
        assert c.get(f"/v1/sessions/{sid}").json()["tokens_read"] == len(ids) == second["tokens_read"]
        assert c.delete(f"/v1/sessions/{sid}").json()["deleted"] is True
        assert c.get(f"/v1/sessions/{sid}").status_code == 404


def test_a_session_completion_continues_what_it_read(server, run):
    url, _ = server
    read, prompt = "def wr", "ap(te"
    with httpx.Client(base_url=url, timeout=60) as c:
        sid = c.post("/v1/sessions").json()["id"]
        c.post(f"/v1/sessions/{sid}/score", json={"text": read})
        out = c.post(
            f"/v1/sessions/{sid}/completions", json={"prompt": prompt, "max_tokens": 4, "temperature": 0}
        ).json()
        generated = out["choices"][0]["text"]
        assert generated == _reference(run, read + prompt, 4, temperature=0)
        assert out["session"]["tokens_read"] == len(read + prompt) + 4
        # what it generated joined the memory: the next text scores as the continuation of all of it
        after = c.post(f"/v1/sessions/{sid}/score", json={"text": "xt"}).json()
        whole = torch.as_tensor(run.vocab.encode(read + prompt + generated + "xt"), dtype=torch.long)
        lengths = scoring_lengths(run.config, memory=True)
        losses = score_tokens(run.model, whole, lengths).losses
        assert [t["logprob"] for t in after["tokens"]] == pytest.approx((-losses[-2:]).tolist(), abs=1e-5)
        # a completion with no prompt continues from the last token read
        more = c.post(f"/v1/sessions/{sid}/completions", json={"max_tokens": 3, "temperature": 0}).json()
        full = read + prompt + generated + "xt"
        assert more["choices"][0]["text"] == _reference(run, full, 3, temperature=0)


def test_session_errors_bounds_and_expiry(run_dir):
    settings = ServeSettings(max_sessions=2, session_ttl=0.6, max_prompt_chars=100)
    with TestClient(create_app(load_run(run_dir), run_dir=run_dir, settings=settings)) as c:
        for path in ("/v1/sessions/nope", "/v1/sessions/nope/score", "/v1/sessions/nope/completions"):
            if path.endswith("nope"):
                response = c.get(path)
            else:
                response = c.post(path, json={"text": "x"} if path.endswith("score") else {})
            assert response.status_code == 404 and response.json()["error"]["type"] == "not_found_error"
        assert c.delete("/v1/sessions/nope").status_code == 404
        a, b = (c.post("/v1/sessions").json()["id"] for _ in range(2))
        full = c.post("/v1/sessions")
        assert full.status_code == 429 and "max_sessions" in full.json()["error"]["message"]
        huge = c.post(f"/v1/sessions/{a}/score", content=b'{"text": "' + b"x" * 500_000 + b'"}')
        assert huge.status_code == 413
        assert c.post(f"/v1/sessions/{a}/score", json={"text": "x" * 101}).json()["error"]["param"] == "text"
        assert c.post(f"/v1/sessions/{a}/score", json={"text": ""}).status_code == 400
        assert c.post(f"/v1/sessions/{a}/completions", json={"n": 2}).json()["error"]["param"] == "n"
        assert c.get("/v1/health").json()["sessions"] == 2
        time.sleep(1.5)
        health = c.get("/v1/health").json()
        assert health["sessions"] == 0 and health["sessions_expired"] == 2
        assert c.get(f"/v1/sessions/{b}").status_code == 404
        assert c.post("/v1/sessions").status_code == 200


def test_a_compiled_server_gives_the_librarys_text_and_compiles_before_its_first_request(
    run, run_dir, compiled_steps_dir, monkeypatch
):
    """``txl serve --compiled``: the server compiles (or loads) the step for its batch's sizes when it starts,
    and those are the sizes its requests then decode with (one set of sizes in all); concurrent requests,
    greedy and sampled, decoded by the compiled step, give the library's eager text."""
    import txl.model.decode as decode
    from txl.model.compiled import CompiledStep

    sizes, calls = [], []
    made, called = decode.compiled_step, CompiledStep.__call__

    def making(step_sizes, weights):
        sizes.append(step_sizes)
        return made(step_sizes, weights)

    def counted(self, *args):
        calls.append(1)
        return called(self, *args)

    monkeypatch.setattr(decode, "compiled_step", making)
    monkeypatch.setattr(CompiledStep, "__call__", counted)
    settings = ServeSettings(max_tokens=400, max_batch=4, compiled=True)
    app = create_app(load_run(run_dir), run_dir=run_dir, settings=settings)
    with live_server(app) as url:
        wait_for(
            lambda: len(sizes) > 0 and len(calls) > 0, timeout=120, what="the warm-up"
        )  # the warm-up, before any request
        warm = len(calls)
        bodies = [REQUESTS[0], REQUESTS[1], REQUESTS[2], REQUESTS[4]]
        got: list[str | None] = [None] * len(bodies)

        def send(i: int) -> None:
            got[i] = _text(_completion(url, bodies[i]))

        threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
    for body, text in zip(bodies, got, strict=True):
        settings_of = {k: body[k] for k in ("temperature", "top_k", "top_p") if k in body}
        want = _reference(run, body["prompt"], body["max_tokens"], seed=body.get("seed", 0), **settings_of)
        assert text == want
    assert len(set(sizes)) == 1, "the requests decoded with other sizes than the warm-up compiled"
    assert len(calls) >= warm + 59  # the requests' steps went through it (the longest: 60 tokens, 59 steps)
