"""The memory core's step compiled by ``torch.compile`` (inductor's C++ kernels on the CPU): chosen by
``CoreConfig.compiled``, compiled on the first step, and the eager step (with one warning) where no compiler
runs. The core's maths stays in ``core.py``; this room only holds the compiled function."""

# A step of E environments is one pure function of tensors of fixed shapes (the observations, the state's
# memory of M slots and its reach, the episode starts), so it compiles to one graph, fullgraph, with static
# shapes: a different number of environments compiles once more. Measured with benchmarks/decode_floor.py.
# Inductor keeps what it compiled on disk (its FX graph cache): a later process with the same shapes compiles
# in seconds rather than the better part of a minute.

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["CompiledRun"]

_WARNED: set[str] = set()


class CompiledRun:
    """``fn`` compiled by ``torch.compile(fn, dynamic=False, fullgraph=True)`` on its first call, called in its
    place; where compiling fails (no C++ compiler, an unsupported platform) ``fn`` itself, from then on, with
    one warning per process. An error after a compiled call went through is raised as it is."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        self.compiled: Callable[..., Any] | None = torch.compile(fn, dynamic=False, fullgraph=True)
        """The compiled function (None: compiling failed, ``fn`` runs)."""
        self.ran = False
        """Whether a compiled call went through."""

    def __call__(self, *args: Any) -> Any:
        if self.compiled is None:
            return self.fn(*args)
        if self.ran:
            return self.compiled(*args)
        try:
            out = self.compiled(*args)
        except Exception as error:  # a missing compiler, a failed build: run eagerly instead
            self.compiled = None
            if "compile" not in _WARNED:
                _WARNED.add("compile")
                first = str(error).strip().splitlines()[0] if str(error).strip() else ""
                warnings.warn(
                    f"the compiled core step is not available ({type(error).__name__}: {first}); stepping "
                    "with the eager step",
                    RuntimeWarning,
                    stacklevel=3,
                )
            return self.fn(*args)
        self.ran = True
        return out
