"""The model loop of ``txl serve`` alone (no HTTP): 16 completions of 64 greedy tokens submitted at once to an
:class:`~txl.serve.engine.Engine` of 16 rows and to one of 1 row, alternated; tokens/s of each and whether their
texts are identical. Prints one JSON object.

    PYTHONPATH=src python3 benchmarks/serve_engine.py --run RUN_DIR --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from txl.runs import load_run
from txl.serve.engine import Engine, Sampling


def submit_all(engine: Engine, ids: torch.Tensor, *, clients: int, tokens: int) -> list[str]:
    futures = []
    for i in range(clients):
        job = engine.admit(rows=1, weight=1)
        sampling = Sampling(max_tokens=tokens, temperature=0, top_k=None, top_p=None, seed=i, stop=())
        futures.append(engine.submit(job, engine.completion_work(job, ids, sampling)))
    return [f.result()["choices"][0]["text"] for f in futures]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--prompt", default="def wrap(text, width=70):\n")
    args = parser.parse_args()
    run = load_run(args.run)
    ids = torch.as_tensor(run.vocab.encode(args.prompt), dtype=torch.long)
    engines = {rows: Engine(run, max_batch=rows, queue_size=args.clients) for rows in (args.clients, 1)}
    for engine in engines.values():  # warm-up
        submit_all(engine, ids, clients=args.clients, tokens=args.tokens)
    rates: dict[int, list[float]] = {rows: [] for rows in engines}
    texts = {}
    for _ in range(args.rounds):
        for rows, engine in engines.items():
            start = time.perf_counter()
            texts[rows] = submit_all(engine, ids, clients=args.clients, tokens=args.tokens)
            rates[rows].append(round(args.clients * args.tokens / (time.perf_counter() - start), 1))
    for engine in engines.values():
        engine.close()
    medians = {rows: statistics.median(r) for rows, r in rates.items()}
    print(
        json.dumps(
            {
                "run": str(args.run),
                "threads": os.environ.get("OMP_NUM_THREADS"),
                "load_average": os.getloadavg(),
                "tokens_per_s": {f"max_batch_{k}": v for k, v in rates.items()},
                "ratio": round(medians[args.clients] / medians[1], 2),
                "same_texts": texts[args.clients] == texts[1],
            }
        )
    )


if __name__ == "__main__":
    main()
