"""The decoding loop: rows of a :class:`~txl.inference.rows.RowBatch` (or :class:`~.rows.WindowRows`) fed
one sampled token per step, yielding a :class:`Step`; :func:`generate` and :func:`stream` are thin wrappers."""

# Dimensions: B batch (rows), P prompt length (the longest), N new tokens, V vocabulary.

from __future__ import annotations

from collections.abc import Generator, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..config import has_memory
from ..model import Memory, eval_mode
from ..model.transformer import config_of
from ..threads import threads_for
from .rows import RowBatch, WindowRows, prepare_rows, rows_for
from .sampling import draw
from .settings import GenerationSettings

__all__ = ["Step", "Generation", "generate", "stream", "PAD_ID"]

PAD_ID = -1
"""The id that fills a row after its stop id (and left-pads prompts of different lengths in ``tokens``)."""


@dataclass(frozen=True)
class Step:
    """One step of the decoding loop (what :func:`stream` yields)."""

    tokens: Tensor
    """(B,) int64 the token drawn for each row (:data:`PAD_ID` for rows that stopped at an earlier step)."""
    log_probs: Tensor
    """(B, V) the model's log-probabilities the tokens were drawn from (before temperature and filters)."""


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
    has not been fed yet). Continue with ``generate(model, tokens[:, -1:], settings, memory=memory)``: the
    result equals one longer generation. Rows that stopped early were fed their own samples until the batch
    ended, not the padding shown. For prompts of different lengths it has a per-row reach
    (:attr:`Memory.reach`): each row continues its own history only. None for models without memory (the
    vanilla baseline, mem_len = 0)."""
    lengths: Tensor
    """(B,) int64, the number of new tokens of each row (N unless the row stopped)."""
    finished: Tensor
    """(B,) bool, True where the row ended on one of ``stop_ids``."""
    scores: Tensor | None = None
    """(B, N, V) the model's log-probabilities of every step (before temperature and filters), with
    ``return_scores=True``."""


Generators = torch.Generator | Sequence[torch.Generator] | None


class _Decoding:
    """One generation, checked when made: the rows as one batch, and the step loop of :func:`generate` and
    :func:`stream`."""

    def __init__(
        self,
        model: nn.Module,
        prompt: Tensor | Sequence[Tensor],
        settings: GenerationSettings,
        generator: Generators,
        memory: Memory | None,
    ) -> None:
        if not isinstance(settings, GenerationSettings):
            raise ValueError(f"settings must be a GenerationSettings, got {type(settings).__name__}")
        if settings.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be at least 1 to generate (0 generates nothing)")
        if settings.stop:
            raise ValueError("stop strings need a vocabulary: use generate_text (or stop_ids here)")
        config = config_of(model)
        param = next(model.parameters(), None)
        device = param.device if param is not None else torch.device("cpu")
        self.rows = prepare_rows(prompt, vocab_size=config.vocab_size, device=device)
        batch = len(self.rows)
        if memory is not None:
            if not has_memory(config, settings.span):
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
        self.stop_ids: Tensor | None = None
        if settings.stop_ids is not None:
            if max(settings.stop_ids) >= config.vocab_size:
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
        elif generator is None and settings.seed is not None:
            generator = torch.Generator(device=device).manual_seed(settings.seed)
        self.model, self.settings, self.memory_in, self.generator = model, settings, memory, generator
        self.batch: RowBatch | WindowRows = rows_for(model, batch, settings)
        self.lengths = torch.zeros(batch, dtype=torch.long, device=device)
        self.finished = torch.zeros(batch, dtype=torch.bool, device=device)

    def steps(self) -> Iterator[Step]:
        """One :class:`Step` per new token. The model is in eval mode, and the work in inference mode, only
        while this runs; each step runs on txl's thread count for decoding (:func:`~txl.threads.threads_for`),
        the caller's count restored between steps."""
        settings, generator, stop_ids, batch = self.settings, self.generator, self.stop_ids, self.batch
        token = None
        with eval_mode(self.model):
            for _ in range(settings.max_new_tokens):
                with torch.inference_mode(), threads_for("tokens"):
                    if token is None:
                        prefilled = batch.prefill(self.rows, self.memory_in)
                        batch.join(range(batch.size), prefilled)
                        log_probs = prefilled.log_probs  # (B, V)
                    else:
                        log_probs = batch.step(token)  # the token sampled last, stopped rows included
                    token = draw(log_probs, settings, generator=generator)  # (B,)
                    shown, done = token, False
                    if stop_ids is not None:
                        running = ~self.finished
                        self.lengths += running
                        shown = torch.where(running, token, PAD_ID)
                        self.finished = self.finished | (running & torch.isin(token, stop_ids))
                        done = bool(self.finished.all())
                yield Step(shown, log_probs)
                if done:
                    return

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
    settings: GenerationSettings = GenerationSettings(),
    *,
    generator: Generators = None,
    memory: Memory | None = None,
) -> Generator[Step, None, None]:
    """Like :func:`generate`, but yield one :class:`Step` at a time, as the tokens are sampled: ``tokens``
    (B,) (:data:`PAD_ID` for rows that have stopped) and the ``log_probs`` (B, V) they were drawn from; it
    ends after ``max_new_tokens`` steps or when every row has met one of ``stop_ids``. The same arguments
    and seed give exactly the tokens :func:`generate` returns.

    The arguments are checked when this is called; the model runs, in eval mode, while the stream is
    consumed, and gets its training flags back when the stream ends or is closed."""
    decoding = _Decoding(model, prompt, settings, generator, memory)

    def steps() -> Generator[Step, None, None]:
        for step in decoding.steps():
            yield Step(step.tokens.clone(), step.log_probs.clone())  # ordinary tensors the caller owns

    return steps()


