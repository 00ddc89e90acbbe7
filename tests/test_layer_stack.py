"""txl.model.LayerStack on its own (continuous inputs, no embedding): segments with memory against one long
pass, documents against reading alone, its variants and its owners' names; StackConfig's checks."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from txl.config import ConfigError, Span, StackConfig, TransformerXLConfig
from txl.model import DecoderLayer, LayerStack, Memory, TransformerXL
from txl.rl import CoreConfig, MemoryCore
from txl.rl.core import CoreStack, GatedLayer

D, H, DH, L = 8, 2, 4, 3


def _stack(**changes) -> tuple[LayerStack, list[tuple[Tensor, Tensor]]]:
    """A float64 stack of L layers with non-zero biases and LayerNorms moved off their initial values."""
    torch.manual_seed(0)
    stack = LayerStack(StackConfig(n_layer=L, n_head=H, d_head=DH, d_model=D, d_inner=16, **changes))
    stack = stack.double().eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in stack.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    biases = [
        (
            torch.randn(H, DH, generator=gen, dtype=torch.float64),
            torch.randn(H, DH, generator=gen, dtype=torch.float64),
        )
        for _ in range(L)
    ]
    return stack, biases


@pytest.mark.parametrize("pre_norm", [False, True])
def test_segments_with_enough_memory_equal_one_long_pass(pre_norm):
    """Three segments, each remembering everything before it, give the outputs of one pass over the whole
    sequence; the memory holds each layer's input at the remembered positions."""
    stack, biases = _stack(pre_norm=pre_norm)
    x = torch.randn(2, 12, D, dtype=torch.float64)
    with torch.no_grad():
        whole, none = stack(x, span=Span(mem_len=0), biases=biases)
        memory, parts = None, []
        for a, b in [(0, 5), (5, 9), (9, 12)]:
            h, memory = stack(x[:, a:b], memory=memory, span=Span(mem_len=12), biases=biases)
            parts.append(h)
    assert none is None and whole.shape == (2, 12, D)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=0, atol=1e-12)
    assert isinstance(memory, Memory) and len(memory) == L and memory.length == 12
    torch.testing.assert_close(memory.states[0], x, rtol=0, atol=0)  # the first layer's input: x itself


def test_a_document_after_another_reads_as_alone():
    """With starts, the positions from a row's start on attend to nothing before it: their outputs equal the
    document read alone, and the memory's reach counts the document's positions."""
    stack, biases = _stack()
    x = torch.randn(2, 10, D, dtype=torch.float64)
    starts = torch.zeros(2, 10, dtype=torch.bool)
    starts[0, 4] = True
    with torch.no_grad():
        h, memory = stack(x, span=Span(mem_len=6), starts=starts, biases=biases)
        alone, _ = stack(x[:1, 4:], span=Span(mem_len=6), biases=biases)
        plain, _ = stack(x[1:], span=Span(mem_len=6), biases=biases)
    torch.testing.assert_close(h[:1, 4:], alone, rtol=0, atol=1e-12)
    torch.testing.assert_close(h[1:], plain, rtol=0, atol=1e-12)
    assert memory is not None and memory.reach is not None and memory.reach.tolist() == [6, 6]
    with torch.no_grad():  # the next segment of row 0 still sees only its document's positions
        nxt = torch.randn(2, 3, D, dtype=torch.float64)
        after, _ = stack(nxt, memory=memory, span=Span(mem_len=6), biases=biases)
        expected, _ = stack(torch.cat([x[:1, 4:], nxt[:1]], dim=1), span=Span(mem_len=0), biases=biases)
    torch.testing.assert_close(after[:1], expected[:, -3:], rtol=0, atol=1e-12)


def test_the_language_model_and_the_memory_core_share_the_stack():
    """Both owners keep one LayerStack as ``layers``; the core's layers are chosen by its gating when it is
    built."""
    model = TransformerXL(TransformerXLConfig(n_layer=2))
    assert type(model.layers) is LayerStack and all(type(layer) is DecoderLayer for layer in model.layers)
    gated = MemoryCore(3, CoreConfig(n_layer=2, gating="gru"))
    plain = MemoryCore(3, CoreConfig(n_layer=2, gating="none"))
    assert isinstance(gated.layers, LayerStack) and isinstance(gated.layers, CoreStack)
    assert all(type(layer) is GatedLayer for layer in gated.layers)
    assert all(type(layer) is DecoderLayer for layer in plain.layers)
    assert gated.layers.config == CoreConfig(n_layer=2).stack and gated.layers.config.pre_norm


