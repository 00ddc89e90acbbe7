"""Import weights from other Transformer-XL implementations, never running pickle code: the authors'
``MemTransformerLM`` state_dict (:func:`load_original`, sizes inferred from the shapes) and a Hugging Face
TransfoXL folder (:func:`load_hf`, :func:`load_hf_vocab`). Writing a run folder is :mod:`txl.interop.convert`'s.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from ..config import ConfigError, TransformerXLConfig, has_memory, positive_int
from ..data.vocab import WordVocab
from ..errors import CheckpointError
from ..model import TransformerXL
from ..model.positional import inverse_frequencies
from .safe_pickle import UnsafePickleError, safe_load_file

__all__ = [
    "CheckpointError",
    "OriginalSettings",
    "load_original",
    "original_to_txl",
    "txl_to_original",
    "config_from_original",
    "load_hf",
    "load_hf_vocab",
    "config_from_hf",
    "hf_to_txl",
    "read_hf_state",
    "read_hf_config",
    "vocab_from_symbols",
]


def _count(keys: Mapping[str, Tensor], pattern: str) -> int:
    regex = re.compile(pattern)
    found = {int(m.group(1)) for k in keys if (m := regex.fullmatch(k))}
    if found and found != set(range(len(found))):
        raise CheckpointError(f"non-contiguous indices for {pattern}: {sorted(found)}")
    return len(found)


def _same(a: Tensor | None, b: Tensor | None) -> bool:
    return a is not None and b is not None and a.shape == b.shape and torch.equal(a, b)


@dataclass(frozen=True)
class OriginalSettings:
    """What the authors' state_dict does not store, given when reading it (:func:`load_original`)."""

    mem_len: int
    """The memory length (M) the model keeps between segments."""
    pre_norm: bool = False
    """Layer norm before each sub-layer (their ``pre_lnorm``); False: after it, as the authors trained."""
    same_length: bool = False
    """Every position attends the same number of keys (their ``same_length``)."""
    clamp_len: int | None = None
    """Relative distances beyond this use the embedding of this distance; None: no clamp."""
    cutoffs: tuple[int, ...] | None = None
    """The cutoffs of an adaptive softmax with ``div_val = 1`` (the authors' WikiText-103 setting: one table
    for all clusters), which the shapes cannot tell; inferred when div_val > 1."""

    def __post_init__(self) -> None:
        if isinstance(self.mem_len, bool) or not isinstance(self.mem_len, int) or self.mem_len < 0:
            raise ConfigError(f"mem_len: must be a non-negative integer, got {self.mem_len!r}")
        if self.clamp_len is not None:
            positive_int(self.clamp_len, "clamp_len")


def config_from_original(state: Mapping[str, Tensor], settings: OriginalSettings) -> TransformerXLConfig:
    """Infer a :class:`TransformerXLConfig` from the original's state_dict shapes and ``settings``."""
    return TransformerXLConfig(
        **_original_sizes(state, settings.cutoffs),
        attention="relative",
        mem_len=settings.mem_len,
        same_length=settings.same_length,
        clamp_len=settings.clamp_len,
        pre_norm=settings.pre_norm,
        share_rel_bias=True,
    )


