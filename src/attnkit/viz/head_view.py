"""BertViz's head view as a picture (Vig 2019): the tokens twice, queries on the left and keys on the right, and a line
from one query to every key, as opaque as the head's weight on it. The lecture's "The animal didn't cross the street
because it was tired" is drawn this way: the lines from "it" show where one head looks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from attnkit.errors import InputError
from attnkit.viz.heatmap import drawable, save_figure
from attnkit.viz.maps import AttentionMaps

LINE_COLOUR = "tab:blue"
MARK_COLOUR = "tab:orange"


def draw_head_view(ax: Axes, tokens: Sequence[str], weights: Sequence[float], query: int, *, title: str,
                   marked: Sequence[int] = ()) -> None:
    """Draw on `ax` one head's attention from `tokens[query]` to every token: `weights` (S,), one per token, in
    [0, 1]. Each line is as opaque as its weight, as BertViz draws them (a head that spreads its weight evenly draws
    faint lines, not a fan of strong ones); each weight is written beside its key. `marked`: key positions whose
    labels are drawn in bold colour (the referent the reader should find).

    Raises InputError where the weights and tokens differ in length, a weight is outside [0, 1] or `query` is not a
    token's position.
    """
    weights = [float(w) for w in weights]
    if len(weights) != len(tokens) or not tokens:
        raise InputError(f"{len(weights)} weights for {len(tokens)} tokens: give one weight per token")
    if not all(-1e-4 <= w <= 1 + 1e-4 for w in weights):  # a float32 softmax may round a little past 0 or 1
        raise InputError("attention weights lie in [0, 1]: give one row of a head's softmax weights")
    weights = [min(max(w, 0.0), 1.0) for w in weights]
    if not 0 <= query < len(tokens):
        raise InputError(f"query position {query} is not among the {len(tokens)} tokens")
    rows = range(len(tokens))
    for key, weight in enumerate(weights):  # (S,) lines, y down the page: token 0 on top
        ax.plot([0.0, 1.0], [query, key], color=LINE_COLOUR, alpha=weight, linewidth=1 + 3 * weight)
    for row, token in zip(rows, tokens, strict=True):
        label = drawable(token)
        ax.text(-0.04, row, label, ha="right", va="center", fontsize=9,
                fontweight="bold" if row == query else "normal")
        ax.text(1.04, row, f"{label}  {weights[row]:.2f}", ha="left", va="center", fontsize=9,
                color=MARK_COLOUR if row in marked else "black", fontweight="bold" if row in marked else "normal")
    ax.set_xlim(-0.8, 1.9)
    ax.set_ylim(len(tokens) - 0.5, -0.5)
    ax.set_axis_off()
    ax.set_title(title, fontsize=9)


def write_head_views(all_maps: Sequence[AttentionMaps], directory: str | Path, query: int) -> list[Path]:
    """`attnkit viz --from-token`: one head view per self-attention kind, layer and head of `all_maps`, from the token
    at position `query`, into `directory` as {kind}_layer{L}_head{H}_from{query}.png. Cross-attention is left out (its
    queries are not its keys: the alignment draws it). Returns the paths written.

    Raises InputError where `query` is not a position of the text's tokens, or where `all_maps` holds no
    self-attention (a recurrent encoder-decoder's one alignment): there is no head view to draw.
    """
    if all(maps.kind == "cross" for maps in all_maps):
        raise InputError(f"--from-token {query}: this model's attention is cross-attention alone (a target attending "
                         "to the source), which the alignment draws; a head view is self-attention's: leave out "
                         "--from-token")
    written = []
    for maps in all_maps:
        if maps.kind == "cross":
            continue
        if not 0 <= query < len(maps.query_tokens):
            raise InputError(f"--from-token {query}: the text has {len(maps.query_tokens)} tokens; give a position "
                             f"0..{len(maps.query_tokens) - 1}")
        for layer in maps.layers:
            for head in maps.heads:
                fig = Figure(figsize=(5.5, 0.3 * len(maps.key_tokens) + 1.0))
                weights = maps.head_weights(layer, head)[query]  # (S,) from the query
                draw_head_view(fig.add_subplot(), maps.key_tokens, weights.tolist(), query,
                               title=f"{maps.title}: layer {layer} head {head}, from "
                               f"{drawable(maps.query_tokens[query])!r}")
                name = f"{maps.kind}_layer{layer}_head{head}_from{query}.png"
                written.append(save_figure(fig, Path(directory) / name))
    return written
