"""Typed, frozen configuration (model, data, training, evaluation, generation), validated with messages that
name the field, and the run-level rules every command shares: evaluation lengths, memory, cache slots."""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
import warnings
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from .errors import TxlError, TxlWarning

__all__ = [
    "TransformerXLConfig",
    "StackConfig",
    "Span",
    "SameLengthOff",
    "span_of",
    "architecture_fields",
    "eval_span",
    "EvalLengths",
    "eval_lengths",
    "has_memory",
    "positive_int",
    "cache_slots",
    "vanilla_baseline",
    "first_set",
    "DataConfig",
    "TrainConfig",
    "EvalConfig",
    "GenerateConfig",
    "RunConfig",
    "ConfigError",
    "load_config",
    "read_preset",
    "preset_names",
    "apply_overrides",
    "config_to_dict",
    "config_from_dict",
    "check_field",
    "check_positive_int",
    "check_non_negative_int",
    "check_one_of",
    "coerce_value",
    "build_section",
    "parse_value",
]


class ConfigError(TxlError):
    """An invalid configuration value, unknown field or unknown preset."""


def check_field(cond: bool, name: str, message: str) -> None:
    """Refuse (:class:`ConfigError`, ``name: message``) a settings field unless ``cond``: the one way a
    settings value names the field it refuses."""
    if not cond:
        raise ConfigError(f"{name}: {message}")


def check_positive_int(obj: Any, name: str) -> None:
    """Refuse the field ``name`` of the settings value ``obj`` unless it is a positive integer."""
    positive_int(getattr(obj, name), name)


def check_non_negative_int(obj: Any, name: str) -> None:
    """Refuse the field ``name`` of the settings value ``obj`` unless it is an integer >= 0."""
    value = getattr(obj, name)
    check_field(
        isinstance(value, int) and not isinstance(value, bool) and value >= 0,
        name,
        f"must be a non-negative integer, got {value!r}",
    )


def _probability(obj: Any, name: str) -> None:
    value = getattr(obj, name)
    check_field(
        isinstance(value, (int, float)) and 0.0 <= value < 1.0, name, f"must be in [0, 1), got {value!r}"
    )


_SAME_LENGTH_NEEDS_MEMORY = (
    "needs mem_len > 0 (same_length=true with mem_len=0 would leave every query no key to attend to)"
)
"""The one same-length rule, for every config that has both fields (Span, the model, the [eval] section)."""


def check_one_of(obj: Any, name: str, choices: tuple[str, ...]) -> None:
    """Refuse the field ``name`` of the settings value ``obj`` unless it is one of ``choices``."""
    value = getattr(obj, name)
    check_field(value in choices, name, f"must be one of {', '.join(map(repr, choices))}, got {value!r}")


# The allowed values of each choice, written once (``typing.get_args`` gives them to validation and the CLI).
Attention = Literal["relative", "absolute"]
VocabKind = Literal["word", "char", "byte", "bpe"]
Tokenizer = Literal["whitespace", "regex"]
Schedule = Literal["cosine", "linear", "inverse_sqrt", "constant"]
Precision = Literal["fp32", "bf16"]
Documents = Literal["continue", "reset"]

_ARCHITECTURE = types.MappingProxyType({"architecture": True})
"""Field metadata of the model fields that define the weights' shapes and meaning (checked when loading)."""


# ---------------------------------------------------------------------------------------------------------
# Evaluation-time lengths
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """How far a Transformer-XL looks back: the evaluation-time lengths, which are not architecture.

    The same weights run with any span; training uses the model config's (:attr:`TransformerXLConfig.span`),
    evaluation and generation may use a longer memory, a clamp or same-length attention. Pass it to
    ``TransformerXL.forward(..., span=...)``, :func:`txl.evaluation.evaluate` and :func:`txl.inference.generate`.
    """

    mem_len: int
    """Positions of hidden states kept per layer as memory for the next segment (M); 0 disables memory."""
    clamp_len: int | None = None
    """Relative distances larger than this use the embedding of clamp_len; None means no clamp."""
    same_length: bool = False
    """Every query attends to the same number of keys (the paper's evaluation setting); needs mem_len > 0."""

    def __post_init__(self) -> None:
        check_non_negative_int(self, "mem_len")
        if self.clamp_len is not None:
            check_positive_int(self, "clamp_len")
        check_field(
            isinstance(self.same_length, bool),
            "same_length",
            f"must be true or false, got {self.same_length!r}",
        )
        check_field(not (self.same_length and self.mem_len == 0), "same_length", _SAME_LENGTH_NEEDS_MEMORY)


