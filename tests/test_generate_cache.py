"""The key/value cache of generation against plain recomputation: cached decoding equals feeding one token
at a time through ordinary ``forward`` with the same sliding memory (every architecture variant), the cache
equals ``forward`` with a memory for any segment lengths, stream and generate agree, stop ids, long prompts in
chunks, prompts of different lengths, continuation from the returned memory, and the work per token. The
equivalences of generation run on both decoding paths: the eager step and the step compiled ahead of time
(``DecodeSettings(compiled=True)``), each against the same plain reference."""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from conftest import generate_drawing_from
from txl import Memory, Span, TransformerXL, TransformerXLConfig
from txl.inference import PAD_ID, DecodeSettings, SamplingParams, generate, stream
from txl.model import KVCache
from txl.model.compiled import CompiledStep
from txl.model.decode import Decoder, DecodingTables, OutputLayout, decoding_tables

V = 50

VARIANTS = {
    "post_norm": {},
    "pre_norm": {"pre_norm": True},
    "per_layer_bias": {"share_rel_bias": False},
    "same_length": {"same_length": True},
    "clamp_len": {"clamp_len": 5},
    "adaptive": {"cutoffs": (12, 30), "div_val": 2, "d_embed": 16},
    "pre_norm_same_length_clamp": {
        "pre_norm": True,
        "same_length": True,
        "clamp_len": 7,
        "share_rel_bias": False,
    },
}


@pytest.fixture(params=[False, True], ids=["eager", "compiled"])
def compiled(request, monkeypatch) -> bool:
    """The decoding path of a test: the eager step, or the compiled one (``DecodeSettings(compiled=True)``),
    which must then really run: a fallback to the eager step (its warning an error here) or a step that never
    calls the compiled function fails the test."""
    if not request.param:
        yield False
        return
    request.getfixturevalue("compiled_steps_dir")
    calls = []
    original = CompiledStep.__call__

    def counted(self, *args):
        calls.append(1)
        return original(self, *args)

    monkeypatch.setattr(CompiledStep, "__call__", counted)
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="the compiled decoding step", category=RuntimeWarning)
        yield True
    assert calls, "the compiled step never ran"


def _on(compiled: bool, settings: DecodeSettings = DecodeSettings()) -> DecodeSettings:
    return dataclasses.replace(settings, compiled=compiled)


def _model(dtype=torch.float32, **changes) -> TransformerXL:
    # init_std large enough that next-token scores are well separated (greedy has no near-ties)
    fields = dict(
        vocab_size=V,
        n_layer=2,
        n_head=3,
        d_head=8,
        d_model=16,
        d_inner=32,
        mem_len=12,
        init_std=0.3,
        proj_init_std=0.3,
    )
    fields.update(changes)
    torch.manual_seed(0)
    model = TransformerXL(TransformerXLConfig(**fields))
    with torch.no_grad():  # biases start at 0: make them count, so that a path that drops one is caught
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.3)
    return model.to(dtype).eval()


def _prompt(b=2, p=6, seed=1):
    return torch.randint(0, V, (b, p), generator=torch.Generator().manual_seed(seed))


def _reference_greedy(model, prompt, n, *, span=None, chunk=None):
    """Plain reference: the prompt through ordinary forward (in chunks if given), then one token at a time
    through forward with the memory the previous call returned (sliding at span.mem_len); no cache."""
    span = model.config.span if span is None else span
    memory, tokens, scores = None, [], []
    with torch.no_grad():
        step = prompt.shape[1] if chunk is None else chunk
        for start in range(0, prompt.shape[1], step):
            out = model(prompt[:, start : start + step], memory=memory, span=span)
            memory = out.memory
        logprobs = out.log_probs[:, -1]  # (B, V)
        for i in range(n):
            token = logprobs.argmax(-1)
            tokens.append(token)
            scores.append(logprobs)
            if i + 1 < n:
                out = model(token[:, None], memory=memory, span=span)
                memory, logprobs = out.memory, out.log_probs[:, -1]
    return torch.stack(tokens, 1), torch.stack(scores, 1), memory


