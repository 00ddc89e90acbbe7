"""Decoding from Python in a program that imported torch itself, beside a busy PyTorch program: the library's
decoding loop with its own thread count (``txl.threads.threads_for``), without it, and under
``txl.configure_threads(workload="tokens")`` (what ``txl generate`` does); prints one JSON line per load and
preset, then a summary line (and a line per worker on stderr).

    PYTHONPATH=src python3 benchmarks/decode_threads.py                          # tiny, loads 0 and 1, 3 rounds
    PYTHONPATH=src python3 benchmarks/decode_threads.py --presets tiny shakespeare-char --repeats 5

Variants (``--variants``; default all three), each in a fresh process started without this shell's ``OMP_*``
and ``TXL_THREADS_*`` variables, that imports torch before txl as a library user's program does:
- ``library``: ``txl.inference.text.generate_text`` as shipped: each decoding step runs on txl's count for
  decoding (one thread), the caller's count restored between steps;
- ``without``: the same call with ``threads_for`` replaced by a block that changes nothing (PyTorch's default
  count during decoding: the library before it ran its steps in ``threads_for``);
- ``configured``: ``txl.configure_threads(workload="tokens")`` before torch is imported (one thread, a passive
  wait: the command's own policy).

The work: ``generate_text(model, ByteVocab(), "class ", GenerationSettings(max_new_tokens=--tokens,
temperature=0.8, top_k=40, seed=0))`` on an untrained model of the preset's sizes (vocabulary 256); a warm-up
call of 4 tokens, then calls until ``--calls`` are timed or ``--max-seconds`` has passed (at least one). The
figure is the median call's seconds (and tokens/s).

Load: ``--loads 0 1`` runs every variant without and with N competing processes, each a PyTorch loop of
256 x 256 matrix products with PyTorch's default threads, started before and stopped after each block.
Rounds (``--repeats``) alternate the order of the loads and rotate the order of the variants; each figure is
the median over the rounds. The load average (``os.getloadavg``) is recorded before and after each block:
other work on the machine counts too, so say what it was.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("library", "without", "configured")
_CLEARED = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "GOMP_SPINCOUNT", "TXL_THREADS_CHOSEN")
_CLEARED_PREFIX = "TXL_THREADS"
LOAD = "import torch\na = torch.randn(256, 256)\nwhile True:\n    a = torch.tanh(a @ a)\n"
"""A competing PyTorch program: matrix products in a loop, PyTorch's default threads."""


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in _CLEARED and not k.startswith(_CLEARED_PREFIX)}


def worker(variant: str, args: argparse.Namespace) -> dict:
    """One variant in this fresh process: import torch as a user's program does, then time the calls."""
    if variant == "configured":
        import txl

        txl.configure_threads(workload="tokens")
    import torch

    from txl import TransformerXL, load_config
    from txl.data.vocab import ByteVocab
    from txl.inference import GenerationSettings
    from txl.inference.text import generate_text

    if variant == "without":
        import txl.inference.loop as loop

        @contextlib.contextmanager
        def unchanged(_workload: str = "tokens"):
            yield torch.get_num_threads()

        loop.threads_for = unchanged  # the loop as it was: PyTorch's count while decoding
    caller_threads = torch.get_num_threads()
    torch.manual_seed(0)
    config = load_config(args.preset).model
    model = TransformerXL(dataclasses.replace(config, vocab_size=256, cutoffs=())).eval()
    vocab = ByteVocab()

    def call(tokens: int) -> None:
        settings = GenerationSettings(max_new_tokens=tokens, temperature=0.8, top_k=40, seed=0)
        generate_text(model, vocab, "class ", settings)

    call(4)  # warm-up: decoding tables, first calls
    times: list[float] = []
    deadline = time.perf_counter() + args.max_seconds
    while len(times) < args.calls and (not times or time.perf_counter() < deadline):
        start = time.perf_counter()
        call(args.tokens)
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    return {
        "seconds": seconds,
        "tokens_per_s": args.tokens / seconds,
        "timed": len(times),
        "caller_threads": caller_threads,
        "threads_after": torch.get_num_threads(),
    }


def _run_worker(variant: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--worker", variant, "--preset", args.preset]
    command += [
        "--tokens",
        str(args.tokens),
        "--calls",
        str(args.calls),
        "--max-seconds",
        str(args.max_seconds),
    ]
    out = subprocess.run(command, capture_output=True, text=True, env=_clean_env(), check=False)
    if out.returncode:
        raise SystemExit(f"worker {variant} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _start_load(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", LOAD], env=_clean_env()) for _ in range(n)]


def _stop_load(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny"], help="model sizes of these presets")
    parser.add_argument("--loads", nargs="+", type=int, default=[0, 1], help="competing PyTorch programs")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--repeats", type=int, default=3, help="rounds; each figure is their median")
    parser.add_argument("--tokens", type=int, default=120, help="new tokens per call (default: 120)")
    parser.add_argument("--calls", type=int, default=5, help="timed calls per worker (default: 5)")
    parser.add_argument(
        "--max-seconds", type=float, default=10.0, help="time budget per worker (default: 10)"
    )
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--preset", default="tiny", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return

    variants = list(dict.fromkeys(args.variants))
    runs: dict[tuple[str, int], dict[str, list[dict]]] = {}
    loadavg: dict[tuple[str, int], list[list[float]]] = {}
    for round_ in range(args.repeats):
        for preset in args.presets:
            args.preset = preset
            for load in args.loads if round_ % 2 == 0 else list(reversed(args.loads)):
                shift = round_ % len(variants)
                order = variants[shift:] + variants[:shift]
                procs = _start_load(load)
                try:
                    time.sleep(1.0 if load else 0)  # let the competing programs get going
                    before = os.getloadavg()[0]
                    for variant in order:
                        result = _run_worker(variant, args)
                        progress = {"round": round_, "preset": preset, "load": load, "variant": variant}
                        print(json.dumps({**progress, **result}), file=sys.stderr, flush=True)
                        runs.setdefault((preset, load), {}).setdefault(variant, []).append(result)
                    loadavg.setdefault((preset, load), []).append(
                        [round(before, 2), round(os.getloadavg()[0], 2)]
                    )
                finally:
                    _stop_load(procs)
    for (preset, load), by_variant in runs.items():
        medians = {v: statistics.median(r["seconds"] for r in by_variant[v]) for v in variants}
        line = {
            "preset": preset,
            "competing_programs": load,
            "tokens": args.tokens,
            "seconds": {v: round(s, 4) for v, s in medians.items()},
            "tokens_per_s": {v: round(args.tokens / s, 1) for v, s in medians.items()},
            "runs_seconds": {v: [round(r["seconds"], 4) for r in by_variant[v]] for v in variants},
            "caller_threads": {v: by_variant[v][0]["caller_threads"] for v in variants},
            "threads_after": {v: by_variant[v][0]["threads_after"] for v in variants},
            **(
                {"without_over_library": round(medians["without"] / medians["library"], 2)}
                if {"without", "library"} <= set(medians)
                else {}
            ),
            "loadavg_1min_before_after": loadavg[(preset, load)],
        }
        print(json.dumps(line), flush=True)
    print(json.dumps({"cpus": len(os.sched_getaffinity(0)), "repeats": args.repeats, "calls": args.calls}))


if __name__ == "__main__":
    main()
