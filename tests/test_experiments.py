"""The lectures' claims as experiments: each runs at the tiny budget and leaves well-formed results.

The verdicts themselves are not asserted (they depend on the budget and the machine); what is checked is that
every experiment writes its files, its numbers are finite, and its plots are pictures rather than blank canvases.
"""

from __future__ import annotations

import json
import math

import matplotlib.image
import numpy as np
import pytest

from attnkit.errors import ConfigError
from attnkit.experiments import BUDGETS, REGISTRY, Result, get, run_experiment
from attnkit.experiments.base import VERDICTS
from attnkit.experiments.transformer_plus_plus import flops_to_reach


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_experiment_writes_results_table_and_plots(name, tmp_path):
    result = run_experiment(name, budget="tiny", out=tmp_path)

    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["name"] == name and saved["budget"] == "tiny"
    assert saved["verdict"] in VERDICTS and saved["reason"] and saved["key_number"]
    assert saved["claim"] == REGISTRY[name].claim and saved["lecture"] == REGISTRY[name].lecture
    assert result.rows, "an experiment reports at least one row"
    numbers = [v for row in result.rows for v in row.values() if isinstance(v, float)]
    assert numbers and all(math.isfinite(v) for v in numbers)  # a number that cannot exist is None, not NaN

    table = (tmp_path / "table.md").read_text()
    assert f"**{result.verdict}**" in table
    assert table.count("\n|") >= len(result.rows) + 1  # header rule and one line per row

    assert result.plots
    for plot in result.plots:
        pixels = matplotlib.image.imread(tmp_path / plot)[..., :3]  # (H, W, RGB) in [0, 1]
        assert pixels.shape[0] >= 200 and pixels.shape[1] >= 200
        assert float(np.std(pixels)) > 0.02, f"{plot} is blank"
        assert float((pixels.mean(axis=-1) < 0.9).mean()) > 0.005, f"{plot} has almost nothing drawn on it"


def test_unknown_experiment_names_the_nearest_or_lists_the_known_ones():
    with pytest.raises(ConfigError, match="did you mean 'norm-placement'"):
        get("norm-placment")
    with pytest.raises(ConfigError) as error:
        get("no-such-claim")
    for name in REGISTRY:
        assert name in str(error.value)


def test_unknown_budget_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="budget"):
        run_experiment("kernel-regression", budget="huge", out=tmp_path)
    assert "tiny" in BUDGETS and not (tmp_path / "results.json").exists()


def test_result_refuses_an_unknown_verdict():
    with pytest.raises(ValueError, match="verdict"):
        Result("probably", "because", "1", [{"a": 1.0}])


def test_flops_to_reach_interpolates_in_log_flops():
    points = [(1e6, 3.0), (1e8, 2.0)]
    assert flops_to_reach(points, 2.5) == pytest.approx(1e7)  # half-way in loss is half-way in log-FLOPs
    assert flops_to_reach(points, 3.5) == 1e6  # the smallest model already reaches it
    assert flops_to_reach(points, 1.0) is None  # none reaches it


def test_command_line_runs_an_experiment_and_lists_them(tmp_path, capsys):
    from attnkit import cli

    assert cli.main(["experiment", "kernel-regression", "--budget", "tiny", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["verdict"] in printed and saved["reason"] in printed
    assert cli.main(["experiment", "--list"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert sorted(line.split(":")[0] for line in listed) == sorted(REGISTRY)
    assert cli.main(["experiment", "no-such-claim"]) == 2
    assert "known experiments: " in capsys.readouterr().err


def test_decoding_speeds_interleave_the_models_and_keep_each_ones_best_round(monkeypatch):
    from attnkit.experiments import gqa_memory

    calls, timings = [], iter([5.0, 1.0, 2.0, 9.0, 4.0, 3.0])  # rounds of (model a, model b)
    monkeypatch.setattr(gqa_memory, "decode_tokens_per_second",
                        lambda model, **decoding: calls.append(model) or next(timings))
    assert gqa_memory.decode_speeds(["a", "b"], rounds=3, batch=1) == [5.0, 9.0]
    assert calls == ["a", "b"] * 3


def test_running_mean_averages_each_value_with_those_before_it():
    from attnkit.experiments.plots import running_mean

    values = [4.0, 2.0, 6.0, 0.0, 8.0]
    assert running_mean(values, window=1) == values
    assert running_mean(values, window=2) == [4.0, 3.0, 4.0, 3.0, 4.0]
    assert running_mean(values, window=3) == pytest.approx([4.0, 3.0, 4.0, 8 / 3, 14 / 3])
