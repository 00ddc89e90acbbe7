"""What ``txl serve``'s requests do on the model's thread: a completion, a text scored, a text read into a
session, as plain token events and results (:mod:`txl.serve.openai` shapes them)."""

# What ``txl serve``'s requests do on the model's thread: a completion (its prompts read, its choices decoded as
# rows), a text scored, a text read into a session; plain token events and results (:mod:`txl.serve.openai`
# shapes them). Readings use the evaluation lengths with memory, generation the model's memory length.
#
# Dimensions: N tokens read, V vocabulary, M memory positions.

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from ..config import has_memory
from ..evaluate import RaggedSettings, ragged_losses
from ..inference import GenerationSettings
from ..inference.text import TextStream
from ..model import Memory
from ..runs import LoadedRun
from .events import ChoiceResult, CompletionResult, Sampling, ScoreResult, TextEvent, TokenInfo
from .jobs import PAUSE, Pause, Ready, Work
from .score import scoring_lengths, token_pieces
from .sessions import CONTEXT_IDS, Session

__all__ = ["Reading", "read_tokens", "Completion", "completion_work", "score_work", "session_read_work"]


@dataclass(frozen=True)
class Reading:
    """A text read after a memory: each target's log-probabilities (N', V) (None when not asked), the losses,
    and the memory and pending token after it."""

    losses: tuple[float, ...]
    log_probs: Tensor | None
    memory: Memory | None
    pending: int | None


def _read(
    run: LoadedRun, seq: list[int], settings: RaggedSettings, memory: Memory | None
) -> Generator[Pause, None, Reading]:
    """Read ``seq`` after ``memory`` with the ragged scorer (the harness's), one model call per slice."""
    losses: list[float] = []
    rows: list[Tensor] = []
    after = memory
    segments = ragged_losses(run.model, [seq], settings, memory=[memory])
    try:
        for step in segments:
            for segment in step:
                losses.extend(segment.loss.tolist())
                if segment.log_probs is not None:
                    rows.append(segment.log_probs)  # (T, V)
                if segment.last and settings.final_memory:
                    after = segment.memory
            yield PAUSE
    finally:
        segments.close()  # type: ignore[attr-defined]
    return Reading(tuple(losses), torch.cat(rows) if rows else None, after, seq[-1])


def read_tokens(
    run: LoadedRun, ids: Sequence[int], *, memory: Memory | None, pending: int | None, log_probs: bool
) -> Generator[Pause, None, Reading]:
    """Read ``ids`` after ``memory`` and the ``pending`` token (the context of the first), segment by segment
    of the evaluation length with memory (``/v1/score``'s reading); the memory and pending token after."""
    lengths = scoring_lengths(run.config, memory=True)
    seq = ([] if pending is None else [pending]) + [int(i) for i in ids]
    if len(seq) < 2:  # nothing to predict: the memory stays as it was
        return Reading((), None, memory, seq[-1] if seq else pending)
    settings = RaggedSettings(lengths.tgt_len, lengths.span, log_probs=log_probs, final_memory=True)
    return (yield from _read(run, seq, settings, memory))


def _top(run: LoadedRun, row: Tensor, k: int) -> dict[str, float]:
    """The ``k`` most likely tokens of ``row`` (V,) as {text: log-probability}."""
    if not k:
        return {}
    values, ids = torch.topk(row.float(), min(k, row.shape[-1]))
    decode = run.vocab.decode
    return {decode([int(i)]): float(v) for v, i in zip(values.tolist(), ids.tolist(), strict=True)}


def _last(memory: Memory | None, length: int) -> Memory | None:
    """The last ``length`` positions of a batch-1 memory (its reach, when it has one, cut to them)."""
    if memory is None or memory.length <= length:
        return memory
    reach = None if memory.reach is None else memory.reach.clamp(max=length)
    return Memory(tuple(state[:, -length:].clone() for state in memory.states), reach)


@dataclass
class _Prompt:
    """One prompt of a completion: its ids, text, the ids its new text is decoded after, its echo."""

    ids: Tensor  # (P,)
    text: str
    context: list[int]
    echo: tuple[TokenInfo, ...] | None = None


@dataclass
class _Choice:
    index: int
    prompt: int
    stream: TextStream
    generator: torch.Generator
    finish: str = "length"
    ids: list[int] = field(default_factory=list)
    tokens: list[TokenInfo] = field(default_factory=list)
    chars: int = 0


