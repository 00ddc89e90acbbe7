"""Adaptive input embedding (Baevski & Auli) and the projected adaptive softmax (Grave et al.), as used by
Transformer-XL on large vocabularies; with no cutoffs, an ordinary embedding and softmax."""

# Adaptive input embedding (Baevski & Auli) and the projected adaptive softmax (Grave et al.), as used by
# Transformer-XL on large vocabularies. With no cutoffs they reduce to an ordinary embedding scaled by
# sqrt(D) and an ordinary softmax computed with a fused cross-entropy.
#
# Clusters: token ids [0, c1) form the head shortlist, [c1, c2) cluster 1, ..., [c_n, V) cluster n. The head
# softmax scores the shortlist plus one logit per tail cluster; as in the authors' code the logit of cluster i
# is column ``shortlist + n_clusters - i`` of the head (cluster 1 is the last column).
#
# Dimensions: N flattened positions (B*T), D model size, E_i embedding size of cluster i, V vocabulary.

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import TransformerXLConfig
from .loss import linear_cross_entropy

__all__ = ["AdaptiveEmbedding", "AdaptiveLogSoftmax", "cluster_bounds", "cluster_dims"]


def cluster_bounds(config: TransformerXLConfig) -> list[tuple[int, int]]:
    """[(start, end)] token id range of each cluster, head first."""
    edges = [0, *config.cutoffs, config.vocab_size]
    return list(zip(edges[:-1], edges[1:], strict=True))


