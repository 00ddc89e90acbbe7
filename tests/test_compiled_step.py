"""The one-position step compiled ahead of time (``Decoder(..., compiled=True)``) against the plain paths: the
model's ordinary ``forward`` with a sliding memory (an independent reference), the eager step (1e-6 in
float32, absolute and relative), 500 greedy tokens, documents, rows that join and leave, two models of one size in one process, and
the eager fallback with one warning where nothing compiles. Each set of sizes compiles once (module fixtures,
a folder of compiled steps of their own)."""

from __future__ import annotations

import warnings

import pytest
import torch

import txl.model.compiled as compiled
from txl import TransformerXL, TransformerXLConfig
from txl.inference import DecodeSettings, SamplingParams, generate
from txl.model import KVCache
from txl.model.decode import Decoder

V = 50
B = 2

VARIANTS = {
    "post_norm": {},
    "pre_norm_same_length_clamp": {
        "pre_norm": True,
        "final_norm": True,
        "same_length": True,
        "clamp_len": 7,
        "share_rel_bias": False,
    },
}


def _model(seed: int = 0, **changes) -> TransformerXL:
    fields = dict(
        vocab_size=V, n_layer=2, n_head=3, d_head=8, d_model=16, d_inner=32, mem_len=12, init_std=0.3
    )
    fields.update(changes)
    torch.manual_seed(seed)
    model = TransformerXL(TransformerXLConfig(**fields))
    with torch.no_grad():  # biases start at 0: make them count, so that a path that drops one is caught
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.3)
    return model.eval()


@pytest.fixture(scope="module", autouse=True)
def compiled_dir(compiled_steps_dir):
    """The session's folder of compiled steps (each set of sizes compiles once)."""
    return compiled_steps_dir


def _prompt(b=B, p=6, seed=1):
    return torch.randint(0, V, (b, p), generator=torch.Generator().manual_seed(seed))


def _compiled_decoder(model: TransformerXL, b: int = B) -> Decoder:
    decoder = Decoder(model, KVCache(model.config, batch_size=b), compiled=True)
    return decoder


def _reference_greedy(model, prompt, n):
    """The prompt through ordinary forward, then one token at a time through forward with the memory the
    previous call returned (sliding at mem_len); no cache, no decoder."""
    with torch.no_grad():
        out = model(prompt)
        memory, scores = out.memory, [out.log_probs[:, -1]]
        for _ in range(n - 1):
            out = model(scores[-1].argmax(-1)[:, None], memory=memory)
            memory = out.memory
            scores.append(out.log_probs[:, -1])
    return torch.stack(scores, 1)  # (B, n, V)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_compiled_greedy_equals_forward_and_the_eager_step(variant):
    """100 greedy steps (the memory of 12 slides for 90, the buffers move back to the front): the compiled step
    gives forward's log-probabilities, and the eager step's to 1e-6."""
    model = _model(**VARIANTS[variant])
    prompt, n = _prompt(), 100
    want = _reference_greedy(model, prompt, n)
    fast = _compiled_decoder(model)
    eager = Decoder(model, KVCache(model.config, batch_size=B))
    got, plain = [fast.prefill(prompt)], [eager.prefill(prompt)]
    for _ in range(n - 1):
        got.append(fast.step(got[-1].argmax(-1)))
        plain.append(eager.step(plain[-1].argmax(-1)))
    assert fast.compiled and fast._fast is not None  # it did run compiled
    torch.testing.assert_close(torch.stack(got, 1), want, atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.stack(got, 1), torch.stack(plain, 1), atol=1e-6, rtol=1e-6)
    for a, b in zip(fast.cache.memory().states, eager.cache.memory().states, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=0)  # the residual stream, larger than log-probs


def test_500_greedy_tokens_are_identical_through_generate():
    """``generate`` with ``DecodeSettings(compiled=True)`` against the eager default: the same 500 tokens, the
    same scores to 1e-6."""
    model = _model()
    params = SamplingParams(max_new_tokens=500, temperature=0)
    eager = generate(model, _prompt(), params, return_scores=True)
    fast = generate(model, _prompt(), params, settings=DecodeSettings(compiled=True), return_scores=True)
    assert torch.equal(fast.new_tokens, eager.new_tokens)
    torch.testing.assert_close(fast.scores, eager.scores, atol=1e-6, rtol=1e-6)


