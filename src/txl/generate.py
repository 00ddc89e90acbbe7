"""Text generation: incremental sampling with a key/value cache of the memory (Transformer-XL), or
recomputation over a sliding window (the vanilla baseline); the pure sampling filters (temperature, top-k,
top-p); text in and out (streamed, with stop strings); and sampling from a trained run (``txl generate``).

Dimensions: B batch, P prompt length, N new tokens, V vocabulary, M memory length, C context window.

The model, its memory and the cache are left to :mod:`txl.model`; vocabularies to :mod:`txl.data.vocab`.

    gen = generate(model, prompt, max_new_tokens=50, top_p=0.9, generator=torch.Generator().manual_seed(0))
    gen.new_tokens                                                   # (B, N)
    more = generate(model, gen.tokens[:, -1:], memory=gen.memory, max_new_tokens=50)   # continue
    for token in stream(model, prompt, max_new_tokens=50, temperature=0, stop_ids=[eos]):  # (B,) per step
        ...
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol

import torch
from torch import Tensor, nn

from .config import Span, check_sampling, first_set, span_of
from .errors import TxlWarning
from .evaluate import eval_mode
from .model import KVCache, Memory
from .model.decode import Decoder

if TYPE_CHECKING:
    from .runs import LoadedRun

__all__ = [
    "Generation",
    "filter_logits",
    "sample_next",
    "generate",
    "stream",
    "generate_text",
    "TextStream",
    "generate_from_run",
    "TextSamples",
    "UnknownTokensWarning",
    "encode_prompt",
    "DEFAULT_CONTEXT",
    "PAD_ID",
    "MAX_NEW_TOKENS",
]

MAX_NEW_TOKENS = 100_000
"""The most tokens :func:`generate_from_run` samples per sample (``txl generate --max-new-tokens``), as txl
serve bounds a request's ``max_tokens``: a larger number is more likely a typo than a wish."""

DEFAULT_CONTEXT = 512
"""Window (tokens) recomputed at every step when the model has no memory and ``context`` is not given."""


# ---------------------------------------------------------------------------------------------------------
# Pure sampling helpers
# ---------------------------------------------------------------------------------------------------------


def _ranks(logits: Tensor) -> tuple[Tensor, Tensor]:
    """Sort descending with ties broken by the lower token id; returns (sorted values, rank of every entry)."""
    values, order = torch.sort(logits, dim=-1, descending=True, stable=True)  # (..., V)
    return values, torch.argsort(order, dim=-1)  # (..., V) rank of each token id


def filter_logits(logits: Tensor, *, top_k: int | None = None, top_p: float | None = None) -> Tensor:
    """A copy of ``logits`` (..., V) with the entries outside the top-k and then outside the nucleus set to -inf.

    ``top_k`` keeps the k highest scores. ``top_p`` keeps the smallest set of most likely tokens whose
    probability (softmax of the top-k-filtered scores) reaches p, and always at least the most likely token.
    Ties are broken deterministically in favour of the lower token id. The input is not modified."""
    check_sampling(top_k=top_k, top_p=top_p)
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be (..., V) with V >= 1, got shape {tuple(logits.shape)}")
    out = logits.clone()
    if top_k is not None and top_k < out.shape[-1]:
        _, ranks = _ranks(out)
        out = out.masked_fill(ranks >= top_k, float("-inf"))
    if top_p is not None and top_p < 1:
        values, ranks = _ranks(out)
        probs = torch.softmax(
            values.float() if values.dtype in (torch.float16, torch.bfloat16) else values, dim=-1
        )
        mass = torch.cumsum(probs, dim=-1)  # (..., V)
        # better-ranked mass
        mass_before = torch.cat([torch.zeros_like(mass[..., :1]), mass[..., :-1]], dim=-1)
        keep_sorted = mass_before < top_p  # rank 0 has mass_before 0 < p: always kept
        keep = torch.gather(keep_sorted, -1, ranks)  # (..., V) back to token order
        out = out.masked_fill(~keep, float("-inf"))
    return out


