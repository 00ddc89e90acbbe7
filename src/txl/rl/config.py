"""The settings of txl.rl, one family of frozen values validated on construction: the memory core's sizes
(:class:`CoreConfig`, with the one mapping of them onto :mod:`txl.model`'s layer stack), PPO's
(:class:`PPOConfig`) and a whole run's (:class:`RLConfig`); the run presets (``configs/rl/*.toml``, one per
task), TOML files and ``path=value`` overrides (``core.mem_len=32``)."""

from __future__ import annotations

import dataclasses
import math
import re
import typing
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from ..config import (
    ConfigError,
    Span,
    StackConfig,
    build_section,
    check_field,
    check_non_negative_int,
    check_one_of,
    check_positive_int,
    coerce_value,
    config_to_dict,
    parse_value,
    read_preset,
)

__all__ = [
    "CoreConfig",
    "Gating",
    "AgentKind",
    "MemoryAfterUpdate",
    "PPOConfig",
    "RLConfig",
    "rl_preset_names",
    "rl_preset_for_task",
    "load_rl_config",
    "rl_config_from_dict",
    "rl_config_to_dict",
    "apply_rl_overrides",
    "RESUME_FIELDS",
]

Gating = Literal["none", "gru"]
"""How a layer adds its attention and feed-forward outputs to its input: ``"none"``, the residual sums of a
pre-norm Transformer-XL layer; ``"gru"``, GTrXL's GRU-type gates in their place (Parisotto et al., 2019)."""


@dataclass(frozen=True)
class CoreConfig:
    """Sizes of :class:`~txl.rl.MemoryCore`: a Transformer-XL layer stack over projected observations.

    The defaults make a small core that runs a few thousand steps a second on one CPU thread."""

    n_layer: int = 2
    """Number of layers."""
    n_head: int = 2
    """Attention heads per layer (H)."""
    d_head: int = 16
    """Size of each head (Dh)."""
    d_model: int = 64
    """Size of the hidden states and of the features the core returns (D); even (sinusoidal positions)."""
    d_inner: int = 128
    """Inner size of each layer's feed-forward network (F)."""
    mem_len: int = 64
    """How many past steps each environment remembers (M): every query sees its own episode's last
    ``mem_len`` steps and itself. The memory has this fixed size from the first step on (unused slots are
    masked), so a step costs the same at step 100 and at step 10,000 of an episode."""
    gating: Gating = "gru"
    """``"gru"``: GTrXL layers (pre-norm, a GRU-type gate in place of each residual sum, starting near the
    identity); ``"none"``: pre-norm Transformer-XL layers with residual sums."""
    dropout: float = 0.0
    """Dropout on the hidden states and attention outputs while training (0 for PPO)."""
    compiled: bool = False
    """Step through a compiled step (``torch.compile``: C++ kernels on the CPU, the same maths): faster
    collection once compiled, which takes the better part of a minute in a fresh process (seconds when
    inductor's on-disk cache has it). Where no compiler runs the core steps eagerly, with one warning.
    Training windows run eagerly either way."""

    def __post_init__(self) -> None:
        # the layer fields (n_layer ... d_inner, dropout) are checked as the stack's, mem_len as the span's
        _ = self.stack, self.span
        check_field(
            isinstance(self.compiled, bool), "compiled", f"must be true or false, got {self.compiled!r}"
        )
        if self.gating not in typing.get_args(Gating):
            choices = ", ".join(map(repr, typing.get_args(Gating)))
            raise ConfigError(f"gating: must be one of {choices}, got {self.gating!r}")

    @property
    def stack(self) -> StackConfig:
        """The settings :mod:`txl.model`'s layer stack is built from: relative attention, pre-norm (GTrXL's
        identity-map reordering), no attention dropout."""
        return StackConfig(
            n_layer=self.n_layer,
            n_head=self.n_head,
            d_head=self.d_head,
            d_model=self.d_model,
            d_inner=self.d_inner,
            dropout=self.dropout,
            dropatt=0.0,
            attention="relative",
            pre_norm=True,
        )

    @property
    def span(self) -> Span:
        """The lengths the core's stack runs with: a memory of ``mem_len`` steps, no clamp (which steps a
        query sees is the core's rule, :class:`~txl.rl.core.CoreStack`)."""
        return Span(mem_len=self.mem_len)


