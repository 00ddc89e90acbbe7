"""Load checks of ``txl serve`` against live servers on 127.0.0.1 (one JSON object; each scenario's figures side
by side, alternated in one run). Every request must be answered in full (200, events up to ``data: [DONE]``,
the usage it asked for) or refused with 429; anything else counts as an error.

- ``waves``: N concurrent streaming clients in waves; the server's resident memory (VmRSS) after a warm-up and
  after every wave.
- ``throughput``: 16 concurrent streaming clients, greedy, 64 tokens each, against a server with
  ``--max-batch 16`` and one with ``--max-batch 1`` (its queue holds them all), waves alternated: aggregate
  tokens/s and their ratio, and each server's CPU seconds per 1000 tokens and their ratio (which the load of
  the machine moves much less).
- ``latency``: time to first token of a client that arrives while 15 others decode, against an idle server,
  alternated; the 15 streams are read by another process (as other users' clients are), and also, for
  comparison, by the measured client's own event loop.
- ``soak``: for ``--soak-s`` seconds clients join, some leave mid-stream, sessions are created, read into,
  continued, deleted or left to expire (``--session-ttl 3``); then no 5xx, ``/v1/health`` back to zero, RSS.
- ``session``: ``--session-tokens`` tokens read through one session in calls of ``--max-prompt-chars``:
  tokens/s of the first and the last calls.

    PYTHONPATH=src python3 benchmarks/serve_load.py --scenario throughput
    PYTHONPATH=src python3 benchmarks/serve_load.py --scenario waves --clients 64 --waves 3
    PYTHONPATH=src python3 benchmarks/serve_load.py --scenario all --soak-s 600

Without ``--run`` it trains a small run first (the ``tiny`` preset, 300 steps, character vocabulary, on two
copies of Python's textwrap.py; a few seconds). Needs ``pip install 'transformer-xl[serve-test]'`` (httpx).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from contextlib import contextmanager
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


async def wave(
    url: str, clients: int, max_tokens: int, seed: int, *, temperature: float = 0.8
) -> tuple[list[dict], float]:
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        start = time.perf_counter()
        results = await asyncio.gather(
            *(
                one_client(
                    client,
                    {
                        "prompt": PROMPTS[i % len(PROMPTS)],
                        "max_tokens": max_tokens,
                        "temperature": temperature,
                        "seed": seed + i,
                        "stream": True,
                    },
                )
                for i in range(clients)
            )
        )
        return results, time.perf_counter() - start


PROMPTS = ["def wrap(text, width=70):\n", "import ", "class TextWrapper:\n    ", "# ", "    return "]


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


@contextmanager
def server(run_dir: Path, *flags: str):
    """A ``txl serve`` process on a free port with ``flags``; yields (url, pid, a dict the exit code and its
    stderr's traceback count are written into when it stops)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "txl", "serve", str(run_dir), "--port", "0", "--log-level", "warning", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(),
    )
    ended: dict = {}
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
        yield url, proc.pid, ended
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            ended["exit_code"] = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            ended["exit_code"] = None
        ended["tracebacks"] = proc.stderr.read().count("Traceback")


def scenario_waves(run_dir: Path, args) -> dict:
    with server(run_dir, "--queue-size", str(args.queue_size), "--max-batch", str(args.max_batch)) as (
        url,
        pid,
        ended,
    ):
        warm = asyncio.run(wave(url, 1, args.max_tokens, seed=10_000))[0][0]
        assert warm["outcome"] == "answered", warm
        rss = [round(rss_mib(pid), 1)]
        waves = []
        for index in range(args.waves):
            results, seconds = asyncio.run(
                wave(url, args.clients, args.max_tokens, seed=index * args.clients)
            )
            waves.append(summarise(results, seconds))
            rss.append(round(rss_mib(pid), 1))
        health = httpx.get(url + "/v1/health", timeout=10).json()
    return {
        "clients": args.clients,
        "waves": args.waves,
        "max_tokens": args.max_tokens,
        "queue_size": args.queue_size,
        "max_batch": args.max_batch,
        "waves_results": waves,
        "every_request_answered_or_429": all(
            w["errors"] == 0 and w["answered"] + w["refused_429"] == args.clients for w in waves
        ),
        "server_rss_mib": {
            "after_warmup": rss[0],
            "after_each_wave": rss[1:],
            "growth_after_first_wave": round(rss[-1] - rss[1], 1) if len(rss) > 1 else None,
        },
        "server_health": health,
        "server": ended,
    }


