"""txl: Transformer-XL language modelling, correct to the paper. The public names below are imported when first
used (PEP 562), so ``import txl`` imports no torch and leaves the thread policy (:mod:`txl.threads`) to the
caller; ``txl.evaluate`` is a function, ``txl.interop`` a module. Examples: the README and the guides."""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ._version import installed_version

if TYPE_CHECKING:
    from . import interop
    from .config import (
        ConfigError,
        DataConfig,
        EvalConfig,
        GenerateConfig,
        RunConfig,
        Span,
        TrainConfig,
        TransformerXLConfig,
        load_config,
    )
    from .evaluation import evaluate, segment_losses
    from .inference import DecodeSettings, Engine, SamplingParams, Step, generate, stream
    from .model import KVCache, Memory, ModelOutput, TransformerXL, update_memory
    from .threads import configure_threads

__version__ = installed_version()

_EXPORTS = {  # public name -> the module that defines it (a module's own name: the module itself)
    "TransformerXLConfig": ".config",
    "DataConfig": ".config",
    "TrainConfig": ".config",
    "EvalConfig": ".config",
    "GenerateConfig": ".config",
    "RunConfig": ".config",
    "Span": ".config",
    "ConfigError": ".config",
    "load_config": ".config",
    "TransformerXL": ".model",
    "ModelOutput": ".model",
    "Memory": ".model",
    "update_memory": ".model",
    "KVCache": ".model",
    "evaluate": ".evaluation",
    "segment_losses": ".evaluation",
    "generate": ".inference",
    "stream": ".inference",
    "SamplingParams": ".inference",
    "DecodeSettings": ".inference",
    "Engine": ".inference",
    "Step": ".inference",
    "interop": ".interop",
    "configure_threads": ".threads",
}

__all__ = [  # the names of _EXPORTS (a literal list, for linters and type checkers)
    "TransformerXLConfig",
    "DataConfig",
    "TrainConfig",
    "EvalConfig",
    "GenerateConfig",
    "RunConfig",
    "Span",
    "ConfigError",
    "load_config",
    "TransformerXL",
    "ModelOutput",
    "Memory",
    "update_memory",
    "KVCache",
    "evaluate",
    "segment_losses",
    "generate",
    "stream",
    "SamplingParams",
    "DecodeSettings",
    "Engine",
    "Step",
    "interop",
    "configure_threads",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use and keep it in the module's namespace; a subpackage or module
    (``txl.model``, ``txl.evaluation``) is imported on first use too, as ``import txl`` once made them
    reachable."""
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
