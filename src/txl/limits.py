"""Sizes that cannot fit: lower bounds of the bytes a memory, segment, batch or generation length makes txl
allocate, against the memory available on the device, refused before allocating with the setting named.
Dimensions: N layers, B batch, T segment, M memory, H heads, Dh head size, D model size.
"""

from __future__ import annotations

import torch

from .config import TransformerXLConfig, cache_slots
from .errors import SizeError

__all__ = [
    "available_bytes",
    "cache_bytes",
    "segment_bytes",
    "check_fits",
    "human_bytes",
    "TOKEN_BYTES",
]

TOKEN_BYTES = 8
"""Bytes kept per generated token at the least (an int64 id, or one pointer to its text)."""


def available_bytes(device: torch.device | str = "cpu") -> int | None:
    """The memory free for new buffers on ``device``: the free memory of a CUDA device, else the
    ``MemAvailable`` of ``/proc/meminfo``; None where it cannot be known (then nothing is refused)."""
    device = torch.device(device)
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file counts kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def cache_bytes(config: TransformerXLConfig, *, batch: int, mem_len: int, dtype_bytes: int = 4) -> int:
    """The key/value cache of ``mem_len`` positions (:class:`txl.model.KVCache`): per layer the hidden
    states (B, C, D) and the keys and values (2, B, H, C, Dh), C slots for M positions and room to slide."""
    capacity = cache_slots(mem_len)
    per_slot = config.d_model + 2 * config.n_head * config.d_head
    return config.n_layer * batch * capacity * per_slot * dtype_bytes


def segment_bytes(
    config: TransformerXLConfig,
    *,
    batch: int,
    tgt_len: int,
    mem_len: int,
    dtype_bytes: int = 4,
    training: bool = False,
) -> int:
    """One segment of ``tgt_len`` after a memory of ``mem_len``: the memory (N, B, M, D) and the attention
    probabilities (B, H, T, K) of one layer, or of all N layers when ``training`` (backward keeps them)."""
    scores = batch * config.n_head * tgt_len * (mem_len + tgt_len)
    memory = config.n_layer * batch * mem_len * config.d_model
    return (memory + scores * (config.n_layer if training else 1)) * dtype_bytes


def human_bytes(n: int | float) -> str:
    """``1536`` -> ``'1.5 KiB'``; bytes in powers of 1024, three significant figures."""
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def check_fits(
    need: int,
    *,
    setting: str,
    what: str,
    lower: str,
    device: torch.device | str = "cpu",
    fields: tuple[str, ...] = (),
) -> None:
    """Refuse ``setting`` (``"mem_len 100000000"``) when ``need`` bytes (of ``what``, the buffers it
    sizes) exceed the memory available on ``device``: a :class:`~txl.errors.SizeError` that names the
    setting, the bytes needed and available, and what to ``lower``; ``fields`` are the settings fields
    these name (:attr:`txl.errors.TxlError.fields`). Nothing is refused where the available memory cannot be
    known."""
    free = available_bytes(device)
    if free is None or need <= free:
        return
    raise SizeError(
        f"{setting}: {what} would need at least {human_bytes(need)}, and {human_bytes(free)} is available "
        f"on {torch.device(device)}; lower {lower}",
        fields=fields,
    )
