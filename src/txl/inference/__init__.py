"""One decoding core with four faces (:func:`generate`, the text layer, the harness and ``txl serve``):
settings, sampling, the rows that join, step and leave, the loop, and text."""

# One decoding core with four faces (:func:`generate`, the text layer, the harness and ``txl serve``):
# :class:`GenerationSettings` says how (one frozen value), :mod:`.sampling` draws a token, :mod:`.rows` holds
# the rows that join, step and leave, :mod:`.loop` runs them, :mod:`.text` reads and writes text.
#
#     from txl.inference import GenerationSettings, generate, stream
#     settings = GenerationSettings(max_new_tokens=50, temperature=0.8, top_p=0.9, stop_ids=(eos,))
#     gen = generate(model, prompt, settings, generator=torch.Generator().manual_seed(0))
#     for step in stream(model, [p1, p2], settings):     # step.tokens (B,), step.log_probs (B, V)
#         ...
#
# The row protocol (continuous batching: a server, the harness), the same for :class:`RowBatch` (a
# Transformer-XL with memory) and :class:`WindowRows` (no memory); :func:`rows_for` picks one:
#
#     rows = rows_for(model, 8, settings)            # R = 8 rows, all free
#     first = rows.prefill(prompt_ids, memory=None)  # (P,) apart from the batch -> Prefilled, first.log_probs (1, V)
#     # for a server: steps = rows.prefill_steps(ids); next(steps) between the other rows' steps; StopIteration.value
#     rows.join(3, first)                            # row 3 continues that prompt (rows.join(5, first): a 2nd choice)
#     token = draw(first.log_probs, settings, generator=g)
#     log_probs = rows.step(tokens)                  # (R,) one token per row (free rows: any value) -> (R, V)
#     memory = rows.row_memory(3)                    # row 3's own memory (batch 1), before it leaves
#     rows.free(3)                                   # the row is free again; nothing it remembers is attended
#
# Each row decodes exactly as its prompt alone (its own reach; left padding never attended), whenever it
# joined and whoever its neighbours are. The rows run in inference mode; put the model in eval mode first
# (``txl.model.eval_mode``), as :func:`generate` does.

from .loop import PAD_ID, Generation, Step, generate, stream
from .rows import Prefilled, RowBatch, WindowRows, rows_for
from .sampling import draw, filter_logits, sample_next
from .settings import DEFAULT_CONTEXT, GREEDY, GREEDY_BELOW, GenerationSettings

__all__ = [
    "GenerationSettings",
    "GREEDY",
    "GREEDY_BELOW",
    "DEFAULT_CONTEXT",
    "Step",
    "Generation",
    "PAD_ID",
    "generate",
    "stream",
    "RowBatch",
    "WindowRows",
    "Prefilled",
    "rows_for",
    "draw",
    "filter_logits",
    "sample_next",
]
