"""Generation: cached steps against recomputation from scratch, continuation from the returned memory,
the sampling filters on hand-made distributions, the vanilla baseline's sliding window, text in and out,
and input validation."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from torch import nn

from conftest import generate_drawing_from
from txl import Memory, Span, TransformerXL, TransformerXLConfig
from txl.inference import (
    GREEDY_BELOW,
    DecodeSettings,
    Generation,
    SamplingParams,
    draw,
    filter_logits,
    generate,
    sample_next,
)
from txl.inference.text import encode_prompt, generate_text

V = 37


def _model(**changes) -> TransformerXL:
    # init_std large enough that next-token scores are well separated (greedy has no near-ties)
    fields = dict(
        vocab_size=V,
        n_layer=2,
        n_head=3,
        d_head=5,
        d_model=12,
        d_inner=20,
        mem_len=32,
        init_std=0.3,
        proj_init_std=0.3,
    )
    fields.update(changes)
    return TransformerXL(TransformerXLConfig(**fields)).double().eval()


class Spy(nn.Module):
    """Wraps a model and records every call: the tokens fed, the memory given, the output. With a key/value
    cache the memory given is the cache's before the call, and the output's memory the cache's after it."""

    def __init__(self, model: TransformerXL) -> None:
        super().__init__()
        self.model = model
        self.config = model.config
        self.calls: list[tuple[torch.Tensor, Memory | None, object]] = []

    def forward(self, tokens, **kwargs):
        cache = kwargs.get("cache")
        given = kwargs.get("memory") if cache is None else cache.memory()
        out = self.model(tokens, **kwargs)
        if cache is not None:
            out = dataclasses.replace(out, memory=cache.memory())
        self.calls.append((tokens.clone(), given, out))
        return out


def _greedy_recompute(model, prompt, n, *, context=None):
    """Reference: a full forward pass without memory over the (last ``context``) tokens at every step."""
    seq, step_logits = prompt, []
    with torch.no_grad():
        for _ in range(n):
            window = seq if context is None else seq[:, -context:]
            logits = model(window).log_probs[:, -1]  # (B, V)
            step_logits.append(logits)
            seq = torch.cat([seq, logits.argmax(-1, keepdim=True)], dim=1)
    return seq, step_logits


def _prompt(b=2, p=5, seed=1):
    return torch.randint(0, V, (b, p), generator=torch.Generator().manual_seed(seed))


# -- the memory cache equals recomputation ---------------------------------------------------------------


@pytest.mark.parametrize("cutoffs", [(), (10, 20)], ids=["softmax", "adaptive"])
@pytest.mark.parametrize("prompt_chunk", [None, 2])
def test_cached_generation_matches_recomputation(cutoffs, prompt_chunk):
    model = _model(cutoffs=cutoffs, mem_len=16)  # P + N = 13 <= mem_len: nothing is forgotten
    prompt, n = _prompt(), 8
    spy = Spy(model)
    gen = generate(
        spy,
        prompt,
        SamplingParams(max_new_tokens=n, temperature=0),
        settings=DecodeSettings(prompt_chunk=prompt_chunk),
    )
    ref_tokens, ref_logits = _greedy_recompute(model, prompt, n)

    assert torch.equal(gen.tokens, ref_tokens)
    assert torch.equal(gen.new_tokens, ref_tokens[:, prompt.shape[1] :])
    n_prompt_calls = 1 if prompt_chunk is None else math.ceil(prompt.shape[1] / prompt_chunk)
    assert len(spy.calls) == n_prompt_calls + n - 1  # the last sampled token is not fed
    for tokens, _, _ in spy.calls[n_prompt_calls:]:
        assert tokens.shape == (2, 1)  # one new token per step: the past is not recomputed
    cached_logits = [spy.calls[n_prompt_calls - 1][2].log_probs[:, -1]]
    cached_logits += [out.log_probs[:, -1] for _, _, out in spy.calls[n_prompt_calls:]]
    for cached, ref in zip(cached_logits, ref_logits, strict=True):
        torch.testing.assert_close(cached, ref, atol=1e-10, rtol=0)

    # the returned memory is the memory after every token but the last sampled one
    expected = model(gen.tokens[:, :-1]).memory
    assert gen.memory.length == gen.tokens.shape[1] - 1
    for got, want in zip(gen.memory.states, expected.states, strict=True):
        torch.testing.assert_close(got, want, atol=1e-10, rtol=0)


