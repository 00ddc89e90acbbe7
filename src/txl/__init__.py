"""txl: Transformer-XL language modelling, correct to the paper.

import torch, txl
model = txl.TransformerXL(txl.TransformerXLConfig(vocab_size=256))
out = model(tokens, targets=targets)             # out.loss (B, T), out.memory
out = model(next_tokens, memory=out.memory, targets=next_targets)
"""

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
from .model import Memory, ModelOutput, TransformerXL, update_memory

__version__ = "0.1.0"

__all__ = [
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
    "interop",
]
