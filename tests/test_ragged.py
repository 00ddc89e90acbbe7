"""The ragged scorer (``txl.evaluation.ragged_losses``): rows of different lengths read together, rows leaving
and joining the batch, each row's losses, log-probabilities, greedy flags and final memory equal to reading it
alone with ``segment_losses``; rows that start from a memory; models without memory."""

from __future__ import annotations

import pytest
import torch

from txl import Span, TransformerXL, TransformerXLConfig
from txl.evaluation import EvalSettings, RaggedSettings, ragged_losses, score_rows, segment_losses
from txl.model import Memory

V = 40
LENGTHS = [23, 5, 1, 40, 9, 2, 17, 0, 31]


def _model(**changes) -> TransformerXL:
    fields = dict(
        vocab_size=V, n_layer=2, n_head=2, d_head=6, d_model=12, d_inner=24, mem_len=7, init_std=0.3
    )
    fields.update(changes)
    torch.manual_seed(0)
    return TransformerXL(TransformerXLConfig(**fields)).double()


def _rows(lengths=LENGTHS) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    return [torch.randint(0, V, (n,), generator=gen).tolist() for n in lengths]


def _alone(model, row, *, tgt_len, span, memory=None):
    """segment_losses on one row: (losses (L-1,), log-probs (L-1, V), memory after the row)."""
    segments = list(
        segment_losses(
            model,
            torch.tensor(row)[None],
            EvalSettings(tgt_len=tgt_len, span=span, batch_size=1, log_probs=True),
            memory=memory,
        )
    )
    loss = torch.cat([s.loss[0] for s in segments])
    probs = torch.cat([s.log_probs[0] for s in segments])
    return loss, probs, segments[-1].memory


SPANS = [
    Span(mem_len=7),
    Span(mem_len=12, same_length=True),
    Span(mem_len=5, clamp_len=3),
    Span(mem_len=0),
]


@pytest.mark.parametrize("span", SPANS, ids=["mem7", "same_length", "clamp", "no_memory"])
@pytest.mark.parametrize("batch_size", [None, 3])
def test_each_row_equals_reading_it_alone(span, batch_size):
    model, rows = _model(), _rows()
    settings = RaggedSettings(
        tgt_len=4, span=span, batch_size=batch_size, log_probs=True, greedy=True, final_memory=True
    )
    got = score_rows(model, rows, settings)
    for row, scores in zip(rows, got, strict=True):
        if len(row) < 2:
            assert scores.loss.numel() == 0 and scores.memory is None
            continue
        loss, probs, memory = _alone(model, row, tgt_len=4, span=span)
        torch.testing.assert_close(scores.loss, loss, rtol=0, atol=1e-10)
        torch.testing.assert_close(scores.log_probs, probs, rtol=0, atol=1e-10)
        assert torch.equal(scores.greedy, probs.argmax(-1) == torch.tensor(row[1:]))
        if span.mem_len == 0:
            assert memory is None and scores.memory is None
        else:
            for a, b in zip(scores.memory.states, memory.states, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_losses_alone_without_log_probs_and_the_vanilla_baseline():
    model, rows = _model(), _rows()
    got = score_rows(model, rows, RaggedSettings(tgt_len=6, batch_size=2))
    for row, scores in zip(rows, got, strict=True):
        if len(row) >= 2:
            torch.testing.assert_close(scores.loss, _alone(model, row, tgt_len=6, span=model.config.span)[0])
        assert scores.log_probs is None and scores.greedy is None and scores.memory is None
    vanilla = _model(attention="absolute", mem_len=0)
    got = score_rows(vanilla, rows, RaggedSettings(tgt_len=6, batch_size=4))
    for row, scores in zip(rows, got, strict=True):
        if len(row) >= 2:
            torch.testing.assert_close(scores.loss, _alone(vanilla, row, tgt_len=6, span=Span(mem_len=0))[0])


def test_one_row_equals_segment_losses_and_one_long_pass():
    model, (row,) = _model(), _rows([50])
    span = Span(mem_len=64)  # more than the row: one pass over the whole row sees the same
    (scores,) = score_rows(model, [row], RaggedSettings(tgt_len=8, span=span))
    tokens = torch.tensor(row)[None]
    with torch.no_grad():
        whole = model(tokens[:, :-1], targets=tokens[:, 1:], span=span).loss[0].double()
    torch.testing.assert_close(scores.loss, whole, rtol=0, atol=1e-10)


def test_rows_start_from_their_memories_and_read_on():
    model, rows = _model(), _rows([19, 3, 26, 2, 11])
    span = Span(mem_len=7)
    prefixes = _rows([12, 0, 3, 9, 30])
    memories = [_alone(model, p, tgt_len=5, span=span)[2] if len(p) >= 2 else None for p in prefixes]
    settings = RaggedSettings(tgt_len=5, span=span, batch_size=2, final_memory=True)
    got = score_rows(model, rows, settings, memory=memories)
    for row, memory, scores in zip(rows, memories, got, strict=True):
        loss, _, after = _alone(model, row, tgt_len=5, span=span, memory=memory)
        torch.testing.assert_close(scores.loss, loss, rtol=0, atol=1e-10)
        for a, b in zip(scores.memory.states, after.states, strict=True):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    # reading on from a final memory: the next text after the last token read
    (first,) = score_rows(model, [rows[0]], settings)
    (second,) = score_rows(model, [rows[0][-1:] + rows[2]], settings, memory=[first.memory])
    rest = _alone(model, rows[0][-1:] + rows[2], tgt_len=5, span=span, memory=first.memory)[0]
    torch.testing.assert_close(second.loss, rest, rtol=0, atol=1e-10)


def test_the_batch_refills_and_shrinks_as_rows_finish():
    model, rows = _model(), _rows([30, 6, 6, 6, 6, 6, 6])
    sizes = [len(step) for step in ragged_losses(model, rows, RaggedSettings(tgt_len=3, batch_size=2))]
    # the long row and one short row at a time: every call reads two rows until the short ones are done
    assert sizes[:10] == [2] * 10 and sizes[-1] == 1 and sum(sizes) == 10 + 6 * 2


def test_bad_arguments_are_refused_at_once():
    model = _model()
    with pytest.raises(ValueError, match="tgt_len"):
        RaggedSettings(tgt_len=0)
    with pytest.raises(ValueError, match="batch_size"):
        RaggedSettings(tgt_len=2, batch_size=0)
    with pytest.raises(ValueError, match="memory"):
        ragged_losses(model, [[1, 2]], RaggedSettings(tgt_len=2), memory=[None, None])
    memory = Memory.zeros(model.config, 1, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="without memory"):
        ragged_losses(model, [[1, 2]], RaggedSettings(tgt_len=2, span=Span(mem_len=0)), memory=[memory])
