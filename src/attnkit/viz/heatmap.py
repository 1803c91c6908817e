"""Attention maps as PNG heatmaps: one layer and head, a layer x head grid, a translation's alignment.

Rows are queries (the token attending), columns keys (the tokens attended to), so a row sums to 1. The alignment
is Bahdanau et al.'s figure 3 (2015): the cross-attention of a translation, mean over one layer's heads, with the
source along the top and the target down the side, white where the weight is high.

A bare `Figure` renders with the Agg backend and touches no pyplot state, so no display is needed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import cache
from pathlib import Path

from matplotlib import font_manager
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from mpl_toolkits.axes_grid1 import axes_size, make_axes_locatable

from attnkit.errors import InputError
from attnkit.outputs import write_figure
from attnkit.viz.maps import AttentionMaps

DPI = 100
CELL_INCHES = (0.2, 0.4)  # one token's row or column, long texts to short
FONT_POINTS = (8, 13)  # token labels: 8 points in the smallest cells, up to 13 where cells are large
LABEL_SHARE = 0.45  # a label's height as a share of its cell, between those bounds
BAR_INCHES = 0.2  # a heatmap's colour bar
GRID_INCHES = 24.0  # the widest a layer x head grid is drawn
GRID_TOKEN_INCHES = 0.16  # one token's row in a grid's map, where GRID_INCHES leaves room: 10-point labels
GRID_BAR_SHARE = 0.06  # the grid's colour bar, as a share of one map's width
TITLE_POINTS = 13  # a grid's figure title
TITLE_PAD = 0.1  # inches above a heatmap's title
AXIS_NAMES = {"cross": ("target token (query)", "source token (key)")}
DEFAULT_AXIS_NAMES = ("query: the token attending", "key: the token attended to")


def drawable(label: str) -> str:
    """`label` with each character that no font of matplotlib's text holds written as its code point between angle
    brackets ("⟨U+1F642⟩", never read as the label's own text): matplotlib draws such a character as an empty box,
    and warns of it at every draw."""
    held = _code_points(_font_paths())
    left, right = ("⟨", "⟩") if {ord("⟨"), ord("⟩")} <= held else ("<", ">")  # brackets the fonts draw
    return "".join(c if ord(c) in held else f"{left}U+{ord(c):04X}{right}" for c in label)


def _font_paths() -> tuple[font_manager.FontPath, ...]:
    """The fonts matplotlib falls back through for its text as rcParams stand now: the one font each family of
    font.family names (a generic family: the first installed of its list, such as font.sans-serif), or the default
    where none is installed. Read at each call (matplotlib caches findfont), so a font put first in a list counts."""
    paths = []
    for family in font_manager.FontProperties().get_family():
        prop = font_manager.FontProperties()
        prop.set_family(family)
        try:
            paths.append(font_manager.findfont(prop, fallback_to_default=False))
        except ValueError:  # a family not installed here
            continue
    return tuple(paths) or (font_manager.findfont(font_manager.FontProperties()),)


@cache
def _code_points(paths: tuple[font_manager.FontPath, ...]) -> frozenset[int]:
    """The characters the fonts at `paths` hold."""
    return frozenset(code for path in paths for code in font_manager.get_font(path).get_charmap())


def _drawn(maps: AttentionMaps) -> AttentionMaps:
    """`maps` with tokens the fonts can draw (`drawable`)."""
    return dataclasses.replace(maps, query_tokens=tuple(map(drawable, maps.query_tokens)),
                               key_tokens=tuple(map(drawable, maps.key_tokens)))


def plot_head(maps: AttentionMaps, layer: int, head: int | None, path: str | Path) -> Path:
    """One layer's head (or the mean over its heads, head=None) as a labelled heatmap with a colour bar."""
    maps = _drawn(maps)
    weights = maps.head_weights(layer, head)
    which = f"head {head}" if head is not None else heads_mean(maps.heads)
    ylabel, xlabel = AXIS_NAMES.get(maps.kind, DEFAULT_AXIS_NAMES)
    fig, ax, font = _labelled_figure(maps.query_tokens, maps.key_tokens, f"{maps.title}, layer {layer}, {which}")
    image = ax.imshow(weights, cmap="viridis", vmin=0.0, vmax=float(weights.max()), aspect="equal")
    _label_axes(ax, maps.query_tokens, maps.key_tokens, font)
    ax.set_xlabel(xlabel, fontsize=font)
    ax.set_ylabel(ylabel, fontsize=font)
    _colour_bar(fig, ax, image, font)
    return save_figure(fig, path)


def plot_alignment(maps: AttentionMaps, path: str | Path, *, layer: int | None = None) -> Path:
    """A translation's alignment: cross-attention of `layer` (default the last), mean over its heads.

    Raises `InputError` for maps that are not cross-attention.
    """
    if maps.kind != "cross":
        raise InputError(f"an alignment is drawn from cross-attention, not {maps.title}; pass the cross maps")
    maps, layer = _drawn(maps), maps.layers[-1] if layer is None else layer
    weights = maps.head_weights(layer, None)  # (T_target, S_source)
    title = f"alignment: cross-attention, layer {layer}, {heads_mean(maps.heads)}"
    fig, ax, font = _labelled_figure(maps.query_tokens, maps.key_tokens, title)
    image = ax.imshow(weights, cmap="gray", vmin=0.0, vmax=float(weights.max()), aspect="equal")
    _label_axes(ax, maps.query_tokens, maps.key_tokens, font)
    ax.xaxis.tick_top()
    ax.xaxis.set_label_position("top")
    ax.set_xlabel("source", fontsize=font)
    ax.set_ylabel("target", fontsize=font)
    _colour_bar(fig, ax, image, font)
    return save_figure(fig, path)


def heads_mean(heads: Sequence[int]) -> str:
    """What a mean over `heads` (model indices) is called: "mean over heads 0-7", "mean over heads 1, 3", or for one
    head that head, so a mean over some of a layer's heads never reads as one over all of them."""
    if len(heads) == 1:
        return f"head {heads[0]}"
    if len(heads) > 2 and list(heads) == list(range(heads[0], heads[-1] + 1)):
        return f"mean over heads {heads[0]}-{heads[-1]}"
    return "mean over heads " + ", ".join(str(h) for h in heads)


def grid_figure(maps: AttentionMaps) -> Figure:
    """Every layer (rows) and head (columns) at a glance, each scaled to its own largest weight (Vaswani et al.
    2017, figures 3-5), with one colour bar for that shared relative scale. Tokens label the outer axes where they
    fit."""
    maps = _drawn(maps)
    n_layers, n_heads, n_queries, n_keys = maps.weights.shape
    cell = min(max(1.4, GRID_TOKEN_INCHES * max(n_queries, n_keys)), GRID_INCHES / n_heads)
    font = min(FONT_POINTS[1], 0.9 * 72 * cell / max(n_queries, n_keys))  # a label fits its row
    # the labels' length beside the first column and below the last row, beyond the 1.8 and 1.0 inches of the
    # layer names, the heads' titles and the colour bar
    labels = 0.6 * font / 72 * max(len(t) for t in (*maps.query_tokens, *maps.key_tokens)) if font >= 4 else 0.0
    title = f"{maps.title}: layers x heads (rows: queries, columns: keys)"
    width = cell * (n_heads + GRID_BAR_SHARE) + 1.8 + labels
    if width < _title_inches(title):  # a grid of one or two maps: the title on two lines, the figure as wide
        title = title.replace(" (", "\n(")
        width = max(width, _title_inches(title))
    # constrained layout keeps the figure's title above the heads' titles, however tall the maps
    fig = Figure(figsize=(width, cell * n_layers + 1.0 + labels), dpi=DPI, layout="constrained")
    layout = fig.add_gridspec(n_layers, n_heads + 1, width_ratios=[1.0] * n_heads + [GRID_BAR_SHARE])
    for row, layer in enumerate(maps.layers):
        for column, head in enumerate(maps.heads):
            ax: Axes = fig.add_subplot(layout[row, column])
            weights = maps.weights[row, column]  # (T, S)
            image = ax.imshow(weights / max(float(weights.max()), 1e-12), cmap="viridis", vmin=0.0, vmax=1.0,
                              aspect="auto")
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(f"head {head}", fontsize=11)
            if column == 0:
                ax.set_ylabel(f"layer {layer}", fontsize=11)
            if font >= 4 and column == 0:
                ax.set_yticks(range(n_queries), maps.query_tokens, fontsize=font, parse_math=False)
            if font >= 4 and row == n_layers - 1:
                ax.set_xticks(range(n_keys), maps.key_tokens, fontsize=font, rotation=90, parse_math=False)
    bar = fig.colorbar(image, cax=fig.add_subplot(layout[:, -1]))
    bar.set_label("weight / its map's largest", fontsize=11)
    bar.ax.tick_params(labelsize=10)
    fig.suptitle(title, fontsize=TITLE_POINTS, parse_math=False)
    return fig


def _title_inches(title: str) -> float:
    """About how wide `title` is drawn at TITLE_POINTS (its longest line; a character is ~0.6 of its size)."""
    return 0.6 * TITLE_POINTS / 72 * max(len(line) for line in title.splitlines()) + 0.4


def plot_grid(maps: AttentionMaps, path: str | Path) -> Path:
    """`grid_figure` written to `path`."""
    return save_figure(grid_figure(maps), path)


def write_pngs(
    all_maps: Sequence[AttentionMaps], directory: str | Path, *, per_head: bool = True
) -> list[Path]:
    """Every picture of `all_maps` into `directory`: per kind a grid, one map per layer and head (`per_head`) and
    per layer the mean over heads; for cross-attention also the alignment. Returns the paths written."""
    directory = Path(directory)
    written = []
    for maps in all_maps:
        written.append(plot_grid(maps, directory / f"{maps.kind}_grid.png"))
        for layer in maps.layers:
            written.append(plot_head(maps, layer, None, directory / f"{maps.kind}_layer{layer}_mean.png"))
            for head in maps.heads if per_head else ():
                written.append(plot_head(maps, layer, head, directory / f"{maps.kind}_layer{layer}_head{head}.png"))
        if maps.kind == "cross":
            written.append(plot_alignment(maps, directory / "alignment.png"))
    return written


def _labelled_figure(query_tokens: Sequence[str], key_tokens: Sequence[str], title: str) -> tuple[Figure, Axes, float]:
    """A figure sized so each token gets a cell of CELL_INCHES, the longest label fits beside the axis and `title`
    (the figure's, centred on it: over a small map beside long labels, a title centred on the map ran off the
    figure) fits above, and the labels' size in points: LABEL_SHARE of a cell within FONT_POINTS, so a short text's
    picture, shown smaller than drawn, keeps labels that can be read."""
    cell = min(max(8.0 / max(len(query_tokens), len(key_tokens)), CELL_INCHES[0]), CELL_INCHES[1])
    font = min(max(LABEL_SHARE * 72 * cell, FONT_POINTS[0]), FONT_POINTS[1])
    label_inches = 0.6 * font / 72 * max(len(t) for t in (*query_tokens, *key_tokens)) + 0.3 + 2 * font / 72
    width = cell * len(key_tokens) + label_inches + 0.6 + 5 * font / 72  # + the colour bar and its label
    height = cell * len(query_tokens) + label_inches + 0.4 + 3 * font / 72  # + the title
    title_inches = 0.6 * (font + 1) / 72 * len(title) + 0.4
    figsize = (max(width, title_inches, 4.0), max(height, 3.0))
    fig = Figure(figsize=figsize, dpi=DPI)
    # the title at the top, TITLE_PAD inches down whatever the figure's height: tight_layout keeps the map below the
    # title's top edge, and a title at 98% of a long text's tall figure was half an inch down, over the map
    fig.suptitle(title, fontsize=font + 1, y=1 - TITLE_PAD / figsize[1], va="top", parse_math=False)  # as written
    return fig, fig.add_subplot(), font


def _label_axes(ax: Axes, query_tokens: Sequence[str], key_tokens: Sequence[str], font: float) -> None:
    ax.set_yticks(range(len(query_tokens)), query_tokens, fontsize=font, parse_math=False)
    ax.set_xticks(range(len(key_tokens)), key_tokens, fontsize=font, rotation=90, parse_math=False)
    ax.tick_params(length=2)


def _colour_bar(fig: Figure, ax: Axes, image, font: float) -> None:
    """The scale beside a map, as tall as the map and BAR_INCHES wide however wide the figure: which shade is which
    weight, its labels as large as the tokens'."""
    cax = make_axes_locatable(ax).append_axes("right", size=axes_size.Fixed(BAR_INCHES), pad=BAR_INCHES / 2)
    bar = fig.colorbar(image, cax=cax)
    bar.set_label("attention weight", fontsize=font)
    bar.ax.tick_params(labelsize=font)


def save_figure(fig: Figure, path: str | Path) -> Path:
    """Write atomically: a reader sees the old picture or the new one, never half of one. A figure without a layout
    engine of its own is laid out tight."""
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    return write_figure(fig, path)
