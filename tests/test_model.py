"""The model computes exactly the paper's Transformer-XL: naive references, recurrence equivalence,
causality, stop-gradient, memory contents, adaptive softmax, the vanilla baseline and config validation."""

from __future__ import annotations

import dataclasses
import math
import re

import pytest
import torch
import torch.nn.functional as F

from txl import EvalConfig, Memory, Span, TransformerXL, TransformerXLConfig
from txl.model import attention_mask, rel_shift
from txl.model.attention import RelativeContext
from txl.model.positional import relative_distances, sinusoid


def _model(config: TransformerXLConfig) -> TransformerXL:
    return TransformerXL(config).double().eval()


def _segments(model, tokens, targets, seg_len, memory=None, span=None):
    losses = []
    for start in range(0, tokens.shape[1], seg_len):
        out = model(
            tokens[:, start : start + seg_len],
            memory=memory,
            targets=targets[:, start : start + seg_len],
            span=span,
        )
        losses.append(out.loss)
        memory = out.memory
    return torch.cat(losses, dim=1), memory


def _attention_inputs(config, b=2, t=4, m=3):
    model = _model(config)
    attn = model.layers[0].attn
    x = torch.randn(b, t, config.d_model, dtype=torch.float64)
    memory = torch.randn(b, m, config.d_model, dtype=torch.float64) if m else None
    pos = sinusoid(relative_distances(m + t, clamp_len=None), config.d_model, dtype=torch.float64)
    mask = attention_mask(t, m, same_length=False, mem_len=config.mem_len)
    u = torch.randn(config.n_head, config.d_head, dtype=torch.float64)
    v = torch.randn(config.n_head, config.d_head, dtype=torch.float64)
    return model, attn, x, memory, pos, mask, u, v


def _naive_scores(attn, config, x, memory, u, v):
    """The four terms of the paper's score, position by position, from the projection weights."""
    b, t, _ = x.shape
    m = 0 if memory is None else memory.shape[1]
    cat = x if memory is None else torch.cat([memory, x], dim=1)
    h, dh = config.n_head, config.d_head
    w_q, w_k, _ = attn.qkv.weight.chunk(3, dim=0)
    w_r = attn.r_net.weight
    inv_freq = 1.0 / (10000 ** (torch.arange(0.0, config.d_model, 2.0, dtype=torch.float64) / config.d_model))
    scores = torch.full((b, h, t, m + t), float("-inf"), dtype=torch.float64)
    for i in range(t):
        for j in range(m + t):
            distance = m + i - j
            if distance < 0:
                continue
            angle = distance * inv_freq
            r_vec = torch.cat([angle.sin(), angle.cos()])  # R_{i-j}
            q_i = (x[:, i] @ w_q.t()).view(b, h, dh)
            k_j = (cat[:, j] @ w_k.t()).view(b, h, dh)
            r_ij = (r_vec @ w_r.t()).view(h, dh)  # W_{k,R} R_{i-j}
            a = (q_i * k_j).sum(-1)  # content
            bb = (q_i * r_ij).sum(-1)  # content-dependent position
            c = (u * k_j).sum(-1)  # global content bias
            d = (v * r_ij).sum(-1)  # global position bias
            scores[:, :, i, j] = (a + bb + c + d) / math.sqrt(dh)
    return scores


# 1. The shifted position term equals a naive double loop -------------------------------------------------


def test_rel_shift_matches_index_formula():
    t, k = 4, 7
    x = torch.arange(2 * t * k, dtype=torch.float64).view(2, t, k)
    y = rel_shift(x)
    for i in range(t):
        for j in range(k):
            if j + t - 1 - i < k:
                assert y[:, i, j].tolist() == x[:, i, j + t - 1 - i].tolist()


@pytest.mark.parametrize(("t", "k"), [(4, 7), (5, 5), (1, 6), (6, 1 + 6)])
def test_rel_shift_gradient_matches_index_formula(t, k):
    """The strided view's backward sends each valid entry's gradient to x[i, j + T - 1 - i] and nothing
    elsewhere (future entries are masked: their gradient is zero), written as an explicit loop."""
    x = torch.randn(3, t, k, dtype=torch.float64, requires_grad=True)
    m = k - t
    valid = torch.tensor([[j <= m + i for j in range(k)] for i in range(t)])
    weights = torch.randn(3, t, k, dtype=torch.float64) * valid
    (grad,) = torch.autograd.grad((rel_shift(x) * weights).sum(), x)
    want = torch.zeros(3, t, k, dtype=torch.float64)
    for i in range(t):
        for j in range(m + i + 1):
            want[:, i, j + t - 1 - i] += weights[:, i, j]
    torch.testing.assert_close(grad, want, rtol=0, atol=0)