def test_chunked_prompt_gives_identical_generation():
    model = _model(mem_len=20)
    prompt = _prompt(p=7)
    whole = generate(model, prompt, SamplingParams(max_new_tokens=6, temperature=0))
    for chunk in (1, 3, 7, 100):
        chunked = generate(
            model,
            prompt,
            SamplingParams(max_new_tokens=6, temperature=0),
            settings=DecodeSettings(prompt_chunk=chunk),
        )
        assert torch.equal(chunked.tokens, whole.tokens)


def test_short_memory_is_bounded_and_continues_like_one_call():
    model = _model(mem_len=4)
    prompt = _prompt(p=6)
    spy = Spy(model)
    one = generate(spy, prompt, SamplingParams(max_new_tokens=10, temperature=0))
    assert all(out.memory.length <= 4 for _, _, out in spy.calls)
    assert all(memory is None or memory.length <= 4 for _, memory, _ in spy.calls)
    assert one.memory.length == 4

    first = generate(model, prompt, SamplingParams(max_new_tokens=5, temperature=0))
    second = generate(
        model, first.tokens[:, -1:], SamplingParams(max_new_tokens=5, temperature=0), memory=first.memory
    )
    assert torch.equal(torch.cat([first.new_tokens, second.new_tokens], dim=1), one.new_tokens)
    for a, b in zip(second.memory.states, one.memory.states, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)

    # a view with a longer memory (shared weights) remembers everything again
    longer = generate(
        model,
        prompt,
        SamplingParams(max_new_tokens=10, temperature=0),
        settings=DecodeSettings(span=Span(mem_len=16)),
    )
    assert torch.equal(longer.tokens, _greedy_recompute(model, prompt, 10)[0])

    # with a memory this short, the cache forgets: the result is not a full recomputation (the test can fail)
    _, ref_logits = _greedy_recompute(model, one.tokens[:, :-1], 1)
    assert not torch.allclose(spy.calls[-1][2].log_probs[:, -1], ref_logits[0], atol=1e-6)


def test_sampled_continuation_equals_one_sampled_call():
    model = _model(mem_len=8)
    prompt = _prompt(p=3)
    one = generate_drawing_from(
        model, prompt, SamplingParams(max_new_tokens=12, top_p=0.9), torch.Generator().manual_seed(5)
    )
    g = torch.Generator().manual_seed(5)
    first = generate_drawing_from(model, prompt, SamplingParams(max_new_tokens=7, top_p=0.9), g)
    second = generate_drawing_from(
        model,
        first.tokens[:, -1:],
        SamplingParams(max_new_tokens=5, top_p=0.9),
        g,
        memory=first.memory,
    )
    assert torch.equal(torch.cat([first.new_tokens, second.new_tokens], dim=1), one.new_tokens)


def test_restores_training_flags_and_runs_without_dropout_or_grad():
    model = _model(dropout=0.5, dropatt=0.5)
    prompt = _prompt()
    model.train()
    model.layers[0].eval()  # a mixed state is restored exactly
    before = {name: m.training for name, m in model.named_modules()}
    gen = generate(model, prompt, SamplingParams(max_new_tokens=6, temperature=0))
    assert {name: m.training for name, m in model.named_modules()} == before
    model.eval()
    ref_tokens, _ = _greedy_recompute(model, prompt, 6)
    assert torch.equal(gen.tokens, ref_tokens)  # dropout was off during generation
    assert not any(s.requires_grad for s in gen.memory.states)


