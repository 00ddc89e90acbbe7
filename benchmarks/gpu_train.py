"""Training speed of the paper's WikiText-103 base model shape (the ``wt103-base`` preset) on random tokens, for an
NVIDIA GPU: bf16 autocast and TF32, each eager and with ``torch.compile``; one JSON line per variant with tokens/s
and peak memory (issue 10). Run through ``benchmarks/gpu.sh``.

    bash benchmarks/gpu.sh                              # cuda: 300 timed steps per variant after 20 warm-up steps
    bash benchmarks/gpu.sh --device cpu --steps 2       # the same code path on the CPU (what the tests run)

The step is the trainer's: forward with targets and the memory carried, backward of the mean loss, gradient
clipping at the preset's 0.25, AdamW; one model and optimizer serve every variant in turn (the memory starts empty
for each). The batch is the preset's (60 x 150, memory 150) on a GPU; on the CPU the default is 2 x 16 with no
warm-up (the model is the same: 16 layers, 151M parameters with the 267,735-word adaptive softmax). Reference:
NVIDIA's Transformer-XL base for WikiText-103 (DeepLearningExamples) trains at about 41.5k tokens/s in TF32 and
60k with mixed precision on one A100; the goal on an H200 is 1.5 times that (``goal_tokens_per_s``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import resource
import time

import torch

from txl import TransformerXL, load_config

NVIDIA_A100 = {"tf32": 41_500, "bf16": 60_000}
"""NVIDIA's published tokens/s for this shape on one A100 (TF32; AMP)."""

VARIANTS = ("tf32", "tf32+compile", "bf16", "bf16+compile")


def _peak_memory_mib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the process's peak RSS


def build(device: torch.device) -> tuple[TransformerXL, torch.optim.Optimizer, float]:
    """The wt103-base model (dropout 0: random tokens have nothing to regularise), AdamW, and the preset's clip."""
    config = load_config("wt103-base")
    torch.manual_seed(0)
    model = TransformerXL(dataclasses.replace(config.model, dropout=0.0)).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.train.lr, fused=device.type == "cuda")
    return model, optimizer, config.train.clip


def run_variant(
    variant: str,
    *,
    model: TransformerXL,
    optimizer: torch.optim.Optimizer,
    clip: float,
    device: torch.device,
    steps: int,
    warmup: int,
    batch: int,
    tgt_len: int,
) -> dict:
    precision, compiled = variant.split("+")[0], variant.endswith("+compile")
    model_config = model.config
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
        torch.cuda.reset_peak_memory_stats(device)
    forward = torch.compile(model) if compiled else model
    tokens = torch.randint(0, model_config.vocab_size, (warmup + steps, batch, tgt_len + 1), device=device)
    memory = None

    def step(segment: torch.Tensor):
        nonlocal memory
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            out = forward(segment[:, :-1], memory=memory, targets=segment[:, 1:])
        loss = out.loss.float().mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        memory = out.memory
        return loss.detach()

    for i in range(warmup):
        step(tokens[i])
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    losses = [step(tokens[warmup + i]) for i in range(steps)]
    last = float(losses[-1])  # the one host synchronisation of the timed loop
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = time.perf_counter() - start
    per_s = batch * tgt_len * steps / seconds
    return {
        "variant": variant,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "batch": batch,
        "tgt_len": tgt_len,
        "mem_len": model_config.mem_len,
        "steps": steps,
        "warmup": warmup,
        "params": model.num_parameters(),
        "tokens_per_s": round(per_s, 1),
        "seconds": round(seconds, 3),
        "peak_memory_mib": round(_peak_memory_mib(device), 1),
        "last_loss": round(last, 4),
        "nvidia_a100_tokens_per_s": NVIDIA_A100[precision],
        "goal_tokens_per_s": 1.5 * NVIDIA_A100[precision],
        "over_goal": round(per_s / (1.5 * NVIDIA_A100[precision]), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=300, help="timed steps per variant")
    parser.add_argument(
        "--warmup", type=int, default=None, help="untimed steps first (default 20 on a GPU, 0 on the CPU)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="default: the preset's 60 on a GPU, 2 on the CPU"
    )
    parser.add_argument(
        "--tgt-len", type=int, default=None, help="default: the preset's 150 on a GPU, 16 on the CPU"
    )
    parser.add_argument(
        "--variants",
        default=None,
        help=f"comma-separated from {', '.join(VARIANTS)} (default: all on a GPU; tf32,bf16 on the CPU)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device here (use --device cpu to check the code path)")
    gpu = device.type == "cuda"
    preset = load_config("wt103-base").train
    variants = (args.variants or (",".join(VARIANTS) if gpu else "tf32,bf16")).split(",")
    for variant in variants:
        if variant not in VARIANTS:
            parser.error(f"--variants: unknown variant {variant!r} (choose from {', '.join(VARIANTS)})")
    model, optimizer, clip = build(device)
    for variant in variants:
        record = run_variant(
            variant,
            model=model,
            optimizer=optimizer,
            clip=clip,
            device=device,
            steps=args.steps,
            warmup=args.warmup if args.warmup is not None else (20 if gpu else 0),
            batch=args.batch_size or (preset.batch_size if gpu else 2),
            tgt_len=args.tgt_len or (preset.tgt_len if gpu else 16),
        )
        print(json.dumps(record), flush=True)
        if gpu:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
