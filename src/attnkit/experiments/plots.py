"""Matplotlib helpers for the experiments' PNGs (headless backend, one figure per file)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib import ticker  # noqa: E402
from torch import Tensor  # noqa: E402


def new_figure(width: float, height: float, *, ncols: int = 1, nrows: int = 1):
    """A figure and its axes: one Axes, or a flat array of them when there are several."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(width, height), squeeze=False)
    axes = axes.ravel()
    return fig, (axes[0] if axes.size == 1 else axes)


def heatmap_axes(ax, weights: Tensor, *, title: str, xlabel: str, ylabel: str,
                 xticklabels: list[str] | None = None, yticklabels: list[str] | None = None) -> None:
    """Draw a (rows, columns) weight matrix in [0, 1] with a colour bar."""
    image = ax.imshow(weights.detach().float().numpy(), aspect="auto", cmap="viridis", vmin=0.0)
    ax.figure.colorbar(image, ax=ax, fraction=0.046)
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if xticklabels is not None:
        ax.set_xticks(range(len(xticklabels)), xticklabels, fontsize=7)
    if yticklabels is not None:
        ax.set_yticks(range(len(yticklabels)), yticklabels, fontsize=7)


def log_log_axes(ax, xticks: list[int]) -> None:
    """Both axes logarithmic, with plain numbers: `xticks` on x (e.g. the sequence lengths), %g on y."""
    ax.set(xscale="log", yscale="log")
    ax.set_xticks(xticks, [str(x) for x in xticks])
    ax.xaxis.set_minor_locator(ticker.NullLocator())
    ax.yaxis.set_major_locator(ticker.LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(ticker.NullFormatter())


def save(fig, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def running_mean(values: list[float], window: int = 10) -> list[float]:
    """Each value averaged with the `window - 1` before it (fewer at the start): noisy loss curves made readable."""
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value - (values[index - window] if index >= window else 0.0)
        out.append(total / min(index + 1, window))
    return out
