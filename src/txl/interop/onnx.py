"""``txl export``: a run's model as an ONNX graph of one segment with its memory, ``(tokens (B, T), memory_reach
(B,), memory_0 .. memory_{N-1} (B, M, D)) -> (log_probs (B, T, V), new_memory_reach, new_memory_0 ..)``, and
its check against txl with onnxruntime (the extra ``export``); loading the run is :mod:`txl.runs`' job.
"""

from __future__ import annotations

import io
import logging
import os
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from ..config import ConfigError, EvalLengths, Span, TransformerXLConfig, eval_lengths, positive_int
from ..errors import TxlError
from ..evaluation import EvalSettings, segment_losses
from ..limits import check_fits, segment_bytes
from ..model import Memory, TransformerXL, eval_mode

if TYPE_CHECKING:
    from ..runs import LoadedRun

__all__ = [
    "ExportError",
    "ExportSettings",
    "OnnxCheck",
    "check_export_fits",
    "SegmentStep",
    "export_model",
    "export_onnx",
    "check_onnx",
    "onnxruntime_session",
    "EXAMPLE_BATCH",
]

EXAMPLE_BATCH = 2
"""Rows of the example input the graph is traced with (the exported batch is dynamic)."""


class ExportError(TxlError):
    """A model that cannot be exported as asked, or an export that does not match the model."""


@dataclass(frozen=True)
class ExportSettings:
    """What :func:`export_onnx` exports."""

    lengths: EvalLengths | None = None
    """The segment the graph reads (T, fixed in the graph) and the span of its memory (M positions read and
    returned, fixed in the graph, above 0; the clamp and same-length attention). None: the run's, as ``txl
    eval`` starts (its ``[eval]`` section, else its training segment and its model's lengths,
    :func:`~txl.config.eval_lengths`)."""
    opset: int = 18
    """The ONNX opset version of the graph."""
    check: bool = True
    """Run the file with onnxruntime over a few segments against txl (:func:`check_onnx`)."""

    def __post_init__(self) -> None:
        if self.lengths is not None and not isinstance(self.lengths, EvalLengths):
            raise ConfigError(f"lengths: must be an EvalLengths, got {type(self.lengths).__name__}")
        positive_int(self.opset, "opset")


@dataclass(frozen=True)
class OnnxCheck:
    """How :func:`check_onnx` compares an exported file with txl."""

    segments: int = 3
    """Segments run one after the other, the memory carried through."""
    batch_size: int = 3
    """Rows of the random tokens (the exported batch is dynamic)."""
    atol: float = 1e-4
    """The largest difference allowed (log-probabilities and memory)."""
    seed: int = 0
    """Seed of the random tokens."""

    def __post_init__(self) -> None:
        positive_int(self.segments, "segments")
        positive_int(self.batch_size, "batch_size")


class SegmentStep(nn.Module):
    """One segment with memory, as plain tensors in and out (the exported function): ``forward(tokens,
    reach, *memory) -> (log_probs, new_reach, *new_memory)``, with the memory length ``span.mem_len`` kept
    constant."""

    def __init__(self, model: TransformerXL, *, span: Span) -> None:
        super().__init__()
        self.model, self.span = model, span

    def forward(self, tokens: Tensor, reach: Tensor, *memory: Tensor) -> tuple[Tensor, ...]:
        out = self.model(tokens, memory=Memory(tuple(memory), reach), span=self.span)
        return (out.log_probs, out.memory.reach, *out.memory.states)


def _names(n_layer: int) -> tuple[list[str], list[str]]:
    inputs = ["tokens", "memory_reach", *(f"memory_{i}" for i in range(n_layer))]
    outputs = ["log_probs", "new_memory_reach", *(f"new_memory_{i}" for i in range(n_layer))]
    return inputs, outputs


def check_export_fits(config: TransformerXLConfig, lengths: EvalLengths) -> None:
    """Refuse lengths that cannot be exported: no memory (:class:`ExportError`: the export carries one), or a
    segment or memory whose buffers in the traced example (:data:`EXAMPLE_BATCH` rows) cannot fit in the
    memory available (:class:`~txl.errors.SizeError`); each names the lengths."""
    if lengths.span.mem_len <= 0:
        raise ExportError(
            f"mem_len must be positive, got {lengths.span.mem_len} (the export carries a memory)",
            fields=("mem_len",),
        )
    check_fits(
        segment_bytes(config, batch=EXAMPLE_BATCH, tgt_len=lengths.tgt_len, mem_len=lengths.span.mem_len),
        setting=f"tgt_len {lengths.tgt_len} mem_len {lengths.span.mem_len}",
        what=f"the traced segment (batch {EXAMPLE_BATCH}, {config.n_layer} layers)",
        lower="tgt_len or mem_len",
        fields=("tgt_len", "mem_len"),
    )