def cpu_seconds(pid: int) -> float:
    """The CPU time (user + system) a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def scenario_throughput(run_dir: Path, args) -> dict:
    """16 greedy streams of 64 tokens: --max-batch 16 against --max-batch 1, waves alternated. Besides the
    tokens/s, each server's CPU seconds per 1000 tokens: what the server spends, which the other processes on
    the machine (the clients among them) do not change as they change the wall-clock figures."""
    clients, tokens = 16, 64
    rates: dict[str, list[float]] = {"max_batch_16": [], "max_batch_1": []}
    cpu: dict[str, list[float]] = {"max_batch_16": [], "max_batch_1": []}
    clients_cpu: dict[str, list[float]] = {"max_batch_16": [], "max_batch_1": []}
    errors = 0
    with (
        server(run_dir, "--max-batch", "16", "--queue-size", "16") as (batched, batched_pid, ended_b),
        server(run_dir, "--max-batch", "1", "--queue-size", "16") as (single, single_pid, ended_s),
    ):
        for url in (batched, single):  # warm-up
            asyncio.run(wave(url, 2, 8, seed=0, temperature=0))
        servers = (("max_batch_16", batched, batched_pid), ("max_batch_1", single, single_pid))
        for _ in range(args.rounds):
            for name, url, pid in servers:
                before, mine = cpu_seconds(pid), time.process_time()
                results, seconds = asyncio.run(wave(url, clients, tokens, seed=0, temperature=0))
                spent, theirs = cpu_seconds(pid) - before, time.process_time() - mine
                summary = summarise(results, seconds)
                errors += summary["errors"] + summary["refused_429"]
                rates[name].append(summary["tokens_per_s"])
                cpu[name].append(round(1000 * spent / max(summary["tokens"], 1), 3))
                clients_cpu[name].append(round(1000 * theirs / max(summary["tokens"], 1), 3))
    med = {k: statistics.median(v) for k, v in rates.items()}
    cpu_med = {k: statistics.median(v) for k, v in cpu.items()}
    return {
        "clients": clients,
        "max_tokens": tokens,
        "greedy": True,
        "rounds": args.rounds,
        "tokens_per_s": rates,
        "median_tokens_per_s": med,
        "ratio_batched_over_single": round(med["max_batch_16"] / med["max_batch_1"], 2),
        "server_cpu_s_per_1000_tokens": cpu,
        "median_server_cpu_s_per_1000_tokens": cpu_med,
        "cpu_ratio_single_over_batched": round(cpu_med["max_batch_1"] / cpu_med["max_batch_16"], 2),
        "median_clients_cpu_s_per_1000_tokens": {k: statistics.median(v) for k, v in clients_cpu.items()},
        "errors_or_refused": errors,
        "servers": [ended_b, ended_s],
    }


async def _first_token(url: str, *, others: int, rounds: int) -> list[float]:
    """Time to first token of one client arriving while ``others`` long streams decode, the streams read by
    this same event loop (so the measured client also waits for this process's parsing of their events)."""
    limits = httpx.Limits(max_connections=others + 2)
    firsts = []
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        for index in range(rounds):
            background = [
                asyncio.create_task(
                    one_client(
                        client,
                        {"prompt": PROMPTS[i % 5], "max_tokens": 400, "temperature": 0, "stream": True},
                    )
                )
                for i in range(others)
            ]
            while others and (await client.get("/v1/health")).json()["rows_in_use"] < others:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            firsts.append(await _one_first(client, index))
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
            await _until_idle(client)
    return firsts


async def _one_first(client: httpx.AsyncClient, index: int) -> float:
    body = {"prompt": PROMPTS[index % 5], "max_tokens": 4, "temperature": 0, "stream": True}
    result = await one_client(client, body)
    if result["outcome"] != "answered":
        raise SystemExit(f"the measured client failed: {result}")
    return result["first_token_s"]


async def _until_idle(client: httpx.AsyncClient) -> None:
    while (await client.get("/v1/health")).json()["rows_in_use"]:
        await asyncio.sleep(0.01)


def _background_streams(url: str, others: int) -> None:
    """(Its own process) ``others`` greedy streams of 400 tokens that start again as they end, until killed."""

    async def forever(client: httpx.AsyncClient, i: int) -> None:
        while True:
            body = {"prompt": PROMPTS[i % 5], "max_tokens": 400, "temperature": 0, "stream": True}
            await one_client(client, body)

    async def run() -> None:
        limits = httpx.Limits(max_connections=others)
        async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
            await asyncio.gather(*(forever(client, i) for i in range(others)))

    asyncio.run(run())


async def _first_token_apart(url: str, *, others: int, rounds: int) -> list[float]:
    """Time to first token of one client (this process) arriving while ``others`` streams decode, read by
    another process, as other users' clients would be."""
    import multiprocessing

    firsts = []
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        for index in range(rounds):
            proc = multiprocessing.get_context("spawn").Process(
                target=_background_streams, args=(url, others), daemon=True
            )
            proc.start()
            try:
                deadline = time.monotonic() + 60
                while (await client.get("/v1/health")).json()["rows_in_use"] < others:
                    if time.monotonic() > deadline or not proc.is_alive():
                        raise SystemExit("the background streams did not start")
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)
                firsts.append(await _one_first(client, index))
            finally:
                proc.kill()
                proc.join()
            await _until_idle(client)
    return firsts


