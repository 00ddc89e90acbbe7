"""Data-parallel scaling on this machine, printed as JSON: the same run (a preset, the same global batch of
train.batch_size streams) trained by 1 process and by N (``txl train --nproc N``, torchrun, gloo on the CPU,
NCCL on GPUs), each process's figure from its summary.json.

    OMP_NUM_THREADS=1 python benchmarks/ddp_scaling.py --nproc 1 2 --set train.batch_size=16 --set train.tgt_len=64

``train_tokens_per_s`` counts the tokens of the whole global batch per second of training steps (evaluations
and start-up excluded); ``speedup`` is its ratio to 1 process. Threads: set OMP_NUM_THREADS so that N
processes x threads fit the cores (one thread each on a 2-core machine), or the processes fight for them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run(nproc: int, config: str, overrides: list[str], out: Path) -> dict[str, float]:
    cmd = [
        sys.executable,
        "-m",
        "txl",
        "train",
        "--config",
        config,
        "--out",
        str(out),
        "--quiet",
        "--nproc",
        str(nproc),
    ]
    for item in ("train.eval_every=0", "train.checkpoint_every=0", *overrides):
        cmd += ["--set", item]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    summary = json.loads((out / "summary.json").read_text())
    return {
        "nproc": nproc,
        "steps": summary["steps"],
        "tokens": summary["tokens"],
        "train_tokens_per_s": round(summary["train_tokens_per_s"], 1),
        "wall_s": round(wall, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="tiny")
    parser.add_argument("--nproc", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--set", action="append", default=[])
    args = parser.parse_args()
    overrides = ["train.steps=60", "train.batch_size=16", "train.tgt_len=64", *args.set]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for nproc in args.nproc:
            results.append(_run(nproc, args.config, overrides, Path(tmp) / f"n{nproc}"))
    base = results[0]["train_tokens_per_s"]
    for result in results:
        result["speedup"] = round(result["train_tokens_per_s"] / base, 2)
    print(
        json.dumps(
            {
                "config": args.config,
                "overrides": overrides,
                "cores": os.cpu_count(),
                "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
                "runs": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
