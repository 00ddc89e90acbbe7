"""The analysis package's arithmetic and protocols, against hand-made answers and naive loops: the vanilla
recipe, sliding-window evaluation (every target once, each with a full window), streams with memory (the
evaluate() protocol; exactly c tokens of context), the RECL formulas, the recall corpus, attention
probabilities and the speed and memory tables."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from txl import Span, TransformerXL, TransformerXLConfig
from txl.analysis import (
    AttentionResult,
    SpeedSettings,
    SweepSettings,
    WindowSettings,
    attention_statistics,
    memory_sweep,
    recl_from_gains,
    relative_gains,
    sliding_losses,
    sliding_predictions,
    speed_benchmark,
    stream_losses,
    stream_predictions,
)
from txl.analysis.common import parse_ints
from txl.analysis.context import absolute_hidden
from txl.analysis.recall import recall_accuracy
from txl.analysis.recl import context_losses, default_recl_lengths
from txl.analysis.report import format_table, plain
from txl.analysis.speed import time_vanilla, time_xl
from txl.config import ConfigError, EvalConfig, RunConfig, TrainConfig, load_config, vanilla_baseline
from txl.data.corpora import (
    RECALL_ALPHABET,
    CorpusError,
    load_corpus,
    recall_positions,
    synthetic_recall_text,
)
from txl.evaluation import EvalSettings, evaluate
from txl.runs import LoadedRun

# -- the vanilla recipe -----------------------------------------------------------------------------------


def test_vanilla_baseline_changes_only_attention_memory_and_eval_lengths():
    xl = load_config("books-word-small")
    vanilla = vanilla_baseline(xl)
    assert vanilla.model.attention == "absolute" and vanilla.model.mem_len == 0
    assert vanilla.model.span == Span(mem_len=0)
    assert vanilla.eval.tgt_len == xl.train.tgt_len  # evaluated with the segment it was trained with
    assert (vanilla.eval.mem_len, vanilla.eval.clamp_len, vanilla.eval.same_length) == (None, None, None)
    same = (
        "n_layer",
        "n_head",
        "d_head",
        "d_model",
        "d_inner",
        "cutoffs",
        "div_val",
        "dropout",
        "vocab_size",
    )
    assert all(getattr(vanilla.model, f) == getattr(xl.model, f) for f in same)
    assert (vanilla.data, vanilla.train, vanilla.generate) == (xl.data, xl.train, xl.generate)
    assert vanilla.eval.batch_size == xl.eval.batch_size
    assert vanilla_baseline(vanilla) == vanilla


# -- sliding windows (the vanilla model) ------------------------------------------------------------------


@pytest.fixture
def vanilla_model() -> TransformerXL:
    config = TransformerXLConfig(
        vocab_size=37,
        n_layer=2,
        n_head=3,
        d_head=5,
        d_model=12,
        d_inner=20,
        mem_len=0,
        attention="absolute",
        cutoffs=(10, 20),
        div_val=2,
    )
    return TransformerXL(config).double().eval()


def _naive_loss(model: TransformerXL, x: torch.Tensor, start: int, end: int, target: int) -> float:
    """Loss of ``x[target]`` by one forward over ``x[start:end]`` (which must contain target - 1)."""
    out = model(x[start:end][None], targets=x[start + 1 : end + 1][None])
    return out.loss[0, target - start - 1].item()


@pytest.mark.parametrize("first", [1, 4, 7, 8, 13])
def test_sliding_stride_1_predicts_every_target_once_with_a_full_window(vanilla_model, first):
    x, window = torch.randint(0, 37, (40,)), 7
    got = sliding_losses(vanilla_model, x, WindowSettings(window=window, batch_size=3), first=first)
    expected = [_naive_loss(vanilla_model, x, max(0, t - window), t, t) for t in range(first, 40)]
    assert got.shape == (40 - first,)
    np.testing.assert_allclose(got, expected, atol=1e-12)


@pytest.mark.parametrize("stride", [2, 3, 7])
def test_sliding_stride_s_window_predicts_its_last_s_targets(vanilla_model, stride):
    x, window, n = torch.randint(0, 37, (41,)), 7, 41
    got = sliding_losses(vanilla_model, x, WindowSettings(window=window, stride=stride, batch_size=2))
    expected = [_naive_loss(vanilla_model, x, 0, t, t) for t in range(1, window + 1)]  # the first window
    for group_start in range(window + 1, n, stride):  # then windows ending at each group's last target
        end = min(group_start + stride - 1, n - 1)
        expected += [_naive_loss(vanilla_model, x, end - window, end, t) for t in range(group_start, end + 1)]
    np.testing.assert_allclose(got, expected, atol=1e-12)
    assert len(got) == n - 1


def test_sliding_on_a_split_shorter_than_the_window(vanilla_model):
    x = torch.randint(0, 37, (5,))
    got = sliding_losses(vanilla_model, x, WindowSettings(window=16))
    np.testing.assert_allclose(got, [_naive_loss(vanilla_model, x, 0, t, t) for t in range(1, 5)], atol=1e-12)


def test_absolute_hidden_is_forward_before_the_softmax(vanilla_model):
    x = torch.randint(0, 37, (3, 9))
    hidden = absolute_hidden(vanilla_model, x[:, :-1])
    nll = vanilla_model.softmax.nll(hidden.reshape(-1, 12), x[:, 1:].reshape(-1)).view(3, 8)
    torch.testing.assert_close(nll, vanilla_model(x[:, :-1], targets=x[:, 1:]).loss, rtol=0, atol=1e-12)


def test_sliding_predictions_match_a_naive_argmax(vanilla_model):
    x, window = torch.randint(0, 37, (30,)), 6
    positions = np.array([1, 2, 6, 7, 15, 29])
    got = sliding_predictions(
        vanilla_model, x, WindowSettings(window=window, batch_size=4), positions=positions
    )
    expected = [
        vanilla_model(x[max(0, p - window) : p][None]).log_probs[0, -1].argmax().item() for p in positions
    ]
    assert got.tolist() == expected


def test_sliding_refuses_the_transformer_xl_and_bad_strides(tiny_config, vanilla_model):
    with pytest.raises(ValueError, match="vanilla"):
        sliding_losses(
            TransformerXL(tiny_config), torch.zeros(20, dtype=torch.long), WindowSettings(window=4)
        )
    with pytest.raises(ValueError, match="stride"):
        sliding_losses(vanilla_model, torch.zeros(20, dtype=torch.long), WindowSettings(window=4, stride=5))


# -- streams with memory (the Transformer-XL) -------------------------------------------------------------


@pytest.mark.parametrize("rows", [1, 3, 5])
def test_stream_losses_are_evaluate_token_by_token(tiny_config, rows):
    model = TransformerXL(tiny_config).double()
    x = torch.randint(0, 37, (203,))
    losses = stream_losses(model, x, EvalSettings(tgt_len=5, batch_size=rows))
    result = evaluate(model, x, EvalSettings(batch_size=rows, tgt_len=5))
    assert losses.shape == (202,) and result.tokens == 202
    assert losses.mean() == pytest.approx(result.loss, abs=1e-12)


def test_stream_with_same_length_memory_c_gives_exactly_c_tokens_of_context(tiny_config):
    """One layer: what a query attends to is all it sees, so memory c with same-length attention is a
    window of the c tokens before each target (the RECL protocol for the Transformer-XL)."""
    model = TransformerXL(dataclasses.replace(tiny_config, n_layer=1)).double().eval()
    x, c = torch.randint(0, 37, (90,)), 6
    got = stream_losses(
        model, x, EvalSettings(tgt_len=4, span=Span(mem_len=c, same_length=True), batch_size=3), first=c
    )
    expected = [
        model(x[t - c : t][None], targets=x[t - c + 1 : t + 1][None]).loss[0, -1].item() for t in range(c, 90)
    ]
    np.testing.assert_allclose(got, expected, atol=1e-12)


def test_stream_predictions_are_the_argmax_of_one_long_pass(tiny_config):
    model = TransformerXL(dataclasses.replace(tiny_config, mem_len=64)).double().eval()
    x = torch.randint(0, 37, (50,))
    got = stream_predictions(model, x, EvalSettings(tgt_len=7, batch_size=1), first=3)
    expected = model(x[None, :-1]).log_probs[0].argmax(-1)[2:]  # targets 3..49 are positions 2..48
    assert got.tolist() == expected.tolist()


# -- RECL -------------------------------------------------------------------------------------------------


# Two models, four targets, contexts 1 and 2 (the paper's Appendix C by hand). A gains only on its easy
# targets, B only on the hardest one, and B's own loss at c = 1 is worse than A's everywhere.
RECL_A = [[4.0, 3.0, 2.0, 1.0], [4.0, 3.0, 1.0, 0.5]]  # l_A(c, t), c = 1, 2
RECL_B = [[5.0, 3.5, 2.5, 1.5], [3.0, 3.5, 2.5, 1.5]]  # l_B(c, t)


@pytest.mark.parametrize(
    ("r", "expected_a", "expected_b"),
    [
        # b(1, t) = [4, 3, 2, 1]; top-r hardest: r = 0.25 -> {t0}, 0.5 -> {t0, t1}, 1 -> all four.
        # r = 0.25: f(1,1) = 4; f_A(1,2) = min(4, 4) = 4; f_B(1,2) = min(4, 3) = 3
        (0.25, 0.0, 1 - math.exp(3 - 4)),
        # r = 0.5: f(1,1) = 3.5; f_A = mean(4, 3) = 3.5; f_B = mean(min(4, 3), min(3, 3.5)) = 3
        (0.5, 0.0, 1 - math.exp(3 - 3.5)),
        # r = 1: f(1,1) = 2.5; f_A = mean(4, 3, 1, 0.5) = 2.125; f_B = mean(3, 3, 2, 1) = 2.25
        (1.0, 1 - math.exp(2.125 - 2.5), 1 - math.exp(2.25 - 2.5)),
    ],
)
def test_relative_gains_on_the_top_r_hardest_targets_against_the_group_baseline(r, expected_a, expected_b):
    contexts, gains = relative_gains(np.array([RECL_A, RECL_B]), lengths=[1, 2], delta=1, r=r)
    assert contexts == (1,)
    np.testing.assert_allclose(gains[:, 0], [expected_a, expected_b], rtol=1e-12, atol=1e-15)
    # the perplexity form of the paper: (exp f(c, c) - exp f(c, c')) / exp f(c, c)


def test_relative_gain_is_measured_against_the_best_model_of_the_group():
    """Alone, B's baseline is its own loss at c = 1 (5 on the hardest target), so it gains 1 - e^-2 from
    5 -> 3; in the group the baseline is A's 4, and the gain is 1 - e^-1."""
    _, alone = relative_gains(np.array([RECL_B]), lengths=[1, 2], delta=1, r=0.25)
    _, group = relative_gains(np.array([RECL_A, RECL_B]), lengths=[1, 2], delta=1, r=0.25)
    assert alone[0, 0] == pytest.approx(1 - math.exp(-2)) and group[1, 0] == pytest.approx(1 - math.exp(-1))