class SameLengthOff(TxlWarning):
    """Same-length attention was turned off because the span has no memory (it would mask every key).
    ``field`` names the setting that gave the memory length 0 (as data: a command names its own flag)."""

    def __init__(self, field: str = "mem_len") -> None:
        self.field = field
        super().__init__(self.named(field))

    @staticmethod
    def named(name: str) -> str:
        """The message, with the setting called ``name`` (a field, or a command's flag)."""
        return f"{name} 0: same_length turned off (it needs a memory)"


def span_of(
    *, mem_len: int, clamp_len: int | None, same_length: bool, same_length_asked: bool = False
) -> Span:
    """The span of these lengths. Without memory, same-length attention would leave a query no key to attend
    to: when it comes with the settings (it was not asked for with ``mem_len``) it is turned off, with a
    :class:`SameLengthOff` warning; asked for with ``same_length_asked``, it is a ConfigError."""
    if mem_len == 0 and same_length and not same_length_asked:
        warnings.warn(SameLengthOff("mem_len"), stacklevel=3)
        same_length = False
    return Span(mem_len=mem_len, clamp_len=clamp_len, same_length=same_length)


# ---------------------------------------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TransformerXLConfig:
    """Sizes and variants of a Transformer-XL language model (or its vanilla baseline).

    The defaults make a tiny CPU model. Names follow the paper and the authors' code.
    """

    vocab_size: int = field(default=256, metadata=_ARCHITECTURE)
    """Number of tokens in the vocabulary (V)."""
    n_layer: int = field(default=2, metadata=_ARCHITECTURE)
    """Number of decoder layers (N)."""
    n_head: int = field(default=2, metadata=_ARCHITECTURE)
    """Attention heads per layer (H)."""
    d_head: int = field(default=16, metadata=_ARCHITECTURE)
    """Size of each attention head (Dh)."""
    d_model: int = field(default=32, metadata=_ARCHITECTURE)
    """Hidden size of the residual stream (D); even, since the sinusoid interleaves sin and cos halves."""
    d_inner: int = field(default=64, metadata=_ARCHITECTURE)
    """Hidden size of the position-wise feed-forward network."""
    d_embed: int | None = field(default=None, metadata=_ARCHITECTURE)
    """Embedding size before projection to d_model; None means d_model (no projection)."""
    dropout: float = 0.0
    """Dropout on embeddings, positions, residual branches and the final hidden state."""
    dropatt: float = 0.0
    """Dropout on attention probabilities."""
    attention: Attention = field(default="relative", metadata=_ARCHITECTURE)
    """"relative": Transformer-XL attention with memory. "absolute": the vanilla baseline of the paper
    (absolute sinusoidal positions added to the input, standard attention, no memory; mem_len is unused)."""
    mem_len: int = 32
    """Positions of hidden states kept per layer as memory for the next segment (M); 0 disables memory."""
    same_length: bool = False
    """Every query attends to the same number of keys (the paper's evaluation setting)."""
    clamp_len: int | None = None
    """Relative distances larger than this use the embedding of clamp_len; None means no clamp."""
    pre_norm: bool = field(default=False, metadata=_ARCHITECTURE)
    """LayerNorm before each sub-layer (pre-norm) instead of after the residual sum (post-norm, the paper)."""
    final_norm: bool = field(default=False, metadata=_ARCHITECTURE)
    """A LayerNorm after the last layer (useful with pre_norm; the authors' code has none)."""
    tie_weights: bool = field(default=True, metadata=_ARCHITECTURE)
    """Share the input embedding and output softmax weights."""
    share_rel_bias: bool = field(default=True, metadata=_ARCHITECTURE)
    """One pair of global biases u, v for all layers (the authors' PyTorch code), or one pair per layer."""
    cutoffs: tuple[int, ...] = field(default=(), metadata=_ARCHITECTURE)
    """Adaptive input/softmax cluster boundaries (token ids); empty means one ordinary softmax."""
    div_val: int = field(default=1, metadata=_ARCHITECTURE)
    """Each adaptive cluster's embedding size is d_embed // div_val**i."""
    tie_projs: bool = field(default=True, metadata=_ARCHITECTURE)
    """Share the tail clusters' output projections with the input embedding projections (adaptive only)."""
    init_std: float = 0.02
    """Standard deviation of the normal initialisation of weights, embeddings and the biases u, v."""
    proj_init_std: float = 0.01
    """Standard deviation of the normal initialisation of the adaptive projections."""

    def __post_init__(self) -> None:
        if isinstance(self.cutoffs, list):
            object.__setattr__(self, "cutoffs", tuple(self.cutoffs))
        for name in ("vocab_size", "n_layer", "n_head", "d_head", "d_model", "d_inner", "div_val"):
            check_positive_int(self, name)
        check_field(
            self.d_model % 2 == 0, "d_model", f"must be even for the sinusoidal positions, got {self.d_model}"
        )
        if self.d_embed is not None:
            check_positive_int(self, "d_embed")
        _probability(self, "dropout")
        _probability(self, "dropatt")
        check_one_of(self, "attention", typing.get_args(Attention))
        check_non_negative_int(self, "mem_len")
        if self.clamp_len is not None:
            check_positive_int(self, "clamp_len")
        for name in ("same_length", "pre_norm", "final_norm", "tie_weights", "share_rel_bias", "tie_projs"):
            check_field(
                isinstance(getattr(self, name), bool),
                name,
                f"must be true or false, got {getattr(self, name)!r}",
            )
        if self.attention == "relative":  # the baseline ignores mem_len and same_length
            check_field(
                not (self.same_length and self.mem_len == 0), "same_length", _SAME_LENGTH_NEEDS_MEMORY
            )
        cut = self.cutoffs
        check_field(
            all(isinstance(c, int) and not isinstance(c, bool) for c in cut), "cutoffs", "must be integers"
        )
        check_field(
            all(a < b for a, b in zip(cut, cut[1:], strict=False)),
            "cutoffs",
            f"must increase strictly, got {cut}",
        )
        check_field(
            all(0 < c < self.vocab_size for c in cut),
            "cutoffs",
            f"must lie strictly between 0 and vocab_size={self.vocab_size}, got {cut}",
        )
        if self.div_val > 1:
            check_field(
                bool(cut),
                "div_val",
                "needs cutoffs (div_val > 1 shrinks the embeddings of adaptive clusters)",
            )
            smallest = self.embed_dim // self.div_val ** len(cut)
            check_field(
                smallest > 0, "div_val", f"d_embed // div_val**{len(cut)} must be positive, got {smallest}"
            )
        for name in ("init_std", "proj_init_std"):
            value = getattr(self, name)
            check_field(
                isinstance(value, (int, float)) and value > 0, name, f"must be positive, got {value!r}"
            )

    @property
    def embed_dim(self) -> int:
        """The embedding size actually used (d_embed, or d_model when d_embed is None)."""
        return self.d_model if self.d_embed is None else self.d_embed

    @property
    def span(self) -> Span:
        """The lengths the model trains with (its default span). The vanilla baseline has no memory: span 0."""
        if self.attention != "relative":
            return Span(mem_len=0)
        return Span(mem_len=self.mem_len, clamp_len=self.clamp_len, same_length=self.same_length)

    @property
    def stack(self) -> StackConfig:
        """The settings of the model's layer stack (:class:`~txl.model.LayerStack`): its layer fields."""
        return StackConfig(
            n_layer=self.n_layer,
            n_head=self.n_head,
            d_head=self.d_head,
            d_model=self.d_model,
            d_inner=self.d_inner,
            dropout=self.dropout,
            dropatt=self.dropatt,
            attention=self.attention,
            pre_norm=self.pre_norm,
        )


