"""The training loop: a :class:`Trainer`, given its parts, carries memory from step to step, schedules,
accumulates, clips, evaluates with memory, logs, checkpoints and resumes exactly (also under torchrun);
:func:`train` and :func:`resume` assemble the parts under the run folder's lock.
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from ..checkpoint import (
    CheckpointContents,
    ResumeWarning,
    TrainingState,
    checkpoint_step,
    load_checkpoint,
    load_rank_rng,
    save_checkpoint,
)
from ..config import ConfigError, RunConfig, config_from_dict, config_to_dict, eval_lengths
from ..data import Batch, PreparedData, SegmentStream, load_vocab, prepare_data
from ..distributed import SINGLE, Distributed
from ..errors import RunError
from ..evaluation import EvalResult, EvalSettings, bits_name, evaluate, metrics_from_loss
from ..files import atomic_write_text
from ..model import Memory, TransformerXL
from ..runs import (
    RunPaths,
    check_new_run_dir,
    check_run_folder,
    latest_checkpoint,
    load_run_config,
    lock_run,
    new_run_folder,
    newest_intact_checkpoint,
    prune_checkpoints,
    recover_run,
    save_run_config,
    truncate_metrics,
)
from .checks import check_data, check_training_fits, resume_config, train_stream
from .optim import configure_optimizer, schedule_lr, set_hyperparameters, set_lr

__all__ = [
    "train",
    "resume",
    "Trainer",
    "build_trainer",
    "TrainingDiverged",
    "Interrupted",
    "TrainerParts",
    "TrainerOptions",
    "catch_signals",
]

SCHEDULE_FIELDS = ("steps", "lr", "min_lr", "warmup_steps", "schedule")

Callback = Callable[[dict[str, Any]], None]


class TrainingDiverged(RunError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class Interrupted(RunError):
    """SIGINT or SIGTERM: a checkpoint was saved and the run can be resumed."""

    def __init__(self, message: str, *, signum: int) -> None:
        super().__init__(message, fields=("resume",))
        self.signum = signum


@contextmanager
def _sigterm_raises(paths: RunPaths) -> Iterator[None]:
    """Outside the training loop (loading data, the final evaluation) SIGTERM raises Interrupted, so that the
    lock is released and a failed start cleaned up; inside the loop ``catch_signals`` takes over."""

    def handler(signum, _frame):
        raise Interrupted(
            f"{signal.Signals(signum).name} outside the training steps: stopped; a run with a "
            f"checkpoint continues with 'resume {paths.root}'",
            signum=signum,
        )

    try:
        previous = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not in the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def catch_signals() -> Iterator[dict[str, int]]:
    """Turn SIGINT and SIGTERM into a flag checked between steps (main thread only; elsewhere signals are left
    alone): the block gets a dict whose ``"signum"`` is set when one arrives. The trainers of language models
    and of agents (:mod:`txl.rl.run`) stop at the next step boundary with it."""
    received: dict[str, int] = {}
    previous = {}

    def handler(signum, _frame):
        received["signum"] = signum

    try:
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
    except ValueError:  # not in the main thread: leave signals alone
        previous = {}
    try:
        yield received
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@dataclass(frozen=True)
class TrainerParts:
    """What a :class:`Trainer` is given: the components it trains with and the data it evaluates on."""

    model: TransformerXL
    """The model, on the device it trains on."""
    optimizer: torch.optim.Optimizer
    """The optimizer of the model's parameters."""
    stream: SegmentStream
    """The train split's segment stream (every process is given the whole stream)."""
    run: RunPaths
    """The run folder it writes (rank 0 only)."""
    eval_splits: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Token ids of the evaluation splits (``valid``, ``test``: those the corpus has)."""
    eval_starts: Mapping[str, np.ndarray] = field(default_factory=dict)
    """Document starts of the evaluation splits (token indices, by split), passed to the model when
    ``data.documents = "reset"``; then the train stream's ``Batch.starts`` are passed too, and the memory
    carries each row's reach (checkpointed with it)."""
    facts: Mapping[str, Any] = field(default_factory=dict)
    """Saved with every checkpoint and checked when one is loaded (the vocabulary's and corpus's
    fingerprints)."""
    vocab_kind: str | None = None
    """The vocabulary's kind, which names the bits figure of the records (bpc: char, bpb: byte)."""


