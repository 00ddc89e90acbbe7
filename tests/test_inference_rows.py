"""The decoding core's rows (``txl.inference.rows``): rows that join a running batch and leave it mid-decode
give each row exactly the tokens and log-probabilities of its prompt generated alone (greedy and seeded
sampling; with memory through one shared key/value cache, without through recomputed windows; after a
memory with a per-row reach); and a ragged batch equals the segment-wise model computed without the cache."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from txl import Memory, TransformerXL, TransformerXLConfig
from txl.inference import DecodeSettings, SamplingParams, draw, generate
from txl.inference.rows import Prefilled, RowBatch, WindowRows, rows_for

V = 29


def _model(**changes) -> TransformerXL:
    fields = dict(
        vocab_size=V, n_layer=2, n_head=2, d_head=6, d_model=12, d_inner=24, mem_len=8, init_std=0.3
    )
    fields.update(changes)
    torch.manual_seed(0)
    return TransformerXL(TransformerXLConfig(**fields)).to(torch.float64).eval()


@dataclass
class Request:
    prompt: torch.Tensor
    arrives: int  # the step at which it asks for a row
    new: int  # tokens to generate
    seed: int
    memory: Memory | None = None


def _requests(*, with_memory: bool, model: TransformerXL) -> list[Request]:
    g = torch.Generator().manual_seed(5)
    lengths = [3, 11, 1, 6, 17, 4]  # 11 and 17 span several prefill chunks (mem_len 8) or windows (context 6)
    arrivals = [0, 0, 2, 3, 3, 7]
    news = [5, 9, 4, 7, 3, 6]
    requests = [
        Request(torch.randint(0, V, (n,), generator=g), at, new, seed=40 + i)
        for i, (n, at, new) in enumerate(zip(lengths, arrivals, news, strict=True))
    ]
    if with_memory:  # a memory with a per-row reach: the row that read 2 tokens of a ragged batch
        earlier = generate(
            model,
            [torch.randint(0, V, (n,), generator=g) for n in (2, 9)],
            SamplingParams(max_new_tokens=1, temperature=0),
        )
        assert earlier.memory is not None and earlier.memory.reach is not None
        requests[3].memory = earlier.memory.select([0])
        assert requests[3].memory.reach.tolist() == [2]
    return requests


def _serve(rows: RowBatch | WindowRows, requests: list[Request], settings: SamplingParams):
    """Drive ``rows`` as a server would: requests join free rows when they arrive (or when a row frees),
    every step feeds one token per row, a row leaves when its request has its tokens."""
    waiting = list(range(len(requests)))
    placed: dict[int, int] = {}  # row -> request
    log_probs: dict[int, torch.Tensor] = {}
    generators = {i: torch.Generator().manual_seed(r.seed) for i, r in enumerate(requests)}
    out = {i: ([], [], None) for i in range(len(requests))}
    step, joins_mid_decode = 0, 0
    while waiting or placed:
        for i in [i for i in waiting if requests[i].arrives <= step]:
            free = [r for r in range(rows.size) if r not in placed]
            if not free:
                break
            prefilled = rows.prefill(requests[i].prompt, requests[i].memory)
            assert isinstance(prefilled, Prefilled) and prefilled.rows == 1
            rows.join(free[0], prefilled)
            joins_mid_decode += bool(placed)
            placed[free[0]], log_probs[free[0]] = i, prefilled.log_probs[0]
            waiting.remove(i)
        tokens = torch.zeros(rows.size, dtype=torch.long)
        for r, i in list(placed.items()):
            token = draw(log_probs[r][None], settings, generator=generators[i])[0]
            out[i][0].append(int(token))
            out[i][1].append(log_probs[r])
            tokens[r] = token
            if len(out[i][0]) == requests[i].new:
                out[i] = (out[i][0], out[i][1], rows.row_memory(r))
                rows.free(r)
                del placed[r]
        if placed:
            stepped = rows.step(tokens)  # (R, V)
            assert stepped.shape == (rows.size, V)
            for r in placed:
                log_probs[r] = stepped[r]
        step += 1
    assert joins_mid_decode >= 3  # rows really joined a running batch
    return out


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("memory", [True, False], ids=["RowBatch", "WindowRows"])
def test_rows_that_join_and_leave_mid_decode_equal_their_prompt_alone(temperature, memory):
    model = _model() if memory else _model(attention="absolute")
    settings = SamplingParams(temperature=temperature, top_p=0.95 if temperature else None)
    decode = DecodeSettings(context=6)
    rows = rows_for(model, DecodeSettings(context=6, rows=3))
    assert isinstance(rows, RowBatch if memory else WindowRows)
    requests = _requests(with_memory=memory, model=model)
    out = _serve(rows, requests, settings)
    for i, request in enumerate(requests):
        tokens, log_probs, row_memory = out[i]
        alone = generate(
            model,
            [request.prompt],
            SamplingParams(
                max_new_tokens=request.new, temperature=temperature, top_p=settings.top_p, seed=request.seed
            ),
            settings=DecodeSettings(context=decode.context),
            memory=request.memory,
            return_scores=True,
        )
        assert tokens == alone.new_tokens[0].tolist(), i
        torch.testing.assert_close(torch.stack(log_probs), alone.scores[0], atol=1e-12, rtol=0)
        if memory:  # the row's own memory is what the prompt alone carries on with
            assert alone.memory is not None and row_memory is not None
            reach = int(alone.memory.full_reach()[0])
            for mine, theirs in zip(row_memory.states, alone.memory.states, strict=True):
                torch.testing.assert_close(mine[0], theirs[0, theirs.shape[1] - reach :], atol=1e-12, rtol=0)
        else:
            assert row_memory is None and alone.memory is None


def _segmentwise(model: TransformerXL, prompt: torch.Tensor, *, chunk: int, n: int):
    """Greedy tokens and log-probabilities of the segment-wise model on the memory path, without the cache:
    the prompt in chunks of ``chunk`` tokens, then one token per segment, each after the memory the last
    segment left (``model.forward(tokens, memory=...)``)."""
    memory, out = None, None
    for start in range(0, len(prompt), chunk):
        out = model(prompt[None, start : start + chunk], memory=memory)
        memory = out.memory
    tokens, scores = [], []
    log_probs = out.log_probs[0, -1]
    for _ in range(n):
        token = int(torch.argmax(log_probs))
        tokens.append(token)
        scores.append(log_probs)
        out = model(torch.tensor([[token]]), memory=memory)
        memory, log_probs = out.memory, out.log_probs[0, -1]
    return tokens, torch.stack(scores)


@torch.no_grad()
def test_a_ragged_prompt_one_longer_than_the_chunk_is_prefilled_in_chunks():
    """A prompt chunk longer than the memory and a ragged batch whose longest prompt is one token longer than
    the chunk: that row's prompt runs in two chunks (as alone), never as one left-padded segment."""
    model = _model(mem_len=4)
    chunk = 6
    g = torch.Generator().manual_seed(3)
    rows = [torch.randint(0, V, (n,), generator=g) for n in (3, chunk + 1, chunk)]
    settings = SamplingParams(max_new_tokens=5, temperature=0)
    gen = generate(model, rows, settings, settings=DecodeSettings(prompt_chunk=chunk), return_scores=True)
    for r, row in enumerate(rows):
        tokens, scores = _segmentwise(model, row, chunk=chunk, n=5)
        assert gen.new_tokens[r].tolist() == tokens, r
        torch.testing.assert_close(gen.scores[r], scores, atol=1e-10, rtol=0)


