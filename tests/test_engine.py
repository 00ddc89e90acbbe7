"""The decoding engine (``txl.inference.Engine``) and every face of it: a sampled request with a seed gives the
same text alone, first and last in a batch of four with other prompts and settings, through ``generate``,
``stream``, ``txl serve`` and the harness; the engine's own contract (a queue, seeds drawn once, requests
that end early, park and resume, a request's memory, one prefill for the choices of one prompt, its errors);
and the row operations of ``KVCache`` against the cache's whole memory and the rows stepped as they were."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from serve_helpers import train_char_run
from txl import Memory, TransformerXL, TransformerXLConfig

# -- one seeded request in four faces --------------------------------------------------------------------------


@dataclass(frozen=True)
class Ask:
    """A request as each face spells it: its prompt, tokens, temperature (0: greedy), top-k, seed, and whether
    it ends at a newline (a stop id for the token faces, a stop string for the text ones)."""

    prompt: str
    new: int
    temperature: float
    top_k: int | None = None
    seed: int = 0
    stop_at_newline: bool = False


TARGET = Ask("def wrap(text, width", 24, 1.0, seed=11)
SHORTER = [  # neighbours with shorter prompts (the target is the longest: the first row wherever rows sort)
    Ask("import ", 30, 0.0),
    Ask("x = ", 18, 0.7, top_k=12, seed=3),
    Ask("# ", 40, 1.3, seed=5, stop_at_newline=True),
]
LONGER = [  # and longer (the target is the shortest: the last row)
    Ask("class TextWrapper:\n    def ", 30, 0.0),
    Ask("    return '\\n'.join(lines) + ", 18, 0.7, top_k=12, seed=3),
    Ask("def fill(text, width=70, **kwargs):", 40, 1.3, seed=5, stop_at_newline=True),
]


@pytest.fixture(scope="module")
def char_run(tmp_path_factory) -> Path:
    return train_char_run(tmp_path_factory.mktemp("engine"), steps=30)


def _token_face(run, asks: list[Ask], *, streamed: bool) -> list[str]:
    from txl.inference import PAD_ID, SamplingParams, generate, stream

    newline = int(run.vocab.encode("\n")[0])
    prompts = [torch.as_tensor(run.vocab.encode(a.prompt), dtype=torch.long) for a in asks]
    params = [
        SamplingParams(
            max_new_tokens=a.new,
            temperature=a.temperature,
            top_k=a.top_k,
            seed=a.seed,
            stop_ids=(newline,) if a.stop_at_newline else None,
        )
        for a in asks
    ]
    if streamed:
        new = torch.stack([step.tokens for step in stream(run.model, prompts, params)], dim=1)
    else:
        new = generate(run.model, prompts, params).new_tokens
    return [run.vocab.decode([t for t in row.tolist() if t != PAD_ID]) for row in new]


def _serve_face(run, run_dir: Path, asks: list[Ask]) -> list[str]:
    """The requests sent to a live server, the first alone at the model (its prefill held at a gate) while
    the others arrive; they join its batch, which holds all four at once."""
    import httpx

    from serve_helpers import live_server, wait_for
    from txl.serve.app import create_app

    gate = threading.Event()
    calls = []
    original = run.model.forward

    def held(*args, **kwargs):
        calls.append(1)
        assert gate.wait(timeout=60)
        return original(*args, **kwargs)

    run.model.forward = held
    app = create_app(run, run_dir=run_dir)
    texts: list[str | None] = [None] * len(asks)

    def send(url: str, i: int) -> None:
        a = asks[i]
        body = {"prompt": a.prompt, "max_tokens": a.new, "temperature": a.temperature, "seed": a.seed}
        body.update({"top_k": a.top_k} if a.top_k else {})
        body.update({"stop": ["\n"]} if a.stop_at_newline else {})
        with httpx.Client(base_url=url, timeout=120) as c:
            response = c.post("/v1/completions", json=body)
        assert response.status_code == 200, response.text
        texts[i] = response.json()["choices"][0]["text"]

    try:
        with live_server(app) as url, httpx.Client(base_url=url) as c:
            scheduler = app.state.txl.scheduler
            step, most = scheduler.batch.step, []

            def counting(flush) -> None:
                most.append(scheduler.rows_in_use)
                step(flush)

            scheduler.batch.step = counting
            threads = [threading.Thread(target=send, args=(url, i)) for i in range(len(asks))]
            threads[0].start()
            wait_for(lambda: calls, what="the first request to reach the model")
            for i, thread in enumerate(threads[1:], start=2):  # one after the other: they queue in order
                thread.start()
                wait_for(lambda i=i: c.get("/v1/health").json()["admitted"] == i, what="the request to queue")
            gate.set()
            for thread in threads:
                thread.join(timeout=120)
    finally:
        run.model.forward = original
    assert max(most) == len(asks)  # they shared the batch
    return [t for t in texts if t is not None]


def _harness_face(run_dir: Path, asks: list[Ask]) -> list[str]:
    lm_eval = pytest.importorskip("lm_eval", reason="the harness needs lm-evaluation-harness")
    del lm_eval
    from lm_eval.api.instance import Instance

    from txl.harness import TxlLM

    lm = TxlLM(run=str(run_dir), batch_size=4)
    requests = []
    for i, a in enumerate(asks):
        kwargs = {"until": ["\n"] if a.stop_at_newline else [], "max_gen_toks": a.new}
        kwargs.update({"do_sample": True, "temperature": a.temperature} if a.temperature else {})
        requests.append(Instance("generate_until", {}, (a.prompt, kwargs), i))
    return lm.generate_until(requests)


@pytest.mark.parametrize("face", ["generate", "stream", "serve", "harness"])
def test_a_seeded_request_samples_the_same_alone_first_and_last_in_a_batch(face, char_run):
    """The target samples (temperature 1) from its own seed: alone, first of four (the longest prompt) and
    last of four (the shortest), beside greedy and sampled neighbours with other prompts, lengths, filters
    and stops, its text is the same."""
    from txl.runs import load_run

    run = load_run(char_run)

    def texts(asks: list[Ask]) -> list[str]:
        if face in ("generate", "stream"):
            return _token_face(run, asks, streamed=face == "stream")
        if face == "serve":
            return _serve_face(run, char_run, asks)
        return _harness_face(char_run, asks)

    (alone,) = texts([TARGET])
    first = texts([TARGET, *SHORTER])
    last = texts([*LONGER, TARGET])
    assert len(alone) > 10 and first[0] == alone and last[-1] == alone
    assert first[1] and last[0]  # the greedy neighbours ran beside it


# -- the engine ------------------------------------------------------------------------------------------------

V = 31


def _model(**changes) -> TransformerXL:
    fields = dict(
        vocab_size=V, n_layer=2, n_head=2, d_head=6, d_model=12, d_inner=24, mem_len=10, init_std=0.3
    )
    fields.update(changes)
    torch.manual_seed(0)
    return TransformerXL(TransformerXLConfig(**fields)).to(torch.float64).eval()


def _prompts(*lengths: int, seed: int = 4) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g) for n in lengths]


def _drain(engine) -> dict[int, list]:
    """Step until done: each request's events."""
    out: dict[int, list] = {}
    while engine.unfinished:
        for event in engine.step():
            out.setdefault(event.request, []).append(event)
    return out