@dataclass(frozen=True)
class TrainerOptions:
    """How a :class:`Trainer` runs: what it shows, whom it tells, with which processes."""

    progress: bool = True
    """Show a progress bar (rank 0 only)."""
    callbacks: tuple[Callback, ...] = ()
    """Functions given each record logged to metrics.jsonl (rank 0 only)."""
    group: Distributed = SINGLE
    """The processes of a data-parallel run (torchrun); each trains on its rows of every batch."""


class Trainer:
    """One run's training, given its ``parts`` (:class:`TrainerParts`). :meth:`fit` runs the loop;
    :meth:`restore` first continues from a checkpoint.

    Under data parallelism (``options.group``) every process is given the whole stream and trains on its rows
    of each batch (``self.rows``); ``self.memory`` holds the memory of those rows only. Only rank 0 writes
    logs, metrics, the progress bar, checkpoints and the summary."""

    def __init__(
        self, config: RunConfig, parts: TrainerParts, options: TrainerOptions = TrainerOptions()
    ) -> None:
        group, model = options.group, parts.model
        self.vocab_kind = parts.vocab_kind
        self.config, self.model, self.optimizer = config, model, parts.optimizer
        self.stream, self.run = parts.stream, parts.run
        self.eval_splits = dict(parts.eval_splits)
        self.eval_starts = dict(parts.eval_starts) if config.data.documents == "reset" else {}
        self.facts = dict(parts.facts)
        self.progress = options.progress and group.is_main
        self.callbacks = options.callbacks
        self.group = group
        self.rows = self._check_split(config, group, has_eval=bool(self.eval_splits))
        self.device = next(model.parameters()).device
        self.parallel: nn.Module = model
        if group.enabled:  # averages the gradients over the processes during backward
            device_ids = [self.device.index] if self.device.type == "cuda" else None
            self.parallel = DistributedDataParallel(model, device_ids=device_ids)
        self.forward = torch.compile(self.parallel) if config.train.compile else self.parallel
        self.memory: Memory | None = None
        self.state = TrainingState()
        self.tb = None  # opened when training starts, so a refused resume leaves the folder untouched
        self._bar: tqdm | None = None
        self._shown: dict[str, str] = {}  # what the progress display shows after the bar: the last figures
        self._clock = 0.0  # perf_counter() at the run's (resumed) start, minus the time already trained
        self._window_tokens, self._window_seconds = 0, 0.0  # of optimizer steps since the last train record

    @staticmethod
    def _check_split(config: RunConfig, group: Distributed, *, has_eval: bool) -> slice:
        """This process's rows of a training batch; ConfigError naming the field when the train or eval
        batch, or the accumulation chunks, cannot be split evenly over the processes."""
        tc = config.train
        rows = group.rows(tc.batch_size, field="train.batch_size")
        per = rows.stop - rows.start
        if per % tc.accum_steps:
            raise ConfigError(
                f"train.accum_steps={tc.accum_steps} must divide the {per} streams of each of the "
                f"{group.world_size} processes (train.batch_size={tc.batch_size})"
            )
        if has_eval:
            group.rows(config.eval.batch_size, field="eval.batch_size")
        return rows

    # -- checkpoints ----------------------------------------------------------------------------------

    def _meta(self) -> dict[str, Any]:
        return {
            "config": config_to_dict(self.config),
            "model": config_to_dict(self.config.model),
            **self.facts,
        }

    def _save_to(self, folder: Path) -> Path:
        """Save a checkpoint (a collective: every process calls it, rank 0 writes): the memory of all B rows
        and, in a distributed run, every rank's RNG state."""
        self.state.stream = self.stream.state_dict()
        self.state.world_size = self.group.world_size
        memory = self.memory
        if memory is not None and self.group.enabled:
            states = tuple(self.group.gather_rows(state) for state in memory.states)  # (B, M, D) each
            reach = None if memory.reach is None else self.group.gather_rows(memory.reach)  # (B,)
            memory = Memory(states, reach)
        rank_rng = self.group.gather_objects(_rng_state(self.device)) if self.group.enabled else ()
        if self.group.is_main:
            contents = CheckpointContents(
                self.model, self.optimizer, memory, self.state, self._meta(), rank_rng
            )
            save_checkpoint(folder, contents)
        return folder

    def save(self) -> Path:
        """Save the step's checkpoint and keep only the last ``train.keep_last``."""
        folder = self._save_to(self.run.checkpoint_at(self.state.step))
        if self.group.is_main:
            prune_checkpoints(self.run.root, keep_last=self.config.train.keep_last)
        return folder

    def restore(self, folder: Path) -> None:
        """Continue from a checkpoint: weights, optimizer, memory, RNG, stream position, counters. The
        optimizer's betas and weight decay are then set from this run's config (which may override them)."""
        state, memory, document = load_checkpoint(
            folder, model=self.model, optimizer=self.optimizer, expected=self._meta()
        )
        set_hyperparameters(self.optimizer, self.config.train)
        self._warn_schedule_change(document, state.step)
        self._restore_rank_rng(folder, saved_world_size=state.world_size)
        self.state = state
        if (
            memory is not None and len(memory) > self.config.model.n_layer
        ):  # saved before txl 0.2: drop the unread
            memory = Memory(memory.states[: self.config.model.n_layer])  # last layer's output
        if memory is not None:
            if memory.batch_size != self.config.train.batch_size:
                raise RunError(
                    f"{folder}: the checkpoint holds the memory of {memory.batch_size} streams, "
                    f"train.batch_size is {self.config.train.batch_size}"
                )
            memory = memory.select(self.rows).to(self.device)  # this process's streams, (B/N, M, D) each
        self.memory = memory
        try:
            self.stream.load_state_dict(state.stream)
        except ValueError as exc:
            raise RunError(f"{folder}: cannot resume the data stream ({exc})") from None
        if self.group.is_main:
            truncate_metrics(self.run.root, state.step)

    def _restore_rank_rng(self, folder: Path, *, saved_world_size: int) -> None:
        """Give each process the RNG state it had when the checkpoint was taken (load_checkpoint restored rank
        0's). On another number of processes the rows are drawn from other generators: say so when dropout
        makes that matter."""
        world_size = self.group.world_size
        if saved_world_size == world_size:
            if self.group.enabled:
                states = load_rank_rng(folder)
                if len(states) != world_size:
                    raise RunError(
                        f"{folder}: the checkpoint holds the RNG states of {len(states)} processes, "
                        f"its state says {world_size}"
                    )
                _set_rng_state(states[self.group.rank], self.device)
            return
        model = self.config.model
        if model.dropout or model.dropatt:
            warnings.warn(
                f"{folder} was saved by {saved_world_size} process(es) and is resumed on {world_size}: "
                f"the memory rows are split anew, but the dropout masks are drawn from other random "
                f"generators, so the run does not continue exactly as it would have",
                ResumeWarning,
                stacklevel=3,
            )

    def _warn_schedule_change(self, document: dict[str, Any], step: int) -> None:
        """Warn when the new settings (train.steps, ...) move the learning rate of the step about to run."""
        saved = (document.get("config") or {}).get("train")
        tc = self.config.train
        if not isinstance(saved, dict) or step >= tc.steps:
            return
        try:
            before = config_from_dict({"train": saved}).train
        except ConfigError:
            return
        old, new = schedule_lr(step, before), schedule_lr(step, tc)
        if old != new:
            changed = ", ".join(
                f"train.{k} {getattr(before, k)} -> {getattr(tc, k)}"
                for k in SCHEDULE_FIELDS
                if getattr(before, k) != getattr(tc, k)
            )
            warnings.warn(
                f"resuming at step {step} with {changed}: the learning rate jumps from {old:.6g} to "
                f"{new:.6g} (the schedule is recomputed for the new settings)",
                ResumeWarning,
                stacklevel=3,
            )

    # -- one step --------------------------------------------------------------------------------------

    def compute_gradients(
        self, inputs: torch.Tensor, targets: torch.Tensor, starts: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Forward and backward over a batch (in ``train.accum_steps`` chunks of rows, each with its rows of
        the memory), carrying memory to the next call, then clip; returns the mean loss (a tensor). The
        optimizer step is the caller's. ``starts`` (B, T) bool: where documents begin (``data.documents =
        "reset"``), passed to the model with each chunk's rows; None calls the model without.

        Under data parallelism ``inputs`` are this process's rows: every process holds as many tokens, so
        DistributedDataParallel's average of the per-process mean gradients is the gradient of the mean over
        all B·T tokens. Gradients are averaged once, in the backward of the last chunk (``no_sync`` before);
        clipping then sees the averaged gradients, the same on every process, and the loss returned is the
        mean over all processes' tokens, so that every process takes the same decisions from it."""
        tc = self.config.train
        chunks = tc.accum_steps
        rows = inputs.shape[0]
        per = rows // chunks
        total = inputs.numel()
        loss_sum = torch.zeros((), device=self.device)
        new_memory = []
        for c in range(chunks):
            part = slice(c * per, (c + 1) * per)
            memory = None if self.memory is None else self.memory.select(part)
            inner = self.group.enabled and c < chunks - 1
            with cast(DistributedDataParallel, self.parallel).no_sync() if inner else nullcontext():
                with torch.autocast(
                    device_type=self.device.type, dtype=torch.bfloat16, enabled=tc.precision == "bf16"
                ):
                    if starts is None:
                        out = self.forward(inputs[part], memory=memory, targets=targets[part])
                    else:
                        out = self.forward(
                            inputs[part], memory=memory, targets=targets[part], starts=starts[part]
                        )
                loss = out.loss.float().sum()
                (loss / total).backward()
            loss_sum += loss.detach()
            if out.memory is not None:
                new_memory.append(out.memory)
        self.memory = Memory.cat_rows(new_memory) if new_memory else None
        if tc.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.clip)
        return self.group.all_reduce_sum(loss_sum) / (total * self.group.world_size)

    def train_step(self, batch: Batch) -> tuple[float, float]:
        """One optimizer step on ``batch`` at the schedule's learning rate; returns (loss, learning rate).
        TrainingDiverged, before the step, when the loss is not finite."""
        tc = self.config.train
        started = time.perf_counter()
        step = self.state.step
        lr = schedule_lr(step, tc)
        set_lr(self.optimizer, lr)
        tokens = batch.targets.numel()  # of all processes
        batch = batch.select(self.rows).to(self.device)  # (B/N, T): this process's streams
        if batch.new_epoch:  # the rows start the split again: the memory holds its end
            self.memory = None
        loss = float(self.compute_gradients(batch.inputs, batch.targets, batch.starts))
        if not math.isfinite(loss):
            last = latest_checkpoint(self.run.root)
            where = f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"
            raise TrainingDiverged(
                f"loss became {loss} at step {step + 1}; stopped without saving ({where}); "
                "lower train.lr or set train.clip"
            )
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.state.step = step + 1
        self.state.tokens += tokens
        now = time.perf_counter()
        self._window_tokens += tokens
        self._window_seconds += now - started
        self.state.train_seconds += now - started
        self.state.elapsed = now - self._clock
        return loss, lr

    # -- the loop -------------------------------------------------------------------------------------

    def fit(self) -> dict[str, Any]:
        """Train until ``train.steps`` (or an early stop, the time limit, SIGINT/SIGTERM: Interrupted after a
        checkpoint), then evaluate on the whole splits, write summary.json and return the summary."""
        self._start()
        batches = self.stream.batches()
        status = None
        try:
            with catch_signals() as received:
                while status is None and self.state.step < self.config.train.steps:
                    loss, lr = self.train_step(next(batches))
                    self._log_train(loss, lr)
                    status = self._should_stop(patience_exhausted=self._evaluate())
                    signum = self._agreed_signal(received)
                    if status or signum or self._checkpoint_due():
                        self.save()
                    if signum:
                        self.group.barrier()  # no process leaves before the checkpoint is written
                        name = signal.Signals(signum).name
                        raise Interrupted(
                            f"{name} at step {self.state.step}: checkpoint saved; continue with "
                            f"'resume {self.run.root}'",
                            signum=signum,
                        )
        finally:
            if self._bar is not None:
                self._bar.close()
        return self._finish(status or "completed")

    def _agreed_signal(self, received: dict[str, int]) -> int:
        """The signal (SIGINT/SIGTERM) that stops the run at this step, 0 to go on. Under data parallelism
        every process learns whether any of them received one, so that all stop at the same step."""
        signum = received.get("signum", 0)
        if not self.group.any(bool(signum)):
            return 0
        return max(self.group.gather_objects(signum))

    def _start(self) -> None:
        self.tb = _tensorboard(self.run.tensorboard) if self.group.is_main else None
        self.model.train()
        self._clock = time.perf_counter() - self.state.elapsed
        self._window_tokens, self._window_seconds = 0, 0.0
        self._bar = tqdm(
            total=self.config.train.steps,
            initial=self.state.step,
            disable=not self.progress,
            desc="train",
            dynamic_ncols=True,
        )

    def _log(self, record: dict[str, Any]) -> None:
        """Append a record to metrics.jsonl (and TensorBoard), and pass it to the callbacks (rank 0 only)."""
        if not self.group.is_main:
            return
        with open(self.run.metrics, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step",) and math.isfinite(value):
                    self.tb.add_scalar(f"{record['split']}/{key}", value, record["step"])
        for callback in self.callbacks:
            callback(record)

    def _log_train(self, loss: float, lr: float) -> None:
        """A train record every ``train.log_every`` steps and at the last; the progress bar."""
        tc, step = self.config.train, self.state.step
        if step % tc.log_every == 0 or step == tc.steps:
            tokens_per_s = self._window_tokens / max(self._window_seconds, 1e-9)
            self._window_tokens, self._window_seconds = 0, 0.0
            record = {
                "step": step,
                "split": "train",
                "loss": loss,
                **metrics_from_loss(loss, kind=self.vocab_kind),
                "lr": lr,
                "tokens": self.state.tokens,
                "tokens_per_s": tokens_per_s,
                "elapsed_s": self.state.elapsed,
            }
            self._log(record)
            self._show(
                loss=f"{loss:.3f}",
                bits=f"{record['bits_per_token']:.3f}",
                ppl=f"{record['ppl']:.1f}",
                tok_s=f"{tokens_per_s:.0f}",
                lr=f"{lr:.2e}",
            )
        if self._bar is not None:
            self._bar.update(1)

    def _show(self, **figures: str) -> None:
        """Update the figures after the progress bar (the last training ones, the last validation ones)."""
        self._shown.update(figures)
        if self._bar is not None:
            self._bar.set_postfix(self._shown, refresh=True)

    def _show_valid(self, result: EvalResult) -> None:
        """The validation figures just measured, in the progress display."""
        bits = bits_name(self.vocab_kind) or "bits"
        self._show(
            val_loss=f"{result.loss:.3f}",
            val_ppl=f"{result.ppl:.1f}",
            **{f"val_{bits}": f"{result.bits_per_token:.3f}"},
        )

    def evaluate(self, split: str, *, max_tokens: int | None = None) -> EvalResult | None:
        """Loss over ``split`` (its first ``max_tokens``) with the run's evaluation span (and its documents'
        starts with ``data.documents = "reset"``); None without it."""
        if split not in self.eval_splits:
            return None
        lengths = eval_lengths(self.config)
        settings = EvalSettings(
            batch_size=self.config.eval.batch_size,
            tgt_len=lengths.tgt_len,
            span=lengths.span,
            precision=self.config.train.precision,
            max_tokens=max_tokens,
            progress=self.progress,
            name=split,
        )
        return evaluate(
            self.model,
            self.eval_splits[split],
            settings,
            group=self.group,
            starts=self.eval_starts.get(split),
        )

    def _keep_if_best(self, loss: float) -> bool:
        """Save the best checkpoint when ``loss`` is the best validation loss yet; whether it was."""
        if self.state.best_val_loss is not None and loss >= self.state.best_val_loss:
            return False
        self.state.best_val_loss = loss
        self._save_to(self.run.best)
        return True

    def _evaluate(self) -> bool:
        """The periodic validation, when due (every ``train.eval_every`` steps, not at the last: the final
        one follows); keeps the best checkpoint. Returns whether ``train.patience`` is exhausted."""
        tc = self.config.train
        if not tc.eval_every or self.state.step % tc.eval_every or self.state.step == tc.steps:
            return False
        result = self.evaluate("valid", max_tokens=tc.eval_tokens)
        self.model.train()
        if result is None:
            return False
        self._log({"step": self.state.step, "split": "valid", **result.as_dict(kind=self.vocab_kind)})
        self._show_valid(result)
        self.state.bad_evals = 0 if self._keep_if_best(result.loss) else self.state.bad_evals + 1
        return tc.patience is not None and self.state.bad_evals >= tc.patience

    def _should_stop(self, *, patience_exhausted: bool) -> str | None:
        """Why the loop ends before ``train.steps``: "early_stopped", "time_limit", or None to go on."""
        tc = self.config.train
        if patience_exhausted:
            return "early_stopped"
        if tc.time_limit is not None and self.state.elapsed >= tc.time_limit * 60:
            return "time_limit"
        return None

    def _checkpoint_due(self) -> bool:
        every = self.config.train.checkpoint_every
        return self.state.step == self.config.train.steps or bool(every and self.state.step % every == 0)

    def _finish(self, status: str) -> dict[str, Any]:
        """The final evaluations over the whole splits, summary.json, and the summary."""
        valid = self.evaluate("valid")
        if valid is not None:
            self._log(
                {
                    "step": self.state.step,
                    "split": "valid",
                    **valid.as_dict(kind=self.vocab_kind),
                    "final": True,
                }
            )
            self._keep_if_best(valid.loss)
        test = self.evaluate("test")  # reported in summary.json; metrics.jsonl holds train and valid only
        summary: dict[str, Any] = {
            "status": status,
            "steps": self.state.step,
            "tokens": self.state.tokens,
            "train_tokens_per_s": self.state.tokens / max(self.state.train_seconds, 1e-9),
            "elapsed_s": self.state.elapsed,
            "params": self.model.num_parameters(),
            "vocab_size": self.config.model.vocab_size,
            "best_val_loss": self.state.best_val_loss,
        }
        if valid is not None:
            summary.update(valid.as_dict("val_", kind=self.vocab_kind))
        if test is not None:
            summary.update(test.as_dict("test_", kind=self.vocab_kind))
        if self.group.is_main:
            atomic_write_text(self.run.summary, json.dumps(summary, indent=1) + "\n")
        if self.tb is not None:
            self.tb.close()
        return summary


def _rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """This process's random state: the CPU generator, and its GPU's when it trains on one."""
    state = {"torch": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def _set_rng_state(state: Mapping[str, torch.Tensor], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def _tensorboard(folder: Path) -> Any:
    """A TensorBoard writer into ``folder``, or None when TensorBoard is not installed."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except Exception:  # noqa: BLE001 - TensorBoard is optional
        return None
    return SummaryWriter(str(folder))


# ---------------------------------------------------------------------------------------------------------
# Assembling a run: train() and resume()
# ---------------------------------------------------------------------------------------------------------


def build_trainer(
    config: RunConfig, run: RunPaths, data: PreparedData, options: TrainerOptions = TrainerOptions()
) -> Trainer:
    """A run's parts, assembled: the model (initialised from ``train.seed``, the same on every process) on
    ``train.device``, its optimizer, the train stream and the evaluation splits of ``data``. Under data
    parallelism each process then draws its dropout masks from its own generator (``train.seed`` + rank)."""
    group = options.group
    device = group.device(config.train.device)
    torch.manual_seed(config.train.seed)
    model = TransformerXL(config.model).to(device)
    if group.enabled:
        torch.manual_seed(config.train.seed + group.rank)
    parts = TrainerParts(
        model,
        configure_optimizer(model, config.train),
        train_stream(config, data.splits, data.starts),
        run,
        eval_splits={s: t for s, t in data.splits.items() if s != "train"},
        eval_starts={s: t for s, t in data.starts.items() if s != "train"},
        facts={"vocab_fingerprint": data.vocab.fingerprint, "corpus_fingerprint": data.corpus.fingerprint},
        vocab_kind=data.vocab.kind,
    )
    return Trainer(config, parts, options)


def train(
    config: RunConfig,
    out: Path,
    *,
    overwrite: bool = False,
    progress: bool = True,
    callbacks: tuple[Callback, ...] = (),
    group: Distributed = SINGLE,
) -> dict[str, Any]:
    """Train a new run in ``out`` and return its summary (also written to summary.json). The sizes and the
    data are checked before anything is written (SizeError: a segment whose training buffers cannot fit);
    a start that fails before its first checkpoint leaves nothing. Under data parallelism every process calls
    it; every process checks the data, rank 0 alone writes."""
    check_training_fits(config, group)  # the sizes it counts do not depend on the vocabulary's
    paths = check_new_run_dir(out, overwrite=overwrite)
    data = prepare_data(config.data)
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=len(data.vocab)))
    check_data(config, data)
    trainer = build_trainer(config, paths, data, TrainerOptions(progress, callbacks, group))
    group.barrier()  # every process has checked the folder before rank 0 writes in it
    folder = new_run_folder(paths, overwrite=overwrite) if group.is_main else nullcontext()
    with folder, _sigterm_raises(paths):
        if group.is_main:
            data.vocab.save(paths.vocab)
            save_run_config(paths.root, config)
        return trainer.fit()


def resume(
    run_dir: Path,
    *,
    overrides: tuple[str, ...] = (),
    progress: bool = True,
    callbacks: tuple[Callback, ...] = (),
    group: Distributed = SINGLE,
) -> dict[str, Any]:
    """Continue a run from its newest intact checkpoint. ``overrides`` may change train (except
    :data:`~txl.train.checks.RESUME_FIXED_TRAIN_FIELDS`), eval and generate fields; config.json then records them. Nothing in the run
    folder changes before every check has passed (SizeError: a segment whose training buffers cannot fit).
    Under data parallelism every process calls it, on any number of processes that divides
    train.batch_size; rank 0 holds the lock and writes, and says on stderr from which step (and checkpoint)
    the run resumes."""
    paths = RunPaths(Path(run_dir))
    check_run_folder(paths.root)
    with lock_run(paths.root) if group.is_main else nullcontext(), _sigterm_raises(paths):
        config = resume_config(load_run_config(paths.root), tuple(overrides))
        check_training_fits(config, group)
        if group.is_main:
            recover_run(paths.root)
        group.barrier()  # the checkpoints folder is tidy before every process looks in it
        folder = newest_intact_checkpoint(paths.root)
        done = checkpoint_step(folder)
        if paths.summary.exists() and done >= config.train.steps:
            raise RunError(
                f"{paths.root} already finished {done} steps; to train longer resume with "
                f"train.steps=N (N > {done})",
                fields=("train.steps",),
            )
        if not paths.vocab.is_file():
            raise RunError(f"{paths.root} has no vocab.json")
        data = prepare_data(config.data, vocab=load_vocab(paths.vocab))
        check_data(config, data)
        trainer = build_trainer(config, paths, data, TrainerOptions(progress, callbacks, group))
        trainer.restore(folder)  # checks everything before anything in the run folder changes
        if overrides and group.is_main:
            save_run_config(paths.root, config)
        if group.is_main:
            print(f"resuming {paths.root} from step {done} ({folder.name})", file=sys.stderr, flush=True)
        return trainer.fit()
