"""txl.analysis: checks of the paper's claims on your own data, one module per analysis, each a pure
library function returning a result with its JSON (``as_dict``), table and figures; the ``txl compare``
and ``txl analyze`` commands are thin wrappers.

    compare       Transformer-XL vs the vanilla baseline: loss, perplexity, throughput, samples, curves
    memory        loss of one Transformer-XL against its evaluation memory
    speed         per-token evaluation time, vanilla sliding window vs XL memory (the paper's Table 9)
    recl          relative effective context length of a group of models
    recall        exact recall D positions back on a generated task: XL near 100%, vanilla at chance
    attention     attention probability by distance and memory share, per layer
    documents     loss reading across documents or starting each anew, and by position in a document

Shared: :mod:`.context` (per-token losses with a
controlled context: streams with memory, sliding windows), :mod:`.report` (results.json, tables, PNGs).
"""

from .attention import AttentionResult, analyze_attention, attention_statistics
from .compare import CompareResult, compare
from .context import sliding_losses, sliding_predictions, stream_losses, stream_predictions
from .documents import DocumentsResult, analyze_documents
from .memory import MemoryResult, analyze_memory, memory_sweep
from .recall import RecallResult, recall_config, recall_task
from .recl import ReclResult, analyze_recl, recl_from_gains, relative_gains
from .report import PlotsUnavailable, write_report
from .speed import SpeedResult, speed_benchmark

__all__ = [
    "compare",
    "CompareResult",
    "analyze_memory",
    "memory_sweep",
    "MemoryResult",
    "speed_benchmark",
    "SpeedResult",
    "analyze_recl",
    "relative_gains",
    "recl_from_gains",
    "ReclResult",
    "recall_task",
    "recall_config",
    "RecallResult",
    "analyze_attention",
    "attention_statistics",
    "AttentionResult",
    "analyze_documents",
    "DocumentsResult",
    "stream_losses",
    "stream_predictions",
    "sliding_losses",
    "sliding_predictions",
    "write_report",
    "PlotsUnavailable",
]