def _alone(model, prompt, params, **settings):
    from txl.inference import DecodeSettings, generate

    return generate(model, [prompt], params, settings=DecodeSettings(**settings), return_scores=True)


@pytest.mark.parametrize("memory", [True, False], ids=["cache", "window"])
def test_a_queue_of_requests_through_two_rows_each_as_alone(memory):
    """Five requests through two rows: they wait, take a row as one leaves (at its length or its stop id),
    and each gets the tokens and log-probabilities of its prompt alone."""
    from txl.inference import DecodeSettings, Engine, SamplingParams

    model = _model() if memory else _model(attention="absolute")
    prompts = _prompts(3, 12, 1, 7, 25)
    params = [
        SamplingParams(max_new_tokens=n, temperature=t, top_p=p, seed=s)
        for n, t, p, s in [
            (6, 1.0, None, 1),
            (9, 0.0, None, 0),
            (4, 0.8, 0.9, 2),
            (12, 1.2, None, 3),
            (5, 1, 0.5, 4),
        ]
    ]
    stop = _alone(model, prompts[3], params[3], context=6).new_tokens[0, 2].item()
    params[3] = SamplingParams(max_new_tokens=12, temperature=1.2, seed=3, stop_ids=(stop,))
    engine = Engine(model, DecodeSettings(rows=2, context=6))
    ids = [engine.add(p, q) for p, q in zip(prompts, params, strict=True)]
    assert engine.waiting == 5 and engine.rows_in_use == 0
    out = _drain(engine)
    for request, prompt, p in zip(ids, prompts, params, strict=True):
        alone = _alone(model, prompt, p, context=6)
        n = int(alone.lengths[0])
        assert [e.token for e in out[request]] == alone.new_tokens[0, :n].tolist()
        torch.testing.assert_close(
            torch.stack([e.log_probs for e in out[request]]), alone.scores[0, :n], atol=1e-12, rtol=0
        )
        assert out[request][-1].finish == ("stop" if alone.finished[0] else "length")
        assert all(e.finish is None for e in out[request][:-1])
    assert out[ids[3]][-1].finish == "stop" and len(out[ids[3]]) < 12  # one really stopped early