class Completion:
    """One completion's choices (``n`` per prompt; choice ``p * n + j`` is prompt p's j-th, seeded with seed +
    j), decoded as rows (:class:`~txl.serve.scheduler.RowWork`). A session's completion has one prompt and one
    choice."""

    def __init__(
        self,
        run: LoadedRun,
        prompts: Sequence[Tensor],
        sampling: Sampling,
        *,
        n: int,
        session: Session | None,
        emit: Callable[[TextEvent], None],
    ) -> None:
        self.run, self.sampling, self.session, self.emit = run, sampling, session, emit
        before = [] if session is None else session.recent
        self.prompts = [
            _Prompt(ids, run.vocab.decode(ids.tolist()), (before + ids.tolist())[-CONTEXT_IDS:])
            for ids in prompts
        ]
        device = next(run.model.parameters()).device
        self.choices = [
            _Choice(
                p * n + j,
                p,
                TextStream(run.vocab, prompt.context, stop=sampling.stop),
                torch.Generator(device=device).manual_seed((sampling.seed + j) % 2**64),
            )
            for p, prompt in enumerate(self.prompts)
            for j in range(n)
        ]
        self.n = len(self.choices)
        self.settings = GenerationSettings(
            temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p
        )
        self.after_prompt: Reading | None = None  # a session's reading of the prompt
        self.start = time.perf_counter()

    def prompt_of(self, choice: int) -> int:
        """Which prompt choice ``choice`` continues."""
        return self.choices[choice].prompt

    def generator(self, choice: int) -> torch.Generator:
        """Choice ``choice``'s random generator (seed + its index among its prompt's choices)."""
        return self.choices[choice].generator

    def push(self, choice: int, token: int, log_probs: Tensor) -> bool:
        """A row drew ``token`` from ``log_probs`` (V,): record it, emit it; True when the choice is over."""
        c, sampling = self.choices[choice], self.sampling
        prompt = self.prompts[c.prompt]
        c.ids.append(token)
        info = None
        if sampling.logprobs is not None:
            window = (prompt.context + c.ids)[-CONTEXT_IDS - 1 :]
            piece = token_pieces(self.run.vocab.decode, window)[-1]
            top = _top(self.run, log_probs, sampling.logprobs)
            info = TokenInfo(piece, float(log_probs[token]), top, len(prompt.text) + c.chars)
            c.chars += len(piece)
            c.tokens.append(info)
        text = c.stream.push(token, final=len(c.ids) == sampling.max_tokens)
        self.emit(TextEvent(c.index, text, None if info is None else (info,)))
        if c.stream.stopped:
            c.finish = "stop"
            return True
        return len(c.ids) >= sampling.max_tokens

    def resume_prompt(self, choice: int) -> Tensor:
        """(P,) what a parked choice is prefilled with: its last token (with memory) or its whole text."""
        c = self.choices[choice]
        if has_memory(self.run.config.model):
            return torch.tensor(c.ids[-1:])
        return torch.cat([self.prompts[c.prompt].ids, torch.tensor(c.ids, dtype=torch.long)])

    def kept_ids(self, choice: _Choice) -> list[int]:
        """The generated ids whose text the client received: a stop string's tokens are left out (a token
        holding both returned text and the stop string's start too)."""
        if choice.finish != "stop":
            return list(choice.ids)
        context = self.prompts[choice.prompt].context
        pieces = token_pieces(self.run.vocab.decode, context + choice.ids)[len(context) :]
        kept, used = 0, 0
        while kept < len(pieces) and used + len(pieces[kept]) <= len(choice.stream.text):
            used += len(pieces[kept])
            kept += 1
        return choice.ids[:kept]

    def done(self) -> Work:
        """Every choice is over: a session reads the prompt and the text its client received, then the result."""
        if self.session is not None and self.after_prompt is not None:
            before = self.after_prompt
            kept = self.kept_ids(self.choices[0])
            reading = yield from read_tokens(
                self.run, kept, memory=before.memory, pending=before.pending, log_probs=False
            )
            self.session.read(self.prompts[0].ids.tolist() + kept, memory=reading.memory)
        return self.result()

    def result(self) -> CompletionResult:
        """The result so far (every choice is over when it is taken)."""
        choices = []
        for c in self.choices:
            prompt = self.prompts[c.prompt]
            tokens = None
            if self.sampling.logprobs is not None:
                tokens = (prompt.echo or ()) + tuple(c.tokens)
            text = prompt.text + c.stream.text if self.sampling.echo else c.stream.text
            choices.append(ChoiceResult(c.index, text, c.finish, tokens))
        count = sum(len(c.ids) for c in self.choices)
        return CompletionResult(tuple(choices), count, time.perf_counter() - self.start)