AgentKind = Literal["xl", "gru", "lstm", "mlp"]
"""The agent's core: ``xl`` (:class:`~txl.rl.MemoryCore`, Transformer-XL memory), ``gru`` or ``lstm``
(recurrent baselines) or ``mlp`` (no memory)."""

MemoryAfterUpdate = Literal["keep", "recompute", "reset"]
"""What the collectors' memory becomes after a weight update: ``keep`` it as it is (computed with the old
weights); ``recompute`` it with the new weights from each environment's last ``n_layer * mem_len``
observations; ``reset`` it to an empty memory (as at the start of a run)."""


def _number(obj: Any, name: str, *, low: float, above: bool = False, high: float | None = None) -> None:
    """A finite number (not a bool) >= ``low`` (> with ``above``), and <= ``high`` when given."""
    value = getattr(obj, name)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    ok = ok and (value > low if above else value >= low) and (high is None or value <= high)
    bound = f"{'above' if above else 'at least'} {low:g}" + ("" if high is None else f" and at most {high:g}")
    check_field(ok, name, f"must be a finite number {bound}, got {value!r}")


@dataclass(frozen=True)
class PPOConfig:
    """PPO's settings, the same for every agent: rollouts of ``n_envs`` environments times ``n_steps`` steps,
    cut into training windows of ``seq_len`` steps that are replayed from the memory stored at their start."""

    n_envs: int = 16
    """Environments stepped together (E)."""
    n_steps: int = 128
    """Steps per environment per rollout (T); a rollout is ``n_envs * n_steps`` environment steps."""
    seq_len: int = 32
    """Length of the training windows (S), a divisor of ``n_steps``."""
    n_minibatches: int = 4
    """Minibatches per epoch (of windows)."""
    epochs: int = 4
    """Passes over each rollout."""
    lr: float = 3e-4
    """Adam's learning rate."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over the run's updates (false: constant)."""
    gamma: float = 0.99
    """Discount."""
    gae_lambda: float = 0.95
    """GAE's lambda."""
    clip: float = 0.2
    """PPO's ratio clip."""
    ent_coef: float = 0.01
    """Entropy bonus."""
    vf_coef: float = 0.5
    """Value loss weight."""
    max_grad_norm: float = 0.5
    """Gradient norm clip."""
    reward_scale: float = 1.0
    """Rewards are multiplied by this before the values and advantages are learned (the logged returns are
    not): for tasks whose returns are large, such as CartPole's (up to 500), a scale that brings them near 1."""
    memory_after_update: MemoryAfterUpdate = "keep"
    """The collectors' memory after each update: ``keep``, ``recompute`` or ``reset``
    (:data:`MemoryAfterUpdate`)."""
    anneal_clip: bool = False
    """Anneal the ratio clip linearly to 0 over the run's updates, as the learning rate (false: constant)."""
    normalize_obs: bool = False
    """Normalise the observations by their running mean and variance over the run (from the first reset on),
    clipped to ``[-normalize_clip, normalize_clip]``; the statistics are saved in each checkpoint and frozen
    for evaluation (:mod:`txl.rl.normalize`)."""
    normalize_reward: bool = False
    """Divide the rewards (after ``reward_scale``) by the running standard deviation of each environment's
    discounted return (discount ``gamma``), clipped to ``[-normalize_clip, normalize_clip]``."""
    normalize_clip: float = 10.0
    """The bound of normalised observations and rewards."""
    separate_critic: bool = False
    """Give the value head a core of its own, of the agent's kind and size (its state joined to the policy's
    core's), so that the value loss trains that core and the policy loss the other (true), or one core under
    both heads (false)."""
    bootstrap_truncated: bool = False
    """Where an episode is cut by a time limit (truncated, not terminated), add ``gamma`` times the value of
    its last observation to its last reward, so that the values learn that the episode would have gone on
    (true), or treat the cut as the episode's end (false)."""

    def __post_init__(self) -> None:
        for name in ("n_envs", "n_steps", "seq_len", "n_minibatches", "epochs"):
            check_positive_int(self, name)
        check_field(self.n_steps % self.seq_len == 0, "seq_len", f"must divide n_steps ({self.n_steps})")
        windows = self.n_envs * self.n_steps // self.seq_len
        check_field(windows % self.n_minibatches == 0, "n_minibatches", f"must divide the {windows} windows")
        _number(self, "lr", low=0, above=True)
        check_field(
            isinstance(self.anneal_lr, bool), "anneal_lr", f"must be true or false, got {self.anneal_lr!r}"
        )
        for name in ("gamma", "gae_lambda"):
            _number(self, name, low=0, high=1)
        for name in ("clip", "max_grad_norm", "reward_scale"):
            _number(self, name, low=0, above=True)
        for name in ("ent_coef", "vf_coef"):
            _number(self, name, low=0)
        check_one_of(self, "memory_after_update", typing.get_args(MemoryAfterUpdate))
        for name in (
            "anneal_clip",
            "normalize_obs",
            "normalize_reward",
            "separate_critic",
            "bootstrap_truncated",
        ):
            value = getattr(self, name)
            check_field(isinstance(value, bool), name, f"must be true or false, got {value!r}")
        _number(self, "normalize_clip", low=0, above=True)


