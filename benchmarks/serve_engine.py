"""The model loop of ``txl serve`` alone (no HTTP): 16 completions of 64 greedy tokens submitted at once to an
:class:`~txl.serve.scheduler.Scheduler` of 16 rows and to one of 1 row, alternated; tokens/s of each and whether their
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

from txl.inference import SamplingParams
from txl.runs import LoadedRun, load_run
from txl.serve.openai import CompletionRequest
from txl.serve.scheduler import Scheduler
from txl.serve.work import Completion, completion_work


def submit_all(
    engine: Scheduler, run: LoadedRun, ids: torch.Tensor, *, clients: int, tokens: int
) -> list[str]:
    futures = []
    for i in range(clients):
        job = engine.admit(rows=1, weight=1)
        assert job is not None
        params = SamplingParams(max_new_tokens=tokens, temperature=0, seed=i)
        request = CompletionRequest(prompt="", n=1)
        completion = Completion(run, [ids], params, request, session=None, emit=job.emit)
        futures.append(engine.submit(job, completion_work(completion, mem_len=run.config.model.mem_len)))
    return [f.result().choices[0].text for f in futures]


def make(run: LoadedRun, rows: int, queue: int) -> Scheduler:
    return Scheduler(
        run.model, span=run.config.model.span, max_batch=rows, queue_size=queue, stream_buffer=32
    )


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
    engines = {rows: make(run, rows, args.clients) for rows in (args.clients, 1)}
    for engine in engines.values():  # warm-up
        submit_all(engine, run, ids, clients=args.clients, tokens=args.tokens)
    rates: dict[int, list[float]] = {rows: [] for rows in engines}
    texts = {}
    for _ in range(args.rounds):
        for rows, engine in engines.items():
            start = time.perf_counter()
            texts[rows] = submit_all(engine, run, ids, clients=args.clients, tokens=args.tokens)
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