# -- cached decoding equals the plain reference ----------------------------------------------------------


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cached_greedy_equals_plain_forward_with_sliding_memory(variant, compiled):
    model = _model(**VARIANTS[variant])
    prompt, n = _prompt(), 100  # mem_len 12 << 6 + 100: the memory slides for 90 steps
    ref_tokens, ref_scores, ref_memory = _reference_greedy(model, prompt, n)
    top2 = ref_scores.topk(2, dim=-1).values
    assert (top2[..., 0] - top2[..., 1]).min() > 1e-4  # no near-ties: greedy is well defined in float32

    gen = generate(
        model,
        prompt,
        SamplingParams(max_new_tokens=n, temperature=0),
        settings=_on(compiled),
        return_scores=True,
    )
    assert gen.scores.dtype == torch.float32 and gen.scores.shape == (2, n, V)
    assert torch.equal(gen.new_tokens, ref_tokens)
    torch.testing.assert_close(gen.scores, ref_scores, atol=1e-5, rtol=0)
    assert gen.memory.length == 12
    for got, want in zip(gen.memory.states, ref_memory.states, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ["post_norm", "pre_norm_same_length_clamp", "adaptive"])
def test_cache_equals_forward_with_memory_for_any_segment_lengths(variant):
    """Segments of 1 and of several tokens, in eval mode (the one-query path) and in training mode (the
    general path), starting from a given memory longer than mem_len."""
    model = _model(torch.float64, **VARIANTS[variant])
    tokens = torch.randint(0, V, (3, 100), generator=torch.Generator().manual_seed(2))
    start = model(tokens[:, :20], span=Span(mem_len=20)).memory  # 20 > mem_len 12
    for training in (False, True):
        model.train(training)
        memory, cache, pos = start, KVCache(model.config, memory=start), 20
        for t in [1, 1, 5, 1, 13, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 30, 1, 1]:
            segment, pos = tokens[:, pos : pos + t], pos + t
            want = model(segment, memory=memory)
            got = model(segment, cache=cache)
            memory = want.memory
            torch.testing.assert_close(got.log_probs, want.log_probs, atol=1e-10, rtol=0)
            assert got.memory is None and cache.length == memory.length == 12
            for a, b in zip(cache.memory().states, memory.states, strict=True):
                torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
        assert cache.capacity < 60  # the buffers slid back to the front instead of growing with the sequence


def test_last_only_gives_the_last_position():
    model = _model(torch.float64)
    tokens = _prompt(p=9)
    memory = model(tokens[:, :4]).memory
    full = model(tokens[:, 4:], memory=memory)
    last = model(tokens[:, 4:], memory=memory, last_only=True)
    assert last.log_probs.shape == (2, 1, V)
    torch.testing.assert_close(last.log_probs, full.log_probs[:, -1:], atol=1e-12, rtol=0)
    for a, b in zip(last.memory.states, full.memory.states, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="targets"):
        model(tokens, targets=tokens, last_only=True)


def test_cache_validation():
    model = _model()
    cache = KVCache(model.config, batch_size=2)
    model(_prompt(), cache=cache)
    with pytest.raises(ValueError, match="other sizes"):
        _model(d_model=24)(_prompt(), cache=cache)
    with pytest.raises(ValueError, match="no memory"):
        model(_prompt(), cache=cache, memory=model(_prompt()).memory)
    with pytest.raises(ValueError, match="built for"):
        model(_prompt(), cache=cache, span=Span(mem_len=5))
    with pytest.raises(ValueError, match="2 rows"):
        model(_prompt(b=3), cache=cache)
    with pytest.raises(ValueError, match="memory"):
        KVCache(_model(attention="absolute").config, batch_size=1)
    with pytest.raises(ValueError, match="float64"):
        model(_prompt(), cache=KVCache(model.config, batch_size=2, dtype=torch.float64))


