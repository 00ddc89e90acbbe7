"""Training and evaluation speed: txl against Hugging Face ``TransfoXLLMHeadModel`` (transformers 4.35.2), the same
shape, alternated in one process; prints one JSON line per config (issue 10).

    python3 -m venv --system-site-packages /work/venv-hf && /work/venv-hf/bin/pip install transformers==4.35.2
    PYTHONPATH=src /work/venv-hf/bin/python benchmarks/train_eval.py --configs small,big,mem512 --repeats 5
    PYTHONPATH=src python3 benchmarks/train_eval.py --no-hf --configs small --profile   # txl only, top-10 ops

Configs (random weights, uniformly random tokens, dropout 0, post-norm, tied weights and projections):
- ``small``: vocab 10k full softmax, 4 layers, d_model 128, 4 heads x 32, d_inner 512, segment 64, memory 64,
  batch 16;
- ``big``: vocab 32k adaptive (cutoffs 2000/10000, div_val 4), 6 layers, d_model 512, 8 heads x 64, d_inner
  2048, segment 128, memory 128, batch 8;
- ``mem512``: ``small`` with a memory of 512.

Training: forward with targets, backward of the mean loss, an Adam step, the memory carried. txl's optimizer is
the one its trainer builds (``configure_optimizer``: AdamW, fused on the CPU and CUDA, here with weight decay 0,
i.e. Adam); Hugging Face's is ``torch.optim.Adam`` with its defaults, as a user of that port would write it.
``--variants torch-adam`` adds txl's model with that same ``torch.optim.Adam`` (``train_txl_torch-adam_...``):
the model-against-model ratio with one optimizer. Evaluation: forward with targets, no gradients, the memory
carried; txl's as ``txl.evaluation`` runs it, with the memory's keys and values kept in a ``KVCache`` (projected
once, when their positions were current; Hugging Face projects the whole memory again at every segment).
``--variants recompute`` adds txl's evaluation without the cache (``eval_txl_recompute_...``).

Timing: warm-up steps first (ceil(M / T) + 1, at least 2: Hugging Face starts from a memory of M zeros, txl's
fills up to M in the warm-up, so that every timed step of both attends over M + T keys); then the models
alternate step by step (the order flips every step) for ``--repeats`` x ``--steps`` steps each. Tokens/s is B*T
over the median step time and the ratio is the median of the per-step ratios. Hugging Face shifts its labels
inside (T - 1 targets per row); both are credited B*T tokens per step.

``--variants bf16,compile,torch-adam`` times txl with bf16 autocast and with ``torch.compile`` (inductor) in the same rotation
(``{mode}_txl_{variant}_tokens_per_s``; the warm-up steps include the compilation).

Roofline: the model FLOPs of one training step (counted in :func:`step_flops`: forward x 3) over txl's median step
time, divided by the FLOP/s of a large float32 matmul measured in this process with the same threads.

Peak RSS (``--peak``): each model and mode in a fresh subprocess (warm-up steps, the kernel's peak counter reset,
``--steps`` more steps): the peak resident set size (VmHWM) in MiB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass

import torch
from _common import hf_config, reset_peak_rss, status_mib, timed

from txl import TransformerXL, TransformerXLConfig
from txl.config import TrainConfig
from txl.model import KVCache
from txl.train.optim import configure_optimizer


@dataclass(frozen=True)
class Shape:
    config: TransformerXLConfig
    batch: int
    tgt_len: int


def _shape(name: str) -> Shape:
    small = dict(vocab_size=10_000, n_layer=4, d_model=128, n_head=4, d_head=32, d_inner=512)
    if name == "small":
        return Shape(TransformerXLConfig(**small, mem_len=64), batch=16, tgt_len=64)
    if name == "mem512":
        return Shape(TransformerXLConfig(**small, mem_len=512), batch=16, tgt_len=64)
    if name == "big":
        return Shape(
            TransformerXLConfig(
                vocab_size=32_000,
                n_layer=6,
                d_model=512,
                n_head=8,
                d_head=64,
                d_inner=2048,
                mem_len=128,
                cutoffs=(2000, 10000),
                div_val=4,
            ),
            batch=8,
            tgt_len=128,
        )
    raise SystemExit(f"unknown config {name!r}: small, big or mem512")


SHAPES = ("small", "big", "mem512")


def step_flops(shape: Shape) -> float:
    """Model FLOPs of one training step (forward x 3), counted from the shapes: projections of queries (T rows)
    and keys, values ([memory ; current], K rows), W_R R (K rows), the three attention matmuls (content, position,
    values; B*H*T*K*Dh each), the output projection, the feed-forward, and the output layer (the adaptive head for
    every position, each tail cluster for the share of positions whose target it holds, uniform tokens)."""
    c, b, t = shape.config, shape.batch, shape.tgt_len
    k = c.mem_len + t
    n = b * t
    inner = c.n_head * c.d_head
    layer = (
        2 * b * c.d_model * inner * (t + 2 * k)  # q, k, v
        + 2 * k * c.d_model * inner  # W_R R
        + 3 * 2 * b * c.n_head * t * k * c.d_head  # content, position, values
        + 2 * n * inner * c.d_model  # output projection
        + 2 * 2 * n * c.d_model * c.d_inner
    )  # feed-forward
    edges = [0, *c.cutoffs, c.vocab_size]
    out = 0.0
    for i, (start, end) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        dim = c.embed_dim // c.div_val**i if c.div_val > 1 else c.embed_dim
        rows = n if i == 0 else n * (end - start) / c.vocab_size
        cols = end - start + (len(c.cutoffs) if i == 0 else 0)
        proj = 2 * rows * c.d_model * dim if (c.div_val > 1 or dim != c.d_model) else 0
        out += proj + 2 * rows * dim * cols
    return 3.0 * (c.n_layer * layer + out)


def gemm_flops(size: int = 2048, repeats: int = 7) -> float:
    """FLOP/s of a (size x size) float32 matmul in this process: the best of ``repeats`` (the machine's reachable
    peak; on a loaded machine the median says more about the load than about the hardware)."""
    a, b = torch.randn(size, size), torch.randn(size, size)
    torch.mm(a, b)
    return 2 * size**3 / min(timed(lambda: torch.mm(a, b)) for _ in range(repeats))


def _warm_up_steps(shape: Shape) -> int:
    """Steps before timing: at least 2, and enough for txl's memory to reach mem_len (Hugging Face starts from
    M zeros), so that every timed step of both attends over M + T keys."""
    return max(2, -(-shape.config.mem_len // shape.tgt_len) + 1)


def _segments(shape: Shape, count: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randint(0, shape.config.vocab_size, (shape.batch, shape.tgt_len + 1), generator=g)
        for _ in range(count)
    ]


class TxlRunner:
    def __init__(self, shape: Shape, *, train: bool, variant: str = "eager") -> None:
        torch.manual_seed(0)
        self.model = TransformerXL(shape.config).train(train)
        self.forward = torch.compile(self.model) if variant == "compile" else self.model
        self.bf16 = variant == "bf16"
        self.optimizer = None
        if train and variant == "torch-adam":  # the reference's optimizer, for the same-optimizer ratio
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        elif train:  # what txl's trainer uses: AdamW (fused where supported); weight decay 0 makes it Adam
            self.optimizer = configure_optimizer(self.model, TrainConfig(lr=1e-4, weight_decay=0.0))
        # Evaluation as txl.evaluation runs it: the memory's keys and values kept in a KVCache (float32, eager);
        # the "recompute" variant (and bf16, compile) projects the whole memory again at every segment.
        self.cache = None
        if not train and variant == "eager":
            self.cache = KVCache(shape.config, batch_size=shape.batch)
        self.train, self.memory = train, None

    def step(self, segment: torch.Tensor) -> None:
        inputs, targets = segment[:, :-1], segment[:, 1:]
        if self.cache is not None:
            self.forward(inputs, cache=self.cache, targets=targets)
            return
        if not self.train:
            with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
                self.memory = self.forward(inputs, memory=self.memory, targets=targets).memory
            return
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.bf16):
            out = self.forward(inputs, memory=self.memory, targets=targets)
        out.loss.mean().backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.memory = out.memory


class HfRunner:
    def __init__(self, shape: Shape, *, train: bool) -> None:
        from transformers import TransfoXLLMHeadModel

        torch.manual_seed(0)
        self.model = TransfoXLLMHeadModel(hf_config(shape.config, tgt_len=shape.tgt_len)).train(train)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4) if train else None
        self.train, self.mems = train, None

    def step(self, segment: torch.Tensor) -> None:
        inputs = segment[:, :-1]
        if not self.train:
            with torch.no_grad():
                self.mems = self.model(input_ids=inputs, mems=self.mems, labels=inputs).mems
            return
        out = self.model(input_ids=inputs, mems=self.mems, labels=inputs)
        out.loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.mems = out.mems


def _runner(kind: str, shape: Shape, *, train: bool):
    """The runner of `kind`: "txl", "hf", or a txl variant: "txl:bf16" (autocast), "txl:compile" (torch.compile)."""
    if kind == "hf":
        return HfRunner(shape, train=train)
    return TxlRunner(shape, train=train, variant=kind.partition(":")[2] or "eager")


def _run(runner, segments: list[torch.Tensor]) -> Callable[[], None]:
    def go() -> None:
        for segment in segments:
            runner.step(segment)

    return go


def compare(
    shape: Shape, *, train: bool, steps: int, repeats: int, with_hf: bool, variants: tuple[str, ...] = ()
) -> dict[str, list[float]]:
    """Seconds of each step, for txl (and hf, and txl's ``variants``), taking turns step by step (the order flips
    every step), so that a change in the machine's load reaches all alike. ``repeats * steps`` steps each."""
    segments = _segments(shape, steps)
    warm = _segments(shape, _warm_up_steps(shape))
    runners = {"txl": _runner("txl", shape, train=train)}
    if with_hf:
        runners["hf"] = _runner("hf", shape, train=train)
    for variant in variants:
        runners[f"txl:{variant}"] = _runner(f"txl:{variant}", shape, train=train)
    for runner in runners.values():
        _run(runner, warm)()  # warm up; fills txl's memory to mem_len
    seconds: dict[str, list[float]] = {name: [] for name in runners}
    for index in range(repeats * steps):
        segment = segments[index % steps]
        for name in list(runners) if index % 2 == 0 else list(reversed(runners)):
            seconds[name].append(timed(lambda runner=runners[name], segment=segment: runner.step(segment)))
    return seconds


