"""Configuration (presets, overrides, validation, JSON round trip), learning-rate schedules as pure
functions, gradient accumulation equivalence and early stopping."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from txl import TransformerXL
from txl.config import (
    ConfigError,
    RunConfig,
    apply_overrides,
    config_from_dict,
    config_to_dict,
    load_config,
    preset_names,
)
from txl.data import BatchSettings, SegmentStream
from txl.runs import RunPaths
from txl.train.optim import configure_optimizer, lr_at
from txl.train.trainer import Trainer, TrainerOptions, TrainerParts


def test_presets_load_and_round_trip():
    assert {"tiny", "shakespeare-char", "books-word", "enwik8-base", "wt103-base"} <= set(preset_names())
    for name in preset_names():
        config = load_config(name)
        assert config_from_dict(config_to_dict(config)) == config
    sc = load_config("shakespeare-char")
    assert (
        sc.model.n_layer,
        sc.model.n_head,
        sc.model.d_model,
        sc.train.batch_size,
        sc.train.tgt_len,
        sc.train.steps,
        sc.model.dropout,
        sc.data.corpus,
    ) == (4, 4, 128, 12, 64, 2000, 0.0, "tinyshakespeare")


def test_overrides_parse_toml_values_and_reject_unknown_names():
    config = apply_overrides(
        RunConfig(),
        [
            "train.steps=7",
            "train.lr=3e-4",
            "model.cutoffs=[10, 20]",
            "model.attention=absolute",
            "model.clamp_len=null",
            "train.varlen=true",
        ],
    )
    assert config.train.steps == 7 and config.train.lr == 3e-4 and config.model.cutoffs == (10, 20)
    assert config.model.attention == "absolute" and config.model.clamp_len is None and config.train.varlen
    assert RunConfig().train.steps != 7  # the original is untouched
    with pytest.raises(ConfigError, match="model.d_modle"):
        apply_overrides(RunConfig(), ["model.d_modle=3"])
    with pytest.raises(ConfigError, match="train.steps"):
        apply_overrides(RunConfig(), ["train.steps=1.5"])
    with pytest.raises(ConfigError, match="expected section.field=value"):
        apply_overrides(RunConfig(), ["train.steps"])
    with pytest.raises(ConfigError, match="train.accum_steps"):
        apply_overrides(RunConfig(), ["train.batch_size=6", "train.accum_steps=4"])
    for section in ("model", "eval"):  # this pair would block every key of every query
        with pytest.raises(ConfigError, match=rf"^{section}\.same_length: needs mem_len > 0"):
            apply_overrides(RunConfig(), [f"{section}.same_length=true", f"{section}.mem_len=0"])
    apply_overrides(RunConfig(), ["model.attention=absolute", "model.same_length=true", "model.mem_len=0"])


def test_toml_file_errors(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\nn_layer = 2")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad)
    unknown = tmp_path / "unknown.toml"
    unknown.write_text("[optimizer]\nlr = 1\n")
    with pytest.raises(ConfigError, match="optimizer"):
        load_config(unknown)


@pytest.mark.parametrize("schedule", ["cosine", "linear", "inverse_sqrt", "constant"])
def test_schedules_warm_up_then_follow_their_shape(schedule):
    kw = {"lr": 1e-3, "min_lr": 1e-4, "warmup_steps": 10, "total_steps": 110, "schedule": schedule}
    lrs = [lr_at(s, **kw) for s in range(110)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert all(a <= b + 1e-15 for a, b in zip(lrs[:10], lrs[1:10], strict=False))
    tail = lrs[10:]
    if schedule == "constant":
        assert all(x == 1e-3 for x in tail)
    else:
        assert all(a >= b - 1e-15 for a, b in zip(tail, tail[1:], strict=False)) and tail[-1] < 1e-3
        assert min(tail) >= 1e-4 - 1e-15
    if schedule == "cosine":
        assert lr_at(60, **kw) == pytest.approx(1e-4 + 0.5 * 9e-4)
        assert lr_at(110, **kw) == pytest.approx(1e-4)
    if schedule == "inverse_sqrt":
        assert lr_at(39, **kw) == pytest.approx(1e-3 * math.sqrt(10 / 40))


def test_weight_decay_only_on_linear_matrices(tiny_config):
    model = TransformerXL(tiny_config)
    cfg = apply_overrides(RunConfig(), ["train.weight_decay=0.1"]).train
    decay, no_decay = configure_optimizer(model, cfg).param_groups
    decayed = {id(p) for p in decay["params"]}
    assert id(model.layers[0].attn.qkv.weight) in decayed
    assert id(model.embedding.emb_layers[0].weight) not in decayed and id(model.u) not in decayed
    assert id(model.layers[0].attn_norm.weight) not in decayed
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def _trainer(config: RunConfig, tokens: np.ndarray, folder) -> Trainer:
    """A trainer given its parts: a float64 model of ``config``, its optimizer, a stream over ``tokens``."""
    torch.manual_seed(config.train.seed)
    model = TransformerXL(config.model).double()
    tc = config.train
    stream = SegmentStream(
        tokens, BatchSettings(batch_size=tc.batch_size, tgt_len=tc.tgt_len, seed=tc.seed), name="train"
    )
    parts = TrainerParts(model, configure_optimizer(model, tc), stream, RunPaths(folder))
    return Trainer(config, parts, TrainerOptions(progress=False))


def test_accumulation_matches_one_big_batch(tmp_path, tiny_config):
    """Splitting the batch rows into chunks (and their memory) gives the same gradients. The tokens are
    random so that every row, and so every row's memory, differs: a chunk fed another chunk's memory fails."""
    tokens = np.random.default_rng(5).integers(0, 256, size=4000)
    grads = []
    for accum in (1, 2):
        config = apply_overrides(
            RunConfig(),
            [
                "train.batch_size=4",
                f"train.accum_steps={accum}",
                "train.tgt_len=8",
                "train.clip=null",
                "train.seed=3",
            ],
        )
        config = dataclasses.replace(config, model=dataclasses.replace(tiny_config, vocab_size=256))
        trainer = _trainer(config, tokens, tmp_path / str(accum))
        batches = trainer.stream.batches()
        for _ in range(2):  # the second step reads memory split by rows
            batch = next(batches)
            trainer.optimizer.zero_grad()
            loss = trainer.compute_gradients(batch.inputs, batch.targets)
        grads.append((float(loss), [p.grad.clone() for p in trainer.model.parameters()]))
    (loss1, g1), (loss2, g2) = grads
    assert loss1 == pytest.approx(loss2, abs=1e-12)
    for a, b in zip(g1, g2, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_trainer_carries_memory_between_steps(tmp_path, tiny_config):
    """The second step's loss is the model's loss on the second batch given the first batch's memory, computed
    here by calling the model directly; without that memory it would differ (so a trainer that drops it fails)."""
    tokens = np.random.default_rng(6).integers(0, 256, size=2000)
    config = apply_overrides(
        RunConfig(), ["train.batch_size=2", "train.tgt_len=8", "train.clip=null", "train.seed=1"]
    )
    # init_std 0.3 makes the attention sharp, so that the memory changes the loss markedly
    config = dataclasses.replace(config, model=dataclasses.replace(tiny_config, vocab_size=256, init_std=0.3))
    trainer = _trainer(config, tokens, tmp_path)
    model = trainer.model  # no optimizer step is taken below, so the weights stay as they are
    batches = trainer.stream.batches()
    first, second = next(batches), next(batches)
    trainer.compute_gradients(first.inputs, first.targets)
    loss = float(trainer.compute_gradients(second.inputs, second.targets))
    with torch.no_grad():
        memory = model(first.inputs, targets=first.targets).memory
        carried = model(second.inputs, memory=memory, targets=second.targets)
        fresh = model(second.inputs, targets=second.targets).loss.mean().item()
    assert loss == pytest.approx(carried.loss.mean().item(), rel=1e-6)  # the step sums losses in float32
    assert abs(loss - fresh) > 1e-3, (loss, fresh)
    for ours, theirs in zip(trainer.memory.states, carried.memory.states, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_optimizer_step_is_adamw_written_out(tiny_config, dtype):
    """Two steps of configure_optimizer's AdamW (fused on the CPU) against the update written out by hand:
    m, v moving averages, bias correction, decoupled weight decay on the decayed group only."""
    model = TransformerXL(tiny_config).to(dtype)
    cfg = apply_overrides(RunConfig(), ["train.weight_decay=0.1", "train.lr=0.01"]).train
    optimizer = configure_optimizer(model, cfg)
    decayed = {id(p) for p in optimizer.param_groups[0]["params"]}
    params = list(model.parameters())
    want = {id(p): p.detach().clone() for p in params}
    m = {id(p): torch.zeros_like(p) for p in params}
    v = {id(p): torch.zeros_like(p) for p in params}
    gen = torch.Generator().manual_seed(0)
    for step in (1, 2):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen, dtype=dtype)
            w, g, k = want[id(p)], p.grad, id(p)
            if k in decayed:
                w.mul_(1 - cfg.lr * cfg.weight_decay)
            m[k] = cfg.beta1 * m[k] + (1 - cfg.beta1) * g
            v[k] = cfg.beta2 * v[k] + (1 - cfg.beta2) * g * g
            m_hat, v_hat = m[k] / (1 - cfg.beta1**step), v[k] / (1 - cfg.beta2**step)
            w.sub_(cfg.lr * m_hat / (v_hat.sqrt() + 1e-8))
        optimizer.step()
    tol = 1e-6 if dtype == torch.float32 else 1e-12
    for p in params:
        torch.testing.assert_close(p.detach(), want[id(p)], rtol=0, atol=tol)


def test_same_length_off_warning_carries_its_field():
    """The span resolver's warning names the setting as data, so that a command can name its own flag."""
    import warnings

    from txl.config import SameLengthOff, span_of

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        span = span_of(mem_len=0, clamp_len=None, same_length=True)
    assert span.same_length is False
    (warning,) = caught
    assert isinstance(warning.message, SameLengthOff) and warning.message.field == "mem_len"
    assert str(warning.message) == "mem_len 0: same_length turned off (it needs a memory)"
    assert warning.message.named("--mem-len") == "--mem-len 0: same_length turned off (it needs a memory)"
