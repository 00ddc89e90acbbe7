"""The vanilla baseline of the paper as a recipe on a run config, written once: every analysis and command
that pits the Transformer-XL against the vanilla Transformer derives the second config with
:func:`vanilla_baseline`."""

from __future__ import annotations

import dataclasses

from ..config import RunConfig

__all__ = ["vanilla_baseline"]


def vanilla_baseline(config: RunConfig) -> RunConfig:
    """The paper's vanilla Transformer for a Transformer-XL run config.

    Same sizes, data, steps, optimiser and seed; ``attention="absolute"`` (sinusoidal positions added to
    the input, standard causal attention) and no memory. Its evaluation uses disjoint segments of the length
    it was trained with (``eval.tgt_len = train.tgt_len``, no memory, clamp or same-length setting): with
    absolute positions, a longer segment would show it positions it never saw in training."""
    model = dataclasses.replace(
        config.model, attention="absolute", mem_len=0, clamp_len=None, same_length=False
    )
    evaluation = dataclasses.replace(
        config.eval, tgt_len=config.train.tgt_len, mem_len=None, clamp_len=None, same_length=None
    )
    return dataclasses.replace(config, model=model, eval=evaluation)