def profile_top(shape: Shape, *, steps: int, top: int = 10) -> list[dict]:
    """Self CPU time of the top ``top`` ops over ``steps`` txl training steps, in % of the total."""
    from torch.profiler import ProfilerActivity, profile

    runner = TxlRunner(shape, train=True)
    segments = _segments(shape, steps)
    _run(runner, _segments(shape, _warm_up_steps(shape)))()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        _run(runner, segments)()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    ranked = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    return [
        {"op": e.key, "self_pct": round(100 * e.self_cpu_time_total / total, 1), "calls": e.count}
        for e in ranked
    ]


def peak_child(kind: str, name: str, mode: str, steps: int) -> None:
    shape = _shape(name)
    runner = _runner(kind, shape, train=mode == "train")
    _run(runner, _segments(shape, _warm_up_steps(shape)))()  # memory at mem_len
    reset_peak_rss()
    _run(runner, _segments(shape, steps))()
    print(json.dumps({"peak_rss_mib": round(status_mib("VmHWM"), 1)}))


def peak_rss(kind: str, name: str, mode: str, steps: int, threads: int) -> float:
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--peak-child",
            f"{kind},{name},{mode}",
            "--steps",
            str(steps),
            "--threads",
            str(threads),
        ],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ.copy(),
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["peak_rss_mib"]


