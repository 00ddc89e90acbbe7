"""Generation speed: txl's key/value-cached decoding against Hugging Face ``TransfoXLLMHeadModel.generate``
(transformers 4.35.2, the last release with TransfoXL), same sizes, alternated in one process; prints one JSON
line per memory length.

    python3 -m venv --system-site-packages /work/venv-hf && /work/venv-hf/bin/pip install transformers==4.35.2
    PYTHONPATH=src /work/venv-hf/bin/python benchmarks/generate.py                  # memory 64, 512, 1600
    PYTHONPATH=src python3 benchmarks/generate.py --no-hf --memory 64 --repeats 2    # txl only (no transformers)
    PYTHONPATH=src python3 benchmarks/generate.py --ragged --memory 64 --repeats 3   # 8 prompts as one batch

Sizes: vocab 10k (plain softmax), 4 layers, d_model 128, 4 heads x 32, d_inner 512, batch 1, a 64-token
prompt, 200 new tokens, greedy, 2 threads. Random weights: greedy decoding of random weights is the same
amount of work as of trained ones (Hugging Face is told there is no end-of-sequence token, so both always
produce 200 tokens).

Two txl figures per memory length M:
- ``txl_fresh``: the prompt starts with an empty memory, as the issue specifies, so txl attends over at most
  64 + 200 positions even when M is larger. Hugging Face starts from a memory of M zero vectors and attends
  over all M of them from the first step, so at M > 264 this compares unequal work.
- ``txl_full``: txl starts with a full memory of M positions (a segment of M random tokens fed before, not
  timed), so every step attends over M keys as Hugging Face's does: the like-for-like figure.

Peak memory: a fresh subprocess builds one model, runs one generation to warm up, resets the kernel's peak
RSS counter (``/proc/self/clear_refs``), and runs one more: ``peak_rss_mib`` is the peak resident set size
(VmHWM) during that generation, ``peak_rss_growth_mib`` that peak minus the RSS just before it (what the
generation itself allocates), ``process_max_rss_mib`` the whole process's ``ru_maxrss`` (imports included).
Per-token split: wall time inside each layer's one-position attention (projections, cache append, scores,
softmax, output projection), the feed-forward blocks and the output layer with its log-softmax, over one
txl_full decode (timers wrapped around those calls, the 64-token prompt included in the total), divided by
the 200 new tokens; ``other_us`` is the rest (embedding, layer norms, residuals, cache bookkeeping, argmax,
the generation loop in Python).

``--ragged`` (issue 20): 8 prompts of 8 lengths (8, 16, ..., 64 tokens), 200 new tokens each, greedy, from
an empty memory: ``generate`` on the list as one batch (left-padded rows that start at their first token, in
lockstep) against the 8 prompts generated one after the other; alternated, the tokens checked equal.
``ragged_solo_over_batch`` is the median of the per-repeat ratios (how many times faster the batch is).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import torch
from _common import hf_config, reset_peak_rss, status_mib, timed

from txl import Span, TransformerXL, TransformerXLConfig
from txl.inference import DecodeSettings, SamplingParams, generate
from txl.model import decode

SIZES = dict(vocab=10_000, n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512, prompt=64, new=200)


def txl_model(mem_len: int) -> TransformerXL:
    config = TransformerXLConfig(
        vocab_size=SIZES["vocab"],
        n_layer=SIZES["n_layer"],
        d_model=SIZES["d_model"],
        n_head=SIZES["n_head"],
        d_head=SIZES["d_head"],
        d_inner=SIZES["d_inner"],
        mem_len=mem_len,
    )
    return TransformerXL(config).eval()


def hf_model(mem_len: int):
    from transformers import TransfoXLLMHeadModel

    return TransfoXLLMHeadModel(hf_config(txl_model(mem_len).config, tgt_len=SIZES["prompt"])).eval()


def full_memory(model: TransformerXL, mem_len: int):
    """A memory of mem_len positions (a segment of random tokens), so that decoding starts at full length."""
    tokens = torch.randint(0, SIZES["vocab"], (1, mem_len), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(tokens, span=Span(mem_len=mem_len), last_only=True).memory


def run_txl(model: TransformerXL, prompt: torch.Tensor, mem_len: int, memory=None) -> torch.Tensor:
    return generate(
        model,
        prompt,
        SamplingParams(max_new_tokens=SIZES["new"], temperature=0),
        settings=DecodeSettings(span=Span(mem_len=mem_len)),
        memory=memory,
    ).new_tokens


def run_hf(model, prompt: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        out = model.generate(prompt, max_new_tokens=SIZES["new"], do_sample=False)
    new = out[:, prompt.shape[1] :]
    assert new.shape[1] == SIZES["new"], new.shape
    return new


def split_per_token(model: TransformerXL, prompt: torch.Tensor, mem_len: int, memory) -> dict[str, float]:
    """Microseconds per new token inside attention, feed-forward and the output softmax (see the header)."""
    spent = {"attention": 0.0, "feed_forward": 0.0, "softmax": 0.0}
    patched = []

    def wrap(obj, name: str, key: str) -> None:
        original = getattr(obj, name)

        def timed_call(*args, **kwargs):
            start = time.perf_counter()
            out = original(*args, **kwargs)
            spent[key] += time.perf_counter() - start
            return out

        setattr(obj, name, timed_call)
        patched.append((obj, name, original))

    wrap(decode, "attention_step", "attention")  # one position against the cache, projections included
    wrap(decode, "feed_forward_step", "feed_forward")
    wrap(decode.Decoder, "log_probs", "softmax")  # the output layer and the log-softmax
    try:
        total = timed(lambda: run_txl(model, prompt, mem_len, memory))
    finally:
        for obj, name, original in patched:
            setattr(obj, name, original)
    n = SIZES["new"]
    split = {f"{k}_us": round(1e6 * v / n, 1) for k, v in spent.items()}
    split["other_us"] = round(1e6 * (total - sum(spent.values())) / n, 1)
    split["total_us"] = round(1e6 * total / n, 1)
    return split


def peak_rss(kind: str, mem_len: int) -> dict[str, float]:
    """Run one generation in a fresh subprocess and return its peak RSS figures (MiB)."""
    out = subprocess.run(
        [sys.executable, __file__, "--peak-child", kind, "--memory", str(mem_len)],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ.copy(),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def peak_child(kind: str, mem_len: int) -> None:
    torch.set_num_threads(2)
    torch.manual_seed(0)
    prompt = torch.randint(0, SIZES["vocab"], (1, SIZES["prompt"]))
    if kind == "hf":
        model = hf_model(mem_len)
        fn = lambda: run_hf(model, prompt)  # noqa: E731
    else:
        model = txl_model(mem_len)
        memory = full_memory(model, mem_len) if kind == "txl_full" else None
        fn = lambda: run_txl(model, prompt, mem_len, memory)  # noqa: E731
    fn()  # warm up: the libraries' one-time allocations are not the generation's
    reset_peak_rss()
    before = status_mib("VmRSS")
    fn()
    peak = status_mib("VmHWM")
    print(
        json.dumps(
            {
                "peak_rss_mib": round(peak, 1),
                "peak_rss_growth_mib": round(peak - before, 1),
                "process_max_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        )
    )


def bench(mem_len: int, *, repeats: int, with_hf: bool, with_peak: bool) -> dict:
    torch.manual_seed(0)
    prompt = torch.randint(0, SIZES["vocab"], (1, SIZES["prompt"]))
    model = txl_model(mem_len)
    memory = full_memory(model, mem_len)
    runners: dict[str, Callable[[], object]] = {
        "txl_fresh": lambda: run_txl(model, prompt, mem_len),
        "txl_full": lambda: run_txl(model, prompt, mem_len, memory),
    }
    if with_hf:
        hf = hf_model(mem_len)
        runners["hf"] = lambda: run_hf(hf, prompt)
    for fn in runners.values():  # warm up
        fn()
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for r in range(repeats):
        names = list(runners) if r % 2 == 0 else list(reversed(runners))  # alternate the order
        for name in names:
            seconds[name].append(timed(runners[name]))
    n = SIZES["new"]
    record: dict = {
        "memory": mem_len,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "new_tokens": n,
        "prompt": SIZES["prompt"],
    }
    for name, times in seconds.items():
        record[f"{name}_tokens_per_s"] = round(n / statistics.median(times), 1)
    if with_hf:
        for name in ("txl_fresh", "txl_full"):
            # tokens/s txl over hf
            ratios = [h / t for h, t in zip(seconds["hf"], seconds[name], strict=True)]
            record[f"ratio_{name}_over_hf"] = round(statistics.median(ratios), 2)
    record["split_txl_full"] = split_per_token(model, prompt, mem_len, memory)
    if with_peak:
        for name in runners:
            record[f"peak_{name}"] = peak_rss(name, mem_len)
    return record


RAGGED = [8, 16, 24, 32, 40, 48, 56, 64]


def bench_ragged(mem_len: int, *, repeats: int) -> dict:
    """8 prompts of 8 lengths as one batch against one at a time (see the header)."""
    torch.manual_seed(0)
    model = txl_model(mem_len)
    rows = [torch.randint(0, SIZES["vocab"], (n,)) for n in RAGGED]
    batch = lambda: run_txl(model, rows, mem_len)  # noqa: E731
    solo = lambda: [run_txl(model, [row], mem_len) for row in rows]  # noqa: E731
    together, alone = batch(), solo()  # warm up, and the same tokens
    assert all(torch.equal(together[r], alone[r][0]) for r in range(len(rows)))
    seconds: dict[str, list[float]] = {"batch": [], "solo": []}
    for r in range(repeats):
        for name in ("batch", "solo") if r % 2 == 0 else ("solo", "batch"):
            seconds[name].append(timed(batch if name == "batch" else solo))
    n = SIZES["new"] * len(rows)
    ratios = [s / b for s, b in zip(seconds["solo"], seconds["batch"], strict=True)]
    return {
        "case": "ragged",
        "memory": mem_len,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "prompt_lengths": RAGGED,
        "new_tokens_per_row": SIZES["new"],
        "batch_s": round(statistics.median(seconds["batch"]), 3),
        "solo_s": round(statistics.median(seconds["solo"]), 3),
        "batch_tokens_per_s": round(n / statistics.median(seconds["batch"]), 1),
        "solo_tokens_per_s": round(n / statistics.median(seconds["solo"]), 1),
        "ragged_solo_over_batch": round(statistics.median(ratios), 2),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--memory", type=int, action="append", help="memory length(s) (default 64, 512, 1600)"
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-hf", action="store_true", help="txl only (transformers not installed)")
    parser.add_argument("--no-peak", action="store_true", help="skip the peak-memory subprocesses")
    parser.add_argument(
        "--ragged", action="store_true", help="8 prompts of 8 lengths: one batch vs one by one"
    )
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads (default 2)")
    parser.add_argument("--peak-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peak_child:
        peak_child(args.peak_child, args.memory[0])
        return
    torch.set_num_threads(args.threads)
    if args.ragged:
        for mem_len in args.memory or [64]:
            print(json.dumps(bench_ragged(mem_len, repeats=args.repeats)), flush=True)
        return
    for mem_len in args.memory or [64, 512, 1600]:
        print(
            json.dumps(
                bench(mem_len, repeats=args.repeats, with_hf=not args.no_hf, with_peak=not args.no_peak)
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