@dataclass(frozen=True)
class StackConfig:
    """Sizes and variants of a layer stack (:class:`~txl.model.LayerStack`): Transformer-XL's decoder layers
    without a token embedding or an output layer. The language model derives its own
    (:attr:`TransformerXLConfig.stack`), the agents' memory core its own (``txl.rl.CoreConfig.stack``); the
    defaults are the model's."""

    n_layer: int = 2
    """Number of layers (L)."""
    n_head: int = 2
    """Attention heads per layer (H)."""
    d_head: int = 16
    """Size of each attention head (Dh)."""
    d_model: int = 32
    """Size of the hidden states (D); even, since the sinusoid interleaves sin and cos halves."""
    d_inner: int = 64
    """Inner size of each layer's position-wise feed-forward network (F)."""
    dropout: float = 0.0
    """Dropout on the stack's input, the relative positions and the residual branches while training."""
    dropatt: float = 0.0
    """Dropout on attention probabilities."""
    attention: Attention = "relative"
    """"relative": Transformer-XL attention over a memory; "absolute": standard causal attention (the vanilla
    baseline, whose positions its owner adds to the input; no memory)."""
    pre_norm: bool = False
    """LayerNorm before each sub-layer (pre-norm) instead of after the residual sum (post-norm, the paper)."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "d_head", "d_model", "d_inner"):
            check_positive_int(self, name)
        check_field(
            self.d_model % 2 == 0, "d_model", f"must be even for the sinusoidal positions, got {self.d_model}"
        )
        _probability(self, "dropout")
        _probability(self, "dropatt")
        check_one_of(self, "attention", typing.get_args(Attention))
        check_field(
            isinstance(self.pre_norm, bool), "pre_norm", f"must be true or false, got {self.pre_norm!r}"
        )


def architecture_fields() -> tuple[str, ...]:
    """The model fields that define the weights (marked in :class:`TransformerXLConfig`); two configs that
    agree on these can load each other's weights."""
    return tuple(f.name for f in dataclasses.fields(TransformerXLConfig) if f.metadata.get("architecture"))


