"""SegmentStream: contiguous rows, shifted targets, resume, evaluation coverage, varlen determinism."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from txl.data import Batch, BatchSettings, SegmentStream


def _collect(stream):
    return list(iter(stream))


def test_rows_are_contiguous_streams_and_targets_shift_by_one():
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, size=1003)
    s = SegmentStream(tokens, BatchSettings(batch_size=4, tgt_len=7))
    length = 1003 // 4
    batches = _collect(s)
    assert len(batches) == s.n_batches == -(-(length - 1) // 7)
    assert all(b.inputs.shape == (4, 7) for b in batches[:-1])
    assert batches[-1].inputs.shape[1] == ((length - 1) % 7 or 7)
    for b in range(4):
        row = tokens[b * length : (b + 1) * length]
        inputs = torch.cat([x.inputs[b] for x in batches]).numpy()
        targets = torch.cat([x.targets[b] for x in batches]).numpy()
        assert np.array_equal(inputs, row[:-1])
        assert np.array_equal(targets, row[1:])
    assert all(x.mask is None and x.inputs.dtype == torch.int64 for x in batches)
    assert s.tokens_per_epoch == sum(x.targets.numel() for x in batches) == 4 * (length - 1)


def test_epoch_rolls_over_and_repeats():
    s = SegmentStream(np.arange(200), BatchSettings(batch_size=2, tgt_len=9))
    first = _collect(s)
    assert (s.epoch, s.position) == (1, 0)
    second = _collect(s)
    assert s.epoch == 2
    assert all(torch.equal(a.inputs, b.inputs) for a, b in zip(first, second, strict=True))


def test_endless_batches_cross_epochs():
    s = SegmentStream(np.arange(100), BatchSettings(batch_size=2, tgt_len=10))
    n = s.n_batches
    got = [b for _, b in zip(range(2 * n + 1), s.batches(), strict=False)]
    assert s.epoch == 2 and torch.equal(got[0].inputs, got[n].inputs)


@pytest.mark.parametrize("varlen", [False, True])
def test_resume_from_state_dict_equals_uninterrupted(varlen):
    tokens = np.random.default_rng(1).integers(0, 1000, size=5000).astype(np.uint16)
    kw = BatchSettings(batch_size=3, tgt_len=20, varlen=varlen, seed=7)
    full = SegmentStream(tokens, kw)
    reference = [b for _, b in zip(range(200), full.batches(), strict=False)]  # > 2 epochs

    s = SegmentStream(tokens, kw)
    it = s.batches()
    head = [next(it) for _ in range(37)]
    state = json.loads(json.dumps(s.state_dict()))  # must survive JSON
    resumed = SegmentStream(tokens, kw)
    resumed.load_state_dict(state)
    tail = [b for _, b in zip(range(200 - 37), resumed.batches(), strict=False)]
    for a, b in zip(reference, head + tail, strict=True):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)


def test_load_state_dict_rejects_other_settings():
    s = SegmentStream(np.arange(500), BatchSettings(batch_size=2, tgt_len=10))
    other = SegmentStream(np.arange(500), BatchSettings(batch_size=4, tgt_len=10))
    with pytest.raises(ValueError, match="batch_size"):
        other.load_state_dict(s.state_dict())


@pytest.mark.parametrize(("n", "batch_size", "tgt_len"), [(103, 4, 5), (1000, 7, 16), (5, 4, 3), (2, 3, 8)])
def test_eval_mode_predicts_every_token_exactly_once(n, batch_size, tgt_len):
    tokens = np.arange(n)  # a target's value is its position
    s = SegmentStream(tokens, BatchSettings(batch_size=batch_size, tgt_len=tgt_len, drop_last=False))
    counts = np.zeros(n, dtype=np.int64)
    total = 0
    for b in s:
        mask = b.mask if b.mask is not None else torch.ones_like(b.targets, dtype=torch.bool)
        assert b.mask is None or not b.mask.all()
        real_t = b.targets[mask]
        assert torch.equal(real_t, b.inputs[mask] + 1)  # a real target follows its input
        np.add.at(counts, real_t.numpy(), 1)
        total += b.n_targets
    assert counts[0] == 0 and (counts[1:] == 1).all()
    assert total == s.tokens_per_epoch == n - 1


def test_varlen_is_deterministic_and_bounded():
    tokens = np.zeros(200_000, dtype=np.int64)
    lens = [
        [
            b.inputs.shape[1]
            for b in SegmentStream(tokens, BatchSettings(batch_size=2, tgt_len=40, varlen=True, seed=s))
        ]
        for s in (3, 3, 4)
    ]
    assert lens[0] == lens[1] and lens[0] != lens[2]
    body = np.array(lens[0][:-1])
    assert body.min() >= 5 and body.max() <= 40 + 15
    assert 34 < body.mean() < 41  # mostly tgt_len, sometimes tgt_len/2
    assert (body < 30).any()  # the half-length draws happen


def test_accepts_tensors_and_memmaps(tmp_path):
    np.save(tmp_path / "t.npy", np.arange(300, dtype=np.uint16))
    mm = np.load(tmp_path / "t.npy", mmap_mode="r")
    a = _collect(SegmentStream(mm, BatchSettings(batch_size=2, tgt_len=10)))
    b = _collect(SegmentStream(torch.arange(300), BatchSettings(batch_size=2, tgt_len=10)))
    assert all(
        torch.equal(x.inputs, y.inputs) and x.inputs.dtype == torch.int64 for x, y in zip(a, b, strict=True)
    )


def test_too_short_is_a_clear_error():
    with pytest.raises(
        ValueError,
        match=r"split 'valid' has 40 tokens, fewer than one segment \(B x \(T\+1\) = 4 x 11 = 44\)",
    ):
        SegmentStream(np.arange(40), BatchSettings(batch_size=4, tgt_len=10), name="valid")
    with pytest.raises(ValueError, match="has 1 tokens"):
        SegmentStream(np.arange(1), BatchSettings(batch_size=1, tgt_len=10, drop_last=False))
    with pytest.raises(ValueError, match="1-D"):
        SegmentStream(np.zeros((2, 50)), BatchSettings(batch_size=1, tgt_len=10))


def test_batch_to_and_counts():
    b = Batch(
        torch.zeros(2, 3, dtype=torch.long),
        torch.ones(2, 3, dtype=torch.long),
        torch.tensor([[True, True, False], [True, False, False]]),
    )
    assert b.n_targets == 3 and b.to("cpu").mask is not None


def test_first_batch_of_each_epoch_says_so_and_resume_keeps_it():
    """All rows wrap together; the flag follows from the position, so a state taken right before the wrap
    gives a first batch that says so."""
    s = SegmentStream(np.arange(300), BatchSettings(batch_size=2, tgt_len=10))
    n = s.n_batches
    flags = [b.new_epoch for _, b in zip(range(2 * n + 1), s.batches(), strict=False)]
    assert flags == ([True] + [False] * (n - 1)) * 2 + [True]

    s = SegmentStream(np.arange(300), BatchSettings(batch_size=2, tgt_len=10))
    for _ in iter(s):  # one whole epoch: the state is position 0 of epoch 1
        pass
    resumed = SegmentStream(np.arange(300), BatchSettings(batch_size=2, tgt_len=10))
    resumed.load_state_dict(json.loads(json.dumps(s.state_dict())))
    first = next(resumed.batches())
    assert first.new_epoch and first.to("cpu").new_epoch
    assert not next(resumed.batches()).new_epoch
    evaluation = list(SegmentStream(np.arange(300), BatchSettings(batch_size=2, tgt_len=10, drop_last=False)))
    assert [b.new_epoch for b in evaluation] == [True] + [False] * (len(evaluation) - 1)
