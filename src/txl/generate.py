"""Text generation: incremental sampling with the memory cache (Transformer-XL), or recomputation over a
sliding window (the vanilla baseline), and the pure sampling filters (temperature, top-k, top-p).

Dimensions: B batch, P prompt length, N new tokens, V vocabulary, M memory length, C context window.

The model and its memory are left to :mod:`txl.model`; vocabularies to :mod:`txl.data.vocab`.

    gen = generate(model, prompt, max_new_tokens=50, top_p=0.9, generator=torch.Generator().manual_seed(0))
    gen.new_tokens                                                   # (B, N)
    more = generate(model, gen.tokens[:, -1:], memory=gen.memory, max_new_tokens=50)   # continue
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import torch
from torch import Tensor, nn

from .config import Span
from .model import Memory

__all__ = ["Generation", "filter_logits", "sample_next", "generate", "generate_text", "UnknownTokensWarning",
           "DEFAULT_CONTEXT"]

DEFAULT_CONTEXT = 512
"""Window (tokens) recomputed at every step when the model has no memory and ``context`` is not given."""


# ---------------------------------------------------------------------------------------------------------
# Pure sampling helpers
# ---------------------------------------------------------------------------------------------------------


def _check_top_k(top_k: Any) -> None:
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ValueError(f"top_k must be a positive integer or None, got {top_k!r}")


def _check_top_p(top_p: Any) -> None:
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float))
                              or not 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p!r}")


def _check_temperature(temperature: Any) -> None:
    if (isinstance(temperature, bool) or not isinstance(temperature, (int, float))
            or not math.isfinite(temperature) or temperature < 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0 is greedy), got {temperature!r}")


def _ranks(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Sort descending with ties broken by the lower token id; returns (sorted values, rank of every entry)."""
    values, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # (..., V)
    return values, torch.argsort(order, dim=-1)  # (..., V) rank of each token id