class _LinearRows(TorchFunctionMode):
    """Records the number of rows entering every linear map (F.linear, addmm, matmul's left operand)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is F.linear:
            self.rows.append(args[0].reshape(-1, args[0].shape[-1]).shape[0])
        elif func is torch.addmm:
            self.rows.append(args[1].shape[0])
        elif func is torch.baddbmm:  # the output layer in column blocks: (S, N, E) rows
            self.rows.append(args[1].shape[1])
        return func(*args, **(kwargs or {}))


def test_decoding_projects_only_the_new_position():
    """Per token, no linear map sees more rows than the batch: the memory's keys and values and the distance
    table are not projected again (the work per token is O(M·D) in attention, not O(M·D²))."""
    model = _model(mem_len=64)
    calls = []
    original = model.layers[0].attn.project_distances

    def count(pos):
        calls.append(pos.shape[0])
        return original(pos)

    model.layers[0].attn.project_distances = count
    cache = KVCache(model.config, batch_size=2)
    with torch.inference_mode():
        decoder = Decoder(model, cache)
        assert calls == [65]  # the decoder's table for distances 64..0
        decoder.prefill(_prompt(p=40))
        assert calls == [65, 40]  # then the prompt chunk's distances
        recorder = _LinearRows()
        with recorder:
            for _ in range(20):
                decoder.step(torch.zeros(2, dtype=torch.long))
    assert calls == [65, 40] and recorder.rows and max(recorder.rows) == 2


@pytest.mark.parametrize("blocks", [1, 2, 3, 4])
@pytest.mark.parametrize("rows", [1, 3])
def test_output_layout_in_blocks_equals_the_plain_softmax(blocks, rows):
    """The output weight cut into column blocks (padded when V is not a multiple) gives the scores of
    ``F.linear`` with the weight as stored, with and without an input projection."""
    gen = torch.Generator().manual_seed(3)
    weight, bias = torch.randn(10, 6, generator=gen), torch.randn(10, generator=gen)  # V 10, E 6
    proj = torch.randn(5, 6, generator=gen)  # D 5 -> E 6
    for p in (None, proj):
        hidden = torch.randn(rows, 6 if p is None else 5, generator=gen)
        layout = OutputLayout(weight, bias, p, blocks=blocks)
        assert layout.weight.shape == (blocks, 6, -(-10 // blocks))
        want = F.linear(hidden if p is None else hidden @ p, weight, bias)  # (N, V)
        torch.testing.assert_close(layout.scores(hidden), want, atol=1e-5, rtol=0)


def test_large_vocabulary_decodes_with_the_output_in_blocks():
    """A vocabulary of 4,099 (blocks with padding on 2+ threads) decodes as the plain reference."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        model = _model(vocab_size=4099)
        prompt = torch.randint(0, 4099, (2, 6), generator=torch.Generator().manual_seed(4))
        ref_tokens, ref_scores, _ = _reference_greedy(model, prompt, 30)
        gen = generate(model, prompt, SamplingParams(max_new_tokens=30, temperature=0), return_scores=True)
        tables = decoding_tables(model, longest=12, clamp_len=None, batch_size=2)  # the memo generate made
        assert tables.output is not None and tables.output.weight.shape == (2, 16, 2050)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(gen.new_tokens, ref_tokens)
    torch.testing.assert_close(gen.scores, ref_scores, atol=1e-5, rtol=0)


def test_decoding_tables_are_remembered_until_a_weight_changes():
    """Repeated generations reuse the transposed weights; a weight changed in place (as an optimizer step
    does), a state dict loaded into it or a move to another dtype makes them again; nothing is stored on the
    model."""
    model = _model()
    prompt = _prompt()
    first = decoding_tables(model, longest=12, clamp_len=None, batch_size=2)
    assert decoding_tables(model, longest=12, clamp_len=None, batch_size=2) is first
    generate(model, prompt, SamplingParams(max_new_tokens=3, temperature=0))
    assert decoding_tables(model, longest=12, clamp_len=None, batch_size=2) is first
    with torch.no_grad():
        model.layers[1].ff.net[3].weight.mul_(-1.5)  # in place: same storage, new version
    ref_tokens, ref_scores, _ = _reference_greedy(model, prompt, 20)
    gen = generate(model, prompt, SamplingParams(max_new_tokens=20, temperature=0), return_scores=True)
    assert torch.equal(gen.new_tokens, ref_tokens)
    torch.testing.assert_close(gen.scores, ref_scores, atol=1e-5, rtol=0)
    second = decoding_tables(model, longest=12, clamp_len=None, batch_size=2)
    assert second is not first and decoding_tables(model, longest=12, clamp_len=None, batch_size=2) is second
    model.load_state_dict(model.state_dict())
    assert decoding_tables(model, longest=12, clamp_len=None, batch_size=2) is not second
    assert not any(isinstance(value, DecodingTables) for value in vars(model).values())
    model.double()
    gen = generate(model, prompt, SamplingParams(max_new_tokens=20, temperature=0), return_scores=True)
    assert gen.scores.dtype == torch.float64 and torch.equal(gen.new_tokens, ref_tokens)


# -- the generation API ----------------------------------------------------------------------------------


