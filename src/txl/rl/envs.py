"""The tasks agents are trained on, as gymnasium environments with a flat float32 observation (the ``rl``
extra): txl's named tasks (POPGym's card games, classic control with the velocities hidden, and
``MemoryLength-L``), any registered gymnasium id, or a ``module:factory`` of the user's; the vector
environment that steps them; and the state of a vector environment of named tasks as plain JSON values, so
that a run resumes exactly. What an agent does with the observations is left to the cores and PPO."""

from __future__ import annotations

import importlib
import re
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np

try:
    import gymnasium as gym
except ImportError as error:  # pragma: no cover - depends on the install
    raise ImportError("txl.rl.envs needs gymnasium: pip install 'transformer-xl[rl]'") from error

__all__ = [
    "Task",
    "MemoryLength",
    "is_named_task",
    "make_env",
    "make_vector_env",
    "env_state",
    "set_env_state",
]

Task = Literal[
    "RepeatPreviousEasy",
    "RepeatPreviousMedium",
    "RepeatPreviousHard",
    "RepeatFirstEasy",
    "RepeatFirstMedium",
    "AutoencodeEasy",
    "AutoencodeMedium",
    "CartPoleNoVelocity",
    "PendulumNoVelocity",
    "MountainCarContinuousNoVelocity",
]
"""The fixed names of txl's tasks (``MemoryLength-L``, for any integer L >= 1, is named too):

- ``RepeatPrevious{Easy,Medium,Hard}`` (POPGym): cards are dealt one a step (observed: the suit, one-hot of
  4); the action is the suit of the card dealt k steps before (k = 4, 32, 64; 1, 2, 3 decks; 51, 103, 155
  steps). Reward ±1/n on each of the n steps that have a card k back (n = 48, 72, 92): return in [-1, 1],
  chance -0.5.
- ``RepeatFirst{Easy,Medium}`` (POPGym): say the suit of the first card at every step (1 or 8 decks; 51 or
  415 steps; reward ±1/51 or ±1/415 a step): return in [-1, 1], chance -0.5.
- ``Autoencode{Easy,Medium}`` (POPGym): watch a deck (1 or 2) dealt card by card, then play its suits back in
  reverse order (51 + 52 = 103 or 103 + 104 = 207 steps). Observed: the one-hot of the phase (play, watch:
  play from the last card dealt on) then of the suit (4), 6 numbers; reward ±1/52 (±1/104) on each step of
  play: return in [-1, 1], chance -0.5.
- ``CartPoleNoVelocity``, ``PendulumNoVelocity``, ``MountainCarContinuousNoVelocity``: gymnasium's tasks
  without their velocities, as rl-baselines3-zoo's NoVel tasks. CartPole-v1 observing the cart position and
  the pole angle (2 actions; return up to 500, about 20 for random actions); Pendulum-v1 observing the cos and
  sin of the angle (torque in [-2, 2]; 200 steps; return in about [-3250, 0], about -1200 for random
  torques); MountainCarContinuous-v0 observing the position (force in [-1, 1]; up to 999 steps; +100 at the
  goal less 0.1 x the squared force per step: about -33 for random forces, 90 or more once solved).
"""

_MEMORY_LENGTH = re.compile(r"MemoryLength-([1-9][0-9]*)")

# Named task -> (gymnasium id, the observation's components kept): the velocities are left out.
_NO_VELOCITY: dict[str, tuple[str, tuple[int, ...]]] = {
    "CartPoleNoVelocity": ("CartPole-v1", (0, 2)),  # cart position, pole angle
    "PendulumNoVelocity": ("Pendulum-v1", (0, 1)),  # cos and sin of the angle
    "MountainCarContinuousNoVelocity": ("MountainCarContinuous-v0", (0,)),  # position
}
# Named task -> popgym's module of it (the class has the task's name).
_POPGYM = {
    "RepeatPreviousEasy": "repeat_previous",
    "RepeatPreviousMedium": "repeat_previous",
    "RepeatPreviousHard": "repeat_previous",
    "RepeatFirstEasy": "repeat_first",
    "RepeatFirstMedium": "repeat_first",
    "AutoencodeEasy": "autoencode",
    "AutoencodeMedium": "autoencode",
}


