"""txl.rl's cores against references written here, step by step, from their papers' equations:
:class:`~txl.rl.MemoryCore` against GTrXL (Parisotto et al. 2019) and a pre-norm Transformer-XL, reading the
core's weights by name; the GRU baseline against ``torch.nn.GRUCell`` run from zeros at every episode start.

The references know nothing of txl's modules, masks or memory: each environment keeps the layer inputs of its
current episode's steps in a list, and every step attends its last ``mem_len`` entries and itself."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import Tensor

from txl.rl import CoreConfig, CoreState, MemoryCore
from txl.rl.baselines import GRUCore
from txl.rl.state import RecurrentState

OBS = 5
CONFIG = CoreConfig(n_layer=2, n_head=2, d_head=4, d_model=8, d_inner=16, mem_len=3)


def _layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float = 1e-5) -> Tensor:
    """(x - mean) / sqrt(var + eps) * weight + bias over the last dimension (biased variance)."""
    mean = x.mean()
    var = ((x - mean) ** 2).mean()
    return (x - mean) / math.sqrt(var + eps) * weight + bias


def _sinusoid(distance: int, d: int) -> Tensor:
    """Transformer-XL's relative position vector R_distance: [sin(distance f_k) | cos(distance f_k)],
    f_k = 1 / 10000^(2k / d), k < d / 2."""
    f = torch.tensor([10000.0 ** (-2 * k / d) for k in range(d // 2)], dtype=torch.float64)
    return torch.cat([torch.sin(distance * f), torch.cos(distance * f)])


class ReferenceGTrXL:
    """GTrXL from the paper, one step of one environment at a time, on a MemoryCore's weights (float64).

    Identity-map reordering and gating, for layer l with input E (the previous layer's output):
        Y  = RelAttn(LN([StopGrad(M), E]))   (M: the layer inputs of the remembered steps)
        E' = g_attn(E, ReLU(Y))
        E''= g_ff(E', ReLU(FF(LN(E'))))
    with the GRU-type gate g(x, y):
        r = sigmoid(W_r y + U_r x)           z = sigmoid(W_z y + U_z x - b_g)
        h = tanh(W_g y + U_g (r * x))        g = (1 - z) * x + z * h
    Relative attention (Dai et al. 2019, Section 3.3), per head, for query i and key j at distance i - j:
        A_ij = q_i.k_j + q_i.W_R R_{i-j} + u.k_j + v.W_R R_{i-j},  softmax_j(A_ij / sqrt(d_head)) over v_j.
    Without gating (``gating="none"``) each gate is the residual sum x + y, and no ReLU is applied.
    Observations enter through a Linear layer; the features are the last layer's output, layer-normed."""

    def __init__(self, core: MemoryCore) -> None:
        self.p = {name: p.detach().to(torch.float64) for name, p in core.named_parameters()}
        self.gated = core.config.gating == "gru"
        self.mem_len, self.n_layer = core.config.mem_len, core.config.n_layer
        self.h, self.dh = core.config.n_head, core.config.d_head

    def features(self, obs: Tensor, starts: Tensor) -> Tensor:
        """obs (E, T, D_obs) from no memory, starts (E, T) bool -> features (E, T, D)."""
        return torch.stack([self._episodes(o, s) for o, s in zip(obs, starts, strict=True)])

    def _episodes(self, obs: Tensor, starts: Tensor) -> Tensor:
        p = self.p
        history: list[list[Tensor]] = [[] for _ in range(self.n_layer)]  # layer inputs of this episode
        out = []
        for x_obs, start in zip(obs.to(torch.float64), starts.tolist(), strict=True):
            if start:
                history = [[] for _ in range(self.n_layer)]
            x = p["input.weight"] @ x_obs + p["input.bias"]
            for layer in range(self.n_layer):
                remembered = history[layer][-self.mem_len :] if self.mem_len else []
                history[layer].append(x)
                x = self._layer(layer, x, [*remembered, x])
            out.append(_layer_norm(x, p["norm.weight"], p["norm.bias"]))
        return torch.stack(out)

    def _layer(self, layer: int, x: Tensor, keys: list[Tensor]) -> Tensor:
        p, pre = self.p, f"layers.{layer}."
        y = self._attention(layer, x, keys)
        x = self._gate(pre + "attn_gate.", x, torch.relu(y)) if self.gated else x + y
        normed = _layer_norm(x, p[pre + "ff_norm.weight"], p[pre + "ff_norm.bias"])
        hidden = torch.relu(p[pre + "ff.net.0.weight"] @ normed + p[pre + "ff.net.0.bias"])
        y = p[pre + "ff.net.3.weight"] @ hidden + p[pre + "ff.net.3.bias"]
        return self._gate(pre + "ff_gate.", x, torch.relu(y)) if self.gated else x + y

    def _attention(self, layer: int, x: Tensor, keys: list[Tensor]) -> Tensor:
        """The query x (D,) over keys (the remembered layer inputs, oldest first, then x itself)."""
        p, pre, h, dh = self.p, f"layers.{layer}.", self.h, self.dh
        n = h * dh
        w_q, w_k, w_v = p[pre + "attn.qkv.weight"].split(n)  # (H*Dh, D) each
        w_r, w_o = p[pre + "attn.r_net.weight"], p[pre + "attn.out.weight"]
        u, v = p["u"], p["v"]  # (H, Dh): shared by the layers

        def norm(y: Tensor) -> Tensor:
            return _layer_norm(y, p[pre + "attn_norm.weight"], p[pre + "attn_norm.bias"])

        q = (w_q @ norm(x)).view(h, dh)
        heads = []
        for head in range(h):
            scores, values = [], []
            for j, key in enumerate(keys):
                k = (w_k @ norm(key)).view(h, dh)[head]
                r = (w_r @ _sinusoid(len(keys) - 1 - j, x.shape[0])).view(h, dh)[head]
                a = q[head] @ k + q[head] @ r + u[head] @ k + v[head] @ r
                scores.append(a / math.sqrt(dh))
                values.append((w_v @ norm(key)).view(h, dh)[head])
            weights = torch.softmax(torch.stack(scores), dim=0)
            heads.append(sum(w * value for w, value in zip(weights, values, strict=True)))
        return w_o @ torch.cat(heads)

    def _gate(self, pre: str, x: Tensor, y: Tensor) -> Tensor:
        p = self.p
        w_r, w_z, w_g = p[pre + "w.weight"].chunk(3)
        u_r, u_z = p[pre + "u.weight"].chunk(2)
        u_g, b_g = p[pre + "u_g.weight"], p[pre + "gate_bias"]
        r = torch.sigmoid(w_r @ y + u_r @ x)
        z = torch.sigmoid(w_z @ y + u_z @ x - b_g)
        candidate = torch.tanh(w_g @ y + u_g @ (r * x))
        return (1 - z) * x + z * candidate


