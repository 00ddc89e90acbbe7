"""generate() and stream(): the prompts as requests of one :class:`~txl.inference.engine.Engine`, stepped
until every one is done (as nano-vllm's ``generate``), gathered into a :class:`Step` per token."""

# Dimensions: B batch (rows), P prompt length (the longest), N new tokens, V vocabulary, M memory length.

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..model import Memory, eval_mode
from ..model.transformer import config_of
from .engine import Engine, TokenEvent
from .params import DecodeSettings, SamplingParams
from .rows import _no_memory_why, prepare_rows

__all__ = ["Step", "Generation", "generate", "stream", "PAD_ID"]

PAD_ID = -1
"""The id that fills a row after its last token (and left-pads prompts of different lengths in ``tokens``)."""


@dataclass(frozen=True)
class Step:
    """One step of the decoding (what :func:`stream` yields)."""

    tokens: Tensor
    """(B,) int64 the token drawn for each row (:data:`PAD_ID` for rows that ended at an earlier step)."""
    log_probs: Tensor
    """(B, V) the model's log-probabilities the tokens were drawn from (before temperature and filters; 0
    for rows that ended at an earlier step)."""


@dataclass
class Generation:
    """What :func:`generate` returns.

    Row r's new tokens are ``new_tokens[r, :lengths[r]]``: ``max_new_tokens`` of them, or fewer when one of
    its ``stop_ids`` came (its last token, ``finished[r]``); the positions after them hold :data:`PAD_ID`.
    N is the longest row's length."""

    tokens: Tensor
    """(B, P + N) the prompt followed by the new tokens. Prompts of different lengths are left-padded with
    :data:`PAD_ID` to the longest, so that ``tokens[:, P:]`` are the new tokens of every row."""
    new_tokens: Tensor
    """(B, N) the generated tokens only (:data:`PAD_ID` after a row's last)."""
    memory: Memory | None
    """Each row's memory after the last token fed to the model: its prompt (after the memory it was given)
    and its new tokens but the last (drawn, not fed yet), the last ``span.mem_len`` positions, with a per-row
    :attr:`Memory.reach` (rows of different lengths are left-padded; each row continues its own history only).
    Continue with ``generate(model, gen.tokens[:, -1:], params, memory=gen.memory)`` (every row of the same
    length): the result equals one longer generation. None for models without memory (the vanilla baseline,
    mem_len = 0)."""
    lengths: Tensor
    """(B,) int64, the number of new tokens of each row."""
    finished: Tensor
    """(B,) bool, True where the row ended on one of its ``stop_ids``."""
    scores: Tensor | None = None
    """(B, N, V) the model's log-probabilities of every step (before temperature and filters; 0 after a
    row's last token), with ``return_scores=True``."""


Params = SamplingParams | Sequence[SamplingParams]


def _stack_memories(parts: list[Memory | None]) -> Memory | None:
    """Batch-1 memories of the rows as one :class:`Memory`: left-padded with zeros to the longest, each row's
    length its reach (None when no row remembers anything)."""
    kept = [m for m in parts if m is not None]
    if not kept:
        return None
    longest = max(m.length for m in kept)
    like = kept[0].states[0]
    states = []
    for layer in range(len(kept[0])):
        state = like.new_zeros(len(parts), longest, like.shape[-1])  # (B, M, D)
        for r, m in enumerate(parts):
            if m is not None:
                state[r, longest - m.length :] = m.states[layer][0]
        states.append(state)
    reach = torch.tensor([0 if m is None else m.length for m in parts], dtype=torch.int64, device=like.device)
    return Memory(tuple(states), reach=reach)