def test_relative_loss_is_capped_by_the_baseline():
    """f_i(c, c') takes min(b(c, t), l_i(c', t)): a model cannot gain on a token where it got worse."""
    losses = np.array([[[1.0, 4.0], [3.0, 2.0]]])  # one model: token 0 worse at c'=2, token 1 better
    _, gains = relative_gains(losses, lengths=[1, 2], delta=1, r=1.0)
    assert gains[0, 0] == pytest.approx(1 - math.exp(1.5 - 2.5))  # min([1,4],[3,2]) = [1, 2]
    with pytest.raises(ValueError, match="r must be"):
        relative_gains(losses, lengths=[1, 2], delta=1, r=10)


def test_recl_is_where_the_steps_first_fall_below_the_threshold():
    """The paper's algorithm: from the shortest c, c -> c + delta while g >= 0.01; a later gain above the
    threshold does not count, and still gaining at the last measured context is a lower bound."""
    contexts = [10, 20, 30, 40]
    gains = np.array(
        [
            [0.02, 0.005, 0.5, 0.5],  # stops at 20
            [0.009, 0.5, 0.5, 0.5],  # stops at once: the shortest context
            [0.01, 0.01, 0.2, 0.3],  # never below: at least 50
        ]
    )
    assert recl_from_gains(contexts, gains, delta=10) == [(20, False), (10, False), (50, True)]
    assert recl_from_gains(contexts, gains, delta=10, threshold=0.015) == [
        (20, False),
        (10, False),
        (10, False),
    ]


