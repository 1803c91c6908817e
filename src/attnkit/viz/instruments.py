"""The training instruments of a run as one PNG: attention entropy, residual-stream norm and gradient norm per layer
against the step, one line per layer (darker: deeper).

The numbers come from `metrics.jsonl` records of kind "instruments" (written by the trainer at each evaluation,
`train/instruments.py`), keys `attention_entropy/SITE`, `residual_norm/BLOCK`, `grad_norm/BLOCK`. What to look
for: a post-norm stack trained without warmup shows gradient norms that grow towards the output layers and
residual norms that stay pinned by the norms (Xiong et al. 2020); attention that collapses onto single tokens shows
as entropy falling towards 0 (uniform attention over S keys has entropy log S).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from matplotlib import colormaps
from matplotlib.figure import Figure

from attnkit.checkpoint import INSTRUMENTS_KIND, METRICS_FILE
from attnkit.viz.heatmap import save_figure

PANELS = (
    ("attention_entropy", "attention entropy (nats)"),
    ("residual_norm", "residual-stream norm"),
    ("grad_norm", "gradient norm"),
)
PLOT_NAME = "plots/instruments.png"


def read_instruments(metrics_path: str | Path) -> list[dict[str, Any]]:
    """The instruments records of a metrics.jsonl, in order (none when the file is missing; torn lines skipped)."""
    path = Path(metrics_path)
    if not path.is_file():
        return []
    found = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("kind") == INSTRUMENTS_KIND:
            found.append(record)
    return found


LEGEND_POINTS = 9  # the layers' names, beside each panel
LEGEND_ROWS = 12  # names per legend column before another column starts


def instruments_figure(records: list[dict[str, Any]], *, title: str = "") -> Figure:
    """Instruments records as a figure: one panel per instrument present, one line per layer, and each panel's
    legend outside it on the right, where it hides no line."""
    keys = {key for record in records for key in record}
    panels = [(prefix, label) for prefix, label in PANELS if any(k.startswith(prefix + "/") for k in keys)]
    fig = Figure(figsize=(9.5, 2.6 * max(len(panels), 1) + 0.4), dpi=100)
    axes = fig.subplots(max(len(panels), 1), 1, squeeze=False, sharex=True)[:, 0]
    for ax, (prefix, label) in zip(axes, panels, strict=False):
        names = list(dict.fromkeys(k for r in records for k in r if k.startswith(prefix + "/")))
        shades = colormaps["viridis"]
        for index, name in enumerate(names):
            points = [(r["step"], r[name]) for r in records if isinstance(r.get(name), (int, float))
                      and math.isfinite(r[name])]
            if points:
                steps, values = zip(*points, strict=True)
                shade = shades(0.85 * index / max(len(names) - 1, 1))
                style = "o--" if name.startswith(prefix + "/encoder") else "o-"  # encoders dashed
                ax.plot(steps, values, style, markersize=3, linewidth=1.2, color=shade,
                        label=name.removeprefix(prefix + "/"))
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=LEGEND_POINTS, ncol=math.ceil(len(names) / LEGEND_ROWS), loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)
    axes[-1].set_xlabel("step")
    fig.suptitle(title or "training instruments, per layer", parse_math=False)  # a run named $x$ as written
    return fig


def plot_instruments(records: list[dict[str, Any]], path: str | Path, *, title: str = "") -> Path:
    """Draw instruments records into `path` (`instruments_figure`)."""
    return save_figure(instruments_figure(records, title=title), path)


def plot_run_instruments(run_dir: str | Path) -> Path | None:
    """RUN/plots/instruments.png from RUN/metrics.jsonl; None (nothing drawn) when it holds no instruments."""
    run_dir = Path(run_dir)
    records = read_instruments(run_dir / METRICS_FILE)
    if not records:
        return None
    return plot_instruments(records, run_dir / PLOT_NAME, title=f"training instruments: {run_dir.name}")
