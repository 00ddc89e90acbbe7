"""``load_hf``: randomly initialised Hugging Face TransfoXL models (transformers 4.35.2, the last release with
TransfoXL), saved with ``save_pretrained``, load into TransformerXL models that give the same log-probabilities
over segments with memory carried, the same memory, and the same greedy generations."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from txl import Memory
from txl.inference import SamplingParams, generate
from txl.interop import CheckpointError, config_from_hf, load_hf

transformers = pytest.importorskip(
    "transformers",
    reason="the Hugging Face reference needs transformers==4.35.2 (pip install 'transformer-xl[test-ref]')",
)
if not hasattr(transformers, "TransfoXLLMHeadModel"):
    pytest.skip(
        f"transformers {transformers.__version__} has no TransfoXL (removed after 4.35): "
        "pip install transformers==4.35.2",
        allow_module_level=True,
    )

BASE = dict(
    vocab_size=120,
    d_model=32,
    n_head=2,
    d_head=8,
    d_inner=48,
    n_layer=3,
    dropout=0.0,
    dropatt=0.0,
    eos_token_id=None,
)
VARIANTS = {
    # wt103-like: adaptive input and softmax, div_val 4, untied per-layer biases, same_length, clamp_len
    "wt103-like": dict(
        cutoffs=[20, 40, 80], d_embed=64, div_val=4, untie_r=True, same_length=True, clamp_len=6, mem_len=8
    ),
    "shared biases, div_val 1, pre-norm": dict(
        cutoffs=[30, 60],
        d_embed=24,
        div_val=1,
        untie_r=False,
        pre_lnorm=True,
        same_length=False,
        clamp_len=-1,
        mem_len=7,
    ),
    "no adaptive softmax": dict(
        cutoffs=[], d_embed=32, div_val=1, untie_r=True, same_length=True, clamp_len=1000, mem_len=6
    ),
    "untied projections": dict(
        cutoffs=[50],
        d_embed=32,
        div_val=2,
        untie_r=True,
        same_length=False,
        clamp_len=3,
        mem_len=5,
        proj_share_all_but_first=False,
    ),
}


def _hf_model(variant: str, *, seed: int = 0):
    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        config = transformers.TransfoXLConfig(**BASE, **VARIANTS[variant])
        model = transformers.TransfoXLLMHeadModel(config).eval()
    with torch.no_grad():  # biases start at 0 and norms at 1: make every tensor count, so a mix-up shows
        for name, p in model.named_parameters():
            p.add_(
                0.3 * torch.randn_like(p) if ("bias" in name or "norm" in name or "cluster" in name) else 0
            )
    return model


def _save(model, folder, fmt: str):
    model.save_pretrained(folder, safe_serialization=(fmt == "safetensors"))
    files = {p.name for p in folder.iterdir()}
    assert ("model.safetensors" if fmt == "safetensors" else "pytorch_model.bin") in files, files
    return folder


def _hf_step(model, tokens, mems):
    out = model(input_ids=tokens, mems=mems)
    return out.prediction_scores, out.mems


@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("start", ["empty memory", "hf zero memory"])
def test_load_hf_matches_transformers(tmp_path, variant, fmt, start):
    hf = _hf_model(variant)
    ours = load_hf(_save(hf, tmp_path / "hf", fmt))
    cfg = ours.config
    assert cfg.share_rel_bias == (not VARIANTS[variant]["untie_r"])
    assert cfg.cutoffs == tuple(VARIANTS[variant]["cutoffs"]) and cfg.div_val == VARIANTS[variant]["div_val"]
    b, t, d = 2, 5, BASE["d_model"]
    tokens = torch.randint(0, BASE["vocab_size"], (b, 3 * t))
    if start == "empty memory":  # both start with no memory: HF is given empty (0, B, D) tensors
        hf_mems, memory = [torch.zeros(0, b, d) for _ in range(cfg.n_layer)], None
    else:  # HF's own start, mem_len zero vectors; txl is given the same as a Memory
        hf_mems = None
        memory = Memory(tuple(torch.zeros(b, cfg.mem_len, d) for _ in range(cfg.n_layer)))
    with torch.no_grad():
        for start_at in range(0, 3 * t, t):  # three segments, memory carried
            seg = tokens[:, start_at : start_at + t]
            expected, hf_mems = _hf_step(hf, seg, hf_mems)
            out = ours(seg, memory=memory)
            torch.testing.assert_close(out.log_probs, expected, rtol=0, atol=1e-5)
            assert len(out.memory) == len(hf_mems) == cfg.n_layer
            for mine, theirs in zip(out.memory.states, hf_mems, strict=True):
                torch.testing.assert_close(mine, theirs.transpose(0, 1), rtol=0, atol=1e-5)
            memory = out.memory


@pytest.mark.parametrize("variant", ["wt103-like", "shared biases, div_val 1, pre-norm"])
def test_greedy_generation_matches_transformers(tmp_path, variant):
    hf = _hf_model(variant, seed=1)  # float32: HF's mask value overflows in float64
    ours = load_hf(_save(hf, tmp_path / "hf", "safetensors"))
    prompt = torch.randint(0, BASE["vocab_size"], (2, 4))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        expected = hf.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
    zeros = Memory(
        tuple(torch.zeros(2, ours.config.mem_len, BASE["d_model"]) for _ in range(ours.config.n_layer))
    )  # HF starts from mem_len zero vectors
    got = generate(ours, prompt, SamplingParams(max_new_tokens=12, temperature=0.0), memory=zeros)
    assert expected.shape == got.tokens.shape
    assert torch.equal(got.tokens, expected)


def test_a_broken_mapping_is_caught(tmp_path, monkeypatch):
    """The comparison can fail: swapping u and v (r_w_bias and r_r_bias) on import breaks the 1e-5 match."""
    import txl.interop.checkpoints as interop

    hf = _hf_model("wt103-like")
    folder = _save(hf, tmp_path / "hf", "safetensors")
    original = interop._hf_biases
    monkeypatch.setattr(
        interop,
        "_hf_biases",
        lambda s, c: dict(zip(("u", "v"), reversed(original(s, c).values()), strict=True)),
    )
    broken = load_hf(folder)
    tokens = torch.randint(0, BASE["vocab_size"], (2, 5))
    with torch.no_grad():
        expected, _ = _hf_step(hf, tokens, [torch.zeros(0, 2, 32)] * 3)
        with pytest.raises(AssertionError, match="Tensor-likes are not close"):
            torch.testing.assert_close(broken(tokens).log_probs, expected, rtol=0, atol=1e-5)


def test_config_mapping_and_refusals(tmp_path):
    hf = _hf_model("wt103-like")
    folder = _save(hf, tmp_path / "hf", "safetensors")
    data = json.loads((folder / "config.json").read_text())
    cfg = config_from_hf(data)
    assert (cfg.mem_len, cfg.clamp_len, cfg.same_length, cfg.d_embed, cfg.tie_projs) == (8, 6, True, 64, True)
    assert config_from_hf({**data, "clamp_len": -1}).clamp_len is None
    assert config_from_hf({**data, "mem_len": 0}).same_length is False
    older = {
        k: v for k, v in data.items() if k not in ("vocab_size", "tie_projs")
    }  # pytorch-pretrained-bert's keys
    assert config_from_hf({**older, "n_token": 120, "proj_share_all_but_first": True}) == cfg
    assert load_hf(folder / "model.safetensors").config == cfg  # a file inside the folder names the folder
    with pytest.raises(CheckpointError, match="attn_type"):
        config_from_hf({**data, "attn_type": 2})
    with pytest.raises(CheckpointError, match="tie_projs"):
        config_from_hf({**data, "tie_projs": [False, True, False, True]})
    with pytest.raises(CheckpointError, match="no config.json"):
        load_hf(tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no weights"):
        load_hf(folder)
    torch.save({"transformer.r_w_bias": torch.zeros(2, 8)}, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="no tensor for|has no"):
        load_hf(folder)


def test_pickled_weights_are_refused(tmp_path):
    """pytorch_model.bin is read with weights_only=True: a pickled object in it is refused, not run."""
    hf = _hf_model("no adaptive softmax")
    folder = _save(hf, tmp_path / "hf", "bin")
    state = torch.load(folder / "pytorch_model.bin", weights_only=True)
    state["crit.cluster_bias"] = _Payload()
    torch.save(state, folder / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="not readable weights"):
        load_hf(folder)


class _Payload:
    """An arbitrary object: unpickling it would need its class, which weights_only refuses to import."""