def test_recl_of_a_hand_made_group():
    """X keeps gaining on its hardest target up to c = 3; Y never beats the baseline: RECL 3 and 1."""
    x = [[4, 2, 2, 2], [3, 2, 2, 2], [2.5, 2, 2, 2], [2.5, 2, 2, 2]]
    y = [[5, 2, 2, 2]] * 4
    contexts, gains = relative_gains(np.array([x, y], dtype=float), lengths=[1, 2, 3, 4], delta=1, r=0.25)
    assert contexts == (1, 2, 3)
    # c=1: b = 4 -> X 3: 1 - e^-1; c=2: b = 3 -> 2.5: 1 - e^-0.5; c=3: b = 2.5 -> 2.5: 0. Y: 0 throughout.
    np.testing.assert_allclose(gains, [[1 - math.exp(-1), 1 - math.exp(-0.5), 0], [0, 0, 0]], atol=1e-15)
    assert recl_from_gains(contexts, gains, delta=1) == [(3, False), (1, False)]


def test_vanilla_context_is_capped_at_its_training_segment(tiny_config):
    """A context longer than the vanilla model's training segment T gives it the T tokens before each
    target, by a naive forward over exactly that window."""
    vanilla = TransformerXL(dataclasses.replace(tiny_config, mem_len=0, attention="absolute"))
    vanilla = vanilla.double().eval()
    config = RunConfig(model=vanilla.config, train=TrainConfig(tgt_len=4))
    x = torch.randint(0, 37, (30,))
    got = context_losses(vanilla, config, x.numpy(), context=12, first=12)
    expected = [_naive_loss(vanilla, x, t - 4, t, t) for t in range(12, 30)]
    np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_default_recl_lengths():
    assert default_recl_lengths(8) == (4, tuple(range(4, 65, 4)))


