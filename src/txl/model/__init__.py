"""The Transformer-XL model: configuration lives in txl.config, the pieces here."""

# One dimension legend for every module of ``model/`` (each letter means one thing):
#
#     B batch rows                T new positions (queries, the segment)   M remembered positions (memory)
#     K keys in view (M + T)      P remembered positions not yet projected (a cache built from a memory)
#     L layers                    H heads          Dh head size            D model size
#     F feed-forward inner size   E embedding size (E_i of cluster i)      V vocabulary (V_i of cluster i)
#     N rows (flattened positions, B*T)           C classes per block of the fused loss
#     S slots of a cache buffer   R distances in a decoding table           J column blocks of width W

from .attention import AbsoluteMultiHeadAttention, RelativeMultiHeadAttention, rel_shift
from .cache import KVCache
from .layers import DecoderLayer
from .memory import Memory, update_memory
from .transformer import LayerStack, ModelOutput, TransformerXL, attention_mask, eval_mode

__all__ = [
    "TransformerXL",
    "LayerStack",
    "DecoderLayer",
    "ModelOutput",
    "Memory",
    "KVCache",
    "update_memory",
    "rel_shift",
    "attention_mask",
    "eval_mode",
    "RelativeMultiHeadAttention",
    "AbsoluteMultiHeadAttention",
]
