"""txl.analysis: checks of the paper's claims on your own data, one module per analysis, each a library
function taking a frozen settings value and returning a result with its JSON, table and figures.
"""

from .attention import AttentionResult, AttentionSettings, analyze_attention, attention_statistics
from .compare import CompareResult, CompareSettings, compare
from .context import (
    WindowSettings,
    sliding_losses,
    sliding_predictions,
    stream_losses,
    stream_predictions,
)
from .documents import DocumentsResult, DocumentsSettings, analyze_documents
from .memory import MemoryResult, MemorySettings, SweepSettings, analyze_memory, memory_sweep
from .recall import RecallResult, RecallSettings, recall_config, recall_task
from .recl import ReclResult, ReclSettings, analyze_recl, recl_from_gains, relative_gains
from .report import PlotsUnavailable, write_report
from .speed import SpeedResult, SpeedSettings, speed_benchmark

__all__ = [
    "compare",
    "CompareResult",
    "CompareSettings",
    "analyze_memory",
    "memory_sweep",
    "MemoryResult",
    "MemorySettings",
    "SweepSettings",
    "speed_benchmark",
    "SpeedResult",
    "SpeedSettings",
    "analyze_recl",
    "relative_gains",
    "recl_from_gains",
    "ReclResult",
    "ReclSettings",
    "recall_task",
    "recall_config",
    "RecallResult",
    "RecallSettings",
    "analyze_attention",
    "attention_statistics",
    "AttentionResult",
    "AttentionSettings",
    "analyze_documents",
    "DocumentsResult",
    "DocumentsSettings",
    "stream_losses",
    "stream_predictions",
    "sliding_losses",
    "sliding_predictions",
    "WindowSettings",
    "write_report",
    "PlotsUnavailable",
]
