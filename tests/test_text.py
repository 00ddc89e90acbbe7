"""Text around the decoding loop (``txl.text``): a run's samples are the exact decoding of what was generated
(not the pieces a stream printed), the prompt is decoded once, ``txl serve`` reads prompts as ``txl generate``
does; and the settings travel as one checked value (``GenerationSettings``, ``SamplingSettings``)."""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import txl.generate
import txl.sampling
import txl.text
from txl.config import RunConfig, TransformerXLConfig
from txl.data.vocab import WordVocab
from txl.generate import GenerationSettings, generate, stream
from txl.model import TransformerXL
from txl.runs import LoadedRun
from txl.sampling import SamplingSettings
from txl.text import UnknownTokensWarning, encode_prompt, generate_from_run, generate_text

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
    new = generate(run.model, ids, max_new_tokens=n, temperature=0).new_tokens[0].tolist()
    expected = "".join(SYMBOLS[i] for i in new) + "!"  # decode(prompt + new) after the prompt's characters
    printed: list[str] = []
    streamed = generate_from_run(
        run, prompt, max_new_tokens=n, greedy=True, on_text=lambda i, piece: printed.append(piece)
    )
    collected = generate_from_run(run, prompt, max_new_tokens=n, greedy=True)
    assert streamed.texts == collected.texts == [expected]
    assert streamed.prompt_text == "hello!" and streamed.new_tokens == collected.new_tokens == n
    assert "".join(printed) != expected  # what a stream can print falls short here: the result does not


def test_the_prompt_is_decoded_once_for_all_samples():
    vocab = SuffixVocab()
    run = _run(vocab)
    ids = [SYMBOLS.index(c) for c in "abc"]
    for on_text in (None, lambda i, piece: None):
        vocab.decoded.clear()
        result = generate_from_run(run, "abc", max_new_tokens=3, seed=1, num_samples=3, on_text=on_text)
        assert len(result.texts) == 3
        assert vocab.decoded.count(ids) == 1


def test_seeded_samples_equal_generate_with_one_generator():
    """The run-level API with its [generate] defaults draws what generate draws from one seeded generator."""
    vocab = SuffixVocab()
    run = _run(vocab, temperature=0.9, top_k=5)
    ids = torch.tensor([SYMBOLS.index(c) for c in "ab"])
    generator = torch.Generator().manual_seed(3)
    expected = [
        "".join(SYMBOLS[i] for i in generate(run.model, ids, max_new_tokens=4, temperature=0.9, top_k=5,
                                             generator=generator).new_tokens[0].tolist()) + "!"
        for _ in range(2)
    ]  # fmt: skip
    assert generate_from_run(run, "ab", max_new_tokens=4, seed=3, num_samples=2).texts == expected


def test_serve_reads_prompts_as_generate_does():
    from txl.serve.app import _encode

    vocab = WordVocab("the cat sat on mat".split())
    run = SimpleNamespace(vocab=vocab)
    text = "the dog sat on a mat"
    with pytest.warns(UnknownTokensWarning, match=r"2 prompt word\(s\) .*'dog', 'a'"):
        expected = encode_prompt(vocab, text)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ids, notes = _encode(run, text, field_name="prompt")
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
    settings = GenerationSettings(
        max_new_tokens=5, sampling=SamplingSettings(temperature=0.8, top_p=0.9), stop_ids=torch.tensor([4])
    )
    assert settings.stop_ids == (4,)
    by_keywords = generate(
        model, prompt, max_new_tokens=5, temperature=0.8, top_p=0.9, stop_ids=[4],
        generator=torch.Generator().manual_seed(7),
    )  # fmt: skip
    by_value = generate(model, prompt, settings=settings, generator=torch.Generator().manual_seed(7))
    assert torch.equal(by_keywords.tokens, by_value.tokens)
    streamed = list(stream(model, prompt, settings=settings, generator=torch.Generator().manual_seed(7)))
    assert torch.equal(torch.stack(streamed, dim=1), by_value.new_tokens)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.max_new_tokens = 6
    with pytest.raises(ValueError, match="not both"):
        generate(model, prompt, settings=settings, temperature=0.5)
    with pytest.raises(ValueError, match="not both"):
        generate_text(_run(SuffixVocab()).model, SuffixVocab(), "abc", settings=settings, max_new_tokens=2)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingSettings(top_p=0)
    with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
        GenerationSettings(max_new_tokens=0)


def test_moved_names_still_resolve_from_txl_generate():
    for name in ("generate_text", "TextStream", "generate_from_run", "TextSamples", "UnknownTokensWarning",
                 "encode_prompt", "MAX_NEW_TOKENS"):  # fmt: skip
        assert getattr(txl.generate, name) is getattr(txl.text, name)
    for name in ("filter_logits", "sample_next", "SamplingSettings"):
        assert getattr(txl.generate, name) is getattr(txl.sampling, name)
    namespace: dict = {}
    exec("from txl.generate import *", namespace)
    assert set(txl.generate.__all__) <= set(namespace)
    with pytest.raises(AttributeError, match="no_such_name"):
        txl.generate.no_such_name  # noqa: B018
