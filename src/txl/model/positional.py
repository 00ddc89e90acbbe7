"""Sinusoidal position embeddings: the relative distance table R of Transformer-XL and the absolute
table of the vanilla baseline. Owns nothing learned; the model passes in sizes and clamp_len."""

# Dimensions: K keys (memory + current), D model size.

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["inverse_frequencies", "sinusoid", "relative_distances"]


def inverse_frequencies(
    d_model: int, *, device: torch.device | None = None, dtype: torch.dtype = torch.float64
) -> Tensor:
    """1 / 10000^(2i/D) for i in [0, D/2): the frequencies of the sinusoid, shape (D/2,)."""
    return 1.0 / (
        10000 ** (torch.arange(0.0, d_model, 2.0, device=device, dtype=torch.float64) / d_model)
    ).to(dtype)


def sinusoid(positions: Tensor, d_model: int, *, dtype: torch.dtype) -> Tensor:
    """[sin(p f) | cos(p f)] for each position p: (K,) -> (K, D), the halves concatenated as the original.
    Angles are computed in float64 (exact for any realistic position) and then cast to ``dtype``."""
    freqs = inverse_frequencies(d_model, device=positions.device)  # (D/2,)
    angles = torch.outer(positions.to(torch.float64), freqs)  # (K, D/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)  # (K, D)


def relative_distances(klen: int, *, clamp_len: int | None, device: torch.device | None = None) -> Tensor:
    """Distances K-1, K-2, ..., 0 in descending order (key j of the last query is at distance K-1-j),
    clamped at clamp_len: shape (K,)."""
    distances = torch.arange(klen - 1, -1, -1, device=device)
    if clamp_len is not None:
        distances = distances.clamp(max=clamp_len)
    return distances