def test_a_request_without_a_seed_draws_one_when_added():
    """Without a seed, a request's generator is seeded from the engine's generator when it is added: the
    same adds in the same order sample the same, and what is added after it does not change it."""
    from txl.inference import Engine, SamplingParams

    model = _model()
    prompts = _prompts(4, 6)
    params = SamplingParams(max_new_tokens=10)

    def tokens(*added: int) -> list[list[int]]:
        engine = Engine(model, generator=torch.Generator().manual_seed(21))
        ids = [engine.add(prompts[i], params) for i in added]
        out = _drain(engine)
        return [[e.token for e in out[i]] for i in ids]

    one = tokens(0)
    assert tokens(0) == one and tokens(0, 1)[0] == one[0]
    assert tokens(1, 0)[1] != one[0]  # the second seed drawn is another one
    from_global = []
    for _ in range(2):  # without a generator, torch's global one
        torch.manual_seed(5)
        engine = Engine(model)
        request = engine.add(prompts[0], params)
        from_global.append([e.token for e in _drain(engine)[request]])
    assert from_global[0] == from_global[1]


@pytest.mark.parametrize("memory", [True, False], ids=["cache", "window"])
def test_a_parked_request_resumes_exactly_where_it_stopped(memory):
    """A request parked after 4 tokens (its row freed, another request decoding meanwhile) and resumed later
    gives the tokens and log-probabilities of its prompt alone; parked, its memory is kept."""
    from txl.inference import DecodeSettings, Engine, SamplingParams

    model = _model() if memory else _model(mem_len=0)
    prompts = _prompts(5, 3)
    params = SamplingParams(max_new_tokens=14, temperature=1.0, seed=8)
    other = SamplingParams(max_new_tokens=6, temperature=0.0)
    engine = Engine(model, DecodeSettings(rows=1, context=7))
    target = engine.add(prompts[0], params)
    got: list = []
    while len(got) < 4:
        got += engine.step()
    kept = engine.memory(target)
    engine.park(target)
    assert engine.parked == 1 and engine.rows_in_use == 0 and not engine.unfinished
    if memory:
        assert not any(state.is_inference() for state in kept.states)  # ordinary tensors, as generate's
        alone_memory = _alone(model, prompts[0], params.__class__(max_new_tokens=4, seed=8)).memory
        torch.testing.assert_close(
            engine.memory(target).states[0][0], alone_memory.states[0][0], atol=1e-12, rtol=0
        )
        assert kept is not None
    else:
        assert kept is None and engine.memory(target) is None
    neighbour = engine.add(prompts[1], other)
    between = _drain(engine)[neighbour]
    assert len(between) == 6  # the neighbour had the only row meanwhile
    engine.resume(target)
    again = engine.step() + engine.step()  # two more tokens, then parked once more
    engine.park(target)
    engine.resume(target)
    rest = _drain(engine)[target]
    alone = _alone(model, prompts[0], params, context=7)
    events = got + again + rest
    assert [e.token for e in events] == alone.new_tokens[0].tolist()
    torch.testing.assert_close(
        torch.stack([e.log_probs for e in events]), alone.scores[0], atol=1e-10, rtol=0
    )


def test_finish_ends_a_request_and_frees_its_row_for_the_next():
    from txl.inference import DecodeSettings, Engine, SamplingParams

    model = _model()
    prompts = _prompts(4, 4, 2)
    engine = Engine(model, DecodeSettings(rows=1))
    first = engine.add(prompts[0], SamplingParams(max_new_tokens=50, temperature=0))
    waiting = engine.add(prompts[1], SamplingParams(max_new_tokens=3, temperature=0))
    gone = engine.add(prompts[2], SamplingParams(max_new_tokens=3, temperature=0))
    engine.finish(gone)  # ended while waiting: it never runs
    events = engine.step() + engine.step()
    assert [e.request for e in events] == [first, first]
    engine.finish(first)  # as a stop string would
    assert engine.rows_in_use == 0
    out = _drain(engine)
    assert set(out) == {waiting} and len(out[waiting]) == 3
    with pytest.raises(ValueError, match="no request"):
        engine.memory(first)