class _Decoding:
    """One generation, checked when made: the prompts as requests of one engine, and the steps of
    :func:`generate` and :func:`stream` (each row's i-th token in the i-th step)."""

    def __init__(
        self,
        model: nn.Module,
        prompt: Tensor | Sequence[Tensor],
        params: Params,
        settings: DecodeSettings,
        memory: Memory | None,
    ) -> None:
        config = config_of(model)
        param = next(model.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
        self.rows = prepare_rows(prompt, vocab_size=config.vocab_size, device=device)
        batch = len(self.rows)
        if isinstance(params, SamplingParams):
            per_row = [params] * batch
        elif isinstance(params, (list, tuple)) and all(isinstance(p, SamplingParams) for p in params):
            if len(params) != batch:
                raise ValueError(
                    f"params: give one SamplingParams or a list of one per row ({batch}), got {len(params)}"
                )
            per_row = list(params)
        else:
            raise ValueError(f"params must be a SamplingParams or a list of one per row, got {params!r:.80}")
        if not isinstance(settings, DecodeSettings):
            raise ValueError(f"settings must be a DecodeSettings, got {type(settings).__name__}")
        for p in per_row:
            if p.max_new_tokens < 1:
                raise ValueError("max_new_tokens must be at least 1 to generate (0 generates nothing)")
            if p.stop:
                raise ValueError("stop strings need a vocabulary: use generate_text (or stop_ids here)")
        self.model, self.engine = model, Engine(model, settings)
        memories: list[Memory | None] = [None] * batch
        if memory is not None:
            if not self.engine.has_memory:
                why = _no_memory_why(model)
                raise ValueError(f"memory was given but the model has none ({why}): pass memory=None")
            if not isinstance(memory, Memory):
                raise ValueError(f"memory must be a txl Memory, got {type(memory).__name__}")
            if memory.batch_size != batch:
                raise ValueError(f"memory has {memory.batch_size} batch rows, the prompt {batch}")
            memories = [memory.select([r]) for r in range(batch)]
        self.ids = [
            self.engine.add(row, p, memory=m) for row, p, m in zip(self.rows, per_row, memories, strict=True)
        ]
        self.index = {request: r for r, request in enumerate(self.ids)}
        self.got: list[list[TokenEvent]] = [[] for _ in self.ids]
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)
        self.memories: list[Memory | None] = [None] * batch
        self.vocab_size, self.device = config.vocab_size, device

    def steps(self, *, keep_memory: bool = False) -> Iterator[Step]:
        """One :class:`Step` per new token. The model is in eval mode only while this runs."""
        shown, ended = 0, [False] * len(self.ids)  # steps yielded; rows whose every token was yielded
        with eval_mode(self.model):
            while not all(ended):
                if not self.engine.unfinished:
                    raise AssertionError("the engine ended before every row had its tokens")
                for event in self.engine.step():
                    r = self.index[event.request]
                    self.got[r].append(event)
                    if event.finish is not None:
                        self.finished[r] = event.finish == "stop"
                        if keep_memory:
                            self.memories[r] = self.engine.memory(event.request)
                while all(ended[r] or len(self.got[r]) > shown for r in range(len(self.ids))):
                    yield self._step(shown, ended)
                    shown += 1
                    if all(ended):
                        return

    def _step(self, i: int, ended: list[bool]) -> Step:
        """Each row's i-th token (PAD_ID for rows that ended before), and where each row now stands."""
        tokens = torch.full((len(self.ids),), PAD_ID, dtype=torch.long, device=self.device)
        log_probs: Tensor | None = None  # (B, V)
        for r, got in enumerate(self.got):
            if ended[r]:
                continue
            event = got[i]
            if log_probs is None:
                log_probs = event.log_probs.new_zeros(len(self.ids), event.log_probs.shape[-1])
            tokens[r] = event.token
            log_probs[r] = event.log_probs
            ended[r] = event.finish is not None
        assert log_probs is not None
        return Step(tokens, log_probs)

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
    params: Params = SamplingParams(),
    *,
    settings: DecodeSettings = DecodeSettings(),
    memory: Memory | None = None,
) -> Generator[Step, None, None]:
    """Like :func:`generate`, but yield one :class:`Step` at a time, as the tokens are drawn: ``tokens``
    (B,) (:data:`PAD_ID` for rows that have ended) and the ``log_probs`` (B, V) they were drawn from; it ends
    when every row has its ``max_new_tokens`` or has met one of its ``stop_ids``. The same arguments give
    exactly the tokens :func:`generate` returns.

    The arguments are checked when this is called; the model runs, in eval mode, while the stream is
    consumed, and gets its training flags back when the stream ends or is closed."""
    decoding = _Decoding(model, prompt, params, settings, memory)

    def steps() -> Generator[Step, None, None]:
        for step in decoding.steps():
            yield Step(step.tokens.clone(), step.log_probs.clone())  # ordinary tensors the caller owns

    return steps()


