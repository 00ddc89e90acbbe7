"""txl: Transformer-XL language modelling, correct to the paper.

import torch, txl
model = txl.TransformerXL(txl.TransformerXLConfig(vocab_size=256))
out = model(tokens, targets=targets)             # out.loss (B, T), out.memory
out = model(next_tokens, memory=out.memory, targets=next_targets)

The names below are imported when first used (PEP 562), so ``import txl`` does not import torch: txl's entry
points choose the thread policy (:mod:`txl.threads`) before torch starts its thread pool. ``txl.generate``,
``txl.stream``, ``txl.GenerationSettings`` and ``txl.Step`` are the decoding core's (:mod:`txl.inference`):

settings = txl.GenerationSettings(max_new_tokens=50, temperature=0.8, top_p=0.9, seed=0)
gen = txl.generate(model, prompt, settings)      # gen.new_tokens (B, N), gen.memory
for step in txl.stream(model, prompt, settings): # step.tokens (B,), step.log_probs (B, V)
    ...

``txl.evaluate`` and ``txl.interop`` are modules (``txl.evaluate.evaluate(...)``, ``txl.interop.load_hf(folder)``).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

from ._version import installed_version

if TYPE_CHECKING:
    from . import evaluate, interop
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
    from .evaluate import segment_losses
    from .inference import GenerationSettings, Step, generate, stream
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
    "evaluate": ".evaluate",
    "segment_losses": ".evaluate",
    "generate": ".inference",
    "stream": ".inference",
    "GenerationSettings": ".inference",
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
    "GenerationSettings",
    "Step",
    "interop",
    "configure_threads",
]


def __getattr__(name: str) -> Any:
    """Import a public name on first use and keep it in the module's namespace; a subpackage or module
    (``txl.model``, ``txl.evaluate``) is imported on first use too, as ``import txl`` once made them
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