@pytest.mark.parametrize(("lead", "t", "k"), [((2, 3), 4, 7), ((1,), 5, 5), ((2,), 1, 6), ((3, 2), 6, 13)])
def test_padded_rel_shift_equals_the_strided_one_forward_and_backward(lead, t, k):
    """The pad-reshape-slice form (the one graph capture and the ONNX export run) and the strided view (eager)
    agree on every entry a query may attend (j <= M + i) and send the same gradient back to x."""
    from txl.model.attention import _rel_shift_padded

    m = k - t
    valid = torch.tensor([[j <= m + i for j in range(k)] for i in range(t)])
    x = torch.randn(*lead, t, k, dtype=torch.float64)
    weights = torch.randn(*lead, t, k, dtype=torch.float64) * valid
    grads = []
    for shift in (rel_shift, _rel_shift_padded):
        leaf = x.clone().requires_grad_(True)
        y = shift(leaf)
        assert y.shape == x.shape
        (grad,) = torch.autograd.grad((y * weights).sum(), leaf)
        grads.append((y.detach() * valid, grad))
    (strided, strided_grad), (padded, padded_grad) = grads
    torch.testing.assert_close(padded, strided, rtol=0, atol=0)
    torch.testing.assert_close(padded_grad, strided_grad, rtol=0, atol=0)


@pytest.mark.parametrize("m", [0, 3])
def test_cpu_attention_equals_the_fused_kernel_path_with_gradients(tiny_config, m):
    """attend (one baddbmm, the CPU path) and attend_fused (scaled_dot_product_attention with a bias, the GPU
    path) give the same output and the same gradients for q, k, v, u, v and the position weights."""
    _, attn, x, memory, pos, mask, u, v = _attention_inputs(tiny_config, t=5, m=m)
    context = RelativeContext(pos=pos, mask=mask, u=u.requires_grad_(), v=v.requires_grad_())
    q, k, val = (t.detach().requires_grad_() for t in attn.project(x, memory))
    weights = torch.randn(q.shape, dtype=torch.float64)  # (B, H, T, Dh), the output's shape
    outs, grads = [], []
    for fn in (attn.attend, attn.attend_fused):
        out = fn(q, k, val, context)
        outs.append(out)
        grads.append(torch.autograd.grad((out * weights).sum(), (q, k, val, u, v, attn.r_net.weight)))
    torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=1e-12)
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("m", [0, 3, 9], ids=["T=K, no memory", "T<K memory 3", "T<K memory 9"])
def test_position_term_matches_naive_double_loop(tiny_config, m):
    model, attn, x, memory, pos, mask, u, v = _attention_inputs(tiny_config, t=5, m=m)
    q, _, _ = attn.project(x, memory)
    fast = attn.position_term(q, pos, v)  # (B, H, T, K)
    w_r = attn.r_net.weight
    t, k = x.shape[1], m + x.shape[1]
    for i in range(t):
        for j in range(k):
            distance = m + i - j
            if distance < 0:
                continue  # the future: masked, the shift leaves unrelated values there
            r = sinusoid(torch.tensor([distance]), tiny_config.d_model, dtype=torch.float64)[0] @ w_r.t()
            naive = ((q[:, :, i] + v) * r.view(tiny_config.n_head, tiny_config.d_head)).sum(-1)  # (B, H)
            torch.testing.assert_close(fast[:, :, i, j], naive, rtol=0, atol=1e-12)


# 2. Attention scores equal the paper's four terms -----------------------------------------------------------


@pytest.mark.parametrize("m", [0, 4])
def test_scores_match_four_terms(tiny_config, m):
    _, attn, x, memory, pos, mask, u, v = _attention_inputs(tiny_config, t=4, m=m)
    context = RelativeContext(pos=pos, mask=mask, u=u, v=v)
    fast = attn.scores(x, memory=memory, context=context)
    naive = _naive_scores(attn, tiny_config, x, memory, u, v)
    torch.testing.assert_close(fast, naive, rtol=0, atol=1e-12)
    # And the fused output is softmax(scores) @ values through the output projection.
    out = attn(x, memory=memory, context=context)
    cat = x if memory is None else torch.cat([memory, x], dim=1)
    values = (cat @ attn.qkv.weight.chunk(3, dim=0)[2].t()).view(
        x.shape[0], -1, tiny_config.n_head, tiny_config.d_head
    )
    mixed = torch.einsum("bhij,bjhd->bihd", naive.softmax(-1), values).reshape(*x.shape[:2], -1)
    torch.testing.assert_close(out, mixed @ attn.out.weight.t(), rtol=0, atol=1e-12)


