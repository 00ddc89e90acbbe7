"""Decoding against its floor: CPU time per token of txl's one-position step (eager, and compiled ahead of
time with ``Decoder(..., compiled=True)``) beside the matrix-vector work of the same weights alone, and the RL
collector's environment steps per second (XL eager, XL with ``CoreConfig(compiled=True)``, GRU). Rounds
alternate the variants in one process, one thread, CPU time (``time.process_time``), the 1-minute load
average beside each figure; prints one JSON line per case and one with the compile costs.

    PYTHONPATH=src python3 benchmarks/decode_floor.py                      # every case, 7 rounds
    PYTHONPATH=src python3 benchmarks/decode_floor.py --cases lm --rounds 5
    PYTHONPATH=src python3 benchmarks/decode_floor.py --cases rl --rounds 5
    PYTHONPATH=src python3 benchmarks/decode_floor.py --cold               # compile into an empty folder
    PYTHONPATH=src python3 benchmarks/decode_floor.py --cases layers --vocab 256 --rounds 3

Language model: 4 layers, d_model 128, 4 heads x 32, d_inner 512, memory 64, random weights, greedy, a vocabulary
of 256 (bytes) and of 10,000, batch 1 and 16; a 64-token prompt, then ``--tokens`` steps per round (timed).
The floor of a step is the 17 weight matrices it multiplies (4 per layer: qkv, output, two feed-forward; and
the output layer), each ``torch.mv`` at batch 1 and ``torch.mm`` of B rows at batch B, on the model's own
weights (distinct tensors, as the step reads them). ``ratio`` = step / floor.

Compile costs: ``first_step_s`` is the first compiled step of a fresh decoder for these sizes in this process:
the package compiled (``--cold``: an empty folder of compiled steps) or loaded from disk; ``break_even_tokens``
is how many tokens repay it at the measured saving per token; ``generate_ms_per_token`` is the same greedy
decoding through :func:`txl.inference.generate` (the engine's bookkeeping, the drawing of each token and the
steps it yields included): ``(time of N + 1 new tokens - time of 1) / N`` per round, beside the floor in
``generate_ratio_to_floor``; ``generate_16`` and ``generate_500`` time whole
greedy generations (a fresh decoder each: its prefill, its tables and, compiled, a load of the package from
disk), eager against compiled, wall-clock.

Layers (``--cases layers``, batch 1, compiled): where a token's time goes, each layer of the decoding stack
timed alone with the same token again and again, from the inside out: the compiled function (its package's
entry point), ``Decoder.step`` around it, the rows of the batch (``RowBatch.step``), the engine
(``Engine.step``: feeding, drawing, one event per token) and ``generate``, beside the floor.

RL: PPO's defaults (16 environments, rollouts of 128 steps), CoreConfig's defaults (2 GTrXL layers, d_model 64,
memory 64), RepeatPreviousEasy; a rollout per variant per round (``collect``: core steps, heads, environments).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from torch import Tensor

from txl import TransformerXL, TransformerXLConfig
from txl.inference import DecodeSettings, SamplingParams, generate
from txl.model.cache import KVCache
from txl.model.decode import Decoder

SIZES = dict(n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, mem_len=64)
PROMPT = 64


def model_of(vocab: int) -> TransformerXL:
    torch.manual_seed(0)
    return TransformerXL(TransformerXLConfig(vocab_size=vocab, **SIZES)).eval()


def decoder(model: TransformerXL, batch: int, *, compiled: bool) -> tuple[Decoder, Tensor]:
    """A decoder after a prompt of ``PROMPT`` tokens, and the log-probabilities of the next token."""
    cache = KVCache(model.config, batch_size=batch)
    dec = Decoder(model, cache, compiled=compiled)
    prompt = torch.randint(
        model.config.vocab_size, (batch, PROMPT), generator=torch.Generator().manual_seed(1)
    )
    return dec, dec.prefill(prompt)


def greedy(dec: Decoder, log_probs: Tensor, n: int) -> Tensor:
    for _ in range(n):
        log_probs = dec.step(log_probs.argmax(-1))
    return log_probs


def floor_weights(model: TransformerXL) -> list[Tensor]:
    """The 17 weight matrices (out, in) of a step: qkv, output, two feed-forward per layer; the output layer."""
    weights = []
    for layer in model.layers:
        ff = layer.ff.net  # type: ignore[union-attr]
        weights += [layer.attn.qkv.weight, layer.attn.out.weight, ff[0].weight, ff[3].weight]  # type: ignore[union-attr,index]
    weights.append(model.softmax.cluster_params(0)[0])
    return [w.detach() for w in weights]


def floor_step(weights: list[Tensor], batch: int) -> Callable[[], None]:
    inputs = {w.shape[1]: torch.randn(batch, w.shape[1]) for w in weights}
    if batch == 1:
        vectors = {k: v[0] for k, v in inputs.items()}
        return lambda: [torch.mv(w, vectors[w.shape[1]]) for w in weights] and None
    return lambda: [torch.mm(inputs[w.shape[1]], w.t()) for w in weights] and None


def cpu_per_call(fn: Callable[[], object], n: int) -> float:
    begin = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - begin) / n


def lm_case(vocab: int, batch: int, args: argparse.Namespace) -> dict:
    model = model_of(vocab)
    weights = floor_weights(model)
    start = time.perf_counter()
    fast, fast_lp = decoder(model, batch, compiled=True)
    fast_lp = fast.step(fast_lp.argmax(-1))
    first_step_s = time.perf_counter() - start
    eager, eager_lp = decoder(model, batch, compiled=False)
    eager_lp = eager.step(eager_lp.argmax(-1))
    if not fast.compiled:
        raise SystemExit("the compiled step is not available here (see the warning)")
    floor = floor_step(weights, batch)
    state = {"eager": (eager, eager_lp), "compiled": (fast, fast_lp)}
    times: dict[str, list[float]] = {"eager": [], "compiled": [], "floor": []}
    loads = []
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name in ("eager", "compiled"):
                dec, lp = state[name]
                begin = time.process_time()
                lp = greedy(dec, lp, args.tokens)
                times[name].append((time.process_time() - begin) / args.tokens)
                state[name] = (dec, lp)
            times["floor"].append(cpu_per_call(floor, args.tokens))
            loads.append(os.getloadavg()[0])
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    per_token = generate_per_token(model, batch, args)
    saving = med["eager"] - med["compiled"]
    ends = {}
    for tokens in (16, 500):
        runs: dict[str, list[float]] = {"eager": [], "compiled": []}
        for _ in range(max(1, args.rounds // 2)):
            for name in runs:
                begin = time.perf_counter()
                dec, lp = decoder(model, batch, compiled=name == "compiled")
                greedy(dec, lp, tokens)
                runs[name].append(time.perf_counter() - begin)
        ends[f"generate_{tokens}_s"] = {k: round(statistics.median(v), 4) for k, v in runs.items()}
    return {
        "case": "decode step against its matrix-vector floor",
        "vocab": vocab,
        "batch": batch,
        "ms_per_step": {k: round(v, 4) for k, v in med.items()},
        "ms_per_token": {k: round(v / batch, 4) for k, v in med.items()},
        "ratio_to_floor": {k: round(med[k] / med["floor"], 2) for k in ("eager", "compiled")},
        "compiled_speedup": round(med["eager"] / med["compiled"], 2),
        "generate_ms_per_token": {k: round(v, 4) for k, v in per_token.items()},
        "generate_ratio_to_floor": {k: round(v * batch / med["floor"], 2) for k, v in per_token.items()},
        "first_step_s": round(first_step_s, 2),
        "break_even_tokens": round(first_step_s * 1e3 / saving * batch) if saving > 0 else None,
        **ends,
        "rounds": args.rounds,
        "tokens_per_round": args.tokens,
        "load_1min": [round(x, 2) for x in loads],
    }


def generate_per_token(model: TransformerXL, batch: int, args: argparse.Namespace) -> dict[str, float]:
    """Milliseconds per token of greedy :func:`generate` (eager, compiled), the prompt's cost taken out:
    ``(time of N + 1 new tokens - time of 1) / N`` per round, alternated, the median."""
    prompt = torch.randint(
        model.config.vocab_size, (batch, PROMPT), generator=torch.Generator().manual_seed(1)
    )

    def run(new: int, compiled: bool) -> float:
        params = SamplingParams(max_new_tokens=new, temperature=0)
        begin = time.process_time()
        generate(model, prompt, params, settings=DecodeSettings(compiled=compiled))
        return time.process_time() - begin

    times: dict[str, list[float]] = {"eager": [], "compiled": []}
    for _ in range(args.rounds):
        for name in times:
            whole, first = run(args.tokens + 1, name == "compiled"), run(1, name == "compiled")
            times[name].append((whole - first) / (args.tokens * batch))
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def layers_case(vocab: int, args: argparse.Namespace) -> dict:
    """CPU ms per token at batch 1 (compiled) of each layer of the decoding stack, from the inside out."""
    from txl.inference.engine import Engine

    model = model_of(vocab)
    prompt = torch.randint(vocab, (PROMPT,), generator=torch.Generator().manual_seed(1))
    engine = Engine(model, DecodeSettings(compiled=True, rows=1))
    engine.add(prompt, SamplingParams(max_new_tokens=10**9, temperature=0))
    for _ in range(5):
        engine.step()
    rows = engine.rows
    dec = rows.decoder  # type: ignore[union-attr]
    fast = dec._compiled_step(dec.xl, dec.tables)
    if fast is None:
        raise SystemExit("the compiled step is not available here (see the warning)")
    step, token = fast.step, torch.tensor([5])
    inputs = [fast.embed(token), step.where, fast.every, dec.cache.kv, dec.cache.hidden, *step.weights]
    floor = floor_step(floor_weights(model), 1)
    n = args.tokens

    def generated() -> float:
        params = SamplingParams(max_new_tokens=n + 1, temperature=0)
        settings = DecodeSettings(compiled=True)
        begin = time.process_time()
        generate(model, prompt[None], params, settings=settings)
        whole = time.process_time() - begin
        begin = time.process_time()
        generate(model, prompt[None], SamplingParams(max_new_tokens=1, temperature=0), settings=settings)
        return (whole - (time.process_time() - begin)) / n

    parts: dict[str, Callable[[], float]] = {
        "floor": lambda: cpu_per_call(floor, n),
        "compiled_function": lambda: cpu_per_call(lambda: step.run(list(inputs)), n),
        "decoder_step": lambda: cpu_per_call(lambda: dec.step(token), n),
        "rows_step": lambda: cpu_per_call(lambda: rows.step(token), n),
        "engine_step": lambda: cpu_per_call(engine.step, n),
        "generate": generated,
    }
    times: dict[str, list[float]] = {k: [] for k in parts}
    loads = []
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, part in parts.items():
                times[name].append(part() * 1e3)
            loads.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "case": "where a token's time goes (batch 1, compiled)",
        "vocab": vocab,
        "ms_per_token": {k: round(v, 4) for k, v in med.items()},
        "ratio_to_floor": {k: round(v / med["floor"], 2) for k, v in med.items()},
        "rounds": args.rounds,
        "load_1min": [round(x, 2) for x in loads],
    }


def rl_case(args: argparse.Namespace) -> dict:
    from txl.rl import CoreConfig, PPOConfig
    from txl.rl.agent import Agent
    from txl.rl.ppo import Collector, check_vector_env, collect
    from txl.rl.run import make_envs

    ppo = PPOConfig()
    variants = {
        "xl": ("xl", CoreConfig()),
        "xl_compiled": ("xl", CoreConfig(compiled=True)),
        "gru": ("gru", CoreConfig()),
    }
    setups = {}
    compile_s = None
    for name, (kind, core) in variants.items():
        envs = make_envs("RepeatPreviousEasy", ppo.n_envs)
        actions = check_vector_env(envs, ppo.n_envs)
        torch.manual_seed(0)
        agent = Agent(kind, envs.single_observation_space.shape[0], actions, core)
        collector = Collector.begin(envs, agent, seed=0)
        begin = time.perf_counter()
        collect(agent, collector, ppo)  # warm up (and compile)
        if name == "xl_compiled":
            compile_s = time.perf_counter() - begin
        setups[name] = (agent, collector)
    steps = ppo.n_envs * ppo.n_steps
    rates: dict[str, list[float]] = {k: [] for k in variants}
    loads = []
    for _ in range(args.rounds):
        for name, (agent, collector) in setups.items():
            begin = time.process_time()
            collect(agent, collector, ppo)
            rates[name].append(steps / (time.process_time() - begin))
        loads.append(os.getloadavg()[0])
    med = {k: statistics.median(v) for k, v in rates.items()}
    return {
        "case": "RL collection, environment steps per CPU second",
        "env_steps_per_s": {k: round(v) for k, v in med.items()},
        "xl_compiled_over_xl": round(med["xl_compiled"] / med["xl"], 2),
        "gru_over_xl": round(med["gru"] / med["xl"], 2),
        "gru_over_xl_compiled": round(med["gru"] / med["xl_compiled"], 2),
        "first_rollout_compiled_s": round(compile_s or 0.0, 1),
        "rounds": args.rounds,
        "load_1min": [round(x, 2) for x in loads],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=200, help="timed steps per round")
    parser.add_argument("--cases", choices=("all", "lm", "rl", "layers"), default="all")
    parser.add_argument("--vocab", type=int, nargs="+", default=[256, 10_000])
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--cold", action="store_true", help="compile into an empty folder of compiled steps")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.cold:
        os.environ["TXL_COMPILED_DIR"] = tempfile.mkdtemp(prefix="txl-compiled-")
    if args.cases in ("all", "lm"):
        for vocab in args.vocab:
            for batch in args.batch:
                print(json.dumps(lm_case(vocab, batch, args)), flush=True)
    if args.cases == "layers":
        for vocab in args.vocab:
            print(json.dumps(layers_case(vocab, args)), flush=True)
    if args.cases in ("all", "rl"):
        print(json.dumps(rl_case(args)), flush=True)


if __name__ == "__main__":
    main()
