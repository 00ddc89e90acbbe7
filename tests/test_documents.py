"""Documents in one stream (``starts``): several documents read together in one row, in segments with memory,
give each document exactly the log-probabilities it has read alone in one pass (float64, a memory at least as
long as the documents), for the memory path, the key/value cache and the one-position decoder; the memory's
reach by the rule written out; resetting and moving rows of a cache; a zero memory of reach 0 equals an empty
one; no starts and no reach leave the results bit for bit as without them."""

from __future__ import annotations

import pytest
import torch

from txl import Memory, Span, TransformerXL, TransformerXLConfig
from txl.model import KVCache, update_memory
from txl.model.decode import Decoder

V = 41

VARIANTS = {
    "post_norm": {},
    "pre_norm_per_layer_bias": {"pre_norm": True, "share_rel_bias": False},
    "same_length_clamp": {"same_length": True, "clamp_len": 6},
    "adaptive": {"cutoffs": (12, 30), "div_val": 2, "d_embed": 16},
}


def _model(**changes) -> TransformerXL:
    fields = dict(
        vocab_size=V, n_layer=2, n_head=3, d_head=8, d_model=16, d_inner=32, mem_len=16, init_std=0.3
    )
    fields.update(changes)
    torch.manual_seed(0)
    model = TransformerXL(TransformerXLConfig(**fields))
    with torch.no_grad():  # biases start at 0: make them count
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.normal_(0.0, 0.3)
    return model.to(torch.float64).eval()


# Three rows of 36 tokens, each a different cut into documents: several starts in one segment (lengths 2, 3),
# a document over three segments of 6 (14), starts at a segment's first position (row 1: 6, 12, 30; row 2: 6, 12),
# and a row whose first document began before the stream (row 2 has no start at position 0).
LENGTHS = [[5, 9, 2, 3, 14, 3], [6, 6, 10, 8, 6], [4, 2, 6, 1, 13, 5, 5]]
T = 6


def _rows(seed=3):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (len(LENGTHS), sum(LENGTHS[0])), generator=g)
    starts = torch.zeros(tokens.shape, dtype=torch.bool)
    for row, lengths in enumerate(LENGTHS):
        assert sum(lengths) == tokens.shape[1]
        offsets = torch.tensor([0, *lengths[:-1]]).cumsum(0)
        starts[row, offsets] = True
    starts[2, 0] = False  # a stream that begins inside a document: it reaches back to nothing anyway
    return tokens, starts


def _documents(tokens, row):
    """(first, last + 1) of each document of a row."""
    offsets = torch.tensor([0, *LENGTHS[row]]).cumsum(0).tolist()
    return list(zip(offsets[:-1], offsets[1:], strict=True))


def _alone(model, tokens, row, span=None):
    """Each document of a row in one pass on its own, no memory: (T_doc, V) log-probabilities each."""
    with torch.no_grad():
        return [model(tokens[row : row + 1, a:b], span=span).log_probs[0] for a, b in _documents(tokens, row)]


def _together(model, tokens, starts, *, span=None, memory=None):
    """The rows in segments of T with the memory each returns: log-probabilities (B, N, V), last memory."""
    parts = []
    with torch.no_grad():
        for first in range(0, tokens.shape[1], T):
            out = model(
                tokens[:, first : first + T], memory=memory, span=span, starts=starts[:, first : first + T]
            )
            parts.append(out.log_probs)
            memory = out.memory
    return torch.cat(parts, dim=1), memory


def _assert_each_document_as_alone(model, tokens, log_probs, *, span=None, atol=1e-12):
    for row in range(tokens.shape[0]):
        for (a, b), want in zip(_documents(tokens, row), _alone(model, tokens, row, span), strict=True):
            torch.testing.assert_close(log_probs[row, a:b], want, atol=atol, rtol=0)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_documents_read_together_give_each_exactly_its_log_probs_alone(variant):
    model = _model(**VARIANTS[variant])
    tokens, starts = _rows()
    log_probs, memory = _together(model, tokens, starts)
    _assert_each_document_as_alone(model, tokens, log_probs)
    assert memory.reach.tolist() == [3, 6, 5]  # the last document of each row, all remembered
    # without the starts, a document after another reads it: the property is not vacuous
    plain, _ = _together(model, tokens, torch.zeros_like(starts))
    assert (plain[0, 5:14] - log_probs[0, 5:14]).abs().max() > 1e-3