def _naive_blocked(t: int, m: int, *, same_length: bool, mem_len: int) -> list[list[bool]]:
    """The mask rule written out: query i sits at absolute position p = m + i among keys 0..m+t-1. It may
    attend key j iff j <= p (no future) and, with same_length, p - mem_len < j (its window is the last mem_len
    positions, itself included). This is what the authors' ``triu(1+mlen) + tril(-mask_shift_len)`` computes:
    when klen > mem_len, mask_shift_len = mem_len - mlen and tril blocks j - i <= mlen - mem_len, i.e.
    j <= p - mem_len; when klen <= mem_len it is qlen and blocks only j <= i - qlen < 0 (nothing), and then
    p - mem_len < 0 too."""
    blocked = []
    for i in range(t):
        p = m + i
        row = []
        for j in range(m + t):
            visible = j <= p and (not same_length or j > p - mem_len)
            row.append(not visible)
        blocked.append(row)
    return blocked


@pytest.mark.parametrize(
    ("t", "m", "mem_len"),
    [(4, 6, 6), (4, 3, 6), (4, 1, 6), (4, 0, 6), (8, 0, 6), (8, 3, 6), (8, 6, 6), (1, 6, 6), (3, 2, 1)],
    ids=[
        "m=mem_len",
        "m<mem_len,K>mem_len",
        "K<mem_len",
        "m=0,T<mem_len",
        "m=0,T>mem_len",
        "T>mem_len,m>0",
        "T>mem_len,m=mem_len",
        "one_query",
        "mem_len=1",
    ],
)
@pytest.mark.parametrize("same_length", [True, False])
def test_attention_mask_matches_the_rule_written_out(t, m, mem_len, same_length):
    mask = attention_mask(t, m, same_length=same_length, mem_len=mem_len)
    assert mask.shape == (t, m + t) and mask.dtype == torch.bool
    assert mask.tolist() == _naive_blocked(t, m, same_length=same_length, mem_len=mem_len)
    visible = (~mask).sum(-1).tolist()
    if same_length:  # every query sees mem_len keys, or all there are when fewer exist
        assert visible == [min(m + i + 1, mem_len) for i in range(t)]
    else:
        assert visible == [m + i + 1 for i in range(t)]


def test_same_length_mask_sees_equal_key_counts():
    mask = attention_mask(4, 6, same_length=True, mem_len=6)
    assert (~mask).sum(-1).tolist() == [6, 6, 6, 6]  # every query sees exactly mem_len keys, itself included
    assert mask[0, 0] and not mask[0, 1] and not mask[0, 6] and mask[0, 7] and mask[3, 3] and not mask[3, 9]
    plain = attention_mask(4, 6, same_length=False, mem_len=6)
    assert (~plain).sum(-1).tolist() == [7, 8, 9, 10]


# 3. Recurrence is exact -------------------------------------------------------------------------------------

RECURRENCE_VARIANTS = {
    "post-norm": {},
    "pre-norm": {"pre_norm": True, "final_norm": True},
    "per-layer u,v": {"share_rel_bias": False},
    "adaptive div_val 2": {"cutoffs": (10, 20), "div_val": 2, "d_embed": 16},
    "adaptive div_val 1 projected": {"cutoffs": (10, 25), "d_embed": 8},
    "untied": {"tie_weights": False, "tie_projs": False, "cutoffs": (15,), "div_val": 2},
}


@pytest.mark.parametrize("variant", list(RECURRENCE_VARIANTS))
def test_segments_with_memory_equal_one_long_pass(tiny_config, variant):
    config = dataclasses.replace(tiny_config, mem_len=24, **RECURRENCE_VARIANTS[variant])
    model = _model(config)
    tokens = torch.randint(0, config.vocab_size, (2, 24))
    targets = torch.randint(0, config.vocab_size, (2, 24))
    full = model(tokens, targets=targets).loss
    for seg_len in (4, 6, 24):
        pieces, _ = _segments(model, tokens, targets, seg_len)
        torch.testing.assert_close(pieces, full, rtol=0, atol=1e-10)
    # Without enough memory the recurrence is truncated and the result must differ (the check can fail).
    truncated, _ = _segments(model, tokens, targets, 4, span=Span(mem_len=4))
    assert (truncated - full).abs().max() > 1e-6