def _core(gating: str) -> MemoryCore:
    """A small float64 core whose every weight is moved off its initial value (gates far from the identity,
    norms with their own scales and shifts)."""
    torch.manual_seed(0)
    config = replace(CONFIG, gating=gating)
    core = MemoryCore(OBS, config).to(torch.float64).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in core.parameters():
            p.add_(0.5 * torch.randn(p.shape, generator=gen, dtype=p.dtype))
    return core


def _starts(e: int, t: int, at: dict[int, list[int]]) -> Tensor:
    starts = torch.zeros(e, t, dtype=torch.bool)
    for row, times in at.items():
        starts[row, times] = True
    return starts


@pytest.mark.parametrize("gating", ["gru", "none"])
def test_core_equals_the_papers_gtrxl(gating):
    """Steps and windows of MemoryCore (from stored states, the memory sliding, episodes reset inside a
    window) equal the reference written from the paper, in float64."""
    core = _core(gating)
    reference = ReferenceGTrXL(core)
    e, t = 3, 14
    gen = torch.Generator().manual_seed(2)
    obs = torch.randn(e, t, OBS, generator=gen, dtype=torch.float64)
    starts = _starts(e, t, {0: [0, 6], 1: [0], 2: [0, 1, 9]})
    expected = reference.features(obs, starts)
    with torch.no_grad():
        state = core.initial_state(e)
        stepped = []
        for i in range(t):
            out, state = core.step(obs[:, i], state, starts[:, i])
            stepped.append(out)
        first, middle = core.window(obs[:, :5], core.initial_state(e), starts[:, :5])
        second, _ = core.window(obs[:, 5:], middle, starts[:, 5:])
    torch.testing.assert_close(torch.stack(stepped, dim=1), expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(torch.cat([first, second], dim=1), expected, rtol=0, atol=1e-10)
    assert isinstance(middle, CoreState) and middle.reach.tolist() == [3, 3, 3]


@pytest.mark.parametrize("path", ["step", "window"])
def test_gru_baseline_forgets_at_an_episode_start(path):
    """The GRU baseline from a non-zero state equals nn.GRUCell run naively (obs -> Linear -> ReLU -> cell),
    its hidden state zero at every episode start: a start gives the features of a fresh initial state."""
    torch.manual_seed(0)
    core = GRUCore(OBS, d_model=8).to(torch.float64)
    cell = torch.nn.GRUCell(8, 8).to(torch.float64)
    cell.load_state_dict(core.cell.state_dict())
    e, t = 3, 9
    gen = torch.Generator().manual_seed(3)
    obs = torch.randn(e, t, OBS, generator=gen, dtype=torch.float64)
    starts = _starts(e, t, {0: [0, 4], 2: [2, 3, 7]})
    state0 = RecurrentState(torch.randn(e, 8, generator=gen, dtype=torch.float64))
    with torch.no_grad():
        if path == "window":
            features, _ = core.window(obs, state0, starts)
            fresh, _ = core.window(obs, core.initial_state(e), starts)
        else:
            runs = []
            for state in (state0, core.initial_state(e)):
                out = []
                for i in range(t):
                    f, state = core.step(obs[:, i], state, starts[:, i])
                    out.append(f)
                runs.append(torch.stack(out, dim=1))
            features, fresh = runs
        expected = torch.empty(e, t, 8, dtype=torch.float64)
        for row in range(e):
            h = state0.hidden[row : row + 1]
            for i in range(t):
                if starts[row, i]:
                    h = torch.zeros(1, 8, dtype=torch.float64)
                h = cell(torch.relu(core.input(obs[row : row + 1, i])), h)
                expected[row, i] = h[0]
    torch.testing.assert_close(features, expected, rtol=0, atol=1e-12)
    # rows 0 and 2 start an episode inside the window: from then on, as from a fresh state; row 1 does not
    torch.testing.assert_close(features[0], fresh[0], rtol=0, atol=1e-12)
    torch.testing.assert_close(features[2, 2:], fresh[2, 2:], rtol=0, atol=1e-12)
    assert not torch.allclose(features[1], fresh[1], atol=1e-3)
