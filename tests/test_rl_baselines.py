"""The recurrent baselines of txl.rl: the LSTM against the textbook LSTM equations run one episode at a time,
and, for the GRU and the LSTM, a window equals its steps across episode starts, an episode start equals a
fresh state, states stack and index as a rollout buffer uses them, and a window trains inside while the state
it returns is detached."""

from __future__ import annotations

import pytest
import torch

from txl.rl.baselines import GRUCore, LSTMCore, LSTMState


def inputs(e=3, t=12, d_obs=5, seed=0):
    """Observations (E, T, D_obs) and episode starts (E, T) with several starts inside the window."""
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(e, t, d_obs, generator=g)
    starts = torch.rand(e, t, generator=g) < 0.25
    starts[0, 5] = True
    return obs, starts


def textbook_lstm(core: LSTMCore, obs, starts, h0, c0):
    """One environment at a time, one step at a time, h and c set to zero at each episode start; the gates as
    written in the LSTM equations (i, f, g, o from the stacked weights), not through ``nn.LSTMCell``."""
    w_ih, w_hh = core.cell.weight_ih, core.cell.weight_hh
    b = core.cell.bias_ih + core.cell.bias_hh
    d = core.d_model
    out = torch.zeros(obs.shape[0], obs.shape[1], d)
    for env in range(obs.shape[0]):
        h, c = h0[env].clone(), c0[env].clone()
        for t in range(obs.shape[1]):
            if starts[env, t]:
                h, c = torch.zeros(d), torch.zeros(d)
            x = torch.relu(core.input.weight @ obs[env, t] + core.input.bias)
            z = w_ih @ x + w_hh @ h + b
            i, f, g, o = (
                torch.sigmoid(z[:d]),
                torch.sigmoid(z[d : 2 * d]),
                torch.tanh(z[2 * d : 3 * d]),
                torch.sigmoid(z[3 * d :]),
            )
            c = f * c + i * g
            h = o * torch.tanh(c)
            out[env, t] = h
    return out, h, c


def test_lstm_window_matches_the_textbook_equations_episode_by_episode():
    torch.manual_seed(0)
    core = LSTMCore(5, d_model=8)
    obs, starts = inputs()
    h0, c0 = torch.randn(3, 8), torch.randn(3, 8)
    with torch.no_grad():
        features, state = core.window(obs, LSTMState(h0, c0), starts)
        expected, _, _ = textbook_lstm(core, obs, starts, h0, c0)
    assert torch.allclose(features, expected, atol=1e-5, rtol=0)
    assert torch.allclose(state.hidden, expected[:, -1], atol=1e-5, rtol=0)


def _core(kind):
    torch.manual_seed(1)
    return GRUCore(5, d_model=8) if kind == "gru" else LSTMCore(5, d_model=8)


def _random_state(core, e):
    state = core.initial_state(e)
    return type(state)(*(torch.randn_like(t) for t in state.tensors()))


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_window_equals_its_steps_across_episode_starts(kind):
    core = _core(kind)
    obs, starts = inputs()
    state0 = _random_state(core, 3)
    with torch.no_grad():
        features, final = core.window(obs, state0, starts)
        state, stepped = state0, []
        for t in range(obs.shape[1]):
            out, state = core.step(obs[:, t], state, starts[:, t])
            stepped.append(out)
    assert torch.allclose(features, torch.stack(stepped, dim=1), atol=1e-6, rtol=0)
    for a, b in zip(final.tensors(), state.tensors(), strict=True):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_an_episode_start_forgets_even_a_non_finite_state(kind):
    """A state holding NaN or inf (an environment's bad observation in an earlier episode) is gone at the next
    episode start: nothing of it survives, on the step path and on the window path."""
    core = _core(kind)
    obs, starts = inputs()
    starts[:, 0] = True
    poisoned = type(core.initial_state(3))(
        *(
            torch.full_like(t, float("nan")).index_fill(0, torch.tensor([1]), float("inf"))
            for t in core.initial_state(3).tensors()
        )
    )
    with torch.no_grad():
        from_poisoned, _ = core.window(obs, poisoned, starts)
        from_fresh, _ = core.window(obs, core.initial_state(3), starts)
        stepped, _ = core.step(obs[:, 0], poisoned, starts[:, 0])
    assert torch.isfinite(from_poisoned).all()
    assert torch.equal(from_poisoned, from_fresh)
    assert torch.allclose(stepped, from_fresh[:, 0], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_an_episode_start_equals_a_fresh_state(kind):
    """From any state, a window whose first step starts an episode gives what a zero state gives."""
    core = _core(kind)
    obs, starts = inputs()
    starts[:, 0] = True
    with torch.no_grad():
        from_any, _ = core.window(obs, _random_state(core, 3), starts)
        from_fresh, _ = core.window(obs, core.initial_state(3), starts)
    assert torch.equal(from_any, from_fresh)
    assert all(torch.count_nonzero(t) == 0 for t in core.initial_state(3).tensors())


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_states_stored_per_step_resume_any_environment_at_any_step(kind):
    """States stacked over time (T, E) as a rollout buffer stores them, indexed back to some environments at
    some step, continue the window as the uninterrupted run does."""
    core = _core(kind)
    obs, starts = inputs(e=5, t=10)
    with torch.no_grad():
        features, stored, state = [], [], core.initial_state(5)
        for t in range(10):
            out, state = core.step(obs[:, t], state, starts[:, t])
            features.append(out)
            stored.append(state.clone())
        features = torch.stack(features, dim=1)
        states = type(state).stack(stored)
        envs, t0 = torch.tensor([4, 0, 2]), 6
        out, _ = core.window(obs[envs, t0:], states[t0 - 1, envs], starts[envs, t0:])
    assert torch.allclose(out, features[envs, t0:], atol=1e-6, rtol=0)


@pytest.mark.parametrize("kind", ["gru", "lstm"])
def test_window_trains_inside_and_returns_a_detached_state(kind):
    core = _core(kind)
    obs, starts = inputs()
    features, state = core.window(obs, core.initial_state(3), starts)
    features.sum().backward()
    assert core.input.weight.grad is not None and core.input.weight.grad.abs().sum() > 0
    assert not any(t.requires_grad for t in state.tensors())