# 4. Causality ------------------------------------------------------------------------------------------------


def test_changing_a_token_never_changes_earlier_losses(tiny_config):
    model = _model(tiny_config)
    tokens = torch.randint(0, tiny_config.vocab_size, (1, 18))
    targets = torch.randint(0, tiny_config.vocab_size, (1, 18))
    base, _ = _segments(model, tokens, targets, 6)
    for t in (2, 6, 7, 13):  # within the first segment, at a segment start, within later segments
        changed = tokens.clone()
        changed[0, t] = (changed[0, t] + 1) % tiny_config.vocab_size
        loss, _ = _segments(model, changed, targets, 6)
        torch.testing.assert_close(loss[:, :t], base[:, :t], rtol=0, atol=0)
        assert (loss[:, t:] - base[:, t:]).abs().max() > 1e-9  # and it does change later ones (memory too)


# 5. Stop-gradient -------------------------------------------------------------------------------------------


def test_no_gradient_flows_through_memory(tiny_config):
    model = TransformerXL(tiny_config)
    hidden, memory = model.hidden_states(torch.randint(0, 37, (2, 5)))
    first_loss = model.softmax.nll(hidden.reshape(10, -1), torch.randint(0, 37, (10,)))
    assert all(not s.requires_grad for s in memory.states)
    second = model(torch.randint(0, 37, (2, 5)), memory=memory, targets=torch.randint(0, 37, (2, 5)))
    (grad,) = torch.autograd.grad(second.loss.sum(), hidden, allow_unused=True)
    assert grad is None
    # The first segment's graph still exists and is differentiable on its own.
    (own,) = torch.autograd.grad(first_loss.sum(), hidden)
    assert own.abs().sum() > 0


# 6. Memory truncation and contents ---------------------------------------------------------------------------


def test_memory_is_truncated_to_the_last_positions(tiny_config):
    config = dataclasses.replace(tiny_config, mem_len=5)
    model = _model(config)
    tokens = torch.randint(0, config.vocab_size, (2, 9))
    memory, lengths, finals = None, [], []
    for start in range(0, 9, 3):
        hidden, memory = model.hidden_states(tokens[:, start : start + 3], memory=memory)
        lengths.append(memory.length)
        finals.append(hidden)
    assert lengths == [3, 5, 5]
    assert len(memory) == config.n_layer  # the input of each layer; the last layer's output is never read
    torch.testing.assert_close(memory.states[0], model.embedding(tokens)[:, -5:], rtol=0, atol=0)
    assert not any(torch.equal(s, torch.cat(finals, dim=1)[:, -5:]) for s in memory.states)


def test_memory_disabled_and_row_selection(tiny_config):
    model = _model(dataclasses.replace(tiny_config, mem_len=0))
    assert model(torch.zeros(1, 4, dtype=torch.long)).memory is None
    model = _model(tiny_config)
    tokens = torch.randint(0, 37, (3, 6))
    targets = torch.randint(0, 37, (3, 6))
    out = model(tokens[:, :3], targets=targets[:, :3])
    whole = model(tokens[:, 3:], memory=out.memory, targets=targets[:, 3:]).loss
    row = model(tokens[1:2, 3:], memory=out.memory.select([1]), targets=targets[1:2, 3:]).loss
    torch.testing.assert_close(row, whole[1:2], rtol=0, atol=1e-12)
    rebuilt = Memory.cat_rows([out.memory.select(slice(0, 1)), out.memory.select(slice(1, 3))])
    assert all(torch.equal(a, b) for a, b in zip(rebuilt.states, out.memory.states, strict=True))
    restored = Memory.from_state_dict(out.memory.state_dict())
    assert all(torch.equal(a, b) for a, b in zip(restored.states, out.memory.states, strict=True))


def test_wrong_memory_is_rejected(tiny_config):
    model = _model(tiny_config)
    out = model(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="memory"):
        model(torch.zeros(3, 3, dtype=torch.long), memory=out.memory)