def generate(
    model: nn.Module,
    prompt: Tensor | Sequence[Tensor],
    params: Params = SamplingParams(),
    *,
    settings: DecodeSettings = DecodeSettings(),
    memory: Memory | None = None,
    return_scores: bool = False,
) -> Generation:
    """Continue each row of ``prompt`` as ``params`` says: the rows are requests of one
    :class:`~txl.inference.engine.Engine`, stepped until every one is done.

        gen = generate(model, prompt, SamplingParams(max_new_tokens=50, top_p=0.9, seed=0))
        gen = generate(model, [p1, p2, p3], [params1, params2, params3])        # one params per row
        more = generate(model, gen.tokens[:, -1:], params, memory=gen.memory)    # continue

    ``prompt``: (B, P) or (P,) int64, or a list of 1-D rows of different lengths. ``params``: one
    :class:`~txl.inference.params.SamplingParams` for every row, or a list of one per row. Each row draws from
    a generator of its own, seeded with its ``seed`` (without one: a seed drawn from torch's global
    generator), and reads only its own prompt: row r gets exactly the tokens and log-probabilities of
    ``generate(model, [prompt[r]], params[r])``, whatever the other rows are.

    ``settings`` (:class:`~txl.inference.params.DecodeSettings`): how the rows decode. Transformer-XL
    (relative attention, mem_len > 0): a key/value cache holds, per layer, the keys and values of the
    remembered positions, projected once. The prompt is fed after ``memory`` (if given, (B, M) states) in
    chunks of ``settings.prompt_chunk`` tokens (default ``span.mem_len``); then one token per step. This is
    exactly the segment-wise model: chunks of the prompt, then segments of one token, each with the memory of
    the last ``span.mem_len`` positions (``settings.span``: memory length, clamp and same-length attention,
    default the model's). It equals a full recomputation while prompt and new tokens fit in the memory.

    The vanilla baseline (``attention="absolute"``) and mem_len = 0 have no memory: every step recomputes the
    last ``settings.context`` tokens (default :data:`~txl.inference.params.DEFAULT_CONTEXT`); passing
    ``memory`` is an error.

    ``return_scores``: also return the log-probabilities of every step, (B, N, V). Runs in inference mode and
    eval mode, and restores every module's training flag afterwards. A 1-D prompt is treated as one row: the
    result is still batch-first (1, ...)."""
    decoding = _Decoding(model, prompt, params, settings, memory)
    tokens, scores = [], []
    for step in decoding.steps(keep_memory=True):
        tokens.append(step.tokens)
        if return_scores:
            scores.append(step.log_probs)
    new = torch.stack(tokens, dim=1)  # (B, N)
    lengths = torch.tensor([len(got) for got in decoding.got], dtype=torch.long, device=new.device)
    return Generation(
        tokens=torch.cat([decoding.prompt_tokens(), new], dim=1),
        new_tokens=new,
        memory=_stack_memories(decoding.memories) if decoding.engine.has_memory else None,
        lengths=lengths,
        finished=decoding.finished.clone(),
        scores=torch.stack(scores, dim=1) if return_scores else None,
    )
