"""The Transformer-XL model: configuration lives in txl.config, the pieces here."""

from .attention import AbsoluteMultiHeadAttention, RelativeMultiHeadAttention, rel_shift
from .cache import KVCache
from .memory import Memory, update_memory
from .transformer import ModelOutput, TransformerXL, attention_mask

__all__ = [
    "TransformerXL",
    "ModelOutput",
    "Memory",
    "KVCache",
    "update_memory",
    "rel_shift",
    "attention_mask",
    "RelativeMultiHeadAttention",
    "AbsoluteMultiHeadAttention",
]