def test_span_changes_lengths_without_touching_the_model(tiny_config):
    model = _model(tiny_config)
    tokens = torch.randint(0, 37, (2, 6))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    out = model(tokens, span=Span(mem_len=3, clamp_len=8, same_length=True))
    assert out.memory.length == 3 and model.config.mem_len == tiny_config.mem_len
    assert model(tokens).memory.length == 6
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.config.span == Span(mem_len=tiny_config.mem_len)
    with pytest.raises(ValueError, match="same_length"):
        Span(mem_len=0, same_length=True)
    with pytest.raises(ValueError, match="mem_len"):
        Span(mem_len=-1)
    vanilla = _model(dataclasses.replace(tiny_config, attention="absolute"))
    assert vanilla.config.span == Span(mem_len=0)
    with pytest.raises(ValueError, match="no memory"):
        vanilla(tokens, span=Span(mem_len=4))


def test_clamp_len_uses_the_clamped_distance_embedding(tiny_config):
    config = dataclasses.replace(tiny_config, mem_len=32, clamp_len=3)
    model = _model(config)
    distances = relative_distances(10, clamp_len=3)
    assert distances.tolist() == [3, 3, 3, 3, 3, 3, 3, 2, 1, 0]
    tokens = torch.randint(0, 37, (1, 10))
    # A model with clamp 3 differs from the unclamped one only when distances exceed 3.
    free = Span(mem_len=32, clamp_len=None)
    assert torch.equal(model(tokens[:, :4]).log_probs, model(tokens[:, :4], span=free).log_probs)
    assert (model(tokens).log_probs - model(tokens, span=free).log_probs).abs().max() > 1e-9


# 7. Adaptive softmax ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra", [{}, {"cutoffs": (10, 20)}, {"cutoffs": (10, 20), "div_val": 2, "d_embed": 16}]
)
def test_adaptive_softmax_normalises_and_lines_up_with_targets(tiny_config, extra):
    model = _model(dataclasses.replace(tiny_config, **extra))
    hidden = torch.randn(50, tiny_config.d_model, dtype=torch.float64)
    logp = model.softmax.log_prob(hidden)
    assert logp.shape == (50, tiny_config.vocab_size)
    torch.testing.assert_close(logp.exp().sum(-1), torch.ones(50, dtype=torch.float64), rtol=0, atol=1e-12)
    target = torch.randint(0, tiny_config.vocab_size, (50,))
    torch.testing.assert_close(
        model.softmax.nll(hidden, target), -logp.gather(1, target[:, None])[:, 0], rtol=0, atol=1e-12
    )
    for bad in (-100, -1, tiny_config.vocab_size):  # no ignore id: every target outside [0, V) is an error
        wrong = target.clone()
        wrong[7] = bad
        with pytest.raises(
            ValueError, match=rf"targets must be token ids in \[0, {tiny_config.vocab_size}\)"
        ):
            model.softmax.nll(hidden, wrong)


def test_no_cutoffs_is_a_full_softmax(tiny_config):
    model = _model(tiny_config)
    hidden = torch.randn(20, tiny_config.d_model, dtype=torch.float64)
    weight = model.embedding.emb_layers[0].weight  # tied
    expected = F.log_softmax(hidden @ weight.t() + model.softmax.out_layers[0].bias, dim=-1)
    torch.testing.assert_close(model.softmax.log_prob(hidden), expected, rtol=0, atol=1e-12)
    tokens = torch.randint(0, 37, (2, 6))
    loss, log_probs = model(tokens, targets=tokens).loss, model(tokens).log_probs
    torch.testing.assert_close(loss, F.cross_entropy(log_probs.transpose(1, 2), tokens, reduction="none"))


def test_tying_shares_parameters(tiny_config):
    model = TransformerXL(dataclasses.replace(tiny_config, cutoffs=(10, 20), div_val=2, d_embed=16))
    for i in range(3):
        assert model.softmax.out_layers[i].weight is model.embedding.emb_layers[i].weight
    for i in (1, 2):
        assert model.softmax.out_projs[str(i)] is model.embedding.emb_projs[str(i)]
    assert model.softmax.out_projs["0"] is not model.embedding.emb_projs["0"]


