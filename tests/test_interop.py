"""``load_original``: the authors' MemTransformerLM state_dict (their names, time-major layout inside)
loads into an equivalent TransformerXL, checked against a literal re-statement of their forward."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from reference_original import original_forward
from txl import TransformerXL, TransformerXLConfig
from txl.interop import CheckpointError, OriginalSettings, config_from_original, load_original


def _original_state(model: TransformerXL) -> dict[str, torch.Tensor]:
    """Our weights renamed by hand to the original's keys (written independently of txl.interop)."""
    cfg = model.config
    s: dict[str, torch.Tensor] = {"r_w_bias": model.u.detach().clone(), "r_r_bias": model.v.detach().clone()}
    for i, layer in enumerate(model.layers):
        p = f"layers.{i}."
        s[p + "dec_attn.qkv_net.weight"] = layer.attn.qkv.weight.detach().clone()
        s[p + "dec_attn.r_net.weight"] = layer.attn.r_net.weight.detach().clone()
        s[p + "dec_attn.o_net.weight"] = layer.attn.out.weight.detach().clone()
        for ours, theirs in (("attn_norm", "dec_attn.layer_norm"), ("ff_norm", "pos_ff.layer_norm")):
            s[p + theirs + ".weight"] = getattr(layer, ours).weight.detach().clone()
            s[p + theirs + ".bias"] = getattr(layer, ours).bias.detach().clone()
        for j in (0, 3):
            s[p + f"pos_ff.CoreNet.{j}.weight"] = layer.ff.net[j].weight.detach().clone()
            s[p + f"pos_ff.CoreNet.{j}.bias"] = layer.ff.net[j].bias.detach().clone()
    for i, emb in enumerate(model.embedding.emb_layers):
        s[f"word_emb.emb_layers.{i}.weight"] = emb.weight.detach().clone()
    for key, proj in model.embedding.emb_projs.items():
        s[f"word_emb.emb_projs.{key}"] = proj.detach().clone()
    for i, out in enumerate(model.softmax.out_layers):
        s[f"crit.out_layers.{i}.weight"] = out.weight.detach().clone()
        s[f"crit.out_layers.{i}.bias"] = out.bias.detach().clone()
    for key, proj in model.softmax.out_projs.items():
        s[f"crit.out_projs.{key}"] = proj.detach().clone()
    if cfg.cutoffs:
        s["crit.cluster_weight"] = model.softmax.cluster_weight.detach().clone()
        s["crit.cluster_bias"] = model.softmax.cluster_bias.detach().clone()
    s["pos_emb.inv_freq"] = 1.0 / (10000 ** (torch.arange(0.0, cfg.d_model, 2.0) / cfg.d_model))
    return s