class MemoryLength(gym.Env[np.ndarray, np.int64]):
    """bsuite's memory-length task: remember a cue (one of 2) shown at the first step and name it when asked,
    ``length - 1`` steps later.

    An episode is ``length`` steps, t = 0 .. length - 1 (the observation at t is the one the agent acts on at
    t). The observation is 4 numbers: ``[cue is 0, cue is 1, time left, is query]``. The cue's one-hot is
    shown at t = 0 only (zeros after); time left is ``1 - t / length`` (1 at the cue, ``1 / length`` at the
    query); is query is 1 at t = length - 1 only. Actions are 0 or 1; every action before the query is
    ignored and rewarded 0; the action at the query is rewarded +1 if it is the cue, -1 if not, and the
    episode terminates. The return is +1 or -1 (chance 0). ``length = 1`` shows the cue and asks at once (no
    memory needed); in general an agent must carry the cue across ``length - 1`` steps. The cue is drawn from
    the environment's generator, seeded through ``reset(seed=...)``.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, length: int) -> None:
        if isinstance(length, bool) or not isinstance(length, int) or length < 1:
            raise ValueError(f"length must be an integer >= 1, got {length!r}")
        self.length = length
        self.observation_space = gym.spaces.Box(0.0, 1.0, (4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._cue = 0
        self._t = 0

    def _observation(self) -> np.ndarray:
        obs = np.zeros(4, dtype=np.float32)
        if self._t == 0:
            obs[self._cue] = 1.0
        obs[2] = 1.0 - self._t / self.length
        obs[3] = float(self._t == self.length - 1)
        return obs

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict]:
        """Draw a cue; the first observation shows it."""
        super().reset(seed=seed)
        self._cue, self._t = int(self.np_random.integers(2)), 0
        return self._observation(), {}

    def step(self, action: int | np.integer) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Act at step t: rewarded (±1) and terminated at the query, 0 before."""
        if self._t >= self.length:
            raise RuntimeError("MemoryLength.step after the episode ended: call reset")
        query = self._t == self.length - 1
        reward = (1.0 if int(action) == self._cue else -1.0) if query else 0.0
        self._t += 1
        return self._observation(), reward, query, False, {}


def _memory_length(task: str) -> int | None:
    """L of ``MemoryLength-L`` (None for another name)."""
    match = _MEMORY_LENGTH.fullmatch(task)
    return int(match.group(1)) if match else None


def is_named_task(task: object) -> bool:
    """Whether ``task`` is one of txl's named tasks: a name of :data:`Task`, or ``MemoryLength-L`` with an
    integer L >= 1 (whose state :func:`env_state` saves)."""
    return isinstance(task, str) and (task in typing.get_args(Task) or _memory_length(task) is not None)


def make_env(task: str) -> gym.Env:
    """One environment of ``task``, with a flat float32 Box observation and Discrete (from 0) or
    one-dimensional Box actions.

    ``task`` is a named task of txl (:data:`Task`, or ``MemoryLength-L``: :class:`MemoryLength`), a
    registered gymnasium id (made with ``gymnasium.make``; e.g. ``CartPole-v1``), or ``module:factory`` (the
    module is imported and ``factory()`` must return a ``gymnasium.Env``). Observations that are not a flat
    float32 Box are flattened (``gymnasium.spaces.flatten``: a Discrete becomes a one-hot, a Tuple its parts
    side by side) and cast to float32."""
    if not isinstance(task, str):
        raise ValueError(f"task must be a string, got {type(task).__name__}")
    if is_named_task(task):
        env = _flat(_named(task), task, named=True)
    elif ":" in task:
        env = _flat(_from_factory(task), task, named=False)
    elif task in gym.registry:
        env = _flat(gym.make(task), task, named=False)
    else:
        raise ValueError(_unknown(task))
    _check_actions(env.action_space, task)
    return env


def _unknown(task: str) -> str:
    if task.startswith("MemoryLength-"):
        return f"task {task!r}: MemoryLength-L needs an integer L >= 1 (e.g. MemoryLength-48)"
    names = ", ".join(typing.get_args(Task))
    return (
        f"unknown task {task!r}: give a task of txl ({names}, or MemoryLength-L for an integer L >= 1), "
        "a registered gymnasium id (e.g. CartPole-v1), or module:factory (a function that returns a "
        "gymnasium.Env)"
    )