INIT_RULES = [  # (name pattern, expected mean, which std) as the authors' training script initialises them
    (r"embedding\.emb_layers\.\d+\.weight", 0.0, "init_std"),
    (r"(embedding\.emb_projs|softmax\.out_projs)\.\d+", 0.0, "proj_init_std"),
    (r"layers\.\d+\.attn\.(qkv|r_net|out)\.weight", 0.0, "init_std"),
    (r"layers\.\d+\.ff\.net\.[03]\.weight", 0.0, "init_std"),
    (r"softmax\.out_layers\.\d+\.weight", 0.0, "init_std"),  # only when untied
    (r"[uv]", 0.0, "init_std"),
    (r"(layers\.\d+\.(attn_norm|ff_norm)|norm)\.weight", 1.0, "init_std"),
    (r"softmax\.cluster_weight", 0.0, "init_std"),
    (
        r"(layers\.\d+\.ff\.net\.[03]|softmax\.out_layers\.\d+|layers\.\d+\.(attn_norm|ff_norm)|norm)\.bias"
        r"|softmax\.cluster_bias",
        0.0,
        None,
    ),  # zeros
]


@pytest.mark.parametrize("tied", [True, False])
def test_initialisation_follows_the_original(tied):
    """Every parameter group has the authors' distribution: its sample mean within 5 standard errors of the
    expected mean, its sample std within 5 standard errors of the expected std, and (for large groups) about
    68.3% of its values within one std of the mean, as a normal distribution (a uniform one has 57.7%)."""
    config = TransformerXLConfig(
        vocab_size=3000,
        n_layer=3,
        n_head=8,
        d_head=16,
        d_model=128,
        d_inner=256,
        cutoffs=(600, 1500),
        div_val=2,
        d_embed=128,
        pre_norm=True,
        final_norm=True,
        share_rel_bias=False,
        tie_weights=tied,
        tie_projs=tied,
        init_std=0.05,
        proj_init_std=0.01,
    )
    model = TransformerXL(config)
    groups: dict[int, list[torch.Tensor]] = {k: [] for k in range(len(INIT_RULES))}
    for name, param in model.named_parameters():  # tied parameters are listed once
        matches = [k for k, (pattern, _, _) in enumerate(INIT_RULES) if re.fullmatch(pattern, name)]
        assert len(matches) == 1, f"{name} matches {len(matches)} initialisation rules"
        groups[matches[0]].append(param.detach().flatten())
    names = {name for name, _ in model.named_parameters()}
    assert {"softmax.cluster_weight", "embedding.emb_projs.2", "softmax.out_projs.0", "norm.weight"} <= names
    assert ("softmax.out_layers.1.weight" in names) == (not tied)
    for k, (pattern, mean, std_name) in enumerate(INIT_RULES):
        if not groups[k]:  # only the output weights, which are the embeddings when tied
            assert tied and pattern == INIT_RULES[4][0], f"no parameter matches {pattern}"
            continue
        values = [*groups[k], torch.cat(groups[k])]  # each tensor, then the group pooled
        for x in values:
            if std_name is None:
                assert torch.all(x == 0), pattern
                continue
            std, n = getattr(config, std_name), x.numel()
            assert abs(x.mean().item() - mean) < 5 * std / math.sqrt(n), pattern
            assert abs(x.std().item() / std - 1) < 5 / math.sqrt(2 * n), pattern
        pooled = values[-1]
        if std_name is not None and pooled.numel() >= 2000:
            within = ((pooled - mean).abs() < getattr(config, std_name)).double().mean().item()
            assert abs(within - 0.6827) < 5 * math.sqrt(0.6827 * 0.3173 / pooled.numel()), pattern
    # Initialising again keeps the tied weights tied (the same tensors, not copies).
    model.reset_parameters()
    for i in range(3):
        same = model.softmax.out_layers[i].weight is model.embedding.emb_layers[i].weight
        assert same == tied
    for i in (1, 2):
        assert (model.softmax.out_projs[str(i)] is model.embedding.emb_projs[str(i)]) == tied


# 9. The vanilla baseline --------------------------------------------------------------------------------------


