"""What document starts cost the model: one training step (forward with targets and backward, memory carried)
and one cached evaluation segment with ``starts`` against the same without, alternated call by call in one
process; prints one JSON line per case with the median of the per-pair ratios (with / without).

    PYTHONPATH=src python3 benchmarks/starts_cost.py --pairs 21

Shape: ``train_eval.py``'s small config (vocab 10k, 4 layers, d_model 128, 4 heads x 32, d_inner 512,
segments of 64, memory 64, batch 16). The starts: a document begins on average every 100 tokens (random,
seeded), so most segments have one start in some rows and the memory carries a reach.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import torch

import txl

SHAPE = dict(vocab_size=10_000, n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, mem_len=64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = txl.TransformerXL(txl.TransformerXLConfig(**SHAPE))
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, SHAPE["vocab_size"], (16, 129), generator=g)
    starts = torch.rand(16, 128, generator=g) < 0.01  # (B, 2T): a start every ~100 tokens
    with torch.no_grad():
        plain_memory = model(tokens[:, :64]).memory
        doc_memory = model(tokens[:, :64], starts=starts[:, :64]).memory  # with a reach per row

    def train(with_starts: bool):
        model.train()
        memory = doc_memory if with_starts else plain_memory
        marks = starts[:, 64:128] if with_starts else None
        out = model(tokens[:, 64:128], memory=memory, targets=tokens[:, 65:129], starts=marks)
        out.loss.mean().backward()
        model.zero_grad(set_to_none=True)

    def evaluate(with_starts: bool):
        model.eval()
        cache = txl.model.KVCache(model.config, memory=doc_memory if with_starts else plain_memory)
        with torch.no_grad():
            model(
                tokens[:, 64:128],
                cache=cache,
                targets=tokens[:, 65:129],
                starts=starts[:, 64:128] if with_starts else None,
            )

    for name, fn in (("train", train), ("eval", evaluate)):
        fn(False), fn(True)  # warm up
        seconds = {False: [], True: []}
        for pair in range(args.pairs):
            for side in (False, True) if pair % 2 == 0 else (True, False):
                start = time.perf_counter()
                fn(side)
                seconds[side].append(time.perf_counter() - start)
        ratios = [w / n for w, n in zip(seconds[True], seconds[False], strict=True)]
        print(
            json.dumps(
                {
                    "case": name,
                    "pairs": args.pairs,
                    "threads": args.threads,
                    "without_ms": round(1e3 * statistics.median(seconds[False]), 2),
                    "with_starts_ms": round(1e3 * statistics.median(seconds[True]), 2),
                    "with_over_without": round(statistics.median(ratios), 3),
                    "ratio_quartiles": [round(q, 3) for q in statistics.quantiles(ratios, n=4)],
                    "load_average": [round(x, 2) for x in os.getloadavg()],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