def test_one_dimensional_prompt_is_one_row():
    model = _model()
    gen = generate(model, torch.tensor([3, 1, 4]), SamplingParams(max_new_tokens=4, temperature=0))
    assert isinstance(gen, Generation)
    assert gen.tokens.shape == (1, 7) and gen.new_tokens.shape == (1, 4)
    assert gen.tokens.dtype == torch.int64
    ref = generate(model, torch.tensor([[3, 1, 4]]), SamplingParams(max_new_tokens=4, temperature=0))
    assert torch.equal(gen.tokens, ref.tokens)


# -- sampling ---------------------------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible_and_top_k_1_is_greedy():
    model = _model()
    prompt = _prompt()
    runs = [
        generate(
            model,
            prompt,
            SamplingParams(max_new_tokens=10, temperature=1.3, top_k=10, seed=7),
        ).tokens
        for _ in range(2)
    ]
    assert torch.equal(runs[0], runs[1])
    greedy = generate(model, prompt, SamplingParams(max_new_tokens=10, temperature=0)).tokens
    assert torch.equal(greedy, _greedy_recompute(model, prompt, 10)[0])
    top1 = generate(
        model,
        prompt,
        SamplingParams(max_new_tokens=10, top_k=1, seed=3),
    ).tokens
    assert torch.equal(top1, greedy)
    tiny_p = generate(
        model,
        prompt,
        SamplingParams(max_new_tokens=10, top_p=1e-9, seed=3),
    ).tokens
    assert torch.equal(tiny_p, greedy)
    sampled = [generate(model, prompt, SamplingParams(max_new_tokens=10, seed=s)).tokens for s in range(3)]
    assert any(not torch.equal(s, greedy) for s in sampled)  # sampling is not secretly greedy


@pytest.mark.parametrize("temperature", [1e-300, 1e-46, 1e-40, GREEDY_BELOW / 2])
def test_a_temperature_too_small_to_divide_by_is_greedy(temperature):
    """Below GREEDY_BELOW a temperature is greedy, as 0 is: 1e-46 is 0 in float32 and 1e-40 overflows the scores,
    yet each gives the argmax, filters or not; GREEDY_BELOW itself still samples, without a NaN."""
    model = _model().float()
    prompt = _prompt()
    settings = SamplingParams(max_new_tokens=10, temperature=temperature)
    assert settings.greedy and not SamplingParams(temperature=GREEDY_BELOW).greedy
    expected = _greedy_recompute(model, prompt, 10)[0]
    assert torch.equal(generate(model, prompt, settings).tokens, expected)
    filtered = dataclasses.replace(settings, top_k=5, top_p=0.9)
    assert torch.equal(generate(model, prompt, filtered).tokens, expected)
    log_probs = torch.log_softmax(torch.randn(4, V, generator=torch.Generator().manual_seed(0)), dim=-1)
    assert torch.equal(draw(log_probs, settings), log_probs.argmax(-1))
    assert torch.equal(sample_next(log_probs * 1e3, settings), log_probs.argmax(-1))
    coldest = SamplingParams(max_new_tokens=10, temperature=GREEDY_BELOW, seed=0)
    drawn = generate(model, prompt, coldest).tokens
    assert drawn.shape == expected.shape and 0 <= int(drawn.min()) and int(drawn.max()) < V


def test_top_p_keeps_the_smallest_set_reaching_p():
    logits = torch.tensor([0.1, 0.4, 0.2, 0.3], dtype=torch.float64).log()
    kept = {
        p: torch.isfinite(filter_logits(logits, top_p=p)).nonzero().flatten().tolist()
        for p in (0.3, 0.45, 0.75, 0.95, 1.0)
    }
    assert kept == {0.3: [1], 0.45: [1, 3], 0.75: [1, 2, 3], 0.95: [0, 1, 2, 3], 1.0: [0, 1, 2, 3]}
    # kept entries are unchanged, dropped ones -inf, the input untouched
    out = filter_logits(logits, top_p=0.45)
    assert torch.equal(out[[1, 3]], logits[[1, 3]]) and torch.isneginf(out[[0, 2]]).all()
    assert torch.isfinite(logits).all()