def _original_sizes(state: Mapping[str, Tensor], cutoffs: tuple[int, ...] | None) -> dict[str, Any]:
    """The sizes and tying of the original's model (the config fields the shapes tell), from its state_dict;
    ``cutoffs``: those of an adaptive softmax with div_val 1, which the shapes cannot tell."""
    required = ["r_w_bias", "r_r_bias", "word_emb.emb_layers.0.weight", "layers.0.dec_attn.qkv_net.weight"]
    missing = [k for k in required if k not in state]
    if missing:
        raise CheckpointError(
            f"not an original MemTransformerLM state_dict with relative attention (attn_type 0): "
            f"missing {', '.join(missing)}"
        )
    if state["r_w_bias"].dim() != 2:
        raise CheckpointError(
            "r_w_bias must be [n_head, d_head] (the shared biases of attn_type 0); "
            f"got shape {tuple(state['r_w_bias'].shape)}"
        )
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
            raise CheckpointError(
                f"this checkpoint has an adaptive softmax with {n_clusters} tail clusters and "
                f"div_val=1, whose cutoffs are not stored in the weights: pass cutoffs= "
                f"({n_clusters} increasing token ids; e.g. 20000, 40000, 200000 for the "
                f"authors' WikiText-103 model)"
            )
        else:
            cutoffs = tuple(int(c) for c in cutoffs)
    tie_weights = all(
        _same(state.get(f"crit.out_layers.{i}.weight"), state.get(f"word_emb.emb_layers.{i}.weight"))
        for i in range(max(n_out, 1))
    )
    n_clusters = len(cutoffs)
    tie_projs = n_clusters > 0 and all(
        _same(state.get(f"crit.out_projs.{i}"), state.get(f"word_emb.emb_projs.{0 if div_val == 1 else i}"))
        for i in range(1, n_clusters + 1)
    )
    return {
        "vocab_size": vocab_size,
        "n_layer": n_layer,
        "n_head": n_head,
        "d_head": d_head,
        "d_model": d_model,
        "d_inner": d_inner,
        "d_embed": None if d_embed == d_model else d_embed,
        "tie_weights": tie_weights,
        "cutoffs": cutoffs,
        "div_val": div_val,
        "tie_projs": tie_projs or not cutoffs,
    }


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
                raise CheckpointError(
                    f"{theirs} has shape {tuple(tensor.shape)}, the inferred model needs {tuple(param.shape)}"
                )
            param.copy_(tensor.to(param.dtype))
    return model


def txl_to_original(model: TransformerXL) -> dict[str, Tensor]:
    """Our weights under the original's names and layout (the inverse of :func:`original_to_txl`), plus the
    ``pos_emb.inv_freq`` buffer the original stores."""
    names = _name_map(model.config)
    state = {names[name]: p.detach().clone() for name, p in model.named_parameters(remove_duplicate=False)}
    state["pos_emb.inv_freq"] = inverse_frequencies(model.config.d_model, dtype=torch.float32)
    return state