def scenario_latency(run_dir: Path, args) -> dict:
    """Time to first token against an idle server and while 15 others decode, alternated: the 15 streams read
    by another process (``apart``, the figure of the goal) and by the measured client's own event loop
    (``same_process``, which adds the client's own parsing of their events)."""
    idle, apart, same = [], [], []
    with server(run_dir, "--max-batch", "16") as (url, _, ended):
        asyncio.run(_first_token(url, others=0, rounds=2))  # warm-up
        for _ in range(args.rounds):
            idle += asyncio.run(_first_token(url, others=0, rounds=3))
            apart += asyncio.run(_first_token_apart(url, others=15, rounds=3))
            same += asyncio.run(_first_token(url, others=15, rounds=3))
    mi, ma, ms = statistics.median(idle), statistics.median(apart), statistics.median(same)
    return {
        "first_token_s_idle": [round(x, 4) for x in idle],
        "first_token_s_with_15_decoding": [round(x, 4) for x in apart],
        "first_token_s_with_15_decoding_same_process": [round(x, 4) for x in same],
        "median_idle_s": round(mi, 4),
        "median_loaded_s": round(ma, 4),
        "median_loaded_same_process_s": round(ms, 4),
        "ratio_loaded_over_idle": round(ma / mi, 2),
        "ratio_loaded_same_process_over_idle": round(ms / mi, 2),
        "server": ended,
    }


async def _example(counts: dict, response: httpx.Response) -> None:
    """Keep the first answers of each error status (for the report)."""
    examples = counts.setdefault("examples", {})
    kept = examples.setdefault(str(response.status_code), [])
    if len(kept) < 2:
        kept.append((await response.aread()).decode("utf-8", "replace")[:200])


