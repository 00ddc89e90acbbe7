"""The optimizer and learning-rate schedules. ``lr_at`` is a pure function of the step, so a resumed run
needs no scheduler state beyond the step itself."""

from __future__ import annotations

import math

import torch
from torch import nn

from ..config import TrainConfig

__all__ = ["lr_at", "configure_optimizer", "set_lr", "set_hyperparameters", "schedule_lr"]


def lr_at(
    step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int, schedule: str
) -> float:
    """Learning rate for optimizer step ``step`` (0-based): linear warmup from 0 over ``warmup_steps``, then
    ``cosine`` (to min_lr at total_steps), ``linear`` (to min_lr), ``inverse_sqrt`` (lr * sqrt(warmup / step),
    floored at min_lr) or ``constant``."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    if schedule == "constant":
        return lr
    if schedule == "inverse_sqrt":
        return max(min_lr, lr * math.sqrt(max(warmup_steps, 1) / (step + 1)))
    span = max(1, total_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    if schedule == "cosine":
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
    if schedule == "linear":
        return lr + (min_lr - lr) * progress
    raise ValueError(f"schedule: unknown schedule {schedule!r}")


def schedule_lr(step: int, config: TrainConfig) -> float:
    """``lr_at`` with the schedule of a training config."""
    return lr_at(
        step,
        lr=config.lr,
        min_lr=config.min_lr,
        warmup_steps=config.warmup_steps,
        total_steps=config.steps,
        schedule=config.schedule,
    )


def configure_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices of linear layers only (not on embeddings, the biases u and v,
    LayerNorms, biases or the adaptive projections). Two parameter groups, in this order: decay, no decay."""
    decay: list[nn.Parameter] = []
    no_decay: list[nn.Parameter] = []
    decayed = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    for param in model.parameters():
        if not param.requires_grad:
            continue
        (decay if id(param) in decayed and id(param) not in embeddings else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(
        groups, lr=config.lr, betas=(config.beta1, config.beta2), fused=_fused_supported(model)
    )


def _fused_supported(model: nn.Module) -> bool:
    """Whether AdamW's fused kernel (one pass per parameter, no per-op dispatch) serves every parameter: CPU
    and CUDA, floating point (torch >= 2.4). On the CPU it takes a small model's optimizer step from about
    6.5 to 0.9 ms (benchmarks/train_eval.py's small shape, 2 threads); the update is AdamW's, up to rounding."""
    params = list(model.parameters())
    devices = {p.device.type for p in params}
    return bool(params) and devices <= {"cpu", "cuda"} and all(p.dtype.is_floating_point for p in params)


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set the learning rate of every parameter group."""
    for group in optimizer.param_groups:
        group["lr"] = lr


def set_hyperparameters(optimizer: torch.optim.Optimizer, config: TrainConfig) -> None:
    """Set AdamW's betas and weight decay from ``config`` on an optimizer made by :func:`configure_optimizer`
    (the first group decays, the other does not), e.g. over the values of a restored checkpoint."""
    for i, group in enumerate(optimizer.param_groups):
        group["betas"] = (config.beta1, config.beta2)
        group["weight_decay"] = config.weight_decay if i == 0 else 0.0
