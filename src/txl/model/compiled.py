"""A one-position decoding step compiled ahead of time: the step of :class:`~txl.model.decode.Decoder` as one
pure function of static shapes, compiled to C++ by AOTInductor, cached on disk, called from the decoder."""

# What this room owns: the one-position step (``Decoder.step``'s maths) written as a pure function of
# tensors whose shapes never change from one token to the next, so that it compiles once per set of sizes;
# the compiled artifact's cache (in this process and on disk); and the one warning when no compiler runs.
# The plain step stays in ``decode.py`` (readable against the paper); this one is tested against it.
#
# Dimensions (the legend of ``model/``): B batch, S slots of a cache buffer, R distances in a decoding table,
# L layers, H heads, Dh head size, D model size, V vocabulary.
#
# Static shapes: the step attends every slot of the cache's buffers (S, fixed when the cache is built) and
# masks those out of view (before the first slot in view, before the row's document, at and after the new
# position), and reads each slot's distance from the decoding table by a gather; the new position's key and
# value enter as an extra key, and the function returns them (with the layers' inputs) for the decoder to
# write into the cache (one copy each), so nothing is written inside it. The slot numbers arrive as a small
# int64 tensor (B-independent) that shares memory with a NumPy array: the decoder writes them without a
# tensor operation.
#
# Why AOTInductor: measured on 2 CPU cores (benchmarks/decode_floor.py), ``torch.compile`` of the same
# function was no faster than the eager step at batch 1 (its guards and Python wrapper cost about what the
# fusion saves), while AOTInductor's C++ package, with its matrix products as inductor's own C++ micro-kernels
# (max-autotune) and called through its own entry point (no pytree wrapper), is about 2x faster. The weights
# are inputs, so the package depends only on the sizes: compiled once (about a minute of CPU), kept on disk,
# loaded by a later process in a fraction of a second.

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .transformer import TransformerXL

if TYPE_CHECKING:
    from .cache import KVCache

__all__ = [
    "CompiledStep",
    "StepSizes",
    "COMPILED_DIR_VAR",
    "compiled_dir",
    "compiled_step",
    "embedder",
    "step_function",
    "unsupported",
]

COMPILED_DIR_VAR = "TXL_COMPILED_DIR"
"""The environment variable naming the folder of compiled steps (default: ``compiled`` in txl's cache
folder, ``$XDG_CACHE_HOME/txl`` or ``~/.cache/txl``)."""

_WEIGHTS_PER_LAYER = 13

_INDUCTOR = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
"""AOTInductor's settings: the matrix products as inductor's own C++ micro-kernels where they measure faster
than ATen's (every one at these sizes, one row at a time)."""


class StepSizes(NamedTuple):
    """What a compiled step is compiled for: the model's sizes and variants, and the cache's rows, slots and
    distances. Two decoders with equal sizes share one compiled step."""

    n_layer: int
    n_head: int
    d_head: int
    d_model: int
    d_inner: int
    vocab_size: int
    pre_norm: bool
    final_norm: bool
    plain_output: bool
    """A plain softmax, computed inside the step (False: the step returns the final hidden states)."""
    eps: float
    emb_scale: float
    batch_size: int
    slots: int
    distances: int


def unsupported(model: nn.Module, cache: KVCache) -> str | None:
    """Why ``model`` and ``cache`` cannot use a compiled step (None: they can). It needs a
    :class:`~txl.model.TransformerXL` in eval mode, on the CPU, in float32, with relative attention."""
    if not isinstance(model, TransformerXL):
        return f"the model is a {type(model).__name__}, not a TransformerXL"
    if model.training:
        return "the model is in training mode"
    if model.config.attention != "relative":
        return "the model has absolute attention"
    param = model.u
    if param.device.type != "cpu" or cache.device.type != "cpu":
        return "the compiled step runs on the CPU only"
    if param.dtype != torch.float32 or cache.dtype != torch.float32:
        return "the compiled step runs in float32 only"
    return None


def embedder(model: TransformerXL) -> Callable[[Tensor], Tensor]:
    """Tokens (B,) -> their embeddings (B, D), as ``model.embedding``: a single table without projection read
    directly (the module's own call costs more than its two operations), anything else through the module."""
    embedding = model.embedding
    if len(embedding.emb_layers) == 1 and not embedding.emb_projs:
        table, scale = cast(Tensor, embedding.emb_layers[0].weight), embedding.scale
        return lambda token: F.embedding(token, table) * scale
    return lambda token: embedding(token[:, None])[:, 0]