def generate(
    model: nn.Module,
    prompt: Tensor | Sequence[Tensor],
    settings: GenerationSettings = GenerationSettings(),
    *,
    generator: Generators = None,
    memory: Memory | None = None,
    return_scores: bool = False,
) -> Generation:
    """Continue ``prompt`` by ``settings.max_new_tokens`` tokens drawn as ``settings`` says.

        gen = generate(model, prompt, GenerationSettings(max_new_tokens=50, top_p=0.9, seed=0))
        gen = generate(model, [p1, p2, p3], settings, generator=[g1, g2, g3])   # one seed per row
        more = generate(model, gen.tokens[:, -1:], settings, memory=gen.memory)  # continue

    ``prompt``: (B, P) or (P,) int64, or a list of 1-D rows of different lengths: they run as one batch of
    rows (:class:`~txl.inference.rows.RowBatch`), each reading only its own prompt, so that each row's
    log-probabilities are those of its prompt generated alone.

    ``generator``: one ``torch.Generator`` draws the tokens of all rows at once (the draws are those of one
    batch: a row's samples depend on the other rows); a list of one generator per row draws each row's
    token from its own, so that row r samples exactly what ``generate(model, [prompt[r]], settings,
    generator=[g])`` samples alone from a generator in the same state. None: one seeded with
    ``settings.seed``, or torch's global generator.

    Transformer-XL (relative attention, mem_len > 0): a key/value cache holds, per layer, the keys and values
    of the remembered positions, projected once. The prompt is fed after ``memory`` (if given) in chunks of
    ``settings.prompt_chunk`` tokens (default ``span.mem_len``); then one token per step. This is exactly the
    segment-wise model: chunks of the prompt, then segments of one token, each with the memory of the last
    ``span.mem_len`` positions (``settings.span``: memory length, clamp and same-length attention, default
    the model's). It equals a full recomputation while prompt and new tokens fit in the memory.

    The vanilla baseline (``attention="absolute"``) and mem_len = 0 have no memory: every step recomputes the
    last ``settings.context`` tokens (default :data:`~txl.inference.settings.DEFAULT_CONTEXT`); passing
    ``memory`` is an error.

    ``return_scores``: also return the log-probabilities of every step, (B, N, V). Runs in inference mode and
    eval mode, and restores every module's training flag afterwards. A 1-D prompt is treated as one row: the
    result is still batch-first (1, ...)."""
    decoding = _Decoding(model, prompt, settings, generator, memory)
    tokens, scores = [], []
    for step in decoding.steps():
        tokens.append(step.tokens)
        if return_scores:
            scores.append(step.log_probs)
    new = torch.stack(tokens, dim=1)  # (B, N)
    if decoding.stop_ids is not None:
        lengths = decoding.lengths.clone()
    else:
        lengths = torch.full_like(decoding.lengths, new.shape[1])
    return Generation(
        tokens=torch.cat([decoding.prompt_tokens(), new], dim=1),
        new_tokens=new,
        memory=decoding.batch.memory(),
        lengths=lengths,
        finished=decoding.finished.clone(),
        scores=torch.stack(scores, dim=1) if return_scores else None,
    )
