"""What ``data.documents = "reset"`` costs in training: the trainer's step (forward with targets and the memory
carried, backward, clipping, AdamW) of a preset's model on its own corpus, with the batch's document starts
passed (``reset``) and without (``continue``), alternated step by step in one process (issue 20); one JSON line.

    OMP_NUM_THREADS=1 PYTHONPATH=src python3 benchmarks/documents_train.py --config books-word-small --steps 40

Both ways read the same batches of the preset's train stream (with its starts), from the same initial weights
(two copies), each carrying its own memory; after ``--warmup`` steps each, they alternate for ``--steps`` steps
each (the order flips every step). Reported: tokens/s of each over its median step time, and the median of the
per-step time ratios reset / continue, with how many of the timed batches hold a document start.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics

import torch
from _common import timed

from txl import TransformerXL, load_config
from txl.config import apply_overrides
from txl.data import BatchSettings, SegmentStream, prepare_data
from txl.train.optim import configure_optimizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="books-word-small")
    parser.add_argument("--set", action="append", default=[], help="config overrides, as txl train --set")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    config = apply_overrides(load_config(args.config), args.set)
    data = prepare_data(config.data)
    model_config = config.model.__class__(**{**config.model.__dict__, "vocab_size": len(data.vocab)})
    tc = config.train
    stream = SegmentStream(
        data.splits["train"],
        BatchSettings(batch_size=tc.batch_size, tgt_len=tc.tgt_len),
        starts=data.starts["train"],
    )
    torch.manual_seed(tc.seed)
    models = {"continue": TransformerXL(model_config)}
    models["reset"] = copy.deepcopy(models["continue"])
    optimizers = {k: configure_optimizer(m, tc) for k, m in models.items()}
    memory: dict[str, object] = {"continue": None, "reset": None}

    def step(way: str, batch) -> None:
        model, optimizer = models[way], optimizers[way]
        extra = {"starts": batch.starts} if way == "reset" else {}
        out = model(batch.inputs, memory=memory[way], targets=batch.targets, **extra)
        out.loss.float().mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tc.clip or 1e9)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        memory[way] = out.memory

    batches = stream.batches()
    for _ in range(args.warmup):
        batch = next(batches)
        for way in models:
            step(way, batch)
    times: dict[str, list[float]] = {"continue": [], "reset": []}
    with_starts = 0
    for i in range(args.steps):
        batch = next(batches)
        with_starts += bool(batch.starts.any())
        order = ("continue", "reset") if i % 2 == 0 else ("reset", "continue")
        for way in order:
            times[way].append(timed(lambda way=way, batch=batch: step(way, batch)))
    tokens = tc.batch_size * tc.tgt_len
    ratios = [r / c for r, c in zip(times["reset"], times["continue"], strict=True)]
    print(
        json.dumps(
            {
                "config": args.config,
                "overrides": args.set,
                "batch": [tc.batch_size, tc.tgt_len],
                "mem_len": model_config.mem_len,
                "steps": args.steps,
                "batches_with_a_start": with_starts,
                "continue_tokens_per_s": tokens / statistics.median(times["continue"]),
                "reset_tokens_per_s": tokens / statistics.median(times["reset"]),
                "reset_over_continue_time": statistics.median(ratios),
                "threads": torch.get_num_threads(),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "loadavg": os.getloadavg(),
            }
        )
    )


if __name__ == "__main__":
    main()
