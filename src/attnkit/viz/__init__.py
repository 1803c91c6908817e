"""Looking inside: attention maps drawn as PNG heatmaps and as one self-contained HTML page."""

from attnkit.viz.heatmap import plot_alignment, plot_grid, plot_head, write_pngs
from attnkit.viz.labels import token_labels
from attnkit.viz.maps import AttentionMaps
from attnkit.viz.page import render_page, write_page

__all__ = [
    "AttentionMaps",
    "plot_alignment",
    "plot_grid",
    "plot_head",
    "render_page",
    "token_labels",
    "write_page",
    "write_pngs",
]
