"""Looking inside: attention maps drawn as PNG heatmaps and as one self-contained HTML page; training instruments
drawn from a run's metrics."""

from attnkit.viz.extract import attention_maps
from attnkit.viz.heatmap import plot_alignment, plot_grid, plot_head, write_pngs
from attnkit.viz.instruments import plot_instruments, plot_run_instruments
from attnkit.viz.labels import token_labels
from attnkit.viz.maps import AttentionMaps
from attnkit.viz.page import render_page, write_page
from attnkit.viz.run import VizResult, VizSettings, run_viz

__all__ = [
    "AttentionMaps",
    "VizResult",
    "VizSettings",
    "attention_maps",
    "plot_alignment",
    "plot_grid",
    "plot_head",
    "plot_instruments",
    "plot_run_instruments",
    "render_page",
    "run_viz",
    "token_labels",
    "write_page",
    "write_pngs",
]
