"""The tasks of txl.rl.envs (the ``rl`` extra): each named task against the library it wraps (POPGym's
observations one-hot, gymnasium's without the velocities), MemoryLength against its written rules, the other
two forms of a task and their errors, and the environments' state: saved as JSON, restored into fresh
environments, they step exactly as the saved ones."""

from __future__ import annotations

import json
import sys
import types
import typing

import numpy as np
import pytest

gym = pytest.importorskip(
    "gymnasium", reason="txl.rl's tasks need gymnasium: pip install 'transformer-xl[rl]'"
)
pytest.importorskip("popgym", reason="the POPGym tasks need popgym: pip install 'transformer-xl[rl]'")

from txl.rl.envs import (  # noqa: E402
    MemoryLength,
    Task,
    env_state,
    is_named_task,
    make_env,
    make_vector_env,
    set_env_state,
)

NAMED = [*typing.get_args(Task), "MemoryLength-1", "MemoryLength-5"]

# Named task -> (observation size, action space kind, episode length when it is fixed)
SHAPES = {
    "RepeatPreviousEasy": (4, "discrete", 51),
    "RepeatPreviousMedium": (4, "discrete", 103),
    "RepeatPreviousHard": (4, "discrete", 155),
    "RepeatFirstEasy": (4, "discrete", 51),
    "RepeatFirstMedium": (4, "discrete", 415),
    "AutoencodeEasy": (6, "discrete", 103),
    "AutoencodeMedium": (6, "discrete", 207),
    "CartPoleNoVelocity": (2, "discrete", None),
    "PendulumNoVelocity": (2, "box", 200),
    "MountainCarContinuousNoVelocity": (1, "box", None),
    "MemoryLength-1": (4, "discrete", 1),
    "MemoryLength-5": (4, "discrete", 5),
}


def random_actions(space, rng, n):
    """``n`` actions of a vector action space drawn from ``rng`` (not from the space's own generator)."""
    if isinstance(space, gym.spaces.MultiDiscrete):
        return [rng.integers(space.nvec) for _ in range(n)]
    return [rng.uniform(space.low, space.high).astype(np.float32) for _ in range(n)]


def run(envs, actions):
    """Step ``envs`` through ``actions``; every observation, reward, termination and truncation."""
    out = []
    for action in actions:
        obs, reward, terminated, truncated, _ = envs.step(action)
        out.append((obs.copy(), reward.copy(), terminated.copy(), truncated.copy()))
    return out


@pytest.mark.parametrize("task", NAMED)
def test_every_named_task_is_flat_float32_with_its_documented_episodes(task):
    size, kind, length = SHAPES[task]
    assert is_named_task(task)
    envs = make_vector_env(task, 2)
    assert envs.single_observation_space.shape == (size,)
    assert envs.single_observation_space.dtype == np.float32
    space = envs.single_action_space
    assert isinstance(space, gym.spaces.Discrete if kind == "discrete" else gym.spaces.Box)
    obs, _ = envs.reset(seed=3)
    rng = np.random.default_rng(0)
    steps, returns, total = 0, [], np.zeros(2)
    for action in random_actions(envs.action_space, rng, 2 * (length or 1000) + 2):
        assert obs.dtype == np.float32 and obs.shape == (2, size)
        assert np.all(obs >= envs.single_observation_space.low) and np.all(
            obs <= envs.single_observation_space.high
        )
        obs, reward, terminated, truncated, _ = envs.step(action)
        steps, total = steps + 1, total + reward
        done = terminated | truncated
        if done[0] and length is not None:
            assert steps == length, (task, steps)  # the first episode of environment 0
        returns += list(total[done])
        total[done] = 0.0
        if done[0]:
            steps = 0
    assert returns
    if task.startswith(("Repeat", "Autoencode", "MemoryLength")):
        assert all(-1.0 - 1e-9 <= r <= 1.0 + 1e-9 for r in returns)
    envs.close()


