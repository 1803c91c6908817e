"""Training: one `Trainer` for the three families, the run directory that never loses work, and the job behind
`attnkit train`. What each task reads, batches and scores, its registration in `attnkit.tasks` says.

    optim.py     AdamW parameter groups; cosine, noam and constant schedules
    trainer.py   the loop: accumulation, clipping, evaluation, signals, non-finite stop
    precision.py fp32, bf16 autocast, or a bf16 model with fp32 master weights
    state.py     checkpoints (atomic, last N and best), RNG and optimizer state, resume
    metrics.py   metrics.jsonl
    plots.py     the loss-curve PNG
    job.py       from data paths and settings to a Trainer, new or resumed
"""

from attnkit.machine import pick_device
from attnkit.train.job import DataConfig, TrainRequest, prepare
from attnkit.train.state import Checkpoint, find_checkpoint, load_checkpoint, read_task, save_checkpoint
from attnkit.train.trainer import TrainConfig, Trainer, TrainingDiverged, TrainResult

__all__ = [
    "Checkpoint",
    "DataConfig",
    "TrainConfig",
    "TrainRequest",
    "TrainResult",
    "Trainer",
    "TrainingDiverged",
    "find_checkpoint",
    "load_checkpoint",
    "pick_device",
    "prepare",
    "read_task",
    "save_checkpoint",
]
