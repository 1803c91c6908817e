"""Checks for the tutorials' exercises: right, wrong with a hint, or not answered yet.

A tutorial writes each check as a function of the learner's answer that returns whether it is right, and wraps it
with `exercise`:

    @exercise(1, hint="the rows of the weights sum to 1: softmax over the keys, not the queries")
    def check_1(weights_fn):
        return torch.allclose(weights_fn(q, k), expected)

    check_1(my_answer)   # Verdict: "exercise 1: right" / "exercise 1: wrong: <hint>"

An exception raised while checking (the learner's code failing on the check's inputs, a shape that does not match)
is a wrong answer that names the exception, followed by the hint, not a traceback; an answer left as None (the cell
as the tutorial gives it) is "not answered yet". A prediction (*predict, then run*) names its choices,
`@exercise(3, hint=..., choices=("lower", "higher"))`: the prediction is read first (case and surrounding spaces
aside) and one that is none of them is told the choices, without a hint, before the check runs, so a typo never sees
what the check measures and prints; the check then receives the choice as written in `choices`. A `Verdict` is true
when the answer is right, so a tutorial holds each check to its solution (`assert check_1(solution)`) and to a wrong
answer (`assert not check_1(wrong)`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Verdict:
    """What a check says of one answer: `right`, and the line a learner reads (`str(verdict)`)."""

    number: int
    right: bool
    message: str

    def __bool__(self) -> bool:
        return self.right

    def __str__(self) -> str:
        return f"exercise {self.number}: {self.message}"

    def __repr__(self) -> str:  # the notebook shows a check's result as its line
        return str(self)


def exercise(number: int, *, hint: str, choices: Sequence[str] | None = None
             ) -> Callable[[Callable[[Any], Any]], Callable[[Any], Verdict]]:
    """Turn `test(answer) -> bool` into a check that returns a `Verdict`: right, wrong with `hint`, wrong naming the
    exception the answer raised (with `hint`), or not answered yet (answer None). With `choices` (a prediction), an
    answer that is none of them is told the choices before `test` runs, and `test` receives the choice it names."""

    def decorate(test: Callable[[Any], Any]) -> Callable[[Any], Verdict]:
        @functools.wraps(test)
        def check(answer: Any) -> Verdict:
            if answer is None:
                return Verdict(number, False, "not answered yet: put your answer where the cell says, then run it")
            if choices is not None:
                said = answer.strip().lower() if isinstance(answer, str) else None
                chosen = [c for c in choices if c.lower() == said]
                if not chosen:  # a typo in a prediction is not a wrong prediction, and must not see the measurement
                    return Verdict(number, False, f"answer with one of {', '.join(repr(c) for c in choices)}, "
                                                  f"not {answer!r}")
                answer = chosen[0]
            try:
                right = bool(test(answer))
            except Exception as error:  # the learner's code, run on the check's inputs: any failure is an answer
                reason = str(error).strip().splitlines()[0] if str(error).strip() else "(no message)"
                return Verdict(number, False, f"wrong: your answer raised {type(error).__name__}: {reason}\n"
                                              f"  hint: {hint}")
            return Verdict(number, right, "right" if right else f"wrong: {hint}")

        return check

    return decorate
