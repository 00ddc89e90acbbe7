"""The one evaluation protocol and its reductions. :func:`segment_losses` reads a token array as B streams in
segments, carrying memory from segment to segment (in a key/value cache where it applies), and yields the
per-token losses of each segment; every target is predicted exactly once. :func:`evaluate` reduces them to
perplexity and bits per token over a split, ``analysis.context``, ``serve``'s scoring and the ONNX check read
the same segments. Evaluation may use other lengths than training (a longer memory, another segment length,
a clamp, same-length attention), given as a :class:`~txl.config.Span`. Given the token indices where
documents begin (``starts``), each document attends to nothing before it (``data.documents = "reset"``);
without them the streams read on across documents. :func:`evaluate_run` evaluates a
trained run folder (what ``txl eval`` does). :func:`eval_mode` is the one way to switch a model to evaluation
for a while.

Dimensions: N tokens, B streams (rows), T segment length, V vocabulary.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from .config import ConfigError, Span, TransformerXLConfig, eval_span, first_set
from .data import SegmentStream, check_documents, prepare_data
from .data.stream import Batch
from .distributed import SINGLE, Distributed
from .errors import TxlError
from .limits import cache_bytes, check_fits
from .model import KVCache, Memory, TransformerXL
from .runs import load_run

__all__ = [
    "EvalResult",
    "SegmentLosses",
    "bits_name",
    "check_eval_fits",
    "eval_mode",
    "eval_rows",
    "evaluate",
    "evaluate_run",
    "metrics_from_loss",
    "segment_losses",
]


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
    name = bits_name(kind)
    if name:
        out[name] = bits
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


def check_eval_fits(
    config: TransformerXLConfig,
    *,
    batch_size: int,
    rows: int,
    tgt_len: int,
    steps: int,
    mem_len: int,
    cached: bool,
    device: torch.device | str = "cpu",
) -> None:
    """Refuse (:class:`~txl.errors.SizeError`, one line) an evaluation whose largest buffers cannot fit on
    ``device``, before any is allocated: B ``rows`` (of the ``batch_size`` asked for, those the data fills),
    segments of T ``steps`` attending to K keys (the whole memory from the start when ``cached``, a memory that
    grows with the stream otherwise), the hidden states and keys and values of every layer,
    N x (B, K, D + 2 H Dh), one layer's attention scores and probabilities, 2 x (B, H, T, K), and the
    log-probabilities (B, T, V), in float32; with a cache at least what the cache allocates
    (:func:`txl.limits.cache_bytes`). A lower bound: what it refuses would fail."""
    keys = mem_len + steps
    width = config.d_model + 2 * config.n_head * config.d_head
    floats = config.n_layer * rows * keys * width + 2 * rows * config.n_head * steps * keys
    need = 4 * (floats + rows * steps * config.vocab_size)
    if cached:
        need = max(need, cache_bytes(config, batch=rows, mem_len=mem_len))
    filled = "" if rows == batch_size else f" ({rows} rows filled)"
    check_fits(
        need,
        setting=f"--batch-size {batch_size}{filled} --tgt-len {tgt_len} --mem-len {mem_len}",
        what=f"the memory and attention of {config.n_layer} layers, d_model {config.d_model}",
        lower="--batch-size, --tgt-len or --mem-len",
        device=device,
    )


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in evaluation mode inside the block; every module's own training flag restored after (also
    when the block raises)."""
    flags = {module: module.training for module in model.modules()}
    model.eval()
    try:
        yield model
    finally:
        for module, flag in flags.items():
            module.training = flag


@dataclass(frozen=True)
class SegmentLosses:
    """One segment of :func:`segment_losses`, for the B streams."""

    loss: Tensor
    """(B, T) float64 negative log-likelihood in nats of each target given everything before it in its
    stream (0 where ``mask`` is False)."""
    targets: Tensor
    """(B, T) the target ids."""
    mask: Tensor | None
    """(B, T) bool, True where the target is a real token (the last segment is padded); None when all are."""
    log_probs: Tensor | None = None
    """(B, T, V) the log-probabilities, with ``log_probs=True``."""
    memory: Memory | None = None
    """The memory after the segment when no cache holds it (with ``log_probs=True``: ``reuse_keys`` off)."""

    @property
    def count(self) -> int:
        """The number of real targets."""
        return int(self.mask.sum()) if self.mask is not None else self.targets.numel()


