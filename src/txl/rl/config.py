"""The settings of the agents' memory core (:class:`CoreConfig`), and the one mapping of them onto the settings
of :mod:`txl.model`'s layer stack (:class:`~txl.config.StackConfig`) that the core's layers are built from."""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

from ..config import ConfigError, Span, StackConfig

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
        # the layer fields (n_layer ... d_inner, dropout) are checked as the stack's, mem_len as the span's
        _ = self.stack, self.span
        if self.gating not in typing.get_args(Gating):
            choices = ", ".join(map(repr, typing.get_args(Gating)))
            raise ConfigError(f"gating: must be one of {choices}, got {self.gating!r}")

    @property
    def stack(self) -> StackConfig:
        """The settings :mod:`txl.model`'s layer stack is built from: relative attention, pre-norm (GTrXL's
        identity-map reordering), no attention dropout."""
        return StackConfig(
            n_layer=self.n_layer,
            n_head=self.n_head,
            d_head=self.d_head,
            d_model=self.d_model,
            d_inner=self.d_inner,
            dropout=self.dropout,
            dropatt=0.0,
            attention="relative",
            pre_norm=True,
        )

    @property
    def span(self) -> Span:
        """The lengths the core's stack runs with: a memory of ``mem_len`` steps, no clamp (which steps a
        query sees is the core's rule, :class:`~txl.rl.core.CoreStack`)."""
        return Span(mem_len=self.mem_len)
