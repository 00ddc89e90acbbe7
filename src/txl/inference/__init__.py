"""One decoding engine with thin faces (:func:`generate` and :func:`stream`, the text layer, the harness and
``txl serve``): per-request params, per-engine settings, sampling, the rows, the engine, the loop, and text."""

# One decoding engine with thin faces: :class:`SamplingParams` says what a request asks (its own seed),
# :class:`DecodeSettings` how an engine decodes, :mod:`.sampling` draws a token, :mod:`.rows` holds the rows
# that join, step and leave, :class:`Engine` runs the requests over them, :mod:`.loop` (generate, stream)
# and :mod:`.text` are its clients.
#
#     from txl.inference import SamplingParams, generate, stream
#     params = SamplingParams(max_new_tokens=50, temperature=0.8, top_p=0.9, stop_ids=(eos,), seed=0)
#     gen = generate(model, prompt, params)
#     for step in stream(model, [p1, p2], params):     # step.tokens (B,), step.log_probs (B, V)
#         ...
#
# The engine (continuous batching: a server, the harness):
#
#     engine = Engine(model, DecodeSettings(rows=8))
#     a = engine.add(prompt_ids, SamplingParams(max_new_tokens=20, seed=1))   # -> request id
#     while engine.unfinished:
#         for event in engine.step():     # TokenEvent(request, token, log_probs (V,), finish)
#             ...
#
# Each request decodes exactly as its prompt alone (its own reach; left padding never attended; its own
# generator), whenever it joined and whoever its neighbours are.

from .engine import Engine, Finish, TokenEvent
from .loop import PAD_ID, Generation, Step, generate, stream
from .params import DEFAULT_CONTEXT, GREEDY, GREEDY_BELOW, DecodeSettings, SamplingParams
from .sampling import draw, filter_logits, sample_next

__all__ = [
    "SamplingParams",
    "DecodeSettings",
    "GREEDY",
    "GREEDY_BELOW",
    "DEFAULT_CONTEXT",
    "Engine",
    "TokenEvent",
    "Finish",
    "Step",
    "Generation",
    "PAD_ID",
    "generate",
    "stream",
    "draw",
    "filter_logits",
    "sample_next",
]