def test_losses_with_targets_are_the_documents_alone(tiny_config):
    """The per-token losses (targets inside each document) equal the document's losses read alone."""
    model = _model()
    tokens, starts = _rows()
    targets = torch.roll(tokens, -1, dims=1)
    memory, losses = None, []
    for first in range(0, tokens.shape[1], T):
        cut = slice(first, first + T)
        out = model(tokens[:, cut], memory=memory, targets=targets[:, cut], starts=starts[:, cut])
        losses.append(out.loss)
        memory = out.memory
    loss = torch.cat(losses, dim=1)
    for row in range(3):
        for a, b in _documents(tokens, row):
            if b - a == 1:
                continue  # a one-token document has no target inside it
            alone = model(tokens[row : row + 1, a : b - 1], targets=tokens[row : row + 1, a + 1 : b]).loss
            torch.testing.assert_close(loss[row, a : b - 1], alone[0], atol=1e-12, rtol=0)


def test_a_longer_evaluation_memory_and_one_segment_of_everything():
    """With a memory longer than the training one (mem_len 20 > 16) and in one 36-token pass (several starts
    in the segment, no memory at all), each document still reads as alone."""
    model = _model()
    tokens, starts = _rows()
    span = Span(mem_len=20)
    log_probs, memory = _together(model, tokens, starts, span=span)
    _assert_each_document_as_alone(model, tokens, log_probs, span=span)
    with torch.no_grad():
        whole = model(tokens, starts=starts)
    _assert_each_document_as_alone(model, tokens, whole.log_probs)
    assert whole.memory.length == 16 and whole.memory.reach.tolist() == [3, 6, 5]


