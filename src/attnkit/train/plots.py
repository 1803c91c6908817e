"""The loss curves of a run as a PNG: training loss per step (and its moving average) with validation loss."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from attnkit.outputs import write_figure


def plot_losses(records: list[dict[str, Any]], path: str | Path, *, title: str = "") -> None:
    """Draw `metrics.jsonl` records (kind "train" with `loss`, kind "eval" with `val_loss`) into `path`.

    A bare `Figure` renders with the Agg backend and touches no pyplot state, so no display is needed.
    """
    train = [(r["step"], r["loss"]) for r in records if r.get("kind") == "train" and isinstance(r.get("loss"), float)]
    val = [(r["step"], r["val_loss"]) for r in records if r.get("kind") == "eval" and "val_loss" in r]
    fig = Figure(figsize=(7, 4), dpi=100)
    ax = fig.add_subplot()
    if train:
        steps, losses = zip(*train, strict=True)
        ax.plot(steps, losses, color="tab:blue", alpha=0.3, linewidth=0.8, label="train")
        ax.plot(*moving_average(steps, losses, 25), color="tab:blue", linewidth=1.5, label="train (average)")
    if val:
        steps, losses = zip(*val, strict=True)
        ax.plot(steps, losses, "o-", color="tab:orange", linewidth=1.5, markersize=4, label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy loss (nats)")
    ax.set_title(title, parse_math=False)  # a run named $x$ is drawn as written, not as mathtext
    ax.grid(alpha=0.3)
    if train or val:
        ax.legend()
    fig.tight_layout()
    write_figure(fig, path)  # readers see the old picture or the new one, never half of one


def moving_average(steps: Sequence[int], values: Sequence[float], window: int) -> tuple[np.ndarray, np.ndarray]:
    """The mean of each run of `window` consecutive values (fewer at the start), drawn at the mean of their steps:
    the middle of the window it summarises. Drawn at its last step, a trailing mean lags a falling loss by half a
    window and sits above it (12 steps of a 25-step window: in a short run, far above the validation loss)."""
    steps, values = np.asarray(steps, dtype=np.float64), np.asarray(values, dtype=np.float64)
    ends = np.arange(1, len(values) + 1)  # each window is values[start:end]
    starts = np.maximum(ends - window, 0)
    sums = [np.concatenate([[0.0], np.cumsum(a)]) for a in (steps, values)]
    return tuple((total[ends] - total[starts]) / (ends - starts) for total in sums)
