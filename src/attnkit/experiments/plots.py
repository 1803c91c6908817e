"""Matplotlib helpers for the experiments' PNGs (one figure per file, drawn without pyplot: `Figure` objects render
to PNG by themselves, so no backend is chosen and a notebook that imports an experiment keeps its own).

Two rules every experiment's plot follows, kept here so that no plot states them twice:
- the seeds' spread is drawn beside their mean (`series`, `draw_spread`): each seed as a faint point of the mean
  line's colour, or +-1 standard deviation as error bars where only that was stored, and the axis label says which;
- a value axis never magnifies noise (`fit_value_axis`): fractions span 0 to 1, counts and costs start at 0, a level
  such as a loss spans at least `LEVEL_MIN_SPAN` of its values' magnitude, a log axis at least one decade. A
  difference of 0.003 nats then looks like what it is beside a loss of 2.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

from matplotlib import ticker
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from torch import Tensor

from attnkit.outputs import write_figure

Scale = Literal["fraction", "from zero", "level", "log"]
LEVEL_MIN_SPAN = 0.1  # a level axis spans at least this share of the largest magnitude it shows
LOG_MIN_DECADES = 1.0  # a log axis spans at least one decade
MARGIN = 0.05  # share of the span left free above and below the values
NOT_STORED = "spread not stored in this run"


def new_figure(width: float, height: float, *, ncols: int = 1, nrows: int = 1):
    """A figure and its axes: one Axes, or a flat array of them when there are several."""
    fig = Figure(figsize=(width, height))
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
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


def min_span(low: float, high: float, scale: Scale) -> float:
    """The least span a value axis showing values in [low, high] may have, in its own units (decades on a log
    axis): what keeps a small difference looking small."""
    if scale == "fraction":
        return 1.0
    if scale == "from zero":
        return max(abs(low), abs(high))
    if scale == "log":
        return LOG_MIN_DECADES
    return LEVEL_MIN_SPAN * max(abs(low), abs(high), 1e-12)


def value_range(low: float, high: float, scale: Scale) -> tuple[float, float]:
    """The (bottom, top) of a value axis showing values in [low, high]: fractions from 0 to 1, counts and costs
    from 0, a level (a loss) at least `min_span` around its values, a log axis at least a decade (values > 0).

    Raises ValueError for values that are not finite, low above high, or a value <= 0 on a log axis."""
    if not (math.isfinite(low) and math.isfinite(high)) or low > high:
        raise ValueError(f"value_range needs finite low <= high, got {low}, {high}")
    if scale == "log":
        if low <= 0:
            raise ValueError(f"a log axis shows positive values only, got {low}")
        bottom, top = _around(math.log10(low), math.log10(high), LOG_MIN_DECADES)
        return 10.0**bottom, 10.0**top
    if scale == "level":
        return _around(low, high, min_span(low, high, scale))
    low, high = min(low, 0.0), max(high, 1.0 if scale == "fraction" else 0.0)  # the reference stays an edge
    span = (high - low) or 1.0
    return low - MARGIN * span, high + MARGIN * span


def _around(low: float, high: float, floor: float) -> tuple[float, float]:
    """[low, high] widened about its centre to at least `floor`, plus the margin."""
    span = max(high - low, floor)
    centre = low / 2 + high / 2
    return centre - (0.5 + MARGIN) * span, centre + (0.5 + MARGIN) * span


def fit_value_axis(ax, scale: Scale) -> None:
    """Set `ax`'s y-axis by `value_range` over everything drawn on it (lines, seeds' points, error bars,
    reference lines); a log scale is set here too."""
    low, high = (float(v) for v in ax.dataLim.intervaly)
    if scale == "log" and ax.get_yscale() != "log":  # setting it again would reset the axis's tick formats
        ax.set_yscale("log")
    ax.set_ylim(*value_range(low, high, scale))


def draw_spread(ax, x: Sequence, means: Sequence[float | None], *, colour,
                seeds: Sequence[Sequence[float]] | None = None, sd: Sequence[float | None] | None = None,
                unit: str = "seed") -> str:
    """Draw the seeds' spread at each x: each seed's value as a faint point (`seeds`: per x, one value per seed),
    else +-1 standard deviation as error bars around `means` (`sd`: per x). `unit`: what was repeated ("seed",
    "timing round"). Returns what it drew, for the legend (`spread_legend`), or `NOT_STORED` where neither is
    given."""
    if seeds:
        xs = [xi for xi, values in zip(x, seeds, strict=True) for _ in values]
        ys = [value for values in seeds for value in values]
        ax.scatter(xs, ys, s=16, color=colour, alpha=0.35, linewidths=0, zorder=3)
        return f"faint points: each {unit}"
    if sd:
        kept = [(xi, m, s) for xi, m, s in zip(x, means, sd, strict=True) if m is not None and s is not None]
        if kept:
            xs, ms, ss = zip(*kept, strict=True)
            ax.errorbar(xs, ms, yerr=ss, fmt="none", ecolor=colour, capsize=3, alpha=0.8, zorder=3)
        return f"bars: +-1 sd over {unit}s"
    return NOT_STORED


def series(ax, x: Sequence, means: Sequence[float], *, seeds: Sequence[Sequence[float]] | None = None,
           sd: Sequence[float | None] | None = None, unit: str = "seed", **style) -> str:
    """The mean over seeds as a line with markers (matplotlib `style`: label, marker, linestyle, colour), with the
    seeds' spread (`draw_spread`). Returns what the spread shows, for the axis label."""
    (line,) = ax.plot(x, means, **{"marker": "o", **style})
    return draw_spread(ax, x, means, colour=line.get_color(), seeds=seeds, sd=sd, unit=unit)


def spread_legend(ax, *, over: str, spread: str | None, handles: Sequence | None = None, **options) -> None:
    """The legend of lines that summarise repeats, titled with how (`over`, e.g. "mean of 3 seeds"), with one more
    entry saying what the spread drawn beside them shows (`spread`, as `draw_spread` returned it; None: no spread,
    one run a point). `handles`: the lines to name (default: those on `ax`); `options`: matplotlib's legend options
    (fontsize, loc)."""
    lines = list(handles) if handles is not None else ax.get_legend_handles_labels()[0]
    if spread is None:
        ax.legend(handles=lines, title=over, **{"fontsize": 8, "title_fontsize": 8, **options})
        return
    if spread.startswith("faint points"):
        key = Line2D([], [], marker="o", linestyle="", color="grey", alpha=0.35, label=spread)
    elif spread.startswith("bars"):
        key = Line2D([], [], marker="|", markersize=10, linestyle="", color="grey", label=spread)
    else:
        key = Line2D([], [], linestyle="", label=f"({spread})")
    ax.legend(handles=[*lines, key], title=over, **{"fontsize": 8, "title_fontsize": 8, **options})


def save(fig, path: Path) -> None:
    """Write the figure as a PNG, whole or not at all (`attnkit.outputs.write_figure`)."""
    fig.tight_layout()
    write_figure(fig, path, dpi=110)


def running_mean(values: list[float], window: int = 10) -> list[float]:
    """Each value averaged with the `window - 1` before it (fewer at the start): noisy loss curves made readable."""
    out, total = [], 0.0
    for index, value in enumerate(values):
        total += value - (values[index - window] if index >= window else 0.0)
        out.append(total / min(index + 1, window))
    return out