@pytest.mark.parametrize("settings", [dict(temperature=0.9, top_k=10), dict(top_p=0.8), dict(temperature=0)])
def test_stream_yields_what_generate_returns(settings, compiled):
    model = _model()
    prompt = _prompt(b=3)
    gen = generate(
        model,
        prompt,
        SamplingParams(max_new_tokens=30, **settings, seed=4),
        settings=_on(compiled),
    )
    steps = [
        step.tokens
        for step in stream(
            model,
            prompt,
            SamplingParams(max_new_tokens=30, **settings, seed=4),
            settings=_on(compiled),
        )
    ]
    assert len(steps) == 30 and all(s.shape == (3,) and s.dtype == torch.long for s in steps)
    assert torch.equal(torch.stack(steps, 1), gen.new_tokens)
    if settings.get("temperature") != 0:
        greedy = generate(model, prompt, SamplingParams(max_new_tokens=30, temperature=0))
        assert not torch.equal(gen.new_tokens, greedy.new_tokens)  # the sampler is really sampling


def test_stream_restores_training_flags_when_closed():
    model = _model().train()
    steps = stream(model, _prompt(), SamplingParams(max_new_tokens=10, temperature=0))
    next(steps)
    assert not model.training  # eval while the stream runs
    steps.close()
    assert model.training


def test_stop_ids_end_each_row_at_its_first_stop():
    model = _model()
    prompt = _prompt(b=4, seed=3)
    free = generate(model, prompt, SamplingParams(max_new_tokens=40, temperature=0)).new_tokens  # (4, 40)
    stop = [int(free[0, 5]), int(free[2, 11])]
    first = [next((i for i in range(40) if int(free[r, i]) in stop), None) for r in range(4)]
    assert first[0] <= 5 and first[2] <= 11
    gen = generate(model, prompt, SamplingParams(max_new_tokens=40, temperature=0, stop_ids=stop))
    ends = [40 if f is None else f + 1 for f in first]
    assert gen.lengths.tolist() == ends
    assert gen.finished.tolist() == [f is not None for f in first]
    assert gen.new_tokens.shape[1] == (40 if None in first else max(ends))  # ends when every row has stopped
    for r in range(4):
        assert torch.equal(gen.new_tokens[r, : ends[r]], free[r, : ends[r]])
        assert (gen.new_tokens[r, ends[r] :] == PAD_ID).all()
    assert torch.equal(gen.tokens[:, :6], prompt)
    streamed = torch.stack(
        [
            s.tokens
            for s in stream(model, prompt, SamplingParams(max_new_tokens=40, temperature=0, stop_ids=stop))
        ],
        1,
    )
    assert torch.equal(streamed, gen.new_tokens)

    # every row stops: generation ends at the last row's stop
    all_stop = [int(free[r, 3]) for r in range(4)]
    gen = generate(model, prompt, SamplingParams(max_new_tokens=40, temperature=0, stop_ids=all_stop))
    assert gen.finished.all() and gen.new_tokens.shape[1] == int(gen.lengths.max()) <= 4
    with pytest.raises(ValueError, match="stop_ids"):
        generate(model, prompt, SamplingParams(max_new_tokens=3, stop_ids=[V]))


def test_long_prompt_is_fed_in_chunks_and_equals_one_pass_when_memory_covers_it(compiled):
    model = _model(mem_len=8)
    prompt, n = _prompt(p=45), 20
    seen = []
    original = model.forward

    def spy(tokens, **kwargs):
        seen.append(tokens.shape[1])
        return original(tokens, **kwargs)

    model.forward = spy
    gen = generate(
        model,
        prompt,
        SamplingParams(max_new_tokens=n, temperature=0),
        settings=_on(compiled),
        return_scores=True,
    )
    del model.forward
    assert seen == [8, 8, 8, 8, 8, 5]  # chunks of at most mem_len; the new tokens go through the Decoder
    ref_tokens, ref_scores, _ = _reference_greedy(model, prompt, n, chunk=8)
    assert torch.equal(gen.new_tokens, ref_tokens)
    torch.testing.assert_close(gen.scores, ref_scores, atol=1e-5, rtol=0)

    # with a memory that covers prompt and generation, chunks change nothing: equal to the prompt in one pass
    wide = Span(mem_len=80)
    whole_tokens, whole_scores, _ = _reference_greedy(model, prompt, n, span=wide)
    for chunk in (None, 7, 45):
        got = generate(
            model,
            prompt,
            SamplingParams(max_new_tokens=n, temperature=0),
            settings=_on(compiled, DecodeSettings(span=wide, prompt_chunk=chunk)),
            return_scores=True,
        )
        assert torch.equal(got.new_tokens, whole_tokens)
        torch.testing.assert_close(got.scores, whole_scores, atol=1e-5, rtol=0)
    assert not torch.equal(gen.new_tokens, whole_tokens)  # the short memory does forget (the test can fail)