def test_filters_break_ties_by_lower_id_and_compose():
    ties = torch.zeros(2, 4)
    assert torch.isfinite(filter_logits(ties, top_k=2)).tolist() == [[True, True, False, False]] * 2
    many = torch.zeros(3, 500)  # long enough for an unstable sort to reorder ties
    kept = torch.isfinite(filter_logits(many, top_k=200))
    assert torch.equal(kept, (torch.arange(500) < 200).expand(3, 500))
    kept = torch.isfinite(filter_logits(many, top_p=0.5))
    assert torch.equal(kept, (torch.arange(500) < 250).expand(3, 500))
    assert torch.isfinite(filter_logits(ties, top_p=0.5)).tolist() == [[True, True, False, False]] * 2
    assert torch.isfinite(filter_logits(ties, top_p=0.1)).tolist() == [[True, False, False, False]] * 2
    # top-k first, then top-p on the renormalised survivors: {1: 0.4, 3: 0.3} -> 0.57, 0.43
    logits = torch.tensor([[0.1, 0.4, 0.2, 0.3]]).log()
    assert torch.isfinite(filter_logits(logits, top_k=2, top_p=0.6)).tolist() == [[False, True, False, True]]
    assert torch.isfinite(filter_logits(logits, top_k=2, top_p=0.55)).tolist() == [
        [False, True, False, False]
    ]
    assert torch.equal(filter_logits(logits, top_k=10), logits)
    assert sample_next(torch.tensor([[0.0, 2.0, 2.0, 1.0]]), SamplingParams(temperature=0)).tolist() == [1]


def test_sample_next_draws_from_the_filtered_distribution():
    probs = torch.tensor([0.1, 0.4, 0.2, 0.3], dtype=torch.float64)
    logits = probs.log().expand(4000, 4)
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(sample_next(logits, generator=g), minlength=4).double() / 4000
    torch.testing.assert_close(counts, probs, atol=0.03, rtol=0)
    nucleus = sample_next(logits, SamplingParams(top_p=0.45), generator=g)
    assert set(nucleus.tolist()) == {1, 3}
    share_1 = (nucleus == 1).double().mean().item()
    assert abs(share_1 - 0.4 / 0.7) < 0.03
    # a high temperature flattens, temperature 0 is argmax
    hot = (
        torch.bincount(
            sample_next(logits, SamplingParams(temperature=100.0), generator=g), minlength=4
        ).double()
        / 4000
    )
    torch.testing.assert_close(hot, torch.full((4,), 0.25, dtype=torch.float64), atol=0.03, rtol=0)
    assert sample_next(logits[:3], SamplingParams(temperature=0)).tolist() == [1, 1, 1]
    # temperature applies before the nucleus: at 0.1 token 1 alone holds 94% > 0.9 of the mass
    cold = sample_next(logits, SamplingParams(temperature=0.1, top_p=0.9), generator=g)
    assert set(cold.tolist()) == {1}
    again = sample_next(logits[:50], generator=torch.Generator().manual_seed(9))
    assert torch.equal(again, sample_next(logits[:50], generator=torch.Generator().manual_seed(9)))


# -- models without memory ---------------------------------------------------------------------------------


@pytest.mark.parametrize("context", [None, 4])
def test_absolute_baseline_generates_with_a_sliding_window(context):
    model = _model(attention="absolute")
    prompt, n = _prompt(p=3), 7
    spy = Spy(model)
    gen = generate(
        spy, prompt, SamplingParams(max_new_tokens=n, temperature=0), settings=DecodeSettings(context=context)
    )
    ref_tokens, ref_logits = _greedy_recompute(model, prompt, n, context=context)
    assert torch.equal(gen.tokens, ref_tokens)
    assert gen.memory is None
    assert len(spy.calls) == n
    for i, (tokens, memory, out) in enumerate(spy.calls):
        assert memory is None
        assert tokens.shape[1] == (3 + i if context is None else min(context, 3 + i))
        torch.testing.assert_close(out.log_probs[:, -1], ref_logits[i], atol=1e-10, rtol=0)


def test_window_matters_for_the_baseline():
    model = _model(attention="absolute")
    prompt = _prompt(p=6)
    full = generate(model, prompt, SamplingParams(max_new_tokens=6, temperature=0))
    short = generate(
        model, prompt, SamplingParams(max_new_tokens=6, temperature=0), settings=DecodeSettings(context=2)
    )
    assert not torch.equal(full.tokens, short.tokens)