def filter_logits(logits: Tensor, *, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """A copy of ``logits`` (..., V) with the entries outside the top-k and then outside the nucleus set to -inf.

    ``top_k`` keeps the k highest scores. ``top_p`` keeps the smallest set of most likely tokens whose
    probability (softmax of the top-k-filtered scores) reaches p, and always at least the most likely token.
    Ties are broken deterministically in favour of the lower token id. The input is not modified."""
    _check_top_k(top_k)
    _check_top_p(top_p)
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be (..., V) with V >= 1, got shape {tuple(logits.shape)}")
    out = logits.clone()
    if top_k is not None and top_k < out.shape[-1]:
        _, ranks = _ranks(out)
        out = out.masked_fill(ranks >= top_k, float("-inf"))
    if top_p is not None and top_p < 1:
        values, ranks = _ranks(out)
        probs = torch.softmax(values.float() if values.dtype in (torch.float16, torch.bfloat16) else values, dim=-1)
        mass = torch.cumsum(probs, dim=-1)  # (..., V)
        mass_before = torch.cat([torch.zeros_like(mass[..., :1]), mass[..., :-1]], dim=-1)  # better-ranked mass
        keep_sorted = mass_before < top_p  # rank 0 has mass_before 0 < p: always kept
        keep = torch.gather(keep_sorted, -1, ranks)  # (..., V) back to token order
        out = out.masked_fill(~keep, float("-inf"))
    return out


def sample_next(logits: Tensor, *, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, generator: torch.Generator | None = None) -> Tensor:
    """One token id per row (B,) int64 from next-token scores ``logits`` (B, V) (raw logits or log-probs).

    ``temperature`` 0 is greedy (argmax, the lower id on ties; top-k/top-p cannot change it). Otherwise the
    scores are divided by the temperature, filtered by :func:`filter_logits`, and one token is drawn with
    ``generator`` (the global generator when None)."""
    _check_temperature(temperature)
    _check_top_k(top_k)
    _check_top_p(top_p)
    if logits.dim() != 2 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be (batch, vocab), got shape {tuple(logits.shape)}")
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    if temperature == 0:
        return torch.argmax(logits, dim=-1)  # (B,)
    scores = filter_logits(logits / temperature, top_k=top_k, top_p=top_p)
    probs = torch.softmax(scores, dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


# ---------------------------------------------------------------------------------------------------------
# Generation with a model
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Generation:
    """What :func:`generate` returns."""

    tokens: Tensor
    """(B, P + N) the prompt followed by the new tokens."""
    new_tokens: Tensor
    """(B, N) the generated tokens only."""
    memory: Memory | None
    """Memory after the last token fed to the model, i.e. covering ``tokens[:, :-1]`` (the last sampled token
    has not been fed yet). Continue with ``generate(model, tokens[:, -1:], memory=memory, ...)``.
    None for models without memory (the vanilla baseline, mem_len = 0)."""


def _prepare_prompt(prompt: Tensor, *, vocab_size: int, device: torch.device) -> Tensor:
    """Validate and return the prompt as (B, P) int64 on ``device``."""
    if not isinstance(prompt, Tensor):
        raise ValueError(f"prompt must be a tensor of token ids, got {type(prompt).__name__}")
    if prompt.dtype == torch.bool or prompt.dtype.is_floating_point or prompt.dtype.is_complex:
        raise ValueError(f"prompt must hold integer token ids, got dtype {prompt.dtype}")
    if prompt.dim() == 1:
        prompt = prompt.unsqueeze(0)  # (1, P)
    if prompt.dim() != 2:
        raise ValueError(f"prompt must be (batch, time) or (time,), got shape {tuple(prompt.shape)}")
    if prompt.shape[0] == 0 or prompt.shape[1] == 0:
        raise ValueError(f"prompt is empty (shape {tuple(prompt.shape)}): give at least one token per row")
    low, high = int(prompt.min()), int(prompt.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise ValueError(f"prompt token id {bad} is out of range for vocab_size={vocab_size}")
    return prompt.to(device=device, dtype=torch.long)


def _model_device(model: nn.Module) -> torch.device:
    param = next(model.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def _feed_prompt(model: nn.Module, prompt: Tensor, *, memory: Memory | None, chunk: int | None,
                 span: Span) -> tuple[Tensor, Memory | None]:
    """Run the prompt (B, P) through the model in chunks, carrying memory; returns the last position's
    scores (B, V) and the memory after the prompt."""
    step = prompt.shape[1] if chunk is None else chunk
    for start in range(0, prompt.shape[1], step):
        out = model(prompt[:, start:start + step], memory=memory, span=span)
        memory = out.memory
    return out.logits[:, -1], memory  # (B, V)


def _generate_cached(model: nn.Module, prompt: Tensor, *, max_new_tokens: int, memory: Memory | None,
                     prompt_chunk: int | None, span: Span, sample: Any) -> tuple[Tensor, Memory | None]:
    """Transformer-XL: feed the prompt once, then one token per step against the memory of the last step."""
    logits, memory = _feed_prompt(model, prompt, memory=memory, chunk=prompt_chunk, span=span)
    new = []
    for i in range(max_new_tokens):
        token = sample(logits)  # (B,)
        new.append(token)
        if i + 1 < max_new_tokens:  # the last token is returned, not fed
            out = model(token[:, None], memory=memory, span=span)  # (B, 1) in, memory of M <= mem_len positions
            logits, memory = out.logits[:, -1], out.memory  # (B, V)
    return torch.stack(new, dim=1), memory  # (B, N)


def _generate_recomputed(model: nn.Module, prompt: Tensor, *, max_new_tokens: int, context: int,
                         sample: Any) -> Tensor:
    """No memory: recompute the whole window of the last ``context`` tokens at every step."""
    seq = prompt
    for _ in range(max_new_tokens):
        window = seq[:, -context:]  # (B, min(C, P + i))
        token = sample(model(window).logits[:, -1])  # (B,)
        seq = torch.cat([seq, token[:, None]], dim=1)  # (B, P + i + 1)
    return seq[:, prompt.shape[1]:]  # (B, N)


def generate(model: nn.Module, prompt: Tensor, *, max_new_tokens: int, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, generator: torch.Generator | None = None,
             memory: Memory | None = None, prompt_chunk: int | None = None,
             context: int | None = None, span: Span | None = None) -> Generation:
    """Continue ``prompt`` (B, P) or (P,) int64 by ``max_new_tokens`` tokens sampled by :func:`sample_next`.

    Transformer-XL (relative attention, mem_len > 0): the prompt is fed at once, or ``prompt_chunk`` tokens
    at a time, after ``memory`` if given; then one token per step with the memory of the previous step, so
    the past is never recomputed. This is the segment-wise model with segments of one token: it equals a
    full recomputation as long as P + N fits in mem_len (and the prompt in one chunk sees all of itself).

    The vanilla baseline (``attention="absolute"``) and mem_len = 0 have no memory: every step recomputes the
    last ``context`` tokens (default :data:`DEFAULT_CONTEXT`, or the whole sequence when shorter); passing
    ``memory`` is an error. ``context`` is ignored by the memory path, ``prompt_chunk`` by the window path.
    ``span`` sets the memory length, clamp and same-length attention (default: the model's).

    Runs under ``torch.no_grad()`` in eval mode and restores every module's training flag afterwards.
    A 1-D prompt is treated as one row: the result is still batch-first (1, ...)."""
    config = model.config
    prompt = _prepare_prompt(prompt, vocab_size=config.vocab_size, device=_model_device(model))
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
    _check_temperature(temperature)
    _check_top_k(top_k)
    _check_top_p(top_p)
    for name, value in (("prompt_chunk", prompt_chunk), ("context", context)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
    span = config.span if span is None else span
    cached = config.attention == "relative" and span.mem_len > 0
    if memory is not None:
        if not cached:
            why = "the vanilla baseline (attention='absolute')" if config.attention == "absolute" else "mem_len=0"
            raise ValueError(f"memory was given but the model has none ({why}): pass memory=None")
        if not isinstance(memory, Memory):
            raise ValueError(f"memory must be a txl Memory, got {type(memory).__name__}")
        if memory.batch_size != prompt.shape[0]:
            raise ValueError(f"memory has {memory.batch_size} batch rows, the prompt {prompt.shape[0]}")

    def sample(logits: Tensor) -> Tensor:
        return sample_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)

    flags = {module: module.training for module in model.modules()}
    model.eval()
    try:
        with torch.no_grad():
            if cached:
                new, memory = _generate_cached(model, prompt, max_new_tokens=max_new_tokens, memory=memory,
                                               prompt_chunk=prompt_chunk, span=span, sample=sample)
            else:
                new = _generate_recomputed(model, prompt, max_new_tokens=max_new_tokens,
                                           context=DEFAULT_CONTEXT if context is None else context,
                                           sample=sample)
    finally:
        for module, flag in flags.items():
            module.training = flag
    return Generation(tokens=torch.cat([prompt, new], dim=1), new_tokens=new, memory=memory)


class UnknownTokensWarning(UserWarning):
    """A prompt held tokens the vocabulary does not know; they were read as ``<unk>``."""


class _Vocab(Protocol):
    """What :func:`generate_text` needs of a vocabulary (see :mod:`txl.data.vocab`). It also uses, when
    present, ``eos_id``, ``unknown_as_unk`` and ``unknown_tokens(text)``."""

    def __len__(self) -> int: ...

    def encode(self, text: str, *, strict: bool = False) -> Any: ...

    def decode(self, ids: Any) -> str: ...


def _encode_prompt(vocab: _Vocab, prompt: str, unknown: str) -> Tensor:
    """(P,) int64 ids of ``prompt``; unknown tokens as described in :func:`generate_text`."""
    if unknown not in ("unk", "error"):
        raise ValueError(f"unknown must be 'unk' or 'error', got {unknown!r}")
    if unknown == "unk" and getattr(vocab, "unknown_as_unk", False):
        missing = vocab.unknown_tokens(prompt)
        if missing:
            shown = ", ".join(repr(t) for t in missing[:5])
            if len(missing) > 5:
                shown += f" and {len(missing) - 5} more"
            message = f"{len(missing)} prompt word(s) not in the vocabulary, read as <unk>: {shown}"
            warnings.warn(UnknownTokensWarning(message), stacklevel=3)
        ids = vocab.encode(prompt)
    else:
        ids = vocab.encode(prompt, strict=True)
    return torch.as_tensor(ids, dtype=torch.long).reshape(-1)  # (P,)


def generate_text(model: nn.Module, vocab: _Vocab, prompt: str, *, include_prompt: bool = False,
                  unknown: Literal["unk", "error"] = "unk", **kwargs: Any) -> str:
    """Encode ``prompt`` with ``vocab``, generate with :func:`generate` (``kwargs`` as there,
    ``max_new_tokens`` required), and return the new text (or, with ``include_prompt``, the prompt and the new
    text decoded together, which spaces words correctly).

    Prompt tokens not in ``vocab``: with ``unknown="unk"``, a vocabulary whose data reads them as ``<unk>``
    (``vocab.unknown_as_unk``: word vocabularies) does the same and warns with :class:`UnknownTokensWarning`
    naming them; other vocabularies (a char vocabulary has never seen an unknown character), and
    ``unknown="error"``, raise ValueError naming them.

    An empty prompt starts from the vocabulary's ``eos_id`` (a document boundary) when it has one.
    ``max_new_tokens=0`` runs no model: it returns "" (or the prompt as the vocabulary decodes it)."""
    if len(vocab) != model.config.vocab_size:
        raise ValueError(f"the vocabulary has {len(vocab)} tokens but the model's vocab_size is "
                         f"{model.config.vocab_size}: they must match")
    ids = _encode_prompt(vocab, prompt, unknown)  # (P,)
    if ids.numel() == 0:
        eos = getattr(vocab, "eos_id", None)
        if eos is None:
            raise ValueError("the prompt is empty and the vocabulary has no eos_id to start from")
        ids = torch.tensor([eos], dtype=torch.long)  # (1,)
    max_new_tokens = kwargs.get("max_new_tokens")
    if type(max_new_tokens) is int and max_new_tokens == 0:  # not a bool: False is refused by generate
        return vocab.decode(ids.numpy()) if include_prompt else ""
    gen = generate(model, ids, **kwargs)
    return vocab.decode((gen.tokens if include_prompt else gen.new_tokens)[0].cpu().numpy())