# -- the recall corpus -------------------------------------------------------------------------------------


def test_recall_corpus_places_every_target_distance_after_its_source():
    text = synthetic_recall_text(5000, distance=9, seed=3)
    lines = text.splitlines()
    positions = recall_positions(text, distance=9)
    assert len(positions) == 8 * len(lines) and len(text) >= 5000
    chars = np.array(list(text))
    assert (chars[positions] == chars[positions - 9]).all()
    for line in lines:  # f r|r: a filler shorter than D, then the copy
        head, _, copy = line.partition("|")
        assert len(copy) == 8 and head.endswith(copy) and len(head) - 8 < 9
        assert set(line) - {"|"} <= set(RECALL_ALPHABET)
    first = lines[0].index("|")
    assert positions[:8].tolist() == list(range(first + 1, first + 9))


def test_recall_corpus_is_deterministic_and_its_splits_differ():
    a, b = (
        load_corpus("synthetic-recall:distance=8,seed=1"),
        load_corpus("synthetic-recall:distance=8,seed=1"),
    )
    assert a.fingerprint == b.fingerprint and a.level == "char"
    assert set(a.splits) == {"train", "valid", "test"} and a.splits["valid"] != a.splits["test"]
    assert load_corpus("synthetic-recall").fingerprint != load_corpus("synthetic-recall:seed=1").fingerprint
    valid = a.text("valid")
    p = recall_positions(valid, distance=8)
    assert (np.array(list(valid))[p] == np.array(list(valid))[p - 8]).all()
    with pytest.raises(CorpusError, match="distance=D"):
        load_corpus("synthetic-recall:length=3")


