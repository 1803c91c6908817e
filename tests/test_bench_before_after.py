"""`python -m benchmarks before_after` refuses, in one line before any worker starts, a tree that is not an attnkit
checkout or whose speed harness has no route to a row, and runs a worker in a checkout from before the route's public
name (`_step_function`, 7820aaab to 3ca609c4), as it does in this one."""

import pytest

from benchmarks import bench_before_after
from benchmarks.common import ROOT

# A harness that times nothing: one case, and the route to it under `name`.
HARNESS = """
from dataclasses import dataclass


@dataclass
class Case:
    name: str


CASES = [Case("tiny")]


def {name}(case, impl, dtype, device="cpu"):
    return None, lambda: None
"""


def _checkout(tmp_path, speed_source: str):
    (tmp_path / "src" / "attnkit").mkdir(parents=True)
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "speed.py").write_text(speed_source)
    return tmp_path


def test_this_checkout_is_accepted_and_its_worker_calls_step_function():
    assert bench_before_after.checkout_problem(ROOT) is None
    assert bench_before_after.harness_route(ROOT) == "step_function"


def test_a_worker_runs_in_a_checkout_whose_harness_names_its_route_privately(tmp_path):
    """The checkouts from before 3ca609c4 (such as f612c42, the one docs/benchmarks.md compares the inference plan
    against) name the route `_step_function`: accepted, and a worker there times a repetition."""
    old = _checkout(tmp_path, HARNESS.format(name="_step_function"))
    assert bench_before_after.checkout_problem(old) is None
    worker = bench_before_after.Worker(old, "tiny", "attnkit", "fp32", 1, "wall")
    try:
        assert worker.time_one() >= 0.0
    finally:
        worker.close()


def test_a_checkout_whose_harness_has_no_route_is_refused_naming_the_commit(tmp_path, capsys):
    old = _checkout(tmp_path, HARNESS.format(name="build_row"))
    with pytest.raises(SystemExit) as exited:
        bench_before_after.main(["--old", str(old), "--pairs", "1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "neither step_function nor _step_function" in err and "7820aaab" in err and "--old" in err


def test_a_folder_that_is_no_checkout_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench_before_after.main(["--old", str(tmp_path), "--pairs", "1"])
    assert "is not an attnkit checkout" in capsys.readouterr().err