def segment_losses(
    model: TransformerXL,
    tokens: np.ndarray | Tensor,
    *,
    tgt_len: int,
    span: Span | None = None,
    batch_size: int,
    rows: slice | None = None,
    memory: Memory | None = None,
    device: torch.device | str | None = None,
    precision: str = "fp32",
    reuse_keys: bool = True,
    log_probs: bool = False,
    name: str = "tokens",
    starts: np.ndarray | None = None,
) -> Iterator[SegmentLosses]:
    """Per-token losses of ``tokens`` segment by segment: the array (N,) cut into ``batch_size`` contiguous
    streams (:class:`~txl.data.SegmentStream`, the last segment padded), or given as streams already, (B, L+1)
    ids with ``batch_size`` = B, each row's inputs ``row[:-1]`` and targets ``row[1:]``. Each segment of
    ``tgt_len`` attends over the memory of the previous ones with ``span`` (default: the model's), starting
    from ``memory`` (default: none). ``rows``: only these streams (a data-parallel rank's share).

    ``reuse_keys``: a Transformer-XL in float32 keeps the keys and values of the remembered positions in a
    :class:`~txl.model.KVCache` (computed once, when the position was in the current segment) instead of
    projecting the whole memory again at every segment, as generation does; the losses are the same up to
    float rounding. With a memory of 512 and segments of 64 that removes 8/9 of the key and value
    projections. False recomputes them, as training does (where the weights change between segments).
    ``log_probs``: also the (B, T, V) log-probabilities (the losses are then read from them) and the memory.
    ``starts``: the token indices of the (N,) array where documents begin (:attr:`PreparedData.starts`): each
    segment's ``Batch.starts`` are passed to the model, so that a document attends to nothing before it (a
    memory long enough, and each document's losses are those it has read alone). None: read across them.

    Runs in evaluation mode (restored after) without gradients; ``precision`` "bf16" runs under autocast.
    ``name`` names the array in errors (a split)."""
    device = torch.device(device) if device is not None else next(model.parameters()).device
    span = model.config.span if span is None else span
    batches: Iterable[Batch]
    if isinstance(tokens, Tensor) and tokens.dim() == 2:
        if starts is not None:
            raise ValueError("starts are token indices of a 1-D token array; streams (B, L+1) take none")
        if tokens.shape[0] != batch_size or tokens.shape[1] < 2:
            raise ValueError(
                f"streams must be ({batch_size}, L+1) ids with L >= 1, got {tuple(tokens.shape)}"
            )
        ids = tokens.to(device=device, dtype=torch.long)
        inputs, targets = ids[:, :-1], ids[:, 1:]  # (B, L) each
        batches = (
            Batch(inputs[:, start : start + tgt_len], targets[:, start : start + tgt_len])
            for start in range(0, inputs.shape[1], tgt_len)
        )
    else:
        try:
            batches = SegmentStream(
                tokens, batch_size=batch_size, tgt_len=tgt_len, drop_last=False, name=name, starts=starts
            )
        except ValueError as exc:
            raise TxlError(str(exc)) from None
    rows = slice(0, batch_size) if rows is None else rows
    cache = None
    relative = model.config.attention == "relative" and span.mem_len > 0
    if reuse_keys and not log_probs and relative and precision == "fp32":
        dtype = next(model.parameters()).dtype
        cache = KVCache(
            model.config,
            batch_size=rows.stop - rows.start,
            span=span,
            memory=None if memory is None else memory.select(rows),
            dtype=dtype,
            device=device,
        )
    elif memory is not None:
        memory = memory.select(rows)
    with eval_mode(model), torch.no_grad():
        for batch in batches:
            batch = batch.select(rows).to(device)  # (B', T): these streams
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
                # starts only where there are some: a stream without documents calls the model as before
                extra = {} if batch.starts is None else {"starts": batch.starts}
                if log_probs:
                    out = model(batch.inputs, memory=memory, span=span, **extra)
                    probs = out.log_probs.float() if out.log_probs.dtype == torch.bfloat16 else out.log_probs
                    loss = -probs.gather(-1, batch.targets[..., None])[..., 0]  # (B', T)
                elif cache is not None:
                    out = model(batch.inputs, cache=cache, targets=batch.targets, **extra)
                    loss = out.loss
                else:
                    out = model(batch.inputs, memory=memory, targets=batch.targets, span=span, **extra)
                    loss = out.loss
            memory = out.memory
            loss = loss.double()  # (B', T)
            if batch.mask is not None:
                loss = loss * batch.mask
            yield SegmentLosses(
                loss=loss,
                targets=batch.targets,
                mask=batch.mask,
                log_probs=out.log_probs if log_probs else None,
                memory=memory,
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
    starts: np.ndarray | None = None,
) -> EvalResult:
    """Mean negative log-likelihood of every token of ``tokens`` (after the first) given all before it in
    its stream, carrying memory across segments (:func:`segment_losses`, whose ``reuse_keys`` this passes
    on). ``span`` sets the memory length, clamp and same-length attention (default: the model's).
    ``max_tokens`` limits evaluation to a prefix. Under data parallelism (``group``) every process reads its
    rows (streams) of each batch, with their memory, and the loss sums and token counts are added up over the
    processes: the figure is the one process's. Only the rows the data fills are made (:func:`eval_rows`),
    and a batch that cannot fit is refused before anything is allocated (:func:`check_eval_fits`).
    ``starts``: where documents begin (token indices of ``tokens``): each then attends to nothing before it
    (see :func:`segment_losses`)."""
    group.rows(batch_size, field="eval.batch_size")  # the setting as given must split over the processes
    if max_tokens is not None:
        tokens = tokens[: max_tokens + 1]
        if starts is not None:
            starts = starts[starts < len(tokens)]
    span = model.config.span if span is None else span
    device = torch.device(device) if device is not None else next(model.parameters()).device
    asked = batch_size
    batch_size = eval_rows(len(tokens), batch_size, world_size=group.world_size)
    cached = reuse_keys and model.config.attention == "relative" and span.mem_len > 0 and precision == "fp32"
    if batch_size >= 1 and tgt_len >= 1 and len(tokens) >= 2:
        row_len = -(-(len(tokens) - 1) // batch_size)  # targets per stream
        check_eval_fits(
            model.config,
            batch_size=asked,
            rows=batch_size,
            tgt_len=tgt_len,
            steps=min(tgt_len, row_len),
            # a cache holds the whole memory from the start; a memory grows with the stream
            mem_len=span.mem_len if cached else min(span.mem_len, max(row_len - tgt_len, 0)),
            cached=cached,
            device=device,
        )
    rows = group.rows(batch_size, field="eval.batch_size")
    segments = segment_losses(
        model,
        tokens,
        tgt_len=tgt_len,
        span=span,
        batch_size=batch_size,
        rows=rows,
        device=device,
        precision=precision,
        reuse_keys=reuse_keys,
        name=desc,
        starts=starts,
    )
    n_batches = math.ceil(math.ceil((len(tokens) - 1) / batch_size) / tgt_len) if len(tokens) > 1 else 0
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    for segment in tqdm(
        segments, total=n_batches, desc=desc, disable=not progress or not group.is_main, leave=False
    ):
        count += segment.count
        total += segment.loss.sum()
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
    documents: str | None = None,
) -> dict[str, Any]:
    """Evaluate a trained run over a whole split (its first ``max_tokens``) and return one record: the run,
    split, checkpoint and step, the figures of :class:`EvalResult`, and the settings used. ``checkpoint`` is
    named as :func:`txl.runs.find_checkpoint` takes them. Settings left as None are the run's own: its
    ``[eval]`` section, else its training segment (``tgt_len``) or its model's lengths (see
    :func:`~txl.config.eval_span`, which also says what a memory of 0 does to same-length attention).
    ``documents``: "continue" or "reset" (see ``data.documents``; None: the run's own)."""
    run = load_run(Path(run_dir), checkpoint=checkpoint, device=device)
    config = run.config
    span = eval_span(config, mem_len=mem_len, clamp_len=clamp_len, same_length=same_length)
    tgt_len = first_set(tgt_len, config.eval.tgt_len, config.train.tgt_len)
    batch_size = first_set(batch_size, config.eval.batch_size)
    if documents is not None and documents not in ("continue", "reset"):
        raise ConfigError(f"--documents: must be 'continue' or 'reset', got {documents!r}")
    documents = first_set(documents, config.data.documents)
    data = prepare_data(config.data, vocab=run.vocab, splits=(split,))
    check_documents(data.corpus, documents, name="--documents")
    tokens = data.splits[split]
    result = evaluate(
        run.model,
        tokens,
        batch_size=batch_size,
        tgt_len=tgt_len,
        span=span,
        max_tokens=max_tokens,
        progress=progress,
        desc=split,
        starts=data.starts.get(split) if documents == "reset" else None,
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
        "documents": documents,
    }
