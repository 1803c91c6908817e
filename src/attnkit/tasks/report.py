"""What `attnkit eval` found: one row per file (and an "all" row over several), the columns a table shows, and the
extras of the task (window and stride, the metrics' signatures, a confusion matrix)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class EvalReport:
    """One evaluation: `kind` names what was measured ("perplexity", "translation", "classification", ...)."""

    kind: str
    run: str
    rows: list[dict[str, Any]]
    details: dict[str, Any] = field(default_factory=dict)
    columns: tuple[str, ...] = ()  # the rows' fields the table shows, in order
    notes: list[str] = field(default_factory=list)  # lines printed under the table (signatures, a matrix)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "run": self.run, "rows": self.rows, **self.details}

    def table(self) -> str:
        """The rows as an aligned text table, then the notes."""
        columns = self.columns or tuple(self.rows[0])
        cells = [list(columns)] + [[_cell(row.get(c, "")) for c in columns] for row in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
        lines = ["  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
                 for r in cells]
        if self.notes:
            lines += ["", *self.notes]
        return "\n".join(line.rstrip() for line in lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if abs(value) < 1e4 else f"{value:.4g}"
    return str(value)