def test_reach_follows_the_rule_written_out():
    """update_memory's reach: the positions since the row's last start, capped at the new length; a memory
    without reach counts whole; an empty memory reaches nothing; none without starts and reach."""
    states = (torch.zeros(4, 5, 2),)
    hiddens = [torch.zeros(4, 4, 2)]
    starts = torch.tensor([[0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)
    memory = Memory(states, reach=torch.tensor([3, 3, 5, 0]))
    assert update_memory(memory, hiddens, mem_len=8, starts=starts).reach.tolist() == [3, 7, 2, 1]
    assert update_memory(memory, hiddens, mem_len=6, starts=None).reach.tolist() == [6, 6, 6, 4]
    assert update_memory(Memory(states), hiddens, mem_len=8, starts=starts).reach.tolist() == [3, 8, 2, 1]
    assert update_memory(None, hiddens, mem_len=3, starts=starts).reach.tolist() == [3, 3, 2, 1]
    assert (
        update_memory(None, hiddens, mem_len=8, starts=torch.zeros(4, 4, dtype=torch.bool)).reach.tolist()
        == [4] * 4
    )
    assert update_memory(Memory(states), hiddens, mem_len=8).reach is None


def test_no_starts_and_all_false_starts_and_full_reach_are_bit_identical():
    """All-False starts on a first segment, and a memory whose reach is everything, change no bit."""
    model = _model(same_length=True)
    tokens, _ = _rows()
    none = torch.zeros(tokens.shape, dtype=torch.bool)
    with torch.no_grad():
        first = model(tokens[:, :T])
        first_false = model(tokens[:, :T], starts=none[:, :T])
        assert torch.equal(first.log_probs, first_false.log_probs)
        assert first.memory.reach is None and first_false.memory.reach.tolist() == [6, 6, 6]
        second = model(tokens[:, T : 2 * T], memory=first.memory)
        full = Memory(first.memory.states, reach=torch.full((3,), first.memory.length))
        second_full = model(tokens[:, T : 2 * T], memory=full)
        assert torch.equal(second.log_probs, second_full.log_probs)
        assert second.memory.reach is None and second_full.memory.reach.tolist() == [12, 12, 12]


def test_a_zero_memory_of_reach_zero_is_an_empty_start():
    """Memory.zeros: the first segments equal those from no memory (to rounding), also through a cache."""
    model = _model()
    tokens, starts = _rows()
    empty, _ = _together(model, tokens, starts)
    zeros = Memory.zeros(model.config, 3, 16, dtype=torch.float64)
    assert zeros.length == 16 and zeros.reach.tolist() == [0, 0, 0] and len(zeros) == 2
    from_zeros, memory = _together(model, tokens, starts, memory=zeros)
    torch.testing.assert_close(from_zeros, empty, atol=1e-12, rtol=0)
    cached = []
    for memory in [Memory.zeros(model.config, 3, 16, dtype=torch.float64), None]:
        cache = KVCache(model.config, batch_size=3, memory=memory, dtype=torch.float64)
        with torch.no_grad():
            parts = [model(tokens[:, i : i + 4], cache=cache).log_probs for i in range(0, tokens.shape[1], 4)]
        cached.append(torch.cat(parts, dim=1))
    torch.testing.assert_close(cached[0], cached[1], atol=1e-12, rtol=0)  # reach 0: a start at position 0


@pytest.mark.parametrize("variant", ["post_norm", "same_length_clamp", "adaptive"])
def test_cache_path_equals_memory_path_with_starts(variant):
    """forward(cache=...) with starts, in segments of other lengths, equals the memory path; the cache's
    memory carries the same reach."""
    model = _model(**VARIANTS[variant])
    tokens, starts = _rows()
    want, memory = _together(model, tokens, starts)
    cache = KVCache(model.config, batch_size=3, dtype=torch.float64)
    got, first = [], 0
    with torch.no_grad():
        for n in [4, 1, 7, 5, 1, 1, 9, 8]:
            cut = slice(first, first + n)
            got.append(model(tokens[:, cut], cache=cache, starts=starts[:, cut]).log_probs)
            first += n
    torch.testing.assert_close(torch.cat(got, dim=1), want, atol=1e-12, rtol=0)
    assert torch.equal(cache.memory().reach, memory.reach)
    for a, b in zip(cache.memory().states, memory.states, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


@pytest.mark.parametrize("variant", ["post_norm", "pre_norm_per_layer_bias", "same_length_clamp"])
def test_decoder_steps_with_starts_equal_forward(variant):
    """Decoder.prefill then step (the lean one-position path), each with starts, gives the memory path's
    log-probabilities at every position: per-row reach honoured in the one-query path."""
    model = _model(**VARIANTS[variant])
    tokens, starts = _rows()
    want, memory = _together(model, tokens, starts)
    decoder = Decoder(model, KVCache(model.config, batch_size=3, dtype=torch.float64))
    got = [decoder.prefill(tokens[:, :5], starts=starts[:, :5], chunk=2)]
    for i in range(5, tokens.shape[1] - 1):
        got.append(decoder.step(tokens[:, i], starts=starts[:, i]))
    torch.testing.assert_close(torch.stack(got, dim=1), want[:, 4:-1], atol=1e-12, rtol=0)
    assert decoder.cache.reach.tolist() == [2, 5, 4]  # the last token is not fed


def test_reset_rows_starts_a_row_anew_and_touches_no_other():
    model = _model()
    g = torch.Generator().manual_seed(5)
    before, after = torch.randint(0, V, (2, 9), generator=g), torch.randint(0, V, (2, 10), generator=g)
    decoder = Decoder(model, KVCache(model.config, batch_size=2, dtype=torch.float64))
    decoder.prefill(before)
    reference = Decoder(model, KVCache(model.config, batch_size=2, dtype=torch.float64))
    reference.prefill(before)
    decoder.cache.reset_rows([0])
    assert decoder.cache.reach.tolist() == [0, 9]
    fresh = Decoder(model, KVCache(model.config, batch_size=1, dtype=torch.float64))
    got = torch.stack([decoder.step(after[:, i]) for i in range(10)], dim=1)
    kept = torch.stack([reference.step(after[:, i]) for i in range(10)], dim=1)
    alone = torch.stack([fresh.step(after[:1, i]) for i in range(10)], dim=1)
    torch.testing.assert_close(got[0], alone[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(got[1], kept[1], atol=1e-12, rtol=0)


def test_put_rows_then_steps_equal_the_request_alone():
    """A request prefilled in a batch-1 cache and moved into row 1 of a full shared cache (built from
    Memory.zeros) then decodes in lockstep with the other rows exactly as it does alone; the other rows
    go on as if nothing happened."""
    model = _model()
    g = torch.Generator().manual_seed(9)
    others, prompt, steps = (
        torch.randint(0, V, (3, 7), generator=g),
        torch.randint(0, V, (1, 5), generator=g),
        torch.randint(0, V, (3, 12), generator=g),
    )
    shared = Decoder(
        model, KVCache(model.config, memory=Memory.zeros(model.config, 3, 16, dtype=torch.float64))
    )
    untouched = Decoder(
        model, KVCache(model.config, memory=Memory.zeros(model.config, 3, 16, dtype=torch.float64))
    )
    shared.prefill(others)
    untouched.prefill(others)
    request = Decoder(model, KVCache(model.config, batch_size=1, dtype=torch.float64))
    request.prefill(prompt)
    shared.cache.put_rows([1], request.cache)
    assert shared.cache.reach.tolist() == [7, 5, 7]
    got = torch.stack([shared.step(steps[:, i]) for i in range(12)], dim=1)
    alone = torch.stack([request.step(steps[1:2, i]) for i in range(12)], dim=1)
    rest = torch.stack([untouched.step(steps[:, i]) for i in range(12)], dim=1)
    torch.testing.assert_close(got[1], alone[0], atol=1e-12, rtol=0)
    torch.testing.assert_close(got[[0, 2]], rest[[0, 2]], atol=1e-12, rtol=0)
    small = KVCache(model.config, batch_size=3, dtype=torch.float64)
    with pytest.raises(ValueError, match="window only 0"):
        small.put_rows([0], request.cache)


def test_memory_keeps_its_reach_through_select_to_cat_and_state_dict():
    memory = Memory((torch.randn(3, 4, 2), torch.randn(3, 4, 2)), reach=torch.tensor([1, 4, 0]))
    assert memory.select([2, 0]).reach.tolist() == [0, 1]
    assert memory.to(torch.float64).reach.dtype == torch.int64
    joined = Memory.cat_rows([memory.select([0]), Memory(memory.select([1, 2]).states)])
    assert joined.reach.tolist() == [1, 4, 4]
    assert Memory.cat_rows([Memory(memory.states)]).reach is None
    tensors = memory.state_dict()
    assert sorted(tensors) == ["memory.0", "memory.1", "memory.reach"]
    back = Memory.from_state_dict(tensors)
    assert torch.equal(back.reach, memory.reach) and torch.equal(back.states[1], memory.states[1])
    assert Memory.from_state_dict(Memory(memory.states).state_dict()).reach is None
    with pytest.raises(ValueError, match="reach"):
        Memory(memory.states, reach=torch.tensor([1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="reach"):
        Memory(memory.states, reach=torch.tensor([1, 2]))


def test_bad_starts_are_an_error_naming_them():
    model = _model()
    tokens = torch.randint(0, V, (2, 5))
    for bad in [torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 4, dtype=torch.bool), [[True] * 5] * 2]:
        with pytest.raises(ValueError, match="starts"):
            model(tokens, starts=bad)
    decoder = Decoder(model, KVCache(model.config, batch_size=2, dtype=torch.float64))
    with pytest.raises(ValueError, match="starts"):
        decoder.step(tokens[:, 0], starts=torch.zeros(2, 1, dtype=torch.bool))


# -- the other paths: SDPA, the vanilla baseline, memories longer than mem_len, starts at every segment -------


def test_the_fused_path_gives_the_same_documents(monkeypatch):
    """attend_fused (scaled_dot_product_attention with the mask in its bias, the path off the CPU), forced on
    the CPU: each document as alone, and equal to the CPU path."""
    from txl.model.attention import RelativeMultiHeadAttention

    model = _model(same_length=True)
    tokens, starts = _rows()
    cpu, _ = _together(model, tokens, starts)
    calls = []

    def fused(self, q, k, v, context):
        calls.append(context.mask.shape)
        return RelativeMultiHeadAttention.attend_fused(self, q, k, v, context)

    monkeypatch.setattr(RelativeMultiHeadAttention, "attend", fused)
    log_probs, _ = _together(model, tokens, starts)
    assert calls and all(shape[0] == 3 and shape[1] == 1 for shape in calls)  # (B, 1, T, K) per row
    _assert_each_document_as_alone(model, tokens, log_probs)
    torch.testing.assert_close(log_probs, cpu, atol=1e-12, rtol=0)


def test_the_vanilla_baseline_reads_documents_alone_within_a_segment():
    """attention="absolute" (no memory): positions count from each document's start and attention is
    block-diagonal, so each document of a 36-token segment equals the document alone; a document cut by
    the segment's start counts from the segment's first position, as without starts."""
    model = _model(attention="absolute", mem_len=0)
    tokens, starts = _rows()
    with torch.no_grad():
        whole = model(tokens, starts=starts)
        assert whole.memory is None
        _assert_each_document_as_alone(model, tokens, whole.log_probs)
        plain = model(tokens[:, :9])
        cut = model(tokens[:, :9], starts=torch.zeros(3, 9, dtype=torch.bool))
    assert torch.equal(plain.log_probs, cut.log_probs)
    assert (plain.log_probs[0, 5:9] - whole.log_probs[0, 5:9]).abs().max() > 1e-3  # not vacuous
    model.train()  # and it trains: gradients through the mask
    loss = model(tokens[:, :-1], targets=tokens[:, 1:], starts=starts[:, :-1]).loss.mean()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_a_memory_longer_than_mem_len_and_a_start_at_every_segment():
    """A memory of 24 positions (from Span(mem_len=24)) continued with mem_len 16 keeps its reach and
    truncates it; documents that each fill a segment (a start at t=0 of every segment) read as alone."""
    model = _model()
    tokens, starts = _rows()
    with torch.no_grad():
        long = model(tokens[:, :24], starts=starts[:, :24], span=Span(mem_len=24))
        assert long.memory.length == 24 and long.memory.reach.tolist() == [5, 2, 11]
        rest, memory = [], long.memory
        for first in range(24, 36, T):
            out = model(tokens[:, first : first + T], memory=memory, starts=starts[:, first : first + T])
            rest.append(out.log_probs)
            memory = out.memory
        assert memory.length == 16 and memory.reach.tolist() == [3, 6, 5]
        head = model(tokens[:, :24], starts=starts[:, :24]).log_probs
    _assert_each_document_as_alone(model, tokens, torch.cat([head, *rest], dim=1))
    every = torch.zeros(tokens.shape, dtype=torch.bool)
    every[:, ::T] = True
    log_probs, memory = _together(model, tokens, every)
    assert memory.reach.tolist() == [6, 6, 6]
    for first in range(0, 36, T):
        with torch.no_grad():
            alone = model(tokens[:, first : first + T]).log_probs
        torch.testing.assert_close(log_probs[:, first : first + T], alone, atol=1e-12, rtol=0)


def test_training_with_starts_gives_gradients_of_the_documents_alone():
    """The gradient of a document's loss, read after another one with starts, equals that of the document
    alone (the mask also stops the gradient)."""
    model = _model()
    model.train()
    model.drop.p = 0.0
    tokens, starts = _rows()
    grads = []
    for inputs, targets, mark in [
        (tokens[:1, :13], tokens[:1, 1:14], starts[:1, :13]),  # documents 0 and 1 of row 0
        (tokens[:1, 5:13], tokens[:1, 6:14], None),  # document 1 alone
    ]:
        model.zero_grad()
        loss = model(inputs, targets=targets, starts=mark).loss
        loss[:, -8:].sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()])
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=0)


def test_a_checkpoint_keeps_the_memory_reach(tmp_path):
    """save_checkpoint / load_checkpoint store the reach as memory.reach; a memory without one stays without."""
    from txl.checkpoint import CheckpointContents, load_checkpoint, save_checkpoint

    model = _model()
    tokens, starts = _rows()
    with torch.no_grad():
        memory = model(tokens[:, :T], starts=starts[:, :T]).memory
    for saved in [memory, Memory(memory.states)]:
        folder = save_checkpoint(tmp_path / "ck", CheckpointContents(model, memory=saved))
        _, back, _ = load_checkpoint(folder, model=model, restore_rng=False)
        assert torch.equal(back.states[1], saved.states[1])
        if saved.reach is None:
            assert back.reach is None
        else:
            assert back.reach.tolist() == saved.reach.tolist() == [1, 6, 2]


def test_starts_after_a_memory_read_without_them_see_all_of_it():
    """A segment with starts after a memory read without any (no reach: every remembered position belongs to
    the row's current document): the tokens before the row's first start see the whole memory, as one pass
    over both segments with the same starts computes (a full recomputation, no memory)."""
    model = _model()
    tokens, starts = _rows()
    first, second = tokens[:, :12], tokens[:, 12:24]  # 12 positions remembered (mem_len 16)
    marks = starts[:, 12:24].clone()
    marks[:, :3] = False  # every row reads 3 tokens of the remembered document before a start
    with torch.no_grad():
        memory = model(first).memory
        assert memory.reach is None and memory.length == 12
        got = model(second, memory=memory, starts=marks).log_probs
        whole = torch.cat([torch.zeros_like(first, dtype=torch.bool), marks], dim=1)
        want = model(tokens[:, :24], starts=whole, span=Span(mem_len=24)).log_probs[:, 12:]
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
