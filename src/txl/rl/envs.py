"""The tasks of the memory experiment as gymnasium vector environments (the ``rl`` extra): POPGym's
RepeatPreviousEasy and RepeatFirstEasy with one-hot observations, and CartPole-v1 with its velocities hidden.
An environment that ends resets in the same step, so the observation after a done is an episode's first."""

from __future__ import annotations

import typing
from collections.abc import Callable
from typing import Any, Literal

import numpy as np

__all__ = ["Task", "make_env", "make_vector_env"]

Task = Literal["RepeatPreviousEasy", "RepeatFirstEasy", "CartPoleNoVelocity"]
"""``RepeatPreviousEasy``: say the suit of the card dealt 4 steps ago (51 steps, return in [-1, 1], chance
about -0.5); ``RepeatFirstEasy``: say the suit of the first card (51 steps); ``CartPoleNoVelocity``:
gymnasium's CartPole-v1 (return up to 500) observing the cart position and the pole angle only."""


def _gym() -> Any:
    try:
        import gymnasium
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError("txl.rl's environments need gymnasium: pip install 'transformer-xl[rl]'") from error
    return gymnasium


def make_env(task: str) -> Any:
    """One environment of ``task`` (a name of :data:`Task`) with a flat float32 observation."""
    gym = _gym()
    _check_task(task)
    if task == "CartPoleNoVelocity":
        return _keep(gym.make("CartPole-v1"), indices=(0, 2))  # cart position, pole angle
    try:
        from popgym.envs.repeat_first import RepeatFirstEasy
        from popgym.envs.repeat_previous import RepeatPreviousEasy
    except ImportError as error:  # pragma: no cover - depends on the install
        raise ImportError(f"{task} needs popgym: pip install 'transformer-xl[rl]'") from error
    env = RepeatPreviousEasy() if task == "RepeatPreviousEasy" else RepeatFirstEasy()
    return gym.wrappers.TimeLimit(_one_hot(env), max_episode_steps=env.max_episode_length + 1)


def _check_task(task: str) -> None:
    if task not in typing.get_args(Task):
        raise ValueError(f"task must be one of {', '.join(typing.get_args(Task))}, got {task!r}")


def _keep(env: Any, *, indices: tuple[int, ...]) -> Any:
    """The observation's components at ``indices`` only."""
    gym = _gym()
    low, high = env.observation_space.low[list(indices)], env.observation_space.high[list(indices)]
    space = gym.spaces.Box(low, high, dtype=np.float32)
    return gym.wrappers.TransformObservation(env, lambda obs: obs[list(indices)].astype(np.float32), space)


def _one_hot(env: Any) -> Any:
    """A Discrete(n) observation as a one-hot float32 vector of n."""
    gym = _gym()
    n = env.observation_space.n
    space = gym.spaces.Box(0.0, 1.0, (n,), dtype=np.float32)
    return gym.wrappers.TransformObservation(env, lambda obs: np.eye(n, dtype=np.float32)[int(obs)], space)


def make_vector_env(task: str | Callable[[], Any], n_envs: int) -> Any:
    """``n_envs`` copies of ``task`` (a task name, or a function that makes one environment) stepped in this
    process, each resetting in the step where it ends."""
    gym = _gym()
    if isinstance(task, str):
        _check_task(task)
        name = task
        factory: Callable[[], Any] = lambda: make_env(name)  # noqa: E731
    else:
        factory = task
    return gym.vector.SyncVectorEnv(
        [factory for _ in range(n_envs)], autoreset_mode=gym.vector.AutoresetMode.SAME_STEP
    )
