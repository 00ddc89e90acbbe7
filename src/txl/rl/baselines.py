"""The cores the Transformer-XL core is compared with, behind its interface (``initial_state``, ``step``,
``window``): a GRU, an LSTM (the recurrent agent of SB3's RecurrentPPO) and its two-tensor state, and an MLP
that remembers nothing. Dimensions: E environments, T steps of a window, D_obs observation size, D feature
size.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .state import RecurrentState, TensorState

__all__ = ["GRUCore", "LSTMState", "LSTMCore", "MLPCore"]


class GRUCore(nn.Module):
    """obs -> Linear -> ReLU -> GRU cell -> features (D); the hidden state is zeroed where an episode
    starts."""

    def __init__(self, obs_dim: int, d_model: int = 64) -> None:
        super().__init__()
        self.d_model = d_model
        self.input = nn.Linear(obs_dim, d_model)
        self.cell = nn.GRUCell(d_model, d_model)

    def initial_state(self, n_envs: int) -> RecurrentState:
        """A zero hidden state (E, D)."""
        return RecurrentState(self.input.weight.new_zeros(n_envs, self.d_model))

    def step(
        self, obs: Tensor, state: RecurrentState, episode_start: Tensor
    ) -> tuple[Tensor, RecurrentState]:
        """obs (E, D_obs), episode_start (E,) bool -> features (E, D), the next state."""
        features, state = self.window(obs[:, None], state, episode_start[:, None])
        return features[:, 0], state

    def window(self, obs: Tensor, state0: RecurrentState, starts: Tensor) -> tuple[Tensor, RecurrentState]:
        """obs (E, T, D_obs), starts (E, T) bool -> features (E, T, D), the state after (detached)."""
        x = torch.relu(self.input(obs))  # (E, T, D)
        h = state0.hidden  # (E, D)
        out = []
        for t in range(obs.shape[1]):
            # an episode start forgets: select, so that nothing of the old state (even a NaN) survives it
            h = self.cell(x[:, t], torch.where(starts[:, t, None], 0.0, h))
            out.append(h)
        return torch.stack(out, dim=1), RecurrentState(h.detach())  # (E, T, D)


@dataclass(frozen=True)
class LSTMState(TensorState):
    """The state of :class:`LSTMCore`: ``hidden`` (E, D), the LSTM's output h, and ``cell`` (E, D), its cell
    c."""

    hidden: Tensor
    cell: Tensor


class LSTMCore(nn.Module):
    """obs -> Linear -> ReLU -> LSTM cell -> features (D, the cell's h); h and c are zeroed where an episode
    starts. The cell is ``torch.nn.LSTMCell`` with its default initialisation."""

    def __init__(self, obs_dim: int, d_model: int = 64) -> None:
        super().__init__()
        self.d_model = d_model
        self.input = nn.Linear(obs_dim, d_model)
        self.cell = nn.LSTMCell(d_model, d_model)

    def initial_state(self, n_envs: int) -> LSTMState:
        """Zero h and c, (E, D) each."""
        zeros = self.input.weight.new_zeros(n_envs, self.d_model)
        return LSTMState(zeros, zeros.clone())

    def step(self, obs: Tensor, state: LSTMState, episode_start: Tensor) -> tuple[Tensor, LSTMState]:
        """obs (E, D_obs), episode_start (E,) bool -> features (E, D), the next state."""
        features, state = self.window(obs[:, None], state, episode_start[:, None])
        return features[:, 0], state

    def window(self, obs: Tensor, state0: LSTMState, starts: Tensor) -> tuple[Tensor, LSTMState]:
        """obs (E, T, D_obs), starts (E, T) bool -> features (E, T, D), the state after (detached)."""
        x = torch.relu(self.input(obs))  # (E, T, D)
        h, c = state0.hidden, state0.cell  # (E, D) each
        out = []
        for t in range(obs.shape[1]):
            start = starts[:, t, None]  # an episode start forgets h and c (select: even a NaN goes)
            h, c = self.cell(x[:, t], (torch.where(start, 0.0, h), torch.where(start, 0.0, c)))
            out.append(h)
        return torch.stack(out, dim=1), LSTMState(h.detach(), c.detach())  # (E, T, D)


class MLPCore(nn.Module):
    """obs -> Linear -> ReLU -> Linear -> ReLU -> features (D): no memory (its state has no columns)."""

    def __init__(self, obs_dim: int, d_model: int = 64) -> None:
        super().__init__()
        self.input = nn.Linear(obs_dim, d_model)
        self.net = nn.Sequential(self.input, nn.ReLU(), nn.Linear(d_model, d_model), nn.ReLU())

    def initial_state(self, n_envs: int) -> RecurrentState:
        """An empty state (E, 0)."""
        return RecurrentState(self.input.weight.new_zeros(n_envs, 0))

    def step(
        self, obs: Tensor, state: RecurrentState, episode_start: Tensor
    ) -> tuple[Tensor, RecurrentState]:
        """obs (E, D_obs) -> features (E, D); the state passes through."""
        return self.net(obs), state

    def window(self, obs: Tensor, state0: RecurrentState, starts: Tensor) -> tuple[Tensor, RecurrentState]:
        """obs (E, T, D_obs) -> features (E, T, D); the state passes through."""
        return self.net(obs), state0