def _named(task: str) -> gym.Env:
    """The environment of a named task, before its observation is made flat."""
    length = _memory_length(task)
    if length is not None:
        return MemoryLength(length)
    if task in _NO_VELOCITY:
        name, _ = _NO_VELOCITY[task]
        return gym.make(name, disable_env_checker=True)
    try:
        module = importlib.import_module(f"popgym.envs.{_POPGYM[task]}")
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError(f"{task} needs popgym: pip install 'transformer-xl[rl]'") from error
    env = getattr(module, task)()
    # a guard above the episode's fixed length, never reached
    return gym.wrappers.TimeLimit(env, max_episode_steps=env.max_episode_length + 1)


def _from_factory(task: str) -> gym.Env:
    """``factory()`` of ``module:factory``."""
    module_name, _, attribute = task.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ValueError(f"task {task!r}: cannot import module {module_name!r} ({error})") from error
    factory = getattr(module, attribute, None)
    if not callable(factory):
        raise ValueError(f"task {task!r}: module {module_name!r} has no function {attribute!r}")
    env = factory()
    if not isinstance(env, gym.Env):
        raise ValueError(f"task {task!r}: {attribute}() returned {type(env).__name__}, not a gymnasium.Env")
    return env


class _FlatObservation(gym.ObservationWrapper):
    """The outermost layer of every environment :func:`make_env` makes: the observation as a flat float32
    vector; ``task`` is the name it was made from, ``named`` whether that is a task of txl."""

    def __init__(
        self,
        env: gym.Env,
        convert: Callable[[Any], np.ndarray],
        space: gym.spaces.Box,
        *,
        task: str,
        named: bool,
    ) -> None:
        super().__init__(env)
        self.observation_space = space
        self._convert = convert
        self.task = task
        self.named = named

    def observation(self, observation: Any) -> np.ndarray:
        """The flat float32 observation."""
        return self._convert(observation)


def _flat(env: gym.Env, task: str, *, named: bool) -> _FlatObservation:
    """``env`` with a flat float32 observation: the kept components of a NoVelocity task, else flattened."""
    space = env.observation_space
    if task in _NO_VELOCITY:
        keep = list(_NO_VELOCITY[task][1])
        space = typing.cast(gym.spaces.Box, space)  # classic control observes a Box
        box = gym.spaces.Box(space.low[keep], space.high[keep], dtype=np.float32)
        return _FlatObservation(env, lambda obs: obs[keep].astype(np.float32), box, task=task, named=named)
    if isinstance(space, gym.spaces.Box) and space.dtype == np.float32 and len(space.shape) == 1:
        return _FlatObservation(
            env, lambda obs: np.asarray(obs, dtype=np.float32), space, task=task, named=named
        )
    try:
        flat = gym.spaces.flatten_space(space)
    except NotImplementedError:
        flat = None
    if not isinstance(flat, gym.spaces.Box):
        raise ValueError(f"task {task!r}: its observation space {space} cannot be made a flat vector")
    with np.errstate(over="ignore"):  # bounds beyond float32 become infinite
        box = gym.spaces.Box(flat.low.astype(np.float32), flat.high.astype(np.float32), dtype=np.float32)
    return _FlatObservation(
        env,
        lambda obs: np.asarray(gym.spaces.flatten(space, obs), dtype=np.float32),
        box,
        task=task,
        named=named,
    )


def _check_actions(space: gym.Space, task: str) -> None:
    if isinstance(space, gym.spaces.Discrete) and int(space.start) == 0:
        return
    if isinstance(space, gym.spaces.Box) and len(space.shape) == 1:
        return
    raise ValueError(
        f"task {task!r} has actions {space}; txl.rl supports Discrete actions (from 0) and one-dimensional Box "
        "actions"
    )


