"""attnkit.exercises: the tutorials' checks say right, wrong with the hint, or not answered yet, and an answer that
raises is a wrong answer naming the exception, never a traceback."""

from __future__ import annotations

import pytest

from attnkit.exercises import exercise


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


def test_a_prediction_outside_the_choices_is_told_the_choices_not_that_it_raised():
    @exercise(4, hint="equal scores give equal weights", choices=("lower", "higher"))
    def check(prediction):
        return prediction == "lower"

    verdict = check("maybe")
    assert not verdict
    assert str(verdict) == "exercise 4: answer with one of 'lower', 'higher', not 'maybe'"
    assert "answer with one of" in str(check(3))  # not a string at all
    assert check("lower") and not check("higher")


def test_a_prediction_is_read_whatever_its_case_and_surrounding_spaces():
    @exercise(2, hint="predict one of the two", choices=("about the same", "higher"))
    def check(prediction):
        return prediction == "about the same"  # the choice as the check wrote it

    assert check(" About the Same ") and check("about the same")
    assert not check("HIGHER") and "wrong: predict one of the two" in str(check("HIGHER"))


def test_a_mistyped_prediction_is_told_the_choices_before_the_check_runs_and_prints_what_it_measured(capsys):
    """Predict, then run: a typo must not show the measured answer, or the learner's next try is no prediction."""

    @exercise(4, hint="the unscaled scores spread wider", choices=("lower", "higher"))
    def check(prediction):
        print("measured: mean entropy 0.42 nats")  # what a tutorial's check prints before judging
        return prediction == "lower"

    verdict = check("Lowr")
    assert str(verdict) == "exercise 4: answer with one of 'lower', 'higher', not 'Lowr'"
    assert "measured" not in capsys.readouterr().out
    assert check("Lower")
    assert "measured: mean entropy 0.42" in capsys.readouterr().out
