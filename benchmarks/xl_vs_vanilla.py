"""Transformer-XL vs the vanilla baseline on the same budget, side by side in one run; prints JSON.

    python benchmarks/xl_vs_vanilla.py --config shakespeare-char --out runs/bench
    python benchmarks/xl_vs_vanilla.py --config tiny --set train.steps=50 --out /tmp/bench   # smoke test

Both runs use the preset unchanged except that the vanilla one has attention="absolute" and no memory.
The figures that matter are the validation losses and the ratio of training throughputs, not absolute
times (machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from txl.config import apply_overrides, load_config
from txl.train.trainer import train


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="shakespeare-char")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--out", default="runs/xl_vs_vanilla")
    args = parser.parse_args()
    base = apply_overrides(load_config(args.config), args.set)
    vanilla = apply_overrides(base, ["model.attention=\"absolute\"", "model.mem_len=0", "eval.mem_len=null"])
    results = {}
    for name, config in (("transformer_xl", base), ("vanilla", vanilla)):
        summary = train(config, Path(args.out) / name, overwrite=True, progress=False)
        results[name] = {k: summary.get(k) for k in ("val_loss", "val_bpc", "val_ppl", "test_loss", "steps",
                                                      "tokens", "train_tokens_per_s", "elapsed_s", "params")}
    report = {
        "config": args.config,
        "overrides": args.set,
        "eval_mem_len": base.eval.mem_len,
        "results": results,
        "val_loss_gap": results["vanilla"]["val_loss"] - results["transformer_xl"]["val_loss"],
        "train_throughput_ratio_xl_over_vanilla": results["transformer_xl"]["train_tokens_per_s"]
        / results["vanilla"]["train_tokens_per_s"],
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