def make_vector_env(task: str | Callable[[], gym.Env], n_envs: int) -> gym.vector.SyncVectorEnv:
    """``n_envs`` copies of ``task`` (a task for :func:`make_env`, or a function that makes one environment)
    stepped in this process, each resetting in the step where it ends (gymnasium's SAME_STEP autoreset: the
    observation after a done is the next episode's first)."""
    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"n_envs must be a positive integer, got {n_envs!r}")
    if isinstance(task, str):
        name = task
        factory: Callable[[], gym.Env] = lambda: make_env(name)  # noqa: E731
    else:
        factory = task
    return gym.vector.SyncVectorEnv(
        [factory for _ in range(n_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )


# --- the state of a vector environment of named tasks, as JSON values ---------------------------------------

_STATE_FORMAT = 1

# The attributes an environment's step or reset changes, by its exact class (a subclass may add its own).
_FIELDS: dict[str, tuple[str, ...]] = {
    "gymnasium.envs.classic_control.cartpole.CartPoleEnv": ("state", "steps_beyond_terminated"),
    "gymnasium.envs.classic_control.pendulum.PendulumEnv": ("state", "last_u"),
    "gymnasium.envs.classic_control.continuous_mountain_car.Continuous_MountainCarEnv": ("state",),
    **{
        f"popgym.envs.{module}.{name}": ("mode",) if module == "autoencode" else ("dealt_cards", "card")
        for name, module in _POPGYM.items()
    },
    f"{__name__}.MemoryLength": ("_cue", "_t"),
}
# The attributes of a wrapper that change, by its exact class (another wrapper is refused).
_WRAPPER_FIELDS: dict[type, tuple[str, ...]] = {
    gym.wrappers.TimeLimit: ("_elapsed_steps",),
    gym.wrappers.OrderEnforcing: ("_has_reset",),
    _FlatObservation: (),
}


def env_state(envs: gym.vector.VectorEnv) -> dict[str, Any] | None:
    """The complete state of a vector environment of txl's named tasks (from :func:`make_vector_env`), as
    JSON values (dicts, lists, strings, ints, floats, booleans, None), or None when some environment is not a
    named task of :func:`make_env` (its state cannot be saved safely).

    Per environment: its generator's bit-generator state and seed, what its step and reset change (e.g.
    CartPole's ``state``, a POPGym deck's order and hands), and its wrappers' counters (the time limit's
    elapsed steps); for the vector environment: which environments reset at the next step (under NEXT_STEP
    autoreset) and ``observations``, the batch (E, D_obs) of the last reset or step, which is what an agent
    acts on next. The action space's own sampling generator is not part of it. :func:`set_env_state`
    restores it."""
    subs = getattr(envs, "envs", None)
    if not isinstance(envs, gym.vector.SyncVectorEnv) or subs is None:
        return None
    if not all(isinstance(e, _FlatObservation) and e.named for e in subs):
        return None
    return {
        "format": _STATE_FORMAT,
        "envs": [_one_state(e) for e in subs],
        "autoreset": [bool(b) for b in envs._autoreset_envs],
        "observations": _encode(np.asarray(envs._observations)),
    }


def set_env_state(envs: gym.vector.VectorEnv, state: dict[str, Any]) -> None:
    """Restore into ``envs`` (a vector environment of the same tasks, e.g. freshly made, reset or not) what
    :func:`env_state` saved: it then steps exactly as the saved one would have."""
    subs = getattr(envs, "envs", None)
    if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT:
        raise ValueError("state is not an environment state of txl.rl.envs.env_state (format 1)")
    if not isinstance(envs, gym.vector.SyncVectorEnv) or subs is None:
        raise ValueError(f"envs must be a gymnasium SyncVectorEnv, got {type(envs).__name__}")
    saved, tasks = state["envs"], [getattr(e, "task", None) for e in subs]
    if [s["task"] for s in saved] != tasks:
        raise ValueError(
            f"state is of {len(saved)} environments of {_tasks([s['task'] for s in saved])}; envs has "
            f"{len(tasks)} of {_tasks(tasks)}"
        )
    for env, one in zip(subs, saved, strict=True):
        _set_one_state(env, one)
    envs._autoreset_envs = np.array(state["autoreset"], dtype=np.bool_)
    observations = _decode(state["observations"])
    envs._observations = observations
    envs._env_obs = list(observations)


def _tasks(tasks: Sequence[str | None]) -> str:
    return ", ".join(sorted({str(t) for t in tasks}))


def _layers(env: gym.Env) -> list[gym.Env]:
    """The wrappers of ``env``, outermost first, then the environment."""
    layers = [env]
    while isinstance(layers[-1], gym.Wrapper):
        layers.append(layers[-1].env)
    return layers


def _qualified(obj: object) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _names(layers: Sequence[object]) -> list[str]:
    """The class names of ``layers`` (not their modules, which a library may move)."""
    return [type(layer).__qualname__ for layer in layers]


def _one_state(env: _FlatObservation) -> dict[str, Any]:
    """The state of one environment made by :func:`make_env` for a named task."""
    *wrappers, base = _layers(env)
    base = typing.cast(Any, base)  # its fields are its own class's
    fields = _FIELDS.get(_qualified(base))
    if fields is None:
        raise ValueError(f"txl.rl.envs cannot save the state of {_qualified(base)} (task {env.task!r})")
    state: dict[str, Any] = {
        "task": env.task,
        "layers": _names([*wrappers, base]),
        "wrappers": [{name: _encode(getattr(w, name)) for name in _wrapper_fields(w)} for w in wrappers],
        "env": {name: _encode(getattr(base, name)) for name in fields},
        "np_random": _encode_generator(base.np_random),
        "np_random_seed": base.np_random_seed,
    }
    deck = getattr(base, "deck", None)
    if deck is not None:  # a POPGym card game
        state["deck"] = {
            "idx": _encode(deck.idx),
            "deck_len": int(deck.deck_len),
            "hands": {player: [int(card) for card in hand] for player, hand in deck.hands.items()},
        }
    return state


def _set_one_state(env: gym.Env, state: dict[str, Any]) -> None:
    *wrappers, base = _layers(env)
    base = typing.cast(Any, base)  # its fields are its own class's
    layers = _names([*wrappers, base])
    if layers != state["layers"]:
        raise ValueError(
            f"state is of an environment made of {state['layers']}; this one is made of {layers}"
        )
    for wrapper, values in zip(wrappers, state["wrappers"], strict=True):
        for name, value in values.items():
            setattr(wrapper, name, _decode(value))
    for name, value in state["env"].items():
        decoded = _decode(value)
        if name == "mode":  # Autoencode's phase, an IntEnum
            decoded = type(base.mode)(decoded)
        setattr(base, name, decoded)
    generator = _decode_generator(state["np_random"])
    base.np_random = generator
    base._np_random_seed = state["np_random_seed"]
    if "deck" in state:
        deck = base.deck
        deck.idx = _decode(state["deck"]["idx"])
        deck.deck_len = state["deck"]["deck_len"]
        deck.hands = {player: list(hand) for player, hand in state["deck"]["hands"].items()}
        deck.rng = generator


def _wrapper_fields(wrapper: gym.Env) -> tuple[str, ...]:
    for kind, names in _WRAPPER_FIELDS.items():
        if type(wrapper) is kind:
            return names
    raise ValueError(f"txl.rl.envs cannot save the state of the wrapper {_qualified(wrapper)}")


def _encode(value: Any) -> Any:
    """A value of an environment's state as JSON values: numpy arrays and scalars as their dtype, shape and
    numbers (exact: a float's shortest repr round-trips); None, booleans, ints, floats and strings as they
    are."""
    if isinstance(value, (np.ndarray, np.generic)):
        array = np.asarray(value)
        return {"dtype": array.dtype.str, "shape": list(array.shape), "data": array.ravel().tolist()}
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):  # an IntEnum too
        return int(value)
    if isinstance(value, float):
        return float(value)
    raise ValueError(f"txl.rl.envs cannot save a value of type {type(value).__name__}")


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        array = np.asarray(value["data"], dtype=np.dtype(value["dtype"])).reshape(value["shape"])
        return array[()] if array.ndim == 0 else array
    return value


def _encode_generator(generator: np.random.Generator) -> dict[str, Any]:
    """A numpy generator's bit-generator state (its ints may pass 64 bits: Python's JSON keeps them exact)."""
    return dict(generator.bit_generator.state)


def _decode_generator(state: dict[str, Any]) -> np.random.Generator:
    kind = getattr(np.random, state["bit_generator"], None)
    if kind is None or not isinstance(kind, type) or not issubclass(kind, np.random.BitGenerator):
        raise ValueError(f"state names an unknown bit generator {state['bit_generator']!r}")
    bit_generator = kind()
    bit_generator.state = state
    return np.random.Generator(bit_generator)