def bench(
    name: str,
    *,
    steps: int,
    repeats: int,
    with_hf: bool,
    with_peak: bool,
    profile: bool,
    variants: tuple[str, ...] = (),
) -> dict:
    shape = _shape(name)
    tokens = shape.batch * shape.tgt_len
    record: dict = {
        "config": name,
        "batch": shape.batch,
        "tgt_len": shape.tgt_len,
        "mem_len": shape.config.mem_len,
        "steps": steps,
        "repeats": repeats,
        "threads": torch.get_num_threads(),
        "loadavg_before": [round(x, 2) for x in os.getloadavg()],
    }
    for mode in ("train", "eval"):
        seconds = compare(
            shape, train=mode == "train", steps=steps, repeats=repeats, with_hf=with_hf, variants=variants
        )
        record[f"{mode}_txl_tokens_per_s"] = round(tokens / statistics.median(seconds["txl"]), 1)
        for variant in variants:
            record[f"{mode}_txl_{variant}_tokens_per_s"] = round(
                tokens / statistics.median(seconds[f"txl:{variant}"]), 1
            )
        if with_hf:
            record[f"{mode}_hf_tokens_per_s"] = round(tokens / statistics.median(seconds["hf"]), 1)
            ratios = [h / t for h, t in zip(seconds["hf"], seconds["txl"], strict=True)]
            record[f"{mode}_ratio_txl_over_hf"] = round(statistics.median(ratios), 2)
            for variant in variants:
                ratios = [h / t for h, t in zip(seconds["hf"], seconds[f"txl:{variant}"], strict=True)]
                record[f"{mode}_ratio_txl_{variant}_over_hf"] = round(statistics.median(ratios), 2)
        if mode == "train":
            achieved = step_flops(shape) / statistics.median(seconds["txl"])
            gemm = gemm_flops()
            record["train_step_gflop"] = round(step_flops(shape) / 1e9, 3)
            record["train_txl_gflop_per_s"] = round(achieved / 1e9, 2)
            record["gemm_gflop_per_s"] = round(gemm / 1e9, 2)
            record["roofline_fraction"] = round(achieved / gemm, 3)
    if with_peak:
        for kind in ("txl", "hf") if with_hf else ("txl",):
            for mode in ("train", "eval"):
                record[f"peak_rss_mib_{mode}_{kind}"] = peak_rss(
                    kind, name, mode, steps, torch.get_num_threads()
                )
    if profile:
        record["profile_train_txl_top10"] = profile_top(shape, steps=steps)
    record["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="small,big,mem512", help="comma-separated: small, big, mem512")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=5, help="steps per timed run")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-hf", action="store_true", help="txl only (transformers not installed)")
    parser.add_argument(
        "--peak", action="store_true", help="peak RSS of each model and mode, in subprocesses"
    )
    parser.add_argument("--profile", action="store_true", help="top-10 ops of txl's training step")
    parser.add_argument(
        "--variants",
        default="",
        help="txl variants timed alongside: bf16 (autocast), compile, torch-adam (the reference's optimizer), "
        "recompute (evaluation projecting the whole memory at every segment)",
    )
    parser.add_argument("--peak-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    variants = tuple(v for v in args.variants.split(",") if v)
    for variant in variants:
        if variant not in ("bf16", "compile", "torch-adam", "recompute"):
            parser.error(
                f"--variants: unknown variant {variant!r} (choose from bf16, compile, torch-adam, recompute)"
            )
    torch.set_num_threads(args.threads)
    if args.peak_child:
        kind, name, mode = args.peak_child.split(",")
        peak_child(kind, name, mode, args.steps)
        return
    for name in args.configs.split(","):
        if name not in SHAPES:
            parser.error(f"--configs: unknown config {name!r} (choose from {', '.join(SHAPES)})")
    for name in args.configs.split(","):
        print(
            json.dumps(
                bench(
                    name,
                    steps=args.steps,
                    repeats=args.repeats,
                    with_hf=not args.no_hf,
                    with_peak=args.peak,
                    profile=args.profile,
                    variants=variants,
                )
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