# ---------------------------------------------------------------------------------------------------------
# Data, training, evaluation, generation
# ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DataConfig:
    """Which text to model and how to turn it into tokens."""

    corpus: str = "python-stdlib"
    """A corpus name (tinyshakespeare, books, wikitext-2, wikitext-103, enwik8, text8, ptb, python-stdlib),
    a path to a text file or folder, or a Hugging Face dataset: ``hf:NAME[:CONFIG]`` (from the hub, e.g.
    ``hf:wikitext:wikitext-2-raw-v1``) or ``hf-disk:PATH`` (written by ``save_to_disk``); needs ``transformer-xl[datasets]``."""
    text_field: str = "text"
    """Hugging Face datasets: the column that holds the text (one line per row)."""
    vocab: VocabKind | None = None
    """Vocabulary kind; None picks the corpus's natural level (word, char or byte)."""
    min_freq: int = 1
    """Word vocabulary: drop tokens seen fewer times than this (they become <unk>)."""
    max_size: int | None = None
    """Word vocabulary: keep at most this many tokens (plus specials)."""
    bpe_vocab_size: int = 8000
    """BPE vocabulary size."""
    tokenizer: Tokenizer | None = None
    """Word vocabulary tokenizer; None: whitespace for pre-tokenized corpora, regex for raw text."""
    data_dir: str | None = None
    """Folder to look for corpora in before $TXL_DATA_DIR and ~/.cache/txl."""
    cache_dir: str | None = None
    """Folder for encoded .npy caches; None means ~/.cache/txl/encoded."""
    documents: Documents = "continue"
    """What the memory does at a document boundary (a book, a source file, a WikiText article, a record):
    "continue" reads on across it, as the authors' code does (the paper's setting); "reset" passes the
    boundaries to the model in training and evaluation, so that a document attends to nothing before it.
    "reset" needs a corpus with document boundaries."""

    def __post_init__(self) -> None:
        check_field(
            isinstance(self.corpus, str) and bool(self.corpus.strip()), "corpus", "must be a name or path"
        )
        check_field(
            isinstance(self.text_field, str) and bool(self.text_field), "text_field", "must be a column name"
        )
        if self.vocab is not None:
            check_one_of(self, "vocab", typing.get_args(VocabKind))
        check_positive_int(self, "min_freq")
        if self.max_size is not None:
            check_positive_int(self, "max_size")
        check_field(
            isinstance(self.bpe_vocab_size, int) and self.bpe_vocab_size >= 260,
            "bpe_vocab_size",
            f"must be an integer >= 260, got {self.bpe_vocab_size!r}",
        )
        if self.tokenizer is not None:
            check_one_of(self, "tokenizer", typing.get_args(Tokenizer))
        check_one_of(self, "documents", typing.get_args(Documents))


