"""The training loop: ordered segment streams with memory carried from step to step (dropped when the
stream wraps to a new epoch), AdamW with a pure schedule, accumulation, clipping, bf16 autocast, periodic
evaluation with memory, early stopping, metrics, atomic checkpoints and exact resume. It knows the model only
through ``forward(..., memory, targets)``. ``train`` and ``resume`` hold the run folder's lock; a start that
fails before its first checkpoint leaves nothing behind.

    summary = train(load_config("tiny"), Path("runs/tiny"))
    summary = resume(Path("runs/tiny"))
"""

from __future__ import annotations

import dataclasses
import json
import math
import signal
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm

from ..config import ConfigError, RunConfig, apply_overrides, config_from_dict, config_to_dict, eval_span
from ..data import (
    CORPUS_NAMES,
    Corpus,
    SegmentStream,
    Vocab,
    build_vocab,
    encode_split,
    load_corpus,
    load_vocab,
)
from ..errors import RunError
from ..evaluate import EvalResult, evaluate, metrics_from_loss
from ..model import Memory, TransformerXL
from ..runs import RunPaths, check_new_run_dir, clear_run, load_run_config, lock_run, resolve_device
from ..train.checkpoint import (
    DamagedCheckpoint,
    ResumeWarning,
    TrainingState,
    atomic_write_text,
    best_checkpoint,
    checkpoint_step,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    prune_checkpoints,
    recover_checkpoints,
    save_checkpoint,
    verify_checkpoint,
)
from .optim import configure_optimizer, schedule_lr, set_hyperparameters, set_lr

__all__ = ["train", "resume", "Trainer", "TrainingDiverged", "Interrupted", "PreparedData", "prepare_data",
           "check_data", "train_stream", "RESUME_FIXED_TRAIN_FIELDS"]

RESUME_FIXED_TRAIN_FIELDS = ("batch_size", "tgt_len", "varlen", "seed")
"""Train fields a resumed run cannot change: they shape the data stream saved in the checkpoint (its rows,
its position, its segment lengths) or were used up at the start (the seed). Every model field and every
data field except the locations (data_dir, cache_dir: the corpus fingerprint is checked) are fixed too."""
RESUME_MOVABLE_DATA_FIELDS = ("data_dir", "cache_dir")
SCHEDULE_FIELDS = ("steps", "lr", "min_lr", "warmup_steps", "schedule")


class TrainingDiverged(RunError):
    """The loss became NaN or infinite; the last good checkpoint is kept."""


class Interrupted(RunError):
    """SIGINT or SIGTERM: a checkpoint was saved and the run can be resumed."""

    def __init__(self, message: str, *, signum: int) -> None:
        super().__init__(message)
        self.signum = signum


@dataclass
class PreparedData:
    """A corpus, its vocabulary and the encoded splits (memory-mapped)."""

    corpus: Corpus
    vocab: Vocab
    splits: dict[str, np.ndarray]


def prepare_data(config: RunConfig, *, vocab: Vocab | None = None) -> PreparedData:
    """Load the corpus, build (or reuse) the vocabulary and encode every split that exists."""
    data = config.data
    corpus = load_corpus(data.corpus, data_dir=Path(data.data_dir) if data.data_dir else None, text_field=data.text_field)
    if vocab is None:
        vocab = build_vocab(data.vocab or corpus.level, corpus, min_freq=data.min_freq, max_size=data.max_size,
                            bpe_vocab_size=data.bpe_vocab_size, tokenizer=data.tokenizer)
    cache_dir = Path(data.cache_dir) if data.cache_dir else None
    splits = {s: encode_split(corpus, s, vocab, cache_dir=cache_dir) for s in ("train", "valid", "test") if corpus.has(s)}
    if "train" not in splits:
        raise RunError(f"corpus {data.corpus!r} has no train split to train on")
    return PreparedData(corpus=corpus, vocab=vocab, splits=splits)


def train_stream(config: RunConfig, splits: dict[str, np.ndarray]) -> SegmentStream:
    """The ordered stream of the train split (RunError when it is shorter than one segment)."""
    tc = config.train
    try:
        return SegmentStream(splits["train"], batch_size=tc.batch_size, tgt_len=tc.tgt_len, varlen=tc.varlen,
                             seed=tc.seed, name="train")
    except ValueError as exc:
        raise RunError(str(exc)) from None


