"""On a CUDA GPU, in float32: the fused-kernel attention (``scaled_dot_product_attention``, the path of all GPU
training) against the CPU path, losses and gradients; and the key/value cache (segments through ``forward``,
one position at a time through the ``Decoder``) against forward with a memory. Skipped without CUDA;
``benchmarks/gpu.sh`` runs them (``pytest -m cuda``) when a GPU is lent."""

from __future__ import annotations

import pytest
import torch

from txl import TransformerXL, TransformerXLConfig
from txl.model import KVCache
from txl.model.decode import Decoder

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

V = 300
VARIANTS = {
    "post_norm": {},
    "pre_norm_same_length_clamp": {
        "pre_norm": True,
        "same_length": True,
        "clamp_len": 9,
        "share_rel_bias": False,
    },
    "adaptive": {"cutoffs": (100, 200), "div_val": 2, "d_embed": 32},
}


@pytest.fixture(autouse=True)
def _exact_float32():
    """Full float32 matmuls (no TF32), so that the two devices differ by rounding only."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _model(**changes) -> TransformerXL:
    fields = dict(
        vocab_size=V, n_layer=3, n_head=4, d_head=16, d_model=64, d_inner=128, mem_len=24, dropout=0.0,
        dropatt=0.0, init_std=0.1, proj_init_std=0.1,
    )  # fmt: skip
    fields.update(changes)
    torch.manual_seed(0)
    return TransformerXL(TransformerXLConfig(**fields))


def _tokens(b=3, t=64, seed=1) -> torch.Tensor:
    return torch.randint(0, V, (b, t), generator=torch.Generator().manual_seed(seed))


def _segments_and_grads(
    model: TransformerXL, tokens: torch.Tensor
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Per-token losses of three segments of 16 with the memory carried, and the parameters' gradients."""
    model.zero_grad(set_to_none=True)
    memory, losses = None, []
    for start in range(0, 48, 16):
        out = model(tokens[:, start : start + 16], memory=memory, targets=tokens[:, start + 1 : start + 17])
        losses.append(out.loss)
        memory = out.memory
    loss = torch.cat(losses, dim=1)
    loss.mean().backward()
    return loss.detach().cpu(), [p.grad.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_fused_attention_on_cuda_equals_the_cpu_path(variant):
    cpu = _model(**VARIANTS[variant]).train()
    gpu = _model(**VARIANTS[variant]).cuda().train()
    tokens = _tokens()
    want, want_grads = _segments_and_grads(cpu, tokens)
    got, got_grads = _segments_and_grads(gpu, tokens.cuda())
    torch.testing.assert_close(got, want, atol=2e-5, rtol=1e-5)
    for (name, _), a, b in zip(cpu.named_parameters(), got_grads, want_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-3, msg=name)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_cache_on_cuda_equals_forward_with_memory(variant):
    model = _model(**VARIANTS[variant]).cuda().eval()
    tokens = _tokens().cuda()
    span = model.config.span
    with torch.no_grad():
        memory, cache, start = None, KVCache(model.config, batch_size=3, device="cuda"), 0
        for t in (16, 5, 1, 9):  # segments through forward with the cache
            segment, start = tokens[:, start : start + t], start + t
            want = model(segment, memory=memory, span=span)
            got = model(segment, cache=cache)
            memory = want.memory
            torch.testing.assert_close(got.log_probs, want.log_probs, atol=2e-5, rtol=0)
        decoder = Decoder(model, cache)  # then one position at a time through the decoder's tables
        for i in range(start, start + 30):
            token = tokens[:, i]
            want = model(token[:, None], memory=memory, span=span)
            memory = want.memory
            torch.testing.assert_close(decoder.step(token), want.log_probs[:, -1], atol=2e-5, rtol=0)
        for a, b in zip(cache.memory().states, memory.states, strict=True):
            torch.testing.assert_close(a, b, atol=2e-5, rtol=0)


def test_targets_outside_the_vocabulary_fail_on_cuda():
    """The device-side assertion fires (in a subprocess: a failed assertion spoils the CUDA context)."""
    import subprocess
    import sys

    code = (
        "import torch; from txl import TransformerXL, TransformerXLConfig\n"
        "m = TransformerXL(TransformerXLConfig(vocab_size=50, cutoffs=(20,), mem_len=4)).cuda()\n"
        "x = torch.zeros(1, 4, dtype=torch.long, device='cuda'); y = x.clone(); y[0, 1] = 50\n"
        "m(x, targets=y).loss.sum().item(); torch.cuda.synchronize()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0 and "targets must be token ids in [0, 50)" in done.stderr, done.stderr[-2000:]