def load_original(path: str | Path, settings: OriginalSettings) -> TransformerXL:
    """Load the authors' ``MemTransformerLM`` weights (``torch.save(model.state_dict())``, attn_type 0)
    with ``weights_only=True`` and return an equivalent TransformerXL in eval mode. Sizes, cutoffs, div_val
    and weight tying are inferred from the tensor shapes; what they do not store is in ``settings``."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported the same way
        raise CheckpointError(f"{path}: not a readable torch state_dict ({_load_problem(exc)})") from None
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a state_dict (a mapping of names to tensors)")
    state = {k.removeprefix("module."): v for k, v in state.items()}
    config = config_from_original(state, settings)
    return original_to_txl(state, config).eval()


# ---------------------------------------------------------------------------------------------------------
# Hugging Face TransfoXL (transformers <= 4.35)
# ---------------------------------------------------------------------------------------------------------

HF_WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
"""The weight files of a Hugging Face checkpoint folder, in the order they are looked for."""


def _hf_folder(path: str | Path) -> Path:
    path = Path(path).expanduser()
    folder = path.parent if path.is_file() else path
    if not folder.is_dir():
        raise CheckpointError(f"Hugging Face checkpoint folder not found: {path}")
    return folder


def _first_line(exc: BaseException) -> str:
    """The first line of an error from another library (torch.load's run to a page), for a one-line message."""
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


def _load_problem(exc: BaseException) -> str:
    """Why ``torch.load(..., weights_only=True)`` refused a file, in txl's words: a file that holds Python
    objects besides tensors is never unpickled (PyTorch's advice to load it without ``weights_only`` is not
    passed on: it would run code from the file)."""
    if isinstance(exc, pickle.UnpicklingError) or "weights_only" in str(exc):
        return (
            "it holds Python objects besides tensors, and txl does not unpickle those; give a plain "
            "state_dict of tensors (torch.save(model.state_dict(), path)) or a .safetensors file"
        )
    return f"{type(exc).__name__}: {_first_line(exc)}"


def _read_weight_file(path: Path) -> dict[str, Tensor]:
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            return load_file(str(path), device="cpu")
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is reported the same way
        raise CheckpointError(f"{path}: not readable weights ({_load_problem(exc)})") from None
    if not isinstance(state, Mapping) or not all(isinstance(v, Tensor) for v in state.values()):
        raise CheckpointError(f"{path}: expected a state_dict (a mapping of names to tensors)")
    return dict(state)


def read_hf_state(path: str | Path) -> dict[str, Tensor]:
    """The tensors of a Hugging Face checkpoint folder: ``model.safetensors``, else ``pytorch_model.bin``
    (``weights_only=True``), or the shards their ``.index.json`` lists."""
    folder = _hf_folder(path)
    for name in HF_WEIGHT_FILES:
        file = folder / name
        if not file.is_file():
            continue
        if not name.endswith(".index.json"):
            return _read_weight_file(file)
        try:
            shards = sorted(set(json.loads(file.read_text(encoding="utf-8"))["weight_map"].values()))
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            raise CheckpointError(f"{file}: not a weight index ({exc})") from None
        state: dict[str, Tensor] = {}
        for shard in shards:
            state.update(_read_weight_file(folder / shard))
        return state
    raise CheckpointError(f"{folder}: no weights ({', '.join(HF_WEIGHT_FILES)})")


def config_from_hf(hf: Mapping) -> TransformerXLConfig:
    """The TransformerXLConfig of a Hugging Face ``TransfoXLConfig`` (its ``config.json`` as a dict).

    ``untie_r`` gives one pair of biases per layer, ``clamp_len <= 0`` no clamp, ``tie_projs`` (or
    ``proj_share_all_but_first``) the tied tail projections; ``mem_len``, ``same_length`` and ``clamp_len``
    become the model's default span (the paper's evaluation settings for ``transfo-xl-wt103``)."""
    model_type = hf.get("model_type", "transfo-xl")
    if model_type != "transfo-xl":
        raise CheckpointError(f"not a TransfoXL config: model_type is {model_type!r}")
    if hf.get("attn_type", 0) != 0:
        raise CheckpointError(
            f"attn_type {hf.get('attn_type')} is not supported: txl implements the relative "
            "attention of the paper (attn_type 0)"
        )
    if (hf.get("sample_softmax") or -1) > 0:
        raise CheckpointError("sample_softmax > 0 (a sampled softmax) is not supported")
    eps = hf.get("layer_norm_epsilon", 1e-5)
    if abs(eps - 1e-5) > 1e-12:
        raise CheckpointError(f"layer_norm_epsilon {eps} is not supported: txl's LayerNorms use 1e-5")
    cutoffs = tuple(int(c) for c in hf.get("cutoffs", ()))
    tails = [
        bool(t)
        for t in hf.get(
            "tie_projs", [False] + [bool(hf.get("proj_share_all_but_first", True))] * len(cutoffs)
        )
    ][1:]
    if len(set(tails)) > 1:
        raise CheckpointError(f"tie_projs {hf.get('tie_projs')}: txl ties all tail projections or none")
    mem_len = int(hf.get("mem_len", 0) or 0)
    clamp_len = hf.get("clamp_len", -1)
    d_model, d_embed = int(hf["d_model"]), int(hf.get("d_embed", hf["d_model"]))
    try:
        config = TransformerXLConfig(
            vocab_size=int(hf["vocab_size"] if "vocab_size" in hf else hf["n_token"]),
            n_layer=int(hf["n_layer"]),
            n_head=int(hf["n_head"]),
            d_head=int(hf["d_head"]),
            d_model=d_model,
            d_inner=int(hf["d_inner"]),
            d_embed=None if d_embed == d_model else d_embed,
            dropout=float(hf.get("dropout", 0.0)),
            dropatt=float(hf.get("dropatt", 0.0)),
            attention="relative",
            mem_len=mem_len,
            clamp_len=int(clamp_len) if clamp_len is not None and clamp_len > 0 else None,
            pre_norm=bool(hf.get("pre_lnorm", False)),
            tie_weights=bool(hf.get("tie_word_embeddings", True)),
            share_rel_bias=not hf.get("untie_r", True),
            cutoffs=cutoffs,
            div_val=int(hf.get("div_val", 1)),
            tie_projs=all(tails) if cutoffs else True,
            init_std=float(hf.get("init_std", 0.02)),
            proj_init_std=float(hf.get("proj_init_std", 0.01)),
        )
    except KeyError as exc:
        raise CheckpointError(f"the TransfoXL config has no {exc.args[0]!r}") from None
    except ConfigError as exc:
        raise CheckpointError(f"the TransfoXL config cannot be expressed in txl: {exc}") from None
    # same_length needs a memory
    return dataclasses.replace(config, same_length=bool(hf.get("same_length", False)) and has_memory(config))


def _hf_candidates(config: TransformerXLConfig) -> dict[str, list[str]]:
    """Our parameter name -> the Hugging Face names that may hold it (several where HF shares a tensor
    and a safetensors file keeps only one of the names)."""
    names: dict[str, list[str]] = {}
    for ours, theirs in _name_map(config).items():
        if ours in ("u", "v"):
            continue
        names[ours] = [theirs if theirs.startswith("crit.") else f"transformer.{theirs}"]
    for i in range(1 if config.div_val == 1 else len(config.cutoffs) + 1):
        if config.tie_weights:  # tied output weights are saved under the embedding's name
            names[f"softmax.out_layers.{i}.weight"].append(f"transformer.word_emb.emb_layers.{i}.weight")
    if config.tie_projs:
        for i in range(1, len(config.cutoffs) + 1):
            names[f"softmax.out_projs.{i}"].append(
                f"transformer.word_emb.emb_projs.{0 if config.div_val == 1 else i}"
            )
    return names


def _hf_biases(state: Mapping[str, Tensor], config: TransformerXLConfig) -> dict[str, Tensor]:
    """u (r_w_bias) and v (r_r_bias): (H, Dh) shared, or (N, H, Dh) stacked from every layer's own."""
    found = {}
    for ours, theirs in (("u", "r_w_bias"), ("v", "r_r_bias")):
        per_layer = [f"transformer.layers.{i}.dec_attn.{theirs}" for i in range(config.n_layer)]
        if config.share_rel_bias:
            name = next((n for n in [f"transformer.{theirs}", *per_layer] if n in state), None)
            if name is None:
                raise CheckpointError(f"the checkpoint has no transformer.{theirs} (shared, untie_r false)")
            found[ours] = state[name]
        else:
            missing = [n for n in per_layer if n not in state]
            if missing:
                raise CheckpointError(f"the checkpoint has no {missing[0]} (one per layer, untie_r true)")
            found[ours] = torch.stack([state[n] for n in per_layer])
    return found


def hf_to_txl(state: Mapping[str, Tensor], config: TransformerXLConfig) -> TransformerXL:
    """Build a TransformerXL from ``config`` and copy the Hugging Face tensors into it (shapes checked).

    The head's cluster logits are stored in the opposite order: Hugging Face scores tail cluster i with row
    i - 1 of ``cluster_weight``, the authors' PyTorch code and txl with row ``n_clusters - i``."""
    state = {k.removeprefix("module."): v for k, v in state.items()}
    dtype = torch.float64 if any(v.dtype == torch.float64 for v in state.values()) else torch.float32
    model = TransformerXL(config).to(dtype)
    candidates = _hf_candidates(config)
    sources = dict(_hf_biases(state, config))
    for name in ("softmax.cluster_weight", "softmax.cluster_bias"):
        if name in candidates and candidates[name][0] in state:
            sources[name] = state[candidates[name][0]].flip(0)
    with torch.no_grad():
        done: dict[int, tuple[str, Tensor]] = {}
        for name, param in model.named_parameters(remove_duplicate=False):
            options = [n for n in candidates.get(name, []) if n in state]
            tensor = sources.get(name, state[options[0]] if options else None)
            if tensor is None:
                if id(param) in done:  # tied to a parameter already filled
                    continue
                raise CheckpointError(
                    f"the checkpoint has no tensor for {name} (expected "
                    f"{' or '.join(candidates.get(name, ['?']))})"
                )
            if tensor.shape != param.shape:
                raise CheckpointError(
                    f"{options[0] if options else name} has shape {tuple(tensor.shape)}, the "
                    f"model of config.json needs {tuple(param.shape)}"
                )
            if id(param) in done and not torch.equal(done[id(param)][1], tensor):
                raise CheckpointError(
                    f"{name} and {done[id(param)][0]} differ in the checkpoint, but config.json "
                    "ties them (tie_word_embeddings / tie_projs)"
                )
            param.copy_(tensor.to(param.dtype))
            done[id(param)] = (name, tensor)
    return model


def read_hf_config(path: str | Path) -> dict:
    """The ``config.json`` of a Hugging Face checkpoint folder, as a dict."""
    file = _hf_folder(path) / "config.json"
    try:
        hf = json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckpointError(
            f"{file.parent}: no config.json (not a Hugging Face checkpoint folder)"
        ) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{file}: not valid JSON ({exc})") from None
    if not isinstance(hf, dict):
        raise CheckpointError(f"{file}: expected a JSON object")
    return hf


def load_hf(path_or_dir: str | Path) -> TransformerXL:
    """Load a Hugging Face TransfoXL checkpoint folder (``config.json`` + ``model.safetensors`` or
    ``pytorch_model.bin``, read with ``weights_only=True``) as an equivalent TransformerXL in eval mode.

    The model gives Hugging Face's log-probabilities for the same tokens and the same memory. Hugging Face
    starts a sequence from ``mem_len`` zero vectors when given no memory, txl from an empty memory: pass
    ``Memory`` of zeros (B, mem_len, D) per layer to start as it does."""
    config = config_from_hf(read_hf_config(path_or_dir))
    return hf_to_txl(read_hf_state(path_or_dir), config).eval()


def vocab_from_symbols(symbols: Sequence[str], *, eos_per_line: bool = True) -> WordVocab:
    """A whitespace-tokenised word vocabulary with these symbols at these ids (``<unk>`` and ``<eos>`` where
    they are), as imported with a pretrained model."""
    if not symbols or not all(isinstance(s, str) for s in symbols):
        raise CheckpointError("a vocabulary must be a non-empty list of strings")
    try:
        return WordVocab(list(symbols), tokenizer="whitespace", eos_per_line=eos_per_line, as_given=True)
    except ValueError as exc:
        raise CheckpointError(f"not a usable vocabulary: {exc}") from None


def _symbols_from_pickled(data: object, path: Path) -> list[str]:
    """idx2sym of the dict TransfoXLTokenizer (or the authors' Vocab) pickles, checked."""
    if not isinstance(data, Mapping):
        raise CheckpointError(
            f"{path}: expected the pickled dict of a TransfoXL vocabulary, got {type(data).__name__}"
        )
    if data.get("lower_case"):
        raise CheckpointError(f"{path}: a lower-casing vocabulary (lower_case true) is not supported")
    if data.get("delimiter") not in (None, "", " "):
        raise CheckpointError(
            f"{path}: a vocabulary split on {data.get('delimiter')!r} is not supported "
            "(txl splits on whitespace)"
        )
    symbols = data.get("idx2sym")
    if symbols is None and isinstance(data.get("sym2idx"), Mapping):
        symbols = [s for s, _ in sorted(data["sym2idx"].items(), key=lambda item: item[1])]
    if not isinstance(symbols, (list, tuple)):
        raise CheckpointError(f"{path}: the pickled vocabulary has no idx2sym list")
    return list(symbols)


def load_hf_vocab(path_or_dir: str | Path) -> WordVocab:
    """The word vocabulary of a Hugging Face TransfoXL folder (or the vocabulary file itself): ``vocab.pkl``
    (read by :func:`txl.interop.safe_pickle.safe_load_file`: plain containers only, no pickle code runs), else
    ``vocab.txt`` (one symbol per line, the first field as TransfoXLTokenizer reads it) or ``vocab.json``
    (a list of symbols, ``{"idx2sym": [...]}`` or ``{symbol: id}``). Ids are kept as they are."""
    path = Path(path_or_dir).expanduser()
    if path.is_dir():
        found = [path / n for n in ("vocab.pkl", "vocab.txt", "vocab.json") if (path / n).is_file()]
        if not found:
            raise CheckpointError(f"{path}: no vocab.pkl, vocab.txt or vocab.json")
        path = found[0]
    if not path.is_file():
        raise CheckpointError(f"vocabulary not found: {path}")
    if path.suffix == ".txt":
        lines = path.read_text(encoding="utf-8").splitlines()
        return vocab_from_symbols([line.split()[0] for line in lines if line.strip()])
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
        if isinstance(data, Mapping) and "idx2sym" not in data and "sym2idx" not in data:
            data = {"sym2idx": data}
        return vocab_from_symbols(data if isinstance(data, list) else _symbols_from_pickled(data, path))
    try:
        data = safe_load_file(path)
    except UnsafePickleError as exc:
        raise CheckpointError(
            f"{exc} (export the vocabulary as vocab.txt, one symbol per line, instead)"
        ) from None
    return vocab_from_symbols(_symbols_from_pickled(data, path))
