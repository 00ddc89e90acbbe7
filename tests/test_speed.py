"""The fast paths equal the plain ones: the fused linear + cross-entropy (values and gradients, several class
blocks, ignored targets, bf16 autocast), the adaptive softmax built on it, torch.compile and bf16 training."""

from __future__ import annotations

import dataclasses

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


@pytest.mark.parametrize("extra", [{}, {"cutoffs": (10, 20)}, {"cutoffs": (10, 20), "div_val": 2, "d_embed": 16}])
def test_adaptive_nll_gradients_equal_those_of_the_log_probabilities(tiny_config, extra):
    model = TransformerXL(dataclasses.replace(tiny_config, **extra)).double()
    hidden = torch.randn(50, tiny_config.d_model, dtype=torch.float64, requires_grad=True)
    target = torch.randint(0, tiny_config.vocab_size, (50,))
    target[::7] = -100
    keep = target != -100
    params = [hidden, *model.softmax.parameters()]
    fused = model.softmax.nll(hidden, target)
    plain = -model.softmax.log_prob(hidden).gather(1, target.clamp(min=0)[:, None])[:, 0] * keep
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-12)
    for got, expected in zip(torch.autograd.grad(fused.sum(), params, allow_unused=True),
                             torch.autograd.grad(plain.sum(), params, allow_unused=True), strict=True):
        if expected is None:
            assert got is None or torch.all(got == 0)
        else:
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
