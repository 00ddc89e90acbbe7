"""Load check of ``txl serve``: N concurrent streaming clients against a live server on 127.0.0.1, in waves.
Every request must be answered in full (200, events up to ``data: [DONE]``, the usage it asked for) or refused
with 429; anything else counts as an error. The server's resident memory (VmRSS of its process) is read after
a warm-up request and after every wave. Prints one JSON object.

    PYTHONPATH=src python3 benchmarks/serve_load.py                          # 50 clients, 3 waves, queue 8
    PYTHONPATH=src python3 benchmarks/serve_load.py --queue-size 50          # every client is answered
    PYTHONPATH=src python3 benchmarks/serve_load.py --run runs/demo/transformer-xl --max-tokens 200

Without ``--run`` it trains a small run first (the ``tiny`` preset, 300 steps, character vocabulary, on two
copies of Python's textwrap.py; a few seconds). Needs ``pip install 'txl[serve-test]'`` (httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import httpx

SRC = Path(__file__).resolve().parents[1] / "src"


def train_run(folder: Path, steps: int) -> Path:
    corpus = folder / "corpus.txt"
    corpus.write_text(
        (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text(encoding="utf-8") * 2,
        encoding="utf-8",
    )
    run_dir = folder / "run"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "txl",
            "train",
            "--config",
            "tiny",
            "--out",
            str(run_dir),
            "--quiet",
            "--set",
            'data.vocab="char"',
            "--set",
            f"data.corpus={json.dumps(str(corpus))}",
            "--set",
            f"train.steps={steps}",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        env=_env(),
    )
    return run_dir


def _env() -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def one_client(client: httpx.AsyncClient, body: dict) -> dict:
    """One streaming request: its outcome, latency, time to first token, token events."""
    start = time.perf_counter()
    first = None
    tokens = 0
    try:
        async with client.stream("POST", "/v1/completions", json=body) as response:
            if response.status_code == 429:
                error = json.loads(await response.aread())["error"]
                ok = error["type"] == "rate_limit_error"
                return {
                    "outcome": "refused" if ok else "error",
                    "seconds": time.perf_counter() - start,
                    "detail": None if ok else error,
                }
            if response.status_code != 200:
                return {
                    "outcome": "error",
                    "detail": f"status {response.status_code}: {await response.aread()!r}",
                }
            final, done = None, False
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    return {"outcome": "error", "detail": event["error"]}
                if event["choices"][0]["finish_reason"] is None:
                    tokens += 1
                    first = first or time.perf_counter()
                else:
                    final = event
            complete = (
                done
                and final is not None
                and final["usage"]["completion_tokens"] == tokens == body["max_tokens"]
            )
            return {
                "outcome": "answered" if complete else "error",
                "seconds": time.perf_counter() - start,
                "first_token_s": (first - start) if first else None,
                "tokens": tokens,
                "detail": None if complete else f"incomplete stream: {tokens} tokens, done={done}",
            }
    except Exception as exc:  # noqa: BLE001 - counted and reported
        return {"outcome": "error", "detail": f"{type(exc).__name__}: {exc}"}


async def wave(url: str, clients: int, max_tokens: int, seed: int) -> tuple[list[dict], float]:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(
                one_client(
                    client,
                    {
                        "prompt": "def wrap(text, width=70):\n",
                        "max_tokens": max_tokens,
                        "temperature": 0.8,
                        "seed": seed + i,
                        "stream": True,
                    },
                )
                for i in range(clients)
            )
        )
        return results, time.perf_counter() - start


def summarise(results: list[dict], seconds: float) -> dict:
    answered = [r for r in results if r["outcome"] == "answered"]
    refused = [r for r in results if r["outcome"] == "refused"]
    errors = [r for r in results if r["outcome"] == "error"]
    latencies = sorted(r["seconds"] for r in answered)
    firsts = sorted(r["first_token_s"] for r in answered if r["first_token_s"] is not None)
    tokens = sum(r["tokens"] for r in answered)
    return {
        "answered": len(answered),
        "refused_429": len(refused),
        "errors": len(errors),
        "error_details": [r["detail"] for r in errors][:5],
        "tokens": tokens,
        "wall_s": round(seconds, 3),
        "tokens_per_s": round(tokens / seconds, 1) if seconds > 0 else None,
        "latency_s": {"median": round(statistics.median(latencies), 3), "max": round(latencies[-1], 3)}
        if latencies
        else None,
        "first_token_s": {"median": round(statistics.median(firsts), 3), "max": round(firsts[-1], 3)}
        if firsts
        else None,
        "refusal_s_max": round(max(r["seconds"] for r in refused), 3) if refused else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", type=Path, help="a run folder to serve (default: train a small one)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--queue-size", type=int, default=8)
    parser.add_argument(
        "--steps", type=int, default=300, help="training steps of the run trained without --run"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run or train_run(Path(tmp), args.steps)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "txl",
                "serve",
                str(run_dir),
                "--port",
                "0",
                "--log-level",
                "warning",
                "--queue-size",
                str(args.queue_size),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        try:
            line = proc.stdout.readline()
            match = re.search(r"on (http://127\.0\.0\.1:\d+)/", line)
            if not match:
                raise SystemExit(f"txl serve did not start: {line}{proc.stderr.read()}")
            url = match.group(1)
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(url + "/v1/health", timeout=2)
                    break
                except httpx.TransportError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise SystemExit("txl serve did not answer") from None
                    time.sleep(0.1)
            warm = asyncio.run(wave(url, 1, args.max_tokens, seed=10_000))[0][0]
            assert warm["outcome"] == "answered", warm
            rss = [round(rss_mib(proc.pid), 1)]
            waves = []
            for index in range(args.waves):
                results, seconds = asyncio.run(
                    wave(url, args.clients, args.max_tokens, seed=index * args.clients)
                )
                waves.append(summarise(results, seconds))
                rss.append(round(rss_mib(proc.pid), 1))
            health = httpx.get(url + "/v1/health", timeout=10).json()
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                code = proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = None
            stderr = proc.stderr.read()
    report = {
        "clients": args.clients,
        "waves": args.waves,
        "max_tokens": args.max_tokens,
        "queue_size": args.queue_size,
        "run": str(args.run)
        if args.run
        else f"tiny preset, {args.steps} steps, char vocabulary (trained here)",
        "threads": os.environ.get("OMP_NUM_THREADS"),
        "waves_results": waves,
        "every_request_answered_or_429": all(
            w["errors"] == 0 and w["answered"] + w["refused_429"] == args.clients for w in waves
        ),
        "server_rss_mib": {
            "after_warmup": rss[0],
            "after_each_wave": rss[1:],
            "growth": round(rss[-1] - rss[0], 1),
        },
        "server_health": health,
        "server_exit_code": code,
        "server_tracebacks": stderr.count("Traceback"),
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
