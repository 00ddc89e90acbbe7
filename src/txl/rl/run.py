"""A PPO run, in memory or in a run folder of :mod:`txl.runs` (its layout, lock, metrics file and checkpoint
names): :func:`train` starts one, :func:`resume` continues one from its newest intact checkpoint.

A checkpoint (:mod:`txl.checkpoint`) holds the agent's weights and the optimizer's state in safetensors, the
torch RNG state and the collector's tensors (memory, last observations, episode starts) beside them, and in
its JSON the counters, the numpy RNG state, the collector's running returns and lengths, and the
environments' own state (:func:`txl.rl.envs.env_state`). A run of one of txl's named tasks resumes exactly: it
logs the rows an uninterrupted run logs. The environments of any other task cannot be saved safely: that run
resumes on fresh episodes, and warns so.
"""

from __future__ import annotations

import json
import signal
import sys
import time
import warnings
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..checkpoint import (
    CheckpointContents,
    ResumeWarning,
    TrainingState,
    checkpoint_step,
    load_checkpoint,
    load_extra_tensors,
    save_checkpoint,
)
from ..config import ConfigError
from ..errors import RunError
from ..files import atomic_write_text
from ..runs import (
    RunPaths,
    check_new_run_dir,
    check_run_folder,
    lock_run,
    new_run_folder,
    newest_intact_checkpoint,
    prune_checkpoints,
    read_metrics,
    recover_run,
    truncate_metrics,
)
from ..train.trainer import Interrupted, catch_signals
from .agent import Agent
from .config import RESUME_FIELDS, RLConfig, apply_rl_overrides, rl_config_from_dict, rl_config_to_dict
from .normalize import Normalizer
from .ppo import Collector, check_vector_env, collect, refresh_memory, update

__all__ = ["train", "resume", "read_rl_config", "make_envs", "final_return", "TIMING_FIELDS", "FINAL_STEPS"]

TIMING_FIELDS = ("collect_s", "update_s", "memory_s", "steps_per_s", "elapsed_s", "cpu_s")
"""The fields of a metrics row that time the run (they vary with the machine and its load); every other
field is the same in every run of the same config, resumed or not."""

FINAL_STEPS = 20_480
"""The final return of a run (:func:`final_return`) is over the episodes that ended in its last this many
environment steps."""

KEEP_LAST = 2
"""Step checkpoints kept in a run folder (the newest ones)."""


def make_envs(task: str, n_envs: int) -> Any:
    """``n_envs`` environments of ``task`` (:func:`txl.rl.envs.make_vector_env`); a task that cannot be made
    is a ConfigError naming it."""
    from .envs import make_vector_env

    try:
        return make_vector_env(task, n_envs)
    except ConfigError:
        raise
    except (ImportError, ValueError, TypeError) as exc:
        raise ConfigError(f"task {task!r}: {exc}") from None


def final_return(rows: Sequence[dict[str, Any]], *, steps: int = FINAL_STEPS) -> float | None:
    """The mean return of the episodes that ended in the last ``steps`` environment steps of a run's rows
    (at least its last row); None when no episode ended there."""
    if not rows:
        return None
    end = rows[-1]["env_steps"]
    recent = [r for r in rows if r["env_steps"] > end - steps] or [rows[-1]]
    counted = [(r["return_mean"], r["episodes"]) for r in recent if r["episodes"]]
    total = sum(n for _, n in counted)
    return sum(mean * n for mean, n in counted) / total if total else None


def _numpy_rng() -> list[Any]:
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    return [name, [int(k) for k in keys], int(pos), int(has_gauss), float(cached)]


def _set_numpy_rng(saved: list[Any]) -> None:
    name, keys, pos, has_gauss, cached = saved
    np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