def check_data(config: RunConfig, data: PreparedData) -> None:
    """Refuse, before anything is written, data a run cannot use: a train split shorter than one segment, an
    evaluation split too short to evaluate (a file corpus is cut 90/5/5, so its validation slice can come out
    empty), and early stopping that can never happen."""
    train_stream(config, data.splits)
    corpus = config.data.corpus
    for split in ("valid", "test"):
        n = len(data.splits.get(split, ()))
        if split in data.splits and n < 2:
            raise RunError(f"split '{split}' of corpus {corpus!r} has {n} token(s); evaluation needs at least 2; "
                           "use a longer corpus")
    if "valid" not in data.splits and corpus not in CORPUS_NAMES and Path(corpus).expanduser().is_file():
        raise RunError(f"split 'valid' of corpus {corpus!r} is empty (0 tokens): the file is cut 90/5/5 at line "
                       "ends and no text fell between the cuts; use a longer file, or a folder with train.txt "
                       "and valid.txt")
    patience = config.train.patience
    if patience is not None and "valid" not in data.splits:
        raise RunError(f"train.patience={patience}: corpus {corpus!r} has no validation split to stop early on; "
                       "set train.patience=null")
    if patience is not None and not config.train.eval_every:
        raise RunError(f"train.patience={patience} stops after evaluations without improvement, but "
                       "train.eval_every=0 evaluates only at the end; set train.eval_every")


@contextmanager
def _sigterm_raises(paths: RunPaths) -> Iterator[None]:
    """Outside the training loop (loading data, the final evaluation) SIGTERM raises Interrupted, so that the
    lock is released and a failed start cleaned up; inside the loop ``_catch_signals`` takes over."""
    def handler(signum, _frame):
        raise Interrupted(f"{signal.Signals(signum).name} outside the training steps: stopped; a run with a "
                          f"checkpoint continues with 'txl train --resume {paths.root}'", signum=signum)

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
def _catch_signals() -> Iterator[dict[str, int]]:
    """Turn SIGINT/SIGTERM into a flag checked between steps (main thread only)."""
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