def step_function(sizes: StepSizes) -> Callable[..., tuple[Tensor, Tensor, Tensor]]:
    """The pure one-position step for ``sizes``:

    ``step(x, where, seen, kv, hidden, *weights) -> (out, new_kv, inputs)``, with x (B, D) the embedded
    tokens; where (2,) int64, the slot of the new position and the first slot in view; seen (B,) int64, how
    many of the last remembered positions each row may attend (its document's); kv (L, 2, B, H, S, Dh) and
    hidden (L, B, S, D) the cache's buffers (read only); weights as :func:`~txl.model.decode.step_weights`. Returns the
    log-probabilities (B, V) (or the final hidden states (B, D) without a plain softmax), the new position's
    keys and values (L, 2, B, H, Dh) and every layer's input (L, B, D), which the caller writes at the slot.

    The maths of :func:`~txl.model.decode.attention_step` and :func:`~txl.model.decode.layer_step` over all
    S slots, those out of view masked with -inf (they weigh exactly 0)."""
    s = sizes
    b, h, dh, d, n_layer = s.batch_size, s.n_head, s.d_head, s.d_model, s.n_layer
    scale, eps, r = s.d_head**-0.5, s.eps, s.distances

    def step(x: Tensor, where: Tensor, seen: Tensor, kv: Tensor, hidden: Tensor, *weights: Tensor) -> Any:
        end, first = where[0], where[1]
        slots = torch.arange(s.slots, device=x.device)  # (S,)
        column = (r - 1 - (end - slots)).clamp(0, r - 1)  # (S,): each slot's distance in the table
        lowest = torch.maximum(first, end - seen)  # (B,)
        in_view = (slots >= lowest[:, None]) & (slots < end)  # (B, S)
        bias = torch.where(in_view, 0.0, float("-inf"))[:, None, :]  # (B, 1, S)
        inputs, new = [], []
        for layer in range(n_layer):
            w = weights[_WEIGHTS_PER_LAYER * layer : _WEIGHTS_PER_LAYER * (layer + 1)]
            q_bias, v_minus_u, qkv_t, out_t, rel, w1_t, b1, w2_t, b2, an_w, an_b, fn_w, fn_b = w
            inputs.append(x)
            a = F.layer_norm(x, (d,), an_w, an_b, eps) if s.pre_norm else x
            qkv = torch.addmm(q_bias, a, qkv_t).view(b, 3, h, dh)  # (B, 3, H, Dh): q + u | k | v
            q_u, k, v = qkv.unbind(1)  # (B, H, Dh) each
            new.append(qkv[:, 1:])  # (B, 2, H, Dh)
            position = torch.einsum("bhd,hdr->bhr", q_u + v_minus_u, rel)  # (B, H, R): terms (b) + (d)
            content = torch.einsum("bhd,bhsd->bhs", q_u, kv[layer, 0])  # (B, H, S): terms (a) + (c)
            remembered = content + position[..., column] + bias  # (B, H, S)
            itself = (q_u * k).sum(-1, keepdim=True) + position[..., r - 1 :]  # (B, H, 1): distance 0
            p = torch.softmax(torch.cat([remembered, itself], dim=-1) * scale, dim=-1)  # (B, H, S + 1)
            attn = torch.einsum("bhs,bhsd->bhd", p[..., :-1], kv[layer, 1]) + p[..., -1:] * v  # (B, H, Dh)
            y = torch.addmm(x, attn.reshape(b, h * dh), out_t)  # (B, D)
            if s.pre_norm:
                ff = torch.addmm(b1, F.layer_norm(y, (d,), fn_w, fn_b, eps), w1_t).relu()  # (B, F)
                x = y + torch.addmm(b2, ff, w2_t)
            else:
                y = F.layer_norm(y, (d,), an_w, an_b, eps)
                ff = torch.addmm(b1, y, w1_t).relu()  # (B, F)
                x = F.layer_norm(y + torch.addmm(b2, ff, w2_t), (d,), fn_w, fn_b, eps)
        rest = weights[_WEIGHTS_PER_LAYER * n_layer :]
        if s.final_norm:
            x = F.layer_norm(x, (d,), rest[0], rest[1], eps)
            rest = rest[2:]
        out = torch.log_softmax(torch.addmm(rest[1], x, rest[0]), dim=-1) if s.plain_output else x
        return (
            out,
            torch.stack(new).transpose(1, 2),
            torch.stack(inputs),
        )  # (B, V), (L, 2, B, H, Dh), (L, B, D)

    return step


class _Step(nn.Module):
    """The step function as a module, for ``torch.export``."""

    def __init__(self, sizes: StepSizes) -> None:
        super().__init__()
        self.fn = step_function(sizes)

    def forward(self, *args: Tensor) -> Any:
        return self.fn(*args)


