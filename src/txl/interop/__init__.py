"""Other implementations' models in and out of txl: the authors' and Hugging Face's checkpoints, ``txl
convert``, ``txl export`` to ONNX and the restricted unpickler; the checkpoint readers are re-exported here
and imported when first used (PEP 562), so reading a pickled vocabulary needs no torch."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .checkpoints import (
        CheckpointError,
        OriginalSettings,
        config_from_hf,
        config_from_original,
        hf_to_txl,
        load_hf,
        load_hf_vocab,
        load_original,
        original_to_txl,
        read_hf_config,
        read_hf_state,
        txl_to_original,
        vocab_from_symbols,
    )
    from .safe_pickle import UnsafePickleError

_EXPORTS = {  # public name -> the module that defines it
    "CheckpointError": ".checkpoints",
    "OriginalSettings": ".checkpoints",
    "load_original": ".checkpoints",
    "original_to_txl": ".checkpoints",
    "txl_to_original": ".checkpoints",
    "config_from_original": ".checkpoints",
    "load_hf": ".checkpoints",
    "load_hf_vocab": ".checkpoints",
    "config_from_hf": ".checkpoints",
    "hf_to_txl": ".checkpoints",
    "read_hf_state": ".checkpoints",
    "read_hf_config": ".checkpoints",
    "vocab_from_symbols": ".checkpoints",
    "UnsafePickleError": ".safe_pickle",
}

__all__ = [  # the names of _EXPORTS (a literal list, for linters and type checkers)
    "CheckpointError",
    "OriginalSettings",
    "load_original",
    "original_to_txl",
    "txl_to_original",
    "config_from_original",
    "load_hf",
    "load_hf_vocab",
    "config_from_hf",
    "hf_to_txl",
    "read_hf_state",
    "read_hf_config",
    "vocab_from_symbols",
    "UnsafePickleError",
]


def __getattr__(name: str) -> Any:
    """Import a public name, or one of this package's modules (``txl.interop.onnx``), on first use and keep it
    in the package's namespace."""
    where = _EXPORTS.get(name)
    if where is None and not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}"):
        where = f".{name}"
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(where, __name__)
    value = module if where == f".{name}" else getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