class Trainer:
    """One run: a model, its optimizer, the train stream and its memory, and the run folder."""

    def __init__(self, config: RunConfig, paths: RunPaths, data: PreparedData, *, progress: bool = True,
                 callbacks: tuple[Callable[[dict[str, Any]], None], ...] = ()) -> None:
        self.config, self.paths, self.data = config, paths, data
        self.progress = progress
        self.callbacks = callbacks
        tc = config.train
        self.device = resolve_device(tc.device)
        torch.manual_seed(tc.seed)
        self.model = TransformerXL(config.model).to(self.device)
        self.optimizer = configure_optimizer(self.model, tc)
        self.forward = torch.compile(self.model) if tc.compile else self.model
        self.stream = train_stream(config, data.splits)
        self.memory: Memory | None = None
        self.state = TrainingState()
        self.tb = None  # opened when training starts, so a refused resume leaves the folder untouched

    # -- bookkeeping ----------------------------------------------------------------------------------

    def _tensorboard(self):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception:  # noqa: BLE001 - TensorBoard is optional
            return None
        return SummaryWriter(str(self.paths.tensorboard))

    def _meta(self) -> dict[str, Any]:
        return {
            "config": config_to_dict(self.config),
            "model": config_to_dict(self.config.model),
            "vocab_fingerprint": self.data.vocab.fingerprint,
            "corpus_fingerprint": self.data.corpus.fingerprint,
        }

    def _log(self, record: dict[str, Any]) -> None:
        with open(self.paths.metrics, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
        if self.tb is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("step",) and math.isfinite(value):
                    self.tb.add_scalar(f"{record['split']}/{key}", value, record["step"])
        for callback in self.callbacks:
            callback(record)

    def save(self) -> Path:
        folder = self.paths.checkpoints / f"step-{self.state.step:08d}"
        self.state.stream = self.stream.state_dict()
        save_checkpoint(folder, model=self.model, optimizer=self.optimizer, memory=self.memory, state=self.state,
                        meta=self._meta())
        prune_checkpoints(self.paths.root, keep_last=self.config.train.keep_last)
        return folder

    def _save_best(self) -> None:
        self.state.stream = self.stream.state_dict()
        save_checkpoint(self.paths.checkpoints / "best", model=self.model, optimizer=self.optimizer,
                        memory=self.memory, state=self.state, meta=self._meta())

    def restore(self, folder: Path) -> None:
        """Continue from a checkpoint: weights, optimizer, memory, RNG, stream position, counters. The
        optimizer's betas and weight decay are then set from this run's config (which may override them)."""
        state, memory, document = load_checkpoint(folder, model=self.model, optimizer=self.optimizer,
                                                  expected=self._meta())
        set_hyperparameters(self.optimizer, self.config.train)
        self._warn_schedule_change(document, state.step)
        self.state = state
        if memory is not None and len(memory) > self.config.model.n_layer:  # saved before txl 0.2: drop the unread
            memory = Memory(memory.states[: self.config.model.n_layer])  # last layer's output
        self.memory = memory.to(self.device) if memory is not None else None
        try:
            self.stream.load_state_dict(state.stream)
        except ValueError as exc:
            raise RunError(f"{folder}: cannot resume the data stream ({exc})") from None
        _truncate_metrics(self.paths.metrics, state.step)

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
            changed = ", ".join(f"train.{k} {getattr(before, k)} -> {getattr(tc, k)}" for k in SCHEDULE_FIELDS
                                if getattr(before, k) != getattr(tc, k))
            warnings.warn(f"resuming at step {step} with {changed}: the learning rate jumps from {old:.6g} to "
                          f"{new:.6g} (the schedule is recomputed for the new settings)", ResumeWarning,
                          stacklevel=3)

    # -- evaluation -----------------------------------------------------------------------------------

    def evaluate(self, split: str, *, max_tokens: int | None = None) -> EvalResult | None:
        if split not in self.data.splits:
            return None
        ec, tc = self.config.eval, self.config.train
        return evaluate(self.model, self.data.splits[split], batch_size=ec.batch_size,
                        tgt_len=ec.tgt_len or tc.tgt_len, span=eval_span(self.config), device=self.device,
                        precision=tc.precision, max_tokens=max_tokens, progress=self.progress, desc=split)

    def _periodic_eval(self) -> bool:
        """Evaluate on the validation split; keep the best checkpoint. Returns True to stop early."""
        result = self.evaluate("valid", max_tokens=self.config.train.eval_tokens)
        if result is None:
            return False
        self._log({"step": self.state.step, "split": "valid", **result.as_dict()})
        if self.state.best_val_loss is None or result.loss < self.state.best_val_loss:
            self.state.best_val_loss = result.loss
            self.state.bad_evals = 0
            self._save_best()
        else:
            self.state.bad_evals += 1
        patience = self.config.train.patience
        return patience is not None and self.state.bad_evals >= patience

    # -- training -------------------------------------------------------------------------------------

    def _step(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """One optimizer step over a batch, carrying memory; returns the mean loss (a tensor)."""
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
            with torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=tc.precision == "bf16"):
                out = self.forward(inputs[part], memory=memory, targets=targets[part])
            loss = out.loss.float().sum()
            (loss / total).backward()
            loss_sum += loss.detach()
            if out.memory is not None:
                new_memory.append(out.memory)
        self.memory = Memory.cat_rows(new_memory) if new_memory else None
        if tc.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), tc.clip)
        return loss_sum / total

    def fit(self) -> dict[str, Any]:
        tc = self.config.train
        self.tb = self._tensorboard()
        self.model.train()
        batches = self.stream.batches()
        start_time = time.perf_counter() - self.state.elapsed
        window_tokens, window_seconds = 0, 0.0  # optimizer steps only: evaluations and saves excluded
        status = "completed"
        bar = tqdm(total=tc.steps, initial=self.state.step, disable=not self.progress, desc="train",
                   dynamic_ncols=True)
        with _catch_signals() as received:
            while self.state.step < tc.steps:
                step = self.state.step
                step_start = time.perf_counter()
                lr = schedule_lr(step, tc)
                set_lr(self.optimizer, lr)
                batch = next(batches).to(self.device)
                if batch.new_epoch:  # the rows start the split again: the memory holds its end
                    self.memory = None
                loss = self._step(batch.inputs, batch.targets)
                value = float(loss)
                if not math.isfinite(value):
                    last = latest_checkpoint(self.paths.root)
                    where = f"the last good checkpoint is {last}" if last else "no checkpoint was written yet"
                    raise TrainingDiverged(f"loss became {value} at step {step + 1}; stopped without saving ({where}); "
                                           "lower train.lr or set train.clip")
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                self.state.step = step + 1
                self.state.tokens += batch.targets.numel()
                window_tokens += batch.targets.numel()
                now = time.perf_counter()
                window_seconds += now - step_start
                self.state.train_seconds += now - step_start
                self.state.elapsed = now - start_time
                if self.state.step % tc.log_every == 0 or self.state.step == tc.steps:
                    train_tokens_per_s = window_tokens / max(window_seconds, 1e-9)
                    window_tokens, window_seconds = 0, 0.0
                    record = {"step": self.state.step, "split": "train", "loss": value, **metrics_from_loss(value),
                              "lr": lr, "tokens": self.state.tokens, "tokens_per_s": train_tokens_per_s,
                              "elapsed_s": self.state.elapsed}
                    self._log(record)
                    bar.set_postfix(loss=f"{value:.3f}", bpc=f"{record['bpc']:.3f}", ppl=f"{record['ppl']:.1f}",
                                    tok_s=f"{train_tokens_per_s:.0f}", lr=f"{lr:.2e}")
                bar.update(1)
                done = self.state.step == tc.steps
                out_of_time = tc.time_limit is not None and self.state.elapsed >= tc.time_limit * 60
                stop = False
                if (tc.eval_every and self.state.step % tc.eval_every == 0) and not done:
                    stop = self._periodic_eval()
                    self.model.train()
                    if stop:
                        status = "early_stopped"
                if done or stop or out_of_time or received or (
                        tc.checkpoint_every and self.state.step % tc.checkpoint_every == 0):
                    self.save()
                if received:
                    bar.close()
                    name = signal.Signals(received["signum"]).name
                    raise Interrupted(f"{name} at step {self.state.step}: checkpoint saved; continue with "
                                      f"'txl train --resume {self.paths.root}'", signum=received["signum"])
                if stop:
                    break
                if out_of_time:
                    status = "time_limit"
                    break
        bar.close()
        return self._finish(status)

    def _finish(self, status: str) -> dict[str, Any]:
        valid = self.evaluate("valid")
        if valid is not None:
            self._log({"step": self.state.step, "split": "valid", **valid.as_dict(), "final": True})
            if self.state.best_val_loss is None or valid.loss < self.state.best_val_loss:
                self.state.best_val_loss = valid.loss
                self._save_best()
        test = self.evaluate("test")  # reported in summary.json; metrics.jsonl holds train and valid only
        summary: dict[str, Any] = {
            "status": status,
            "steps": self.state.step,
            "tokens": self.state.tokens,
            "train_tokens_per_s": self.state.tokens / max(self.state.train_seconds, 1e-9),
            "elapsed_s": self.state.elapsed,
            "params": self.model.num_parameters(),
            "vocab_size": len(self.data.vocab),
            "best_val_loss": self.state.best_val_loss,
        }
        if valid is not None:
            summary.update(valid.as_dict("val_"))
        if test is not None:
            summary.update(test.as_dict("test_"))
        atomic_write_text(self.paths.summary, json.dumps(summary, indent=1) + "\n")
        if self.tb is not None:
            self.tb.close()
        return summary