def test_the_choices_of_one_prompt_share_one_prefill(monkeypatch):
    """Requests added with the same prompt object and no memory are prefilled once (one forward of the
    prompt) and each samples from its own seed as alone."""
    from txl.inference import Engine, SamplingParams

    model = _model()
    (prompt,) = _prompts(6)
    calls = []
    forward = TransformerXL.forward
    monkeypatch.setattr(
        TransformerXL,
        "forward",
        lambda self, tokens, **kw: calls.append(tokens.shape) or forward(self, tokens, **kw),
    )
    engine = Engine(model)
    ids = [engine.add(prompt, SamplingParams(max_new_tokens=8, seed=s)) for s in (1, 2, 3)]
    out = _drain(engine)
    assert calls == [(1, 6)]
    monkeypatch.undo()
    for request, seed in zip(ids, (1, 2, 3), strict=True):
        alone = _alone(model, prompt, SamplingParams(max_new_tokens=8, seed=seed))
        assert [e.token for e in out[request]] == alone.new_tokens[0].tolist()
    assert len({tuple(e.token for e in out[i]) for i in ids}) == 3


def test_the_engine_refuses_what_it_cannot_do():
    from txl.inference import DecodeSettings, Engine, SamplingParams

    model = _model()
    engine = Engine(model, DecodeSettings(rows=2))
    memory = Memory.zeros(model.config, 2, 3, dtype=torch.float64)
    cases = [
        (lambda: engine.add([1, 2], {"max_new_tokens": 3}), "params must be a SamplingParams"),
        (lambda: engine.add([1, 2], SamplingParams(max_new_tokens=0)), "max_new_tokens must be at least 1"),
        (lambda: engine.add([1, 2], SamplingParams(stop_ids=[V])), "stop_ids must be token ids in"),
        (lambda: engine.add([], SamplingParams()), "not empty"),
        (lambda: engine.add([1, V], SamplingParams()), "out of range"),
        (lambda: engine.add(torch.zeros(2, 2, dtype=torch.long), SamplingParams()), "1-D"),
        (lambda: engine.add([1], SamplingParams(), memory=memory), "memory has 2 batch rows"),
        (
            lambda: Engine(_model(mem_len=0)).add([1], SamplingParams(), memory=memory.select([0])),
            "the model has none",
        ),
        (lambda: Engine(model, SamplingParams()), "settings must be a DecodeSettings"),
        (lambda: engine.park(99), "no request 99"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message):
            call()
    waiting = engine.add([1, 2], SamplingParams(max_new_tokens=2))
    with pytest.raises(ValueError, match="not running"):
        engine.park(waiting)
    with pytest.raises(ValueError, match="not parked"):
        engine.resume(waiting)
    with pytest.raises(ValueError, match="has no row yet"):
        engine.memory(waiting)


# -- the row operations of KVCache -----------------------------------------------------------------------------


def test_kvcache_row_operations_against_the_whole_memory_and_the_rows_as_they_were():
    """``row_memory`` is a row's own part of ``memory()`` (within its reach, before padding it did not
    own); ``can_join`` says what ``put_rows`` takes; ``keep_rows`` keeps rows that step on exactly as in the
    whole cache; ``put_rows`` with ``source_rows`` gives one source row to several rows."""
    from txl.model import KVCache
    from txl.model.decode import Decoder

    model = _model(mem_len=8)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, V, (3, 5), generator=g)
    starts = torch.zeros(3, 5, dtype=torch.bool)
    starts[1, 2] = True  # row 1's document begins at its third token: its reach is 3
    cache = KVCache(model.config, batch_size=3, dtype=torch.float64)
    model(tokens, cache=cache, starts=starts)
    whole = cache.memory()
    assert cache.full_reach().tolist() == [5, 3, 5]
    for row, reach in enumerate([5, 3, 5]):
        own = cache.row_memory(row)
        for mine, theirs in zip(own.states, whole.states, strict=True):
            assert torch.equal(mine[0], theirs[row, 5 - reach :])
    shorter = cache.row_memory(2, reach=2, drop=1)  # its last 2 positions before the last one written
    assert torch.equal(shorter.states[0][0], whole.states[0][2, 2:4])
    assert cache.can_join(3, 5) and not cache.can_join(4, 5) and not cache.can_join(1, 6)
    kept = cache.keep_rows([2, 0])
    assert kept.batch_size == 2 and kept.full_reach().tolist() == [5, 5]
    step = torch.randint(0, V, (3,), generator=g)
    both = Decoder(model, cache).step(step)  # (3, V)
    alone = Decoder(model, kept).step(step[[2, 0]])
    torch.testing.assert_close(alone, both[[2, 0]], atol=1e-12, rtol=0)
    target = KVCache(model.config, memory=Memory.zeros(model.config, 3, 8, dtype=torch.float64))
    target.mark_projected()
    target.put_rows([0, 2], kept, source_rows=[1, 1])  # row 0 of the whole cache, twice
    for row in (0, 2):
        mine, theirs = target.row_memory(row).states[1], cache.row_memory(0).states[1]
        torch.testing.assert_close(mine, theirs, atol=1e-12, rtol=0)
    assert target.full_reach().tolist() == [6, 0, 6]
