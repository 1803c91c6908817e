"""TensorBoard logging of the same records as metrics.jsonl (`logger="tensorboard"`), for people who live in it.

Each number of a record becomes a scalar at the record's step: `train/loss`, `eval/val_loss`, and the instruments
under their own names (`attention_entropy/decoder.causal.0`, `grad_norm/stack.1`, ...). Event files go to
RUN/tensorboard/; `tensorboard --logdir runs/` shows every run. A resumed run truncates metrics.jsonl after its
checkpoint's step, and has TensorBoard drop its events after that step too (SummaryWriter's `purge_step`), so a
run resumed from an earlier checkpoint shows one history in both.

The `tensorboard` package is an optional extra: `pip install 'attnkit[tensorboard]'`.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, get_args

from attnkit.errors import ConfigError

Logger = Literal["jsonl", "tensorboard"]
LOGGERS = get_args(Logger)
TENSORBOARD_DIR = "tensorboard"


class TensorBoardLog:
    """Writes records as scalars into `run_dir/tensorboard/`. Raises ConfigError when tensorboard is missing."""

    def __init__(self, run_dir: str | Path) -> None:
        try:
            import torch.utils.tensorboard  # noqa: F401  (refused here, before training; the writer opens later)
        except ImportError:
            raise ConfigError(
                "logger='tensorboard' needs the tensorboard package: pip install 'attnkit[tensorboard]' "
                "(or log to metrics.jsonl alone with logger='jsonl')"
            ) from None
        self.log_dir = Path(run_dir) / TENSORBOARD_DIR
        self.writer: Any = None  # a SummaryWriter, opened by the first record: an event file per session that writes
        self.purge_step: int | None = None

    def truncate_after(self, step: int) -> None:
        """Continue the log after `step`: readers drop the events of later steps written before (a resumed run's)."""
        self.close()
        self.purge_step = step + 1

    def write(self, record: dict[str, Any]) -> None:
        """Every finite number of `record` (except its step) as a scalar at its step; flushed at once."""
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            self.writer = SummaryWriter(log_dir=str(self.log_dir), purge_step=self.purge_step)
        kind, step = record.get("kind", "train"), int(record["step"])
        for key, value in record.items():
            if key in ("kind", "step") or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            if math.isfinite(value):
                self.writer.add_scalar(key if "/" in key else f"{kind}/{key}", value, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