@pytest.mark.parametrize("task", [t for t in typing.get_args(Task) if t.startswith(("Repeat", "Autoencode"))])
def test_popgym_tasks_observe_the_one_hot_of_popgyms_observation(task):
    """The same game from popgym directly, with the same seed and actions: the observation is the one-hot of
    the suit (Autoencode: of the phase flag, then of the suit); the rewards and ends are popgym's."""
    import popgym.envs as envs_module

    raw = getattr(envs_module, task)()
    env = make_env(task)
    raw_obs, _ = raw.reset(seed=7)
    obs, _ = env.reset(seed=7)
    rng = np.random.default_rng(1)
    for _ in range(250):
        if task.startswith("Autoencode"):
            expected = np.concatenate([np.eye(2)[raw_obs[0]], np.eye(4)[raw_obs[1]]])
        else:
            expected = np.eye(4)[raw_obs]
        assert np.array_equal(obs, expected.astype(np.float32))
        action = int(rng.integers(4))
        raw_obs, raw_reward, raw_terminated, _, _ = raw.step(action)
        obs, reward, terminated, _, _ = env.step(action)
        assert reward == raw_reward and terminated == raw_terminated
        if terminated:
            raw_obs, _ = raw.reset(seed=8)
            obs, _ = env.reset(seed=8)


@pytest.mark.parametrize(
    "task,name,keep",
    [
        ("CartPoleNoVelocity", "CartPole-v1", [0, 2]),
        ("PendulumNoVelocity", "Pendulum-v1", [0, 1]),
        ("MountainCarContinuousNoVelocity", "MountainCarContinuous-v0", [0]),
    ],
)
def test_no_velocity_tasks_hide_the_velocities(task, name, keep):
    """gymnasium's task with the same seed and actions: the observation keeps its positions only."""
    raw, env = gym.make(name), make_env(task)
    raw_obs, _ = raw.reset(seed=5)
    obs, _ = env.reset(seed=5)
    rng = np.random.default_rng(2)
    for _ in range(30):
        assert np.array_equal(obs, raw_obs[keep])
        action = (
            int(rng.integers(2))
            if name.startswith("CartPole")
            else rng.uniform(-1, 1, (1,)).astype(np.float32)
        )
        raw_obs, raw_reward, raw_terminated, raw_truncated, _ = raw.step(action)
        obs, reward, terminated, truncated, _ = env.step(action)
        assert (reward, terminated, truncated) == (raw_reward, raw_terminated, raw_truncated)
        if terminated or truncated:
            raw_obs, _ = raw.reset(seed=6)
            obs, _ = env.reset(seed=6)


@pytest.mark.parametrize("length", [1, 2, 7])
def test_memory_length_follows_its_rules(length):
    """Written out from the rules: the cue's one-hot at t = 0 only, time left 1 - t / L, the query flag at
    t = L - 1 only; rewards 0 before the query, +1 for the cue at the query, -1 for the other; the episode
    ends there. Over many seeds both cues come, and a constant answer averages near chance (0)."""
    env = MemoryLength(length)
    cues, constant = [], []
    for seed in range(200):
        for answer_cue in (True, False):
            obs, _ = env.reset(seed=seed)
            cue = int(np.argmax(obs[:2]))
            assert obs[:2].sum() == 1.0
            for t in range(length):
                if t > 0:
                    assert obs[0] == obs[1] == 0.0
                assert obs[2] == np.float32(1 - t / length) and obs[3] == (1.0 if t == length - 1 else 0.0)
                action = (cue if answer_cue else 1 - cue) if t == length - 1 else seed % 2
                obs, reward, terminated, truncated, _ = env.step(action)
                assert not truncated and terminated == (t == length - 1)
                if t < length - 1:
                    assert reward == 0.0
            assert reward == (1.0 if answer_cue else -1.0)
        cues.append(cue)
        obs, _ = env.reset(seed=seed)
        for _ in range(length):
            obs, reward, *_ = env.step(0)
        constant.append(reward)
    assert 70 < sum(cues) < 130
    assert abs(np.mean(constant)) < 0.2
    with pytest.raises(RuntimeError, match="call reset"):
        env.step(0)


def test_memory_length_is_seeded_through_reset():
    env = MemoryLength(3)
    first = [env.reset(seed=s)[0][:2].tolist() for s in range(20)]
    again = [env.reset(seed=s)[0][:2].tolist() for s in range(20)]
    assert first == again