def test_recall_accuracy_scores_each_position_by_the_prediction_of_its_own_token(tiny_config):
    """Tokens made so that the Transformer-XL predicts exactly the chosen positions (each set to the
    model's argmax given what precedes it): those are hits, and every other scored position is a hit only
    where the model's one-pass argmax (an independent computation) says so."""
    model = TransformerXL(dataclasses.replace(tiny_config, mem_len=16)).double().eval()
    config = RunConfig(
        model=model.config, train=TrainConfig(tgt_len=5), eval=EvalConfig(tgt_len=5, batch_size=1, mem_len=64)
    )
    run = LoadedRun(config=config, vocab=None, model=model, checkpoint=Path("none"), step=0)
    x = torch.randint(0, 37, (60,))
    chosen = [9, 10, 11, 20, 31, 32, 47]
    with torch.no_grad():
        for t in chosen:  # causal: setting a later token never changes an earlier prediction
            x[t] = model(x[None, :t]).log_probs[0, -1].argmax()
        argmax = model(x[None, :-1]).log_probs[0].argmax(-1)  # the prediction of token t is at t - 1
    positions = np.arange(8, 52)  # not up to the end: a shifted prediction must show as a wrong hit
    hits = recall_accuracy(run, x.numpy(), positions, distance=8)
    expected = (argmax[positions - 1] == x[positions]).numpy()
    assert hits.tolist() == expected.tolist()
    assert hits[np.isin(positions, chosen)].all() and not hits.all()


# -- attention, memory and speed --------------------------------------------------------------------------