def export_model(
    model: TransformerXL,
    out: str | Path,
    *,
    tgt_len: int,
    mem_len: int | None = None,
    span: Span | None = None,
    opset: int = 18,
) -> Path:
    """Write ``model`` (relative attention, with memory) as ONNX to ``out``: segments of ``tgt_len`` tokens
    after a memory of ``span.mem_len`` positions, with its clamp and same-length setting (or give ``mem_len``
    alone: the model's clamp and same-length setting), traced with :data:`EXAMPLE_BATCH` rows (SizeError
    when they cannot fit). The file is written under a temporary name next to ``out`` and renamed into place,
    so a failed export leaves nothing and never half replaces an older file."""
    cfg = model.config
    span = _span(model, mem_len, span)
    mem_len, batch_size = span.mem_len, EXAMPLE_BATCH
    if cfg.attention != "relative":
        raise ExportError(
            "only the Transformer-XL (relative attention) exports with memory; the vanilla baseline has none"
        )
    if mem_len <= 0 or tgt_len <= 0:
        raise ExportError(
            f"mem_len and tgt_len must be positive, got {mem_len} and {tgt_len}",
            fields=("mem_len", "tgt_len"),
        )
    if any(p.dtype != torch.float32 for p in model.parameters()):
        raise ExportError("export a float32 model (this one has other parameter types)")
    check_export_fits(cfg, EvalLengths(tgt_len, span))  # the buffers of the example below
    step = SegmentStep(model, span=span)
    tokens = torch.randint(0, cfg.vocab_size, (batch_size, tgt_len))
    memory = Memory.zeros(cfg, batch_size, mem_len, dtype=torch.float32)
    inputs, outputs = _names(cfg.n_layer)
    batch = torch.export.Dim("batch", min=1, max=4096)
    dynamic = {
        "tokens": {0: batch},
        "reach": {0: batch},
        "memory": tuple({0: batch} for _ in range(cfg.n_layer)),
    }
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.{os.getpid()}.tmp.onnx")
    quiet = _exporter_quiet()
    with eval_mode(model), torch.no_grad(), warnings.catch_warnings(), redirect_stdout(io.StringIO()), quiet:
        warnings.simplefilter("ignore")
        try:
            torch.onnx.export(
                step,
                (tokens, memory.reach, *memory.states),
                str(partial),
                input_names=inputs,
                output_names=outputs,
                dynamic_shapes=dynamic,
                opset_version=opset,
                dynamo=True,
                external_data=False,
            )
        except BaseException as exc:
            partial.unlink(missing_ok=True)
            if isinstance(exc, ImportError):
                raise ExportError(
                    f"ONNX export needs onnx and onnxscript: pip install 'transformer-xl[export]' ({exc})"
                ) from None
            failed = _os_error_in(exc)
            if failed is not None:  # the exporter's failed write (a full disk), named by the file it was for
                raise OSError(failed.errno, failed.strerror or str(failed), str(out)) from None
            raise
    os.replace(partial, out)
    return out