def sample_next(
    logits: Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """One token id per row (B,) int64 from next-token scores ``logits`` (B, V) (raw logits or log-probs).

    ``temperature`` 0 is greedy (argmax, the lower id on ties; top-k/top-p cannot change it). Otherwise the
    scores are divided by the temperature, filtered by :func:`filter_logits`, and one token is drawn with
    ``generator`` (the global generator when None)."""
    check_sampling(temperature=temperature, top_k=top_k, top_p=top_p)
    if logits.dim() != 2 or logits.shape[-1] == 0:
        raise ValueError(f"logits must be (batch, vocab), got shape {tuple(logits.shape)}")
    return _draw(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)


# ---------------------------------------------------------------------------------------------------------
# Generation with a model
# ---------------------------------------------------------------------------------------------------------


@dataclass
class Generation:
    """What :func:`generate` returns.

    Rows that meet one of ``stop_ids`` end there: ``new_tokens[r, :lengths[r]]`` are row r's tokens (its stop
    id last, ``finished[r]``), and the positions after it hold :data:`PAD_ID`. Generation ends early when
    every row has stopped, so N is the longest row's length."""

    tokens: Tensor
    """(B, P + N) the prompt followed by the new tokens. Prompts of different lengths are left-padded with
    :data:`PAD_ID` to the longest, so that ``tokens[:, P:]`` are the new tokens of every row."""
    new_tokens: Tensor
    """(B, N) the generated tokens only (:data:`PAD_ID` after a row's stop id)."""
    memory: Memory | None
    """Memory after the last token fed to the model, i.e. covering ``tokens[:, :-1]`` (the last sampled token
    has not been fed yet). Continue with ``generate(model, tokens[:, -1:], memory=memory, ...)``: the result
    equals one longer generation. Rows that stopped early were fed their own samples until the batch ended,
    not the padding shown. None for models without memory (the vanilla baseline, mem_len = 0), and for
    prompts of different lengths whose memories differ in length (continue those row by row)."""
    lengths: Tensor
    """(B,) int64, the number of new tokens of each row (N unless the row stopped)."""
    finished: Tensor
    """(B,) bool, True where the row ended on one of ``stop_ids``."""
    scores: Tensor | None = None
    """(B, N, V) the model's log-probabilities of every step (before temperature and filters), with
    ``return_scores=True``."""


PAD_ID = -1
"""The id that fills a row after its stop id (and left-pads prompts of different lengths in ``tokens``)."""


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


def _prepare_rows(prompt: Any, *, vocab_size: int, device: torch.device) -> list[Tensor]:
    """The prompt as a list of rows (P_r,) int64: one (B, P) tensor gives B rows of one length, a sequence of
    1-D tensors (or of lists of ids) gives rows of any lengths."""
    if isinstance(prompt, Tensor):
        return list(_prepare_prompt(prompt, vocab_size=vocab_size, device=device))
    if not isinstance(prompt, (list, tuple)) or not prompt:
        raise ValueError(
            f"prompt must be a tensor of token ids or a non-empty list of rows, got {prompt!r:.80}"
        )
    rows = []
    for row in prompt:
        row = row if isinstance(row, Tensor) else torch.as_tensor(row)
        if row.dim() != 1:
            raise ValueError(f"each prompt row must be 1-D (time,), got shape {tuple(row.shape)}")
        rows.append(_prepare_prompt(row, vocab_size=vocab_size, device=device)[0])
    return rows


def _model_param(model: nn.Module) -> Tensor | None:
    return next(model.parameters(), None)


def _model_device(model: nn.Module) -> torch.device:
    param = _model_param(model)
    return param.device if param is not None else torch.device("cpu")


def _draw(
    logprobs: Tensor,
    *,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | None,
) -> Tensor:
    """:func:`sample_next` without the checks (the settings were validated once, before the loop)."""
    if logprobs.dtype in (torch.float16, torch.bfloat16):
        logprobs = logprobs.float()
    if temperature == 0:
        return torch.argmax(logprobs, dim=-1)  # (B,)
    scores = logprobs / temperature
    if top_k is not None or (top_p is not None and top_p < 1):
        scores = filter_logits(scores, top_k=top_k, top_p=top_p)
    probs = torch.softmax(scores, dim=-1)  # (B, V)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)  # (B,)


class _CachedRows:
    """Rows with prompts of one length decoded against one key/value cache (Transformer-XL with memory)."""

    def __init__(
        self,
        model: nn.Module,
        prompt: Tensor,
        *,
        memory: Memory | None,
        span: Span,
        chunk: int,
        dtype: torch.dtype,
    ) -> None:
        self.cache = KVCache(
            model.config,
            batch_size=prompt.shape[0],
            span=span,
            memory=memory,
            dtype=dtype,
            device=prompt.device,
        )
        self.decoder = Decoder(model, self.cache)
        self.logprobs = self.decoder.prefill(prompt, chunk=chunk)  # (G, V): at most `chunk` attend at once

    def feed(self, token: Tensor) -> None:
        self.logprobs = self.decoder.step(token)  # (G, V)

    def memory(self) -> Memory | None:
        return self.cache.memory()


class _WindowRows:
    """Rows of a model without memory: the last ``context`` tokens are recomputed at every step."""

    def __init__(self, model: nn.Module, prompt: Tensor, *, context: int, span: Span) -> None:
        self.model, self.context, self.seq, self.span = model, context, prompt, span
        self.logprobs = model(prompt[:, -context:], span=span, last_only=True).log_probs[:, -1]  # (G, V)

    def feed(self, token: Tensor) -> None:
        self.seq = torch.cat([self.seq, token[:, None]], dim=1)  # (G, P + i)
        window = self.seq[:, -self.context :]  # (G, min(C, P + i))
        self.logprobs = self.model(window, span=self.span, last_only=True).log_probs[:, -1]  # (G, V)

    def memory(self) -> Memory | None:
        return None


class _Decoding:
    """One generation: validated settings, the rows grouped by prompt length, and the step loop shared by
    :func:`generate` and :func:`stream`."""

    def __init__(
        self,
        model: nn.Module,
        prompt: Any,
        *,
        max_new_tokens: int,
        temperature: float,
        top_k: int | None,
        top_p: float | None,
        generator: torch.Generator | None,
        memory: Memory | None,
        stop_ids: Sequence[int] | Tensor | None,
        prompt_chunk: int | None,
        context: int | None,
        span: Span | None,
    ) -> None:
        config = model.config
        param = _model_param(model)
        device = param.device if param is not None else torch.device("cpu")
        self.rows = _prepare_rows(prompt, vocab_size=config.vocab_size, device=device)
        if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be a positive integer, got {max_new_tokens!r}")
        check_sampling(temperature=temperature, top_k=top_k, top_p=top_p)
        for name, value in (("prompt_chunk", prompt_chunk), ("context", context)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive integer or None, got {value!r}")
        span = config.span if span is None else span
        if not isinstance(span, Span):
            raise ValueError(f"span must be a txl Span, got {type(span).__name__}")
        self.cached = config.attention == "relative" and span.mem_len > 0
        batch = len(self.rows)
        if memory is not None:
            if not self.cached:
                why = (
                    "the vanilla baseline (attention='absolute')"
                    if config.attention == "absolute"
                    else "mem_len=0"
                )
                raise ValueError(f"memory was given but the model has none ({why}): pass memory=None")
            if not isinstance(memory, Memory):
                raise ValueError(f"memory must be a txl Memory, got {type(memory).__name__}")
            if memory.batch_size != batch:
                raise ValueError(f"memory has {memory.batch_size} batch rows, the prompt {batch}")
        self.stop_ids = None
        if stop_ids is not None:
            ids = torch.as_tensor(stop_ids).reshape(-1)
            if ids.numel() == 0 or ids.dtype == torch.bool or ids.dtype.is_floating_point:
                raise ValueError(f"stop_ids must be a non-empty sequence of token ids, got {stop_ids!r}")
            if int(ids.min()) < 0 or int(ids.max()) >= config.vocab_size:
                raise ValueError(
                    f"stop_ids must be token ids in [0, {config.vocab_size}), got {ids.tolist()}"
                )
            self.stop_ids = ids.to(device=device, dtype=torch.long)
        self.model, self.memory_in, self.span, self.max_new_tokens = model, memory, span, max_new_tokens
        self.chunk = prompt_chunk if prompt_chunk is not None else span.mem_len
        self.context = DEFAULT_CONTEXT if context is None else context
        self.dtype = param.dtype if param is not None else torch.get_default_dtype()
        self.sampling = dict(temperature=temperature, top_k=top_k, top_p=top_p, generator=generator)
        # Rows with prompts of one length are decoded together; different lengths in lockstep, one group each.
        lengths = [len(row) for row in self.rows]
        self.groups_rows = [[r for r in range(batch) if lengths[r] == n] for n in sorted(set(lengths))]
        order = [r for rows in self.groups_rows for r in rows]
        self.order = None if order == list(range(batch)) else torch.tensor(order, device=device)
        self.inverse = None if self.order is None else torch.argsort(self.order)
        self.groups: list[_CachedRows | _WindowRows] = []
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)

    def _start(self) -> None:
        """Feed every group's prompt (after its part of the given memory)."""
        for rows in self.groups_rows:
            prompt = torch.stack([self.rows[r] for r in rows])  # (G, P)
            if self.cached:
                memory = None if self.memory_in is None else self.memory_in.select(rows)
                self.groups.append(
                    _CachedRows(
                        self.model, prompt, memory=memory, span=self.span, chunk=self.chunk, dtype=self.dtype
                    )
                )
            else:
                self.groups.append(_WindowRows(self.model, prompt, context=self.context, span=self.span))

    def _logprobs(self) -> Tensor:
        """The next-token log-probabilities of all rows, (B, V) in the prompt's row order."""
        if len(self.groups) == 1:
            return self.groups[0].logprobs
        return torch.cat([g.logprobs for g in self.groups])[self.inverse]  # (B, V)

    def _feed(self, token: Tensor) -> None:
        if len(self.groups) == 1:
            self.groups[0].feed(token)
            return
        grouped = token[self.order]  # (B,) in group order
        start = 0
        for group, rows in zip(self.groups, self.groups_rows, strict=True):
            group.feed(grouped[start : start + len(rows)])
            start += len(rows)

    def steps(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield (token ids (B,), log-probabilities (B, V)) for each new token: PAD_ID for stopped rows.
        The model is in eval mode, and the work in inference mode, only while this runs."""
        sampling = self.sampling
        stop_ids = self.stop_ids
        token = None
        with eval_mode(self.model):
            for step in range(self.max_new_tokens):
                with torch.inference_mode():
                    if step == 0:
                        self._start()
                    else:
                        self._feed(token)  # the token sampled last, stopped rows included
                    logprobs = self._logprobs()
                    token = _draw(logprobs, **sampling)  # (B,)
                    shown = token
                    done = False
                    if stop_ids is not None:
                        running = ~self.finished
                        self.lengths += running
                        shown = torch.where(running, token, PAD_ID)
                        self.finished = self.finished | (running & torch.isin(token, stop_ids))
                        done = bool(self.finished.all())
                yield shown, logprobs
                if done:
                    return

    def memory(self) -> Memory | None:
        """The memory after the last token fed (see :attr:`Generation.memory`)."""
        parts = [group.memory() for group in self.groups]
        if any(part is None for part in parts) or len({part.length for part in parts}) != 1:
            return None
        if len(parts) == 1:
            return parts[0]
        return Memory.cat_rows(parts).select(self.inverse)

    def prompt_tokens(self) -> Tensor:
        """(B, P) the prompts, shorter ones left-padded with PAD_ID."""
        width = max(len(row) for row in self.rows)
        out = torch.full((len(self.rows), width), PAD_ID, dtype=torch.long, device=self.rows[0].device)
        for r, row in enumerate(self.rows):
            out[r, width - len(row) :] = row
        return out


def stream(
    model: nn.Module,
    prompt: Tensor | Sequence[Tensor],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    memory: Memory | None = None,
    stop_ids: Sequence[int] | Tensor | None = None,
    prompt_chunk: int | None = None,
    context: int | None = None,
    span: Span | None = None,
) -> Iterator[Tensor]:
    """Like :func:`generate`, but yield the new token ids (B,) one step at a time, as they are sampled
    (:data:`PAD_ID` for rows that have stopped); it ends after ``max_new_tokens`` steps or when every row has
    met one of ``stop_ids``. The same arguments and seed give exactly the tokens :func:`generate` returns.

    The settings are checked when this is called; the model runs, in eval mode, while the stream is consumed,
    and gets its training flags back when the stream ends or is closed."""
    decoding = _Decoding(
        model,
        prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        generator=generator,
        memory=memory,
        stop_ids=stop_ids,
        prompt_chunk=prompt_chunk,
        context=context,
        span=span,
    )

    def tokens() -> Iterator[Tensor]:
        for token, _ in decoding.steps():
            yield token.clone()  # an ordinary tensor (not an inference-mode one) that the caller owns

    return tokens()


def generate(
    model: nn.Module,
    prompt: Tensor | Sequence[Tensor],
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | None = None,
    memory: Memory | None = None,
    stop_ids: Sequence[int] | Tensor | None = None,
    prompt_chunk: int | None = None,
    context: int | None = None,
    span: Span | None = None,
    return_scores: bool = False,
) -> Generation:
    """Continue ``prompt`` by ``max_new_tokens`` tokens sampled by :func:`sample_next`.

    ``prompt``: (B, P) or (P,) int64, or a list of 1-D rows of different lengths (each row is then generated
    exactly as it would be alone; rows of one length share a batch, the groups step in lockstep, and the
    sampler sees all rows at once in their order, so the random draws are those of one batch).

    Transformer-XL (relative attention, mem_len > 0): a key/value cache (``txl.model.KVCache``) holds, per
    layer, the keys and values of the remembered positions, projected once. The prompt is fed after
    ``memory`` (if given) in chunks of ``prompt_chunk`` tokens (default ``span.mem_len``), so time and memory
    stay bounded for any prompt length; then one token per step, whose attention costs O(M·D). This is
    exactly the segment-wise model: chunks of the prompt, then segments of one token, each with the memory
    of the last ``span.mem_len`` positions (``span`` sets memory length, clamp and same-length attention,
    default the model's). It equals a full recomputation while prompt and new tokens fit in the memory.

    The vanilla baseline (``attention="absolute"``) and mem_len = 0 have no memory: every step recomputes the
    last ``context`` tokens (default :data:`DEFAULT_CONTEXT`); passing ``memory`` is an error. ``context`` is
    ignored by the memory path, ``prompt_chunk`` by the window path.

    ``stop_ids``: a row stops at the first of these ids (see :class:`Generation` for how stopped rows look).
    ``return_scores``: also return the log-probabilities of every step, (B, N, V).

    Runs in inference mode and eval mode, and restores every module's training flag afterwards. A 1-D prompt
    is treated as one row: the result is still batch-first (1, ...)."""
    decoding = _Decoding(
        model,
        prompt,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        generator=generator,
        memory=memory,
        stop_ids=stop_ids,
        prompt_chunk=prompt_chunk,
        context=context,
        span=span,
    )
    tokens, scores = [], []
    for token, logprobs in decoding.steps():
        tokens.append(token)
        if return_scores:
            scores.append(logprobs)
    new = torch.stack(tokens, dim=1)  # (B, N)
    lengths = (
        decoding.lengths.clone()
        if decoding.stop_ids is not None
        else torch.full_like(decoding.lengths, new.shape[1])
    )
    return Generation(
        tokens=torch.cat([decoding.prompt_tokens(), new], dim=1),
        new_tokens=new,
        memory=decoding.memory(),
        lengths=lengths,
        finished=decoding.finished.clone(),
        scores=torch.stack(scores, dim=1) if return_scores else None,
    )


# ---------------------------------------------------------------------------------------------------------
# Text
# ---------------------------------------------------------------------------------------------------------


class UnknownTokensWarning(TxlWarning):
    """A prompt held tokens the vocabulary does not know; they were read as ``<unk>``."""


class _Vocab(Protocol):
    """What :func:`generate_text` needs of a vocabulary (see :mod:`txl.data.vocab`). It also uses, when
    present, ``eos_id``, ``unknown_as_unk`` and ``unknown_tokens(text)``."""

    def __len__(self) -> int: ...

    def encode(self, text: str, *, strict: bool = False) -> Any: ...

    def decode(self, ids: Any) -> str: ...


def encode_prompt(vocab: _Vocab, prompt: str, *, unknown: Literal["unk", "error"] = "unk") -> Tensor:
    """(P,) int64 ids of ``prompt`` (unknown tokens as described in :func:`generate_text`); an empty prompt is
    the vocabulary's ``eos_id`` (a document boundary) when it has one."""
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
    ids = torch.as_tensor(ids, dtype=torch.long).reshape(-1)  # (P,)
    if ids.numel() == 0:
        eos = getattr(vocab, "eos_id", None)
        if eos is None:
            raise ValueError("the prompt is empty and the vocabulary has no eos_id to start from")
        ids = torch.tensor([eos], dtype=torch.long)  # (1,)
    return ids


def generate_text(
    model: nn.Module,
    vocab: _Vocab,
    prompt: str,
    *,
    include_prompt: bool = False,
    unknown: Literal["unk", "error"] = "unk",
    stop: Sequence[str] = (),
    on_text: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> str:
    """Encode ``prompt`` with ``vocab``, generate with :func:`generate` (``kwargs`` as there,
    ``max_new_tokens`` required), and return the new text (or, with ``include_prompt``, the prompt and the new
    text decoded together, which spaces words correctly).

    Prompt tokens not in ``vocab``: with ``unknown="unk"``, a vocabulary whose data reads them as ``<unk>``
    (``vocab.unknown_as_unk``: word vocabularies) does the same and warns with :class:`UnknownTokensWarning`
    naming them; other vocabularies (a char vocabulary has never seen an unknown character), and
    ``unknown="error"``, raise ValueError naming them.

    An empty prompt starts from the vocabulary's ``eos_id`` (a document boundary) when it has one.
    ``max_new_tokens=0`` runs no model: it returns "" (or the prompt as the vocabulary decodes it).

    ``stop``: strings that end the generation as soon as the new text contains one; the text is cut before it.
    ``on_text``: called once per generated token with the text that token made printable (see
    :class:`TextStream`: possibly empty, the last call flushes the rest), for printing as it is produced."""
    if len(vocab) != model.config.vocab_size:
        raise ValueError(
            f"the vocabulary has {len(vocab)} tokens but the model's vocab_size is "
            f"{model.config.vocab_size}: they must match"
        )
    ids = encode_prompt(vocab, prompt, unknown=unknown)  # (P,)
    max_new_tokens = kwargs.get("max_new_tokens")
    if type(max_new_tokens) is int and max_new_tokens == 0:  # not a bool: False is refused by generate
        return vocab.decode(ids.tolist()) if include_prompt else ""
    return _text_from_ids(
        model, vocab, ids, include_prompt=include_prompt, stop=stop, on_text=on_text, **kwargs
    )


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class TextStream:
    """Generated token ids in, printable text out, as they come; cut at the first stop string.

    The new text is ``decode(prompt + new ids)`` after ``decode(prompt)``, so word vocabularies space it as
    one text. Held back until a later token (or the last) settles it: a trailing U+FFFD (an incomplete UTF-8
    character of a byte vocabulary) and a tail that could be the start of a stop string. A vocabulary whose
    decoding rewrites earlier text (rare BPE merges) may make the printed pieces differ from :attr:`text`;
    :attr:`text` is always the exact decoding.

        pieces = TextStream(vocab, prompt_ids, stop=["\\n\\n"])
        for token in stream(...): print(pieces.push(int(token[0])), end="", flush=True)
    """

    def __init__(self, vocab: _Vocab, prompt_ids: Sequence[int], *, stop: Sequence[str] = ()) -> None:
        if isinstance(stop, str) or any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop must be a list of non-empty strings, got {stop!r}")
        self.vocab = vocab
        self.stop = tuple(stop)
        self.ids = [int(i) for i in prompt_ids]
        self.new_ids: list[int] = []
        self.prompt_text = vocab.decode(self.ids)
        self.text = ""
        """The new text so far (cut before the stop string once :attr:`stopped`)."""
        self.stopped = False
        """True once the new text contains a stop string."""
        self._shown = ""

    def push(self, token_id: int, *, final: bool = False) -> str:
        """Add one generated id; return the text that became printable (``final``: print everything left)."""
        if self.stopped:
            return ""
        self.ids.append(int(token_id))
        self.new_ids.append(int(token_id))
        full = self.vocab.decode(self.ids)
        new = full[_common_prefix(full, self.prompt_text) :]
        cuts = [i for i in (new.find(s) for s in self.stop) if i >= 0]
        if cuts:
            new, final, self.stopped = new[: min(cuts)], True, True
        self.text = new
        if not final:
            new = new.rstrip("\ufffd")
            hold = max((k for s in self.stop for k in range(1, len(s)) if new.endswith(s[:k])), default=0)
            new = new[: len(new) - hold]
        if not new.startswith(self._shown):  # the decoding changed text already shown: show only what follows
            return ""
        piece, self._shown = new[len(self._shown) :], new
        return piece


def _text_from_ids(
    model: nn.Module,
    vocab: _Vocab,
    ids: Tensor,
    *,
    include_prompt: bool,
    stop: Sequence[str],
    on_text: Callable[[str], None] | None,
    **kwargs: Any,
) -> str:
    """Generate one row after the prompt ids (P,) and decode it (see :func:`generate_text`)."""
    pieces = TextStream(vocab, ids.tolist(), stop=stop)
    if not stop and on_text is None:
        new = generate(model, ids, **kwargs).new_tokens[0]
        new_ids = new.tolist()
    else:
        stop_ids = kwargs.get("stop_ids")
        stop_ids = set() if stop_ids is None else set(torch.as_tensor(stop_ids).reshape(-1).tolist())
        tokens = stream(model, ids, **kwargs)
        last = kwargs.get("max_new_tokens", 0) - 1
        for step, token in enumerate(tokens):
            token_id = int(token[0])
            piece = pieces.push(token_id, final=step == last or token_id in stop_ids)
            if on_text is not None:
                on_text(piece)
            if pieces.stopped:
                tokens.close()
                break
        new_ids = pieces.new_ids
    if include_prompt:
        text = vocab.decode(ids.tolist() + new_ids)
        if pieces.stopped:
            text = text[: _common_prefix(text, pieces.prompt_text)] + pieces.text
        return text
    text = vocab.decode(new_ids)
    if pieces.stopped:
        cuts = [i for i in (text.find(s) for s in stop) if i >= 0]
        text = text[: min(cuts)] if cuts else text
    return text


# ---------------------------------------------------------------------------------------------------------
# A trained run
# ---------------------------------------------------------------------------------------------------------


@dataclass
class TextSamples:
    """What :func:`generate_from_run` returns."""

    prompt: str
    """The prompt text as given."""
    prompt_text: str
    """The prompt as the vocabulary reads it back (``decode(encode(prompt))``: unknown words as ``<unk>``,
    a word vocabulary's spacing): the text that ``texts`` continue, so ``prompt_text + texts[i]`` is the
    whole sample as one text."""
    texts: list[str]
    """The new text of each sample (cut before a stop string)."""
    new_tokens: int
    """Tokens generated over all samples (the stop string's tokens included)."""
    seconds: float
    """Time spent generating (prompt feeding included, loading the run not)."""

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.seconds if self.seconds > 0 else 0.0


def generate_from_run(
    run: LoadedRun,
    prompt: str,
    *,
    max_new_tokens: int | None = None,
    temperature: float | None = None,
    top_k: int | None = None,
    top_p: float | None = None,
    greedy: bool = False,
    mem_len: int | None = None,
    seed: int = 0,
    stop: Sequence[str] = (),
    num_samples: int = 1,
    unknown: Literal["unk", "error"] = "unk",
    on_start: Callable[[int, str], None] | None = None,
    on_text: Callable[[int, str], None] | None = None,
) -> TextSamples:
    """Sample ``num_samples`` continuations of ``prompt`` from a loaded run (what ``txl generate`` does).

    Settings left as None come from the run's ``[generate]`` config; ``greedy`` means temperature 0;
    ``mem_len`` replaces the model's memory length (0 also turns same-length attention off, with a
    :class:`~txl.config.SameLengthOff` warning). Unknown prompt
    tokens: see ``unknown`` in :func:`generate_text`. The samples are drawn one after the other from one
    generator seeded with ``seed`` (so streamed and collected output are the same). ``on_text(i, piece)`` is
    called once per generated token of sample i with the text it made printable (see :class:`TextStream`),
    after ``on_start(i, prompt_text)`` (the prompt as the vocabulary reads it, which the new text continues).
    ``max_new_tokens=0`` generates nothing. Bad settings and unknown prompt tokens raise ValueError."""
    if greedy:
        if temperature not in (None, 0):
            raise ValueError(f"greedy decoding has temperature 0, not {temperature}")
        temperature = 0.0
    given = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    sampling = dataclasses.replace(run.config.generate, **{k: v for k, v in given.items() if v is not None})
    max_new_tokens = first_set(max_new_tokens, sampling.max_new_tokens)
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be a non-negative integer, got {max_new_tokens!r}")
    if max_new_tokens > MAX_NEW_TOKENS:
        raise ValueError(
            f"max_new_tokens={max_new_tokens} is above the limit of {MAX_NEW_TOKENS} tokens per sample "
            "(as txl serve bounds max_tokens); generate in several runs"
        )
    span = None
    if mem_len is not None:
        if run.config.model.attention != "relative":
            raise ValueError(
                "a memory length applies to the Transformer-XL only (this run is the vanilla baseline)"
            )
        base = run.config.model.span
        span = span_of(mem_len=mem_len, clamp_len=base.clamp_len, same_length=base.same_length)
    model, vocab = run.model, run.vocab
    ids = encode_prompt(vocab, prompt, unknown=unknown)  # (P,): once, so unknown words are reported once
    prompt_text = vocab.decode(ids.tolist())
    generator = torch.Generator(device=_model_device(model)).manual_seed(seed)
    texts, count, seconds = [], 0, 0.0
    for index in range(num_samples):
        if max_new_tokens == 0:
            texts.append("")
            continue
        if on_start is not None:
            on_start(index, prompt_text)
        pieces: list[str] = []

        def collect(piece: str, index: int = index, pieces: list[str] = pieces) -> None:
            pieces.append(piece)
            if on_text is not None:
                on_text(index, piece)

        start = time.perf_counter()
        _text_from_ids(
            model,
            vocab,
            ids,
            include_prompt=False,
            stop=stop,
            on_text=collect,
            max_new_tokens=max_new_tokens,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            generator=generator,
            span=span,
        )
        seconds += time.perf_counter() - start
        count += len(pieces)
        texts.append("".join(pieces))
    return TextSamples(prompt=prompt, prompt_text=prompt_text, texts=texts, new_tokens=count, seconds=seconds)
