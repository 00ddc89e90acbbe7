"""txl.rl's memory core: the window path against T steps across episode resets, resets that forget, the state
through a rollout buffer, the memory after a weight update, gates that start near the identity, settings,
slots no query may attend that hold NaN or inf, and the inputs it accepts or refuses."""

from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load, save

from txl.config import ConfigError
from txl.rl import CoreConfig, CoreState, MemoryCore
from txl.rl.compiled import CompiledRun
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
    gated, plain = GatedLayer(config.stack).eval(), MemoryCore(OBS, replace(config, gating="none")).layers[0]
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
        ("compiled", "yes"),
    ],
)
def test_config_names_the_bad_field(field, value):
    with pytest.raises(ConfigError, match=f"^{field}: "):
        CoreConfig(**{field: value})


def test_bad_inputs_get_one_line_errors():
    """Each bad input gets one line naming the argument and the shape expected on its path (a step's shapes
    for ``step``, a window's for ``window``)."""
    core = _core(mem_len=4)
    state = core.initial_state(2)
    no_start = torch.zeros(2, dtype=torch.bool)
    wide = CoreState(state.memory, torch.tensor([0, 5]))
    cases = [
        (
            lambda: core.step(torch.randn(2, OBS + 1), state, no_start),
            ValueError,
            r"obs must be \(E, 5\), got",
        ),
        (
            lambda: core.step(torch.randn(2, 1, OBS), state, no_start),
            ValueError,
            r"obs must be \(E, 5\), got",
        ),
        (
            lambda: core.step(torch.randn(2, OBS), state, torch.zeros(2)),
            ValueError,
            r"episode_start must be a bool tensor of shape \(2,\)",
        ),
        (
            lambda: core.step(torch.randn(2, OBS), state, torch.zeros(2, 1, dtype=torch.bool)),
            ValueError,
            r"episode_start must be a bool tensor of shape \(2,\)",
        ),
        (
            lambda: core.step(torch.randn(3, OBS), state, torch.zeros(3, dtype=torch.bool)),
            ValueError,
            "state memory",
        ),
        (
            lambda: core.step(torch.randn(2, OBS), state.memory, no_start),
            ValueError,
            "state must be a CoreState",
        ),
        (
            lambda: core.step(torch.randn(2, OBS), state.to(torch.float64), no_start),
            ValueError,
            "state must be torch.float32 on cpu",
        ),
        (
            lambda: core.step("abc", state, no_start),
            TypeError,
            r"obs must be a tensor, array or nested list of",
        ),
        (
            lambda: core.step(torch.randn(2, OBS), state, object()),
            TypeError,
            "episode_start must be a tensor",
        ),
        (
            lambda: core.window(torch.randn(2, OBS), state, no_start),
            ValueError,
            r"obs must be \(E, T, 5\), got \(2, 5\)",
        ),
        (
            lambda: core.window(torch.randn(2, 3, OBS), state, no_start),
            ValueError,
            r"starts must be a bool tensor of shape \(2, 3\)",
        ),
        (lambda: core.window(torch.randn(2, 3, OBS), state, {"a": 1}), TypeError, "starts must be a tensor"),
        (
            lambda: core.step(torch.randn(2, OBS), CoreState(state.memory, torch.tensor([0, -1])), no_start),
            ValueError,
            r"state reach must be between 0 and mem_len = 4, got -1 at environment 1",
        ),
        (
            lambda: core.window(torch.randn(2, 3, OBS), wide, torch.zeros(2, 3, dtype=torch.bool)),
            ValueError,
            r"state reach must be between 0 and mem_len = 4, got 5 at environment 1",
        ),
        (lambda: core.initial_state(0), ValueError, "n_envs must be"),
        (lambda: MemoryCore(0), ValueError, "obs_dim must be"),
    ]
    for call, error, message in cases:
        with pytest.raises(error, match=message) as info:
            call()
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_a_non_finite_observation_is_refused_by_name(value):
    """A NaN or infinite observation is refused with a message naming ``obs`` and where it is: the environment
    (and the step of a window); finite observations of any size pass."""
    core = _core(mem_len=4)
    state = core.initial_state(3)
    obs = torch.randn(3, 6, OBS)
    obs[2, 4, 1] = value
    with pytest.raises(
        ValueError, match=rf"^obs must be finite, got {value} at environment 2, step 4 of the"
    ):
        core.window(obs, state, torch.zeros(3, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match=rf"^obs must be finite, got {value} at environment 2 \("):
        core.step(obs[:, 4], state, torch.zeros(3, dtype=torch.bool))
    obs[2, 4, 1] = 1e30
    with torch.no_grad():
        core.window(obs, state, torch.zeros(3, 6, dtype=torch.bool))


@pytest.mark.parametrize("gating", ["gru", "none"])
@pytest.mark.parametrize("junk", [float("nan"), float("inf"), -float("inf"), 3e38])
def test_slots_outside_the_reach_contribute_nothing_whatever_they_hold(gating, junk):
    """A state's slots outside each environment's reach (a previous episode, or never written) are never
    attended: filling them with NaN, inf or huge values leaves every feature and the next state's reach exactly
    as with zeros there, on the step and the window path."""
    core = _core(gating=gating, mem_len=6)
    e, t = 3, 8
    gen = torch.Generator().manual_seed(5)
    memory = torch.randn(e, 2, 6, 16, generator=gen)
    reach = torch.tensor([2, 0, 6])
    outside = torch.arange(6)[None, :] < (6 - reach)[:, None]  # (E, M): slots before each row's reach
    clean = CoreState(torch.where(outside[:, None, :, None], 0.0, memory), reach)
    dirty = CoreState(torch.where(outside[:, None, :, None], junk, memory), reach)
    obs = torch.randn(e, t, OBS, generator=gen)
    starts = _starts(e, t, {0: [5], 2: [3]})
    with torch.no_grad():
        for run in (core.window, lambda o, s, st: _steps(core, o, s, st)[::2]):
            expected, _ = run(obs, clean, starts)
            got, after = run(obs, dirty, starts)
            assert torch.isfinite(got).all()
            assert torch.equal(got, expected), (got - expected).abs().max()
    assert after.reach.tolist() == [3, 6, 5]


@pytest.mark.parametrize("junk", [float("nan"), float("inf")])
def test_window_equals_steps_when_an_earlier_episode_is_not_finite(junk):
    """A non-finite value the current episode remembers (a state written by other code) makes the features of
    the queries that attend it, directly or through the layers, NaN; it never reaches the next episode, in the
    same window or later: the window equals the steps (NaN where they are NaN), and after the start both equal
    a run whose state held no such value."""
    core = _core(torch.float64, mem_len=4)
    e, t, start = 2, 20, 9
    gen = torch.Generator().manual_seed(6)
    warm = torch.randn(e, 5, OBS, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        _, clean = core.window(warm, core.initial_state(e), _starts(e, 5, {0: [0], 1: [0]}))
    memory = clean.memory.clone()
    memory[0, 0, -2, 3] = junk  # row 0's layer-0 input two steps ago: inside its reach
    dirty = CoreState(memory, clean.reach)
    obs = torch.randn(e, t, OBS, generator=gen, dtype=torch.float64)
    starts = _starts(e, t, {0: [start]})
    with torch.no_grad():
        window, after = core.window(obs[:, :12], dirty, starts[:, :12])  # the start inside the window
        rest, _ = core.window(obs[:, 12:], after, starts[:, 12:])
        window = torch.cat([window, rest], dim=1)
        stepped, _, _ = _steps(core, obs, dirty, starts)
        reference, _ = core.window(obs, clean, starts)
    torch.testing.assert_close(window, stepped, rtol=0, atol=1e-12, equal_nan=True)
    poisoned = torch.isnan(window).any(dim=-1)  # (E, T)
    # the slot is step -2: layer 0 attends it at steps 0-2 (M = 4 back), layer 1 attends those up to step 6
    assert poisoned[0].tolist() == [True] * 7 + [False] * (t - 7)
    assert not poisoned[1].any()
    torch.testing.assert_close(window[0, start:], reference[0, start:], rtol=0, atol=1e-12)
    torch.testing.assert_close(window[1], reference[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("as_input", [np.asarray, lambda x: x.tolist()])
def test_arrays_and_lists_are_accepted(as_input):
    """Observations and starts as numpy arrays or lists (e.g. what a gymnasium vector env returns; float64
    observations for a float32 core) give the tensors' features."""
    core = _core(mem_len=4)
    gen = torch.Generator().manual_seed(7)
    obs = torch.randn(2, 5, OBS, generator=gen, dtype=torch.float64)
    starts = _starts(2, 5, {0: [0, 3], 1: [0]})
    state = core.initial_state(2)
    with torch.no_grad():
        expected, _ = core.window(obs.float(), state, starts)
        got, _ = core.window(as_input(obs.numpy()), state, as_input(starts.numpy()))
        step, _ = core.step(as_input(obs[:, 0].numpy()), state, as_input(starts[:, 0].numpy()))
    assert torch.equal(got, expected) and got.dtype == torch.float32
    assert torch.allclose(step, expected[:, 0], atol=1e-6, rtol=0)


def test_a_window_of_no_steps_changes_nothing():
    """T = 0: no features, and the state it was given."""
    core = _core(mem_len=4)
    with torch.no_grad():
        _, state = core.window(torch.randn(2, 3, OBS), core.initial_state(2), _starts(2, 3, {0: [0]}))
        features, after = core.window(torch.zeros(2, 0, OBS), state, torch.zeros(2, 0, dtype=torch.bool))
    assert features.shape == (2, 0, 16) and features.dtype == torch.float32
    assert after is state


def test_the_compiled_step_equals_the_window_and_the_eager_step():
    """``CoreConfig(compiled=True)``: 30 steps with episode starts, from a stored state, give the window's
    features and state (the independent path) and the eager step's to 1e-6; training windows stay eager."""
    eager, fast = _core(), _core(compiled=True)
    assert isinstance(fast._compiled, CompiledRun)
    fast.load_state_dict(eager.state_dict())
    e, t = 4, 30
    gen = torch.Generator().manual_seed(2)
    warm = torch.randn(e, 9, OBS, generator=gen)
    _, _, state0 = _steps(eager, warm, eager.initial_state(e), _starts(e, 9, {0: [0], 1: [4], 3: [0, 7]}))
    obs = torch.randn(e, t, OBS, generator=gen)
    starts = _starts(e, t, {0: [3, 9, 15, 20], 1: [0, 1, 2], 2: [11]})
    with torch.no_grad():
        window, after = eager.window(obs, state0, starts)
        stepped, _, last = _steps(fast, obs, state0, starts)
        plain, _, plain_last = _steps(eager, obs, state0, starts)
    assert fast._compiled.ran and fast._compiled.compiled is not None  # it did run compiled
    torch.testing.assert_close(stepped, window, atol=1e-5, rtol=0)
    torch.testing.assert_close(stepped, plain, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(last.memory, plain_last.memory, atol=1e-6, rtol=1e-6)
    assert torch.equal(last.reach, after.reach)


def test_without_a_compiler_the_core_steps_eagerly_with_one_warning(monkeypatch):
    import txl.rl.compiled as rl_compiled

    def no_compiler(fn, **kwargs):
        def fails(*args):
            raise RuntimeError("no C++ compiler found")

        return fails

    monkeypatch.setattr(rl_compiled.torch, "compile", no_compiler)
    monkeypatch.setattr(rl_compiled, "_WARNED", set())
    eager, fast = _core(), _core(compiled=True)
    state, start = eager.initial_state(2), torch.ones(2, dtype=torch.bool)
    obs = torch.randn(2, OBS)
    with pytest.warns(RuntimeWarning, match="compiled core step is not available.*no C\\+\\+ compiler"):
        got, _ = fast.step(obs, state, start)
    assert fast._compiled.compiled is None
    torch.testing.assert_close(got, eager.step(obs, state, start)[0], atol=0, rtol=0)