async def _soak_client(client: httpx.AsyncClient, rng: random.Random, counts: dict) -> None:
    kind = rng.random()
    try:
        if kind < 0.6:  # a completion, maybe left mid-stream
            body = {
                "prompt": rng.choice(PROMPTS),
                "max_tokens": rng.randint(1, 120),
                "temperature": rng.choice([0, 0.8]),
                "seed": rng.randrange(1000),
                "stream": True,
                "n": rng.choice([1, 1, 1, 2]),
                "logprobs": rng.choice([None, None, 2]),
            }
            leave = rng.random() < 0.3
            async with client.stream("POST", "/v1/completions", json=body) as response:
                counts[response.status_code] = counts.get(response.status_code, 0) + 1
                if response.status_code != 200:
                    await _example(counts, response)
                seen = 0
                async for line in response.aiter_lines():
                    seen += line.startswith("data:")
                    if leave and seen >= 3:
                        counts["left"] = counts.get("left", 0) + 1
                        break
        else:  # a session: read, continue, then delete it or leave it to expire
            response = await client.post("/v1/sessions")
            counts[response.status_code] = counts.get(response.status_code, 0) + 1
            if response.status_code != 200:
                await _example(counts, response)
            if response.status_code != 200:
                return
            sid = response.json()["id"]
            for _ in range(rng.randint(1, 3)):
                r = await client.post(f"/v1/sessions/{sid}/score", json={"text": rng.choice(PROMPTS) * 20})
                counts[r.status_code] = counts.get(r.status_code, 0) + 1
                if r.status_code != 200:
                    await _example(counts, r)
            r = await client.post(
                f"/v1/sessions/{sid}/completions", json={"max_tokens": 20, "temperature": 0}
            )
            counts[r.status_code] = counts.get(r.status_code, 0) + 1
            if r.status_code != 200:
                await _example(counts, r)
            if rng.random() < 0.5:
                r = await client.delete(f"/v1/sessions/{sid}")
                counts[r.status_code] = counts.get(r.status_code, 0) + 1
                if r.status_code != 200:
                    await _example(counts, r)
    except httpx.HTTPError as exc:
        counts[type(exc).__name__] = counts.get(type(exc).__name__, 0) + 1


async def _soak(url: str, pid: int, seconds: float, concurrency: int) -> dict:
    rng = random.Random(0)
    counts: dict = {}
    limits = httpx.Limits(max_connections=concurrency + 4)
    rss = []
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:
        deadline = time.monotonic() + seconds
        running: set = set()
        next_rss = time.monotonic()
        while time.monotonic() < deadline:
            while len(running) < concurrency:
                running.add(asyncio.create_task(_soak_client(client, rng, counts)))
            done, running = await asyncio.wait(running, timeout=0.5, return_when=asyncio.FIRST_COMPLETED)
            if time.monotonic() >= next_rss:
                rss.append(round(rss_mib(pid), 1))
                next_rss += max(seconds / 10, 1)
        await asyncio.gather(*running)
        await asyncio.sleep(5)  # the sessions' ttl (3 s) and the sweep
        health = (await client.get("/v1/health")).json()
        rss.append(round(rss_mib(pid), 1))
    examples = counts.pop("examples", {})
    return {
        "status_counts": {str(k): v for k, v in sorted(counts.items(), key=str)},
        "error_examples": examples,
        "rss": rss,
        "health": health,
    }


def scenario_soak(run_dir: Path, args) -> dict:
    with server(run_dir, "--max-batch", "16", "--session-ttl", "3", "--max-sessions", "200") as (
        url,
        pid,
        ended,
    ):
        warm = asyncio.run(_soak(url, pid, 10, 8))  # the first wave: what RSS growth is measured from
        result = asyncio.run(_soak(url, pid, args.soak_s, 24))
    five_xx = sum(v for k, v in result["status_counts"].items() if k.isdigit() and int(k) >= 500)
    health = result["health"]
    start = warm["rss"][-1]
    return {
        "seconds": args.soak_s,
        "concurrency": 24,
        **result,
        "rss_after_warmup_mib": start,
        "rss_growth_pct": round(100 * (result["rss"][-1] - start) / start, 2),
        "five_xx": five_xx,
        "health_back_to_zero": health["admitted"] == 0
        and health["rows_in_use"] == 0
        and health["sessions"] == 0,
        "server": ended,
    }