@contextmanager
def _exporter_quiet() -> Iterator[None]:
    """PyTorch's ONNX exporter logs what it skips on this machine (operators of packages not installed,
    such as torchvision's) as warnings: none of them concern a txl model. Only its errors are shown."""
    logger = logging.getLogger("torch.onnx")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _os_error_in(exc: BaseException) -> OSError | None:
    """The operating-system error (one with an errno) that ``exc`` is, or was raised from, if any."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno is not None:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def onnxruntime_session(path: str | Path) -> Any:
    """An ``onnxruntime`` CPU session of the file (ExportError when onnxruntime is not installed)."""
    try:
        import onnxruntime
    except ImportError:
        raise ExportError(
            "checking the export needs onnxruntime: pip install 'transformer-xl[export]' (or pass check=False)",
            fields=("check=False",),
        ) from None
    return onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def check_onnx(
    model: TransformerXL,
    path: str | Path,
    *,
    tgt_len: int,
    mem_len: int | None = None,
    span: Span | None = None,
    check: OnnxCheck = OnnxCheck(),
) -> float:
    """Run ``check.segments`` segments with memory carried through the exported file (onnxruntime), from a
    zero memory of reach 0, and through ``model`` as ``txl eval`` reads them, from an empty memory, on random
    tokens; returns the largest difference (log-probabilities and the memory's positions in reach; the
    reaches must be equal) and raises ExportError when it exceeds ``check.atol``."""
    cfg = model.config
    span = _span(model, mem_len, span)
    mem_len = span.mem_len
    segments, batch_size, atol = check.segments, check.batch_size, check.atol
    session = onnxruntime_session(path)
    generator = torch.Generator().manual_seed(check.seed)
    tokens = torch.randint(0, cfg.vocab_size, (batch_size, segments * tgt_len + 1), generator=generator)
    memory = Memory.zeros(cfg, batch_size, mem_len, dtype=torch.float32)
    assert memory.reach is not None  # a zero memory has reach 0
    feeds = [memory.reach.numpy(), *(m.numpy() for m in memory.states)]  # float32 states, as exported
    inputs, _ = _names(cfg.n_layer)
    worst = 0.0
    # the segments as txl eval reads them (the same loop), from the empty memory that reach 0 stands for
    expected = segment_losses(
        model, tokens, EvalSettings(tgt_len=tgt_len, span=span, batch_size=batch_size, log_probs=True)
    )
    for s, segment in enumerate(expected):
        seg = tokens[:, s * tgt_len : (s + 1) * tgt_len]
        assert segment.log_probs is not None and segment.memory is not None  # asked for, with memory
        got = session.run(None, dict(zip(inputs, [seg.numpy(), *feeds], strict=True)))
        worst = max(worst, float(np.abs(got[0] - segment.log_probs.numpy()).max()))
        length = (
            segment.memory.length
        )  # txl's memory grows to M; the graph's holds M, the last `length` reached
        if not (got[1] == min(length, mem_len)).all():
            raise ExportError(
                f"{path}: the graph's memory reach {got[1].tolist()} differs from txl's {length}"
            )
        for mine, theirs in zip(got[2:], segment.memory.states, strict=True):
            worst = max(worst, float(np.abs(mine[:, mem_len - length :] - theirs.numpy()).max()))
        feeds = got[1:]
    if not worst <= atol:
        raise ExportError(
            f"{path}: onnxruntime differs from txl by {worst:.3g} (more than {atol:g}) over "
            f"{segments} segments"
        )
    return worst


def _span(model: TransformerXL, mem_len: int | None, span: Span | None) -> Span:
    """The span to export with: ``span``, or ``mem_len`` with the model's clamp and same-length setting."""
    if span is not None and mem_len is None:
        return span
    if mem_len is None or span is not None:
        raise ExportError("give the memory length (mem_len) or the whole span (span), one of them")
    cfg = model.config
    if mem_len <= 0:  # export_model says what is wrong
        return Span(mem_len)
    return Span(mem_len=mem_len, clamp_len=cfg.clamp_len, same_length=cfg.same_length)


def export_onnx(
    run: LoadedRun, out: Path, settings: ExportSettings | None = None, *, progress: bool = False
) -> dict[str, Any]:
    """``txl export``: the model of a loaded run (:func:`txl.runs.load_run`) as ONNX in ``out``, checked with
    onnxruntime over 3 segments against txl unless ``settings.check`` is off. Lengths without a memory, or
    whose traced buffers cannot fit, are refused before tracing (:func:`check_export_fits`). ``progress``: say
    each stage on stderr (tracing and writing, checking) as it starts. Returns what was written (a JSON-able
    record)."""
    s = settings or ExportSettings()
    started = time.perf_counter()

    def say(message: str) -> None:
        if progress:
            print(
                f"txl export: {message} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True
            )

    config = run.config
    lengths = eval_lengths(config) if s.lengths is None else s.lengths
    tgt_len, span = lengths.tgt_len, lengths.span
    check_export_fits(config.model, lengths)
    say(
        f"tracing the model (segments of {tgt_len} after a memory of {span.mem_len}) and writing {out}; "
        "tracing takes a while"
    )
    path = export_model(run.model, out, tgt_len=lengths.tgt_len, span=lengths.span, opset=s.opset)
    record: dict[str, Any] = {
        "out": str(path),
        "format": "onnx",
        "tgt_len": tgt_len,
        "mem_len": span.mem_len,
        "clamp_len": span.clamp_len,
        "same_length": span.same_length,
        "n_layer": config.model.n_layer,
        "d_model": config.model.d_model,
        "vocab_size": config.model.vocab_size,
        "opset": s.opset,
    }
    if s.check:
        say(f"checking {path} with onnxruntime against txl over 3 segments")
        record["max_abs_diff"] = check_onnx(run.model, path, tgt_len=lengths.tgt_len, span=lengths.span)
    say(f"wrote {path}")
    return record