def cluster_dims(config: TransformerXLConfig) -> list[int]:
    """Embedding size of each cluster: d_embed // div_val**i (all d_embed when div_val is 1)."""
    n = len(config.cutoffs) + 1
    if config.div_val == 1:
        return [config.embed_dim] * n
    return [config.embed_dim // config.div_val**i for i in range(n)]


def _upcast(x: Tensor) -> Tensor:
    """Half-precision logits are normalised in float32; float32 and float64 stay as they are."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x


def _check_targets(target: Tensor, vocab_size: int) -> None:
    """Targets must be token ids in [0, V): ``F.cross_entropy`` raises on others, and so does txl's loss."""
    outside = (target < 0) | (target >= vocab_size)
    if target.device.type != "cpu":
        torch._assert_async(~outside.any(), f"targets must be token ids in [0, {vocab_size})")
    elif bool(outside.any()):
        raise ValueError(
            f"targets must be token ids in [0, {vocab_size}), got {target[outside][:5].tolist()}"
        )


class AdaptiveEmbedding(nn.Module):
    """Token ids (B, T) -> embeddings (B, T, D) scaled by sqrt(D).

    div_val == 1: one table of size (V, E) and, if E != D, one projection (D, E).
    div_val > 1: one table and one projection (D, E_i) per cluster.
    Parameter names follow the authors' code: ``emb_layers.{i}.weight`` and ``emb_projs.{i}``.
    """

    def __init__(self, config: TransformerXLConfig) -> None:
        super().__init__()
        self.d_model = config.d_model
        self.scale = math.sqrt(config.d_model)
        self.bounds = cluster_bounds(config)
        dims = cluster_dims(config)
        if config.div_val == 1:
            self.emb_layers = nn.ModuleList([nn.Embedding(config.vocab_size, config.embed_dim)])
            self.bounds = [(0, config.vocab_size)]
            projected = config.embed_dim != config.d_model
            self.emb_projs = nn.ParameterDict(
                {"0": nn.Parameter(torch.empty(config.d_model, config.embed_dim))} if projected else {}
            )
        else:
            self.emb_layers = nn.ModuleList(
                [nn.Embedding(end - start, d) for (start, end), d in zip(self.bounds, dims, strict=True)]
            )
            self.emb_projs = nn.ParameterDict(
                {str(i): nn.Parameter(torch.empty(config.d_model, d)) for i, d in enumerate(dims)}
            )

    @torch.no_grad()
    def reset_projections(self, std: float) -> None:
        """Projections N(0, std) (the tables are initialised with the model's other weights)."""
        for proj in self.emb_projs.values():
            nn.init.normal_(proj, 0.0, std)

    def projection(self, i: int) -> Tensor | None:
        """The (D, E_i) projection of cluster i, or None when the cluster is not projected."""
        return self.emb_projs[str(i)] if str(i) in self.emb_projs else None

    def forward(self, tokens: Tensor) -> Tensor:
        if len(self.emb_layers) == 1:
            table = cast(Tensor, self.emb_layers[0].weight)
            emb = F.embedding(tokens, table)  # (B, T, E), as the plain nn.Embedding
            if not self.emb_projs:  # one table of size D (decoding embeds one token per step: few calls)
                return emb * self.scale
            proj = self.projection(0)
            if proj is not None:
                emb = F.linear(emb, proj)  # (B, T, D)
            return emb * self.scale
        out = None
        for i, (start, end) in enumerate(self.bounds):
            # Every cluster embeds every position (ids clamped into range) and a mask keeps the owners:
            # no data-dependent shapes, so no host-device synchronisation.
            inside = (tokens >= start) & (tokens < end)  # (B, T)
            local = (tokens - start).clamp(0, end - start - 1)
            emb = F.linear(self.emb_layers[i](local), self.emb_projs[str(i)])  # (B, T, D)
            emb = emb * inside.unsqueeze(-1).to(emb.dtype)
            out = emb if out is None else out + emb
        assert out is not None  # at least two clusters here
        return out * self.scale


class AdaptiveLogSoftmax(nn.Module):
    """Hidden states (N, D) -> per-token negative log-likelihood (N,) or full log-probabilities (N, V).

    Parameter names follow the authors' code: ``out_layers.{i}.weight/bias``, ``out_projs.{i}`` (D, E_i),
    ``cluster_weight`` (n_clusters, E_0), ``cluster_bias`` (n_clusters,).
    """

    def __init__(self, config: TransformerXLConfig) -> None:
        super().__init__()
        self.bounds = cluster_bounds(config)
        self.n_clusters = len(config.cutoffs)
        self.shortlist = self.bounds[0][1]
        dims = cluster_dims(config)
        self.div_val = config.div_val
        if config.div_val == 1:
            self.out_layers = nn.ModuleList([nn.Linear(config.embed_dim, config.vocab_size)])
            projected = config.embed_dim != config.d_model
            self.out_projs = nn.ParameterDict(
                {
                    str(i): nn.Parameter(torch.empty(config.d_model, config.embed_dim))
                    for i in range(len(self.bounds))
                }
                if projected
                else {}
            )
        else:
            self.out_layers = nn.ModuleList(
                [nn.Linear(d, end - start) for (start, end), d in zip(self.bounds, dims, strict=True)]
            )
            self.out_projs = nn.ParameterDict(
                {str(i): nn.Parameter(torch.empty(config.d_model, d)) for i, d in enumerate(dims)}
            )
        if self.n_clusters > 0:
            self.cluster_weight = nn.Parameter(torch.empty(self.n_clusters, dims[0]))
            self.cluster_bias = nn.Parameter(torch.empty(self.n_clusters))
        else:
            self.register_parameter("cluster_weight", None)
            self.register_parameter("cluster_bias", None)

    @torch.no_grad()
    def reset_adaptive(self, *, std: float, proj_std: float) -> None:
        """Projections N(0, proj_std), cluster weights N(0, std), cluster biases 0 (the output layers are
        initialised with the model's other linear layers)."""
        for proj in self.out_projs.values():
            nn.init.normal_(proj, 0.0, proj_std)
        if self.cluster_weight is not None:
            nn.init.normal_(self.cluster_weight, 0.0, std)
            nn.init.zeros_(self.cluster_bias)

    def tie_to(self, embedding: AdaptiveEmbedding, *, weights: bool, projections: bool) -> None:
        """Share parameters with the input embedding: each cluster's output weight with its embedding table
        (``weights``), and the tail clusters' projections with the embedding projections (``projections``)."""
        if weights:
            for i, layer in enumerate(self.out_layers):
                layer.weight = embedding.emb_layers[i].weight
        if projections and self.n_clusters > 0:
            for i in range(1, self.n_clusters + 1):
                if self.div_val == 1 and "0" in embedding.emb_projs:
                    self.out_projs[str(i)] = embedding.emb_projs["0"]
                elif self.div_val > 1:
                    self.out_projs[str(i)] = embedding.emb_projs[str(i)]

    def cluster_params(self, i: int) -> tuple[Tensor, Tensor, Tensor | None]:
        """Weight (V_i, E_i), bias (V_i,) and projection (D, E_i) or None of cluster i."""
        proj = self.out_projs[str(i)] if str(i) in self.out_projs else None
        if self.div_val == 1:
            start, end = self.bounds[i]
            layer = cast(nn.Linear, self.out_layers[0])
            return layer.weight[start:end], layer.bias[start:end], proj
        layer = cast(nn.Linear, self.out_layers[i])
        return layer.weight, layer.bias, proj

    @staticmethod
    def _logits(hidden: Tensor, weight: Tensor, bias: Tensor, proj: Tensor | None) -> Tensor:
        if proj is not None:
            hidden = hidden @ proj  # (N, E_i)
        return F.linear(hidden, weight, bias)

    def _head_params(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """Weight (shortlist + n_clusters, E_0), bias and projection (D, E_0) or None of the head softmax."""
        weight, bias, proj = self.cluster_params(0)
        if self.n_clusters > 0:
            weight = torch.cat([weight, self.cluster_weight], dim=0)  # (shortlist + n_clusters, E_0)
            bias = torch.cat([bias, self.cluster_bias], dim=0)
        return weight, bias, proj

    def _head_logits(self, hidden: Tensor) -> Tensor:
        return self._logits(hidden, *self._head_params())  # (N, shortlist + n_clusters)

    def nll(self, hidden: Tensor, target: Tensor) -> Tensor:
        """Per-token negative log-likelihood (N,), in the order of ``target``: token ids in [0, V), anything else
        is an error (a ValueError on the CPU; on an accelerator, an asynchronous device assertion, which needs
        no host synchronisation).

        -log p(t) = -log p_head(t) for a shortlist token, -log p_head(cluster i) - log p_i(t) for a token of tail
        cluster i: the head's fused cross-entropy runs on every row with the target's head column (the token, or
        its cluster's logit), each tail's on the rows whose target it holds (data-dependent, as the original)."""
        _check_targets(target, self.bounds[-1][1])
        weight, bias, proj = self._head_params()
        head = hidden if proj is None else hidden @ proj  # (N, E_0)
        if self.n_clusters == 0:
            return linear_cross_entropy(head, weight, bias, target)
        head_target = target
        for i, (start, end) in enumerate(self.bounds[1:], start=1):
            column = self.shortlist + self.n_clusters - i
            head_target = torch.where((target >= start) & (target < end), column, head_target)
        nll = linear_cross_entropy(head, weight, bias, head_target)  # (N,)
        for i, (start, end) in enumerate(self.bounds[1:], start=1):
            # data-dependent, as the original
            rows = ((target >= start) & (target < end)).nonzero().squeeze(1)
            if rows.numel() == 0:
                continue
            weight, bias, proj = self.cluster_params(i)
            tail = hidden.index_select(0, rows)  # (n_i, D)
            tail = tail if proj is None else tail @ proj  # (n_i, E_i)
            nll = nll.index_add(
                0, rows, linear_cross_entropy(tail, weight, bias, target.index_select(0, rows) - start)
            )
        return nll

    def log_prob(self, hidden: Tensor) -> Tensor:
        """Full log-probabilities over the vocabulary (N, V); each row sums (in probability) to 1."""
        head = self._head_logits(hidden)
        head_logprob = F.log_softmax(_upcast(head), dim=-1)
        if self.n_clusters == 0:
            return head_logprob
        parts = [head_logprob[:, : self.shortlist]]
        for i in range(1, len(self.bounds)):
            weight, bias, proj = self.cluster_params(i)
            tail = F.log_softmax(_upcast(self._logits(hidden, weight, bias, proj)), dim=-1)  # (N, V_i)
            parts.append(head_logprob[:, self.shortlist + self.n_clusters - i, None] + tail)
        return torch.cat(parts, dim=-1)  # (N, V)
