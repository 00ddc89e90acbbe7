"""A slow, literal, time-major re-statement of the authors' ``MemTransformerLM`` forward (attention type 0)
over *their* state_dict names, used as the numerical reference in tests.

It is written from the paper's equations and the original code's conventions (time-major [T, B, ...]
tensors, distances in descending order, the -i head column of tail clusters, memory of n_layer + 1 hidden
states), with explicit loops where the real code is clever, so that it shares no code with txl.model.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def _layer_norm(x: Tensor, state: dict[str, Tensor], prefix: str) -> Tensor:
    return F.layer_norm(x, x.shape[-1:], state[prefix + ".weight"], state[prefix + ".bias"], eps=1e-5)


def _embed(tokens: Tensor, state: dict[str, Tensor], *, d_model: int) -> Tensor:
    """tokens [T, B] -> [T, B, D]."""
    n_tables = sum(1 for k in state if k.startswith("word_emb.emb_layers."))
    out = torch.zeros(*tokens.shape, d_model, dtype=state["r_w_bias"].dtype)
    if n_tables == 1:
        emb = state["word_emb.emb_layers.0.weight"][tokens]
        if "word_emb.emb_projs.0" in state:
            emb = emb @ state["word_emb.emb_projs.0"].t()
        return emb * math.sqrt(d_model)
    edges = [0]
    for i in range(n_tables):
        edges.append(edges[-1] + state[f"word_emb.emb_layers.{i}.weight"].shape[0])
    for t in range(tokens.shape[0]):
        for b in range(tokens.shape[1]):
            tok = int(tokens[t, b])
            i = max(c for c in range(n_tables) if tok >= edges[c])
            vec = state[f"word_emb.emb_layers.{i}.weight"][tok - edges[i]]
            out[t, b] = state[f"word_emb.emb_projs.{i}"] @ vec
    return out * math.sqrt(d_model)


def _log_probs(hidden: Tensor, state: dict[str, Tensor], *, cutoffs: list[int]) -> Tensor:
    """hidden [N, D] -> log-probabilities [N, V] of the (projected adaptive) softmax."""
    n_out = sum(1 for k in state if k.startswith("crit.out_layers.") and k.endswith(".weight"))

    def logits(h: Tensor, i: int, weight: Tensor, bias: Tensor) -> Tensor:
        proj = state.get(f"crit.out_projs.{i}")
        if proj is not None:
            h = h @ proj
        return h @ weight.t() + bias

    if "crit.cluster_weight" not in state:
        return torch.log_softmax(
            logits(hidden, 0, state["crit.out_layers.0.weight"], state["crit.out_layers.0.bias"]), -1
        )
    n_clusters = state["crit.cluster_weight"].shape[0]
    if n_out == 1:
        vocab = state["crit.out_layers.0.weight"].shape[0]
        edges = [0, *cutoffs, vocab]
        weights = [state["crit.out_layers.0.weight"][edges[i] : edges[i + 1]] for i in range(n_clusters + 1)]
        biases = [state["crit.out_layers.0.bias"][edges[i] : edges[i + 1]] for i in range(n_clusters + 1)]
    else:
        weights = [state[f"crit.out_layers.{i}.weight"] for i in range(n_out)]
        biases = [state[f"crit.out_layers.{i}.bias"] for i in range(n_out)]
    head_w = torch.cat([weights[0], state["crit.cluster_weight"]])
    head_b = torch.cat([biases[0], state["crit.cluster_bias"]])
    head = torch.log_softmax(logits(hidden, 0, head_w, head_b), -1)
    parts = [head[:, : weights[0].shape[0]]]
    for i in range(1, n_clusters + 1):
        tail = torch.log_softmax(logits(hidden, i, weights[i], biases[i]), -1)
        parts.append(head[:, -i].unsqueeze(1) + tail)  # cluster i's logit is the i-th column from the end
    return torch.cat(parts, dim=1)


def original_forward(
    state: dict[str, Tensor],
    tokens: Tensor,
    targets: Tensor,
    mems: list[Tensor] | None,
    *,
    mem_len: int,
    cutoffs: list[int] | None = None,
    pre_lnorm: bool = False,
    same_length: bool = False,
    clamp_len: int = -1,
) -> tuple[Tensor, list[Tensor]]:
    """tokens, targets [T, B]; mems: n_layer + 1 tensors [M, B, D] or None.
    Returns the per-token loss [T, B] and the new mems, as the original's ``forward(data, target, *mems)``."""
    cutoffs = cutoffs or []
    n_head, d_head = state["r_w_bias"].shape
    n_layer = sum(1 for k in state if k.endswith("dec_attn.qkv_net.weight"))
    d_model = state["layers.0.dec_attn.qkv_net.weight"].shape[1]
    qlen, bsz = tokens.shape
    mlen = 0 if mems is None else mems[0].shape[0]
    klen = mlen + qlen

    word = _embed(tokens, state, d_model=d_model)  # [T, B, D]
    pos_seq = torch.arange(klen - 1, -1, -1.0, dtype=torch.float64)
    if clamp_len > 0:
        pos_seq = pos_seq.clamp(max=clamp_len)
    inv_freq = 1 / (10000 ** (torch.arange(0.0, d_model, 2.0, dtype=torch.float64) / d_model))
    sinusoid = torch.outer(pos_seq, inv_freq)
    pos_emb = torch.cat([sinusoid.sin(), sinusoid.cos()], dim=-1).to(word.dtype)  # [K, D]

    blocked = torch.zeros(qlen, klen, dtype=torch.bool)
    for i in range(qlen):
        for j in range(klen):
            if j > mlen + i:
                blocked[i, j] = True
            if same_length:
                mask_len = klen - mem_len
                shift = qlen - mask_len if mask_len > 0 else qlen
                if j - i <= -shift:
                    blocked[i, j] = True

    hids = [word]
    core = word
    for layer in range(n_layer):
        p = f"layers.{layer}."
        mem = None if mems is None else mems[layer]
        cat = core if mem is None else torch.cat([mem, core], 0)  # [K, B, D]
        if pre_lnorm:
            cat = _layer_norm(cat, state, p + "dec_attn.layer_norm")
        heads = cat @ state[p + "dec_attn.qkv_net.weight"].t()  # [K, B, 3HDh]
        q, k, v = heads.chunk(3, dim=-1)
        q = q[-qlen:].reshape(qlen, bsz, n_head, d_head)
        k = k.reshape(klen, bsz, n_head, d_head)
        v = v.reshape(klen, bsz, n_head, d_head)
        r = (pos_emb @ state[p + "dec_attn.r_net.weight"].t()).reshape(klen, n_head, d_head)  # [K, H, Dh]
        score = torch.empty(qlen, klen, bsz, n_head, dtype=word.dtype)
        for i in range(qlen):
            for j in range(klen):
                distance = mlen + i - j
                m = klen - 1 - distance if distance >= 0 else 0  # row of r for that distance (masked if < 0)
                ac = ((q[i] + state["r_w_bias"]) * k[j]).sum(-1)  # [B, H]
                bd = ((q[i] + state["r_r_bias"]) * r[m]).sum(-1)
                score[i, j] = (ac + bd) / math.sqrt(d_head)
        score = score.masked_fill(blocked[:, :, None, None], float("-inf"))
        prob = torch.softmax(score, dim=1)
        vec = torch.einsum("ijbn,jbnd->ibnd", prob, v).reshape(qlen, bsz, n_head * d_head)
        attn_out = vec @ state[p + "dec_attn.o_net.weight"].t()
        if pre_lnorm:
            out = core + attn_out
        else:
            out = _layer_norm(core + attn_out, state, p + "dec_attn.layer_norm")
        inner_in = _layer_norm(out, state, p + "pos_ff.layer_norm") if pre_lnorm else out
        ff = torch.relu(
            inner_in @ state[p + "pos_ff.CoreNet.0.weight"].t() + state[p + "pos_ff.CoreNet.0.bias"]
        )
        ff = ff @ state[p + "pos_ff.CoreNet.3.weight"].t() + state[p + "pos_ff.CoreNet.3.bias"]
        core = out + ff if pre_lnorm else _layer_norm(out + ff, state, p + "pos_ff.layer_norm")
        hids.append(core)

    new_mems = []
    for i, h in enumerate(hids):
        cat = h if mems is None else torch.cat([mems[i], h], 0)
        end = mlen + qlen
        new_mems.append(cat[max(0, end - mem_len) : end].detach())
    logp = _log_probs(core.reshape(qlen * bsz, d_model), state, cutoffs=cutoffs)
    loss = -logp.gather(1, targets.reshape(-1, 1)).reshape(qlen, bsz)
    return loss, new_mems
