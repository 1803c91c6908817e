"""The one rule that turns an experiment's checks into its verdict, and how experiments show progress."""

from __future__ import annotations

import logging
import math
import os
import shutil
import statistics
import subprocess

import pytest

from attnkit.experiments.base import Check, Progress, Result, t_95, verdict_of


def test_noise_is_the_95_percent_interval_of_the_mean_over_seeds():
    samples = [0.30, 0.10, 0.20]
    check = Check.over("a", samples)
    assert check.difference == pytest.approx(0.2)
    assert check.spread == pytest.approx(statistics.stdev(samples))
    assert check.noise == pytest.approx(4.30 * 0.1 / math.sqrt(3))  # Student's t with 2 degrees of freedom
    assert check.basis == "3 seeds" and check.outcome == "inside noise"  # 0.2 < 0.248


def test_t_quantiles_match_the_table_and_its_tail():
    assert t_95(1) == pytest.approx(12.71) and t_95(10) == pytest.approx(2.23)
    assert t_95(30) == pytest.approx(2.042, abs=0.01) and t_95(1000) == pytest.approx(1.96, abs=0.01)
    assert t_95(0) == math.inf


def test_one_seed_decides_nothing():
    check = Check.over("a", [5.0])
    assert check.noise == math.inf and check.outcome == "inside noise"
    assert verdict_of([check])[0] == "inconclusive at this budget"


def test_a_pooled_spread_gives_a_single_run_its_noise():
    check = Check.over("a", [0.5], spread=0.1, df=4)
    assert check.noise == pytest.approx(2.78 * 0.1)
    assert check.outcome == "for" and "pooled" in check.basis


def test_outcomes_follow_the_sign_beyond_the_noise():
    assert Check("a", 1.0, 0.5, "x").outcome == "for"
    assert Check("a", -1.0, 0.5, "x").outcome == "against"
    assert Check("a", 0.4, 0.5, "x").outcome == "inside noise"
    assert Check("a", -0.4, 0.5, "x").outcome == "inside noise"
    assert Check.fact("a", True).outcome == "for" and Check.fact("a", False).outcome == "against"


@pytest.mark.parametrize(("outcomes", "verdict"), [
    (["for", "for"], "held"),
    (["against", "against"], "did not hold at this scale"),
    (["for", "against"], "mixed"),
    (["for", "inside noise"], "inconclusive at this budget"),
    (["inside noise"], "inconclusive at this budget"),
    (["against", "inside noise"], "did not hold at this scale"),
    (["for", "against", "inside noise"], "mixed"),
])
def test_verdict_rule(outcomes, verdict):
    difference = {"for": 1.0, "against": -1.0, "inside noise": 0.1}
    checks = [Check(f"check {i}", difference[o], 0.5, "3 seeds", spread=0.5, n=3) for i, o in enumerate(outcomes)]
    assert verdict_of(checks)[0] == verdict


def test_equal_losses_are_never_a_verdict():
    """scaled-dot at the tiny budget once said 'held' with both losses 4.372: equal numbers are inside any noise."""
    check = Check.over("unscaled loss minus scaled", [4.372 - 4.372, 4.371 - 4.372])
    assert verdict_of([check, Check.fact("saturates at initialisation", True)])[0] == "inconclusive at this budget"


def test_inconclusive_says_what_would_decide_it():
    check = Check.over("gap", [0.12, 0.08, 0.10, 0.16, 0.04])  # mean 0.1, sd 0.0447: noise 0.0555 at n=5
    assert check.outcome == "for"
    small = Check.over("gap", [0.02, 0.12, -0.02])  # mean 0.04, sd 0.072: needs about 16 seeds
    verdict, decision = verdict_of([small])
    assert verdict == "inconclusive at this budget"
    needed = next(n for n in range(4, 200) if t_95(n - 1) * small.spread / math.sqrt(n) < small.difference)
    assert f"about {needed} seeds (now 3; --seeds {needed})" in decision
    assert "larger budget" in Check.over("gap", [0.1, -0.1, 0.0]).to_decide()  # no difference: seeds cannot tell


