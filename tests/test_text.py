"""Text around the decoding loop (``txl.inference.text``): a run's samples are the exact decoding of what was
generated (not the pieces a stream printed), the prompt is decoded once, ``txl serve`` reads prompts as ``txl
generate`` does; and the settings travel as one checked value (``GenerationSettings``)."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import txl
import txl.inference
from txl.config import RunConfig, TransformerXLConfig
from txl.data.vocab import WordVocab
from txl.inference import GenerationSettings, generate, stream
from txl.inference.text import (
    UnknownTokensWarning,
    encode_prompt,
    generate_from_run,
    generate_text,
    run_settings,
)
from txl.model import TransformerXL
from txl.runs import LoadedRun

SYMBOLS = "abcdefghijklmnopqrstuvwxyz0123456789\n"


class SuffixVocab:
    """Characters, decoded with a trailing "!": each new token rewrites the end of the text already decoded,
    as rare BPE merges do, so the pieces a stream can print are not the whole text. Counts its decodings."""

    def __init__(self) -> None:
        self.decoded: list[list[int]] = []

    def __len__(self) -> int:
        return len(SYMBOLS)

    def encode(self, text: str, *, strict: bool = False) -> np.ndarray:
        return np.array([SYMBOLS.index(c) for c in text], dtype=np.int64)

    def decode(self, ids) -> str:
        ids = [int(i) for i in ids]
        self.decoded.append(ids)
        return "".join(SYMBOLS[i] for i in ids) + "!"


def _run(vocab, **generate_fields) -> LoadedRun:
    config = TransformerXLConfig(
        vocab_size=len(SYMBOLS),
        n_layer=2,
        n_head=2,
        d_head=4,
        d_model=8,
        d_inner=16,
        mem_len=16,
        init_std=0.3,
    )
    torch.manual_seed(0)
    model = TransformerXL(config).eval()
    run_config = RunConfig(model=config)
    if generate_fields:
        run_config = dataclasses.replace(
            run_config, generate=dataclasses.replace(run_config.generate, **generate_fields)
        )
    return LoadedRun(config=run_config, vocab=vocab, model=model, checkpoint=Path("."), step=0)


def test_run_samples_are_the_exact_decoding_not_the_printed_pieces():
    vocab = SuffixVocab()
    run = _run(vocab)
    n, prompt = 6, "hello"
    ids = torch.tensor([SYMBOLS.index(c) for c in prompt])
    new = generate(run.model, ids, GenerationSettings(max_new_tokens=n, temperature=0)).new_tokens[0].tolist()
    expected = "".join(SYMBOLS[i] for i in new) + "!"  # decode(prompt + new) after the prompt's characters
    printed: list[str] = []
    greedy = GenerationSettings(max_new_tokens=n, temperature=0)
    streamed = generate_from_run(run, prompt, greedy, on_text=lambda i, piece: printed.append(piece))
    collected = generate_from_run(run, prompt, greedy)
    assert streamed.texts == collected.texts == [expected]
    assert streamed.prompt_texts == ["hello!"] and streamed.new_tokens == collected.new_tokens == n
    assert "".join(printed) != expected  # what a stream can print falls short here: the result does not


def test_the_prompt_is_decoded_once_for_all_samples():
    vocab = SuffixVocab()
    run = _run(vocab)
    ids = [SYMBOLS.index(c) for c in "abc"]
    for on_text in (None, lambda i, piece: None):
        vocab.decoded.clear()
        settings = GenerationSettings(max_new_tokens=3, seed=1)
        result = generate_from_run(run, "abc", settings, num_samples=3, on_text=on_text)
        assert len(result.texts) == 3
        assert vocab.decoded.count(ids) == 1


def test_seeded_samples_equal_generate_alone_with_their_own_seed():
    """The run-level API with its [generate] defaults: row r (prompt r // num_samples, its sample
    r % num_samples) draws what generate draws alone from a generator seeded with seed + r % num_samples,
    though all rows run as one batch."""
    vocab = SuffixVocab()
    run = _run(vocab, temperature=0.9, top_k=5)
    settings = dataclasses.replace(run_settings(run), max_new_tokens=4, seed=3)
    assert (settings.temperature, settings.top_k) == (0.9, 5)
    prompts = ["ab", "hello", "z"]
    expected = []
    for r in range(6):
        ids = torch.tensor([SYMBOLS.index(c) for c in prompts[r // 2]])
        generator = torch.Generator().manual_seed(3 + r % 2)
        new = generate(run.model, ids, settings, generator=generator).new_tokens[0].tolist()
        expected.append("".join(SYMBOLS[i] for i in new) + "!")
    result = generate_from_run(run, prompts, settings, num_samples=2)
    assert result.texts == expected
    assert result.prompts == ["ab", "ab", "hello", "hello", "z", "z"]
    assert len(set(expected)) > 1  # the rows really differ


def test_serve_reads_prompts_as_generate_does():
    from txl.serve.checks import encode_text

    vocab = WordVocab("the cat sat on mat".split())
    run = SimpleNamespace(vocab=vocab)
    text = "the dog sat on a mat"
    with pytest.warns(UnknownTokensWarning, match=r"2 prompt word\(s\) .*'dog', 'a'"):
        expected = encode_prompt(vocab, text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ids, notes = encode_text(run, text, field_name="prompt")
    assert (
        ids.tolist() == expected.tolist() == [vocab.index[w] if w in vocab.index else 0 for w in text.split()]
    )
    assert notes == ["2 word(s) of prompt not in the vocabulary, read as <unk>: 'dog', 'a'"]


def test_settings_are_one_checked_value():
    torch.manual_seed(0)
    model = TransformerXL(
        TransformerXLConfig(vocab_size=11, n_layer=1, d_model=8, n_head=2, d_head=4, d_inner=8)
    )
    prompt = torch.tensor([[1, 2, 3]])
    settings = GenerationSettings(max_new_tokens=5, temperature=0.8, top_p=0.9, stop_ids=torch.tensor([4]))
    assert settings.stop_ids == (4,)
    assert settings == GenerationSettings(max_new_tokens=5, temperature=0.8, top_p=0.9, stop_ids=[4])
    by_value = generate(model, prompt, settings, generator=torch.Generator().manual_seed(7))
    seeded = generate(model, prompt, dataclasses.replace(settings, seed=7))
    assert torch.equal(seeded.tokens, by_value.tokens)
    streamed = list(stream(model, prompt, settings, generator=torch.Generator().manual_seed(7)))
    assert torch.equal(torch.stack([s.tokens for s in streamed], dim=1), by_value.new_tokens)
    assert torch.equal(torch.cat([s.log_probs for s in streamed]), generate(model, prompt, settings, generator=torch.Generator().manual_seed(7), return_scores=True).scores[0])  # fmt: skip
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_new_tokens = 6  # type: ignore[misc]
    with pytest.raises(TypeError):
        generate(model, prompt, settings, temperature=0.5)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="settings must be a GenerationSettings"):
        generate(model, prompt, {"max_new_tokens": 3})  # type: ignore[arg-type]
    for field, value, message in [
        ("top_p", 0, "top_p must be in"),
        ("temperature", -1, "temperature must be"),
        ("top_k", 0, "top_k must be"),
        ("max_new_tokens", -1, "max_new_tokens must be an integer >= 0"),
        ("stop_ids", [], "stop_ids must be a non-empty"),
        ("stop_ids", [1.5], "stop_ids must be a non-empty"),
        ("stop_ids", [-2], "stop_ids must be token ids >= 0"),
        ("stop", "ab", "stop must be a list"),
        ("stop", [""], "stop must be a list"),
        ("seed", -1, "seed must be"),
        ("prompt_chunk", 0, "prompt_chunk must be a positive integer"),
        ("context", True, "context must be a positive integer"),
        ("span", 3, "span must be a txl Span"),
    ]:
        with pytest.raises(ValueError, match=message):
            GenerationSettings(**{field: value})
    with pytest.raises(ValueError, match="max_new_tokens must be at least 1"):
        generate(model, prompt, GenerationSettings(max_new_tokens=0))
    with pytest.raises(ValueError, match="stop strings need a vocabulary"):
        stream(model, prompt, GenerationSettings(stop=("x",)))
    with pytest.raises(ValueError, match=r"stop_ids must be token ids in \[0, 11\)"):
        generate(model, prompt, GenerationSettings(stop_ids=[11]))


def test_the_decoding_core_has_one_address():
    """The root's decoding names are the functions and classes of txl.inference; the old modules are gone."""
    import importlib.util

    assert txl.generate is txl.inference.generate and callable(txl.generate)
    assert txl.stream is txl.inference.stream
    assert txl.GenerationSettings is txl.inference.GenerationSettings and txl.Step is txl.inference.Step
    for old in ("txl.generate", "txl.text", "txl.sampling", "txl.safe_pickle", "txl.analysis.baseline"):
        assert importlib.util.find_spec(old) is None, old