@dataclass(frozen=True)
class TrainConfig:
    """The optimisation loop."""

    steps: int = 200
    """Optimizer steps to run."""
    batch_size: int = 8
    """Number of parallel streams (batch rows), each a contiguous part of the corpus."""
    tgt_len: int = 32
    """Segment length T (tokens predicted per row per step)."""
    varlen: bool = False
    """Draw segment lengths around tgt_len as the original (the memory carries across any length)."""
    lr: float = 1e-3
    """Peak learning rate."""
    min_lr: float = 0.0
    """Learning rate at the end of the cosine or linear schedule."""
    schedule: Schedule = "cosine"
    """Learning-rate schedule after warmup."""
    warmup_steps: int = 0
    """Linear warmup from 0 to lr over this many steps."""
    weight_decay: float = 0.0
    """AdamW weight decay (not applied to biases, norms, embeddings' u/v biases)."""
    beta1: float = 0.9
    """AdamW beta1."""
    beta2: float = 0.999
    """AdamW beta2."""
    clip: float | None = 0.25
    """Gradient norm clipping threshold; None disables clipping."""
    accum_steps: int = 1
    """Gradient accumulation: the batch rows are split into this many chunks per step."""
    precision: Precision = "fp32"
    """bf16 autocast for the forward pass (weights and optimizer stay fp32)."""
    device: str = "auto"
    """"auto" (CUDA if available), "cpu", "cuda", "cuda:N"."""
    seed: int = 0
    """Seed for parameters, dropout and the segment stream."""
    log_every: int = 10
    """Write a train line to metrics.jsonl every N steps."""
    eval_every: int = 100
    """Evaluate on the validation split every N steps (and at the end); 0 only at the end."""
    eval_tokens: int | None = None
    """Limit periodic validation to about this many tokens (None: the whole split). The final is always full."""
    checkpoint_every: int = 100
    """Save a checkpoint every N steps (and at the end); 0 only at the end."""
    keep_last: int = 2
    """Keep this many most recent step checkpoints (the best one is kept separately)."""
    patience: int | None = None
    """Stop after this many evaluations without a better validation loss; None never stops early."""
    time_limit: float | None = None
    """Stop after this many minutes of training (then evaluate and save as at the last step)."""
    compile: bool = False
    """Wrap the model with torch.compile."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "tgt_len", "accum_steps", "log_every", "keep_last"):
            check_positive_int(self, name)
        for name in ("warmup_steps", "eval_every", "checkpoint_every", "seed"):
            check_non_negative_int(self, name)
        check_field(
            isinstance(self.lr, (int, float)) and self.lr > 0, "lr", f"must be positive, got {self.lr!r}"
        )
        check_field(
            isinstance(self.min_lr, (int, float)) and 0 <= self.min_lr <= self.lr,
            "min_lr",
            f"must be in [0, lr], got {self.min_lr!r}",
        )
        check_one_of(self, "schedule", typing.get_args(Schedule))
        check_field(
            isinstance(self.weight_decay, (int, float)) and self.weight_decay >= 0,
            "weight_decay",
            "must be >= 0",
        )
        for name in ("beta1", "beta2"):
            _probability(self, name)
        if self.clip is not None:
            check_field(
                isinstance(self.clip, (int, float)) and self.clip > 0, "clip", "must be positive or null"
            )
        check_one_of(self, "precision", typing.get_args(Precision))
        check_field(
            self.batch_size % self.accum_steps == 0,
            "accum_steps",
            f"must divide batch_size={self.batch_size}, got {self.accum_steps}",
        )
        if self.eval_tokens is not None:
            check_positive_int(self, "eval_tokens")
        if self.patience is not None:
            check_positive_int(self, "patience")
        if self.time_limit is not None:
            check_field(
                isinstance(self.time_limit, (int, float)) and self.time_limit > 0,
                "time_limit",
                f"must be a positive number of minutes, got {self.time_limit!r}",
            )


@dataclass(frozen=True)
class EvalConfig:
    """Evaluation over a whole split, carrying memory; these may differ from training (longer memory)."""

    batch_size: int = 8
    """Parallel streams during evaluation."""
    tgt_len: int | None = None
    """Segment length; None: the training tgt_len."""
    mem_len: int | None = None
    """Memory length; None: the model's mem_len."""
    clamp_len: int | None = None
    """Clamp of relative distances; None: the model's clamp_len."""
    same_length: bool | None = None
    """Every query sees the same number of keys; None: the model's setting."""

    def __post_init__(self) -> None:
        check_positive_int(self, "batch_size")
        if self.tgt_len is not None:
            check_positive_int(self, "tgt_len")
        if self.mem_len is not None:
            check_non_negative_int(self, "mem_len")
        if self.clamp_len is not None:
            check_positive_int(self, "clamp_len")
        if self.same_length is not None:
            check_field(
                isinstance(self.same_length, bool),
                "same_length",
                f"must be true or false, got {self.same_length!r}",
            )
        check_field(
            not (self.same_length is True and self.mem_len == 0), "same_length", _SAME_LENGTH_NEEDS_MEMORY
        )


