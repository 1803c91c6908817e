"""`metrics.jsonl`: one JSON object per line, `{"kind": "train", "step": ...}` per logged step and
`{"kind": "eval", "step": ...}` per evaluation. Appended as training goes; a resumed run first drops the lines
after its checkpoint's step, so the file reads as one uninterrupted run.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Protocol

from attnkit.checkpoint import atomic_write


class RecordSink(Protocol):
    """Somewhere else every record goes too (TensorBoard: `train/tensorboard.py`)."""

    def write(self, record: dict[str, Any]) -> None: ...

    def truncate_after(self, step: int) -> None:
        """Drop what it holds of steps after `step` (a resumed run's), as `MetricsLog.truncate_after` does."""


class MetricsLog:
    """Appends records to `path` (flushed at once, so a crash loses nothing logged), and passes each to `mirror`."""

    def __init__(self, path: str | Path, *, mirror: RecordSink | None = None) -> None:
        self.path = Path(path)
        self.mirror = mirror

    def append(self, record: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a", encoding="utf-8") as handle:
            handle.write(json.dumps({k: _finite_or_str(v) for k, v in record.items()}) + "\n")
        if self.mirror is not None:
            self.mirror.write(record)

    def records(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Every record (of `kind`, when given), in order; a line that holds no record (a torn last line after a
        crash mid-write, a line damaged or edited by hand: not JSON, not an object, not UTF-8) is skipped."""
        if not self.path.is_file():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue
            if isinstance(record, dict) and (kind is None or record.get("kind") == kind):
                out.append(record)
        return out

    def truncate_after(self, step: int) -> None:
        """Keep only the records of steps <= `step` (atomically); a record whose step is no number goes too. The
        mirror drops its later steps as well."""
        kept = [r for r in self.records() if _step(r) is not None and _step(r) <= step]
        atomic_write(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        if self.mirror is not None:
            self.mirror.truncate_after(step)


def _step(record: dict[str, Any]) -> float | None:
    """A record's step (0 when it has none), or None when it is not a number."""
    step = record.get("step", 0)
    return step if isinstance(step, int | float) and not isinstance(step, bool) else None


def _finite_or_str(value: Any) -> Any:
    """JSON has no NaN or infinity: write those as the strings "nan", "inf", "-inf"."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value