def test_absolute_baseline_positions_only_at_input(tiny_config):
    config = dataclasses.replace(tiny_config, attention="absolute")
    model = _model(config)
    assert model.u is None and not hasattr(model.layers[0].attn, "r_net")
    tokens = torch.randint(0, 37, (2, 7))
    out = model(tokens, targets=tokens)
    assert out.memory is None
    # The same computation by hand: embedding * sqrt(D) + absolute sinusoid, then plain causal layers.
    h = model.embedding.emb_layers[0].weight[tokens] * math.sqrt(config.d_model)
    h = h + sinusoid(torch.arange(7), config.d_model, dtype=torch.float64)
    for layer in model.layers:
        attn = layer.attn
        q, k, v = (
            z.view(2, 7, config.n_head, config.d_head).transpose(1, 2)
            for z in (h @ attn.qkv.weight.t()).chunk(3, -1)
        )
        score = (q @ k.transpose(-1, -2)) / math.sqrt(config.d_head)
        score = score.masked_fill(torch.triu(torch.ones(7, 7, dtype=torch.bool), 1), float("-inf"))
        mixed = (score.softmax(-1) @ v).transpose(1, 2).reshape(2, 7, -1) @ attn.out.weight.t()
        h = layer.attn_norm(h + mixed)
        h = layer.ff_norm(h + layer.ff(h))
    expected = model.softmax.nll(h.reshape(14, -1), tokens.reshape(-1)).view(2, 7)
    torch.testing.assert_close(out.loss, expected, rtol=0, atol=1e-12)
    # The same token at every position: without positions every output would be the same (each query and
    # its keys are identical copies); with absolute positions each position's output differs.
    same = model(torch.full((1, 7), 5)).log_probs[0]  # (T, V)
    assert (same[1:] - same[:-1]).abs().amax(-1).min() > 1e-6


@pytest.mark.parametrize("attention", ["relative", "absolute"])
def test_positions_tell_the_order_of_earlier_tokens(tiny_config, attention):
    """In one layer, the output at position i sees the query x_i and the *set* of keys x_0..x_i: swapping
    two earlier tokens leaves that set unchanged, so only the position encoding can change the output."""
    # init_std 0.5 instead of 0.02 makes the attention sharp, so that the differences are large
    model = _model(dataclasses.replace(tiny_config, n_layer=1, attention=attention, init_std=0.5))
    tokens = torch.tensor([[3, 17, 8, 30, 11, 25]])
    swapped = tokens[:, [1, 0, 2, 3, 4, 5]]
    later = (model(tokens).log_probs[:, 2:] - model(swapped).log_probs[:, 2:]).abs().amax(-1)  # (1, T-2)
    assert later.min() > 1e-5
    if attention == "relative":  # control: with W_R = 0 the position term vanishes and the orders agree
        with torch.no_grad():
            model.layers[0].attn.r_net.weight.zero_()
        torch.testing.assert_close(
            model(tokens).log_probs[:, 2:], model(swapped).log_probs[:, 2:], rtol=0, atol=1e-12
        )


def test_relative_positions_reach_into_memory(tiny_config):
    """The same current tokens after the same remembered states in another order: keys and values are the
    same set, only their distances differ, so the outputs differ through the relative positions alone."""
    model = _model(dataclasses.replace(tiny_config, n_layer=1, mem_len=8, init_std=0.5))
    memory = model(torch.tensor([[4, 9, 21, 2, 33]])).memory  # the embeddings of 5 tokens (the layer's input)
    reordered = Memory(tuple(s[:, [4, 2, 0, 1, 3]] for s in memory.states))
    tokens = torch.tensor([[6, 14, 6]])
    diff = (model(tokens, memory=memory).log_probs - model(tokens, memory=reordered).log_probs).abs().amax(-1)
    assert diff.min() > 1e-5
    with torch.no_grad():  # control: without the position term the order of the memory is invisible
        model.layers[0].attn.r_net.weight.zero_()
    torch.testing.assert_close(
        model(tokens, memory=memory).log_probs, model(tokens, memory=reordered).log_probs, rtol=0, atol=1e-12
    )


def test_absolute_baseline_rejects_memory(tiny_config):
    xl = _model(tiny_config)
    memory = xl(torch.zeros(2, 3, dtype=torch.long)).memory
    vanilla = _model(dataclasses.replace(tiny_config, attention="absolute"))
    with pytest.raises(ValueError, match="no memory"):
        vanilla(torch.zeros(2, 3, dtype=torch.long), memory=memory)


