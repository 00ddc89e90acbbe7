"""``txl convert``: Hugging Face and original checkpoints become run folders whose model is the same model, and
which ``txl eval`` and ``txl generate`` accept from the command line."""

from __future__ import annotations

import dataclasses
import json
import pickle
import warnings

import pytest
import torch

from txl import Memory, TransformerXL, TransformerXLConfig
from txl.cli import main
from txl.interop import txl_to_original
from txl.runs import load_run

WORDS = ["<eos>", "the", ",", ".", "<unk>", "of", "and"] + [f"w{i}" for i in range(113)]  # 120 symbols


def _vocab_pickle(folder, symbols=WORDS):
    data = {
        "special": ["<eos>"],
        "lower_case": False,
        "delimiter": None,
        "idx2sym": list(symbols),
        "sym2idx": {s: i for i, s in enumerate(symbols)},
        "eos_idx": 0,
    }
    (folder / "vocab.pkl").write_bytes(pickle.dumps(data, protocol=2))


def _corpus(tmp_path):
    torch.manual_seed(3)
    ids = torch.randint(1, len(WORDS), (4000,)).tolist()
    lines = [
        " ".join(WORDS[i] for i in ids[j : j + 20] if WORDS[i] != "<eos>") for j in range(0, len(ids), 20)
    ]
    path = tmp_path / "text.txt"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _run(args, capsys):
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def hf_folder(tmp_path):
    transformers = pytest.importorskip(
        "transformers",
        reason="the Hugging Face reference needs transformers==4.35.2 (pip install 'transformer-xl[test-ref]')",
    )
    if not hasattr(transformers, "TransfoXLLMHeadModel"):
        pytest.skip(
            f"transformers {transformers.__version__} has no TransfoXL: pip install transformers==4.35.2"
        )
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.TransfoXLConfig(
            vocab_size=len(WORDS),
            d_model=32,
            d_embed=64,
            n_head=2,
            d_head=8,
            d_inner=48,
            n_layer=2,
            div_val=4,
            cutoffs=[20, 40, 80],
            mem_len=8,
            clamp_len=6,
            same_length=True,
            untie_r=True,
            dropout=0.0,
            eos_token_id=None,
            tgt_len=16,
        )
        hf = transformers.TransfoXLLMHeadModel(config).eval()
    folder = tmp_path / "hf"
    hf.save_pretrained(folder)
    _vocab_pickle(folder)
    return hf, folder


def test_convert_hf_evaluates_and_generates(tmp_path, hf_folder, capsys):
    hf, folder = hf_folder
    corpus = _corpus(tmp_path)
    run_dir = tmp_path / "run"
    code, out, err = _run(["convert", folder, run_dir, "--corpus", corpus], capsys)
    assert code == 0, err
    assert out.strip() == str(run_dir)
    run = load_run(run_dir)
    assert list(run.vocab.symbols) == WORDS and run.config.eval.tgt_len == 16
    assert (run.config.model.mem_len, run.config.model.clamp_len, run.config.model.same_length) == (
        8,
        6,
        True,
    )
    tokens = torch.randint(0, len(WORDS), (2, 7))
    with torch.no_grad():  # the run's model is Hugging Face's model (from the same zero memory)
        zeros = [torch.zeros(8, 2, 32) for _ in range(2)]
        expected = hf(input_ids=tokens, mems=zeros).prediction_scores
        got = run.model(tokens, memory=Memory(tuple(z.transpose(0, 1) for z in zeros))).log_probs
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)

    code, out, err = _run(["eval", run_dir, "--split", "test", "--quiet", "--json"], capsys)
    assert code == 0, err
    record = json.loads(out)
    assert record["tgt_len"] == 16 and record["mem_len"] == 8 and record["same_length"] is True
    assert 0 < record["loss"] < 2 * torch.log(torch.tensor(float(len(WORDS)))).item()

    code, out, err = _run(
        ["generate", run_dir, "--prompt", "the w3 of", "--max-new-tokens", "6", "--greedy"], capsys
    )
    assert code == 0, err
    assert out.startswith("the w3 of") and "txl: 6 tokens in" in err

    code, _, err = _run(["convert", folder, run_dir], capsys)  # never over another run without --overwrite
    assert code == 2 and "already holds a run" in err
    code, _, err = _run(
        ["convert", folder, run_dir, "--overwrite", "--mem-len", "32", "--no-same-length"], capsys
    )
    assert code == 0, err
    assert (load_run(run_dir).config.model.mem_len, load_run(run_dir).config.model.same_length) == (32, False)


def test_convert_original_round_trip(tmp_path, capsys):
    config = TransformerXLConfig(
        vocab_size=len(WORDS),
        n_layer=2,
        n_head=2,
        d_head=8,
        d_model=16,
        d_inner=32,
        d_embed=24,
        cutoffs=(10, 25),
        mem_len=6,
    )
    source = TransformerXL(config)
    with torch.no_grad():
        for p in source.parameters():
            p.add_(0.1 * torch.randn_like(p))
    torch.save(txl_to_original(source), tmp_path / "model.pt")
    (tmp_path / "vocab.txt").write_text("\n".join(WORDS) + "\n", encoding="utf-8")
    run_dir = tmp_path / "run"
    code, _, err = _run(["convert", tmp_path / "model.pt", run_dir, "--from", "original"], capsys)
    assert code == 2 and "--mem-len" in err
    code, _, err = _run(
        [
            "convert",
            tmp_path / "model.pt",
            run_dir,
            "--mem-len",
            "6",
            "--cutoffs",
            "10,25",
            "--clamp-len",
            "4",
            "--same-length",
            "--corpus",
            _corpus(tmp_path),
        ],
        capsys,
    )
    assert code == 0, err
    run = load_run(run_dir)
    assert run.config.model == dataclasses.replace(config, clamp_len=4, same_length=True)
    for (name, ours), theirs in zip(
        run.model.state_dict().items(), source.state_dict().values(), strict=True
    ):
        assert torch.equal(ours, theirs), name
    code, out, err = _run(
        ["eval", run_dir, "--split", "valid", "--quiet", "--json", "--tgt-len", "8"], capsys
    )
    assert code == 0, err
    assert json.loads(out)["tokens"] > 0


def test_convert_refuses_mismatched_vocabularies(tmp_path, hf_folder, capsys):
    _, folder = hf_folder
    _vocab_pickle(folder, WORDS[:50])
    code, _, err = _run(["convert", folder, tmp_path / "run"], capsys)
    assert code == 2 and "vocabulary has 50 symbols, the model 120" in err
    assert not (tmp_path / "run").exists()
    code, _, err = _run(["convert", tmp_path / "missing", tmp_path / "run"], capsys)
    assert code == 2 and "not found" in err
