"""Before/after in one process: another tree's ``txl`` package (copied as ``txl_old``; its imports inside the
package are relative) against this tree's, the same weights, alternated call by call (the order flips every
pair), so that a busy machine slows both alike. Prints one JSON line per case with the median of the
per-pair ratios (old time / new time: above 1 means this tree is faster).

    rm -rf /tmp/old && mkdir /tmp/old && cp -r OLD_TREE/src/txl /tmp/old/txl_old
    PYTHONPATH=src:/tmp/old python3 benchmarks/model_ab.py --pairs 15

Cases, at ``train_eval.py``'s small shape (vocab 10k, 4 layers, d_model 128, 4 heads x 32, d_inner 512):
- ``train``: forward with targets and backward of the mean loss, segments of 64 with a memory of 64
  carried, batch 16 (no optimizer: it is not the model's);
- ``eval``: forward with targets through a ``KVCache`` of 64, no gradients, batch 16;
- ``generate``: ``generate`` of 100 greedy tokens after a 64-token prompt, batch 1, memory 64 (the lean
  one-position ``Decoder.step`` path);
- ``generate_1600``: the same after a full memory of 1,600 positions (``span`` mem_len 1,600);
- ``ragged``: 8 prompts of 8, 16, ..., 64 tokens as one batch, 100 greedy tokens each, memory 64.
No starts anywhere: this measures what the code paths without documents cost.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import statistics
import time

import torch

import txl

SHAPE = dict(vocab_size=10_000, n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, mem_len=64)


def models(old):
    """The same weights in both packages' TransformerXL."""
    torch.manual_seed(0)
    new_model = txl.TransformerXL(txl.TransformerXLConfig(**SHAPE))
    old_model = old.TransformerXL(old.TransformerXLConfig(**SHAPE))
    old_model.load_state_dict(new_model.state_dict())
    return old_model, new_model


def greedy(pkg):
    """``generate(model, prompt, memory, span)`` of 100 greedy tokens in that package's API (per-request params
    and per-engine settings since the engine, one settings value since the decoding core, keyword arguments
    before it)."""
    if importlib.util.find_spec(f"{pkg.__name__}.inference") is not None:
        inference = importlib.import_module(f"{pkg.__name__}.inference")
        if hasattr(inference, "SamplingParams"):

            def engine(model, prompt, memory=None, span=None):
                params = inference.SamplingParams(max_new_tokens=100, temperature=0)
                settings = inference.DecodeSettings(span=span)
                return inference.generate(model, prompt, params, settings=settings, memory=memory)

            return engine

        def new(model, prompt, memory=None, span=None):
            settings = inference.GenerationSettings(max_new_tokens=100, temperature=0, span=span)
            return inference.generate(model, prompt, settings, memory=memory)

        return new
    generate = importlib.import_module(f"{pkg.__name__}.generate").generate

    def old(model, prompt, memory=None, span=None):
        return generate(model, prompt, max_new_tokens=100, temperature=0, memory=memory, span=span)

    return old


def cases(pkg, model, generate):
    tokens = torch.randint(0, SHAPE["vocab_size"], (16, 65), generator=torch.Generator().manual_seed(1))
    memory = model(tokens[:, :64]).memory  # a full memory of 64
    prompt = tokens[:1, :64]

    def train():
        model.train()
        out = model(tokens[:, :64], memory=memory, targets=tokens[:, 1:65])
        out.loss.mean().backward()
        model.zero_grad(set_to_none=True)

    def evaluate():
        model.eval()
        cache = pkg.model.KVCache(model.config, memory=memory)
        with torch.no_grad():
            model(tokens[:, :64], cache=cache, targets=tokens[:, 1:65])

    def gen():
        generate(model, prompt)

    long = pkg.Span(mem_len=1600)
    with torch.no_grad():
        text = torch.randint(0, SHAPE["vocab_size"], (1, 1600), generator=torch.Generator().manual_seed(2))
        full = model.eval()(text, span=long).memory  # a full memory of 1,600

    def gen_1600():
        generate(model, prompt, full, long)

    ragged = [tokens[r, : 8 * (r + 1)] for r in range(8)]

    def gen_ragged():
        generate(model, ragged)

    return {
        "train": train,
        "eval": evaluate,
        "generate": gen,
        "generate_1600": gen_1600,
        "ragged": gen_ragged,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--cases", default="train,eval,generate")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    old = importlib.import_module("txl_old")
    old_model, new_model = models(old)
    runs = {"old": cases(old, old_model, greedy(old)), "new": cases(txl, new_model, greedy(txl))}
    for case in args.cases.split(","):
        for side in ("old", "new"):  # warm up (and the decoding tables)
            runs[side][case]()
        seconds = {"old": [], "new": []}
        for pair in range(args.pairs):
            for side in ("old", "new") if pair % 2 == 0 else ("new", "old"):
                start = time.perf_counter()
                runs[side][case]()
                seconds[side].append(time.perf_counter() - start)
        ratios = [o / n for o, n in zip(seconds["old"], seconds["new"], strict=True)]
        print(
            json.dumps(
                {
                    "case": case,
                    "pairs": args.pairs,
                    "threads": args.threads,
                    "old_ms": round(1e3 * statistics.median(seconds["old"]), 2),
                    "new_ms": round(1e3 * statistics.median(seconds["new"]), 2),
                    "old_over_new": round(statistics.median(ratios), 3),
                    "ratio_quartiles": [round(q, 3) for q in statistics.quantiles(ratios, n=4)],
                    "load_average": [round(x, 2) for x in os.getloadavg()],
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
