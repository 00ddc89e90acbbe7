"""Thread policies side by side, with and without competing processes (issue 23); prints one JSON line per mode
and load, then a summary line (and a progress line per worker on stderr).

    PYTHONPATH=src python3 benchmarks/threads.py --policies txl torch one passive spin10k \\
        --repeats 3 --steps 6 --max-seconds 6 --gen-tokens 20      # docs/results.md: ~5 min on a quiet machine
    PYTHONPATH=src python3 benchmarks/threads.py --loads 0 --repeats 5            # a quiet machine only

Policies (``--policies``; default ``txl torch one``), each in a fresh process started with no ``OMP_*``
variables of this shell:
- ``txl``: txl's choice for the mode's command (``txl.configure_threads(workload=...)`` before torch is
  imported, as ``txl train`` and ``txl generate`` do), which looks at the cores for 50 ms to tell a quiet
  machine from a shared one (``txl_machine`` in each line: what it saw in each round);
- ``torch``: PyTorch's default (its own thread count, OpenMP's default wait: libgomp spins 300,000 times);
- ``one``: ``OMP_NUM_THREADS=1``;
- ``passive``: ``OMP_WAIT_POLICY=PASSIVE`` (idle threads sleep at once; txl's choice on a shared machine);
- ``passive2``: the same with ``OMP_NUM_THREADS=2`` written out, as txl writes its count;
- ``spin1k`` ... ``spin100k``: ``GOMP_SPINCOUNT=1000`` ... ``100000`` (libgomp's bounded spin, then sleep).

Modes: ``train``, the small config of ``benchmarks/train_eval.py`` (vocab 10k full softmax, 4 layers, d_model 128,
4 heads x 32, d_inner 512, segment 64, memory 64, batch 16; forward, backward, txl's AdamW step), tokens/s = B*T
over the median step time after the warm-up steps; ``generate``, greedy decoding at batch 1 with the sizes of
``benchmarks/generate.py`` (memory 64, a full memory before the 64-token prompt), tokens/s of the median chunk
of ``--gen-tokens`` new tokens. Each worker times ``--steps`` steps (or chunks), fewer when ``--max-seconds``
runs out (at least 2): the slowest policy under load would otherwise take minutes per run.

Load: ``--loads 0 2`` runs every policy without and with 2 competing CPU-bound processes (``while True: pass``),
started before and stopped after each block. Rounds (``--repeats``) alternate the loads and rotate the order of
the policies; each figure is the median over the rounds. ``txl_vs_one``, ``txl_vs_torch`` are ratios of the
medians; ``txl_vs_fastest`` is txl's median over the best policy's. The load average (``os.getloadavg``) is
recorded before and after each block: other work on the machine counts too, so say what it was.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

POLICIES: dict[str, dict[str, str]] = {
    "txl": {},  # txl.configure_threads(workload=...) in the worker
    "torch": {},
    "one": {"OMP_NUM_THREADS": "1"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
    "passive2": {"OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "2"},
    "spin1k": {"GOMP_SPINCOUNT": "1000"},
    "spin3k": {"GOMP_SPINCOUNT": "3000"},
    "spin10k": {"GOMP_SPINCOUNT": "10000"},
    "spin30k": {"GOMP_SPINCOUNT": "30000"},
    "spin100k": {"GOMP_SPINCOUNT": "100000"},
}
"""Each policy's environment on top of this shell's, less its ``OMP_*`` variables; ``txl`` sets its own."""
DEFAULT_POLICIES = ("txl", "torch", "one")
MODES = ("train", "generate")
WORKLOADS = {"train": "batches", "generate": "tokens"}
"""The ``txl`` command whose thread policy each mode runs under (``txl train``, ``txl generate``)."""
_CLEARED = ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "GOMP_SPINCOUNT", "TXL_THREADS_CHOSEN")


def _policy_env(policy: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    return {**env, **POLICIES[policy]}


def _median_rate(step, *, count: int, steps: int, max_seconds: float) -> tuple[float, int]:
    """``count`` items per call of ``step``: items/s over the median call time, and how many calls were timed."""
    times: list[float] = []
    deadline = time.perf_counter() + max_seconds
    while len(times) < steps and (len(times) < 2 or time.perf_counter() < deadline):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return count / statistics.median(times), len(times)


def worker(mode: str, policy: str, args: argparse.Namespace) -> dict:
    """One policy in this fresh process: apply it, then import torch and time ``mode``."""
    machine = None
    if policy == "txl":
        from txl.threads import configure_threads

        machine = configure_threads(workload=WORKLOADS[mode]).machine
    import torch

    from txl import Span

    if mode == "train":
        from train_eval import TxlRunner, _segments, _shape, _warm_up_steps

        shape = _shape("small")
        runner = TxlRunner(shape, train=True)
        warm = _warm_up_steps(shape)
        segments = iter(_segments(shape, warm + args.steps))
        for _ in range(warm):
            runner.step(next(segments))
        rate, timed = _median_rate(
            lambda: runner.step(next(segments)),
            count=shape.batch * shape.tgt_len,
            steps=args.steps,
            max_seconds=args.max_seconds,
        )
    else:
        from generate import SIZES, full_memory, txl_model

        from txl.inference import DecodeSettings, SamplingParams, generate

        torch.manual_seed(0)
        model = txl_model(64)
        memory = full_memory(model, 64)
        prompt = torch.randint(
            0, SIZES["vocab"], (1, SIZES["prompt"]), generator=torch.Generator().manual_seed(2)
        )

        def chunk(new: int = args.gen_tokens) -> None:
            generate(
                model,
                prompt,
                SamplingParams(max_new_tokens=new, temperature=0),
                settings=DecodeSettings(span=Span(mem_len=64)),
                memory=memory,
            )

        chunk(4)  # warm-up: decoding tables, first calls
        rate, timed = _median_rate(
            chunk, count=args.gen_tokens, steps=args.steps, max_seconds=args.max_seconds
        )
    policy_env = {
        k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ
    }
    return {
        "tokens_per_s": rate,
        "timed": timed,
        "threads": torch.get_num_threads(),
        "env": policy_env,
        "machine": machine,
    }


def _run_worker(mode: str, policy: str, args: argparse.Namespace) -> dict:
    command = [sys.executable, __file__, "--worker", mode, "--policy", policy]
    command += ["--steps", str(args.steps), "--max-seconds", str(args.max_seconds)]
    command += ["--gen-tokens", str(args.gen_tokens)]
    out = subprocess.run(command, capture_output=True, text=True, env=_policy_env(policy), check=False)
    if out.returncode:
        raise SystemExit(f"worker {mode}/{policy} failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _start_load(n: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def _stop_load(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        proc.kill()
    for proc in procs:
        proc.wait()


def _ratios(medians: dict[str, float]) -> dict[str, float]:
    """txl's median over one thread's, PyTorch's default's and the fastest policy's; the fastest's name."""
    out: dict = {}
    if "txl" in medians:
        for other in ("one", "torch"):
            if other in medians:
                out[f"txl_vs_{other}"] = round(medians["txl"] / medians[other], 3)
        out["txl_vs_fastest"] = round(medians["txl"] / max(medians.values()), 3)
    out["fastest"] = max(medians, key=medians.get)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument(
        "--loads", nargs="+", type=int, default=[0, 2], help="competing processes (default: 0 2)"
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="rounds; each figure is their median (default: 3)"
    )
    parser.add_argument(
        "--steps", type=int, default=10, help="timed steps or chunks per worker (default: 10)"
    )
    parser.add_argument("--max-seconds", type=float, default=8.0, help="time budget per worker (default: 8)")
    parser.add_argument(
        "--gen-tokens", type=int, default=50, help="new tokens per generation chunk (default: 50)"
    )
    parser.add_argument(
        "--policies",
        nargs="+",
        choices=list(POLICIES),
        default=list(DEFAULT_POLICIES),
        help=f"policies to compare (default: {' '.join(DEFAULT_POLICIES)})",
    )
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--policy", choices=list(POLICIES), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.policy, args)))
        return

    policies = list(dict.fromkeys(args.policies))
    runs: dict[tuple[str, int], dict[str, list[dict]]] = {}
    loadavg: dict[tuple[str, int], list[list[float]]] = {}
    for round_ in range(args.repeats):
        for mode in args.modes:
            for load in args.loads if round_ % 2 == 0 else reversed(args.loads):
                shift = round_ % len(policies)
                order = policies[shift:] + policies[:shift]
                procs = _start_load(load)
                try:
                    time.sleep(0.5 if load else 0)  # let the competing processes get going
                    before = os.getloadavg()[0]
                    for policy in order:
                        result = _run_worker(mode, policy, args)
                        progress = {"round": round_, "mode": mode, "load": load, "policy": policy}
                        print(json.dumps({**progress, **result}), file=sys.stderr, flush=True)
                        runs.setdefault((mode, load), {}).setdefault(policy, []).append(result)
                    loadavg.setdefault((mode, load), []).append(
                        [round(before, 2), round(os.getloadavg()[0], 2)]
                    )
                finally:
                    _stop_load(procs)
    summary = []
    for (mode, load), by_policy in runs.items():
        medians = {p: statistics.median(r["tokens_per_s"] for r in by_policy[p]) for p in policies}
        line = {
            "mode": mode,
            "competing_processes": load,
            "tokens_per_s": {p: round(v, 1) for p, v in medians.items()},
            "runs": {p: [round(r["tokens_per_s"], 1) for r in by_policy[p]] for p in policies},
            "threads": {p: by_policy[p][0]["threads"] for p in policies},
            "env": {p: by_policy[p][0]["env"] for p in policies},
            **({"txl_machine": [r["machine"] for r in by_policy["txl"]]} if "txl" in policies else {}),
            **_ratios(medians),
            "loadavg_1min_before_after": loadavg[(mode, load)],
        }
        summary.append(line)
        print(json.dumps(line), flush=True)
    print(json.dumps({"cpus": len(os.sched_getaffinity(0)), "repeats": args.repeats, "steps": args.steps}))


if __name__ == "__main__":
    main()