@dataclass(frozen=True)
class GenerateConfig:
    """Sampling settings."""

    max_new_tokens: int = 200
    """Tokens to sample."""
    temperature: float = 1.0
    """Divide logits by this; 0 means greedy, and so does any temperature below 1e-5."""
    top_k: int | None = None
    """Keep the k most likely tokens."""
    top_p: float | None = None
    """Keep the smallest set of tokens whose probability reaches p (nucleus)."""
    prompt: str | None = None
    """The default prompt of ``txl generate`` and of txl serve's page (None: a newline for ``txl generate``,
    the first line of the corpus's training text for the page)."""

    def __post_init__(self) -> None:
        check_positive_int(self, "max_new_tokens")
        check_sampling(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)
        check_field(
            self.prompt is None or isinstance(self.prompt, str),
            "prompt",
            f"must be text, got {self.prompt!r}",
        )


def check_sampling(*, temperature: Any = 1.0, top_k: Any = None, top_p: Any = None) -> None:
    """Validate sampling settings (the one place: :class:`GenerateConfig` and :class:`txl.inference.SamplingParams` use it).
    Raises ConfigError (a ValueError) naming the setting."""
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not math.isfinite(temperature)
        or temperature < 0
    ):
        raise ConfigError(f"temperature must be a finite number >= 0 (0 is greedy), got {temperature!r}")
    positive_int(top_k, "top_k", optional=True, field=False)
    if top_p is not None and (
        isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1
    ):
        raise ConfigError(f"top_p must be in (0, 1] or None, got {top_p!r}")


@dataclass(frozen=True)
class RunConfig:
    """Everything a training run needs; saved as config.json in the run folder."""

    model: TransformerXLConfig = field(default_factory=TransformerXLConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)


def first_set(*values: Any) -> Any:
    """The first value that is not None (a setting given, else the run's, else the default), or None: the
    one way settings are merged."""
    return next((v for v in values if v is not None), None)


def eval_span(
    config: RunConfig,
    *,
    mem_len: int | None = None,
    clamp_len: int | None = None,
    same_length: bool | None = None,
) -> Span:
    """The span to evaluate a run with: the lengths given here, else its ``[eval]`` lengths where set, else
    the model's (one place resolves them for the trainer, ``txl eval`` and the analyses). A memory of 0 turns
    off same-length attention not given with it (see :func:`span_of`). The vanilla baseline has no memory:
    giving it lengths is an error."""
    model, ev = config.model, config.eval
    if model.attention != "relative":
        given = [
            name
            for name, value in (("mem_len", mem_len), ("clamp_len", clamp_len), ("same_length", same_length))
            if value is not None
        ]
        if given:
            raise ConfigError(
                f"{' and '.join(given)} appl{'ies' if len(given) == 1 else 'y'} to the Transformer-XL "
                "only (this run is the vanilla baseline: no memory, no relative positions)"
            )
        return model.span
    for name, value, low in (("mem_len", mem_len, 0), ("clamp_len", clamp_len, 1)):  # given: named as given
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < low):
            raise ConfigError(f"{name}: must be an integer >= {low}, got {value!r}", fields=(name,))
    try:
        return span_of(
            mem_len=first_set(mem_len, ev.mem_len, model.mem_len),
            clamp_len=first_set(clamp_len, ev.clamp_len, model.clamp_len),
            same_length=first_set(same_length, ev.same_length, model.same_length),
            same_length_asked=same_length is not None,
        )
    except ConfigError as exc:
        raise ConfigError(f"eval.{exc}") from None