def test_a_gymnasium_id_and_a_module_factory_are_tasks(monkeypatch):
    """A registered id (made by gymnasium) and ``module:factory``, flattened as the named tasks are: the
    factory of POPGym's AutoencodeEasy (Tuple observations) gives the named task's 6 numbers."""
    env = make_env("CartPole-v1")
    assert env.observation_space.shape == (4,) and env.reset(seed=0)[0].dtype == np.float32
    assert not is_named_task("CartPole-v1")
    factory = make_env("popgym.envs.autoencode:AutoencodeEasy")
    named = make_env("AutoencodeEasy")
    assert factory.observation_space == named.observation_space
    assert np.array_equal(factory.reset(seed=4)[0], named.reset(seed=4)[0])
    for _ in range(60):
        assert np.array_equal(factory.step(1)[0], named.step(1)[0])

    module = types.ModuleType("txl_test_tasks")
    module.image = lambda: _Custom(gym.spaces.Box(0, 255, (2, 3), dtype=np.uint8), gym.spaces.Discrete(3))
    module.grid = lambda: _Custom(
        gym.spaces.Box(0, 1, (2,), dtype=np.float32), gym.spaces.MultiDiscrete([2, 2])
    )
    module.shifted = lambda: _Custom(
        gym.spaces.Box(0, 1, (2,), dtype=np.float32), gym.spaces.Discrete(3, start=1)
    )
    module.not_env = lambda: "an env"
    module.sequence = lambda: _Custom(gym.spaces.Sequence(gym.spaces.Discrete(2)), gym.spaces.Discrete(2))
    monkeypatch.setitem(sys.modules, "txl_test_tasks", module)
    image = make_env("txl_test_tasks:image")
    assert image.observation_space.shape == (6,) and image.observation_space.dtype == np.float32
    assert image.reset(seed=0)[0].dtype == np.float32 and image.reset(seed=0)[0].shape == (6,)
    for name in ("grid", "shifted"):
        with pytest.raises(ValueError, match="supports Discrete actions"):
            make_env(f"txl_test_tasks:{name}")
    with pytest.raises(ValueError, match="cannot be made a flat vector"):
        make_env("txl_test_tasks:sequence")
    with pytest.raises(ValueError, match="returned str, not a gymnasium.Env"):
        make_env("txl_test_tasks:not_env")
    with pytest.raises(ValueError, match="has no function 'missing'"):
        make_env("txl_test_tasks:missing")
    with pytest.raises(ValueError, match="cannot import module 'txl_no_such_module'"):
        make_env("txl_no_such_module:make")


class _Custom(gym.Env):
    """An environment with the given spaces, which observes a sample of its observation space."""

    def __init__(self, observation_space, action_space):
        self.observation_space, self.action_space = observation_space, action_space

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return self.observation_space.sample(), {}

    def step(self, action):
        return self.observation_space.sample(), 0.0, False, False, {}


@pytest.mark.parametrize(
    "task", ["NoSuchTask", "repeatpreviouseasy", "MemoryLength-0", "MemoryLength-x", "CartPole"]
)
def test_an_unknown_task_is_a_one_line_error_naming_the_forms(task):
    assert not is_named_task(task)
    with pytest.raises(ValueError) as error:
        make_env(task)
    message = str(error.value)
    assert "\n" not in message and repr(task) in message
    if task.startswith("MemoryLength"):
        assert "integer L >= 1" in message
    else:
        assert all(name in message for name in typing.get_args(Task))
        assert "MemoryLength-L" in message and "gymnasium id" in message and "module:factory" in message
    with pytest.raises(ValueError, match="n_envs must be a positive integer"):
        make_vector_env("RepeatFirstEasy", 0)


# Steps before the state is saved and after, per task: enough to cross an episode's end after the save.
STEPS = {
    "RepeatPreviousEasy": (40, 60),
    "RepeatPreviousMedium": (90, 60),
    "RepeatPreviousHard": (150, 60),
    "RepeatFirstEasy": (40, 60),
    "RepeatFirstMedium": (400, 60),
    "AutoencodeEasy": (95, 60),
    "AutoencodeMedium": (200, 60),
    "CartPoleNoVelocity": (30, 80),
    "PendulumNoVelocity": (190, 60),
    "MountainCarContinuousNoVelocity": (990, 60),
    "MemoryLength-1": (3, 10),
    "MemoryLength-5": (7, 20),
}