def test_owners_keep_their_state_dict_names_and_parameter_order():
    """Checkpoints (the weights by name, the optimizer's moments by position) load as before: the stack's
    layers are ``layers.{i}.*`` of their owner, and the parameters come in the same order."""
    model = TransformerXL(TransformerXLConfig(n_layer=2, final_norm=True, tie_weights=False))
    for names in (list(model.state_dict()), [n for n, _ in model.named_parameters()]):
        assert list(dict.fromkeys(n.split(".")[0] for n in names)) == [
            "u",
            "v",
            "embedding",
            "layers",
            "norm",
            "softmax",
        ]
        assert "layers.1.attn.qkv.weight" in names and "layers.0.ff.net.3.bias" in names
    core = MemoryCore(3, CoreConfig(n_layer=2))
    names = [n for n, _ in core.named_parameters()]
    assert list(dict.fromkeys(n.split(".")[0] for n in names)) == ["u", "v", "input", "layers", "norm"]
    assert "layers.1.attn_gate.w.weight" in names and "layers.0.attn.r_net.weight" in names


def test_a_slice_is_a_plain_list_of_the_same_layers():
    stack, _ = _stack()
    part = stack[1:]
    assert type(part) is torch.nn.ModuleList and list(part) == list(stack)[1:]
    assert stack[0] is list(stack)[0]


def test_bad_calls_get_one_line_errors_naming_the_argument():
    stack, biases = _stack()
    x = torch.randn(2, 4, D, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^biases: .* one \(u, v\) pair per layer \(3\), got none"):
        stack(x, span=Span(mem_len=4))
    with pytest.raises(ValueError, match=r"^biases: .*got 2"):
        stack(x, span=Span(mem_len=4), biases=biases[:2])
    with pytest.raises(ValueError, match=r"stack's input must be \(batch, time, 8\)"):
        stack(x[..., :4], span=Span(mem_len=4), biases=biases)
    memory = Memory(tuple(torch.zeros(2, 3, D, dtype=torch.float64) for _ in range(2)))
    with pytest.raises(ValueError, match=r"memory has 2 states, the stack needs one per layer \(3\)"):
        stack(x, memory=memory, span=Span(mem_len=4), biases=biases)
    with pytest.raises(ValueError, match="starts must be a bool tensor"):
        stack(x, span=Span(mem_len=4), starts=torch.zeros(2, 4), biases=biases)
    with pytest.raises(TypeError, match="config must be a StackConfig, got TransformerXLConfig"):
        LayerStack(TransformerXLConfig())  # type: ignore[arg-type]
    absolute, _ = _stack(attention="absolute")
    with pytest.raises(ValueError, match="has no memory: its span has mem_len 0"):
        absolute(x, span=Span(mem_len=4))


@pytest.mark.parametrize(
    "field,value",
    [
        ("n_layer", 0),
        ("d_model", 7),
        ("dropout", 1.0),
        ("dropatt", -0.1),
        ("attention", "rotary"),
        ("pre_norm", 1),
    ],
)
def test_stack_config_names_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"^{field}:"):
        StackConfig(**{field: value})


def test_the_configs_map_onto_the_stack():
    model = TransformerXLConfig(
        n_layer=3, n_head=4, d_head=8, d_model=32, d_inner=48, dropout=0.1, dropatt=0.2
    )
    assert model.stack == StackConfig(
        n_layer=3, n_head=4, d_head=8, d_model=32, d_inner=48, dropout=0.1, dropatt=0.2, pre_norm=False
    )
    core = CoreConfig(n_layer=1, n_head=2, d_head=4, d_model=8, d_inner=16, dropout=0.1)
    assert core.stack == StackConfig(
        n_layer=1, n_head=2, d_head=4, d_model=8, d_inner=16, dropout=0.1, dropatt=0.0, pre_norm=True
    )
    assert core.span == Span(mem_len=core.mem_len)