# 10. Config validation ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"n_layer": -1}, "n_layer"),
        ({"d_inner": 0}, "d_inner"),
        ({"d_model": 13}, "d_model"),
        ({"mem_len": -2}, "mem_len"),
        ({"attention": "sliding"}, "attention"),
        ({"dropout": 1.5}, "dropout"),
        ({"cutoffs": (20, 10)}, "cutoffs"),
        ({"cutoffs": (10, 300)}, "cutoffs"),
        ({"div_val": 2}, "div_val"),
        ({"clamp_len": 0}, "clamp_len"),
    ],
)
def test_invalid_config_names_the_field(changes, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        TransformerXLConfig(**changes)


def test_same_length_without_memory_is_rejected():
    """same_length with mem_len=0 would give every query zero keys (an all-blocked mask, output exactly 0)."""
    mask = attention_mask(3, 0, same_length=True, mem_len=0)
    assert mask.all()  # what the rejected combination would compute
    with pytest.raises(ValueError, match=r"^same_length:.*mem_len"):
        TransformerXLConfig(same_length=True, mem_len=0)
    TransformerXLConfig(same_length=True, mem_len=1)  # any memory is fine
    TransformerXLConfig(same_length=False, mem_len=0)  # no memory without same_length is fine
    TransformerXLConfig(attention="absolute", same_length=True, mem_len=0)  # the baseline ignores both
    with pytest.raises(ValueError, match=r"^same_length:.*mem_len"):
        EvalConfig(same_length=True, mem_len=0)
    for ok in (
        {"same_length": True},
        {"mem_len": 0},
        {"same_length": True, "mem_len": 4},
        {"same_length": False, "mem_len": 0},
    ):
        EvalConfig(**ok)  # one of them left to the model, or a harmless pair


def test_float32_default_and_train_mode_dropout(tiny_config):
    model = TransformerXL(dataclasses.replace(tiny_config, dropout=0.3, dropatt=0.2))
    tokens = torch.randint(0, 37, (2, 6))
    a, b = model(tokens, targets=tokens).loss, model(tokens, targets=tokens).loss
    assert a.dtype == torch.float32 and not torch.equal(a, b)
    model.eval()
    assert torch.equal(model(tokens, targets=tokens).loss, model(tokens, targets=tokens).loss)


def test_hidden_states_are_forward_before_the_softmax(tiny_config):
    model = _model(tiny_config).eval()
    tokens = torch.randint(0, tiny_config.vocab_size, (2, 12))
    first = model(tokens[:, :6], targets=tokens[:, 1:7])
    hidden, memory = model.hidden_states(tokens[:, 6:11], memory=first.memory)
    want = model(tokens[:, 6:11], memory=first.memory, targets=tokens[:, 7:12])
    nll = model.softmax.nll(hidden.reshape(-1, tiny_config.d_model), tokens[:, 7:12].reshape(-1)).view(2, 5)
    torch.testing.assert_close(nll, want.loss, rtol=0, atol=0)
    for got, expected in zip(memory.states, want.memory.states, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)


# 10. The forward interface ----------------------------------------------------------------------------------


def test_forward_takes_exactly_the_documented_arguments():
    """No test-only or never-used switches (return_logits, return_hidden, ignore_index), no train() override."""
    import inspect

    assert list(inspect.signature(TransformerXL.forward).parameters) == [
        "self",
        "tokens",
        "memory",
        "targets",
        "span",
        "cache",
        "last_only",
        "starts",
    ]
    assert TransformerXL.train is torch.nn.Module.train


@pytest.mark.parametrize(
    "extra", [{}, {"cutoffs": (10, 20)}, {"cutoffs": (10, 20), "div_val": 2, "d_embed": 16}]
)
@pytest.mark.parametrize("bad", [37, 77, -1, -5, -100])
def test_targets_outside_the_vocabulary_are_an_error(tiny_config, extra, bad):
    """As F.cross_entropy: a target outside [0, V) raises (plain and adaptive softmax), it never gives a finite
    loss; with a cache too."""
    model = _model(dataclasses.replace(tiny_config, **extra))
    tokens = torch.randint(0, 37, (2, 6), generator=torch.Generator().manual_seed(0))
    targets = tokens.clone()
    targets[1, 3] = bad
    with pytest.raises(ValueError, match=r"targets must be token ids in \[0, 37\)"):
        model(tokens, targets=targets)
    from txl.model import KVCache

    cache = KVCache(model.config, batch_size=2, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"targets must be token ids in \[0, 37\)"):
        model(tokens, targets=targets, cache=cache)


def test_log_probs_field_is_normalised_and_has_no_alias(tiny_config):
    model = _model(tiny_config)
    out = model(torch.randint(0, 37, (2, 5)))
    torch.testing.assert_close(out.log_probs.exp().sum(-1), torch.ones(2, 5, dtype=torch.float64))
    assert not hasattr(out, "logits")