def test_attention_probabilities_are_what_each_layer_attends_with(tiny_config):
    """The statistics' probabilities, applied to the layer's values and output projection, give the
    attention module's actual output; they sum to one per query."""
    model = TransformerXL(dataclasses.replace(tiny_config, mem_len=8)).double().eval()
    x = np.random.default_rng(0).integers(0, 37, 3 * 40)
    captured = []

    def keep(module, args, kwargs, output):
        captured.append((module, args[0], kwargs.get("memory"), kwargs["context"], output))

    handle = model.layers[1].attn.register_forward_hook(keep, with_kwargs=True)
    stats = attention_statistics(model, x, EvalSettings(tgt_len=4, batch_size=3))
    handle.remove()
    module, h, memory, context, output = captured[-1]
    probs = torch.softmax(module.scores(h, memory=memory, context=context), dim=-1)  # (B, H, T, K)
    _, _, v = module.project(h, memory)
    attended = (probs @ v).transpose(1, 2).reshape(h.shape[0], h.shape[1], -1)
    torch.testing.assert_close(module.out(attended), output)
    counted = 3 * (40 // 4 - 2)  # row-segments after the warm-up of ceil(8 / 4) = 2 segments
    assert stats.queries == counted * 4
    np.testing.assert_allclose(stats.prob_sum.sum(-1), stats.queries)  # each query's probabilities sum to 1
    assert ((stats.memory_share >= 0) & (stats.memory_share <= 1)).all()
    assert stats.seen[0] == stats.queries and stats.seen[11] == counted  # distance 11: the last query only
    assert np.isnan(stats.by_distance[..., 12:]).all()  # K = 12 keys: no distance beyond 11


def _uniform_attention(model: TransformerXL) -> TransformerXL:
    """Queries and global biases zeroed: every score is 0, so each query attends uniformly to the keys it
    can see."""
    with torch.no_grad():
        model.u.zero_()
        model.v.zero_()
        for layer in model.layers:
            inner = layer.attn.qkv.weight.shape[0] // 3
            layer.attn.qkv.weight[:inner] = 0  # rows: q | k | v
    return model


def test_attention_statistics_of_uniform_attention_are_exact(tiny_config):
    """Memory 8, segments of 4, no same-length: query i sees the 8 memory keys and i + 1 current ones, each
    with probability 1 / (9 + i). Memory share: mean_i 8 / (9 + i); mean distance: mean_i (8 + i) / 2; the
    mean probability at distance d: over the queries that see d, of 1 / (9 + i)."""
    model = _uniform_attention(TransformerXL(dataclasses.replace(tiny_config, mem_len=8)).double())
    x = np.random.default_rng(0).integers(0, 37, 3 * 40)
    stats = attention_statistics(model, x, EvalSettings(tgt_len=4, batch_size=3))
    queries = range(4)
    np.testing.assert_allclose(stats.memory_share, np.mean([8 / (9 + i) for i in queries]), rtol=1e-12)
    np.testing.assert_allclose(stats.mean_distance, np.mean([(8 + i) / 2 for i in queries]), rtol=1e-12)
    for d in range(12):
        sees = [i for i in queries if d <= 8 + i]
        expected = np.mean([1 / (9 + i) for i in sees])
        np.testing.assert_allclose(stats.by_distance[..., d], expected, rtol=1e-12)
    result = AttentionResult(
        run="r", split="valid", tgt_len=4, mem_len=8, queries=stats.queries, stats=stats
    ).as_dict()
    for layer in result["layers"]:
        share = np.mean([8 / (9 + i) for i in queries])
        assert (layer["memory_share"], layer["current_share"]) == (
            pytest.approx(share),
            pytest.approx(1 - share),
        )


def test_attention_statistics_refuse_the_vanilla_model(vanilla_model):
    with pytest.raises(ValueError, match="Transformer-XL"):
        attention_statistics(
            vanilla_model, np.zeros(100, dtype=np.int64), EvalSettings(tgt_len=4, batch_size=4)
        )


@pytest.mark.parametrize(("same_length", "clamp_len"), [(False, None), (True, None), (True, 20)])
def test_memory_sweep_rows_are_evaluations_with_that_memory(tiny_config, same_length, clamp_len):
    """Each row is evaluate() with that memory and the sweep's settings (same-length off at memory 0), and
    its clamped figures are evaluate() with clamp_len at the training attention length, 16 + 8 = 24."""
    model = TransformerXL(tiny_config).double()
    x = np.random.default_rng(1).integers(0, 37, 300)
    lengths = [0, 8, 32]
    rows = memory_sweep(
        model,
        x,
        SweepSettings(
            lengths=lengths,
            reading=EvalSettings(
                tgt_len=8, batch_size=2, span=Span(1, clamp_len=clamp_len, same_length=same_length)
            ),
        ),
    )
    assert [r.mem_len for r in rows] == lengths
    for row in rows:
        span = Span(mem_len=row.mem_len, clamp_len=clamp_len, same_length=same_length and row.mem_len > 0)
        result = evaluate(model, x, EvalSettings(batch_size=2, tgt_len=8, span=span))
        clamped = evaluate(
            model, x, EvalSettings(batch_size=2, tgt_len=8, span=dataclasses.replace(span, clamp_len=24))
        )
        assert (row.loss, row.tokens, row.same_length) == (
            pytest.approx(result.loss, abs=1e-12),
            299,
            span.same_length,
        )
        assert row.ppl == pytest.approx(np.exp(row.loss)) and row.bits_per_token == pytest.approx(
            row.loss / np.log(2)
        )
        assert row.clamped_loss == pytest.approx(clamped.loss, abs=1e-12)
        assert row.clamped_ppl == pytest.approx(np.exp(row.clamped_loss))
    # the settings matter on this model: same-length and the clamp change the loss at memory 32
    plain = evaluate(model, x, EvalSettings(batch_size=2, tgt_len=8, span=Span(mem_len=32)))
    assert (rows[2].loss != pytest.approx(plain.loss, abs=1e-10)) == (same_length or clamp_len is not None)
    assert rows[2].clamped_loss != pytest.approx(rows[2].loss, abs=1e-10) or clamp_len == 20


SPEED_SIZES = TransformerXLConfig(vocab_size=50, n_layer=2, n_head=2, d_head=8, d_model=16, d_inner=32)


def test_speed_rows_have_the_agreed_fields(monkeypatch):
    import txl.analysis.speed as speed

    calls = []

    def recorded(model, tokens, **kwargs):
        calls.append((kwargs["length"], kwargs["windows_per_batch"]))
        return time_vanilla(model, tokens, **kwargs)

    monkeypatch.setattr(speed, "time_vanilla", recorded)
    result = speed_benchmark(
        SpeedSettings(
            lengths=(8, 16), model=SPEED_SIZES, segment=4, tokens=6, xl_tokens=8, repeats=1, progress=False
        )
    )
    assert sorted(calls) == [(8, 1), (8, 6), (16, 1), (16, 6)]  # the paper's batch 1, and batched
    rows = result.as_dict()["rows"]
    assert [r["length"] for r in rows] == [8, 16]
    for row in rows:
        assert set(row) == {
            "length",
            "xl_ms_per_token",
            "vanilla_ms_per_token",
            "vanilla_batched_ms_per_token",
            "windows_per_batch",
            "ratio",
            "batched_ratio",
        }
        assert row["ratio"] == pytest.approx(row["vanilla_ms_per_token"] / row["xl_ms_per_token"])
        assert row["batched_ratio"] == pytest.approx(
            row["vanilla_batched_ms_per_token"] / row["xl_ms_per_token"]
        )
        assert row["windows_per_batch"] == 6  # 16384 / L windows, at most the 6 timed
        assert (
            min(row["xl_ms_per_token"], row["vanilla_ms_per_token"], row["vanilla_batched_ms_per_token"]) > 0
        )
    xl = TransformerXL(dataclasses.replace(SPEED_SIZES, mem_len=8))
    assert result.params == sum(p.numel() for p in xl.parameters())
    assert result.threads == torch.get_num_threads() and result.model["n_layer"] == 2
    table = result.table()
    assert "vanilla / XL (batch 1)" in table and "vanilla / XL (batched)" in table and "threads" in table


def _attended_keys(model: TransformerXL) -> tuple[list, list]:
    """Hooks on every layer's attention: (memory length, keys each query attends to) per call."""
    seen, handles = [], []

    def keep(module, args, kwargs):
        memory = kwargs.get("memory")
        seen.append((0 if memory is None else memory.shape[1], (~kwargs["context"].mask).sum(-1).tolist()))

    for layer in model.layers:
        handles.append(layer.attn.register_forward_pre_hook(keep, with_kwargs=True))
    return seen, handles


def test_the_xl_is_timed_with_every_prediction_attending_to_exactly_l_positions():
    model = TransformerXL(dataclasses.replace(SPEED_SIZES, mem_len=8))
    seen, handles = _attended_keys(model)
    ids = torch.randint(0, 50, (200,))
    time_xl(model, ids, length=8, segment=4, predictions=8, repeats=2)
    for h in handles:
        h.remove()
    full = [keys for memory, keys in seen if memory == 8]
    # 2 segments to fill the memory, then 2 timed segments, once for the warm-up and twice timed, 2 layers
    assert len(seen) == 2 * (2 + 3 * 2) and len(full) == 2 * 3 * 2
    assert all(keys == [8, 8, 8, 8] for keys in full)  # same-length: exactly L keys for every query


def test_the_vanilla_model_is_timed_one_window_per_forward_and_batched():
    model = TransformerXL(dataclasses.replace(SPEED_SIZES, mem_len=0, attention="absolute"))
    shapes = []
    handle = model.layers[0].register_forward_pre_hook(
        lambda module, args: shapes.append(tuple(args[0].shape))
    )
    ids = torch.randint(0, 50, (40,))
    time_vanilla(model, ids, length=8, predictions=6, windows_per_batch=1, repeats=2)
    assert shapes == [(1, 8, 16)] * (6 * 3)  # each prediction its own forward of a full window (3 runs)
    shapes.clear()
    time_vanilla(model, ids, length=8, predictions=6, windows_per_batch=4, repeats=2)
    assert shapes == [(4, 8, 16), (2, 8, 16)] * 3
    handle.remove()


# -- small helpers ----------------------------------------------------------------------------------------


def test_report_helpers():
    assert plain({"a": (1, float("inf")), "b": np.float64(2.5), 3: np.int64(4)}) == {
        "a": [1, None],
        "b": 2.5,
        "3": 4,
    }
    table = format_table(["name", "x"], [["a", 1.5], ["bb", None]]).splitlines()
    assert (
        table[0].split() == ["name", "x"]
        and table[2].split() == ["a", "1.5000"]
        and table[3].split() == ["bb", "-"]
    )
    assert parse_ints("0, 8,16", name="--lengths") == (0, 8, 16)
    with pytest.raises(ConfigError, match="--lengths"):
        parse_ints("8,x", name="--lengths")


def _drawn(figure):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure).draw()
    return figure


