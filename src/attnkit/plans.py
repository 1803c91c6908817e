"""A plan's choices, each with its reason: the shared form of the inference plan (`generate/plan.py`) and the
training plan (`train/plan.py`), which `--explain` prints; a choice that departs from an option the user gave says
so (`Choice.departure`), which the command logs as a warning whether or not it explains."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Choice:
    """One decision of a plan: what it is about, what was chosen, and why. `asked`: the option the user gave that
    the plan does not follow here (`--compile blocks` on an LSTM), which is said, never dropped in silence."""

    what: str
    choice: str
    why: str
    asked: str | None = None

    def departure(self) -> str | None:
        """One line saying that the option asked for is not followed, and why; None when the plan follows it."""
        if self.asked is None:
            return None
        return f"{self.asked} is not followed: {self.what} {self.choice}, as {self.why}"


def explain_choices(title: str, choices: Sequence[Choice]) -> str:
    """`title`, then one line per choice with its reason, aligned."""
    width = max((len(c.what) for c in choices), default=0)
    return "\n".join([title, *(f"  {c.what:<{width}}  {c.choice}: {c.why}" for c in choices)])


def attention_choice(paths: Sequence[tuple[str, str, str]], fused: str, why_fused: str) -> Choice:
    """The attention choice as the layers take it (`blocks.attention_kernels`: each (where, kernel, why) once, read
    here without importing the layers this module sits below): per kernel what it is and why, with `fused`, the
    kernel `attend` runs (SDPA or the measured math kernel), and its reason `why_fused` where a path goes there."""
    names = {"sdpa": fused, "sdpa+bias": f"{fused} with a dense (T, S) bias", "flex": "FlexAttention",
             "reference": "the reference path (scores and weights formed)"}
    several = len(paths) > 1
    choice = " / ".join(dict.fromkeys(names[kernel] for _, kernel, _ in paths))
    why = "; ".join(f"{where}: {reason}" if several else reason for where, _, reason in paths)
    kernels = {kernel for _, kernel, _ in paths}
    if kernels & {"sdpa", "sdpa+bias"}:  # the fused kernel's own reason, named where other kernels are listed too
        why += f"; {why_fused}" if kernels <= {"sdpa", "sdpa+bias"} else f"; {fused}: {why_fused}"
    return Choice("attention", choice, why)
