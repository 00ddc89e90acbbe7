"""Transformer-XL vs the vanilla baseline on the same budget, printed as JSON: a thin wrapper of
``txl compare`` (:func:`txl.analysis.compare`), kept for the commands in docs/results.md.

    python benchmarks/xl_vs_vanilla.py --config shakespeare-char --out runs/bench
    python benchmarks/xl_vs_vanilla.py --config tiny --set train.steps=50 --out /tmp/bench   # smoke test

Both runs use the preset unchanged except for :func:`txl.analysis.vanilla_baseline` (absolute attention,
no memory, evaluated on its training segments); the vanilla model is also evaluated with a sliding window.
The figures that matter are the losses and the ratio of training throughputs, not absolute times
(machines are shared and noisy). ``txl compare`` also writes the figures and samples.md into --out.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from txl.analysis import CompareSettings, compare
from txl.analysis.report import plain
from txl.config import apply_overrides, load_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="shakespeare-char")
    parser.add_argument("--set", action="append", default=[])
    parser.add_argument("--stride", type=int, default=1)
    parser.add_argument("--out", default="runs/xl_vs_vanilla")
    args = parser.parse_args()
    config = apply_overrides(load_config(args.config), args.set)
    settings = CompareSettings(
        config_name=args.config,
        overrides=tuple(args.set),
        stride=args.stride,
        sample_tokens=0,
        progress=False,
    )
    result = compare(config, Path(args.out), settings)
    print(json.dumps(plain(result.as_dict()), indent=1))


if __name__ == "__main__":
    main()