def test_figures_show_plain_values_without_an_offset():
    pytest.importorskip(
        "matplotlib", reason="the figures need matplotlib: pip install -e '.[plots]' (or '.[test]')"
    )
    from txl.analysis.report import new_figure, plain_ticks

    def narrow():
        figure = new_figure()
        figure.subplots().plot([0, 1, 2], [6.3731, 6.3732, 6.3734])  # a range matplotlib counts from +6.373
        return figure

    assert _drawn(narrow()).axes[0].yaxis.get_offset_text().get_text() != ""  # matplotlib's own choice
    axis = _drawn(plain_ticks(narrow())).axes[0].yaxis
    assert axis.get_offset_text().get_text() == ""
    labels = [t.get_text().replace("\u2212", "-") for t in axis.get_ticklabels() if t.get_text()]
    assert labels and all(label.startswith("6.373") for label in labels), labels


def test_the_speed_figure_gives_the_transformer_xl_its_own_axis():
    pytest.importorskip(
        "matplotlib", reason="the figures need matplotlib: pip install -e '.[plots]' (or '.[test]')"
    )
    from txl.analysis.speed import SpeedResult, SpeedRow

    rows = tuple(
        SpeedRow(
            length=n,
            xl_ms_per_token=xl,
            vanilla_ms_per_token=v,
            vanilla_batched_ms_per_token=v / 2,
            windows_per_batch=8,
            ratio=v / xl,
            batched_ratio=v / 2 / xl,
        )
        for n, xl, v in [(128, 0.5, 20.0), (256, 0.6, 45.0), (512, 0.7, 95.0), (800, 0.8, 150.0)]
    )
    result = SpeedResult(
        model={}, params=0, segment=64, tokens=8, xl_tokens=64, repeats=1, threads=1, device="cpu", rows=rows
    )
    figure = _drawn(result.figures()["speed"]())
    xl_axes = [ax for ax in figure.axes for line in ax.get_lines() if "Transformer-XL" in line.get_label()]
    assert len(xl_axes) == 1
    [xl_line] = [line for line in xl_axes[0].get_lines() if "Transformer-XL" in line.get_label()]
    assert list(xl_line.get_ydata()) == [0.5, 0.6, 0.7, 0.8]
    low, high = xl_axes[0].get_ylim()
    assert high < 2 * 0.8  # the line spans its axis, not the bottom 1% of the vanilla model's
