"""The settings of the agents' memory core (:class:`CoreConfig`), and the one mapping of them onto the layer
settings of :mod:`txl.model` that the core's layers are built from."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from ..config import TransformerXLConfig, _check, _non_negative_int, _one_of, _positive_int, _probability

__all__ = ["CoreConfig", "Gating"]

Gating = Literal["none", "gru"]
"""How a layer adds its attention and feed-forward outputs to its input: ``"none"``, the residual sums of a
pre-norm Transformer-XL layer; ``"gru"``, GTrXL's GRU-type gates in their place (Parisotto et al., 2019)."""


@dataclass(frozen=True)
class CoreConfig:
    """Sizes of :class:`~txl.rl.MemoryCore`: a Transformer-XL layer stack over projected observations.

    The defaults make a small core that runs a few thousand steps a second on one CPU thread."""

    n_layer: int = 2
    """Number of layers."""
    n_head: int = 2
    """Attention heads per layer (H)."""
    d_head: int = 16
    """Size of each head (Dh)."""
    d_model: int = 64
    """Size of the hidden states and of the features the core returns (D); even (sinusoidal positions)."""
    d_inner: int = 128
    """Inner size of each layer's feed-forward network (F)."""
    mem_len: int = 64
    """How many past steps each environment remembers (M): every query sees its own episode's last
    ``mem_len`` steps and itself. The memory has this fixed size from the first step on (unused slots are
    masked), so a step costs the same at step 100 and at step 10,000 of an episode."""
    gating: Gating = "gru"
    """``"gru"``: GTrXL layers (pre-norm, a GRU-type gate in place of each residual sum, starting near the
    identity); ``"none"``: pre-norm Transformer-XL layers with residual sums."""
    dropout: float = 0.0
    """Dropout on the hidden states and attention outputs while training (0 for PPO)."""

    def __post_init__(self) -> None:
        for name in ("n_layer", "n_head", "d_head", "d_model", "d_inner"):
            _positive_int(self, name)
        _check(
            self.d_model % 2 == 0, "d_model", f"must be even for the sinusoidal positions, got {self.d_model}"
        )
        _non_negative_int(self, "mem_len")
        _one_of(self, "gating", typing.get_args(Gating))
        _probability(self, "dropout")

    def layer_config(self) -> TransformerXLConfig:
        """The settings :mod:`txl.model`'s layers are built from: relative attention, pre-norm (GTrXL's
        identity-map reordering), no attention dropout; the vocabulary is unused."""
        return TransformerXLConfig(
            vocab_size=1,
            n_layer=self.n_layer,
            n_head=self.n_head,
            d_head=self.d_head,
            d_model=self.d_model,
            d_inner=self.d_inner,
            dropout=self.dropout,
            mem_len=self.mem_len,
            pre_norm=True,
            final_norm=True,
        )
