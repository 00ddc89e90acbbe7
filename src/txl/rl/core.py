"""The memory core of an agent: :mod:`txl.model`'s layer stack (Transformer-XL layers, or GTrXL's gated
variant) over projected observations, one step per environment for collection and windows for training.
Dimensions: E environments, T window steps, D_obs observation size, L layers, M remembered steps, K = M + T,
D model."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from numpy.typing import ArrayLike
from torch import Tensor, nn

from ..config import Span, StackConfig, positive_int
from ..model import DecoderLayer, LayerStack, Memory, attention_mask
from ..model.attention import AbsoluteContext, RelativeContext
from .compiled import CompiledRun
from .config import CoreConfig
from .state import CoreState

if TYPE_CHECKING:
    from ..model.cache import LayerCache

__all__ = ["MemoryCore", "CoreStack", "GatedLayer", "GRUGate"]

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

    def __init__(self, config: StackConfig) -> None:
        super().__init__(config)
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


class CoreStack(LayerStack):
    """The core's layer stack: :class:`~txl.model.LayerStack` with two rules of its own.

    - Each step attends its last M steps and itself (same-length attention over M + 1 keys): what one step
      sees, so that a window equals its steps.
    - A step a query may not attend (another episode, the future, a slot outside the reach) contributes
      nothing to it, whatever it holds (:meth:`run_layer`)."""

    def causal_mask(self, t: int, m: int, *, span: Span, device: torch.device) -> Tensor:
        """(T, K) bool: the future and the keys more than M steps behind each query are out of view."""
        return attention_mask(t, m, same_length=True, mem_len=m + 1, device=device)

    def run_layer(
        self,
        layer: nn.Module,
        h: Tensor,
        *,
        memory: Tensor | None,
        context: RelativeContext | AbsoluteContext | None,
        cache: LayerCache | None,
    ) -> Tensor:
        """``layer(h, memory=memory, context=context)``, h (E, T, D), memory (E, M, D), where a step a query may
        not attend (True in ``context.mask``) contributes nothing to it, whatever it holds.

        Attention gives such a key weight 0, but 0 x NaN is NaN. So a step whose attention input (its normed
        hidden state, what its key and value are projected from) is not finite enters the layer as zeros
        (selected, not multiplied), and the queries that may attend it get NaN, as they would without the
        selection. Where every attention input is finite this is the layer itself, bit for bit."""
        assert isinstance(context, RelativeContext) and cache is None  # the core's stack: relative, no cache
        m = 0 if memory is None else memory.shape[1]
        steps = h if memory is None else torch.cat([memory, h], dim=1)  # (E, K, D)
        # a row with a NaN or an infinity sums to one (a normed row is far too small to overflow)
        bad = ~torch.isfinite(cast(DecoderLayer, layer).attention_input(steps).sum(dim=-1))  # (E, K)
        steps = torch.where(bad[..., None], 0.0, steps)  # (E, K, D)
        blocked = context.mask if context.mask.dim() == 2 else context.mask[:, 0]  # (T, K) or (E, T, K)
        sees_bad = (bad[:, None, :] & ~blocked).any(dim=-1)  # (E, T)
        out = layer(steps[:, m:], memory=steps[:, :m] if m else None, context=context)  # (E, T, D)
        return torch.where(sees_bad[..., None], float("nan"), out)


class MemoryCore(nn.Module):
    """Transformer-XL memory over observations: obs -> Linear -> :class:`CoreStack` (the L layers of
    :class:`~txl.model.LayerStack`, relative attention over each environment's remembered steps of its current
    episode) -> LayerNorm -> features (D).

        core = MemoryCore(obs_dim, CoreConfig())
        state = core.initial_state(E)
        features, state = core.step(obs, state, episode_start)   # (E, D_obs), (E,) bool -> (E, D)
        features, state = core.window(obs, state0, starts)       # (E, T, D_obs), (E, T) bool -> (E, T, D)

    Both paths are one function (a step is a window of one), so ``window`` from a stored state equals T calls
    of ``step`` from it; with ``config.compiled`` a step runs that function compiled (:mod:`txl.rl.compiled`).
    An episode start is a document start of :mod:`txl.model`: the step that begins an
    episode, and every later one, attends to nothing before it. The memory has ``mem_len`` slots from the
    first step on and slides, so episodes of any length cost the same per step.

    Inputs: observations may be tensors, numpy arrays or nested lists (cast to the core's dtype and device);
    episode starts bool tensors, arrays or lists (moved to its device). A window of T = 0 steps returns
    features (E, 0, D) and the state it was given. Observations must be finite: a NaN or infinite value
    raises a ValueError naming its environment (and step of the window); replace or clip such values before
    the core (e.g. ``torch.nan_to_num``). A step a query may not attend (another episode, the future, a slot
    outside the reach) contributes nothing to it, whatever it holds: a non-finite value in such a slot (a
    state written by other code, an overflow) never reaches another episode, and ``window`` equals the steps
    around it; a query that does attend one gets NaN features.

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
        self.drop = nn.Dropout(config.dropout)  # the features' (the stack drops its input and positions)
        self.layers = CoreStack(config.stack, layer=GatedLayer if config.gating == "gru" else DecoderLayer)
        self.u = nn.Parameter(torch.zeros(config.n_head, config.d_head))  # global content bias (shared)
        self.v = nn.Parameter(torch.zeros(config.n_head, config.d_head))  # global position bias (shared)
        self.norm = nn.LayerNorm(config.d_model)
        nn.init.normal_(self.u, 0.0, 0.02)
        nn.init.normal_(self.v, 0.0, 0.02)
        self._compiled = CompiledRun(self._run) if config.compiled else None
        """What :meth:`step` runs where ``config.compiled`` asks: :meth:`_run` compiled (None: :meth:`_run`)."""

    def initial_state(self, n_envs: int) -> CoreState:
        """The state of ``n_envs`` environments that remember nothing: zero slots, reach 0 (on the core's
        device, in its dtype)."""
        positive_int(n_envs, "n_envs", error=ValueError, field=False)
        cfg, weight = self.config, self.input.weight
        memory = weight.new_zeros(n_envs, cfg.n_layer, cfg.mem_len, cfg.d_model)  # (E, L, M, D)
        return CoreState(memory, torch.zeros(n_envs, dtype=torch.int64, device=weight.device))

    def step(
        self, obs: Tensor | ArrayLike, state: CoreState, episode_start: Tensor | ArrayLike
    ) -> tuple[Tensor, CoreState]:
        """One step of E environments: obs (E, D_obs), episode_start (E,) bool (True where obs is the first
        of a new episode: that row forgets its memory) -> features (E, D) and the next state."""
        obs, episode_start = self._inputs(obs, state, episode_start, window=False)
        run = self._run if self._compiled is None else self._compiled
        features, state = run(obs[:, None], state, episode_start[:, None])
        return features[:, 0], state  # (E, D)

    def window(
        self, obs: Tensor | ArrayLike, state0: CoreState, starts: Tensor | ArrayLike
    ) -> tuple[Tensor, CoreState]:
        """T steps of E environments from ``state0`` (detached, e.g. stored in a rollout buffer): obs
        (E, T, D_obs), starts (E, T) bool (episode starts) -> features (E, T, D), with gradients inside the
        window, and the state after it (T = 0: no features, ``state0``)."""
        obs, starts = self._inputs(obs, state0, starts, window=True)
        if obs.shape[1] == 0:
            return obs.new_zeros(obs.shape[0], 0, self.config.d_model), state0  # (E, 0, D)
        return self._run(obs, state0, starts)

    def _run(self, obs: Tensor, state0: CoreState, starts: Tensor) -> tuple[Tensor, CoreState]:
        """:meth:`window` on checked inputs, T >= 1."""
        cfg = self.config
        h = self.input(obs)  # (E, T, D)
        memory = None
        if cfg.mem_len > 0:  # the input of every layer at the last M steps, (E, M, D) each
            memory = Memory(tuple(state0.memory.unbind(dim=1)), reach=state0.reach)
        biases = [(self.u, self.v)] * cfg.n_layer  # shared by the layers
        h, after = self.layers(h, memory=memory, span=cfg.span, starts=starts, biases=biases)
        return self.drop(self.norm(h)), self._next_state(state0, after)

    def _next_state(self, state0: CoreState, after: Memory | None) -> CoreState:
        """The state after a window, from the memory the stack returned (``after``; None for mem_len 0): the
        layer inputs of the last M steps (:func:`txl.model.update_memory`: concatenate, keep the last M,
        detach) and the reach, which follows the episode starts."""
        if after is None:
            return CoreState(state0.memory, torch.zeros_like(state0.reach))
        assert after.reach is not None  # the stack was given starts
        return CoreState(torch.stack(after.states, dim=1), after.reach)  # (E, L, M, D), (E,)

    def _inputs(
        self, obs: Tensor | ArrayLike, state: CoreState, starts: Tensor | ArrayLike, *, window: bool
    ) -> tuple[Tensor, Tensor]:
        """obs and starts as tensors on the core's device (obs in its dtype), checked against the shapes of
        a window (obs (E, T, D_obs), starts (E, T)) or of a step (obs (E, D_obs), episode_start (E,)), and
        the state against them; a one-line error that names the argument otherwise."""
        cfg, weight = self.config, self.input.weight
        obs_shape, starts_name = ("(E, T, {})", "starts") if window else ("(E, {})", "episode_start")
        obs_shape = obs_shape.format(self.obs_dim)
        obs = _as_tensor(obs, "obs", f"of shape {obs_shape}", dtype=weight.dtype, device=weight.device)
        if obs.dim() != (3 if window else 2) or obs.shape[-1] != self.obs_dim:
            raise ValueError(f"obs must be {obs_shape}, got {tuple(obs.shape)}")
        lead = tuple(obs.shape[:-1])  # (E, T) or (E,)
        starts = _as_tensor(starts, starts_name, f"of shape {lead}", device=weight.device)
        if starts.dtype != torch.bool or tuple(starts.shape) != lead:
            raise ValueError(
                f"{starts_name} must be a bool tensor of shape {lead} (episode starts), got {starts.dtype} "
                f"{tuple(starts.shape)}"
            )
        if not isinstance(state, CoreState):
            raise ValueError(
                f"state must be a CoreState (from initial_state or a step), got {type(state).__name__}"
            )
        e = lead[0]
        expected = (e, cfg.n_layer, cfg.mem_len, cfg.d_model)
        if tuple(state.memory.shape) != expected:
            raise ValueError(
                f"state memory must be {expected} for these {e} environments, got {tuple(state.memory.shape)}"
            )
        if state.memory.dtype != weight.dtype or {state.memory.device, state.reach.device} != {weight.device}:
            raise ValueError(
                f"state must be {weight.dtype} on {weight.device} (the core's), got memory "
                f"{state.memory.dtype} on {state.memory.device}, reach on {state.reach.device}"
            )
        # one host sync for both value checks
        finite, in_reach = torch.stack(
            [torch.isfinite(obs).all(), ((state.reach >= 0) & (state.reach <= cfg.mem_len)).all()]
        ).tolist()
        if not in_reach:
            env = int(((state.reach < 0) | (state.reach > cfg.mem_len)).nonzero()[0, 0])
            raise ValueError(
                f"state reach must be between 0 and mem_len = {cfg.mem_len}, got {int(state.reach[env])} at "
                f"environment {env}"
            )
        if not finite:
            where = (~torch.isfinite(obs)).nonzero()[0].tolist()
            at = (
                f"environment {where[0]}, step {where[1]} of the window"
                if window
                else f"environment {where[0]}"
            )
            raise ValueError(
                f"obs must be finite, got {obs[tuple(where)].item()} at {at} (replace or clip non-finite "
                f"observations before the core, e.g. with torch.nan_to_num)"
            )
        return obs, starts


def _as_tensor(value: Tensor | ArrayLike, name: str, shape: str, **kwargs: Any) -> Tensor:
    """``torch.as_tensor(value, **kwargs)`` (no copy for a tensor already there), or a TypeError naming the
    argument."""
    try:
        return torch.as_tensor(value, **kwargs)
    except (TypeError, ValueError, RuntimeError) as error:
        raise TypeError(
            f"{name} must be a tensor, array or nested list {shape}, got {type(value).__name__}"
        ) from error
