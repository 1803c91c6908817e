"""A plan's choices, each with its reason: the shared form of the inference plan (`generate/plan.py`) and the
training plan (`train/plan.py`), which `--explain` prints."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Choice:
    """One decision of a plan: what it is about, what was chosen, and why."""

    what: str
    choice: str
    why: str


def explain_choices(title: str, choices: Sequence[Choice]) -> str:
    """`title`, then one line per choice with its reason, aligned."""
    width = max((len(c.what) for c in choices), default=0)
    return "\n".join([title, *(f"  {c.what:<{width}}  {c.choice}: {c.why}" for c in choices)])