def _truncate_metrics(path: Path, step: int) -> None:
    """Drop metric lines logged after ``step`` (written by a run killed after its last checkpoint) and the
    final evaluations (they are made again when the resumed run ends)."""
    if not path.exists():
        return
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut short by a kill
        if record.get("step", 0) <= step and not record.get("final"):
            kept.append(line)
    atomic_write_text(path, "".join(f"{line}\n" for line in kept))


def _missing_folders(path: Path) -> list[Path]:
    """The folders ``path.mkdir(parents=True)`` would create, deepest first."""
    missing = []
    while not path.exists() and path != path.parent:
        missing.append(path)
        path = path.parent
    return missing


@contextmanager
def _new_run_folder(paths: RunPaths, *, overwrite: bool) -> Iterator[None]:
    """Create the run folder (clearing an old run with ``overwrite``) and hold its lock. If anything fails
    before a checkpoint exists, remove what was written and the folders made, so the same command can run
    again."""
    created = _missing_folders(paths.root)
    paths.root.mkdir(parents=True, exist_ok=True)
    try:
        with lock_run(paths.root), _sigterm_raises(paths):
            check_new_run_dir(paths.root, overwrite=overwrite)  # again, now that no one else can start one
            clear_run(paths)
            try:
                yield
            except BaseException:
                if latest_checkpoint(paths.root) is None and best_checkpoint(paths.root) is None:
                    clear_run(paths)
                raise
    finally:
        for folder in created:
            try:
                folder.rmdir()
            except OSError:  # not empty: the run is there
                break


