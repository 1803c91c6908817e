"""`python -m benchmarks before_after` refuses, in one line before any worker starts, a tree that is not an attnkit
checkout or whose speed harness predates `step_function` (the one route to a row its workers call)."""

import pytest

from benchmarks import bench_before_after
from benchmarks.common import ROOT


def _checkout(tmp_path, speed_source: str):
    (tmp_path / "src" / "attnkit").mkdir(parents=True)
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / "benchmarks" / "speed.py").write_text(speed_source)
    return tmp_path


def test_this_checkout_is_accepted():
    assert bench_before_after.checkout_problem(ROOT) is None


def test_a_checkout_from_before_step_function_is_refused_naming_the_commit(tmp_path, capsys):
    old = _checkout(tmp_path, "def _step_function(case, impl, dtype):\n    pass\n")
    with pytest.raises(SystemExit) as exited:
        bench_before_after.main(["--old", str(old), "--pairs", "1"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert "no step_function" in err and "3ca609c4" in err and "--old" in err


def test_a_folder_that_is_no_checkout_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit):
        bench_before_after.main(["--old", str(tmp_path), "--pairs", "1"])
    assert "is not an attnkit checkout" in capsys.readouterr().err