def test_memoryless_models_refuse_memory():
    memory = _model().forward(_prompt()).memory
    for model in (_model(attention="absolute"), _model(mem_len=0)):
        with pytest.raises(ValueError, match="memory"):
            generate(model, _prompt(), SamplingParams(max_new_tokens=2), memory=memory)


def test_mem_len_zero_recomputes():
    model = _model(mem_len=0)
    prompt = _prompt()
    gen = generate(model, prompt, SamplingParams(max_new_tokens=5, temperature=0))
    assert gen.memory is None
    assert torch.equal(gen.tokens, _greedy_recompute(model, prompt, 5)[0])


# -- text --------------------------------------------------------------------------------------------------


class CharVocab:
    """A minimal character vocabulary with the interface generate_text relies on."""

    def __init__(self, symbols: str, *, eos_id: int | None = None) -> None:
        self.symbols = symbols
        self.eos_id = eos_id

    def __len__(self) -> int:
        return len(self.symbols)

    def encode(self, text: str, *, strict: bool = False) -> np.ndarray:
        unknown = sorted({c for c in text if c not in self.symbols})
        if strict and unknown:
            raise ValueError(f"unknown characters: {unknown}")
        return np.array([self.symbols.index(c) for c in text if c in self.symbols], dtype=np.int64)

    def decode(self, ids) -> str:
        return "".join(self.symbols[i] for i in np.asarray(ids).tolist())


SYMBOLS = "abcdefghijklmnopqrstuvwxyz0123456789\n"  # 37 = V


def test_generate_text_returns_the_new_text():
    model = _model()
    vocab = CharVocab(SYMBOLS)
    text = generate_text(model, vocab, "hello", SamplingParams(max_new_tokens=9, temperature=0))
    assert isinstance(text, str) and len(text) == 9
    ids = torch.as_tensor(vocab.encode("hello"))
    assert text == vocab.decode(
        generate(model, ids, SamplingParams(max_new_tokens=9, temperature=0)).new_tokens[0]
    )


def test_generate_text_unknown_token_and_empty_prompt():
    model = _model()
    with pytest.raises(ValueError, match="Z"):
        generate_text(model, CharVocab(SYMBOLS), "heZlo", SamplingParams(max_new_tokens=3))
    with pytest.raises(ValueError, match="empty"):
        generate_text(model, CharVocab(SYMBOLS), "", SamplingParams(max_new_tokens=3))
    with_eos = CharVocab(SYMBOLS, eos_id=36)
    text = generate_text(model, with_eos, "", SamplingParams(max_new_tokens=4, temperature=0))
    assert text == generate_text(model, with_eos, "\n", SamplingParams(max_new_tokens=4, temperature=0))
    with pytest.raises(ValueError, match="vocab_size"):
        generate_text(model, CharVocab(SYMBOLS[:-1]), "ab", SamplingParams(max_new_tokens=3))


# -- validation --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "kwargs", "match"),
    [
        (torch.zeros(1, 0, dtype=torch.long), {}, "empty"),
        (torch.zeros(0, dtype=torch.long), {}, "empty"),
        (torch.tensor([[1, V]]), {}, f"{V}.*vocab_size"),
        (torch.tensor([[1, -1]]), {}, "-1"),
        (torch.tensor([[1.0, 2.0]]), {}, "integer"),
        (torch.zeros(1, 2, 3, dtype=torch.long), {}, "shape"),
        (torch.tensor([[1, 2]]), {"max_new_tokens": 0}, "max_new_tokens"),
        (torch.tensor([[1, 2]]), {"max_new_tokens": 2.0}, "max_new_tokens"),
        (torch.tensor([[1, 2]]), {"temperature": -0.5}, "temperature"),
        (torch.tensor([[1, 2]]), {"temperature": float("nan")}, "temperature"),
        (torch.tensor([[1, 2]]), {"top_k": 0}, "top_k"),
        (torch.tensor([[1, 2]]), {"top_p": 0.0}, "top_p"),
        (torch.tensor([[1, 2]]), {"top_p": 1.5}, "top_p"),
        (torch.tensor([[1, 2]]), {"prompt_chunk": 0}, "prompt_chunk"),
        (torch.tensor([[1, 2]]), {"context": 0}, "context"),
    ],
)
def test_invalid_inputs_raise(prompt, kwargs, match):
    kwargs = {"max_new_tokens": 2, **kwargs}
    decode = {k: kwargs.pop(k) for k in ("prompt_chunk", "context") if k in kwargs}
    with pytest.raises(ValueError, match=match):
        generate(_model(), prompt, SamplingParams(**kwargs), settings=DecodeSettings(**decode))


