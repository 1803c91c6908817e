"""One training loop for every family: the task supplies batches and the model computes the loss.

    for each optimizer step:
        grad_accum micro-batches -> forward (fp32, bf16 autocast or a bf16 copy: precision.py)
        -> loss x (its targets / all targets) -> backward: gradients of the mean loss over every target of the step
        loss or gradient norm not finite?  stop: the last checkpoint stays as it is
        clip the gradient norm -> set the scheduled learning rate -> AdamW step
        every eval_every steps: evaluate, plot, checkpoint (keep the last N and the best)
        SIGINT / SIGTERM: finish the step, checkpoint, return (a second: stop at once, naming the last checkpoint)

A run stopped and resumed continues bit for bit (on CPU in fp32): weights, optimizer moments, the global RNG
states (dropout) and the task's position in its data are all in the checkpoint, and evaluation runs under a
forked RNG so it never shifts the training randomness.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import os
import signal
import sys
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from attnkit.chat_format import DEFAULT_FORMAT, ChatTemplate
from attnkit.checkpoint import INSTRUMENTS_KIND, METRICS_FILE, checkpoint_dirs
from attnkit.config import ModelConfig, check_types
from attnkit.errors import AttnkitError, ConfigError
from attnkit.layers.embedding import inputs_checked
from attnkit.machine import CpuCapabilities
from attnkit.options import duration
from attnkit.tasks import TrainingTask as Task
from attnkit.tokenize import Tokenizer
from attnkit.train.distributed import SingleProcess
from attnkit.train.finetune import Freeze, check_freeze
from attnkit.train.instruments import gradient_norms, measure_activations
from attnkit.train.lora import DEFAULT_TARGETS
from attnkit.train.metrics import MetricsLog
from attnkit.train.optim import SCHEDULES, Schedule, lr_factor, make_optimizer
from attnkit.train.plan import TrainAttention, TrainCompile, TrainingPlan, plan_training
from attnkit.train.plots import plot_losses
from attnkit.train.precision import TrainDType, check_dtype
from attnkit.train.rundir import owning
from attnkit.train.state import (
    CHECKPOINTS_DIR,
    Checkpoint,
    capture_rng,
    checkpoint_name,
    later_best,
    mend_best,
    remove_checkpoints_after,
    save_checkpoint,
)
from attnkit.train.tensorboard import LOGGERS, Logger, TensorBoardLog

log = logging.getLogger(__name__)

PLOT_FILE = "plots/loss.png"


class TrainingDiverged(AttnkitError):
    """The loss or the gradient norm stopped being a finite number."""


@dataclass(frozen=True)
class TrainConfig:
    """How to train (the model's shape is `ModelConfig`'s business). Every field is a `--set` key.

    Raises:
        ConfigError: on a value out of range, naming the field and a sensible value.
    """

    max_steps: int = 1000  # optimizer steps; also the horizon of the cosine schedule
    max_time: float | None = field(default=None, metadata={"parse": duration, "metavar": "DURATION"})
    """stop after this much training time (all sessions of a resumed run together), e.g. 300, 90s, 5m, 1h; the cosine
    schedule then ends when either budget does. None: no limit"""
    batch_size: int = 16  # sequences per micro-batch
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3  # peak learning rate
    schedule: Schedule = "cosine"
    """cosine: warmup, then cosine decay to lr * min_lr_ratio; noam: Vaswani et al.'s warmup, then 1/sqrt(step);
    constant: warmup, then flat"""
    warmup: int = 100  # steps of linear warmup
    min_lr_ratio: float = 0.1  # cosine ends at lr * min_lr_ratio
    weight_decay: float = 0.1  # on weight matrices only
    beta1: float = 0.9  # AdamW's decay rate of the gradient's running mean
    beta2: float = 0.95  # AdamW's decay rate of the squared gradient's running mean
    clip: float = 1.0  # max gradient norm; 0 disables clipping
    dtype: TrainDType = "fp32"  # bf16: autocast; bf16-master: a bf16 model with fp32 master weights (precision.py)
    compile: TrainCompile = field(default="auto", metadata={"const": "model"})
    """auto: the whole model on a GPU, eager on a CPU (the training plan says why: attnkit train --explain); model:
    the whole model (bare --compile); blocks: each transformer block; off: eager"""
    float8: bool = False  # bf16 on a Hopper or Ada GPU: the blocks' products in float8 (torchao; the training plan)
    attention_kernel: TrainAttention = "auto"
    """auto: the training plan picks per variant (FlexAttention for ALiBi, windows, soft-capping and packed documents
    on a GPU; SDPA; the reference path for what neither expresses); sdpa: never FlexAttention; flex: FlexAttention (a
    GPU)"""
    eval_every: int = 200  # steps between evaluations (each also writes a checkpoint)
    log_every: int = 10  # steps between progress lines when no progress bar is shown
    keep: int = 3  # checkpoints kept besides best/
    average_last: int = 0  # > 0: at the end, the mean of the last N checkpoints goes to RUN/average-last-N
    seed: int = 1337  # seed of initialisation, data order and dropout
    # Fine-tuning (train/finetune.py, train/lora.py): a new run starting from trained weights
    init_from: str | None = None  # an attnkit run directory or a Hugging Face model directory; None: random weights
    freeze: Freeze = "none"  # body: train the task head only; embeddings: freeze the embedding tables
    lora_rank: int = 0  # > 0: train rank-r LoRA adapters (and a fresh head) only (Hu et al. 2021); 0: off
    lora_alpha: float = 16.0  # the adapters' update is scaled by lora_alpha / lora_rank
    lora_targets: tuple[str, ...] = field(default=DEFAULT_TARGETS, metadata={"sep": ",", "metavar": "NAME"})
    """linear modules to adapt: last name parts or globs, e.g. q_proj,v_proj"""
    lora_dropout: float = 0.0  # dropout on the adapters' input
    # Several processes (torchrun; train/distributed.py): batch_size is per rank, the global batch N times larger
    shard: bool = False  # FSDP2: shard weights, gradients and AdamW state over the ranks; off: DDP (whole replicas)
    dist_timeout: float = 600.0  # seconds a rank waits for the others in a collective before the job fails
    # Looking inside (train/instruments.py): per-layer attention entropy, residual and gradient norms per evaluation
    instruments: bool = True  # log them to metrics.jsonl at each evaluation (attnkit viz --run draws them)
    logger: Logger = "jsonl"  # tensorboard: also write every metric to RUN/tensorboard/ (optional extra)

    def __post_init__(self) -> None:
        check_types(self)  # a string for a number or a boolean is an error naming the field, never truthy
        for name in ("max_steps", "batch_size", "grad_accum", "eval_every", "log_every", "keep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name}={value!r} must be a positive integer")
        if isinstance(self.average_last, bool) or not isinstance(self.average_last, int) or not (
                0 <= self.average_last <= self.keep):
            raise ConfigError(f"average_last={self.average_last!r} must lie in 0..keep ({self.keep}): only the kept "
                              "checkpoints can be averaged; raise keep")
        if self.max_time is not None and not self.max_time > 0:
            raise ConfigError(f"max_time={self.max_time} must be a positive number of seconds (or unset)")
        if not (isinstance(self.lr, (int, float)) and math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"lr={self.lr!r} must be a positive number (1e-3 suits small models)")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule={self.schedule!r} is not known; choose one of {', '.join(SCHEDULES)}")
        check_dtype(self.dtype)
        if isinstance(self.warmup, bool) or not isinstance(self.warmup, int) or self.warmup < 0:
            raise ConfigError(f"warmup={self.warmup!r} must be a whole number of steps >= 0")
        if self.schedule == "noam" and self.warmup == 0:
            raise ConfigError("schedule='noam' needs warmup >= 1 (Vaswani et al. used 4000 steps)")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio={self.min_lr_ratio} must lie in [0, 1] (0.1 is usual)")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must lie in [0, 1) (AdamW: 0.9 and 0.95-0.999)")
        for name in ("weight_decay", "clip"):  # nan or inf would turn every weight into nan
            if not 0 <= getattr(self, name) < math.inf:
                raise ConfigError(f"{name}={getattr(self, name)} must be a finite number >= 0 (0 disables it)")
        check_freeze(self.freeze)
        if isinstance(self.lora_rank, bool) or not isinstance(self.lora_rank, int) or self.lora_rank < 0:
            raise ConfigError(f"lora_rank={self.lora_rank!r} must be a whole number >= 0 (0: no LoRA; 8 is usual)")
        if not (isinstance(self.lora_alpha, (int, float)) and 0 < self.lora_alpha < math.inf):
            raise ConfigError(f"lora_alpha={self.lora_alpha!r} must be positive (16 is usual; the scale is alpha/rank)")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ConfigError(f"lora_dropout={self.lora_dropout} must lie in [0, 1)")
        if not isinstance(self.shard, bool):
            raise ConfigError(f"shard={self.shard!r} must be true or false")
        if not (isinstance(self.dist_timeout, (int, float)) and 0 < self.dist_timeout < math.inf):
            raise ConfigError(f"dist_timeout={self.dist_timeout!r} must be a positive number of seconds (600 is usual)")
        if (self.lora_rank or self.freeze != "none") and not self.init_from:
            raise ConfigError("lora_rank and freeze adapt trained weights: give --init-from RUN_DIR|HF_DIR too")
        if not isinstance(self.instruments, bool):
            raise ConfigError(f"instruments={self.instruments!r} must be true or false")
        if self.logger not in LOGGERS:
            raise ConfigError(f"logger={self.logger!r} is not known; choose one of {', '.join(LOGGERS)}")

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        data = check_fields(cls, data, "training")
        if isinstance(data.get("compile"), bool):  # runs saved when compile was on/off: per block, or eager
            data = {**data, "compile": "blocks" if data["compile"] else "off"}
        if isinstance(data.get("lora_targets"), (list, str)):  # JSON has lists; --set lora_targets=q_proj,v_proj
            targets = data["lora_targets"]
            data = {**data, "lora_targets": tuple(targets.split(",") if isinstance(targets, str) else targets)}
        return cls(**data)


def scheduled_lr(settings: TrainConfig, step: int, elapsed: float) -> float:
    """The learning rate of optimizer step `step` (1-based) after `elapsed` seconds of training: the peak `lr` times
    the schedule's factor, whose progress is the share of the budget after warmup used, by steps or by time when
    that runs out first."""
    s = settings
    fraction = (step - s.warmup) / max(s.max_steps - s.warmup, 1)
    if s.max_time is not None:
        fraction = max(fraction, elapsed / s.max_time)
    return s.lr * lr_factor(s.schedule, step, warmup=s.warmup, progress=fraction, min_lr_ratio=s.min_lr_ratio)


def check_fields(cls: type, data: dict[str, Any], what: str) -> dict[str, Any]:
    """`data` itself, once every key is known to be a field of dataclass `cls` (else a ConfigError naming them)."""
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"unknown {what} setting(s) {unknown}; known settings are {sorted(known)}")
    return data


@dataclass
class TrainResult:
    """How a call to `Trainer.fit` ended. `reason`: "max_steps", "max_time", "stop_at" or "signal"."""

    step: int
    reason: str
    checkpoint: Path
    evaluation: dict[str, float]  # the latest evaluation's results (empty when none ran)
    elapsed: float  # seconds of training, all sessions together
    tokens_per_second: float  # in this session
    signal: int | None = None


class Trainer:
    """Trains `model` on `task`, checkpointing into `run_dir` (layout in `attnkit.train.state`).

    `run_info` is saved in every train_state.json beside the trainer's own state (the job's data settings, so
    a resumed run can rebuild its data); `labels` (classification) is saved as labels.json. `parallel` is this
    rank's part in several processes (`distributed.start`; its task draws global batches); None: one process.
    `plan`: how each step runs (`train/plan.py`); None: the plan for this model, device and `settings`.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        config: ModelConfig,
        task: Task,
        settings: TrainConfig,
        run_dir: str | Path,
        tokenizer: Tokenizer,
        labels: list[str] | None = None,
        device: torch.device | str = "cpu",
        run_info: dict[str, Any] | None = None,
        progress: bool | None = None,
        parallel: SingleProcess | None = None,
        plan: TrainingPlan | None = None,
        chat_template: ChatTemplate = DEFAULT_FORMAT,
    ) -> None:
        self.device = torch.device(device)
        self.model = model.to(self.device)  # fp32: what the optimizer updates and checkpoints save
        self.parallel = parallel or SingleProcess(device=self.device)
        self.precision = self.parallel.precision(settings.dtype, self.model)
        self.plan = plan or plan_training(
            self.precision.compute_model, family=config.family, device=self.device, dtype=settings.dtype,
            compile=settings.compile, log_every=settings.log_every, sharded=self.parallel.shards,
            float8=settings.float8, batch_tokens=settings.batch_size * getattr(config, "max_seq_len", 0),
            attention=settings.attention_kernel, packed=getattr(task, "packed", False),
            padded=getattr(task, "padded", False), ranks=self.parallel.size)
        self.plan.prepare(self.precision.compute_model)
        departures = [c.departure() for c in self.plan.choices if c.asked is not None]
        for departure in departures if self.parallel.writes else []:  # an option given and not followed is said
            log.warning(departure)
        # DDP: a wrapper that reduces gradients; FSDP2: the model itself, sharded (so before the optimizer is made)
        self.eager_model = self.parallel.wrap(self.precision.compute_model, dtype=settings.dtype, seed=settings.seed)
        # compiled whole: a model torch cannot compile trains eagerly, said once (`train_step`)
        self.train_model = self.plan.compiled(self.eager_model, self.precision.compute_model)
        if settings.schedule != "noam" and settings.warmup >= settings.max_steps and self.parallel.writes:
            log.warning("--warmup %d covers all %d steps: the learning rate rises to %.2g of --lr and never decays; "
                        "give --warmup below --max-steps (a tenth of it is usual)", settings.warmup,
                        settings.max_steps, settings.max_steps / settings.warmup)
        if settings.dtype != "fp32" and self.device.type == "cpu" and self.parallel.writes:
            warning = bf16_cost_warning(CpuCapabilities.detect())
            if warning:
                log.warning(warning)
        self.config, self.task, self.settings = config, task, settings
        self.run_dir = Path(run_dir)
        self.tokenizer, self.labels, self.run_info = tokenizer, labels, run_info or {}
        self.chat_template = chat_template  # kept beside the tokenizer, where `attnkit serve` reads it
        self.progress = shows_progress(progress) and self.parallel.writes
        self.optimizer = make_optimizer(
            model, lr=settings.lr, weight_decay=settings.weight_decay, betas=(settings.beta1, settings.beta2)
        )
        mirror = TensorBoardLog(self.run_dir) if settings.logger == "tensorboard" and self.parallel.writes else None
        self.metrics = MetricsLog(self.run_dir / METRICS_FILE, mirror=mirror)
        self.step = 0
        self.elapsed = 0.0
        self.tokens_seen = 0
        self.best: float | None = None
        self.best_step: int | None = None  # the step whose evaluation scored `best` (best/ holds its model)
        self.evaluation: dict[str, float] = {}
        self.evaluated_step = self.saved_step = -1
        self.layer_grad_norms: dict[str, float] = {}  # taken at the step before each evaluation
        self.unread: list[_UnreadStep] = []  # steps whose loss and gradient norm the host has not read yet
        self.last_record: dict[str, Any] | None = None  # the latest step's metrics record read

    # Resuming ------------------------------------------------------------------------------------------------
    def restore(self, checkpoint: Checkpoint, *, own_run: bool = True, named: bool = False) -> None:
        """Continue from `checkpoint` (loaded with `state.load_checkpoint`, its model being `self.model`). `own_run`
        False: the checkpoint belongs to another run directory, and this one's best/ and checkpoints start from its
        own evaluation (the first writes best/; a run with nothing left to train evaluates and saves once). `named`:
        --resume named the checkpoint by path (not its run), which forks the run there."""
        state = checkpoint.train_state
        self.parallel.load_optimizer(self.optimizer, checkpoint.optimizer, source=str(checkpoint.path))
        self.step, self.elapsed = int(state["step"]), float(state["elapsed"])
        self.tokens_seen, self.best = int(state["tokens_seen"]), state["best"]
        self.best_step = state.get("best_step")
        self.evaluation = state["evaluation"]
        self.evaluated_step, self.saved_step = int(state["evaluated_step"]), self.step
        self.precision.weights_to_compute()
        self.parallel.restore_rng(state, seed=self.settings.seed)
        self.task.load_data_state(state["data"])
        # best/ saved after this step (resumed past damaged checkpoints, or forked from an earlier one by path) is
        # the best model the run has made: it stays, and only a better score of the continued run replaces it
        kept = later_best(self.run_dir, self.step)
        if kept is not None:
            self.best, self.best_step = kept["best"], kept["step"]
            log.info("kept best/ (step %d, %s %s)%s: the run replaces it only with a better score", kept["step"],
                     self.task.metric, _fmt(kept["best"]),
                     f", though the run goes on from the earlier step {self.step}" if named else "")
        if self.parallel.writes:
            removed = remove_checkpoints_after(self.run_dir, self.step, keep_best=kept is not None)
            for path in removed:  # first: a kill leaves a resumable run
                log.warning("removed %s: the run continues from step %d, before it", path, self.step)
            self.metrics.truncate_after(self.step)  # and its mirror's (TensorBoard's) records
            if kept is None and mend_best(self.run_dir, checkpoint.path):
                log.warning("copied %s to best/: it holds the run's best score, and the save that wrote it stopped "
                            "before best/ took its copy", checkpoint.path)
        if not own_run:
            self.best, self.best_step, self.evaluated_step, self.saved_step = None, None, -1, -1
        saved_ranks = state.get("ranks", 1)
        if saved_ranks != self.parallel.size:
            log.warning("the run was saved by %d process(es) and continues in %d: the global batch is now %d "
                        "sequences per step", saved_ranks, self.parallel.size,
                        self.settings.batch_size * self.settings.grad_accum * self.parallel.size)
        log.info("resumed from %s at step %d", checkpoint.path, self.step)
        if self.step >= self.settings.max_steps:
            log.warning("the run is at step %d, --max-steps %d: nothing is left to train; give --max-steps above %d "
                        "to train on", self.step, self.settings.max_steps, self.step)
        elif self.settings.max_time is not None and self.elapsed >= self.settings.max_time:
            log.warning("the run has trained %.1f s, --max-time %gs: nothing is left to train; give a longer "
                        "--max-time (it counts every session of the run) to train on", self.elapsed,
                        self.settings.max_time)
        else:  # a step will train: say where its rate jumps, if it does
            self._say_schedule_change(TrainConfig.from_dict(state["settings"]))

    def _say_schedule_change(self, saved: TrainConfig) -> None:
        """Warn when the resumed settings (a longer --max-steps, another --lr or schedule) move the learning rate of
        the next step away from where the run's own schedule had it: the rate jumps there at once."""
        step = self.step + 1
        before, after = scheduled_lr(saved, step, self.elapsed), scheduled_lr(self.settings, step, self.elapsed)
        if not math.isclose(before, after, rel_tol=0.01):
            log.warning("the learning rate of step %d is %.3g under the resumed settings, where the run's own schedule "
                        "had %.3g: it jumps there at once (the schedule is a function of the step and the settings)",
                        step, after, before)

    # The loop -------------------------------------------------------------------------------------------------
    def fit(self, *, stop_at: int | None = None) -> TrainResult:
        """Train until `max_steps`, `max_time`, step `stop_at` (then checkpoint, as for a signal) or a signal.

        Raises:
            TrainingDiverged: when the loss or gradient norm is NaN or infinite; nothing is saved for that step.
        """
        s = self.settings
        session_start, elapsed_before, tokens_before = time.perf_counter(), self.elapsed, self.tokens_seen
        self.train_model.train()
        owner = owning(self.run_dir) if self.parallel.writes else nullcontext()  # one process per run directory
        with (owner, _StopOnSignal() as stop, logging_redirect_tqdm(), self.plan.matmul_precision(),
              _progress_bar(self, enabled=self.progress) as bar):
            meter = _Meter(self.step, self.tokens_seen)
            reason = None
            try:
                while reason is None:
                    reason = self._why_stop(stop_at, stop)
                    if reason is not None:
                        break
                    self.train_step()
                    self.elapsed = elapsed_before + time.perf_counter() - session_start
                    meter.update(self.step, self.tokens_seen)
                    self._report(meter, bar)
                    if self.step % s.eval_every == 0 and self.step < s.max_steps:
                        self._evaluate_and_save()
                        meter.restart(self.step, self.tokens_seen)  # evaluation time is not training speed
                self._read_steps()
                if reason in ("max_steps", "max_time") and self.evaluated_step != self.step:
                    self._evaluate_and_save()
                elif self.saved_step != self.step:
                    self._save(best=False)
                    self._plot()
            except RuntimeError as err:  # a failed collective: another rank died or hangs
                lost = self.parallel.lost(err, saved_step=self.saved_step, run_dir=self.run_dir)
                if lost is None:
                    raise
                raise lost from None
            except KeyboardInterrupt:  # a second signal: no save, so say which checkpoint the resume starts from
                if self.parallel.writes:
                    self._say_interrupted(stop.signum)
                raise
        session = time.perf_counter() - session_start
        checkpoint = self.run_dir / CHECKPOINTS_DIR / checkpoint_name(self.step)
        if reason == "signal" and self.parallel.writes:
            log.warning(
                "stopped by %s after step %d; saved %s. Resume with: %s",
                signal.Signals(stop.signum).name, self.step, checkpoint, self.parallel.resume_command(self.run_dir),
            )
        return TrainResult(
            step=self.step,
            reason=reason,
            checkpoint=checkpoint,
            evaluation=self.evaluation,
            elapsed=self.elapsed,
            tokens_per_second=(self.tokens_seen - tokens_before) / max(session, 1e-9),
            signal=stop.signum,
        )

    def _say_interrupted(self, first: int | None) -> None:
        """Log, for a run a second signal stopped at once (nothing saved), the checkpoint a resume continues from, bit
        for bit: the newest complete one on disk, which a save cut short may have finished."""
        how = f"a second {signal.Signals(first).name}" if first else "an interrupt"
        saved = checkpoint_dirs(self.run_dir)
        if not saved:
            log.warning("stopped at once by %s after step %d, before any checkpoint was written: nothing to resume; "
                        "start again", how, self.step)
        else:
            log.warning("stopped at once by %s after step %d, unsaved; the last checkpoint is %s. Resume with: %s",
                        how, self.step, saved[-1], self.parallel.resume_command(self.run_dir))

    def _why_stop(self, stop_at: int | None, stop: _StopOnSignal) -> str | None:
        out_of_time = self.settings.max_time is not None and self.elapsed >= self.settings.max_time
        # every rank stops after the same step: a signal to any rank, or any rank's clock, stops them all
        signum, out_of_time = self.parallel.max(stop.signum or 0, float(out_of_time))
        if signum:
            stop.signum = int(signum)
            return "signal"
        if self.step >= self.settings.max_steps:
            return "max_steps"
        if stop_at is not None and self.step >= stop_at:
            return "stop_at"
        if out_of_time:
            return "max_time"
        return None

    def train_step(self) -> None:
        """One optimizer step over `grad_accum` micro-batches, as `fit` takes it (benchmarks time it alone); its loss
        and gradient norm are read (and its metrics record written) at the plan's next host read."""
        s = self.settings
        # several ranks: this rank's rows of each global batch; `counts` 0 marks a stand-in row (distributed.py)
        batches, counts = zip(*(self.parallel.share(self.task.next_batch()) for _ in range(s.grad_accum)), strict=True)
        weights = [self.task.weight(b) * c for b, c in zip(batches, counts, strict=True)]
        (total,) = self.parallel.sum(sum(weights))  # every rank's targets
        step = self.step + 1
        lr = scheduled_lr(s, step, self.elapsed)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        tokens = sum(self.task.n_tokens(b) * c for b, c in zip(batches, counts, strict=True))
        try:
            losses = self._accumulate(batches, weights, total)
        except torch._dynamo.exc.TorchDynamoException as err:  # tracing or compiling failed (no public class)
            if self.train_model is self.eager_model:
                raise
            log.warning("training runs eagerly: torch.compile failed on the model (%s: %s)", type(err).__name__,
                        str(err).splitlines()[0] if str(err) else "")
            self.train_model = self.eager_model
            self.optimizer.zero_grad(set_to_none=True)
            losses = self._accumulate(batches, weights, total)
        if s.instruments and (step % s.eval_every == 0 or step >= s.max_steps):
            self.layer_grad_norms = gradient_norms(self.model)  # before clipping, as the total norm below
        grad_norm = self.parallel.clip_grad_norm(self.model, s.clip if s.clip > 0 else math.inf)
        self.unread.append(_UnreadStep(step, lr, tokens, losses, grad_norm))
        if step % self.plan.sync_every == 0:
            self._read_steps()  # before the update: a non-finite step found here is never applied
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.precision.weights_to_compute()
        self.step = step

    def _accumulate(self, batches: tuple, weights: list[float], total: float) -> list[MicroBatchLoss]:
        """Forward and backward over the micro-batches, gradients summed; each micro-batch's loss (on the device), its
        share of the step's targets and the task's metrics of it (a task's optional `loss_and_metrics`)."""
        losses = []
        loss_and_metrics = getattr(self.task, "loss_and_metrics", None)
        for index, (batch, weight) in enumerate(zip(batches, weights, strict=True)):
            batch = self.plan.to_device(batch)
            # gradients are reduced over the ranks in the last micro-batch's backward only
            with self.parallel.sync(self.train_model, last=index == len(batches) - 1):
                with self.precision.context(), inputs_checked():
                    loss, metrics = (loss_and_metrics(self.train_model, batch) if loss_and_metrics is not None
                                     else (self.task.loss(self.train_model, batch), {}))
                # x ranks: DDP and FSDP average the ranks' gradients, and this makes the average their sum
                scale = weight / total * self.parallel.size
                (loss * scale if scale != 1 else loss).backward()
            self.precision.gradients_to_model()
            losses.append((loss.detach(), weight / total, metrics))
        return losses

    def _read_steps(self) -> None:
        """Read the steps not yet read (one wait for the device), log their records and stop on a non-finite loss
        or gradient norm. Every rank reads at the same steps, and sums over the ranks before deciding."""
        if not self.unread:
            return
        steps, self.unread = self.unread, []
        # once the last is ready all are: reading them one by one waits for the device once
        losses = [sum(float(loss) * share for loss, share, _ in u.losses) for u in steps]
        names = sorted({name for u in steps for _, _, metrics in u.losses for name in metrics})  # alike on every rank
        shared = [sum(float(metrics[name]) * share for _, share, metrics in u.losses) for u in steps for name in names]
        grad_norms = [float(u.grad_norm) for u in steps]
        summed = self.parallel.sum(*losses, *(u.tokens for u in steps), *shared)  # every rank's shares and tokens
        n, k = len(steps), len(names)
        losses, tokens_read, metrics_read = summed[:n], summed[n : 2 * n], summed[2 * n :]
        task_metrics = [dict(zip(names, metrics_read[i * k : (i + 1) * k], strict=True)) for i in range(n)]  # by step
        for u, loss, grad_norm, tokens, extra in zip(steps, losses, grad_norms, tokens_read, task_metrics, strict=True):
            if not math.isfinite(loss):  # after the reduction, so that every rank stops at once
                self._diverged("loss", loss, u.step, u.lr)
            if not math.isfinite(grad_norm):
                self._diverged("gradient norm", grad_norm, u.step, u.lr)
            self.tokens_seen += int(tokens)
            self.last_record = {"kind": "train", "step": u.step, "loss": loss, "lr": u.lr, "grad_norm": grad_norm,
                                "tokens": self.tokens_seen, **extra}
            if self.parallel.writes:
                self.metrics.append(self.last_record)

    def _diverged(self, what: str, value: float, step: int, lr: float) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.saved_step >= 0:
            kept = f"the last good checkpoint (step {self.saved_step}) is in {self.run_dir}"
            again = f"then resume with `{self.parallel.resume_command(self.run_dir)}` or start afresh"
        else:
            kept, again = "no checkpoint had been written yet", "then start again"
        raise TrainingDiverged(
            f"the {what} became {value} at step {step} (learning rate {lr:.3g}); training stopped and {kept}. "
            f"Lower --lr, lengthen --warmup, keep --clip on or train in --dtype fp32, {again}"
        )

    # Evaluation and checkpoints ------------------------------------------------------------------------------
    def _evaluate_and_save(self) -> None:
        self._read_steps()
        model = self.precision.compute_model
        model.eval()
        devices = [self.device] if self.device.type == "cuda" else []
        instruments = measure_activations(model) if self.settings.instruments else nullcontext()
        with torch.random.fork_rng(devices=devices), torch.no_grad(), self.precision.context(), instruments as inside:
            self.evaluation = {k: float(v) for k, v in self._evaluate(model).items()}
        model.train()
        self.evaluated_step = self.step
        if self.parallel.writes:
            self.metrics.append({"kind": "eval", "step": self.step, **self.evaluation})
            if inside is not None:
                self.metrics.append({"kind": INSTRUMENTS_KIND, "step": self.step, **inside.summary(),
                                     **self.layer_grad_norms})
        self.layer_grad_norms = {}
        log.info("step %d: %s", self.step, "  ".join(f"{k} {_fmt(v)}" for k, v in self.evaluation.items()))
        score = self.evaluation[self.task.metric]
        better = (self.best is None or math.isnan(self.best)  # a NaN best (a first score of NaN) is beaten by any
                  or (score > self.best if self.task.higher_is_better else score < self.best))
        if better:
            self.best, self.best_step = score, self.step
        self._save(best=better)
        self._plot()

    def _evaluate(self, model: nn.Module) -> dict[str, Any]:
        """The task's evaluation; with several ranks, each scores its share of the validation set when the task
        takes a `shard` (`attnkit.tasks.common.Shard`), else every rank scores all of it."""
        if self.parallel.size > 1 and "shard" in inspect.signature(self.task.evaluate).parameters:
            return self.task.evaluate(model, shard=self.parallel)
        return self.task.evaluate(model)

    def _plot(self) -> None:
        if not self.parallel.writes:
            return
        plot_losses(self.metrics.records(), self.run_dir / PLOT_FILE, title=f"{self.task.name}: {self.run_dir.name}")

    def _save(self, *, best: bool) -> None:
        self._read_steps()  # nothing is saved past a step whose loss was not finite
        state = {
            "step": self.step,
            "elapsed": self.elapsed,
            "tokens_seen": self.tokens_seen,
            "best": self.best,
            "best_step": self.best_step,
            "metric": self.task.metric,
            "evaluation": self.evaluation,
            "evaluated_step": self.evaluated_step,
            "rng": capture_rng(),
            "ranks": self.parallel.size,
            "rank_rng": self.parallel.rng_states()[1:],  # ranks 1.. (dropout); the data position is shared
            "data": self.task.data_state(),
            "settings": self.settings.to_dict(),
            **self.run_info,
        }
        whole = self.parallel.full_copy(self.model, self.optimizer)  # FSDP2: gathered on rank 0; None elsewhere
        if whole is not None:
            save_checkpoint(
                self.run_dir, model=whole[0], config=self.config, optimizer=whole[1], tokenizer=self.tokenizer,
                task={"task": self.task.name, **getattr(self.task, "record", {})}, train_state=state,
                labels=self.labels, keep=self.settings.keep, best=best, chat_template=self.chat_template,
            )
            self.saved_step = self.step  # whole on disk: if the barrier fails, this is the checkpoint to name
        self.parallel.barrier()  # no rank goes on (or exits) before rank 0 has written
        self.saved_step = self.step

    # Progress ------------------------------------------------------------------------------------------------
    def _report(self, meter: _Meter, bar: tqdm) -> None:
        """The progress bar (or a log line every log_every steps), with the latest step read from the device."""
        record = self.last_record
        if record is None:
            return
        eta = meter.eta(self.step, self.settings.max_steps, self.elapsed, self.settings.max_time)
        fields = {"loss": f"{record['loss']:.4f}", "lr": f"{record['lr']:.2e}",
                  "tok/s": f"{meter.tokens_per_second:,.0f}", "eta": _clock(eta)}
        if bar.disable:
            if self.step % self.settings.log_every == 0:
                log.info("step %d/%d  %s", self.step, self.settings.max_steps,
                         "  ".join(f"{k} {v}" for k, v in fields.items()))
        else:
            bar.update(self.step - bar.n)
            bar.set_postfix(fields, refresh=False)