class CharVocab:
    """Plain characters, one token each."""

    def __len__(self) -> int:
        return len(SYMBOLS)

    def encode(self, text: str, *, strict: bool = False) -> np.ndarray:
        return np.array([SYMBOLS.index(c) for c in text], dtype=np.int64)

    def decode(self, ids) -> str:
        return "".join(SYMBOLS[int(i)] for i in ids)


def _naive_cut(text: str, stop: list[str]) -> str:
    """The text before the first position at which any stop string begins (a scan, position by position)."""
    for i in range(len(text)):
        if any(text.startswith(s, i) for s in stop):
            return text[:i]
    return text


def test_two_stop_strings_completing_on_one_token_cut_at_the_earlier():
    """Stop strings "xy" and "y" both complete on the token y: the text ends before x (where the first
    stop string begins), whichever of the two is listed first; through generate_text, the run-level API with
    its streamed pieces, and TextStream itself."""
    vocab = CharVocab()
    run = _run(vocab)
    settings = GenerationSettings(max_new_tokens=40, seed=11)
    text = generate_text(run.model, vocab, "the\n", settings)
    assert len(text) == 40
    # the first token that completes both a two-character and a one-character stop string for the first time
    j = next(
        j for j in range(1, len(text)) if text[j] not in text[:j] and text[j - 1 : j + 1] not in text[:j]
    )
    for stop in ([text[j - 1 : j + 1], text[j]], [text[j], text[j - 1 : j + 1]]):
        expected = _naive_cut(text, stop)
        assert expected == text[: j - 1]
        stopped = dataclasses.replace(settings, stop=tuple(stop))
        assert generate_text(run.model, vocab, "the\n", stopped) == expected
        printed: list[str] = []
        result = generate_from_run(
            run, "the\n", stopped, on_text=lambda i, piece, out=printed: out.append(piece)
        )
        assert result.texts == [expected] and "".join(printed) == expected
        pieces = txl.inference.text.TextStream(vocab, vocab.encode("the\n"), stop=stop)
        shown = "".join(pieces.push(int(i)) for i in vocab.encode(text[: j + 1]))
        assert pieces.stopped and pieces.text == shown == expected