VARIANTS = {
    "plain": {},
    "pre-norm": {"pre_norm": True},
    "adaptive div_val 2": {"cutoffs": (10, 20), "div_val": 2, "d_embed": 16},
    "adaptive div_val 1": {"cutoffs": (10, 25)},
    "untied": {"tie_weights": False},
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_load_original_round_trip_matches_reference(tmp_path, tiny_config, variant):
    config = dataclasses.replace(tiny_config, mem_len=6, **VARIANTS[variant])
    source = TransformerXL(config).double()
    with torch.no_grad():  # make biases and norms non-trivial so a mix-up would show
        for name, p in source.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    state = _original_state(source)
    path = tmp_path / "model.pt"
    torch.save(state, path)

    kwargs = {"cutoffs": config.cutoffs} if config.cutoffs and config.div_val == 1 else {}
    loaded = load_original(path, OriginalSettings(pre_norm=config.pre_norm, mem_len=6, **kwargs)).double()
    inferred = loaded.config
    assert (inferred.n_layer, inferred.n_head, inferred.d_head, inferred.d_model, inferred.d_inner) == (
        config.n_layer,
        config.n_head,
        config.d_head,
        config.d_model,
        config.d_inner,
    )
    assert (inferred.vocab_size, inferred.cutoffs, inferred.div_val, inferred.tie_weights) == (
        config.vocab_size,
        config.cutoffs,
        config.div_val,
        config.tie_weights,
    )
    assert inferred.embed_dim == config.embed_dim

    tokens = torch.randint(0, config.vocab_size, (2, 8))
    targets = torch.randint(0, config.vocab_size, (2, 8))
    ours_mem, theirs_mem = None, None
    ref_state = {k: v.double() for k, v in state.items()}
    for start in (0, 4):  # two segments: the second reads memory
        seg, tgt = tokens[:, start : start + 4], targets[:, start : start + 4]
        out = loaded(seg, memory=ours_mem, targets=tgt)
        ref_loss, theirs_mem = original_forward(
            ref_state,
            seg.t(),
            tgt.t(),
            theirs_mem,
            mem_len=6,
            cutoffs=list(config.cutoffs),
            pre_lnorm=config.pre_norm,
        )
        torch.testing.assert_close(out.loss, ref_loss.t(), rtol=0, atol=1e-10)
        torch.testing.assert_close(
            out.loss, source.eval()(seg, memory=ours_mem, targets=tgt).loss, rtol=0, atol=1e-12
        )
        # the original keeps n_layer + 1 states; its last (the final layer's output) is never read
        assert len(theirs_mem) == len(out.memory) + 1
        for ours, theirs in zip(out.memory.states, theirs_mem[:-1], strict=True):
            torch.testing.assert_close(ours, theirs.transpose(0, 1), rtol=0, atol=1e-10)
        ours_mem = out.memory


def test_reference_same_length_and_clamp(tiny_config):
    config = dataclasses.replace(tiny_config, mem_len=5, same_length=True, clamp_len=3)
    model = TransformerXL(config).double().eval()
    state = {k: v.double() for k, v in _original_state(model).items()}
    tokens = torch.randint(0, 37, (1, 12))
    ours, theirs = None, None
    for start in range(0, 12, 4):
        seg = tokens[:, start : start + 4]
        out = model(seg, memory=ours, targets=seg)
        ref, theirs = original_forward(
            state, seg.t(), seg.t(), theirs, mem_len=5, same_length=True, clamp_len=3
        )
        torch.testing.assert_close(out.loss, ref.t(), rtol=0, atol=1e-10)
        ours = out.memory


def test_load_original_rejects_bad_files(tmp_path, tiny_config):
    with pytest.raises(CheckpointError, match="not found"):
        load_original(tmp_path / "missing.pt", OriginalSettings(mem_len=4))
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint")
    with pytest.raises(CheckpointError, match="not a readable"):
        load_original(junk, OriginalSettings(mem_len=4))
    partial = tmp_path / "partial.pt"
    torch.save({"r_w_bias": torch.zeros(2, 3)}, partial)
    with pytest.raises(CheckpointError, match="missing"):
        load_original(partial, OriginalSettings(mem_len=4))
    state = _original_state(TransformerXL(dataclasses.replace(tiny_config, cutoffs=(10, 20))))
    with pytest.raises(CheckpointError, match="cutoffs"):
        config_from_original(state, OriginalSettings(mem_len=4))


class Payload:
    """An arbitrary Python object: unpickling it would run code of our choosing."""


def test_load_original_refuses_pickled_objects(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"r_w_bias": Payload()}, path)
    with pytest.raises(CheckpointError):
        load_original(path, OriginalSettings(mem_len=4))


def test_inferred_config_is_a_valid_config(tiny_config):
    state = _original_state(TransformerXL(tiny_config))
    config = config_from_original(state, OriginalSettings(mem_len=10))
    assert isinstance(config, TransformerXLConfig) and config.mem_len == 10 and config.share_rel_bias


def test_half_precision_checkpoints_load_as_float32(tmp_path, tiny_config):
    state = {k: v.half() for k, v in _original_state(TransformerXL(tiny_config)).items()}
    path = tmp_path / "half.pt"
    torch.save(state, path)
    model = load_original(path, OriginalSettings(mem_len=4))
    assert model.layers[0].attn.qkv.weight.dtype == torch.float32
    assert torch.equal(model.layers[0].attn.qkv.weight, state["layers.0.dec_attn.qkv_net.weight"].float())