class _Loop:
    """One run's updates over its environments, with its agent, optimizer and collector; writes to ``paths``
    (None: in memory)."""

    def __init__(self, config: RLConfig, envs: Any, paths: RunPaths | None, *, progress: bool) -> None:
        self.config, self.envs, self.paths, self.progress = config, envs, paths, progress
        self.actions = check_vector_env(envs, config.ppo.n_envs)
        self.obs_dim = int(envs.single_observation_space.shape[0])
        torch.manual_seed(config.seed)
        self.agent = Agent(
            config.agent,
            self.obs_dim,
            self.actions,
            config.core,
            separate_critic=config.ppo.separate_critic,
        )
        self.optimizer = torch.optim.Adam(self.agent.parameters(), lr=config.ppo.lr, eps=1e-5)
        self.history = config.history if config.ppo.memory_after_update == "recompute" else 0
        self.collector = Collector.begin(
            envs, self.agent, seed=config.seed, history=self.history, norm=self._normalizer()
        )
        self.done = 0  # updates
        self.elapsed, self.cpu = 0.0, 0.0  # of the updates done, across resumes
        self.rows: list[dict[str, Any]] = []

    def _normalizer(self) -> Normalizer | None:
        """The normalisation of a new collector (None when ``ppo`` normalises nothing)."""
        ppo = self.config.ppo
        if not (ppo.normalize_obs or ppo.normalize_reward):
            return None
        return Normalizer.begin(
            ppo.n_envs,
            self.obs_dim,
            obs=ppo.normalize_obs,
            reward=ppo.normalize_reward,
            gamma=ppo.gamma,
            clip=ppo.normalize_clip,
        )

    # -- checkpoints ----------------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        return {
            "config": rl_config_to_dict(self.config),
            "agent": {"kind": self.config.agent, "obs_dim": self.obs_dim, "actions": self.actions.to_dict()},
        }

    def save(self) -> Path:
        """The checkpoint of the updates done; keeps the newest :data:`KEEP_LAST`."""
        from .envs import env_state

        assert self.paths is not None
        record = {
            "env_steps": self.done * self.config.ppo.n_envs * self.config.ppo.n_steps,
            "cpu_s": self.cpu,
            "numpy_rng": _numpy_rng(),
            "collector": self.collector.record(),
            "envs": env_state(self.envs),
        }
        contents = CheckpointContents(
            self.agent,
            self.optimizer,
            state=TrainingState(step=self.done, elapsed=self.elapsed),
            meta={**self._meta(), "rl": record},
            extra={f"collector.{k}": v for k, v in self.collector.tensors().items()},
        )
        folder = save_checkpoint(self.paths.checkpoint_at(self.done), contents)
        prune_checkpoints(self.paths.root, keep_last=KEEP_LAST)
        return folder

    def restore(self, folder: Path) -> None:
        """Continue from a checkpoint: weights, optimizer, RNG states, counters, and the environments and the
        collector where the environments' state was saved (else fresh episodes, with a ResumeWarning)."""
        state, _, document = load_checkpoint(folder, model=self.agent, optimizer=self.optimizer)
        saved_agent = document.get("agent")
        if saved_agent != self._meta()["agent"]:
            raise RunError(
                f"{folder}: the checkpoint's agent {saved_agent} is not this run's {self._meta()['agent']}"
            )
        record = document["rl"]
        self.done, self.elapsed, self.cpu = state.step, state.elapsed, float(record["cpu_s"])
        _set_numpy_rng(record["numpy_rng"])
        saved = {
            k[len("collector.") :]: v
            for k, v in load_extra_tensors(folder).items()
            if k.startswith("collector.")
        }
        if record["envs"] is not None:
            from .envs import set_env_state

            try:
                set_env_state(self.envs, record["envs"])
            except ValueError as exc:
                raise RunError(
                    f"{folder}: cannot put the environments back as they were saved ({exc})"
                ) from None
            self.collector.load(saved, record["collector"])
            return
        seed = self.config.seed + self.done
        norm = self._normalizer()
        if norm is not None:  # the statistics go on; the fresh episodes' discounted returns start at 0
            norm.load({k[len("norm.") :]: t for k, t in saved.items() if k.startswith("norm.")})
            norm.running = np.zeros_like(norm.running)
        self.collector = Collector.begin(self.envs, self.agent, seed=seed, history=self.history, norm=norm)
        warnings.warn(
            f"the environments of task {self.config.task!r} cannot be saved: the run resumes from update "
            f"{self.done} on fresh episodes (reset with seed {seed}), so it does not continue exactly as it "
            "would have",
            ResumeWarning,
            stacklevel=3,
        )

    # -- the updates ----------------------------------------------------------------------------------

    def _log(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        if self.paths is not None:
            with open(self.paths.metrics, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")

    def _one_update(self) -> dict[str, Any]:
        """Collect a rollout, update, refresh the memory; the metrics row."""
        cfg, ppo = self.config, self.config.ppo
        n = cfg.updates
        lr = ppo.lr * (1.0 - self.done / n) if ppo.anneal_lr else ppo.lr
        clip = ppo.clip * (1.0 - self.done / n) if ppo.anneal_clip else ppo.clip
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        wall, cpu = time.perf_counter(), time.process_time()
        rollout = collect(self.agent, self.collector, ppo)
        collected = time.perf_counter()
        stats = update(self.agent, self.optimizer, rollout, ppo, clip=clip)
        updated = time.perf_counter()
        refresh_memory(self.agent, self.collector, ppo.memory_after_update)
        end = time.perf_counter()
        self.done += 1
        self.elapsed += end - wall
        self.cpu += time.process_time() - cpu
        finished = rollout.finished
        steps = ppo.n_envs * ppo.n_steps
        return {
            "step": self.done,
            "env_steps": self.done * steps,
            "episodes": len(finished),
            "return_mean": float(np.mean([r for r, _ in finished])) if finished else None,
            "length_mean": float(np.mean([n for _, n in finished])) if finished else None,
            **stats,
            "lr": lr,
            "collect_s": collected - wall,
            "update_s": updated - collected,
            "memory_s": end - updated,
            "steps_per_s": steps / max(end - wall, 1e-9),
            "elapsed_s": self.elapsed,
            "cpu_s": self.cpu,
        }

    def fit(self) -> list[dict[str, Any]]:
        """Run the updates left; in a run folder, a metrics row each, a checkpoint when due and at the end,
        and SIGINT/SIGTERM saving a checkpoint before stopping (Interrupted)."""
        cfg, ppo = self.config, self.config.ppo
        per = ppo.n_envs * ppo.n_steps
        every = cfg.checkpoint_every
        bar = tqdm(
            total=cfg.updates * per,
            initial=self.done * per,
            unit="step",
            disable=not self.progress,
            desc=f"{cfg.task} {cfg.agent}",
            dynamic_ncols=True,
        )
        try:
            signals: AbstractContextManager[dict[str, int]] = (
                catch_signals() if self.paths is not None else nullcontext({})
            )
            with signals as received:
                while self.done < cfg.updates:
                    row = self._one_update()
                    self._log(row)
                    bar.update(per)
                    if row["return_mean"] is not None:
                        bar.set_postfix(ret=f"{row['return_mean']:.3f}", refresh=False)
                    if self.paths is None:
                        continue
                    signum = received.get("signum", 0)
                    if signum or self.done == cfg.updates or (every and self.done % every == 0):
                        self.save()
                    if signum:
                        raise Interrupted(
                            f"{signal.Signals(signum).name} at update {self.done}: checkpoint saved; continue "
                            f"with 'resume {self.paths.root}'",
                            signum=signum,
                        )
        finally:
            bar.close()
        rows = self.rows if self.paths is None else read_metrics(self.paths.root)
        if self.paths is not None:
            atomic_write_text(self.paths.summary, json.dumps(self.summary(rows), indent=1) + "\n")
        return rows

    def summary(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        """What summary.json says of the finished run."""
        return {
            "status": "completed",
            "task": self.config.task,
            "agent": self.config.agent,
            "seed": self.config.seed,
            "updates": self.done,
            "env_steps": self.done * self.config.ppo.n_envs * self.config.ppo.n_steps,
            "final_return": final_return(rows),
            "final_steps": FINAL_STEPS,
            "elapsed_s": self.elapsed,
            "cpu_s": self.cpu,
            "params": sum(p.numel() for p in self.agent.parameters()),
        }


def read_rl_config(run: Path) -> RLConfig:
    """The :class:`~txl.rl.config.RLConfig` saved in a run folder (RunError when it holds none)."""
    paths = RunPaths(Path(run))
    check_run_folder(paths.root)
    if not paths.config.is_file():
        raise RunError(f"{paths.root} holds no run (no config.json)")
    try:
        data = json.loads(paths.config.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunError(f"{paths.config}: corrupt ({exc})") from None
    if not isinstance(data, dict) or "task" not in data:
        raise RunError(f"{paths.root} is not a reinforcement-learning run (made by txl rl train)")
    try:
        return rl_config_from_dict(data)
    except ConfigError as exc:
        raise RunError(f"{paths.config}: {exc}") from None


def train(
    config: RLConfig,
    out: str | Path | None = None,
    *,
    envs: Any = None,
    overwrite: bool = False,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Train a new run and return its metrics rows (one per update). With ``out``, in a new run folder
    (config.json, metrics.jsonl, checkpoints, summary.json; ``overwrite`` replaces a run there) that
    :func:`resume` continues; without, in memory. ``envs``: a gymnasium vector environment of
    ``ppo.n_envs`` that resets an ended episode in the same step (default: the task's,
    :func:`txl.rl.envs.make_vector_env`)."""
    made = envs is None
    envs = make_envs(config.task, config.ppo.n_envs) if made else envs
    try:
        if out is None:
            return _Loop(config, envs, None, progress=progress).fit()
        paths = check_new_run_dir(Path(out), overwrite=overwrite)
        with new_run_folder(paths, overwrite=overwrite):
            atomic_write_text(paths.config, json.dumps(rl_config_to_dict(config), indent=1) + "\n")
            return _Loop(config, envs, paths, progress=progress).fit()
    finally:
        if made:
            envs.close()


def _resume_config(saved: RLConfig, overrides: Sequence[str]) -> RLConfig:
    """The saved config with ``overrides`` of :data:`~txl.rl.config.RESUME_FIELDS` only."""
    config = apply_rl_overrides(saved, list(overrides))
    before, after = rl_config_to_dict(saved), rl_config_to_dict(config)
    for key in before:
        for name in before[key] if isinstance(before[key], dict) else [None]:
            old = before[key] if name is None else before[key][name]
            new = after[key] if name is None else after[key][name]
            path = key if name is None else f"{key}.{name}"
            if old != new and path not in RESUME_FIELDS:
                raise ConfigError(
                    f"{path} cannot change when a run resumes (only {', '.join(RESUME_FIELDS)} can); "
                    "start a new run for other settings"
                )
    return config


def _warn_schedule_change(saved: RLConfig, config: RLConfig, done: int) -> None:
    """Warn when new steps move an annealed learning rate of the update about to run."""
    ppo = config.ppo
    if not ppo.anneal_lr or saved.updates == config.updates:
        return
    old, new = ppo.lr * (1 - done / saved.updates), ppo.lr * (1 - done / config.updates)
    warnings.warn(
        f"resuming at update {done} with steps {saved.steps} -> {config.steps}: the annealed learning rate "
        f"jumps from {old:.6g} to {new:.6g}",
        ResumeWarning,
        stacklevel=3,
    )


def resume(
    run: str | Path, *, overrides: Sequence[str] = (), envs: Any = None, progress: bool = True
) -> list[dict[str, Any]]:
    """Continue a run from its newest intact checkpoint and return all its metrics rows. ``overrides``
    (``steps=N``, ``checkpoint_every=N``) may change :data:`~txl.rl.config.RESUME_FIELDS` only; ``envs`` as
    :func:`train` takes them (default: the task's). The metrics logged after the checkpoint by a killed
    process are dropped first; the run says on stderr from which update it resumes."""
    paths = RunPaths(Path(run))
    check_run_folder(paths.root)
    with lock_run(paths.root):
        recover_run(paths.root)
        saved = read_rl_config(paths.root)
        config = _resume_config(saved, overrides)
        folder = newest_intact_checkpoint(paths.root)
        done = checkpoint_step(folder)
        if done >= config.updates:
            per = config.ppo.n_envs * config.ppo.n_steps
            raise RunError(
                f"{paths.root} already finished {done} updates ({done * per:,} steps); to train longer "
                f"resume with steps N (N >= {(done + 1) * per})",
                fields=("steps",),
            )
        _warn_schedule_change(saved, config, done)
        made = envs is None
        envs = make_envs(config.task, config.ppo.n_envs) if made else envs
        try:
            loop = _Loop(config, envs, paths, progress=progress)
            loop.restore(folder)  # checks everything before anything in the run folder changes
            truncate_metrics(paths.root, done)
            if config != saved:
                atomic_write_text(paths.config, json.dumps(rl_config_to_dict(config), indent=1) + "\n")
            print(f"resuming {paths.root} from update {done} ({folder.name})", file=sys.stderr, flush=True)
            return loop.fit()
        finally:
            if made:
                envs.close()