def test_prompts_of_different_lengths_equal_one_row_at_a_time(compiled):
    """Each row of a batch against the same prompt alone, both on the test's decoding path."""
    model, on = _model(), _on(compiled)
    rows = [_prompt(b=1, p=p, seed=p)[0] for p in (7, 3, 7, 1, 15)]
    gen = generate(
        model, rows, SamplingParams(max_new_tokens=25, temperature=0), settings=on, return_scores=True
    )
    assert gen.tokens.shape == (5, 15 + 25) and gen.new_tokens.shape == (5, 25)
    for r, row in enumerate(rows):
        alone = generate(
            model, row, SamplingParams(max_new_tokens=25, temperature=0), settings=on, return_scores=True
        )
        assert torch.equal(gen.new_tokens[r], alone.new_tokens[0])
        torch.testing.assert_close(gen.scores[r], alone.scores[0], atol=1e-5, rtol=0)
        pad = 15 - len(row)
        assert (gen.tokens[r, :pad] == PAD_ID).all() and torch.equal(gen.tokens[r, pad:15], row)
    # every row's history is longer than mem_len (12): one memory, in row order, that continues each row
    more = generate(
        model,
        gen.tokens[:, -1:],
        SamplingParams(max_new_tokens=5, temperature=0),
        settings=on,
        memory=gen.memory,
    )
    for r, row in enumerate(rows):
        alone = generate(model, row, SamplingParams(max_new_tokens=30, temperature=0), settings=on)
        assert torch.equal(more.new_tokens[r], alone.new_tokens[0, 25:])
    # short histories of different lengths: one memory whose per-row reach keeps each row's own history
    short = generate(model, [rows[1], rows[3]], SamplingParams(max_new_tokens=2, temperature=0), settings=on)
    assert short.memory.reach.tolist() == [4, 2]
    more = generate(
        model,
        short.tokens[:, -1:],
        SamplingParams(max_new_tokens=6, temperature=0),
        settings=on,
        memory=short.memory,
    )
    for r, row in enumerate([rows[1], rows[3]]):
        alone = generate(model, row, SamplingParams(max_new_tokens=8, temperature=0), settings=on)
        assert torch.equal(more.new_tokens[r], alone.new_tokens[0, 2:])
    # one generator draws for all rows at once, in row order
    sampled = [
        generate(model, rows, SamplingParams(max_new_tokens=10, seed=8), settings=on).new_tokens
        for _ in range(2)
    ]
    assert torch.equal(sampled[0], sampled[1])
    steps = [s.tokens for s in stream(model, rows, SamplingParams(max_new_tokens=10, seed=8), settings=on)]
    assert torch.equal(torch.stack(steps, 1), sampled[0])


@pytest.mark.parametrize("variant", ["post_norm", "pre_norm_same_length_clamp"])
def test_continuing_with_the_returned_memory_equals_one_longer_generation(variant, compiled):
    model, on = _model(**VARIANTS[variant]), _on(compiled)
    prompt = _prompt(b=2, p=10)
    one = generate_drawing_from(
        model,
        prompt,
        SamplingParams(max_new_tokens=30, top_k=5),
        torch.Generator().manual_seed(1),
        settings=on,
    )
    g = torch.Generator().manual_seed(1)
    first = generate_drawing_from(model, prompt, SamplingParams(max_new_tokens=17, top_k=5), g, settings=on)
    assert first.memory.length == 12  # the memory after tokens[:, :-1], truncated to mem_len
    second = generate_drawing_from(
        model,
        first.tokens[:, -1:],
        SamplingParams(max_new_tokens=13, top_k=5),
        g,
        memory=first.memory,
        settings=on,
    )
    assert torch.equal(torch.cat([first.new_tokens, second.new_tokens], 1), one.new_tokens)
    for a, b in zip(second.memory.states, one.memory.states, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)