@pytest.mark.parametrize("task", NAMED)
def test_a_saved_state_steps_on_exactly_in_fresh_environments(task):
    """K steps of random actions, the state saved and sent through JSON, N more steps; a fresh vector
    environment reset with another seed, given the state, takes the same N actions: the same observations
    (from the saved ones on), rewards, terminations and truncations. Without the state it does not."""
    before, after = STEPS[task]
    rng = np.random.default_rng(11)
    envs = make_vector_env(task, 3)
    envs.reset(seed=1)
    actions = random_actions(envs.action_space, rng, before + after)
    run(envs, actions[:before])
    state = json.loads(json.dumps(env_state(envs), allow_nan=False))
    expected = run(envs, actions[before:])
    assert any(t.any() or u.any() for _, _, t, u in expected)  # an episode ends after the save

    fresh = make_vector_env(task, 3)
    fresh.reset(seed=99)
    set_env_state(fresh, state)
    assert np.array_equal(
        np.array(state["observations"]["data"], np.float32).reshape(3, -1), fresh._observations
    )
    got = run(fresh, actions[before:])
    for (obs, reward, terminated, truncated), (obs2, reward2, terminated2, truncated2) in zip(
        expected, got, strict=True
    ):
        assert np.array_equal(obs, obs2) and np.array_equal(reward, reward2)
        assert np.array_equal(terminated, terminated2) and np.array_equal(truncated, truncated2)

    unrestored = make_vector_env(task, 3)
    unrestored.reset(seed=99)
    other = run(unrestored, actions[before:])
    assert not all(
        np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
        for a, b in zip(expected, other, strict=True)
    )


def test_a_state_restores_into_environments_never_reset():
    envs = make_vector_env("RepeatPreviousEasy", 2)
    envs.reset(seed=0)
    actions = random_actions(envs.action_space, np.random.default_rng(0), 70)
    run(envs, actions[:20])
    state = env_state(envs)
    expected = run(envs, actions[20:])
    fresh = make_vector_env("RepeatPreviousEasy", 2)
    set_env_state(fresh, json.loads(json.dumps(state)))
    got = run(fresh, actions[20:])
    assert all(
        np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(expected, got, strict=True)
    )


def test_a_state_keeps_next_step_autoreset_bookkeeping():
    """Under NEXT_STEP autoreset (a vector environment of the user's), a state saved right after an episode
    ends restores the pending reset: the fresh environments reset at the next step as the saved ones do."""

    def make():
        return gym.vector.SyncVectorEnv(
            [lambda: make_env("MemoryLength-3")] * 2, autoreset_mode=gym.vector.AutoresetMode.NEXT_STEP
        )

    envs = make()
    envs.reset(seed=0)
    actions = random_actions(envs.action_space, np.random.default_rng(0), 12)
    run(envs, actions[:3])  # both episodes end at the third step
    state = json.loads(json.dumps(env_state(envs)))
    assert state["autoreset"] == [True, True]
    expected = run(envs, actions[3:])
    fresh = make()
    fresh.reset(seed=5)
    set_env_state(fresh, state)
    got = run(fresh, actions[3:])
    assert all(
        np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1]) for a, b in zip(expected, got, strict=True)
    )


def test_only_named_tasks_have_a_state_and_a_state_fits_its_own_tasks():
    assert env_state(make_vector_env("CartPole-v1", 2)) is None
    assert env_state(make_vector_env("popgym.envs.repeat_first:RepeatFirstEasy", 2)) is None
    assert env_state(make_vector_env(lambda: make_env("CartPoleNoVelocity"), 2)) is not None
    wrapped = make_vector_env(lambda: gym.wrappers.RecordEpisodeStatistics(make_env("CartPoleNoVelocity")), 2)
    assert env_state(wrapped) is None
    envs = make_vector_env("RepeatFirstEasy", 2)
    envs.reset(seed=0)
    state = env_state(envs)
    with pytest.raises(ValueError, match="state is of 2 environments of RepeatFirstEasy; envs has 3"):
        set_env_state(make_vector_env("RepeatFirstEasy", 3), state)
    with pytest.raises(ValueError, match="envs has 2 of RepeatPreviousEasy"):
        set_env_state(make_vector_env("RepeatPreviousEasy", 2), state)
    with pytest.raises(ValueError, match="not an environment state"):
        set_env_state(envs, {"format": 0})
