"""The loss curves of a run as a PNG: training loss per step (and its moving average) with validation loss."""

from __future__ import annotations

from pathlib import Path
from typing import Any

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
        ax.plot(steps, _moving_average(list(losses), 25), color="tab:blue", linewidth=1.5, label="train (average)")
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


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out
