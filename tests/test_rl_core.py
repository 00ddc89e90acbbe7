"""txl.rl's memory core: the window path against T steps across episode resets, resets that forget, the state
through a rollout buffer, the memory after a weight update, gates that start near the identity, settings."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from safetensors.torch import load, save

from txl.config import ConfigError
from txl.rl import CoreConfig, CoreState, MemoryCore
from txl.rl.core import GatedLayer, GRUGate

OBS = 5


def _core(dtype: torch.dtype = torch.float32, **fields) -> MemoryCore:
    torch.manual_seed(0)
    config = CoreConfig(**{"n_layer": 2, "n_head": 2, "d_head": 8, "d_model": 16, "d_inner": 32, **fields})
    return MemoryCore(OBS, config).to(dtype).eval()


def _steps(core: MemoryCore, obs: torch.Tensor, state: CoreState, starts: torch.Tensor):
    """T calls of the step path: features (E, T, D), the states after each step, the last state."""
    features, states = [], []
    for t in range(obs.shape[1]):
        out, state = core.step(obs[:, t], state, starts[:, t])
        features.append(out)
        states.append(state)
    return torch.stack(features, dim=1), states, state


def _starts(e: int, t: int, at: dict[int, list[int]]) -> torch.Tensor:
    starts = torch.zeros(e, t, dtype=torch.bool)
    for row, times in at.items():
        starts[row, times] = True
    return starts


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("gating", ["gru", "none"])
@pytest.mark.parametrize("mem_len,t", [(40, 24), (6, 24)])
def test_window_equals_steps_across_resets(dtype, tol, gating, mem_len, t):
    """From a stored state, one window of T steps equals T calls of step: features and the state after, with
    3-4 episode starts inside the window in some rows, a memory longer than the window (and shorter)."""
    core = _core(dtype, gating=gating, mem_len=mem_len)
    e = 4
    gen = torch.Generator().manual_seed(1)
    warm = torch.randn(e, 9, OBS, generator=gen, dtype=dtype)
    _, _, state0 = _steps(core, warm, core.initial_state(e), _starts(e, 9, {0: [0], 1: [4], 3: [0, 7]}))
    obs = torch.randn(e, t, OBS, generator=gen, dtype=dtype)
    starts = _starts(e, t, {0: [3, 9, 15, 20], 1: [0, 1, 2], 2: [11]})
    with torch.no_grad():
        window, after = core.window(obs, state0, starts)
    stepped, _, last = _steps(core, obs, state0, starts)
    assert torch.allclose(window, stepped, atol=tol, rtol=0), (window - stepped).abs().max()
    assert torch.allclose(after.memory, last.memory, atol=tol, rtol=0)
    assert torch.equal(after.reach, last.reach)
    # a row's reach: its steps since its last start, capped at M
    expected = torch.tensor([t - 20, t - 2, t - 11, min(mem_len, 9 - 7 + t)]).clamp(max=mem_len)
    assert torch.equal(after.reach, expected)


@pytest.mark.parametrize("path", ["step", "window"])
def test_reset_forgets_the_previous_episode(path):
    """After an episode start, a row's features do not depend on its previous episode (perturbed); the other
    rows' features, and the row's before the start, do."""
    core = _core(mem_len=32)
    e, t, start = 3, 20, 12
    gen = torch.Generator().manual_seed(2)
    obs = torch.randn(e, t, OBS, generator=gen)
    perturbed = obs.clone()
    perturbed[:, :start] += torch.randn(e, start, OBS, generator=gen)
    starts = _starts(e, t, {0: [0], 1: [0, start], 2: [0]})  # row 1 begins a new episode at `start`
    runs = []
    for x in (obs, perturbed):
        with torch.no_grad():
            if path == "window":
                runs.append(core.window(x, core.initial_state(e), starts)[0])
            else:
                runs.append(_steps(core, x, core.initial_state(e), starts)[0])
    a, b = runs
    assert torch.allclose(a[1, start:], b[1, start:], atol=1e-6, rtol=0)
    assert not torch.allclose(a[1, :start], b[1, :start], atol=1e-3)
    assert not torch.allclose(a[[0, 2], start:], b[[0, 2], start:], atol=1e-3)


def test_state_round_trips_through_a_buffer():
    """States stored at every step of a rollout (stacked to (T, E)), saved and loaded as safetensors, sliced
    by time and environment, then resumed, give the features of the uninterrupted run."""
    core = _core(mem_len=10)
    e, t = 5, 30
    gen = torch.Generator().manual_seed(3)
    obs = torch.randn(e, t, OBS, generator=gen)
    starts = _starts(e, t, {0: [0, 17], 1: [0], 2: [0, 5, 22], 3: [0], 4: [0, 26]})
    with torch.no_grad():
        features, states, _ = _steps(core, obs, core.initial_state(e), starts)
    buffer = CoreState.stack([s.detach().clone() for s in states])  # memory (T, E, L, M, D), reach (T, E)
    assert buffer.memory.shape == (t, e, 2, 10, 16) and buffer.reach.shape == (t, e)
    loaded = CoreState(**load(save({"memory": buffer.memory, "reach": buffer.reach})))
    envs, t0 = torch.tensor([4, 0, 2]), 14
    resumed = loaded[t0 - 1, envs]  # the state after step t0 - 1 of these environments
    assert resumed.memory.shape == (3, 2, 10, 16) and not resumed.memory.requires_grad
    with torch.no_grad():
        out, _ = core.window(obs[envs, t0:], resumed, starts[envs, t0:])
    assert torch.allclose(out, features[envs, t0:], atol=1e-5, rtol=0)
    halves = CoreState.cat([loaded[t0 - 1, :2], loaded[t0 - 1, 2:]])
    assert torch.equal(halves.memory, loaded.memory[t0 - 1]) and torch.equal(
        halves.reach, loaded.reach[t0 - 1]
    )
    moved = loaded.to(torch.float64)
    assert moved.memory.dtype == torch.float64 and moved.reach.dtype == torch.int64


def test_memory_after_a_weight_update_is_kept_stale_until_it_slides_out():
    """The rule: after a weight update the state is not recomputed. Right after the update the features
    differ from a run that used the new weights from the start; after n_layer * mem_len steps of the episode
    they equal it (the stale values have slid out of every layer's memory)."""
    mem_len, n_layer = 5, 2
    old = _core(torch.float64, mem_len=mem_len, n_layer=n_layer)
    new = copy.deepcopy(old)
    with torch.no_grad():
        for p in new.parameters():
            p.add_(0.1 * torch.randn_like(p))
    e, before, after = 2, 15, 2 * n_layer * mem_len
    gen = torch.Generator().manual_seed(4)
    obs = torch.randn(e, before + after, OBS, generator=gen, dtype=torch.float64)
    starts = _starts(e, before + after, {0: [0], 1: [0]})
    with torch.no_grad():
        _, state = old.window(obs[:, :before], old.initial_state(e), starts[:, :before])
        stored = state.memory.clone()
        continued, _, _ = _steps(new, obs[:, before:], state, starts[:, before:])
        fresh, _ = new.window(obs, new.initial_state(e), starts)
    assert torch.equal(state.memory, stored)  # the update left the state as it was
    gap = (continued - fresh[:, before:]).abs().amax(dim=(0, 2))  # (T,)
    assert gap[0] > 1e-3  # stale: not recomputed with the new weights
    bound = n_layer * mem_len
    assert gap[bound:].max() < 1e-10, gap
    assert gap[bound - 1] > 1e-6  # and not earlier: the bound is tight


def test_gates_start_near_the_identity():
    """GTrXL's gate bias makes each gate, and a gated layer, start close to the identity map; a residual sum
    (no gating) moves its input further."""
    torch.manual_seed(0)
    x, y = torch.randn(8, 16, 64), torch.relu(torch.randn(8, 16, 64))
    gate = GRUGate(64)
    assert torch.allclose(gate.gate_bias, torch.full((64,), 2.0))
    assert (gate(x, y) - x).norm() / x.norm() < 0.25
    config = CoreConfig(d_model=64, mem_len=4)
    core = MemoryCore(OBS, config).eval()  # its u, v for the layers' context
    gated, plain = GatedLayer(config).eval(), MemoryCore(OBS, replace(config, gating="none")).layers[0]
    h = torch.randn(3, 6, 64)
    with torch.no_grad():
        out, summed = _layer_output(core, gated, h), _layer_output(core, plain, h)
    assert (out - h).norm() / h.norm() < 0.35
    assert (out - h).norm() < (summed - h).norm()


def _layer_output(core: MemoryCore, layer: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """One layer over h (E, T, D) with no memory, through the context the core builds."""
    from txl.model.attention import RelativeContext
    from txl.model.positional import relative_distances, sinusoid
    from txl.model.transformer import attention_mask

    t = h.shape[1]
    pos = sinusoid(relative_distances(t, clamp_len=None), h.shape[-1], dtype=h.dtype)
    mask = attention_mask(t, 0, same_length=False, mem_len=0)
    return layer(h, context=RelativeContext(pos=pos, mask=mask, u=core.u, v=core.v))


def test_window_trains_inside_and_returns_a_detached_state():
    core = _core(mem_len=8).train()
    state0 = core.initial_state(3)
    obs = torch.randn(3, 7, OBS)
    features, state = core.window(obs, state0, _starts(3, 7, {0: [0], 1: [2]}))
    assert features.shape == (3, 7, 16) and not state.memory.requires_grad
    features.pow(2).sum().backward()
    assert all(p.grad is not None for p in core.input.parameters())


def test_memory_slides_in_long_episodes():
    """Over an episode many times the memory's length the state keeps its size and the reach its cap."""
    core = _core(mem_len=4)
    state = core.initial_state(2)
    with torch.no_grad():
        for t in range(50):
            _, state = core.step(torch.randn(2, OBS), state, torch.tensor([t == 0, t == 0]))
    assert state.memory.shape == (2, 2, 4, 16) and state.reach.tolist() == [4, 4]


@pytest.mark.parametrize(
    "field,value",
    [
        ("n_layer", 0),
        ("n_head", -1),
        ("d_model", 15),
        ("mem_len", -1),
        ("gating", "lstm"),
        ("dropout", 1.0),
        ("d_inner", 2.5),
    ],
)
def test_config_names_the_bad_field(field, value):
    with pytest.raises(ConfigError, match=f"^{field}: "):
        CoreConfig(**{field: value})


def test_bad_inputs_get_one_line_errors():
    core = _core(mem_len=4)
    state = core.initial_state(2)
    cases = [
        (lambda: core.step(torch.randn(2, OBS + 1), state, torch.zeros(2, dtype=torch.bool)), "obs must be"),
        (lambda: core.step(torch.randn(2, OBS), state, torch.zeros(2)), "episode starts must be a bool"),
        (
            lambda: core.step(torch.randn(3, OBS), state, torch.zeros(3, dtype=torch.bool)),
            "state memory must be",
        ),
        (lambda: core.window(torch.randn(2, OBS), state, torch.zeros(2, dtype=torch.bool)), "obs must be"),
        (lambda: core.initial_state(0), "n_envs must be"),
        (lambda: MemoryCore(0), "obs_dim must be"),
    ]
    for call, message in cases:
        with pytest.raises(ValueError, match=message) as info:
            call()
        assert "\n" not in str(info.value)
