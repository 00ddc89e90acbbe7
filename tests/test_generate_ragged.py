"""Prompts of different lengths as one batch (issue 20, point 3): left-padded rows that each start at their
first prompt token, decoded in lockstep, give every row the tokens and log-probabilities of its prompt
generated alone: greedy and sampled (one generator per row), after a memory, with prompts longer than a
prefill chunk, and on the memoryless window path; the crash of two prompts sorted by length is gone."""

from __future__ import annotations

import pytest
import torch

from txl import TransformerXL, TransformerXLConfig
from txl.inference import PAD_ID, DecodeSettings, SamplingParams, generate, stream
from txl.model.decode import Decoder

V = 43


def _model(**changes) -> TransformerXL:
    fields = dict(
        vocab_size=V, n_layer=2, n_head=3, d_head=8, d_model=16, d_inner=32, mem_len=12, init_std=0.3
    )
    fields.update(changes)
    torch.manual_seed(0)
    return TransformerXL(TransformerXLConfig(**fields)).to(torch.float64).eval()


def _rows(lengths, seed=2):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g) for n in lengths]


def _seeds(n, base=100):
    return [base + r for r in range(n)]


def _split(settings):
    """The keyword arguments of the old single settings value as (params fields, decode fields)."""
    decode = {k: settings[k] for k in ("span", "context", "prompt_chunk") if k in settings}
    return {k: v for k, v in settings.items() if k not in decode}, DecodeSettings(**decode)


def _assert_rows_as_alone(model, rows, *, seeds=None, **settings):
    """generate(rows) as one batch against each row alone (the same seed per row)."""
    sampling, decode = _split(settings)
    gen = generate(
        model,
        rows,
        SamplingParams(**sampling)
        if seeds is None
        else [SamplingParams(**sampling, seed=s) for s in _seeds(len(rows))],
        settings=decode,
        return_scores=True,
    )
    width = max(len(row) for row in rows)
    for r, row in enumerate(rows):
        seed = None if seeds is None else _seeds(len(rows))[r]
        alone = generate(
            model, [row], SamplingParams(**sampling, seed=seed), settings=decode, return_scores=True
        )
        assert torch.equal(gen.new_tokens[r], alone.new_tokens[0]), (r, settings)
        torch.testing.assert_close(gen.scores[r], alone.scores[0], atol=1e-12, rtol=0)
        assert (gen.tokens[r, : width - len(row)] == PAD_ID).all() and torch.equal(
            gen.tokens[r, width - len(row) : width], row
        )
    return gen


@pytest.mark.parametrize(
    "settings",
    [dict(temperature=0), dict(temperature=1.0), dict(temperature=0.8, top_k=5), dict(top_p=0.7)],
    ids=["greedy", "sampled", "top_k", "top_p"],
)
def test_two_prompts_of_different_lengths_in_every_sampling_mode(settings):
    """The reported crash: generate(model, [p1, p2]) with len(p1) < len(p2) raised in every mode (the row
    order of the grouped path was None). Now one batch; each row equals its prompt alone, sampled with one
    generator per row; one shared generator runs too and is reproducible."""
    model = _model()
    rows = _rows([3, 7])
    gen = _assert_rows_as_alone(model, rows, seeds=True, max_new_tokens=15, **settings)
    assert gen.new_tokens.shape == (2, 15) and gen.memory.reach.tolist() == [12, 12]  # mem_len 12
    shared = [
        generate(
            model,
            rows,
            SamplingParams(max_new_tokens=6, **settings, seed=4),
        )
        for _ in "ab"
    ]
    assert shared[0].new_tokens.shape == (2, 6) and torch.equal(shared[0].new_tokens, shared[1].new_tokens)


def test_eight_lengths_run_as_one_batch_in_lockstep(monkeypatch):
    """8 prompts of 8 lengths (all within one prefill chunk): one prefill of the left-padded batch with
    starts, then one step of all 8 rows per token; each row as alone; the memory keeps each row's own."""
    model = _model(mem_len=16)
    rows = _rows([1, 2, 3, 5, 8, 11, 13, 16])
    calls = []
    forward, step = TransformerXL.forward, Decoder.step
    monkeypatch.setattr(
        TransformerXL,
        "forward",
        lambda self, tokens, **kw: calls.append(("prefill", tokens.shape)) or forward(self, tokens, **kw),
    )
    monkeypatch.setattr(
        Decoder,
        "step",
        lambda self, token, **kw: calls.append(("step", token.shape)) or step(self, token, **kw),
    )
    gen = generate(model, rows, SamplingParams(max_new_tokens=10, temperature=0))
    assert calls == [("prefill", (8, 16))] + [("step", (8,))] * 9
    monkeypatch.undo()
    _assert_rows_as_alone(model, rows, max_new_tokens=10, temperature=0)
    assert gen.memory.length == 16 and gen.memory.reach.tolist() == [
        min(n + 9, 16) for n in (1, 2, 3, 5, 8, 11, 13, 16)
    ]
    more = generate(
        model, gen.tokens[:, -1:], SamplingParams(max_new_tokens=4, temperature=0), memory=gen.memory
    )
    for r, row in enumerate(rows):
        alone = generate(model, [row], SamplingParams(max_new_tokens=14, temperature=0))
        assert torch.equal(more.new_tokens[r], alone.new_tokens[0, 10:])