def test_result_takes_its_verdict_from_the_checks_only():
    result = Result([Check.over("gap", [0.0, 0.01])], "losses 4.372 and 4.372", "4.372 vs 4.372", [{"a": 1.0}])
    assert result.verdict == "inconclusive at this budget"
    assert result.summary().startswith("inconclusive at this budget: losses 4.372 and 4.372. Gap is")
    with pytest.raises(ValueError, match="at least one check"):
        Result([], "because", "1", [{"a": 1.0}])


def test_progress_logs_each_phase_and_every_fifth_of_the_steps(caplog):
    progress = Progress(bars=False)
    with caplog.at_level(logging.INFO, logger="attnkit.experiments.base"):
        progress.phase("training pre-norm")
        assert list(progress.steps(10, "pre-norm, seed 0")) == list(range(1, 11))
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["training pre-norm"] + [f"pre-norm, seed 0: step {n}/10" for n in (2, 4, 6, 8, 10)]


def test_progress_bars_count_the_same_steps(caplog):
    with caplog.at_level(logging.INFO, logger="attnkit.experiments.base"):
        assert list(Progress(bars=True).steps(7, "run")) == list(range(1, 8))
    assert not caplog.records  # the bar, not log lines


def test_a_run_that_diverged_leaves_its_check_undecided_and_says_so():
    """A nan loss made the difference nan: 'inside noise', with more seeds named as what would decide it, and a
    results.json holding NaN. The check is undecided with the count of runs that gave no number, and names finite
    runs as the fix."""
    check = Check.over("a", [0.5, math.nan, 0.7])
    assert check.outcome == "inside noise" and check.noise == math.inf and check.unmeasured == 1
    assert check.difference == pytest.approx(0.6) and "1 of them no finite value" in check.basis
    verdict, decision = verdict_of([check, Check.over("b", [1.0, 1.1, 0.9])])
    assert verdict == "inconclusive at this budget"
    assert "--seeds" not in decision and "runs that stay finite" in decision
    assert Check.over("c", [math.inf, math.nan]).difference == 0.0


def test_a_check_seeds_do_not_repeat_never_names_more_seeds_as_its_fix():
    """transformer-plus-plus runs its larger sizes once whatever --seeds says; an undecided check there named
    '--seeds 3' as what would decide it, which runs that size once again."""
    once = Check.over("a", [0.2], spread=0.1, df=4, repeated=False)  # noise 0.278: inside
    assert once.outcome == "inside noise"
    verdict, decision = verdict_of([once])
    assert verdict == "inconclusive at this budget" and "--seeds" not in decision.replace("--seeds does not", "")
    assert "a larger budget" in decision
    assert "--seeds" in Check.over("a", [0.2], spread=0.1, df=4).to_decide()  # where seeds repeat it, they are named


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_code_version_names_a_commit_only_of_the_repository_that_tracks_the_code(tmp_path, monkeypatch):
    """An attnkit installed (untracked) inside another project's checkout would have named that project's commit."""
    from attnkit.experiments import base

    def commit_all() -> None:
        subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m"], cwd=tmp_path,
                       check=True)

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    (tmp_path / "README").write_text("another project\n")
    commit_all()
    copy = tmp_path / "attnkit" / "experiments" / "base.py"  # the package's layout: its changes are counted too
    copy.parent.mkdir(parents=True)
    copy.write_text("# a stand-in for the module\n")
    monkeypatch.setattr(base, "__file__", str(copy))
    assert "commit" not in base.code_version()
    commit_all()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, capture_output=True, text=True,
                            check=True).stdout.strip()
    assert base.code_version().endswith(f", commit {commit}")


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_code_version_leaves_the_checkouts_index_alone(tmp_path, monkeypatch):
    """A plain `git status` refreshes .git/index (taking index.lock) where a tracked file's times changed: a run
    started beside a commit in the same checkout could make that commit fail on the lock."""
    from attnkit.experiments import base

    module = tmp_path / "attnkit" / "experiments" / "base.py"
    module.parent.mkdir(parents=True)
    module.write_text("# a stand-in for the module\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "add", "."], cwd=tmp_path, check=True)
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "m"], cwd=tmp_path, check=True)
    index = tmp_path / ".git" / "index"
    os.utime(module, ns=(module.stat().st_atime_ns, module.stat().st_mtime_ns + 10**9))  # the same text, touched
    before = index.read_bytes()
    monkeypatch.setattr(base, "__file__", str(module))
    assert "+ changes" not in base.code_version()
    assert index.read_bytes() == before