def _echo_tokens(run: LoadedRun, ids: list[int], reading: Reading, k: int) -> tuple[TokenInfo, ...]:
    """The prompt's tokens with their log-probabilities from ``reading`` (the first: None unless read after a
    pending token)."""
    pieces = token_pieces(run.vocab.decode, ids)
    first = len(ids) - len(reading.losses)  # 1: the first token had no context, 0: it had
    out, at = [], 0
    for t, piece in enumerate(pieces):
        if t < first:
            out.append(TokenInfo(piece, None, None, at))
        else:
            assert reading.log_probs is not None
            row = reading.log_probs[t - first]
            out.append(TokenInfo(piece, float(row[ids[t]]), _top(run, row, k), at))
        at += len(piece)
    return tuple(out)


def completion_work(completion: Completion, *, mem_len: int) -> Work:
    """The work of a completion: each prompt read when it is echoed with log-probabilities (a session's always,
    after its memory), then the choices join rows (``Ready``): a session's after its memory's last ``mem_len``
    positions (the generation's memory length)."""
    run, sampling, session = completion.run, completion.sampling, completion.session
    scored = sampling.echo and sampling.logprobs is not None
    for prompt in completion.prompts:
        ids = prompt.ids.tolist()
        if session is not None:
            completion.after_prompt = yield from read_tokens(
                run, ids, memory=session.memory, pending=session.pending, log_probs=scored
            )
        if scored:
            reading = completion.after_prompt
            if reading is None:
                reading = yield from read_tokens(run, ids, memory=None, pending=None, log_probs=True)
            prompt.echo = _echo_tokens(run, ids, reading, sampling.logprobs or 0)
    if sampling.echo:
        for c in completion.choices:
            prompt = completion.prompts[c.prompt]
            completion.emit(TextEvent(c.index, prompt.text, prompt.echo))
    if sampling.max_tokens == 0:
        return (yield from completion.done())
    pending = [] if session is None or session.pending is None else [session.pending]
    fed = tuple(torch.cat([torch.tensor(pending, dtype=torch.long), p.ids]) for p in completion.prompts)
    memory = None if session is None else _last(session.memory, mem_len)
    yield Ready(completion, fed, memory)
    raise AssertionError("a completion's work ends when it joins its rows")


def score_work(run: LoadedRun, ids: Tensor, *, memory: bool) -> Work:
    """``/v1/score``: every token's log-probability, segments of the evaluation length with or without the
    memory of the previous ones (``txl eval``'s reading)."""
    lengths = scoring_lengths(run.config, memory=memory)
    tgt_len, span = lengths.tgt_len, lengths.span
    id_list = ids.tolist()
    reading = yield from _read(run, id_list, RaggedSettings(tgt_len, span), None)
    pieces = token_pieces(run.vocab.decode, id_list)
    logprobs = [None] + [-x for x in reading.losses]
    return ScoreResult(tuple(zip(id_list, pieces, logprobs, strict=True)), reading.losses, tgt_len, span)


def session_read_work(run: LoadedRun, session: Session, ids: Tensor) -> Work:
    """Read ``ids`` into a session: each token's log-probability given everything the session has read; the
    session's memory then holds them."""
    lengths = scoring_lengths(run.config, memory=True)
    tgt_len, span = lengths.tgt_len, lengths.span
    reading = yield from read_tokens(
        run, ids.tolist(), memory=session.memory, pending=session.pending, log_probs=False
    )
    pieces = token_pieces(run.vocab.decode, session.recent + ids.tolist())[len(session.recent) :]
    first: list[float | None] = [None] if session.pending is None else []
    logprobs = first + [-x for x in reading.losses]
    session.read(ids.tolist(), memory=reading.memory)
    tokens = tuple(zip(ids.tolist(), pieces, logprobs, strict=True))
    return ScoreResult(tokens, reading.losses, tgt_len, span, tokens_read=session.tokens_read)