@pytest.mark.parametrize("variant", [{}, {"same_length": True, "clamp_len": 5, "pre_norm": True}])
def test_prompts_longer_than_a_chunk_and_after_a_memory(variant):
    """A prompt longer than the prefill chunk, and prompts that continue a given memory, are prefilled alone
    and join the batch's cache (put_rows): still each row as alone, sampled per row."""
    model = _model(**variant)
    rows = _rows([2, 9, 4, 22])  # 22 > mem_len + chunk: chunks that fall elsewhere would change it
    _assert_rows_as_alone(model, rows, seeds=True, max_new_tokens=12, prompt_chunk=4, top_k=6)
    memory = model(torch.randint(0, V, (4, 7), generator=torch.Generator().manual_seed(3))).memory
    gen = generate(
        model, rows, SamplingParams(max_new_tokens=12, temperature=0), memory=memory, return_scores=True
    )
    for r, row in enumerate(rows):
        alone = generate(
            model,
            [row],
            SamplingParams(max_new_tokens=12, temperature=0),
            memory=memory.select([r]),
            return_scores=True,
        )
        assert torch.equal(gen.new_tokens[r], alone.new_tokens[0])
        torch.testing.assert_close(gen.scores[r], alone.scores[0], atol=1e-12, rtol=0)


@pytest.mark.parametrize(
    "changes", [{"attention": "absolute", "mem_len": 0}, {"mem_len": 0}], ids=["vanilla", "no_memory"]
)
def test_the_window_path_takes_ragged_rows(changes):
    """Without memory every step recomputes the window: left-padded rows with starts, each row as alone,
    also once the window has slid past the padding."""
    model = _model(**changes)
    rows = _rows([2, 6, 3])
    _assert_rows_as_alone(model, rows, seeds=True, max_new_tokens=8, context=5, temperature=0.9)
    _assert_rows_as_alone(model, rows, max_new_tokens=4, temperature=0)


def test_stop_ids_and_stream_with_ragged_rows():
    model = _model()
    rows = _rows([5, 1, 3])
    first = generate(model, rows, SamplingParams(max_new_tokens=12, temperature=0))
    stop = int(first.new_tokens[1, 2])
    gen = generate(model, rows, SamplingParams(max_new_tokens=12, temperature=0, stop_ids=[stop]))
    for r, row in enumerate(rows):
        alone = generate(model, [row], SamplingParams(max_new_tokens=12, temperature=0, stop_ids=[stop]))
        n = int(alone.lengths[0])
        assert int(gen.lengths[r]) == n and torch.equal(gen.new_tokens[r, :n], alone.new_tokens[0, :n])
    steps = [
        s.tokens
        for s in stream(
            model, rows, [SamplingParams(max_new_tokens=12, top_p=0.9, seed=s) for s in _seeds(3)]
        )
    ]
    assert torch.equal(
        torch.stack(steps, 1),
        generate(
            model, rows, [SamplingParams(max_new_tokens=12, top_p=0.9, seed=s) for s in _seeds(3)]
        ).new_tokens,
    )


def test_a_list_of_params_must_have_one_per_row():
    model = _model()
    with pytest.raises(ValueError, match="one per row"):
        generate(model, _rows([2, 3]), [SamplingParams(max_new_tokens=2, seed=s) for s in _seeds(3)])
    with pytest.raises(ValueError, match="params"):
        generate(model, _rows([2, 3]), 7)


@pytest.mark.parametrize(
    ("lengths", "together"), [((3, 9, 14, 6), True), ((3, 9, 19, 6), False)], ids=["fit", "longer"]
)
def test_prompts_longer_than_a_chunk_are_prefilled_together_while_the_memory_holds_them(
    lengths, together, monkeypatch
):
    """Memory 12, chunks of 5: prompts of up to 15 tokens (every query of the last chunk still sees its whole
    prompt) are prefilled as one left-padded batch, chunk by chunk; a longer one makes each prompt read alone
    (its chunks then fall where they fall alone). Either way each row equals its prompt alone."""
    model = _model()
    rows = _rows(lengths)
    shapes = []
    forward = TransformerXL.forward
    monkeypatch.setattr(
        TransformerXL,
        "forward",
        lambda self, tokens, **kw: shapes.append(tokens.shape) or forward(self, tokens, **kw),
    )
    generate(
        model, rows, SamplingParams(max_new_tokens=2, temperature=0), settings=DecodeSettings(prompt_chunk=5)
    )
    monkeypatch.undo()
    if together:
        assert shapes == [(4, 5), (4, 5), (4, 4)]
    else:
        assert all(shape[0] == 1 for shape in shapes) and len(shapes) == 1 + 2 + 4 + 2
    _assert_rows_as_alone(model, rows, seeds=True, max_new_tokens=10, prompt_chunk=5, top_k=6)
