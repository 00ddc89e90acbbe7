"""The vanilla baseline of the paper, :func:`txl.config.vanilla_baseline` (the recipe lives next to the
config it rewrites); re-exported here for the analyses that import it from this module."""

from __future__ import annotations

from ..config import vanilla_baseline

__all__ = ["vanilla_baseline"]
