"""The memory core of an agent: :mod:`txl.model`'s Transformer-XL layers (or GTrXL's gated variant) over
projected observations, one step per environment for collection and windows for training. Dimensions:
E environments, T window steps, D_obs observation size, L layers, M remembered steps, K = M + T, D model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..config import positive_int
from ..model.attention import AbsoluteContext, RelativeContext
from ..model.cache import LayerCache
from ..model.layers import DecoderLayer
from ..model.memory import Memory, update_memory
from ..model.positional import relative_distances, sinusoid
from ..model.transformer import attention_mask, document_mask
from .config import CoreConfig
from .state import CoreState

__all__ = ["MemoryCore", "GatedLayer", "GRUGate"]

GATE_BIAS = 2.0
"""GTrXL's initial gate bias b_g: the update gate starts at about sigmoid(-2) = 0.12, so that each layer
starts near the identity map (Parisotto et al. 2019 found b_g = 2 trained best)."""


class GRUGate(nn.Module):
    """GTrXL's GRU-type gate g(x, y) in place of the residual sum x + y (Parisotto et al. 2019, Eq. 8):

    r = sigmoid(W_r y + U_r x)            z = sigmoid(W_z y + U_z x - b_g)
    h = tanh(W_g y + U_g (r * x))         g(x, y) = (1 - z) * x + z * h
    """

    def __init__(self, d_model: int, *, bias: float = GATE_BIAS) -> None:
        super().__init__()
        self.w = nn.Linear(d_model, 3 * d_model, bias=False)  # rows: W_r | W_z | W_g, applied to y
        self.u = nn.Linear(d_model, 2 * d_model, bias=False)  # rows: U_r | U_z, applied to x
        self.u_g = nn.Linear(d_model, d_model, bias=False)
        self.gate_bias = nn.Parameter(torch.full((d_model,), bias))

    def forward(self, x: Tensor, y: Tensor) -> Tensor:
        """x the layer's stream, y the sublayer's output, both (..., D) -> (..., D)."""
        wr, wz, wg = self.w(y).chunk(3, dim=-1)  # 3 x (..., D)
        ur, uz = self.u(x).chunk(2, dim=-1)  # 2 x (..., D)
        r = torch.sigmoid(wr + ur)
        z = torch.sigmoid(wz + uz - self.gate_bias)
        h = torch.tanh(wg + self.u_g(r * x))
        return torch.lerp(x, h, z)  # (1 - z) * x + z * h


class GatedLayer(DecoderLayer):
    """A GTrXL layer: ``txl.model``'s pre-norm decoder layer (its attention, feed-forward and norms) with a
    GRU-type gate after each sublayer's ReLU in place of the residual sum (Parisotto et al. 2019, Eqs. 1-8):

        y = RelAttn(LN(x), memory=LN(memory));  x = g1(x, ReLU(y))
        y = FF(LN(x));                          x = g2(x, ReLU(y))
    """

    def __init__(self, config: CoreConfig) -> None:
        super().__init__(config.layer_config())
        self.attn_gate = GRUGate(config.d_model)
        self.ff_gate = GRUGate(config.d_model)

    def forward(
        self,
        x: Tensor,
        *,
        memory: Tensor | None = None,
        context: RelativeContext | AbsoluteContext | None = None,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """x (E, T, D), memory (E, M, D) -> (E, T, D), as :meth:`DecoderLayer.forward`."""
        normed_memory = None if memory is None else self.attn_norm(memory)
        y = self.attn(self.attn_norm(x), memory=normed_memory, context=context, cache=cache)
        x = self.attn_gate(x, F.relu(y))
        return self.ff_gate(x, F.relu(self.ff(self.ff_norm(x))))


class MemoryCore(nn.Module):
    """Transformer-XL memory over observations: obs -> Linear -> L layers (relative attention over each
    environment's remembered steps of its current episode) -> LayerNorm -> features (D).

        core = MemoryCore(obs_dim, CoreConfig())
        state = core.initial_state(E)
        features, state = core.step(obs, state, episode_start)   # (E, D_obs), (E,) bool -> (E, D)
        features, state = core.window(obs, state0, starts)       # (E, T, D_obs), (E, T) bool -> (E, T, D)

    Both paths are one function (a step is a window of one), so ``window`` from a stored state equals T calls
    of ``step`` from it. An episode start is a document start of :mod:`txl.model`: the step that begins an
    episode, and every later one, attends to nothing before it. The memory has ``mem_len`` slots from the
    first step on and slides, so episodes of any length cost the same per step.

    After a weight update the state is kept as it is (stale), never recomputed: it is what the agent acted
    on, so a training window started from a stored state sees the policy's own inputs; and its staleness is
    bounded: the features no longer depend on any value computed with the old weights after
    ``n_layer * mem_len`` steps of the episode, or from an episode start on.
    """

    def __init__(self, obs_dim: int, config: CoreConfig | None = None) -> None:
        super().__init__()
        config = CoreConfig() if config is None else config
        positive_int(obs_dim, "obs_dim", error=ValueError, field=False)
        self.obs_dim, self.config = obs_dim, config
        self.input = nn.Linear(obs_dim, config.d_model)
        self.drop = nn.Dropout(config.dropout)
        if config.gating == "gru":
            self.layers = nn.ModuleList([GatedLayer(config) for _ in range(config.n_layer)])
        else:
            self.layers = nn.ModuleList([DecoderLayer(config.layer_config()) for _ in range(config.n_layer)])
        self.u = nn.Parameter(torch.zeros(config.n_head, config.d_head))  # global content bias (shared)
        self.v = nn.Parameter(torch.zeros(config.n_head, config.d_head))  # global position bias (shared)
        self.norm = nn.LayerNorm(config.d_model)
        nn.init.normal_(self.u, 0.0, 0.02)
        nn.init.normal_(self.v, 0.0, 0.02)

    def initial_state(self, n_envs: int) -> CoreState:
        """The state of ``n_envs`` environments that remember nothing: zero slots, reach 0 (on the core's
        device, in its dtype)."""
        positive_int(n_envs, "n_envs", error=ValueError, field=False)
        cfg, weight = self.config, self.input.weight
        memory = weight.new_zeros(n_envs, cfg.n_layer, cfg.mem_len, cfg.d_model)  # (E, L, M, D)
        return CoreState(memory, torch.zeros(n_envs, dtype=torch.int64, device=weight.device))

    def step(self, obs: Tensor, state: CoreState, episode_start: Tensor) -> tuple[Tensor, CoreState]:
        """One step of E environments: obs (E, D_obs), episode_start (E,) bool (True where obs is the first
        of a new episode: that row forgets its memory) -> features (E, D) and the next state."""
        if obs.dim() != 2 or episode_start.dim() != 1:
            raise ValueError(
                f"step takes obs (E, D_obs) and episode_start (E,), got {tuple(obs.shape)} and "
                f"{tuple(episode_start.shape)}"
            )
        features, state = self.window(obs[:, None], state, episode_start[:, None])
        return features[:, 0], state  # (E, D)

    def window(self, obs: Tensor, state0: CoreState, starts: Tensor) -> tuple[Tensor, CoreState]:
        """T steps of E environments from ``state0`` (detached, e.g. stored in a rollout buffer): obs
        (E, T, D_obs), starts (E, T) bool (episode starts) -> features (E, T, D), with gradients inside the
        window, and the state after it."""
        self._check(obs, state0, starts)
        cfg = self.config
        e, t, _ = obs.shape
        m = cfg.mem_len
        h = self.drop(self.input(obs))  # (E, T, D)
        distances = relative_distances(m + t, clamp_len=None, device=obs.device)  # (K,)
        pos = self.drop(sinusoid(distances, cfg.d_model, dtype=h.dtype))  # (K, D)
        # each query sees its last M steps and itself, what one step sees: the future and keys more than M
        # behind are masked (same-length attention over M + 1 keys)
        causal = attention_mask(t, m, same_length=True, mem_len=m + 1, device=obs.device)  # (T, K)
        documents = document_mask(starts, state0.reach, t=t, m=m)  # (E, T, K): before the episode's start
        context = RelativeContext(pos, (causal | documents)[:, None], self.u, self.v)
        inputs = []  # the input of every layer: what the next steps remember
        for index, layer in enumerate(self.layers):
            inputs.append(h)
            memory = state0.memory[:, index] if m > 0 else None  # (E, M, D)
            h = layer(h, memory=memory, context=context)
        return self.drop(self.norm(h)), self._next_state(state0, inputs, starts)

    def _next_state(self, state0: CoreState, inputs: list[Tensor], starts: Tensor) -> CoreState:
        """The memory after the window: :func:`txl.model.memory.update_memory` (concatenate, keep the last M,
        detach; the reach follows the episode starts)."""
        m = self.config.mem_len
        if m == 0:
            return CoreState(state0.memory, torch.zeros_like(state0.reach))
        before = Memory(tuple(state0.memory.unbind(dim=1)), reach=state0.reach)
        after = update_memory(before, inputs, mem_len=m, starts=starts)
        assert after is not None and after.reach is not None
        return CoreState(torch.stack(after.states, dim=1), after.reach)  # (E, L, M, D), (E,)

    def _check(self, obs: Tensor, state: CoreState, starts: Tensor) -> None:
        cfg = self.config
        if obs.dim() != 3 or obs.shape[-1] != self.obs_dim:
            raise ValueError(f"obs must be (E, T, {self.obs_dim}), got {tuple(obs.shape)}")
        e, t = obs.shape[:2]
        if not isinstance(starts, Tensor) or starts.dtype != torch.bool or starts.shape != (e, t):
            got = (
                f"{starts.dtype} {tuple(starts.shape)}"
                if isinstance(starts, Tensor)
                else type(starts).__name__
            )
            raise ValueError(f"episode starts must be a bool tensor of shape ({e}, {t}), got {got}")
        if not isinstance(state, CoreState):
            raise ValueError(
                f"state must be a CoreState (from initial_state or a step), got {type(state).__name__}"
            )
        expected = (e, cfg.n_layer, cfg.mem_len, cfg.d_model)
        if tuple(state.memory.shape) != expected:
            raise ValueError(
                f"state memory must be {expected} for these {e} environments, got {tuple(state.memory.shape)}"
            )
