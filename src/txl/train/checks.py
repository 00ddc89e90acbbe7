"""What a run may start or resume with, refused before anything is written: its data, the sizes of its
training segment, the fields a resume may change. The loop itself is :mod:`txl.train.trainer`'s.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..config import RunConfig, apply_overrides, config_to_dict, has_memory
from ..data import CORPUS_NAMES, BatchSettings, PreparedData, SegmentStream
from ..distributed import Distributed
from ..errors import RunError
from ..limits import check_fits, segment_bytes

__all__ = [
    "RESUME_FIXED_TRAIN_FIELDS",
    "RESUME_MOVABLE_DATA_FIELDS",
    "check_data",
    "check_training_fits",
    "resume_config",
    "train_stream",
]

RESUME_FIXED_TRAIN_FIELDS = ("batch_size", "tgt_len", "varlen", "seed")
"""Train fields a resumed run cannot change: they shape the data stream saved in the checkpoint (its rows,
its position, its segment lengths) or were used up at the start (the seed). Every model field and every
data field except the locations (data_dir, cache_dir: the corpus fingerprint is checked) are fixed too."""
RESUME_MOVABLE_DATA_FIELDS = ("data_dir", "cache_dir")


def train_stream(
    config: RunConfig, splits: Mapping[str, np.ndarray], starts: Mapping[str, np.ndarray] | None = None
) -> SegmentStream:
    """The ordered stream of the train split (RunError when there is none, or it is shorter than one segment).
    With ``data.documents = "reset"`` its batches carry the document starts of the train split (``starts``,
    :attr:`PreparedData.starts`); with "continue" they carry none, so nothing differs from a corpus without."""
    if "train" not in splits:
        raise RunError(f"corpus {config.data.corpus!r} has no train split to train on")
    tc = config.train
    try:
        return SegmentStream(
            splits["train"],
            BatchSettings(batch_size=tc.batch_size, tgt_len=tc.tgt_len, varlen=tc.varlen, seed=tc.seed),
            name="train",
            starts=(starts or {}).get("train") if config.data.documents == "reset" else None,
        )
    except ValueError as exc:
        raise RunError(str(exc)) from None


def check_data(config: RunConfig, data: PreparedData) -> None:
    """Refuse, before anything is written, data a run cannot use: no train split or one shorter than one
    segment, an evaluation split too short to evaluate (a file corpus is cut 90/5/5, so its validation slice
    can come out empty), and early stopping that can never happen."""
    train_stream(config, data.splits)
    corpus = config.data.corpus
    for split in ("valid", "test"):
        n = len(data.splits.get(split, ()))
        if split in data.splits and n < 2:
            raise RunError(
                f"split '{split}' of corpus {corpus!r} has {n} token(s); evaluation needs at least 2; "
                "use a longer corpus"
            )
    if "valid" not in data.splits and corpus not in CORPUS_NAMES and Path(corpus).expanduser().is_file():
        raise RunError(
            f"split 'valid' of corpus {corpus!r} is empty (0 tokens): the file is cut 90/5/5 at line "
            "ends and no text fell between the cuts; use a longer file, or a folder with train.txt "
            "and valid.txt"
        )
    patience = config.train.patience
    if patience is not None and "valid" not in data.splits:
        raise RunError(
            f"train.patience={patience}: corpus {corpus!r} has no validation split to stop early on; "
            "set train.patience=null"
        )
    if patience is not None and not config.train.eval_every:
        raise RunError(
            f"train.patience={patience} stops after evaluations without improvement, but "
            "train.eval_every=0 evaluates only at the end; set train.eval_every"
        )


def resume_config(saved: RunConfig, overrides: tuple[str, ...]) -> RunConfig:
    """The run's config with ``overrides`` applied; RunError naming every field a resume cannot change."""
    if not overrides:
        return saved
    config = apply_overrides(saved, overrides)
    before, after = config_to_dict(saved), config_to_dict(config)
    fixed = [("model", name) for name in before["model"]]
    fixed += [("data", name) for name in before["data"] if name not in RESUME_MOVABLE_DATA_FIELDS]
    fixed += [("train", name) for name in RESUME_FIXED_TRAIN_FIELDS]
    refused = [
        f"{section}.{name}: cannot be changed when resuming (the run has "
        f"{json.dumps(before[section][name])}, asked {json.dumps(after[section][name])})"
        for section, name in fixed
        if before[section][name] != after[section][name]
    ]
    if refused:
        raise RunError("; ".join(refused))
    return config


def check_training_fits(config: RunConfig, group: Distributed) -> None:
    """Refuse (:class:`~txl.errors.SizeError`) a training segment whose buffers cannot fit in this process's
    device: one forward of one process (its rows of a batch, one accumulation chunk) keeps the memory and
    every layer's attention for backward. Names the fields to lower."""
    train, model = config.train, config.model
    rows = max(1, train.batch_size // (group.world_size * train.accum_steps))  # one forward of one process
    mem_len = model.mem_len if has_memory(model) else 0
    check_fits(
        segment_bytes(model, batch=rows, tgt_len=train.tgt_len, mem_len=mem_len, training=True),
        setting=f"train.batch_size {train.batch_size}, train.tgt_len {train.tgt_len}, model.mem_len {mem_len}",
        what=f"the attention of {model.n_layer} layers over {rows} rows of {train.tgt_len} + {mem_len} keys",
        lower="train.batch_size, train.tgt_len or model.mem_len, or raise train.accum_steps",
        device=group.device(train.device),
    )
