"""Hugging Face ``datasets`` as a corpus source (the extra ``datasets``): ``hf:NAME[:CONFIG]`` from the hub or
its cache and ``hf-disk:PATH``, each row's ``text_field`` one line of text, their splits txl's train, valid
and test. What a corpus is, and caching, are :mod:`txl.data.corpora`'s and :mod:`txl.data.encoded`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ..errors import CorpusError

__all__ = ["HF_PREFIX", "HF_DISK_PREFIX", "is_hf_spec", "load_hf_corpus", "SPLIT_NAMES"]

HF_PREFIX = "hf:"
HF_DISK_PREFIX = "hf-disk:"
SPLIT_NAMES = {"train": "train", "validation": "valid", "valid": "valid", "dev": "valid", "test": "test"}
"""Dataset split name -> txl split name; other splits are left out."""


def is_hf_spec(spec: str) -> bool:
    """Whether ``data.corpus`` names a Hugging Face dataset."""
    return spec.startswith((HF_PREFIX, HF_DISK_PREFIX))


def _datasets() -> Any:

    try:
        import datasets
    except ImportError:
        raise CorpusError(
            "hf: and hf-disk: corpora need Hugging Face datasets: pip install 'transformer-xl[datasets]'"
        ) from None
    return datasets


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return f"{type(exc).__name__}: {first[:300]}"


def _open(spec: str) -> tuple[Any, str]:
    """The DatasetDict (or Dataset) that ``spec`` names, and the corpus name."""
    datasets = _datasets()
    if spec.startswith(HF_DISK_PREFIX):
        path = Path(spec[len(HF_DISK_PREFIX) :]).expanduser()
        if not path.exists():
            raise CorpusError(f"corpus {spec}: {path} does not exist (a folder written by save_to_disk)")
        try:
            return datasets.load_from_disk(str(path)), f"{HF_DISK_PREFIX}{path.name}"
        except Exception as exc:  # noqa: BLE001 - datasets raises many types for a bad folder
            raise CorpusError(
                f"corpus {spec}: not a dataset saved with save_to_disk ({_one_line(exc)})"
            ) from None
    name, _, config = spec[len(HF_PREFIX) :].partition(":")
    if not name:
        raise CorpusError(
            f"corpus {spec!r}: expected hf:NAME or hf:NAME:CONFIG, e.g. hf:wikitext:wikitext-2-raw-v1"
        )
    try:
        return datasets.load_dataset(name, config or None), spec
    except Exception as exc:  # noqa: BLE001 - network, hub and script errors all end here
        raise CorpusError(
            f"cannot load the Hugging Face dataset {spec[len(HF_PREFIX) :]!r} ({_one_line(exc)}): the hub cannot be "
            "reached or has no such dataset; on a machine with network run datasets.load_dataset(...)"
            '.save_to_disk(PATH) and use data.corpus="hf-disk:PATH"'
        ) from None


def load_hf_corpus(
    spec: str, *, text_field: str = "text"
) -> tuple[str, dict[str, list[tuple[bytes, str, int | None]]], dict[str, tuple[int, ...]]]:
    """The corpus name, its splits as pieces (UTF-8 bytes, source, None) for :func:`corpora._make`, and per
    split the byte offset where each row begins (a record: a document, except in a WikiText dataset)."""
    data, name = _open(spec)
    datasets = _datasets()
    splits = {"train": data} if isinstance(data, datasets.Dataset) else dict(data)
    parts: dict[str, list[tuple[bytes, str, int | None]]] = {}
    records: dict[str, tuple[int, ...]] = {}
    for split, dataset in splits.items():
        ours = SPLIT_NAMES.get(split)
        if ours is None:
            continue
        if text_field not in dataset.column_names:
            raise CorpusError(
                f"corpus {spec}: split {split!r} has no column {text_field!r} (columns: "
                f"{', '.join(dataset.column_names)}); set data.text_field"
            )
        rows = dataset[text_field]
        if not all(isinstance(row, str) for row in rows):
            raise CorpusError(f"corpus {spec}: column {text_field!r} must hold text")
        encoded = [(row if row.endswith("\n") else row + "\n").encode("utf-8") for row in rows]
        before = sum(len(piece) for piece, _, _ in parts.get(ours, ()))
        offsets = np.cumsum([0, *map(len, encoded[:-1])]) + before if encoded else np.zeros(0, dtype=np.int64)
        records[ours] = (*records.get(ours, ()), *map(int, offsets))
        parts.setdefault(ours, []).append((b"".join(encoded), f"{spec}[{split}]", None))
    if not parts:
        raise CorpusError(
            f"corpus {spec}: no train, validation or test split (splits: {', '.join(splits) or 'none'})"
        )
    return name, parts, records