MicroBatchLoss = tuple[Tensor, float, dict[str, Tensor]]
"""A micro-batch's mean loss, its share of this rank's targets, and the task's metrics of it (0-dim tensors, means
over its targets as the loss: DPO's rewards/*), which the step's record logs beside the loss"""


@dataclass
class _UnreadStep:
    """A step whose loss (this rank's share) and gradient norm may still be on the device."""

    step: int
    lr: float
    tokens: int  # this rank's tokens
    losses: list[MicroBatchLoss]
    grad_norm: Tensor


class _Meter:
    """Tokens per second and steps per second since the last restart (after each evaluation)."""

    def __init__(self, step: int, tokens: int) -> None:
        self.restart(step, tokens)

    def restart(self, step: int, tokens: int) -> None:
        self.start, self.step0, self.tokens0 = time.perf_counter(), step, tokens
        self.tokens_per_second = self.steps_per_second = 0.0

    def update(self, step: int, tokens: int) -> None:
        seconds = max(time.perf_counter() - self.start, 1e-9)
        self.tokens_per_second = (tokens - self.tokens0) / seconds
        self.steps_per_second = (step - self.step0) / seconds

    def eta(self, step: int, max_steps: int, elapsed: float, max_time: float | None) -> float:
        """Seconds left: the remaining steps at the current speed, or the remaining time if sooner."""
        left = (max_steps - step) / self.steps_per_second if self.steps_per_second > 0 else math.inf
        return min(left, max_time - elapsed) if max_time is not None else left


