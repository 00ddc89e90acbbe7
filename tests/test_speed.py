"""The fast paths equal the plain ones: the fused linear + cross-entropy (values and gradients, several class
blocks, ignored targets, bf16 autocast), the adaptive softmax built on it, torch.compile and bf16 training."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from txl import TransformerXL
from txl.model import loss as loss_module
from txl.model.loss import linear_cross_entropy


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 256 classes whatever N: a 700-class problem then runs in 3 blocks, the last one partial."""
    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 1)


@pytest.mark.parametrize("bias", [True, False])
def test_linear_cross_entropy_equals_cross_entropy_of_linear(small_blocks, bias):
    g = torch.Generator().manual_seed(0)
    n, e, v = 40, 9, 700
    hidden = torch.randn(n, e, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(v, e, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(v, dtype=torch.float64, generator=g, requires_grad=True) if bias else None
    target = torch.randint(0, v, (n,), generator=g)
    target[::5] = -100
    target[1] = v - 1  # the last class, in the partial block
    upstream = torch.randn(n, dtype=torch.float64, generator=g)
    expected = F.cross_entropy(F.linear(hidden, weight, b), target, reduction="none")
    got = linear_cross_entropy(hidden, weight, b, target)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    params = [p for p in (hidden, weight, b) if p is not None]
    expected_grads = torch.autograd.grad((expected * upstream).sum(), params)
    got_grads = torch.autograd.grad((got * upstream).sum(), params)
    for g_got, g_expected in zip(got_grads, expected_grads, strict=True):
        torch.testing.assert_close(g_got, g_expected, rtol=0, atol=1e-12)


def test_linear_cross_entropy_across_steps_and_pending_graphs(small_blocks):
    """Steps in a row with changing sizes, then two graphs pending at once (the second forward before the
    first backward, backwards in reverse order): each equals the plain loss and gradients, so nothing one
    call keeps for its backward is shared with another."""
    g = torch.Generator().manual_seed(2)

    def problem(n, v):
        hidden = torch.randn(n, 7, generator=g, requires_grad=True)
        weight = torch.randn(v, 7, generator=g, requires_grad=True)
        bias = torch.randn(v, generator=g, requires_grad=True)
        return hidden, weight, bias, torch.randint(0, v, (n,), generator=g)

    def reference(hidden, weight, bias, target):
        loss = F.cross_entropy(F.linear(hidden, weight, bias), target, reduction="none")
        return loss, torch.autograd.grad(loss.sum(), (hidden, weight, bias))

    def check(got, args, want):
        torch.testing.assert_close(got, want[0], rtol=0, atol=1e-5)
        for a, b in zip(torch.autograd.grad(got.sum(), args[:3]), want[1], strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)

    for n, v in [(40, 700), (40, 700), (20, 300), (60, 900)]:
        args = problem(n, v)
        check(linear_cross_entropy(*args), args, reference(*args))
    first, second = problem(40, 700), problem(40, 700)
    got_first, got_second = linear_cross_entropy(*first), linear_cross_entropy(*second)
    check(got_second, second, reference(*second))
    check(got_first, first, reference(*first))


def test_linear_cross_entropy_under_bf16_autocast_matches_upcast_log_softmax(small_blocks):
    """Under autocast both paths multiply in bf16 and normalise in float32; the only difference is the order of
    the float32 sums, so they agree to float32 rounding of values of size log(V) ~ 7 (atol 1e-4)."""
    g = torch.Generator().manual_seed(1)
    hidden, weight = torch.randn(30, 16, generator=g), torch.randn(600, 16, generator=g)
    bias, target = torch.randn(600, generator=g), torch.randint(0, 600, (30,), generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = linear_cross_entropy(hidden, weight, bias, target)
        expected = F.cross_entropy(F.linear(hidden, weight, bias).float(), target, reduction="none")
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4)


@pytest.mark.parametrize(
    "extra", [{}, {"cutoffs": (10, 20)}, {"cutoffs": (10, 20), "div_val": 2, "d_embed": 16}]
)
def test_adaptive_nll_gradients_equal_those_of_the_log_probabilities(tiny_config, extra):
    model = TransformerXL(dataclasses.replace(tiny_config, **extra)).double()
    hidden = torch.randn(50, tiny_config.d_model, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, tiny_config.vocab_size, (50,))
    params = [hidden, *model.softmax.parameters()]
    fused = model.softmax.nll(hidden, target)
    plain = -model.softmax.log_prob(hidden).gather(1, target[:, None])[:, 0]
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-12)
    for got, expected in zip(
        torch.autograd.grad(fused.sum(), params, allow_unused=True),
        torch.autograd.grad(plain.sum(), params, allow_unused=True),
        strict=True,
    ):
        if expected is None:
            assert got is None or torch.all(got == 0)
        else:
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def _two_segments(model: TransformerXL, tokens: torch.Tensor, *, forward=None) -> tuple[torch.Tensor, list]:
    """Mean loss of two consecutive segments (the memory carried) and the gradients of the model's parameters."""
    forward = model if forward is None else forward
    model.zero_grad(set_to_none=True)
    first = forward(tokens[:, :8], targets=tokens[:, 1:9])
    second = forward(tokens[:, 8:16], memory=first.memory, targets=tokens[:, 9:17])
    loss = torch.cat([first.loss, second.loss], dim=1)
    loss.float().mean().backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.slow
def test_compiled_model_equals_eager(tiny_config):
    """train.compile wraps the model in torch.compile (inductor, the machine's C++ compiler on the CPU, about a
    minute): the same losses and gradients up to float32 reassociation inside fused kernels. The adaptive softmax
    with two tail clusters, so the fused cross-entropy and the data-dependent tail rows are compiled too."""
    model = TransformerXL(dataclasses.replace(tiny_config, cutoffs=(10, 20), div_val=2, d_embed=16)).train()
    tokens = torch.randint(0, tiny_config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    eager_loss, eager_grads = _two_segments(model, tokens)
    compiled_loss, compiled_grads = _two_segments(model, tokens, forward=torch.compile(model))
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-5)
    for got, expected in zip(compiled_grads, eager_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-6)


def test_bf16_autocast_stays_within_bf16_rounding_of_float32(tiny_config):
    """train.precision = "bf16" runs the matmuls in bfloat16 (8 significant bits: unit roundoff 2^-9 ~ 0.002 per
    rounding) and normalises the softmax in float32. Every logit is then off by a few roundoffs relative to its
    inputs' scale; across the 2 layers and the output layer of the tiny model that moves per-token losses of about
    log(37) ~ 3.6 by a few roundoffs of that size, 0.007 each (measured: max 0.001), so: losses within 0.02 nats,
    and the gradient of every parameter pointing the same way (cosine similarity > 0.99)."""
    model = TransformerXL(tiny_config).train()
    tokens = torch.randint(0, tiny_config.vocab_size, (3, 17), generator=torch.Generator().manual_seed(0))
    loss32, grads32 = _two_segments(model, tokens)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss16, grads16 = _two_segments(model, tokens)
    assert loss16.dtype == torch.float32
    torch.testing.assert_close(loss16, loss32, rtol=0, atol=0.02)
    for g16, g32 in zip(grads16, grads32, strict=True):
        assert F.cosine_similarity(g16.flatten(), g32.flatten(), dim=0) > 0.99


@pytest.mark.slow
def test_gpu_benchmark_runs_on_the_cpu():
    """benchmarks/gpu.sh --device cpu --steps 2: the GPU benchmark's code path (the wt103-base model, 151M
    parameters, 2 x 16 tokens), TF32 (plain float32 on the CPU) then bf16, one JSON line each."""
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        ["bash", str(root / "benchmarks" / "gpu.sh"), "--device", "cpu", "--steps", "2"],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    records = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["variant"] for r in records] == ["tf32", "bf16"]
    for record in records:
        assert record["steps"] == 2 and record["tokens_per_s"] > 0 and record["peak_memory_mib"] > 0
        assert record["params"] > 150_000_000 and 0 < record["last_loss"] < 30