def test_documents_each_row_as_alone():
    """A row whose token begins a new document (``starts``) attends nothing before it: its log-probabilities
    are those of a fresh decoder fed the document alone; the other row goes on as the eager step's."""
    model = _model()
    g = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, V, (B, 30), generator=g)
    fast, eager = _compiled_decoder(model), Decoder(model, KVCache(model.config, batch_size=B))
    fast.prefill(tokens[:, :5])
    eager.prefill(tokens[:, :5])
    starts = torch.zeros(B, 30, dtype=torch.bool)
    starts[0, 9] = True
    got, plain = [], []
    for i in range(5, 30):
        got.append(fast.step(tokens[:, i], starts=starts[:, i]))
        plain.append(eager.step(tokens[:, i], starts=starts[:, i]))
    torch.testing.assert_close(torch.stack(got, 1), torch.stack(plain, 1), atol=1e-6, rtol=1e-6)
    alone = Decoder(model, KVCache(model.config, batch_size=1))
    doc = [alone.prefill(tokens[:1, 9:10])] + [alone.step(tokens[:1, i]) for i in range(10, 30)]
    torch.testing.assert_close(torch.stack(got, 1)[0, 4:], torch.stack(doc, 1)[0], atol=1e-5, rtol=0)
    assert fast.cache.reach.tolist() == eager.cache.reach.tolist()


def test_rows_that_join_and_leave_equal_the_eager_engine():
    """Five prompts of different lengths through two rows (requests wait, join a freed row, leave at their
    own lengths): the compiled engine gives the eager engine's tokens and scores."""
    model = _model()
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, V, (n,), generator=g) for n in (3, 9, 5, 14, 2)]
    params = [SamplingParams(max_new_tokens=n, temperature=0) for n in (7, 30, 12, 20, 25)]
    eager = generate(model, prompts, params, settings=DecodeSettings(rows=B), return_scores=True)
    fast = generate(
        model, prompts, params, settings=DecodeSettings(rows=B, compiled=True), return_scores=True
    )
    for a, b in zip(fast.new_tokens, eager.new_tokens, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(fast.scores, eager.scores, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-6)


def test_two_models_of_one_size_share_the_package_with_their_own_weights():
    """Two models of equal sizes step alternately through one loaded package: each gets its own weights'
    log-probabilities."""
    first, second = _model(0), _model(5)
    prompt = _prompt()
    decoders = [_compiled_decoder(first), _compiled_decoder(second)]
    eagers = [Decoder(m, KVCache(m.config, batch_size=B)) for m in (first, second)]
    got = [[d.prefill(prompt)] for d in decoders]
    want = [[d.prefill(prompt)] for d in eagers]
    for _ in range(10):
        for k in range(2):
            got[k].append(decoders[k].step(want[k][-1].argmax(-1)))
            want[k].append(eagers[k].step(want[k][-1].argmax(-1)))
    assert decoders[0]._fast.step.run is decoders[1]._fast.step.run
    for k in range(2):
        torch.testing.assert_close(torch.stack(got[k], 1), torch.stack(want[k], 1), atol=1e-6, rtol=1e-6)


def test_without_a_compiler_it_steps_eagerly_with_one_warning(monkeypatch, tmp_path):
    """Where compiling fails (as without a C++ compiler) the decoder warns once and steps eagerly."""

    def no_compiler(sizes, path):
        raise RuntimeError("no C++ compiler found")

    monkeypatch.setenv(compiled.COMPILED_DIR_VAR, str(tmp_path))
    monkeypatch.setattr(compiled, "_compile", no_compiler)
    monkeypatch.setattr(compiled, "_LOADED", {})
    monkeypatch.setattr(compiled, "_WARNED", set())
    model = _model()
    prompt = _prompt()
    with pytest.warns(RuntimeWarning, match="compiled decoding step is not available.*no C\\+\\+ compiler"):
        fast = _compiled_decoder(model)
        got = [fast.prefill(prompt)]
        got.append(fast.step(got[-1].argmax(-1)))
    assert not fast.compiled
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process
        again = _compiled_decoder(model)
        again.prefill(prompt)
        again.step(got[0].argmax(-1))
    eager = Decoder(model, KVCache(model.config, batch_size=B))
    want = [eager.prefill(prompt)]
    want.append(eager.step(want[-1].argmax(-1)))
    torch.testing.assert_close(torch.stack(got), torch.stack(want), atol=0, rtol=0)


def test_where_it_cannot_run_it_steps_eagerly():
    """float64, training mode: the eager step, silently (nothing to warn about: a choice of the model)."""
    model = _model().double()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decoder = Decoder(model, KVCache(model.config, batch_size=1, dtype=torch.float64), compiled=True)
        decoder.step(decoder.prefill(_prompt(1)).argmax(-1))
    assert not decoder.compiled
    with pytest.raises(ValueError, match="compiled"):
        Decoder(model, KVCache(model.config, batch_size=1), compiled="yes")
    with pytest.raises(ValueError, match="compiled"):
        DecodeSettings(compiled=1)
