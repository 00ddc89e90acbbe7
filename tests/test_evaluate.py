"""The one evaluation protocol: segment_losses against a loop written out here (forward with the memory carried),
with and without the key/value cache, for a token array cut into streams and for streams given as rows; the
reductions that read it (evaluate, analysis.context, serve's scoring) agree with it; eval_mode restores flags."""

from __future__ import annotations

import pytest
import torch

from txl import Span, TransformerXL, TransformerXLConfig
from txl.analysis.context import stream_losses
from txl.config import EvalLengths
from txl.evaluation import EvalSettings, evaluate, segment_losses
from txl.model import eval_mode
from txl.serve.score import score_tokens

V = 40


def _model(**changes) -> TransformerXL:
    fields = dict(
        vocab_size=V, n_layer=2, n_head=2, d_head=6, d_model=12, d_inner=24, mem_len=7, init_std=0.3
    )
    fields.update(changes)
    torch.manual_seed(0)
    return TransformerXL(TransformerXLConfig(**fields)).double()


def _naive(model, rows: torch.Tensor, *, tgt_len: int, span: Span) -> torch.Tensor:
    """Streams (B, L+1): every segment through forward with the memory the previous one returned."""
    memory, losses = None, []
    with torch.no_grad():
        for start in range(0, rows.shape[1] - 1, tgt_len):
            x, y = rows[:, start : start + tgt_len], rows[:, start + 1 : start + 1 + tgt_len]
            out = model(x[:, : y.shape[1]], memory=memory, targets=y, span=span)
            losses.append(out.loss)
            memory = out.memory
    return torch.cat(losses, dim=1)  # (B, L)


@pytest.mark.parametrize("reuse_keys", [True, False])
@pytest.mark.parametrize(
    "span", [Span(mem_len=7), Span(mem_len=3, clamp_len=2, same_length=True), Span(mem_len=0)], ids=str
)
def test_segment_losses_equal_the_loop_written_out(span, reuse_keys):
    model = _model().eval()
    tokens = torch.randint(0, V, (61,), generator=torch.Generator().manual_seed(1))
    # the array cut into 3 streams of 20 targets (the streams share their boundary tokens), the last padded
    rows = torch.stack([tokens[b * 20 : b * 20 + 21] for b in range(3)])  # (3, 21)
    want = _naive(model, rows, tgt_len=6, span=span)
    for given in (tokens, rows):  # the array, or the streams as rows
        segments = list(
            segment_losses(
                model, given, EvalSettings(tgt_len=6, span=span, batch_size=3, reuse_keys=reuse_keys)
            )
        )
        assert [s.loss.shape[1] for s in segments] == [6, 6, 6, 2]
        got = torch.cat([s.loss for s in segments], dim=1)
        torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
        assert sum(s.count for s in segments) == 60


def test_readers_of_the_protocol_agree():
    """evaluate's mean, analysis.context's stream losses and serve's scoring of one stream are the same numbers."""
    model = _model()
    tokens = torch.randint(0, V, (50,), generator=torch.Generator().manual_seed(2))
    span = Span(mem_len=5, same_length=True)
    per_token = torch.cat(
        [s.loss for s in segment_losses(model, tokens, EvalSettings(tgt_len=4, span=span, batch_size=1))], 1
    )
    scored = score_tokens(model, tokens, EvalLengths(4, span)).losses
    streamed = torch.from_numpy(
        stream_losses(model, tokens, EvalSettings(tgt_len=4, span=span, batch_size=1))
    )
    mean = evaluate(model, tokens, EvalSettings(batch_size=1, tgt_len=4, span=span)).loss
    torch.testing.assert_close(scored, per_token[0, :49], atol=0, rtol=0)
    torch.testing.assert_close(streamed, per_token[0, :49], atol=0, rtol=0)
    assert mean == pytest.approx(float(per_token.sum() / 49), abs=1e-12)


def test_eval_mode_restores_every_flag_even_on_errors_and_early_stops():
    model = _model().train()
    model.layers[1].eval()  # a mixed state, restored as it was
    before = {name: m.training for name, m in model.named_modules()}
    with pytest.raises(RuntimeError), eval_mode(model):
        assert not any(m.training for m in model.modules())
        raise RuntimeError("boom")
    assert {name: m.training for name, m in model.named_modules()} == before
    tokens = torch.randint(0, V, (50,), generator=torch.Generator().manual_seed(3))
    calls = iter([False, False, True])
    score_tokens(model, tokens, EvalLengths(4, Span(mem_len=5)), should_stop=lambda: next(calls))
    assert {name: m.training for name, m in model.named_modules()} == before


def test_txl_eval_lays_the_lengths_given_over_the_runs_and_reads_as_evaluate(trained_run, capsys):
    """``txl eval --mem-len 3 --clamp-len 5`` is evaluate() with the span built here by hand from the run's
    config (the lengths not given are its [eval] ones, else its model's), and evaluate_run on the loaded run
    with that span says the same."""
    import json

    from txl.cli import main
    from txl.config import Span, eval_span
    from txl.data import prepare_data
    from txl.evaluation import evaluate_run
    from txl.runs import load_run

    assert main(["eval", str(trained_run), "--mem-len", "3", "--clamp-len", "5", "--max-tokens", "300"]
                + ["--json", "--quiet"]) == 0  # fmt: skip
    record = json.loads(capsys.readouterr().out)
    run = load_run(trained_run)
    config = run.config
    same = config.eval.same_length if config.eval.same_length is not None else config.model.same_length
    span = Span(3, clamp_len=5, same_length=same)
    tgt_len = config.eval.tgt_len or config.train.tgt_len
    tokens = prepare_data(config.data, vocab=run.vocab, splits=("valid",)).splits["valid"][:301]
    expected = evaluate(
        run.model, tokens, EvalSettings(tgt_len=tgt_len, batch_size=config.eval.batch_size, span=span)
    )
    assert (record["mem_len"], record["clamp_len"], record["same_length"]) == (3, 5, same)
    assert (
        record["loss"] == pytest.approx(expected.loss, rel=1e-6)
        and record["tokens"] == expected.tokens == 300
    )
    settings = EvalSettings(span=eval_span(config, mem_len=3, clamp_len=5), max_tokens=300)
    assert evaluate_run(run, settings)["loss"] == pytest.approx(expected.loss, rel=1e-6)
