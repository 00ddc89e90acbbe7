"""The decoding loop: new tokens one step at a time, with a key/value cache of the memory (Transformer-XL), or
by recomputing a sliding window (the vanilla baseline), rows of mixed prompt lengths in one batch, in lockstep.

Dimensions: B batch, P prompt length (the longest), N new tokens, V vocabulary, M memory length, C context
window.

Prompts of different lengths: the rows are left-padded to the longest and each row's first prompt token is
a document start (``TransformerXL.forward(..., starts=...)``), so that no row attends to its padding; the
memory's per-row reach keeps it so while the batch decodes. A prompt longer than one prefill chunk, or one
that continues a given memory, is prefilled alone and then joins its row of the batch's cache
(``KVCache.put_rows``). Either way each row's tokens are those of its prompt generated alone.

How one token is drawn is :mod:`txl.sampling`'s (pure filters and :class:`~txl.sampling.SamplingSettings`);
text, prompts, stop strings and runs are :mod:`txl.text`'s; the model, its memory and the cache
:mod:`txl.model`'s.

    gen = generate(model, prompt, max_new_tokens=50, top_p=0.9, generator=torch.Generator().manual_seed(0))
    gen = generate(model, [p1, p2, p3], max_new_tokens=50, generator=[g1, g2, g3])  # one seed per row
    gen.new_tokens                                                   # (B, N)
    more = generate(model, gen.tokens[:, -1:], memory=gen.memory, max_new_tokens=50)   # continue
    for token in stream(model, prompt, max_new_tokens=50, temperature=0, stop_ids=[eos]):  # (B,) per step
        ...

The text-level names that lived here (``generate_text``, ``generate_from_run``, ``TextStream``, ...) are
still reachable from this module; they live in :mod:`txl.text`, which imports this one.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from .config import Span
from .evaluate import eval_mode
from .model import KVCache, Memory
from .model.decode import Decoder
from .sampling import SamplingSettings, draw, filter_logits, sample_next

_IN_TEXT = (  # names that lived here, now in txl.text (which imports this module): reachable from here as before
    "generate_text",
    "TextStream",
    "generate_from_run",
    "TextSamples",
    "UnknownTokensWarning",
    "encode_prompt",
    "MAX_NEW_TOKENS",
)

__all__ = [
    "Generation",
    "GenerationSettings",
    "SamplingSettings",
    "filter_logits",
    "sample_next",
    "generate",
    "stream",
    "DEFAULT_CONTEXT",
    "PAD_ID",
    *_IN_TEXT,
]

DEFAULT_CONTEXT = 512
"""Window (tokens) recomputed at every step when the model has no memory and ``context`` is not given."""


def __getattr__(name: str) -> Any:
    """The text-level names, from :mod:`txl.text` (imported on first use: it imports this module)."""
    if name in _IN_TEXT:
        value = getattr(importlib.import_module(".text", __package__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _positive(name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer{' or None' if optional else ''}, got {value!r}")


@dataclass(frozen=True)
class GenerationSettings:
    """What one generation does, besides its model, prompt, memory and random generator: checked when built,
    and handed as one value from the run-level and text-level functions down to the loop."""

    max_new_tokens: int
    """Steps to run (fewer when every row has met one of ``stop_ids``)."""
    sampling: SamplingSettings = SamplingSettings()
    """How each token is drawn."""
    stop_ids: tuple[int, ...] | None = None
    """A row stops at the first of these ids."""
    prompt_chunk: int | None = None
    """Prompt tokens fed at once on the memory path (None: ``span.mem_len``)."""
    context: int | None = None
    """Window recomputed at every step on the memoryless path (None: :data:`DEFAULT_CONTEXT`)."""
    span: Span | None = None
    """Memory length, clamp and same-length attention (None: the model's)."""

    def __post_init__(self) -> None:
        _positive("max_new_tokens", self.max_new_tokens)
        if not isinstance(self.sampling, SamplingSettings):
            raise ValueError(f"sampling must be a SamplingSettings, got {type(self.sampling).__name__}")
        _positive("prompt_chunk", self.prompt_chunk, optional=True)
        _positive("context", self.context, optional=True)
        if self.span is not None and not isinstance(self.span, Span):
            raise ValueError(f"span must be a txl Span, got {type(self.span).__name__}")
        if self.stop_ids is not None:
            ids = torch.as_tensor(self.stop_ids).reshape(-1)
            if ids.numel() == 0 or ids.dtype == torch.bool or ids.dtype.is_floating_point:
                raise ValueError(f"stop_ids must be a non-empty sequence of token ids, got {self.stop_ids!r}")
            object.__setattr__(self, "stop_ids", tuple(ids.tolist()))


def _settings(
    settings: GenerationSettings | None,
    *,
    max_new_tokens: int | None,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    stop_ids: Sequence[int] | Tensor | None,
    prompt_chunk: int | None,
    context: int | None,
    span: Span | None,
) -> GenerationSettings:
    """``settings``, or the one the keyword arguments of :func:`generate` and :func:`stream` make."""
    if settings is None:
        return GenerationSettings(
            max_new_tokens=max_new_tokens,
            sampling=SamplingSettings(temperature=temperature, top_k=top_k, top_p=top_p),
            stop_ids=stop_ids,
            prompt_chunk=prompt_chunk,
            context=context,
            span=span,
        )
    given = (max_new_tokens, top_k, top_p, stop_ids, prompt_chunk, context, span)
    if not isinstance(settings, GenerationSettings):
        raise ValueError(f"settings must be a GenerationSettings, got {type(settings).__name__}")
    if temperature != 1.0 or any(value is not None for value in given):
        raise ValueError("give settings= or its fields (max_new_tokens=, temperature=, ...), not both")
    return settings


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
    not the padding shown. For prompts of different lengths it has a per-row reach (:attr:`Memory.reach`):
    each row continues its own history only. None for models without memory (the vanilla baseline,
    mem_len = 0)."""
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


def _left_pad(rows: list[Tensor]) -> tuple[Tensor, Tensor]:
    """Rows of different lengths as one batch: (B, P) tokens left-padded with id 0 to the longest, and (B, P)
    starts, True at each row's first token (so that no row attends to its padding)."""
    width = max(len(row) for row in rows)
    tokens = torch.zeros(len(rows), width, dtype=torch.long, device=rows[0].device)
    starts = torch.zeros(len(rows), width, dtype=torch.bool, device=rows[0].device)
    for r, row in enumerate(rows):
        tokens[r, width - len(row) :] = row
        starts[r, width - len(row)] = True
    return tokens, starts


class _CachedRows:
    """Every row against one key/value cache (Transformer-XL with memory), decoded in lockstep.

    One prompt length: one batch, as given. Several, all within one prefill chunk and no memory: left-padded
    with a start at each row's first token (one prefill). Otherwise (a prompt longer than a chunk, whose
    chunks would fall elsewhere than alone, or a memory to continue): each row is prefilled alone and moved
    into its row of a cache as long as the longest (``KVCache.put_rows``)."""

    def __init__(
        self,
        model: nn.Module,
        rows: list[Tensor],
        *,
        memory: Memory | None,
        span: Span,
        chunk: int,
        dtype: torch.dtype,
    ) -> None:
        config, device, batch = model.config, rows[0].device, len(rows)
        longest = max(len(row) for row in rows)
        if all(len(row) == longest for row in rows):
            self.cache = KVCache(
                config, batch_size=batch, span=span, memory=memory, dtype=dtype, device=device
            )
            self.decoder = Decoder(model, self.cache)
            self.logprobs = self.decoder.prefill(torch.stack(rows), chunk=chunk)  # (B, V)
        elif memory is None and longest <= chunk:
            tokens, starts = _left_pad(rows)  # (B, P) each
            self.cache = KVCache(config, batch_size=batch, span=span, dtype=dtype, device=device)
            self.decoder = Decoder(model, self.cache)
            self.logprobs = self.decoder.prefill(tokens, starts=starts)  # (B, V)
        else:
            alone, logprobs = [], []
            for r, row in enumerate(rows):
                own = None if memory is None else memory.select([r])
                cache = KVCache(config, batch_size=1, span=span, memory=own, dtype=dtype, device=device)
                logprobs.append(Decoder(model, cache).prefill(row[None], chunk=chunk))  # (1, V)
                alone.append(cache)
            length = max(cache.length for cache in alone)
            zeros = Memory.zeros(config, batch, length, dtype=dtype, device=device)
            self.cache = KVCache(config, span=span, memory=zeros)
            for r, cache in enumerate(alone):
                self.cache.put_rows([r], cache)
            self.cache.mark_projected()  # every row's window is projected; the slots before are out of reach
            self.decoder = Decoder(model, self.cache)
            self.logprobs = torch.cat(logprobs)  # (B, V)

    def feed(self, token: Tensor) -> None:
        self.logprobs = self.decoder.step(token)  # (B, V)

    def memory(self) -> Memory | None:
        return self.cache.memory()


class _WindowRows:
    """Rows of a model without memory: the last ``context`` tokens are recomputed at every step (left-padded,
    with a start at each row's first token, for prompts of different lengths)."""

    def __init__(self, model: nn.Module, rows: list[Tensor], *, context: int, span: Span) -> None:
        self.model, self.context, self.span = model, context, span
        if all(len(row) == len(rows[0]) for row in rows):
            self.seq, self.starts = torch.stack(rows), None  # (B, P)
        else:
            self.seq, self.starts = _left_pad(rows)  # (B, P) each
        self.logprobs = self._next()

    def _next(self) -> Tensor:
        window = self.seq[:, -self.context :]  # (B, min(C, P + i))
        starts = None if self.starts is None else self.starts[:, -self.context :]
        return self.model(window, span=self.span, last_only=True, starts=starts).log_probs[:, -1]  # (B, V)

    def feed(self, token: Tensor) -> None:
        self.seq = torch.cat([self.seq, token[:, None]], dim=1)  # (B, P + i)
        if self.starts is not None:
            self.starts = torch.cat([self.starts, self.starts.new_zeros(self.starts.shape[0], 1)], dim=1)
        self.logprobs = self._next()

    def memory(self) -> Memory | None:
        return None


class _Decoding:
    """One generation: validated settings, the rows as one batch, and the step loop shared by
    :func:`generate` and :func:`stream`."""

    def __init__(
        self,
        model: nn.Module,
        prompt: Any,
        settings: GenerationSettings,
        *,
        generator: torch.Generator | Sequence[torch.Generator] | None,
        memory: Memory | None,
    ) -> None:
        config = model.config
        param = _model_param(model)
        device = param.device if param is not None else torch.device("cpu")
        self.rows = _prepare_rows(prompt, vocab_size=config.vocab_size, device=device)
        span = config.span if settings.span is None else settings.span
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
        if settings.stop_ids is not None:
            if min(settings.stop_ids) < 0 or max(settings.stop_ids) >= config.vocab_size:
                raise ValueError(
                    f"stop_ids must be token ids in [0, {config.vocab_size}), got {list(settings.stop_ids)}"
                )
            self.stop_ids = torch.tensor(settings.stop_ids, dtype=torch.long, device=device)
        if isinstance(generator, (list, tuple)):
            if len(generator) != batch or not all(isinstance(g, torch.Generator) for g in generator):
                raise ValueError(
                    f"generator must be a torch.Generator or a list of one per row ({batch}), got {generator!r:.80}"
                )
            generator = tuple(generator)
        elif generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be a torch.Generator, got {type(generator).__name__}")
        self.model, self.memory_in, self.span = model, memory, span
        self.max_new_tokens, self.sampling, self.generator = (
            settings.max_new_tokens,
            settings.sampling,
            generator,
        )
        self.chunk = settings.prompt_chunk if settings.prompt_chunk is not None else span.mem_len
        self.context = DEFAULT_CONTEXT if settings.context is None else settings.context
        self.dtype = param.dtype if param is not None else torch.get_default_dtype()
        self.batch: _CachedRows | _WindowRows | None = None  # made when the first step runs
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)

    def _start(self) -> None:
        """Feed the prompts (after the given memory) as one batch."""
        if self.cached:
            self.batch = _CachedRows(
                self.model,
                self.rows,
                memory=self.memory_in,
                span=self.span,
                chunk=self.chunk,
                dtype=self.dtype,
            )
        else:
            self.batch = _WindowRows(self.model, self.rows, context=self.context, span=self.span)

    def steps(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Yield (token ids (B,), log-probabilities (B, V)) for each new token: PAD_ID for stopped rows.
        The model is in eval mode, and the work in inference mode, only while this runs."""
        sampling, generator, stop_ids = self.sampling, self.generator, self.stop_ids
        token = None
        with eval_mode(self.model):
            for step in range(self.max_new_tokens):
                with torch.inference_mode():
                    if step == 0:
                        self._start()
                    else:
                        self.batch.feed(token)  # the token sampled last, stopped rows included
                    logprobs = self.batch.logprobs  # (B, V)
                    token = draw(logprobs, sampling, generator=generator)  # (B,)
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
        return None if self.batch is None else self.batch.memory()

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
    max_new_tokens: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    memory: Memory | None = None,
    stop_ids: Sequence[int] | Tensor | None = None,
    prompt_chunk: int | None = None,
    context: int | None = None,
    span: Span | None = None,
    settings: GenerationSettings | None = None,
) -> Iterator[Tensor]:
    """Like :func:`generate`, but yield the new token ids (B,) one step at a time, as they are sampled
    (:data:`PAD_ID` for rows that have stopped); it ends after ``max_new_tokens`` steps or when every row has
    met one of ``stop_ids``. The same arguments and seed give exactly the tokens :func:`generate` returns.

    ``settings``: all the settings as one :class:`GenerationSettings`, instead of their keywords.
    The settings are checked when this is called; the model runs, in eval mode, while the stream is consumed,
    and gets its training flags back when the stream ends or is closed."""
    settings = _settings(
        settings,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop_ids=stop_ids,
        prompt_chunk=prompt_chunk,
        context=context,
        span=span,
    )
    decoding = _Decoding(model, prompt, settings, generator=generator, memory=memory)

    def tokens() -> Iterator[Tensor]:
        for token, _ in decoding.steps():
            yield token.clone()  # an ordinary tensor (not an inference-mode one) that the caller owns

    return tokens()


def generate(
    model: nn.Module,
    prompt: Tensor | Sequence[Tensor],
    *,
    max_new_tokens: int | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    memory: Memory | None = None,
    stop_ids: Sequence[int] | Tensor | None = None,
    prompt_chunk: int | None = None,
    context: int | None = None,
    span: Span | None = None,
    return_scores: bool = False,
    settings: GenerationSettings | None = None,
) -> Generation:
    """Continue ``prompt`` by ``max_new_tokens`` tokens sampled by :func:`sample_next`.

    ``prompt``: (B, P) or (P,) int64, or a list of 1-D rows of different lengths: they run as one batch in
    lockstep (left-padded, each row starting at its first prompt token, so that padding is never attended),
    and each row's log-probabilities are those of its prompt generated alone.

    ``generator``: one ``torch.Generator`` draws the tokens of all rows at once (the draws are those of one
    batch: a row's samples depend on the other rows); a list of one generator per row draws each row's
    token from its own, so that row r samples exactly what ``generate(model, [prompt[r]],
    generator=[g])`` (or ``generator=g``) samples alone from a generator in the same state.

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
    ``settings``: all the settings but ``return_scores`` as one :class:`GenerationSettings`, instead of their
    keywords.

    Runs in inference mode and eval mode, and restores every module's training flag afterwards. A 1-D prompt
    is treated as one row: the result is still batch-first (1, ...)."""
    settings = _settings(
        settings,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop_ids=stop_ids,
        prompt_chunk=prompt_chunk,
        context=context,
        span=span,
    )
    decoding = _Decoding(model, prompt, settings, generator=generator, memory=memory)
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