@dataclass(frozen=True)
class RLConfig:
    """One reinforcement-learning run: the task, the agent, the budget, and the PPO and core settings. Saved
    as the run folder's ``config.json``; the presets (:func:`rl_preset_names`) are TOML files of it."""

    task: str = "RepeatPreviousEasy"
    """A named task of :mod:`txl.rl.envs`, a registered gymnasium id, or ``module:factory``."""
    agent: AgentKind = "xl"
    """The core: ``xl``, ``gru``, ``lstm`` or ``mlp`` (:data:`AgentKind`)."""
    steps: int = 401_408
    """Environment steps, all environments together; the run makes ``steps // (n_envs * n_steps)`` updates
    (at least one)."""
    seed: int = 1
    """Seeds the agent's initialisation, its sampling and the environments."""
    checkpoint_every: int = 10
    """Save a checkpoint every this many updates, and at the end (0: at the end only)."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO's settings (:class:`PPOConfig`)."""
    core: CoreConfig = field(default_factory=CoreConfig)
    """The XL core's sizes (:class:`CoreConfig`); ``core.d_model`` is also the feature size of the GRU, the
    LSTM and the MLP."""

    def __post_init__(self) -> None:
        check_field(
            isinstance(self.task, str) and self.task.strip() != "",
            "task",
            f"must name a task, got {self.task!r}",
        )
        check_one_of(self, "agent", typing.get_args(AgentKind))
        check_positive_int(self, "steps")
        check_non_negative_int(self, "seed")
        check_non_negative_int(self, "checkpoint_every")
        check_field(
            isinstance(self.ppo, PPOConfig), "ppo", f"must be a PPOConfig, got {type(self.ppo).__name__}"
        )
        check_field(
            isinstance(self.core, CoreConfig), "core", f"must be a CoreConfig, got {type(self.core).__name__}"
        )

    @property
    def updates(self) -> int:
        """The run's updates: one per rollout of ``ppo.n_envs * ppo.n_steps`` steps (at least one)."""
        return max(1, self.steps // (self.ppo.n_envs * self.ppo.n_steps))

    @property
    def history(self) -> int:
        """Observations per environment that ``memory_after_update = "recompute"`` re-reads: the XL core's
        reach, ``core.n_layer * core.mem_len``."""
        return self.core.n_layer * self.core.mem_len


_SECTIONS: dict[str, type] = {"ppo": PPOConfig, "core": CoreConfig}
RESUME_FIELDS = ("steps", "checkpoint_every")
"""The fields a resumed run may change (``--set steps=N`` trains longer); the others are the run's."""


def _presets_dir() -> Path:
    return Path(str(resources.files("txl") / "configs" / "rl"))


def rl_preset_names() -> list[str]:
    """Names of the run presets shipped with txl: one per task, named as the task; others named as their task
    with a suffix (``CartPoleNoVelocity-100k``); one per family of tasks (``MemoryLength`` for every
    ``MemoryLength-L``)."""
    return sorted(p.stem for p in _presets_dir().glob("*.toml"))


def rl_preset_for_task(task: str, names: list[str] | None = None) -> str | None:
    """The preset ``txl rl train --task TASK`` starts from: the preset named ``task``, else that of its family
    (``MemoryLength`` for ``MemoryLength-48``: a name, a dash and a positive integer), else None. ``names``:
    the presets to choose from (default: :func:`rl_preset_names`)."""
    names = rl_preset_names() if names is None else names
    if task in names:
        return task
    family = re.fullmatch(r"(.+)-[1-9][0-9]*", task)
    return family.group(1) if family is not None and family.group(1) in names else None


def load_rl_config(name_or_path: str | Path) -> RLConfig:
    """A preset by name (``RepeatPreviousEasy``) or a TOML file by path, as an :class:`RLConfig`."""
    return rl_config_from_dict(read_preset(name_or_path, _presets_dir()))


def _known(cls: type) -> list[str]:
    return sorted(f.name for f in dataclasses.fields(cls))


def rl_config_from_dict(data: dict[str, Any]) -> RLConfig:
    """An :class:`RLConfig` from nested plain values (TOML or JSON): the run's fields at the top, ``[ppo]``
    and ``[core]`` tables; an unknown field is an error that names it."""
    hints = typing.get_type_hints(RLConfig)
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key in _SECTIONS:
            if not isinstance(value, dict):
                raise ConfigError(f"{key}: must be a table of fields")
            values[key] = build_section(_SECTIONS[key], value, key)
        elif key in hints:
            values[key] = coerce_value(value, hints[key], key)
        else:
            raise ConfigError(f"{key}: unknown field (known: {', '.join(_known(RLConfig))})")
    return RLConfig(**values)


def rl_config_to_dict(config: RLConfig) -> dict[str, Any]:
    """Nested plain values for JSON or TOML (the inverse of :func:`rl_config_from_dict`)."""
    return config_to_dict(config)


def apply_rl_overrides(config: RLConfig, overrides: list[str] | tuple[str, ...]) -> RLConfig:
    """Apply ``path=value`` overrides (``steps=2048``, ``ppo.lr=1e-3``, ``core.mem_len=32``; values as TOML,
    a bare word a string), returning a new validated :class:`RLConfig`."""
    data = rl_config_to_dict(config)
    for item in overrides:
        key, sep, raw = item.partition("=")
        path = key.strip()
        if not sep:
            raise ConfigError(f"override {item!r}: expected field=value or section.field=value")
        section, dot, name = path.partition(".")
        if dot:
            if section not in _SECTIONS:
                raise ConfigError(f"{path}: unknown config section (known: {', '.join(_SECTIONS)})")
            if name not in _known(_SECTIONS[section]):
                raise ConfigError(f"{path}: unknown field (known: {', '.join(_known(_SECTIONS[section]))})")
            data[section][name] = parse_value(raw.strip())
        elif path in _SECTIONS or path not in _known(RLConfig):
            raise ConfigError(f"{path}: unknown field (known: {', '.join(_known(RLConfig))})")
        else:
            data[path] = parse_value(raw.strip())
    return rl_config_from_dict(data)
