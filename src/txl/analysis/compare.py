"""``txl compare``: the paper's headline comparison on one config. The Transformer-XL and the vanilla baseline
train as two run folders, ``OUT/xl`` and ``OUT/vanilla``, and are compared side by side.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ..config import (
    ConfigError,
    GenerateConfig,
    RunConfig,
    eval_lengths,
    eval_span,
    positive_int,
    vanilla_baseline,
)
from ..data import CorpusError, Vocab
from ..data.vocab import start_token
from ..errors import TxlError
from ..evaluation import bits_name, metrics_from_loss
from ..files import atomic_write_text
from ..inference import DecodeSettings, SamplingParams, generate
from ..runs import LoadedRun, load_run, read_metrics
from ..train.trainer import Interrupted
from .common import split_tokens, train_or_reuse
from .context import WindowSettings, sliding_losses
from .report import SIGN_CONVENTION, format_table, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "MODELS",
    "Sample",
    "CompareResult",
    "CompareSettings",
    "compare",
    "default_prompts",
    "default_stride",
    "samples_markdown",
    "sliding_windows",
]

MODELS = ("xl", "vanilla", "vanilla_sliding")
"""The rows of the comparison (keys of results.json)."""
_LABELS = {"xl": "Transformer-XL", "vanilla": "vanilla", "vanilla_sliding": "vanilla, sliding window"}


@dataclass(frozen=True)
class CompareSettings:
    """How :func:`compare` names, evaluates and samples the two runs (the defaults are ``txl compare``'s)."""

    config_name: str = ""
    """The config's name, as reported (a preset or a TOML file)."""
    overrides: tuple[str, ...] = ()
    """The ``SECTION.FIELD=VALUE`` overrides applied to the config, as reported."""
    stride: int | None = None
    """Predictions per window of the vanilla sliding evaluation, at most the training segment (None:
    :func:`default_stride`; 1 is the paper's protocol)."""
    prompts: tuple[str, ...] | None = None
    """Texts to continue in ``samples.md`` (None: three passages of the test split, else validation)."""
    sample_tokens: int = 200
    """Tokens each model writes per prompt (0: no samples)."""
    seed: int = 0
    """Sampling seed, the same for both models."""
    overwrite: bool = False
    """Train both runs again from scratch instead of continuing or reusing them."""
    progress: bool = True
    """Show progress bars."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "overrides", tuple(self.overrides))
        if self.prompts is not None:
            object.__setattr__(self, "prompts", tuple(self.prompts))
        if self.stride is not None:
            positive_int(self.stride, "stride")


@dataclass(frozen=True)
class Sample:
    """One prompt and what each model wrote after it."""

    prompt: str
    xl: str
    vanilla: str


@dataclass(frozen=True)
class CompareResult:
    """Everything ``txl compare`` reports (``as_dict`` is results.json)."""

    config: str
    overrides: tuple[str, ...]
    level: str
    stride: int
    window: int
    models: dict[str, dict[str, Any]]
    relative: dict[str, dict[str, float]]
    throughput: dict[str, float | None]
    actions: dict[str, str]
    samples: tuple[Sample, ...] = ()
    curves: dict[str, list[dict[str, Any]]] = field(default_factory=dict, repr=False)
    corpus: str = ""
    """The corpus both runs read (``data.corpus``), which the title names beside the config."""

    @property
    def title(self) -> str:
        """``CONFIG on CORPUS`` (a path as its file name), as the table, the figures and samples.md say."""
        return _compare_title(self.config, self.corpus)

    def as_dict(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "corpus": self.corpus,
            "overrides": list(self.overrides),
            "level": self.level,
            "stride": self.stride,
            "window": self.window,
            **self.models,
            "relative": self.relative,
            "throughput": self.throughput,
            "runs": self.actions,
            "samples": "samples.md" if self.samples else None,
        }

    def _metrics(self) -> list[str]:
        units = ("loss", "ppl", bits_name(self.level)) if bits_name(self.level) else ("loss", "ppl")
        return [f"{split}_{unit}" for split in ("val", "test") for unit in units]

    def table(self) -> str:
        metrics = [m for m in self._metrics() if any(self.models[k].get(m) is not None for k in MODELS)]
        rows = [
            [_LABELS[k], *(self.models[k].get(m) for m in metrics), self.models[k].get("train_tokens_per_s")]
            for k in MODELS
        ]
        for base in ("vanilla", "vanilla_sliding"):
            rows.append(
                [f"XL vs {_LABELS[base]}", *(_percent(self.relative[base].get(m)) for m in metrics), ""]
            )
        note = (
            f"{self.title}: every token of each split predicted once; vanilla on disjoint segments of "
            f"{self.window}, vanilla sliding: windows of {self.window}, stride {self.stride}\n"
            f"XL vs rows: (XL - vanilla) / vanilla; {SIGN_CONVENTION}"
        )
        throughput = (
            f"training throughput, XL / vanilla: {self.throughput['ratio_xl_over_vanilla']:.2f}"
            if self.throughput.get("ratio_xl_over_vanilla")
            else ""
        )
        return "\n".join([note, format_table(["model", *metrics, "train tok/s"], rows), throughput])

    def figures(self) -> Mapping[str, Callable[[], Figure]]:
        return {"valid_curves": self._plot_valid, "train_curves": self._plot_train}

    def _plot_valid(self) -> Figure:
        fig = new_figure()
        ax = fig.subplots()
        for name in ("xl", "vanilla"):
            records = [r for r in self.curves.get(name, []) if r.get("split") == "valid"]
            periodic = [r for r in records if not r.get("final")]
            line = ax.plot(
                [r["step"] for r in periodic],
                [r["loss"] for r in periodic],
                marker=".",
                label=f"{_LABELS[name]} (periodic)",
            )[0]
            for r in records:
                if r.get("final"):
                    ax.plot(
                        [r["step"]],
                        [r["loss"]],
                        marker="*",
                        markersize=12,
                        color=line.get_color(),
                        linestyle="none",
                        label=f"{_LABELS[name]}, final: {r['loss']:.3f}",
                    )
        sliding = self.models["vanilla_sliding"].get("val_loss")
        if sliding is not None:
            ax.axhline(
                sliding,
                color="gray",
                linestyle="--",
                label=f"{_LABELS['vanilla_sliding']}, final: {sliding:.3f}",
            )
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss (nats per token)")
        ax.set_title(f"Validation loss: {self.title}")
        ax.legend()
        ax.grid(alpha=0.3)
        return fig

    def _plot_train(self) -> Figure:
        fig = new_figure()
        ax = fig.subplots()
        for name in ("xl", "vanilla"):
            records = [r for r in self.curves.get(name, []) if r.get("split") == "train" and "tokens" in r]
            ax.plot(
                [r["tokens"] for r in records], [r["loss"] for r in records], label=_LABELS[name], alpha=0.8
            )
        ax.set_xlabel("training tokens seen")
        ax.set_ylabel("training loss (nats per token)")
        ax.set_title(f"Training loss: {self.title}")
        ax.legend()
        ax.grid(alpha=0.3)
        return fig


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:+.1f}%"


def _row(summary: dict[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    return {k: summary.get(k) for k in keys}


def default_stride(window: int) -> int:
    """The sliding window's default stride: a quarter of the window. Each window then predicts its last
    quarter, each prediction from at least 3/4 of a window of context (stride 1, the paper's protocol, gives
    every prediction a whole window, at 4 / window of the speed: about 16 times slower for a window of 64)."""
    return max(1, window // 4)


def sliding_windows(n_tokens: int, settings: WindowSettings) -> int:
    """How many windows :func:`~txl.analysis.context.sliding_losses` reads with ``settings`` to predict every
    target of ``n_tokens`` tokens: one for the first ``window`` targets, then one per ``stride`` targets."""
    head = min(settings.window, n_tokens - 1)
    return (1 if head > 0 else 0) + -(-max(n_tokens - 1 - head, 0) // settings.stride)


def _estimate_sliding(
    run: LoadedRun, splits: dict[str, np.ndarray], settings: WindowSettings
) -> tuple[int, float]:
    """(windows, seconds): the windows the sliding evaluation of ``splits`` reads and the time they take
    here, timed on 64 windows of the first split."""
    windows = sum(sliding_windows(len(t), settings) for t in splits.values())
    first = next(iter(splits.values()), np.zeros(0, dtype=np.int64))
    piece = first[: settings.window + 1 + 63 * settings.stride]
    if len(piece) < 2 or not windows:
        return windows, 0.0
    start = time.perf_counter()
    sliding_losses(run.model, piece, replace(settings, batch_size=64, progress=False))
    seconds = time.perf_counter() - start
    return windows, seconds * windows / sliding_windows(len(piece), settings)


def _sliding_row(
    run: LoadedRun, splits: dict[str, np.ndarray], settings: WindowSettings, level: str
) -> dict[str, Any]:
    row: dict[str, Any] = {"window": settings.window, "stride": settings.stride}
    for split, tokens in splits.items():
        losses = sliding_losses(run.model, tokens, replace(settings, desc=f"vanilla sliding {split}"))
        loss = float(losses.mean())
        prefix = "val" if split == "valid" else split
        row.update({f"{prefix}_loss": loss, f"{prefix}_tokens": len(losses)})
        row.update({f"{prefix}_{k}": v for k, v in metrics_from_loss(loss, kind=level).items()})
    return row


def default_prompts(
    tokens: np.ndarray, vocab: Vocab, *, count: int = 3, length: int = 32
) -> list[np.ndarray]:
    """``count`` prompts of ``length`` tokens from evenly spaced places of ``tokens``, each starting where a
    text starts (after the vocabulary's :func:`~txl.data.vocab.start_token`) when one is near."""
    n = len(tokens)
    if n < length + 1:
        return [np.asarray(tokens[: max(1, n - 1)], dtype=np.int64)]
    try:
        boundary: int | None = start_token(vocab)
    except TxlError:
        boundary = None
    prompts = []
    for i in range(count):
        start = (i + 1) * (n - length) // (count + 1)
        if boundary is not None:
            ahead = np.flatnonzero(np.asarray(tokens[start : start + 400]) == boundary)
            if len(ahead) and start + ahead[0] + 1 + length <= n:
                start += int(ahead[0]) + 1
        prompts.append(np.asarray(tokens[start : start + length], dtype=np.int64))
    return prompts


def _samples(
    xl: LoadedRun, vanilla: LoadedRun, prompts: Sequence[np.ndarray], *, new_tokens: int, seed: int
) -> tuple[Sample, ...]:
    params = SamplingParams.from_config(xl.config.generate, max_new_tokens=new_tokens)
    xl_settings = DecodeSettings(span=eval_span(xl.config))
    vanilla_settings = DecodeSettings(context=vanilla.config.train.tgt_len)
    samples = []
    for i, ids in enumerate(prompts):
        prompt = torch.as_tensor(ids, dtype=torch.long)
        mine = replace(params, seed=seed + i)
        xl_new = generate(xl.model, prompt, mine, settings=xl_settings).new_tokens[0]
        vanilla_new = generate(vanilla.model, prompt, mine, settings=vanilla_settings).new_tokens[0]
        samples.append(
            Sample(
                prompt=xl.vocab.decode(ids),
                xl=xl.vocab.decode(xl_new.numpy()),
                vanilla=xl.vocab.decode(vanilla_new.numpy()),
            )
        )
    return tuple(samples)


def _compare_title(config_name: str, corpus: str) -> str:
    """``CONFIG on CORPUS``: a preset run on your own text is named by both. A corpus given as a path shows
    its file or folder name; a corpus name (``books``, ``hf:NAME``, ``hf-disk:PATH``) shows as written."""
    if not corpus:
        return config_name
    if "/" in corpus and not corpus.startswith(("hf:", "hf-disk:")):
        corpus = Path(corpus).name or corpus
    return f"{config_name} on {corpus}"


def _sampling_words(gen: GenerateConfig) -> str:
    """The sampling settings in words, naming only the filters in use: ``temperature 0.8, top_k 40``,
    ``greedy``, ``temperature 1.0, no top-k or top-p filter``."""
    if gen.temperature == 0:
        return "greedy"
    filters = [f"top_k {gen.top_k}"] if gen.top_k is not None else []
    filters += [f"top_p {gen.top_p}"] if gen.top_p is not None else []
    return ", ".join([f"temperature {gen.temperature}", *(filters or ["no top-k or top-p filter"])])


def samples_markdown(samples: Sequence[Sample], *, title: str, note: str) -> str:
    """The samples as Markdown: each prompt, then a two-column table (Transformer-XL | vanilla)."""

    def cell(text: str) -> str:
        return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "<br>")

    parts = [f"# {title}", "", note, ""]
    for i, s in enumerate(samples, 1):
        parts += [
            f"## Prompt {i}",
            "",
            "```text",
            s.prompt,
            "```",
            "",
            "| Transformer-XL | vanilla |",
            "| --- | --- |",
            f"| {cell(s.xl)} | {cell(s.vanilla)} |",
            "",
        ]
    return "\n".join(parts)


def compare(config: RunConfig, out: Path, settings: CompareSettings = CompareSettings()) -> CompareResult:
    """Train (or continue, or reuse) both runs under ``out`` and compare them. ``config`` is the
    Transformer-XL's; the vanilla baseline (:func:`~txl.config.vanilla_baseline`: same sizes, data, steps
    and seed) is derived from it. Running again continues an unfinished run and reuses a finished one.

    Reported side by side: validation and test loss, perplexity (and bits per character for character and
    byte corpora), the relative difference of the XL to each baseline, and each model's training
    throughput. Three rows, each over every token of the split, with the final weights of each run:

    - ``xl``: segments with memory, the run's evaluation lengths (its summary);
    - ``vanilla``: disjoint segments of its training length, as it was trained (its summary);
    - ``vanilla_sliding``: the paper's baseline protocol, every prediction from a window of the T training
      tokens before it (:func:`~txl.analysis.context.sliding_losses`; with stride s each window predicts
      its last s tokens, each seeing T - s + 1 to T tokens; s = 1 is the paper's).

    Also written: ``out/samples.md`` (``settings.sample_tokens`` tokens from each model after the same
    prompts, sampled with the same seed); the result carries both runs' curves for its figures."""
    if config.model.attention != "relative":
        raise ConfigError(
            'compare: the config must describe the Transformer-XL (model.attention = "relative"); '
            "the vanilla baseline is derived from it"
        )
    window = config.train.tgt_len
    stride = default_stride(window) if settings.stride is None else settings.stride
    if not 1 <= stride <= window:
        raise ConfigError(
            f"compare: stride must be in 1..{window} (the training segment), got {stride}", fields=("stride",)
        )
    out = Path(out)
    summaries, actions = _train_both(config, out, settings)
    xl, vanilla = load_run(out / "xl", checkpoint="latest"), load_run(out / "vanilla", checkpoint="latest")
    level = xl.vocab.kind
    splits = {
        s: split_tokens(vanilla.config, vanilla.vocab, s)
        for s in ("valid", "test")
        if f"{'val' if s == 'valid' else s}_loss" in summaries["vanilla"]
    }
    sliding = WindowSettings(
        window, stride=stride, batch_size=max(1, 16384 // window), progress=settings.progress
    )
    windows, seconds = _estimate_sliding(vanilla, splits, sliding)
    print(
        f"vanilla sliding evaluation: {windows:,} windows of {window} tokens (stride {stride}) over "
        f"{' and '.join(splits) or 'no split'}: about {_duration(seconds)} here; --stride sets it (larger is "
        "faster, each prediction then seeing less context)",
        file=sys.stderr,
        flush=True,
    )
    units = ("loss", "ppl", "tokens", "bits_per_token", *filter(None, [bits_name(level)]))
    keys = [f"{p}_{u}" for p in ("val", "test") for u in units]
    extra = ("steps", "params", "train_tokens_per_s", "elapsed_s")
    models = {
        "xl": {**_row(summaries["xl"], keys + list(extra)), "eval": _lengths(xl.config)},
        "vanilla": {**_row(summaries["vanilla"], keys + list(extra)), "eval": _lengths(vanilla.config)},
        "vanilla_sliding": {**dict.fromkeys(keys), **_sliding_row(vanilla, splits, sliding, level)},
    }
    relative = {
        base: {
            k: (models["xl"][k] - models[base][k]) / models[base][k]
            for k in keys
            if not k.endswith("_tokens") and models["xl"].get(k) is not None and models[base].get(k)
        }
        for base in ("vanilla", "vanilla_sliding")
    }
    return CompareResult(
        config=settings.config_name,
        overrides=settings.overrides,
        level=level,
        stride=sliding.stride,
        window=sliding.window,
        models=models,
        relative=relative,
        throughput=_throughput(summaries),
        actions=actions,
        samples=_write_samples(xl, vanilla, out, settings),
        curves={"xl": read_metrics(out / "xl"), "vanilla": read_metrics(out / "vanilla")},
        corpus=config.data.corpus,
    )


def _train_both(
    config: RunConfig, out: Path, settings: CompareSettings
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Train, continue or reuse ``out/xl`` and ``out/vanilla``: (their summaries, what was done), by name."""
    summaries, actions = {}, {}
    for name, cfg in (("xl", config), ("vanilla", vanilla_baseline(config))):
        try:
            summaries[name], actions[name] = train_or_reuse(
                cfg, out / name, overwrite=settings.overwrite, progress=settings.progress
            )
        except Interrupted as exc:
            raise Interrupted(
                f"{name} interrupted at a checkpoint; run the same 'txl compare' command again to continue",
                signum=exc.signum,
            ) from None
    return summaries, actions


def _throughput(summaries: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """Training tokens per second of each run, and their ratio."""
    xl_tps = summaries["xl"].get("train_tokens_per_s")
    vanilla_tps = summaries["vanilla"].get("train_tokens_per_s")
    return {
        "xl_tokens_per_s": xl_tps,
        "vanilla_tokens_per_s": vanilla_tps,
        "ratio_xl_over_vanilla": xl_tps / vanilla_tps if xl_tps and vanilla_tps else None,
    }


def _write_samples(
    xl: LoadedRun, vanilla: LoadedRun, out: Path, settings: CompareSettings
) -> tuple[Sample, ...]:
    """Sample both models after the same prompts and write ``out/samples.md`` (none when
    ``settings.sample_tokens`` is 0)."""
    if settings.sample_tokens <= 0:
        return ()
    prompts = _prompt_ids(xl, settings.prompts)
    samples = _samples(xl, vanilla, prompts, new_tokens=settings.sample_tokens, seed=settings.seed)
    note = (
        f"{settings.sample_tokens} tokens from each model after the same prompt, the same seed and settings "
        f"({_sampling_words(xl.config.generate)}); the Transformer-XL with "
        f"its memory ({eval_span(xl.config).mem_len}), the vanilla model recomputing a window of "
        f"{vanilla.config.train.tgt_len}."
    )
    out.mkdir(parents=True, exist_ok=True)
    title = _compare_title(settings.config_name or "compare", xl.config.data.corpus)
    markdown = samples_markdown(samples, title=f"Samples: {title}", note=note)
    atomic_write_text(out / "samples.md", markdown + "\n")
    return samples


def _lengths(config: RunConfig) -> dict[str, Any]:
    lengths = eval_lengths(config)
    span = lengths.span
    return {
        "tgt_len": lengths.tgt_len,
        "mem_len": span.mem_len,
        "clamp_len": span.clamp_len,
        "same_length": span.same_length,
    }


def _prompt_ids(run: LoadedRun, prompts: Sequence[str] | None) -> list[np.ndarray]:
    if prompts:
        ids = []
        for text in prompts:
            try:
                encoded = np.asarray(run.vocab.encode(text, strict=True), dtype=np.int64)
            except ValueError as exc:
                raise ConfigError(f"prompts {text!r}: {exc}", fields=("prompts",)) from None
            if not len(encoded):
                raise ConfigError(
                    f"prompts {text!r}: no tokens; give some text to continue", fields=("prompts",)
                )
            ids.append(encoded)
        return ids
    try:
        tokens = split_tokens(run.config, run.vocab, "test")
    except CorpusError:
        tokens = split_tokens(run.config, run.vocab, "valid")
    return default_prompts(tokens, run.vocab, length=100 if run.vocab.kind in ("char", "byte") else 32)
