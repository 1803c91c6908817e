"""attnkit.exercises: the tutorials' checks say right, wrong with the hint, or not answered yet, and an answer that
raises is a wrong answer naming the exception, never a traceback."""

from __future__ import annotations

import pytest

from attnkit.exercises import exercise, one_of


@exercise(3, hint="square it")
def check_square(square):
    return [square(x) for x in (0, 2, -3)] == [0, 4, 9]


def test_a_right_answer_is_right():
    verdict = check_square(lambda x: x * x)
    assert verdict and verdict.right
    assert str(verdict) == "exercise 3: right"


def test_a_wrong_answer_is_wrong_with_the_hint():
    verdict = check_square(lambda x: 2 * x)
    assert not verdict
    assert str(verdict) == "exercise 3: wrong: square it"


def test_an_answer_that_raises_is_wrong_naming_the_exception_and_the_hint():
    verdict = check_square(lambda x: x.shape[0])
    assert not verdict
    assert "wrong: your answer raised AttributeError: 'int' object has no attribute 'shape'" in str(verdict)
    assert str(verdict).endswith("hint: square it")


def test_an_answer_left_as_none_is_not_answered_yet():
    verdict = check_square(None)
    assert not verdict
    assert "not answered yet" in str(verdict)


def test_a_check_that_returns_a_tensor_is_read_as_its_truth_value():
    torch = pytest.importorskip("torch")

    @exercise(1, hint="all of them")
    def check(answer):
        return torch.tensor(answer).all()

    assert check([1, 1]) and not check([1, 0])
    assert "wrong: your answer raised" in str(check([[1], [1, 1]]))  # a ragged list: torch refuses, it is wrong


def test_one_of_names_the_choices_when_the_answer_is_none_of_them():
    assert one_of("yes", ("yes", "no")) == "yes"

    @exercise(2, hint="predict one of the two")
    def check(prediction):
        return one_of(prediction, ("yes", "no")) == "yes"

    verdict = check("maybe")
    assert not verdict
    assert "answer with one of 'yes', 'no', not 'maybe'" in str(verdict)


def test_a_prediction_outside_the_choices_is_told_the_choices_not_that_it_raised():
    @exercise(4, hint="equal scores give equal weights")
    def check(prediction):
        return one_of(prediction, ("lower", "higher")) == "lower"

    verdict = check("Lower")  # a typo, not a wrong prediction
    assert not verdict
    assert str(verdict) == "exercise 4: answer with one of 'lower', 'higher', not 'Lower'"
    assert check("lower") and not check("higher")