def test_rows_refuse_what_they_cannot_do():
    model = _model()
    rows = RowBatch(model, DecodeSettings(rows=2))
    with pytest.raises(ValueError, match="no row has joined"):
        rows.step(torch.zeros(2, dtype=torch.long))
    first = rows.prefill(torch.tensor([1, 2, 3]))
    rows.join(1, first)
    with pytest.raises(ValueError, match="in use"):
        rows.join(1, rows.prefill(torch.tensor([4])))
    with pytest.raises(ValueError, match="integers in"):
        rows.join(2, rows.prefill(torch.tensor([4])))
    with pytest.raises(ValueError, match=r"tokens must be \(2,\)"):
        rows.step(torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="not in use"):
        rows.free(0)
    with pytest.raises(ValueError, match="out of range"):
        rows.prefill(torch.tensor([V]))
    with pytest.raises(ValueError, match="memory has 1 batch rows, the prompt 2"):
        rows.prefill(torch.tensor([[1, 2], [3, 4]]), Memory.zeros(model.config, 1, 3, dtype=torch.float64))
    with pytest.raises(ValueError, match="use WindowRows"):
        RowBatch(_model(attention="absolute"), DecodeSettings(rows=2))
    window = WindowRows(_model(attention="absolute"), DecodeSettings(rows=2))
    with pytest.raises(ValueError, match="the model has none"):
        window.prefill(torch.tensor([1]), Memory.zeros(model.config, 1, 3))
    with pytest.raises(ValueError, match="made by RowBatch"):
        window.join(0, first)
    with pytest.raises(ValueError, match="rows must be a positive integer"):
        WindowRows(model, DecodeSettings(rows=0))