class CompiledStep:
    """A compiled one-position step for one :class:`StepSizes` and one model's weights, with its own slot
    numbers: write them into :attr:`slots`, then call it with the embedded tokens, the rows' reach and the
    cache's buffers. A decoder holds one per cache; steps of equal sizes share the loaded package."""

    def __init__(self, sizes: StepSizes, run: Callable[[list[Tensor]], list[Tensor]], weights: list[Tensor]):
        self.sizes = sizes
        self.run = run
        """The package's own entry point (flat inputs in the exported order, flat outputs back), without the
        pytree wrapper of its Python object (tens of microseconds a call)."""
        self.weights = weights
        """The weights (:func:`step_weights`)."""
        self.slots = np.zeros(2, dtype=np.int64)
        """The slot of the new position and the first slot in view (written by the caller)."""
        self.where = torch.from_numpy(self.slots)  # (2,), the same memory as ``slots``

    def __call__(self, x: Tensor, seen: Tensor, kv: Tensor, hidden: Tensor) -> Any:
        """``(out, new_kv, inputs)`` of :func:`step_function` at the slots in :attr:`slots`."""
        return self.run([x, self.where, seen, kv, hidden, *self.weights])


def compiled_dir() -> Path:
    """The folder of compiled steps: ``$TXL_COMPILED_DIR``, else ``compiled`` in txl's cache folder."""
    given = os.environ.get(COMPILED_DIR_VAR)
    if given:
        return Path(given).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "txl" / "compiled"


@functools.cache
def _code_digest() -> str:
    """A digest of the code a package is compiled from, read once (the source as it was imported)."""
    code = "".join(inspect.getsource(part) for part in (step_function, _Step, _example))
    return hashlib.sha256(code.encode()).hexdigest()


def _package_name(sizes: StepSizes) -> str:
    """The package's file name: a digest of the sizes, torch's version and the code it is compiled from (a
    package compiled from other code is never loaded)."""
    key = json.dumps([list(sizes), sizes._fields, torch.__version__, _code_digest(), _INDUCTOR])
    return "step-" + hashlib.sha256(key.encode()).hexdigest()[:24] + ".pt2"


_LOADED: dict[StepSizes, Callable[[list[Tensor]], list[Tensor]]] = {}
"""Compiled steps loaded in this process, by sizes."""
_LOCK = threading.Lock()
_WARNED: set[str] = set()


def _example(sizes: StepSizes) -> tuple[Tensor, ...]:
    """Inputs and weights of the sizes' shapes (zeros, distinct tensors), to export the step with."""
    s = sizes
    b, h, dh, d, f = s.batch_size, s.n_head, s.d_head, s.d_model, s.d_inner
    weights: list[Tensor] = []
    for _ in range(s.n_layer):  # distinct tensors: the export would take one tensor given twice as one input
        weights += [torch.zeros(3 * h * dh), torch.zeros(h, dh), torch.zeros(d, 3 * h * dh)]
        weights += [torch.zeros(h * dh, d), torch.zeros(h, dh, s.distances), torch.zeros(d, f)]
        weights += [torch.zeros(f), torch.zeros(f, d), *[torch.zeros(d) for _ in range(5)]]
    if s.final_norm:
        weights += [torch.ones(d), torch.zeros(d)]
    if s.plain_output:
        weights += [torch.zeros(d, s.vocab_size), torch.zeros(s.vocab_size)]
    return (
        torch.zeros(b, d),
        torch.tensor([0, 0]),
        torch.zeros(b, dtype=torch.int64),
        torch.zeros(s.n_layer, 2, b, h, s.slots, dh),
        torch.zeros(s.n_layer, b, s.slots, d),
        *weights,
    )


def _compile(sizes: StepSizes, path: Path) -> None:
    """Export the step for ``sizes`` and compile it into the package ``path`` (written under a temporary
    name, then renamed: a reader never sees half a package)."""
    import torch._inductor

    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.stem}.{os.getpid()}.tmp.pt2")
    with torch.no_grad():
        exported = torch.export.export(_Step(sizes), _example(sizes), strict=False)
        torch._inductor.aoti_compile_and_package(
            exported, package_path=str(temporary), inductor_configs=_INDUCTOR
        )
    os.replace(temporary, path)


def compiled_step(sizes: StepSizes, weights: list[Tensor]) -> CompiledStep | None:
    """The compiled step for ``sizes`` and ``weights`` (:func:`step_weights`): loaded in this process already, else from the folder of compiled steps
    (:func:`compiled_dir`), else compiled into it (about a minute of CPU) and loaded. None, with one warning
    per process, where it cannot be compiled (no C++ compiler, an unsupported platform): the caller steps
    eagerly."""
    with _LOCK:
        run = _LOADED.get(sizes)
        if run is None:
            try:
                path = compiled_dir() / _package_name(sizes)
                if not path.exists():
                    _compile(sizes, path)
                # the package's loader itself: loading through torch._inductor would import it (seconds)
                loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
            except Exception as error:  # a missing compiler, a failed build: decode eagerly instead
                reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error) else ''}"
                if "compile" not in _WARNED:
                    _WARNED.add("compile")
                    warnings.warn(
                        f"the compiled decoding step is not available ({reason}); decoding with the eager step",
                        RuntimeWarning,
                        stacklevel=3,
                    )
                return None
            run = _LOADED[sizes] = loader.boxed_run
    return CompiledStep(sizes, run, weights)
