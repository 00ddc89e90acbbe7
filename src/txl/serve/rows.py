"""The rows ``txl serve`` decodes at once: R rows that requests join and leave between steps. ``CacheRows``
holds them in one key/value cache (Transformer-XL with memory), ``WindowRows`` as token windows recomputed at
every step (models without memory). Both: ``prefill`` a prompt alone, ``join`` it into a free row, ``step``
every row at once, ``free`` a row, ``row_memory``.

Dimensions: R rows, V vocabulary, P prompt tokens, C window (context) of a model without memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import Span
from ..generate import DEFAULT_CONTEXT
from ..model import KVCache, Memory
from ..model.decode import Decoder, bind_memory

__all__ = ["Prefilled", "CacheRows", "WindowRows", "make_rows"]


@dataclass(frozen=True)
class Prefilled:
    """A prompt read alone, ready to join a row: its batch-1 cache (or window of tokens) and the next token's
    log-probabilities (1, V)."""

    log_probs: Tensor
    cache: KVCache | None = None
    window: Tensor | None = None  # (P,) the last C tokens, models without memory


class CacheRows:
    """R rows of one key/value cache; a free row steps a dummy token that nothing attends."""

    def __init__(self, model: nn.Module, *, rows: int, span: Span) -> None:
        param = next(model.parameters())
        self.model, self.span, self.size = model, span, rows
        self.device, self.dtype = param.device, param.dtype
        zeros = Memory.zeros(model.config, rows, span.mem_len, dtype=self.dtype, device=self.device)
        self.cache = KVCache(model.config, span=span, memory=zeros)
        bind_memory(model, self.cache)
        self.decoder = Decoder(model, self.cache)

    def prefill(self, prompt: Tensor, memory: Memory | None = None) -> Prefilled:
        """Read ``prompt`` (P,) after ``memory`` (batch 1) in chunks of the memory length, as generation does."""
        cache = KVCache(
            self.model.config,
            batch_size=1,
            span=self.span,
            memory=memory,
            dtype=self.dtype,
            device=self.device,
        )
        log_probs = Decoder(self.model, cache).prefill(prompt.to(self.device)[None], chunk=self.span.mem_len)
        return Prefilled(log_probs=log_probs, cache=cache)  # (1, V)

    def join(self, r: int, prefilled: Prefilled) -> None:
        assert prefilled.cache is not None
        self.cache.put_rows([r], prefilled.cache)

    def step(self, tokens: Tensor) -> Tensor:
        """(R,) tokens -> (R, V) log-probabilities of the next ones."""
        return self.decoder.step(tokens.to(self.device))

    def free(self, r: int) -> None:
        self.cache.reset_rows([r])

    def row_memory(self, r: int) -> Memory | None:
        """Row ``r``'s own remembered positions (those within its reach) as a batch-1 memory."""
        cache = self.cache
        reach = int(cache.full_reach()[r])
        if reach == 0:
            return None
        index = torch.tensor([r], device=cache.device)
        states = (
            cache.hidden[i, index, cache.end - reach : cache.end].clone() for i in range(len(cache.layers))
        )
        return Memory(tuple(states))


class WindowRows:
    """R rows of a model without memory: each row's last C tokens, recomputed at every step (the rows in use
    left-padded to the longest, each starting at its own first token)."""

    def __init__(self, model: nn.Module, *, rows: int, span: Span, context: int = DEFAULT_CONTEXT) -> None:
        self.model, self.span, self.size, self.context = model, span, rows, context
        self.device = next(model.parameters()).device
        self.windows: list[Tensor | None] = [None] * rows

    def _next(self, windows: list[Tensor]) -> Tensor:
        width = max(len(w) for w in windows)
        tokens = torch.zeros(len(windows), width, dtype=torch.long, device=self.device)  # (B, W)
        starts = torch.zeros(len(windows), width, dtype=torch.bool, device=self.device)
        for b, w in enumerate(windows):
            tokens[b, width - len(w) :] = w
            starts[b, width - len(w)] = True
        out = self.model(tokens, span=self.span, last_only=True, starts=starts)
        return out.log_probs[:, -1]  # (B, V)

    def prefill(self, prompt: Tensor, memory: Memory | None = None) -> Prefilled:
        if memory is not None:
            raise ValueError("a model without memory takes no memory")
        window = prompt.to(self.device)[-self.context :]
        return Prefilled(log_probs=self._next([window]), window=window)

    def join(self, r: int, prefilled: Prefilled) -> None:
        self.windows[r] = prefilled.window

    def step(self, tokens: Tensor) -> Tensor:
        used = [r for r, w in enumerate(self.windows) if w is not None]
        for r in used:
            window = self.windows[r]
            assert window is not None
            self.windows[r] = torch.cat([window, tokens[r : r + 1].to(self.device)])[-self.context :]
        log_probs = self._next([w for w in self.windows if w is not None]) if used else None
        out = torch.zeros(self.size, len_vocab(self.model), device=self.device)  # (R, V)
        if log_probs is not None:
            out[used] = log_probs.to(out.dtype)
        return out

    def free(self, r: int) -> None:
        self.windows[r] = None

    def row_memory(self, r: int) -> Memory | None:
        return None


def len_vocab(model: nn.Module) -> int:
    return int(model.config.vocab_size)


def make_rows(model: nn.Module, *, rows: int, span: Span) -> CacheRows | WindowRows:
    """The rows for ``model``: one cache with memory, token windows without."""
    if model.config.attention == "relative" and span.mem_len > 0:
        return CacheRows(model, rows=rows, span=span)
    return WindowRows(model, rows=rows, span=span)