def test_outputs_are_ordinary_tensors_usable_for_training():
    """Generation runs in inference mode; what it returns can still enter autograd."""
    model = _model()
    gen = generate(model, _prompt(), SamplingParams(max_new_tokens=5, temperature=0), return_scores=True)
    step = next(stream(model, _prompt(), SamplingParams(max_new_tokens=5, temperature=0)))
    assert not any(
        t.is_inference()
        for t in (
            gen.tokens,
            gen.new_tokens,
            gen.scores,
            gen.lengths,
            step.tokens,
            step.log_probs,
            *gen.memory.states,
        )
    )
    model.train()
    out = model(gen.tokens[:, :-1], memory=gen.memory, targets=gen.tokens[:, 1:])
    out.loss.mean().backward()
    assert model.u.grad is not None
    assert isinstance(gen.memory, Memory)


# -- evaluation through the cache -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("variant", "span", "tgt_len"),
    [
        ("post_norm", Span(mem_len=12), 5),
        ("post_norm", Span(mem_len=3), 7),  # memory shorter than a segment
        ("pre_norm_same_length_clamp", Span(mem_len=9, clamp_len=4, same_length=True), 6),
        ("adaptive", Span(mem_len=20), 4),
    ],
)
def test_evaluation_reusing_keys_equals_recomputing_them(variant, span, tgt_len):
    """evaluate() with the key/value cache (the default) gives the losses of forward with a memory, segment by
    segment, for every stream; the last batch is shorter and padded."""
    from txl.evaluation import EvalSettings, evaluate

    model = _model(torch.float64, **VARIANTS[variant])
    tokens = torch.randint(0, V, (203,), generator=torch.Generator().manual_seed(5))
    cached = evaluate(model, tokens, EvalSettings(batch_size=3, tgt_len=tgt_len, span=span))
    plain = evaluate(model, tokens, EvalSettings(batch_size=3, tgt_len=tgt_len, span=span, reuse_keys=False))
    assert cached.tokens == plain.tokens == 202
    assert cached.loss == pytest.approx(plain.loss, abs=1e-12)


def test_cache_with_targets_gives_forward_losses():
    model = _model(torch.float64)
    tokens = torch.randint(0, V, (2, 31), generator=torch.Generator().manual_seed(6))
    cache, memory = KVCache(model.config, batch_size=2, dtype=torch.float64), None
    for start in range(0, 30, 6):
        x, y = tokens[:, start : start + 6], tokens[:, start + 1 : start + 7]
        want = model(x, memory=memory, targets=y)
        got = model(x, cache=cache, targets=y)
        memory = want.memory
        assert got.log_probs is None
        torch.testing.assert_close(got.loss, want.loss, atol=1e-12, rtol=0)
    one = model(tokens[:, 30:31], cache=cache, targets=tokens[:, 30:31])
    want = model(tokens[:, 30:31], memory=memory, targets=tokens[:, 30:31])
    torch.testing.assert_close(one.loss, want.loss, atol=1e-12, rtol=0)


@pytest.mark.parametrize("variant", ["post_norm", "pre_norm_same_length_clamp", "adaptive"])
def test_decoder_steps_equal_forward_with_memory_from_a_given_memory(variant):
    """The Decoder stepping straight after a cache built from a memory (its keys and values bound first, by
    bind_memory) gives forward's log-probabilities and memory, token after token; it notices changed weights."""
    model = _model(torch.float64, **VARIANTS[variant])
    tokens = torch.randint(0, V, (2, 60), generator=torch.Generator().manual_seed(7))
    memory = model(tokens[:, :20], span=Span(mem_len=20)).memory  # longer than mem_len 12
    decoder = Decoder(model, KVCache(model.config, memory=memory))
    assert not decoder.stale
    for i in range(20, 50):
        want = model(tokens[:, i : i + 1], memory=memory)
        memory = want.memory
        torch.testing.assert_close(decoder.step(tokens[:, i]), want.log_probs[:, -1], atol=1e-10, rtol=0)
    for a, b in zip(decoder.cache.memory().states, memory.states, strict=True):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0)
    with torch.no_grad():
        model.layers[0].attn.qkv.weight.mul_(0.5)
    assert decoder.stale  # (the cached keys and values are the old weights': a cache serves one set)
    before = decoder.tables
    decoder.prefill(tokens[:, 50:52])  # makes the tables again
    assert not decoder.stale and decoder.tables is not before
