"""``txl serve`` from two source trees side by side: a server of each (the same run, the same flags), and waves
of 16 greedy streaming clients of 64 tokens sent to one, then the other, alternated; tokens/s of each wave, their
medians and ratio, the load average. Prints one JSON object.

    PYTHONPATH=src python3 benchmarks/serve_ab.py --run RUN --before /tmp/old-checkout/src --rounds 6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
from contextlib import ExitStack
from pathlib import Path

import serve_load


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--before", type=Path, required=True, help="the src folder of the other tree")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--max-batch", default="16")
    args = parser.parse_args()
    trees = {"before": args.before.resolve(), "after": serve_load.SRC}
    urls = {}
    load = [os.getloadavg()]
    with ExitStack() as stack:
        for name, src in trees.items():
            serve_load.SRC = src  # the server() helper puts SRC first on the child's PYTHONPATH
            flags = ("--max-batch", args.max_batch, "--queue-size", "16")
            urls[name] = stack.enter_context(serve_load.server(args.run, *flags))[0]
        for url in urls.values():  # warm-up
            asyncio.run(serve_load.wave(url, 2, 8, seed=0, temperature=0))
        rates: dict[str, list[float]] = {name: [] for name in urls}
        for index in range(args.rounds):
            order = list(urls) if index % 2 == 0 else list(reversed(urls))
            for name in order:
                results, seconds = asyncio.run(serve_load.wave(urls[name], 16, 64, seed=0, temperature=0))
                rates[name].append(serve_load.summarise(results, seconds)["tokens_per_s"])
            load.append(os.getloadavg())
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(
        json.dumps(
            {
                "run": str(args.run),
                "max_batch": int(args.max_batch),
                "tokens_per_s": rates,
                "median_tokens_per_s": medians,
                "after_over_before": round(medians["after"] / medians["before"], 2),
                "load_average": [[round(x, 1) for x in la] for la in load],
            }
        )
    )


if __name__ == "__main__":
    main()
