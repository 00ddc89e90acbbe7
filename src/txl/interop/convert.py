"""``txl convert``: a pretrained checkpoint (the authors' state_dict or a Hugging Face TransfoXL folder) written
as a txl run folder that ``txl eval`` and ``txl generate`` accept. Reading the checkpoints is
:mod:`txl.interop.checkpoints`' job, the run folder's layout :mod:`txl.runs`' and :mod:`txl.checkpoint`'s.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from ..checkpoint import CheckpointContents, save_checkpoint
from ..config import (
    ConfigError,
    DataConfig,
    EvalConfig,
    RunConfig,
    TrainConfig,
    TransformerXLConfig,
    config_to_dict,
    has_memory,
)
from ..data.vocab import Vocab
from ..errors import CheckpointError, TxlError
from ..runs import check_new_run_dir, clear_run, save_run_config
from .checkpoints import OriginalSettings, load_hf, load_hf_vocab, load_original, read_hf_config

__all__ = ["ConvertSettings", "Source", "convert", "detect_source"]

Source = Literal["original", "hf"]

EXPECTED = (
    "source hf takes a Hugging Face TransfoXL folder (config.json, pytorch_model.bin or model.safetensors, "
    "vocab.pkl), source original a state_dict file of the authors' code"
)
"""What ``txl convert`` reads, said whenever a source is not that."""


@dataclass(frozen=True)
class ConvertSettings:
    """What :func:`convert` reads and the lengths it gives the run. The original's state_dict stores no
    ``mem_len``, ``clamp_len``, ``same_length``, ``pre_norm`` or div_val-1 ``cutoffs``: they are given here
    (``lengths.mem_len`` is required for it); for a Hugging Face folder the lengths given override its
    config."""

    source: Source | None = None
    """``hf`` (a folder with config.json and weights) or ``original`` (a state_dict file); None: detected."""
    vocab: str | Path | None = None
    """The vocabulary file or folder; None: the vocab.pkl / vocab.txt / vocab.json next to the source."""
    corpus: str = "wikitext-103"
    """What ``txl eval`` evaluates the run on (its ``data.corpus``)."""
    lengths: EvalConfig = EvalConfig()
    """The lengths the run is given, as an ``[eval]`` section holds them (its ``batch_size`` is not used):
    ``tgt_len``, the evaluation segment (None: the Hugging Face config's ``tgt_len``, else 128); ``mem_len``
    (None: the Hugging Face config's; required for ``original``), ``clamp_len`` and ``same_length`` (None: the
    source's; none and off for ``original``)."""
    pre_norm: bool = False
    """The original's layer norm placement: before each sub-layer (True) or after it (the authors')."""
    cutoffs: tuple[int, ...] | None = None
    """The adaptive softmax cutoffs of a div_val-1 original; None: read from the state_dict."""

    def __post_init__(self) -> None:
        if not isinstance(self.lengths, EvalConfig):
            raise ConfigError(f"lengths: must be an EvalConfig, got {type(self.lengths).__name__}")


def _refuse_txl_run(src: Path) -> None:
    """A txl run folder (or a file in one) given as the source: it needs no conversion."""
    folder = src if src.is_dir() else src.parent
    if (folder / "config.json").is_file() and (folder / "checkpoints").is_dir():
        raise CheckpointError(
            f"{src} is a txl run folder, which txl eval and txl generate read as it is; "
            f"convert expects another checkpoint: {EXPECTED}",
            fields=("source",),
        )


def detect_source(src: Path) -> Source:
    """``hf`` for a folder with a config.json (or a file inside one), ``original`` for a state_dict file."""
    folder = src if src.is_dir() else src.parent
    if (folder / "config.json").is_file() and not (src.is_file() and src.suffix in (".pt", ".pth")):
        return "hf"
    if src.is_file():
        return "original"
    raise CheckpointError(
        f"{src}: neither a Hugging Face folder (with config.json) nor a file; {EXPECTED}", fields=("source",)
    )


def _load_vocab(src: Path, vocab: Path | None) -> Vocab:
    if vocab is not None:
        return load_hf_vocab(vocab)
    folder = src if src.is_dir() else src.parent
    if any((folder / n).is_file() for n in ("vocab.pkl", "vocab.txt", "vocab.json")):
        return load_hf_vocab(folder)
    raise CheckpointError(
        f"{folder}: no vocab.pkl, vocab.txt or vocab.json; pass vocab PATH", fields=("vocab",)
    )


def convert(
    src: str | Path, dst: str | Path, settings: ConvertSettings | None = None, *, overwrite: bool = False
) -> Path:
    """Write the checkpoint ``src`` as a run folder ``dst`` (replacing a run there with ``overwrite``) and
    return it. The vocabulary's ids are kept; ``settings`` says what to read and the lengths to give."""
    s = settings or ConvertSettings()
    mem_len, tgt_len = s.lengths.mem_len, s.lengths.tgt_len
    src, dst = Path(src).expanduser(), Path(dst).expanduser()
    if not src.exists():
        raise CheckpointError(f"checkpoint not found: {src}")
    _refuse_txl_run(src)
    source = s.source or detect_source(src)
    paths = check_new_run_dir(dst, overwrite=overwrite, resumable=False)
    if source == "original" and mem_len is None:
        raise CheckpointError(
            "source original needs mem_len (the state_dict does not store it)", fields=("source", "mem_len")
        )
    try:
        words = _load_vocab(src, None if s.vocab is None else Path(s.vocab).expanduser())
        if source == "hf":
            model = load_hf(src)
            tgt_len = tgt_len or read_hf_config(src).get("tgt_len") or 128
        else:
            assert mem_len is not None  # refused above
            lengths = OriginalSettings(
                mem_len=mem_len,
                pre_norm=s.pre_norm,
                same_length=bool(s.lengths.same_length),
                clamp_len=s.lengths.clamp_len,
                cutoffs=s.cutoffs,
            )
            model = load_original(src, lengths)
            tgt_len = tgt_len or 128
    except TxlError:
        raise
    except (TypeError, KeyError, AttributeError, IndexError, ValueError, OSError) as exc:
        what = "folder" if src.is_dir() else "file"
        raise CheckpointError(
            f"{src}: cannot read this {what} as source {source} ({type(exc).__name__}: {exc}); {EXPECTED}",
            fields=("source",),
        ) from None
    model = model.float()
    if len(words) != model.config.vocab_size:
        raise CheckpointError(f"the vocabulary has {len(words)} symbols, the model {model.config.vocab_size}")
    config = RunConfig(
        model=_with_span(model.config, s),
        data=DataConfig(corpus=s.corpus, vocab="word", tokenizer="whitespace"),
        train=TrainConfig(tgt_len=int(tgt_len)),
        eval=EvalConfig(tgt_len=int(tgt_len)),
    )
    if paths.holds_run():
        clear_run(paths)
    paths.root.mkdir(parents=True, exist_ok=True)
    words.save(paths.vocab)
    save_run_config(paths.root, config)
    meta = {
        "config": config_to_dict(config),
        "model": config_to_dict(config.model),
        "vocab_fingerprint": words.fingerprint,
        "converted_from": {"source": source, "path": str(src)},
    }
    save_checkpoint(paths.best, CheckpointContents(model, meta=meta))
    return paths.root


def _with_span(config: TransformerXLConfig, settings: ConvertSettings) -> TransformerXLConfig:
    """The config with the default lengths that were given changed (they are not architecture: the weights
    stay as they are); same_length is dropped with no memory."""
    lengths = {n: getattr(settings.lengths, n) for n in ("mem_len", "clamp_len", "same_length")}
    changes = {k: v for k, v in lengths.items() if v is not None}
    try:
        config = dataclasses.replace(config, **changes)
    except ConfigError as exc:
        raise ConfigError(f"convert: {exc}") from None
    if config.same_length and not has_memory(config):
        config = dataclasses.replace(config, same_length=False)
    return config
