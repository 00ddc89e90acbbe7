"""Import weights from other Transformer-XL implementations.

``load_original`` reads a ``state_dict`` saved with ``torch.save(model.state_dict())`` from the authors'
PyTorch ``MemTransformerLM`` (attention type 0, the relative attention of the paper), safely
(``weights_only=True``), infers every size from the tensor shapes and returns an equivalent
:class:`~txl.model.TransformerXL`. Their tensors are laid out time-major inside; weights are not.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import Tensor

from .config import TransformerXLConfig
from .errors import CheckpointError
from .model import TransformerXL
from .model.positional import inverse_frequencies

__all__ = ["CheckpointError", "load_original", "original_to_txl", "txl_to_original", "config_from_original"]


def _count(keys: Mapping[str, Tensor], pattern: str) -> int:
    regex = re.compile(pattern)
    found = {int(m.group(1)) for k in keys if (m := regex.fullmatch(k))}
    if found and found != set(range(len(found))):
        raise CheckpointError(f"non-contiguous indices for {pattern}: {sorted(found)}")
    return len(found)


def _same(a: Tensor | None, b: Tensor | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and torch.equal(a, b)


def config_from_original(state: Mapping[str, Tensor], *, pre_norm: bool = False, mem_len: int,
                         same_length: bool = False, clamp_len: int | None = None,
                         cutoffs: tuple[int, ...] | None = None) -> TransformerXLConfig:
    """Infer a :class:`TransformerXLConfig` from the original's state_dict shapes.

    The one size the shapes cannot tell is the cutoffs of an adaptive softmax with ``div_val = 1`` (the
    authors' WikiText-103 setting: one table for all clusters); pass ``cutoffs`` then."""
    required = ["r_w_bias", "r_r_bias", "word_emb.emb_layers.0.weight", "layers.0.dec_attn.qkv_net.weight"]
    missing = [k for k in required if k not in state]
    if missing:
        raise CheckpointError(f"not an original MemTransformerLM state_dict with relative attention (attn_type 0): "
                              f"missing {', '.join(missing)}")
    if state["r_w_bias"].dim() != 2:
        raise CheckpointError("r_w_bias must be [n_head, d_head] (the shared biases of attn_type 0); "
                              f"got shape {tuple(state['r_w_bias'].shape)}")
    n_head, d_head = state["r_w_bias"].shape
    n_layer = _count(state, r"layers\.(\d+)\.dec_attn\.qkv_net\.weight")
    d_model = state["layers.0.dec_attn.qkv_net.weight"].shape[1]
    d_inner = state["layers.0.pos_ff.CoreNet.0.weight"].shape[0]
    n_emb = _count(state, r"word_emb\.emb_layers\.(\d+)\.weight")
    emb_sizes = [state[f"word_emb.emb_layers.{i}.weight"].shape for i in range(n_emb)]
    d_embed = emb_sizes[0][1]
    n_out = _count(state, r"crit\.out_layers\.(\d+)\.weight")
    if n_emb > 1:  # div_val > 1: one table per cluster
        div_val = d_embed // emb_sizes[1][1] if emb_sizes[1][1] else 1
        edges = [0]
        for rows, _ in emb_sizes:
            edges.append(edges[-1] + rows)
        vocab_size, cutoffs = edges[-1], tuple(edges[1:-1])
    else:
        div_val = 1
        vocab_size = emb_sizes[0][0]
        n_clusters = state["crit.cluster_weight"].shape[0] if "crit.cluster_weight" in state else 0
        if n_clusters == 0:
            cutoffs = ()
        elif cutoffs is None or len(cutoffs) != n_clusters:
            # With div_val 1 all clusters share one table and one output layer: the state_dict records how
            # many clusters there are (cluster_weight rows) but not where they start.
            raise CheckpointError(f"this checkpoint has an adaptive softmax with {n_clusters} tail clusters and "
                                  f"div_val=1, whose cutoffs are not stored in the weights: pass cutoffs= "
                                  f"({n_clusters} increasing token ids; e.g. 20000, 40000, 200000 for the "
                                  f"authors' WikiText-103 model)")
        else:
            cutoffs = tuple(int(c) for c in cutoffs)
    tie_weights = all(
        _same(state.get(f"crit.out_layers.{i}.weight"), state.get(f"word_emb.emb_layers.{i}.weight"))
        for i in range(max(n_out, 1))
    )
    n_clusters = len(cutoffs)
    tie_projs = n_clusters > 0 and all(
        _same(state.get(f"crit.out_projs.{i}"),
              state.get(f"word_emb.emb_projs.{0 if div_val == 1 else i}"))
        for i in range(1, n_clusters + 1)
    )
    return TransformerXLConfig(
        vocab_size=vocab_size, n_layer=n_layer, n_head=n_head, d_head=d_head, d_model=d_model,
        d_inner=d_inner, d_embed=None if d_embed == d_model else d_embed, attention="relative",
        mem_len=mem_len, same_length=same_length, clamp_len=clamp_len, pre_norm=pre_norm,
        tie_weights=tie_weights, share_rel_bias=True, cutoffs=cutoffs, div_val=div_val,
        tie_projs=tie_projs or not cutoffs,
    )


# Our name <- their name, per layer (l) and per cluster (i).
_LAYER_MAP = {
    "attn.qkv.weight": "dec_attn.qkv_net.weight",
    "attn.r_net.weight": "dec_attn.r_net.weight",
    "attn.out.weight": "dec_attn.o_net.weight",
    "attn_norm.weight": "dec_attn.layer_norm.weight",
    "attn_norm.bias": "dec_attn.layer_norm.bias",
    "ff.net.0.weight": "pos_ff.CoreNet.0.weight",
    "ff.net.0.bias": "pos_ff.CoreNet.0.bias",
    "ff.net.3.weight": "pos_ff.CoreNet.3.weight",
    "ff.net.3.bias": "pos_ff.CoreNet.3.bias",
    "ff_norm.weight": "pos_ff.layer_norm.weight",
    "ff_norm.bias": "pos_ff.layer_norm.bias",
}


def _name_map(config: TransformerXLConfig) -> dict[str, str]:
    """Our parameter name -> the original's, for every parameter of a model built from ``config``."""
    names = {"u": "r_w_bias", "v": "r_r_bias"}
    for layer in range(config.n_layer):
        for ours, theirs in _LAYER_MAP.items():
            names[f"layers.{layer}.{ours}"] = f"layers.{layer}.{theirs}"
    n_out = 1 if config.div_val == 1 else len(config.cutoffs) + 1
    for i in range(n_out):
        names[f"embedding.emb_layers.{i}.weight"] = f"word_emb.emb_layers.{i}.weight"
        names[f"softmax.out_layers.{i}.weight"] = f"crit.out_layers.{i}.weight"
        names[f"softmax.out_layers.{i}.bias"] = f"crit.out_layers.{i}.bias"
    for i in range(len(config.cutoffs) + 1):
        names[f"embedding.emb_projs.{i}"] = f"word_emb.emb_projs.{i}"
        names[f"softmax.out_projs.{i}"] = f"crit.out_projs.{i}"
    names["softmax.cluster_weight"] = "crit.cluster_weight"
    names["softmax.cluster_bias"] = "crit.cluster_bias"
    return names


def original_to_txl(state: Mapping[str, Tensor], config: TransformerXLConfig) -> TransformerXL:
    """Build a TransformerXL from ``config`` and copy the original's tensors into it (shapes checked)."""
    if config.attention != "relative" or not config.share_rel_bias:
        raise CheckpointError("the original attn_type 0 model has relative attention with shared u, v biases")
    # float64 checkpoints stay float64 (exact comparisons); half precision is widened to float32.
    dtype = torch.float64 if state["r_w_bias"].dtype == torch.float64 else torch.float32
    model = TransformerXL(config).to(dtype)
    names = _name_map(config)
    ours = dict(model.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for name, param in ours.items():
            theirs = names.get(name)
            if theirs is None or theirs not in state:
                raise CheckpointError(f"the original state_dict has no tensor for {name} (expected {theirs})")
            tensor = state[theirs]
            if tensor.shape != param.shape:
                raise CheckpointError(f"{theirs} has shape {tuple(tensor.shape)}, the inferred model needs "
                                      f"{tuple(param.shape)}")
            param.copy_(tensor.to(param.dtype))
    return model


def txl_to_original(model: TransformerXL) -> dict[str, Tensor]:
    """Our weights under the original's names and layout (the inverse of :func:`original_to_txl`), plus the
    ``pos_emb.inv_freq`` buffer the original stores."""
    names = _name_map(model.config)
    state = {names[name]: p.detach().clone() for name, p in model.named_parameters(remove_duplicate=False)}
    state["pos_emb.inv_freq"] = inverse_frequencies(model.config.d_model, dtype=torch.float32)
    return state


def load_original(path: str | Path, *, pre_norm: bool = False, mem_len: int, same_length: bool = False,
                  clamp_len: int | None = None, cutoffs: tuple[int, ...] | None = None) -> TransformerXL:
    """Load the authors' ``MemTransformerLM`` weights (``torch.save(model.state_dict())``, attn_type 0)
    with ``weights_only=True`` and return an equivalent TransformerXL in eval mode.

    Sizes, cutoffs, div_val and weight tying are inferred from the tensor shapes; ``pre_norm`` (their
    ``pre_lnorm``), ``mem_len``, ``same_length`` and ``clamp_len`` are not stored there and are given here, and so are
    ``cutoffs`` for an adaptive softmax with div_val 1 (they are inferred when div_val > 1)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported the same way
        raise CheckpointError(f"{path}: not a readable torch state_dict ({type(exc).__name__}: {exc})") from None
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a state_dict (a mapping of names to tensors)")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    config = config_from_original(state, pre_norm=pre_norm, mem_len=mem_len, same_length=same_length,
                                  clamp_len=clamp_len, cutoffs=cutoffs)
    return original_to_txl(state, config).eval()