@dataclass(frozen=True)
class EvalLengths:
    """The lengths a run is evaluated with: the segment length and the span."""

    tgt_len: int
    """Tokens predicted per segment (T)."""
    span: Span
    """How far back each segment looks (memory, clamp, same-length attention)."""


def eval_lengths(
    config: RunConfig,
    *,
    tgt_len: int | None = None,
    mem_len: int | None = None,
    clamp_len: int | None = None,
    same_length: bool | None = None,
) -> EvalLengths:
    """The evaluation lengths of a run, each from the value given here, else its ``[eval]`` section, else
    training's: the one rule for every command, analysis and server that reads a text as the run would."""
    tgt = first_set(tgt_len, config.eval.tgt_len, config.train.tgt_len)
    span = eval_span(config, mem_len=mem_len, clamp_len=clamp_len, same_length=same_length)
    return EvalLengths(tgt_len=positive_int(tgt, "tgt_len"), span=span)


def has_memory(model: TransformerXLConfig, span: Span | None = None) -> bool:
    """Whether a model keeps a memory between segments: relative attention and a memory length above 0 (the
    span's when given, else the model's). The vanilla baseline never does."""
    mem_len = model.mem_len if span is None else span.mem_len
    return model.attention == "relative" and mem_len > 0


@typing.overload
def positive_int(
    value: Any, name: str, *, error: type[Exception] = ..., optional: Literal[False] = ..., field: bool = ...
) -> int: ...
@typing.overload
def positive_int(
    value: Any, name: str, *, error: type[Exception] = ..., optional: bool, field: bool = ...
) -> int | None: ...
def positive_int(
    value: Any, name: str, *, error: type[Exception] = ConfigError, optional: bool = False, field: bool = True
) -> int | None:
    """``value`` when it is an integer above 0 (not a bool), or None when ``optional``; else ``error``: the
    one positive-integer check. A settings field is named as every field is (``name: must be a positive
    integer, got 0``); an argument (``field=False``) in a sentence (``name must be a positive integer, ...``)."""
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        kind = "a positive integer or None" if optional else "a positive integer"
        raise error(f"{name}{':' if field else ''} must be {kind}, got {value!r}")
    return value


def cache_slots(mem_len: int) -> int:
    """Positions a key/value cache of memory ``mem_len`` holds per layer: the memory plus room to slide
    (a quarter of it, at least 16) before its window moves back to the start."""
    return mem_len + max(mem_len // 4, 16)


_SECTIONS: dict[str, type] = {
    "model": TransformerXLConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "generate": GenerateConfig,
}


# ---------------------------------------------------------------------------------------------------------
# Conversion, presets and overrides
# ---------------------------------------------------------------------------------------------------------


def coerce_value(value: Any, hint: Any, name: str) -> Any:
    """Convert a TOML/JSON value to the field's declared type ``hint`` (lists to tuples, ints to floats); a
    value of another type is a :class:`ConfigError` naming ``name``."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return coerce_value(value, arg, name)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(errors[0] if errors else f"{name}: invalid value {value!r}")
    if origin is Literal:
        if value not in typing.get_args(hint):
            choices = ", ".join(map(repr, typing.get_args(hint)))
            raise ConfigError(f"{name}: must be one of {choices}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name}: must be a list, got {value!r}")
        (item,) = typing.get_args(hint)[:1]
        return tuple(coerce_value(v, item, name) for v in value)
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{name}: must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                return int(value)
            raise ConfigError(f"{name}: must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{name}: must be a number, got {value!r}")
        if not math.isfinite(float(value)):
            raise ConfigError(f"{name}: must be finite, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{name}: must be a string, got {value!r}")
        return value
    return value


def build_section(cls: type, values: dict[str, Any], section: str) -> Any:
    """The settings value ``cls`` of one TOML section's ``values``, each converted (:func:`coerce_value`); an
    unknown field or an invalid value is a :class:`ConfigError` naming ``section.field``."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, value in values.items():
        if key not in known:
            raise ConfigError(f"{section}.{key}: unknown field (known: {', '.join(sorted(known))})")
        kwargs[key] = coerce_value(value, hints[key], f"{section}.{key}")
    try:
        return cls(**kwargs)
    except ConfigError as exc:
        msg = str(exc)
        if not msg.startswith(f"{section}."):
            msg = f"{section}.{msg}"
        raise ConfigError(msg) from None


def config_from_dict(data: dict[str, Any]) -> RunConfig:
    """Build a RunConfig from nested plain values (TOML or JSON); unknown sections or fields are errors."""
    sections = {}
    for key, value in data.items():
        if key not in _SECTIONS:
            raise ConfigError(f"{key}: unknown config section (known: {', '.join(_SECTIONS)})")
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: must be a table of fields")
        sections[key] = build_section(_SECTIONS[key], value, key)
    return RunConfig(**sections)


def config_to_dict(config: Any) -> dict[str, Any]:
    """Nested plain values (tuples as lists) for JSON or TOML."""

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, tuple):
            return [plain(v) for v in value]
        return value

    return plain(config)