def bf16_cost_warning(cpu: CpuCapabilities) -> str | None:
    """What bf16 training costs on a CPU without oneDNN's bf16 kernels (None where it has them): its matrix products
    take a slow path there, far slower than fp32's."""
    if cpu.onednn_bf16:
        return None
    return (f"--dtype bf16 on this CPU ({cpu.isa}, no AVX-512 BW/VL/DQ or AVX-NE-CONVERT): oneDNN has no bf16 kernels "
            "here, so bf16 matrix products take a slow path (python -m benchmarks speed measures the peaks); "
            "--dtype fp32 trains faster on this machine")


def shows_progress(progress: bool | None) -> bool:
    """A progress setting read: True or False as given; None (the default) when standard error is a terminal."""
    return sys.stderr.isatty() if progress is None else progress


def _progress_bar(trainer: Trainer, *, enabled: bool) -> tqdm:
    return tqdm(
        total=trainer.settings.max_steps, initial=trainer.step, disable=not enabled, unit="step", dynamic_ncols=True,
        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} [{elapsed}{postfix}]", desc=trainer.task.name,
    )


class _StopOnSignal:
    """While active, SIGINT and SIGTERM set `signum` (the loop stops after its step and saves) and say so at once on
    stderr, since a step or an evaluation can take a while; a second signal raises KeyboardInterrupt at once, and later
    ones are ignored, so that they cannot cut short the message that says where to resume. Handlers can only be
    installed from the main thread."""

    NOTICE = b"attnkit: stopping after this step and saving a checkpoint; a second ^C stops at once without saving\n"

    def __init__(self) -> None:
        self.signum: int | None = None
        self.interrupted = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopOnSignal:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.interrupted:
            return
        if self.signum is not None:
            self.interrupted = True
            raise KeyboardInterrupt
        self.signum = signum
        os.write(2, self.NOTICE)  # a raw write: logging's handlers may be mid-write in the interrupted frame

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def _fmt(value: float) -> str:
    return f"{value:.4f}" if abs(value) < 1000 else f"{value:.4g}"


def _clock(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "?"
    seconds = max(int(seconds), 0)
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"