def test_a_batch_that_began_whole_takes_a_later_row():
    """Every row joined at once (the batch takes the prefilled cache, shorter than the memory); one leaves
    and a row with a longer prompt joins: the batch widens its cache, and both rows still equal alone."""
    model = _model()
    g = torch.Generator().manual_seed(9)
    first = [torch.randint(0, V, (n,), generator=g) for n in (2, 3)]
    later = torch.randint(0, V, (13,), generator=g)
    rows = RowBatch(model, DecodeSettings(rows=2))
    prefilled = rows.prefill(first)
    rows.join([0, 1], prefilled)
    assert rows.cache is prefilled.cache and rows.cache.length == 3  # no copy, no wider than needed
    tokens = torch.argmax(prefilled.log_probs, dim=-1)
    got = {1: [int(tokens[1])], 2: []}
    seen = {1: [prefilled.log_probs[1]], 2: []}
    log_probs = rows.step(tokens)
    rows.free(0)
    joined = rows.prefill(later)
    rows.join(0, joined)
    assert rows.cache.length == model.config.mem_len  # widened
    current = {2: joined.log_probs[0], 1: log_probs[1]}
    for _ in range(6):
        tokens = torch.stack([torch.argmax(current[2]), torch.argmax(current[1])])  # rows 0 and 1
        for request, token in ((2, tokens[0]), (1, tokens[1])):
            got[request].append(int(token))
            seen[request].append(current[request])
        stepped = rows.step(tokens)
        current = {2: stepped[0], 1: stepped[1]}
    for request, prompt in ((1, first[1]), (2, later)):
        alone = generate(
            model,
            [prompt],
            SamplingParams(max_new_tokens=len(got[request]), temperature=0),
            return_scores=True,
        )
        assert got[request] == alone.new_tokens[0].tolist()
        torch.testing.assert_close(torch.stack(seen[request]), alone.scores[0], atol=1e-12, rtol=0)


def test_one_prefill_joins_several_rows_as_choices():
    """One prefilled prompt joins two rows (two choices of one request, each with its own seed): each row
    samples what the prompt alone samples from its generator."""
    model = _model()
    prompt = torch.randint(0, V, (10,), generator=torch.Generator().manual_seed(2))
    settings = SamplingParams(temperature=1.0)
    rows = RowBatch(model, DecodeSettings(rows=3))
    prefilled = rows.prefill(prompt)
    rows.join(2, prefilled)
    rows.join(0, prefilled)
    generators = {0: torch.Generator().manual_seed(7), 2: torch.Generator().manual_seed(8)}
    current = {r: prefilled.log_probs[0] for r in generators}
    got: dict[int, list[int]] = {0: [], 2: []}
    for _ in range(8):
        tokens = torch.zeros(3, dtype=torch.long)
        for r, g in generators.items():
            tokens[r] = draw(current[r][None], settings, generator=g)[0]
            got[r].append(int(tokens[r]))
        stepped = rows.step(tokens)
        current = {r: stepped[r] for r in generators}
    for r, seed in ((0, 7), (2, 8)):
        alone = generate(
            model,
            prompt,
            SamplingParams(max_new_tokens=8, seed=seed),
        )
        assert got[r] == alone.new_tokens[0].tolist()
    assert got[0] != got[2]
    whole = RowBatch(model, DecodeSettings(rows=1))
    first = whole.prefill(prompt)
    whole.join(0, first)
    whole.free(0)
    with pytest.raises(ValueError, match="became the batch's cache"):
        whole.join(0, first)


def test_a_freed_row_remembers_nothing():
    """A row that leaves keeps no reach: the batch's memory gives it none (its rows in use keep theirs, one
    position per token they have read), and it has no memory of its own to carry on with."""
    model = _model()
    rows = RowBatch(model, DecodeSettings(rows=3))
    rows.join(0, rows.prefill(torch.tensor([1, 2, 3])))
    rows.join(1, rows.prefill(torch.tensor([4, 5, 6, 7, 8])))
    rows.step(torch.tensor([1, 2, 0]))
    before = rows.memory()
    assert before is not None and before.reach is not None
    assert before.reach.tolist()[:2] == [3 + 1, 5 + 1]  # prompt and one token each (mem_len 8)
    assert rows.row_memory(1) is not None
    rows.free(1)
    after = rows.memory()
    assert after is not None and after.reach is not None
    assert after.reach.tolist() == [4, 0, before.reach.tolist()[2]]
    assert rows.row_memory(1) is None
    for kept, was in zip(after.states, before.states, strict=True):  # the other rows are untouched
        torch.testing.assert_close(kept, was, atol=0, rtol=0)
