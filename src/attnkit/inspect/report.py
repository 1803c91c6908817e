"""An analysis's output files: a table as JSON and as markdown, and a picture (PNG), each written whole or not at all
(`attnkit.outputs.atomic_write`: a temporary sibling renamed into place; a full disk is one error naming the file).

    OUT/NAME.json    {"title", "summary", "rows"}        NaN cells (a site with fewer heads) become null
    OUT/NAME.md      the title, the summary, the rows as a markdown table
    OUT/NAME.png     the analysis's picture (`heatmap`, or one it draws itself on a `Figure`)
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure
from torch import Tensor

from attnkit.outputs import atomic_write, png_bytes, refuse_root, writing


def write_report(out: str | Path, name: str, *, title: str, rows: list[dict[str, Any]], summary: dict[str, Any],
                 figure: Figure) -> list[Path]:
    """Write NAME.json, NAME.md and NAME.png into `out` (made when absent); returns the three paths."""
    out = Path(out)
    refuse_root(out)
    with writing(out):  # a forbidden or read-only place: one error naming it
        out.mkdir(parents=True, exist_ok=True)
    clean_rows = [{k: _plain(v) for k, v in row.items()} for row in rows]
    clean_summary = {k: _plain(v) for k, v in summary.items()}
    document = json.dumps({"title": title, "summary": clean_summary, "rows": clean_rows}, indent=2)
    paths = [out / f"{name}.json", out / f"{name}.md", out / f"{name}.png"]
    figure.tight_layout()
    picture = png_bytes(figure, dpi=110)  # drawn before any file is written
    atomic_write(paths[0], document + "\n")
    atomic_write(paths[1], markdown(title, clean_summary, clean_rows))
    atomic_write(paths[2], picture)
    return paths


def markdown(title: str, summary: dict[str, Any], rows: list[dict[str, Any]]) -> str:
    """`# title`, one `- key: value` line per summary entry, then the rows as a table."""
    lines = [f"# {title}", "", *(f"- {k}: {v}" for k, v in summary.items()), ""]
    if rows:
        columns = list(rows[0])
        lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_cell(row.get(c)) for c in columns) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    """A value as one markdown table cell: a `|` escaped and a line break written <br>, either of which would end
    the cell or the row (a continuation or a token may hold both)."""
    return "" if value is None else str(value).replace("|", "\\|").replace("\n", "<br>")


WRAP = 32  # positions in one panel: a longer text's table is cut into panels stacked one under another


def position_spans(length: int) -> list[range]:
    """The positions each stacked panel of a `length`-position table shows: WRAP at most, about as many each (100
    positions: 25 a panel, 4 panels), so a long text's cells keep a readable width."""
    size = math.ceil(length / max(1, math.ceil(length / WRAP)))
    return [range(start, min(length, start + size)) for start in range(0, length, size)]


def heatmap(values: Tensor, *, title: str, rows: Sequence[str], columns: Sequence[str], xlabel: str,
            colorbar: str, centered: bool = False, share: bool = False, bound: float | None = None, ax=None
            ) -> Figure:
    """A (rows, columns) table of numbers as a heatmap with each cell written in (NaN cells left blank);
    `centered`: a diverging scale around 0 (changes that go both ways), to +-`bound` (default: the largest
    magnitude; give one to panels that share a scale); `share`: a scale from 0 to 1 (a share of the attention, a
    probability)."""
    data = values.detach().float().cpu().numpy()
    if ax is None:
        figure = Figure(figsize=(1.2 + 0.55 * len(columns) + 1.5, 1.0 + 0.35 * len(rows) + 0.6))
        ax = figure.add_subplot()
    finite = data[~(data != data)]
    bound = bound if bound is not None else float(abs(finite).max()) if finite.size else 1.0
    limits = ({"vmin": -bound, "vmax": bound, "cmap": "RdBu_r"} if centered else
              {"vmin": 0.0, "vmax": 1.0, "cmap": "viridis"} if share else {"cmap": "viridis"})
    image = ax.imshow(data, aspect="auto", **limits)
    ax.figure.colorbar(image, ax=ax, fraction=0.046, label=colorbar)
    ax.set_yticks(range(len(rows)), list(rows), fontsize=7)
    ax.set_xticks(range(len(columns)), list(columns), fontsize=7, rotation=90 if len(columns) > 12 else 0)
    ax.set(title=title, xlabel=xlabel)
    if data.size <= 400:  # small enough to read each number
        low, high = image.get_clim()
        decimals = _decimals(max(abs(low), abs(high)))
        for r in range(data.shape[0]):
            for c in range(data.shape[1]):
                if data[r, c] == data[r, c]:  # not NaN
                    place = (data[r, c] - low) / ((high - low) or 1.0)  # where on the scale: dark ends get white
                    dark = abs(place - 0.5) > 0.3 if centered else place < 0.5
                    value = round(float(data[r, c]), decimals) + 0.0  # -0.001 -> 0.0, never written -0.00
                    ax.text(c, r, f"{value:.{decimals}f}", ha="center", va="center", fontsize=6,
                            color="white" if dark else "black")
    return ax.figure


def _decimals(largest: float) -> int:
    """Decimals that show the numbers of a scale reaching `largest` to two significant digits at least (2 from 0.1
    up; 0.004 needs 4), so that small values are not all written 0.00."""
    if not largest > 0 or largest >= 0.1 or math.isinf(largest):
        return 2
    return min(6, 1 - math.floor(math.log10(largest)))


def _plain(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, Tensor):
        return _plain(value.item()) if value.dim() == 0 else [_plain(v) for v in value.tolist()]
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value