def test_memory_batch_mismatch_and_helper_validation():
    model = _model()
    memory = model(_prompt(b=3)).memory
    with pytest.raises(ValueError, match="batch rows"):
        generate(model, _prompt(b=2), SamplingParams(max_new_tokens=2), memory=memory)
    with pytest.raises(ValueError, match="top_k"):
        filter_logits(torch.zeros(4), top_k=-1)
    with pytest.raises(ValueError, match="top_p"):
        filter_logits(torch.zeros(4), top_p=2)
    with pytest.raises(ValueError, match="temperature"):
        sample_next(torch.zeros(1, 4), SamplingParams(temperature=-1))
    with pytest.raises(ValueError, match="batch, vocab"):
        sample_next(torch.zeros(4))


def test_generate_text_reads_unknown_words_as_unk_with_a_warning():
    from txl.data import WordVocab
    from txl.inference.text import UnknownTokensWarning

    words = [f"w{i}" for i in range(V - 2)]
    vocab = WordVocab.build(" ".join(words))  # <unk>, <eos> and 35 words: V symbols
    model = _model()
    with pytest.warns(UnknownTokensWarning, match=r"2 prompt word\(s\).*'foo', 'bar'"):
        text = generate_text(
            model, vocab, "w1 foo w2 bar foo", SamplingParams(max_new_tokens=3, temperature=0)
        )
        read = encode_prompt(vocab, "w1 foo w2 bar foo")
    assert vocab.decode(read.tolist()) == "w1 <unk> w2 <unk> <unk>"
    unk = generate_text(
        model, vocab, "w1 <unk> w2 <unk> <unk>", SamplingParams(max_new_tokens=3, temperature=0)
    )
    assert text == unk  # the same continuation as the prompt written with <unk>
    with pytest.raises(ValueError, match="'foo'"):
        encode_prompt(vocab, "w1 foo", unknown="error")
    with pytest.raises(ValueError, match="unknown must be"):
        encode_prompt(vocab, "w1", unknown="ignore")


def test_generate_text_with_no_new_tokens_returns_the_prompt():
    vocab = CharVocab(SYMBOLS)
    model = _model()
    assert generate_text(model, vocab, "hello", SamplingParams(max_new_tokens=0)) == ""
    with pytest.raises(ValueError, match="Z"):  # the prompt is still checked
        generate_text(model, vocab, "heZlo", SamplingParams(max_new_tokens=0))


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"temperature": -0.5}, "temperature must be a finite number >= 0 (0 is greedy), got -0.5"),
        ({"temperature": float("inf")}, "temperature must be a finite number >= 0 (0 is greedy), got inf"),
        ({"top_k": 0}, "top_k must be a positive integer or None, got 0"),
        ({"top_p": 1.5}, "top_p must be in (0, 1] or None, got 1.5"),
        ({"top_p": True}, "top_p must be in (0, 1] or None, got True"),
    ],
)
def test_sampling_settings_are_checked_by_one_rule_in_config_and_generate(settings, message):
    from txl.config import GenerateConfig

    with pytest.raises(ValueError) as from_config:
        GenerateConfig(**settings)
    with pytest.raises(ValueError) as from_generate:
        generate(_model(), _prompt(), SamplingParams(max_new_tokens=2, **settings))
    assert str(from_config.value) == str(from_generate.value) == message