def _presets_dir() -> Path:
    return Path(str(resources.files("txl") / "configs"))


def preset_names() -> list[str]:
    """Names of the presets shipped with txl."""
    return sorted(p.stem for p in _presets_dir().glob("*.toml"))


def read_preset(name_or_path: str | Path, folder: Path) -> dict[str, Any]:
    """The TOML table of a preset by name (a ``NAME.toml`` of ``folder``) or of a TOML file by path; an unknown
    name, a missing file or bad TOML is a :class:`ConfigError` (the one reader of every kind of preset)."""
    path = Path(name_or_path)
    if not (path.suffix == ".toml" or path.exists()):
        path = folder / f"{name_or_path}.toml"
        if not path.exists():
            names = sorted(p.stem for p in folder.glob("*.toml"))
            raise ConfigError(
                f"unknown preset {str(name_or_path)!r} (presets: {', '.join(names)}; "
                "or give a path to a .toml file)"
            )
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None


def load_config(name_or_path: str | Path) -> RunConfig:
    """Load a preset by name (``tiny``) or a TOML file by path."""
    return config_from_dict(read_preset(name_or_path, _presets_dir()))


def parse_value(text: str) -> Any:
    """A TOML value (``3``, ``1e-3``, ``true``, ``[1, 2]``, ``"x"``); a bare word is a string."""
    if text.strip().lower() in ("none", "null"):
        return None
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def apply_overrides(config: RunConfig, overrides: list[str] | tuple[str, ...]) -> RunConfig:
    """Apply ``section.field=value`` overrides, returning a new validated RunConfig."""
    data = config_to_dict(config)
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ConfigError(f"override {item!r}: expected section.field=value")
        section, dot, name = key.strip().partition(".")
        if not dot or section not in _SECTIONS:
            raise ConfigError(f"{key.strip()}: unknown config section (known: {', '.join(_SECTIONS)})")
        if name not in {f.name for f in dataclasses.fields(_SECTIONS[section])}:
            raise ConfigError(f"{key.strip()}: unknown field")
        data[section][name] = parse_value(raw.strip())
    return config_from_dict(data)


def vanilla_baseline(config: RunConfig) -> RunConfig:
    """The paper's vanilla Transformer for a Transformer-XL run config.

    Same sizes, data, steps, optimiser and seed; ``attention="absolute"`` (sinusoidal positions added to
    the input, standard causal attention) and no memory. Its evaluation uses disjoint segments of the length
    it was trained with (``eval.tgt_len = train.tgt_len``, no memory, clamp or same-length setting): with
    absolute positions, a longer segment would show it positions it never saw in training."""
    model = dataclasses.replace(
        config.model, attention="absolute", mem_len=0, clamp_len=None, same_length=False
    )
    evaluation = dataclasses.replace(
        config.eval, tgt_len=config.train.tgt_len, mem_len=None, clamp_len=None, same_length=None
    )
    return dataclasses.replace(config, model=model, eval=evaluation)
