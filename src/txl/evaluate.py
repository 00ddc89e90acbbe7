"""Perplexity and bits per token over a whole split, carrying memory from segment to segment; every
token of the split is predicted exactly once. Evaluation may use other lengths than training (a longer
memory, another segment length, a clamp, same-length attention), given as a :class:`~txl.config.Span`.
:func:`evaluate_run` evaluates a trained run folder (what ``txl eval`` does).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from .config import Span, TransformerXLConfig, eval_span, first_set
from .data import SegmentStream, prepare_data
from .distributed import SINGLE, Distributed
from .errors import TxlError
from .model import KVCache, TransformerXL
from .runs import load_run

__all__ = ["EvalResult", "bits_name", "eval_rows", "evaluate", "evaluate_run", "metrics_from_loss"]


@dataclass(frozen=True)
class EvalResult:
    """Mean loss over ``tokens`` predicted targets, with perplexity and bits per token."""

    loss: float
    ppl: float
    bits_per_token: float
    tokens: int

    def as_dict(self, prefix: str = "", *, kind: str | None = None) -> dict[str, float | int]:
        """The fields as ``{prefix}name``; with the vocabulary's ``kind`` also the bits under
        :func:`bits_name` (``bpc`` for a char vocabulary, ``bpb`` for a byte one)."""
        out = {f"{prefix}{k}": v for k, v in asdict(self).items()}
        if bits_name(kind):
            out[f"{prefix}{bits_name(kind)}"] = self.bits_per_token
        return out


def bits_name(kind: str | None) -> str | None:
    """What bits per token are also called for a vocabulary of ``kind``: ``bpc`` (bits per character) for a
    char vocabulary, ``bpb`` (per byte) for a byte one, None for word and BPE ones (a token is neither)."""
    return {"char": "bpc", "byte": "bpb"}.get(kind or "")


def metrics_from_loss(loss: float, *, kind: str | None = None) -> dict[str, float]:
    """Perplexity exp(loss) (inf when it overflows) and bits per token loss / ln 2 (also under
    :func:`bits_name` of the vocabulary's ``kind``)."""
    bits = loss / math.log(2)
    out = {"ppl": math.exp(loss) if loss < 700 else float("inf"), "bits_per_token": bits}
    if bits_name(kind):
        out[bits_name(kind)] = bits
    return out


def eval_rows(n_tokens: int, batch_size: int, *, world_size: int = 1) -> int:
    """The batch rows an evaluation of ``n_tokens`` tokens in ``batch_size`` streams actually fills: rows of
    L = ceil((n - 1) / B) targets hold ceil((n - 1) / L) of them, the rest would be all padding. Evaluating
    with that many rows (rounded up to a multiple of ``world_size``, at most B) gives the same streams, the
    same L, hence the same figures."""
    if batch_size < 1 or n_tokens < 2:
        return batch_size  # refused by the stream, with its message
    length = -(-(n_tokens - 1) // batch_size)
    used = -(-(n_tokens - 1) // length)
    return min(batch_size, -(-used // world_size) * world_size)


def _available_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on ``device`` (MemAvailable on the CPU); None when it cannot be told."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def check_eval_fits(
    config: TransformerXLConfig, *, rows: int, steps: int, keys: int, available: int | None
) -> None:
    """Refuse (TxlError, one line) an evaluation whose largest buffers cannot fit in ``available`` bytes:
    with B ``rows``, segments of T ``steps`` and K ``keys`` (memory and segment), the hidden states and the
    keys and values of every layer, N x (B, K, D + 2 H Dh), one layer's attention scores and probabilities,
    2 x (B, H, T, K), and the logits (B, T, V), all in float32. About a lower bound: what it refuses would
    fail."""
    if available is None:
        return
    width = config.d_model + 2 * config.n_head * config.d_head
    floats = config.n_layer * rows * keys * width + 2 * rows * config.n_head * steps * keys
    need = 4 * (floats + rows * steps * config.vocab_size)
    if need > available:
        raise TxlError(
            f"--batch-size / eval.batch_size: {rows} rows of segments of {steps} attending to {keys} positions "
            f"need at least {_size(need)}, more than the {_size(available)} available; "
            "lower the batch size (or the memory or segment length)"
        )


@torch.no_grad()
def evaluate(
    model: TransformerXL,
    tokens: np.ndarray | torch.Tensor,
    *,
    batch_size: int,
    tgt_len: int,
    span: Span | None = None,
    device: torch.device | str | None = None,
    precision: str = "fp32",
    max_tokens: int | None = None,
    progress: bool = False,
    desc: str = "eval",
    group: Distributed = SINGLE,
    reuse_keys: bool = True,
) -> EvalResult:
    """Mean negative log-likelihood of every token of ``tokens`` (after the first) given all before it in
    its stream, carrying memory across segments. ``span`` sets the memory length, clamp and same-length
    attention (default: the model's). ``max_tokens`` limits evaluation to a prefix. Under data parallelism
    (``group``) every process reads its rows (streams) of each batch, with their memory, and the loss sums
    and token counts are added up over the processes: the figure is the one process's.

    ``reuse_keys``: a Transformer-XL evaluated in float32 keeps the keys and values of the remembered positions
    in a :class:`~txl.model.KVCache` (computed once, when the position was in the current segment) instead of
    projecting the whole memory again at every segment, as generation does; the losses are the same up to
    float rounding. With a memory of 512 and segments of 64 that removes 8/9 of the key and value
    projections. False recomputes them, as training does (where the weights change between segments)."""
    group.rows(batch_size, field="eval.batch_size")  # the setting as given must split over the processes
    if max_tokens is not None:
        tokens = tokens[: max_tokens + 1]
    span = model.config.span if span is None else span
    device = torch.device(device) if device is not None else next(model.parameters()).device
    batch_size = eval_rows(len(tokens), batch_size, world_size=group.world_size)
    reuse_keys = (
        reuse_keys and model.config.attention == "relative" and span.mem_len > 0 and precision == "fp32"
    )
    if batch_size >= 1 and tgt_len >= 1 and len(tokens) >= 2:
        row_len = -(-(len(tokens) - 1) // batch_size)  # targets per stream
        check_eval_fits(
            model.config,
            rows=batch_size,
            steps=min(tgt_len, row_len),
            # a cache holds the whole memory from the start; a memory grows with the stream
            keys=span.mem_len + tgt_len if reuse_keys else min(span.mem_len + tgt_len, row_len),
            available=_available_bytes(device),
        )
    rows = group.rows(batch_size, field="eval.batch_size")
    was_training = model.training
    model.eval()
    try:
        stream = SegmentStream(tokens, batch_size=batch_size, tgt_len=tgt_len, drop_last=False, name=desc)
    except ValueError as exc:
        raise TxlError(str(exc)) from None
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    memory = None
    cache = None
    if reuse_keys:
        dtype = next(model.parameters()).dtype
        cache = KVCache(
            model.config, batch_size=rows.stop - rows.start, span=span, dtype=dtype, device=device
        )
    try:
        for batch in tqdm(
            stream, total=stream.n_batches, desc=desc, disable=not progress or not group.is_main, leave=False
        ):
            batch = batch.select(rows).to(device)  # (B/N, T): this process's streams
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                if cache is not None:
                    out = model(batch.inputs, cache=cache, targets=batch.targets)
                else:
                    out = model(batch.inputs, memory=memory, targets=batch.targets, span=span)
            loss = out.loss.double()  # (B, T)
            if batch.mask is not None:
                loss = loss * batch.mask
                count += int(batch.mask.sum())
            else:
                count += batch.targets.numel()
            total += loss.sum()
            memory = out.memory
    finally:
        model.train(was_training)
    total = group.all_reduce_sum(total)
    count = int(group.all_reduce_sum(torch.tensor(count, dtype=torch.int64, device=device)))
    mean = float(total) / max(count, 1)
    return EvalResult(loss=mean, tokens=count, **metrics_from_loss(mean))


def evaluate_run(
    run_dir: Path,
    *,
    split: str = "valid",
    checkpoint: str = "best",
    device: str = "cpu",
    tgt_len: int | None = None,
    batch_size: int | None = None,
    mem_len: int | None = None,
    clamp_len: int | None = None,
    same_length: bool | None = None,
    max_tokens: int | None = None,
    progress: bool = False,
) -> dict[str, Any]:
    """Evaluate a trained run over a whole split (its first ``max_tokens``) and return one record: the run,
    split, checkpoint and step, the figures of :class:`EvalResult`, and the settings used. ``checkpoint`` is
    named as :func:`txl.runs.find_checkpoint` takes them. Settings left as None are the run's own: its
    ``[eval]`` section, else its training segment (``tgt_len``) or its model's lengths (see
    :func:`~txl.config.eval_span`, which also says what a memory of 0 does to same-length attention)."""
    run = load_run(Path(run_dir), checkpoint=checkpoint, device=device)
    config = run.config
    span = eval_span(config, mem_len=mem_len, clamp_len=clamp_len, same_length=same_length)
    tgt_len = first_set(tgt_len, config.eval.tgt_len, config.train.tgt_len)
    batch_size = first_set(batch_size, config.eval.batch_size)
    tokens = prepare_data(config.data, vocab=run.vocab, splits=(split,)).splits[split]
    result = evaluate(
        run.model,
        tokens,
        batch_size=batch_size,
        tgt_len=tgt_len,
        span=span,
        max_tokens=max_tokens,
        progress=progress,
        desc=split,
    )
    return {
        "run": str(run_dir),
        "split": split,
        "checkpoint": run.checkpoint.name,
        "step": run.step,
        **result.as_dict(kind=run.vocab.kind),
        "tgt_len": tgt_len,
        "batch_size": batch_size,
        "mem_len": span.mem_len,
        "clamp_len": span.clamp_len,
        "same_length": span.same_length,
    }