def scenario_session(run_dir: Path, args) -> dict:
    """Read ``--session-tokens`` through one session (timing each call), then alternate: one call on a fresh
    session (the cost at the start) and one on the session that has read them all (the cost after)."""
    text = (Path(sysconfig.get_paths()["stdlib"]) / "textwrap.py").read_text(encoding="utf-8")
    chars = args.max_prompt_chars
    piece = (text * (chars // len(text) + 2))[:chars]
    calls = -(-args.session_tokens // chars)
    rates = []

    def timed(client: httpx.Client, sid: str) -> float:
        start = time.perf_counter()
        response = client.post(f"/v1/sessions/{sid}/score", json={"text": piece})
        assert response.status_code == 200, response.text
        return len(piece) / (time.perf_counter() - start)

    with server(run_dir, "--max-prompt-chars", str(chars)) as (url, pid, ended):
        with httpx.Client(base_url=url, timeout=600) as client:
            sid = client.post("/v1/sessions").json()["id"]
            rss = [round(rss_mib(pid), 1)]
            for _ in range(calls):
                rates.append(timed(client, sid))
            rss.append(round(rss_mib(pid), 1))
            fresh, after = [], []
            for _ in range(args.rounds * 2):
                new = client.post("/v1/sessions").json()["id"]
                fresh.append(timed(client, new))
                client.delete(f"/v1/sessions/{new}")
                after.append(timed(client, sid))
            read = client.get(f"/v1/sessions/{sid}").json()
    k = min(5, len(rates))
    return {
        "tokens_read": read["tokens_read"],
        "calls": calls,
        "tokens_per_call": chars,
        "tokens_per_s_each_call": [round(r) for r in rates],
        "tokens_per_s_first_calls": round(statistics.median(rates[:k]), 1),
        "tokens_per_s_last_calls": round(statistics.median(rates[-k:]), 1),
        "alternated_tokens_per_s_fresh_session": [round(r) for r in fresh],
        "alternated_tokens_per_s_after_all_read": [round(r) for r in after],
        "ratio_after_over_fresh": round(statistics.median(after) / statistics.median(fresh), 3),
        "memory_length": read["memory_length"],
        "rss_mib": rss,
        "server": ended,
    }


SCENARIOS = {
    "waves": scenario_waves,
    "throughput": scenario_throughput,
    "latency": scenario_latency,
    "soak": scenario_soak,
    "session": scenario_session,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", type=Path, help="a run folder to serve (default: train a small one)")
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="waves")
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--waves", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--queue-size", type=int, default=8)
    parser.add_argument("--max-batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3, help="alternations of the compared settings")
    parser.add_argument("--soak-s", type=float, default=600.0)
    parser.add_argument("--session-tokens", type=int, default=1_000_000)
    parser.add_argument("--max-prompt-chars", type=int, default=20_000)
    parser.add_argument(
        "--steps", type=int, default=300, help="training steps of the run trained without --run"
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        run_dir = args.run or train_run(Path(tmp), args.steps)
        chosen = list(SCENARIOS) if args.scenario == "all" else [args.scenario]
        report = {
            "run": str(args.run)
            if args.run
            else f"tiny preset, {args.steps} steps, char vocabulary (trained here)",
            "threads": os.environ.get("OMP_NUM_THREADS"),
            "load_average_before": os.getloadavg(),
        }
        for name in chosen:
            report[name] = SCENARIOS[name](run_dir, args)
        report["load_average_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
