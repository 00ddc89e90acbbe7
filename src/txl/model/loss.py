"""A fused linear layer + cross-entropy: the per-row loss of ``log_softmax(hidden @ weight.T + bias)`` at a
target, over blocks of classes, never building the (N, V) logits in one piece (for the adaptive softmax)."""

# A fused linear layer + cross-entropy: the per-row loss of ``log_softmax(hidden @ weight.T + bias)`` at a target,
# computed over blocks of classes, without ever building an (N, V) tensor in one piece. The adaptive softmax
# (``adaptive.py``) calls it for its head and for each tail cluster.
#
# Dimensions: N rows (flattened positions), E input size, V classes, C classes per block.
#
# Forward, per block: logits (N, C) = hidden @ weight[block].T, folded into a running row maximum and sum of
# exponentials (the log-sum-exp over all V, as an online softmax), and the target's logit picked; the loss is
# ``lse - logit[target]``. With gradients needed each block's ``exp(logits - running maximum)`` is kept (computed in
# place: no extra buffer), and backward turns it in place into ``grad * (softmax - onehot(target))`` with one
# per-row factor ``exp(maximum - lse)`` and multiplies it into the gradients of hidden, weight[block] and bias[block]
# (every matmul has N or E as its inner size, so none degenerates). Compared with ``F.cross_entropy(F.linear(...))``:
# no log-softmax output kept beside the logits, no zero-filled (N, V) gradient from ``nll_loss``'s backward, no
# log-softmax backward pass, and no fresh (N, V) buffer at all (a buffer that size comes from ``mmap`` and is
# page-faulted in on every call). Without gradients
# (evaluation) each block is dropped once folded in.

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["linear_cross_entropy"]

CHUNK_ELEMENTS = 1 << 19
"""On the CPU, about this many logits per block (2 MiB in float32, cache-sized): classes per block =
max(256, CHUNK_ELEMENTS // N)."""

ACCELERATOR_CHUNK_ELEMENTS = 1 << 26
"""On a GPU (or any other device), blocks of up to 64M logits (256 MiB in float32): there the cost of a block is
its kernel launches, so few large blocks (the wt103-base head, 9,000 rows x 20,003 classes, in 3 blocks)."""


def _chunk_logits(hidden: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """(C, E) x (V, E) -> float32 (or float64) logits (C, V)."""
    logits = hidden @ weight.t() if bias is None else torch.addmm(bias, hidden, weight.t())
    return logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        target: Tensor,
        valid: Tensor,
        cols: int,
        keep: bool,
    ) -> Tensor:
        n, v = hidden.shape[0], weight.shape[0]
        acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        top = torch.full((n, 1), float("-inf"), dtype=acc, device=hidden.device)  # running row maximum
        total = torch.zeros((n, 1), dtype=acc, device=hidden.device)  # running sum of exp(logit - top)
        picked = torch.zeros(n, dtype=acc, device=hidden.device)  # the target's logit
        kept = []  # with keep (gradients needed), the logits of each block, for backward
        for s in range(0, v, cols):
            block_bias = None if bias is None else bias[s : s + cols]
            logits = _chunk_logits(hidden, weight[s : s + cols], block_bias)  # (N, C)
            inside = (target >= s) & (target < s + logits.shape[1])
            local = (target - s).clamp(0, logits.shape[1] - 1)
            picked += logits.gather(1, local[:, None])[:, 0] * inside
            new_top = torch.maximum(top, logits.amax(1, keepdim=True))
            total = total * (top - new_top).exp_() + logits.sub_(new_top).exp_().sum(1, keepdim=True)
            top = new_top
            if keep:  # exp(logit - top_s): the softmax of the block up to a row factor exp(top_s - lse)
                kept.append((logits, new_top))
        lse = (top + total.log_())[:, 0]  # (N,)
        ctx.save_for_backward(hidden, weight, bias, target, valid, lse)
        ctx.cols = cols
        ctx.kept = kept
        return (lse - picked) * valid

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        hidden, weight, bias, target, valid, lse = ctx.saved_tensors
        if ctx.kept is None:
            raise RuntimeError(
                "linear_cross_entropy's backward runs once (its kept logits become the gradient)"
            )
        cols, v = ctx.cols, weight.shape[0]
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad = (grad * valid)[:, None]  # (N, 1)
        acc = lse.dtype
        grad_h = torch.zeros(hidden.shape, dtype=acc, device=hidden.device) if need_h else None
        grad_w = torch.empty(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.empty(v, dtype=acc, device=weight.device) if need_b else None
        for s in range(0, v, cols):
            exps, block_top = ctx.kept[s // cols]
            # (N, C): grad * softmax, in place
            probs = exps.mul_((block_top - lse[:, None]).exp_().mul_(grad))
            inside = ((target >= s) & (target < s + probs.shape[1]))[:, None]
            local = (target - s).clamp(0, probs.shape[1] - 1)[:, None]
            probs.scatter_add_(1, local, -(grad * inside))  # minus grad * one-hot target: d loss / d logits
            if grad_b is not None:
                torch.sum(probs, 0, out=grad_b[s : s + cols])
            if grad_w is not None:
                if probs.dtype == hidden.dtype == acc:
                    torch.mm(probs.t(), hidden, out=grad_w[s : s + cols])  # (C, E), written in place
                else:
                    grad_w[s : s + cols] = probs.t().to(hidden.dtype) @ hidden  # (C, E)
            if grad_h is not None:
                grad_h.addmm_(probs, weight[s : s + cols].to(acc))
        ctx.kept = None
        return (
            None if grad_h is None else grad_h.to(hidden.dtype),
            None if grad_w is None else grad_w.to(weight.dtype),
            None if grad_b is None else grad_b.to(bias.dtype),
            None,
            None,
            None,
            None,
        )


def linear_cross_entropy(
    hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor, *, ignore_index: int = -100
) -> Tensor:
    """Per-row negative log-likelihood (N,) of ``target`` (N,) under ``log_softmax(hidden @ weight.T + bias)``;
    0 where ``target == ignore_index``. hidden (N, E), weight (V, E), bias (V,) or None. Under autocast the matmuls
    run in the autocast dtype and the softmax in float32, as ``F.linear`` followed by an upcast log-softmax."""
    device = hidden.device.type
    if torch.is_autocast_enabled(device):
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    valid = target != ignore_index
    budget = CHUNK_ELEMENTS if device == "cpu" else ACCELERATOR_CHUNK_ELEMENTS
    cols = max(256, budget // max(1, hidden.shape[0]))
    keep = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (hidden, weight, bias))
    acc = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    with torch.autocast(device, enabled=False):
        return _LinearCrossEntropy.apply(
            hidden, weight, bias, target.where(valid, 0), valid.to(acc), cols, keep
        )