def train(config: RunConfig, out: Path, *, overwrite: bool = False, progress: bool = True,
          callbacks: tuple[Callable[[dict[str, Any]], None], ...] = ()) -> dict[str, Any]:
    """Train a new run in ``out`` and return its summary (also written to summary.json). The data is read
    and checked before anything is written; a start that fails before its first checkpoint leaves nothing."""
    paths = check_new_run_dir(out, overwrite=overwrite)
    data = prepare_data(config)
    config = dataclasses.replace(config, model=dataclasses.replace(config.model, vocab_size=len(data.vocab)))
    check_data(config, data)
    trainer = Trainer(config, paths, data, progress=progress, callbacks=callbacks)
    with _new_run_folder(paths, overwrite=overwrite):
        data.vocab.save(paths.vocab)
        atomic_write_text(paths.config, json.dumps(config_to_dict(config), indent=1) + "\n")
        return trainer.fit()


def _resume_config(saved: RunConfig, overrides: tuple[str, ...]) -> RunConfig:
    """The run's config with ``overrides`` applied; RunError naming every field a resume cannot change."""
    if not overrides:
        return saved
    config = apply_overrides(saved, overrides)
    before, after = config_to_dict(saved), config_to_dict(config)
    fixed = [("model", name) for name in before["model"]]
    fixed += [("data", name) for name in before["data"] if name not in RESUME_MOVABLE_DATA_FIELDS]
    fixed += [("train", name) for name in RESUME_FIXED_TRAIN_FIELDS]
    refused = [f"{section}.{name}: cannot be changed when resuming (the run has "
               f"{json.dumps(before[section][name])}, asked {json.dumps(after[section][name])})"
               for section, name in fixed if before[section][name] != after[section][name]]
    if refused:
        raise RunError("; ".join(refused))
    return config


def _resume_point(paths: RunPaths) -> Path:
    """The newest intact checkpoint (step folders and best, by step). Damaged newer ones are skipped with a
    ResumeWarning; DamagedCheckpoint when none is intact, RunError when there is none."""
    ranked, damaged = [], []
    for folder in (*list_checkpoints(paths.root), best_checkpoint(paths.root)):
        if folder is None:
            continue
        try:
            ranked.append((checkpoint_step(folder), folder.name != "best", folder))
        except DamagedCheckpoint as exc:
            damaged.append(str(exc))
    if not ranked and not damaged:
        raise RunError(f"{paths.root} has no checkpoint to resume from; start it again with --overwrite")
    for step, _, folder in sorted(ranked, key=lambda r: r[:2], reverse=True):
        try:
            verify_checkpoint(folder)
        except DamagedCheckpoint as exc:
            damaged.append(str(exc))
            continue
        if damaged:
            warnings.warn(f"{'; '.join(damaged)}; resuming from the newest intact checkpoint {folder.name} "
                          f"(step {step})", ResumeWarning, stacklevel=3)
        return folder
    raise DamagedCheckpoint(f"{'; '.join(damaged)}; no intact checkpoint to resume from")


def resume(run_dir: Path, *, overrides: tuple[str, ...] = (), progress: bool = True,
           callbacks: tuple[Callable[[dict[str, Any]], None], ...] = ()) -> dict[str, Any]:
    """Continue a run from its newest intact checkpoint. ``overrides`` may change train (except
    RESUME_FIXED_TRAIN_FIELDS), eval and generate fields; config.json then records them. Nothing in the run
    folder changes before every check has passed."""
    paths = RunPaths(Path(run_dir))
    if not paths.root.is_dir():
        raise RunError(f"run folder not found: {paths.root}")
    with lock_run(paths.root), _sigterm_raises(paths):
        config = _resume_config(load_run_config(paths.root), tuple(overrides))
        recover_checkpoints(paths.root)
        folder = _resume_point(paths)
        done = checkpoint_step(folder)
        if paths.summary.exists() and done >= config.train.steps:
            raise RunError(f"{paths.root} already finished {done} steps; to train longer resume with "
                           f"--set train.steps=N (N > {done})")
        if not paths.vocab.is_file():
            raise RunError(f"{paths.root} has no vocab.json")
        data = prepare_data(config, vocab=load_vocab(paths.vocab))
        check_data(config, data)
        trainer = Trainer(config, paths, data, progress=progress, callbacks=callbacks)
        trainer.restore(folder)  # checks everything before anything in the run folder changes
        if overrides:
            atomic_write_text(paths.config, json.dumps(config_to_dict(config), indent=1) + "\n")
        return trainer.fit()
