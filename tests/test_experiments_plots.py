"""The experiments' plotting rules: value axes that do not magnify noise, and the seeds' spread drawn."""

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.container import ErrorbarContainer

from attnkit.cli import main
from attnkit.errors import InputError
from attnkit.experiments import Stored, ab_task, replot
from attnkit.experiments.plots import (
    LOG_MIN_DECADES,
    NOT_STORED,
    fit_value_axis,
    min_span,
    new_figure,
    series,
    value_range,
)

values = st.floats(min_value=-1e9, max_value=1e9, allow_nan=False)
positive = st.floats(min_value=1e-9, max_value=1e9)


@settings(max_examples=300, deadline=None)
@given(values, values, st.sampled_from(["fraction", "from zero", "level"]))
def test_a_value_axis_holds_its_values_and_never_spans_less_than_its_floor(a, b, scale):
    low, high = min(a, b), max(a, b)
    bottom, top = value_range(low, high, scale)
    assert bottom <= low and top >= high
    assert top - bottom >= min_span(low, high, scale)


@settings(max_examples=300, deadline=None)
@given(positive, positive)
def test_a_log_axis_spans_at_least_a_decade(a, b):
    low, high = min(a, b), max(a, b)
    bottom, top = value_range(low, high, "log")
    assert bottom <= low * (1 + 1e-12) and top >= high * (1 - 1e-12)
    assert math.log10(top) - math.log10(bottom) >= LOG_MIN_DECADES * (1 - 1e-9)


def test_a_tiny_difference_between_losses_looks_tiny():
    bottom, top = value_range(2.300, 2.303, "level")  # 0.003 nats apart
    assert 0.003 / (top - bottom) < 0.02
    assert value_range(0.49, 0.51, "fraction") == pytest.approx((-0.05, 1.05))
    assert value_range(4600.0, 5800.0, "from zero")[0] < 0 < 4600.0


def test_bad_ranges_are_refused():
    with pytest.raises(ValueError, match="positive"):
        value_range(0.0, 1.0, "log")
    with pytest.raises(ValueError, match="finite"):
        value_range(1.0, math.nan, "level")


def test_a_multi_seed_series_draws_each_seed_and_the_axis_takes_them_in():
    fig, ax = new_figure(4, 3)
    seeds = [[2.30, 2.31, 2.29], [2.10, 2.40, 2.20]]
    shown = series(ax, [1, 2], [2.30, 2.233], seeds=seeds, label="a")
    assert shown == "faint points: each seed"
    (points,) = ax.collections
    assert len(points.get_offsets()) == 6
    fit_value_axis(ax, "level")
    bottom, top = ax.get_ylim()
    assert bottom < 2.10 and top > 2.40 and top - bottom >= min_span(2.10, 2.40, "level")


def test_a_series_with_a_stored_deviation_draws_error_bars_and_one_without_says_so():
    fig, ax = new_figure(4, 3)
    assert series(ax, [1, 2], [2.3, 2.2], sd=[0.05, None], label="a") == "bars: +-1 sd over seeds"
    assert sum(isinstance(c, ErrorbarContainer) for c in ax.containers) == 1
    assert series(ax, [1, 2], [2.4, 2.5], label="b") == NOT_STORED
    assert sum(isinstance(c, ErrorbarContainer) for c in ax.containers) == 1


def two_seed_run() -> Stored:
    rows = [{"pooling": "attention", "accuracy, length 4": 1.0, "accuracy, length 64": 0.99},
            {"pooling": "plain average", "accuracy, length 4": 1.0, "accuracy, length 64": 0.5}]
    per_seed = [{"accuracy, length 4": [1.0, 1.0], "accuracy, length 64": [0.98, 1.0]},
                {"accuracy, length 4": [1.0, 1.0], "accuracy, length 64": [0.45, 0.55]}]
    return Stored(rows, per_seed, "tiny", 2)


def test_an_experiment_plot_of_a_multi_seed_run_draws_each_seed_on_a_0_1_axis(tmp_path, monkeypatch):
    drawn = []
    monkeypatch.setattr(ab_task, "save", lambda fig, path: drawn.append(fig))
    assert ab_task.plot(two_seed_run(), tmp_path) == ["accuracy.png"]
    (ax,) = drawn[0].axes
    assert sum(len(c.get_offsets()) for c in ax.collections) == 2 * 2 * 2  # rows x lengths x seeds
    assert ax.get_ylim()[0] <= 0 and ax.get_ylim()[1] >= 1
    assert "each seed" in " ".join(t.get_text() for t in ax.get_legend().get_texts())


def test_replot_redraws_a_stored_run_and_notes_a_spread_it_lacks(tmp_path, capsys):
    stored = two_seed_run()
    results = {"name": "ab-task", "budget": "full", "rows": stored.rows, "plots": ["accuracy.png"],
               "checks": [{"n": 4, "unit": "seeds"}]}  # stored before per_seed was written
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert main(["experiment", "--replot", str(tmp_path)]) == 0
    assert "redrew accuracy.png" in capsys.readouterr().out
    assert (tmp_path / "accuracy.png").stat().st_size > 10_000
    assert Stored.read(results, 3).seeds == 4 and Stored.read(results, 3).spread([(0, "x")]) is None
    with pytest.raises(InputError, match="results.json"):
        replot(tmp_path / "elsewhere")
    (tmp_path / "results.json").write_text("{")
    with pytest.raises(InputError, match="not JSON"):
        replot(tmp_path)
    for other in ("[1, 2]", json.dumps({"name": "ab-task", "rows": []})):  # JSON, but not an experiment's results
        (tmp_path / "results.json").write_text(other)
        with pytest.raises(InputError, match="is not an experiment's results"):
            replot(tmp_path)


@pytest.mark.parametrize(("edit", "said"), [
    (lambda r: r.update(rows="accuracy"), "rows='accuracy' must be a list of JSON objects"),
    (lambda r: r.update(rows=["x"]), "rows\\[0\\] must be a JSON object"),
    (lambda r: r.update(budget="huge"), "budget='huge' must be one of tiny, small, full"),
    (lambda r: r.update(budget=3), "budget=3 must be a string"),
    (lambda r: r["rows"][1].update(dict.fromkeys(r["rows"][1])), "rows\\[1\\] holds no value"),
    (lambda r: r["rows"][0].update(pooling=[5]), "rows\\[0\\].pooling=\\[5\\] must be a number, a string"),
    (lambda r: r.update(per_seed=[{"x": "high"}] * 2), "per_seed\\[0\\].x='high' must be a list of numbers"),
    (lambda r: r.update(per_seed=[{}]), "per_seed has 1 entries for 2 rows"),
    (lambda r: r.update(seeds="2"), "seeds='2' must be a whole number"),
    (lambda r: [row.pop("pooling") for row in r["rows"]], "a row lacks the column 'pooling'"),
])
def test_replot_checks_the_types_and_values_of_what_it_reads(tmp_path, edit, said):
    stored = two_seed_run()
    results = {"name": "ab-task", "budget": "tiny", "rows": [dict(row) for row in stored.rows], "plots": []}
    edit(results)
    (tmp_path / "results.json").write_text(json.dumps(results))
    with pytest.raises(InputError, match=said) as refusal:
        replot(tmp_path)
    assert str(tmp_path / "results.json") in str(refusal.value) and "rerun the experiment" in str(refusal.value)


def test_replot_refuses_a_run_of_another_experiment_than_named(tmp_path, capsys):
    results = {"name": "ab-task", "budget": "tiny", "rows": two_seed_run().rows}
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert main(["experiment", "bottleneck", "--replot", str(tmp_path)]) != 0
    assert "holds a run of ab-task, not bottleneck: give `attnkit experiment ab-task" in capsys.readouterr().err
    assert not (tmp_path / "accuracy.png").exists()


def test_bottleneck_plot_places_its_length_buckets_by_position(tmp_path, caplog):
    """Buckets named "2-4", "5-8" were drawn as matplotlib categories, which it logged as strings parsable as dates,
    once per line drawn; they sit at positions 0, 1, ... labelled with their names."""
    import logging

    from attnkit.experiments import bottleneck

    rows = [{"model": name, "exact 2-4": 0.5, "exact 5-8": 0.25, "per symbol 2-4": 0.75, "per symbol 5-8": 0.5}
            for name in ("GRU, no attention", "Transformer")]
    with caplog.at_level(logging.INFO):
        assert bottleneck.plot(Stored(rows, [], "tiny", 2), tmp_path) == ["accuracy_by_length.png"]
    assert "categorical units" not in caplog.text


@pytest.mark.parametrize(("name", "row", "column", "value"), [
    ("scaled-dot", 1, "D", "abc"),
    ("transformer-plus-plus", 0, "val loss", None),
    ("rnn-vs-transformer-cost", 0, "ms per step", -1.0),
    ("gqa-memory", 0, "KV bytes per token", "abc"),
])
def test_replot_refuses_values_its_plots_cannot_draw_naming_the_file(tmp_path, name, row, column, value):
    """A results.json whose fields have the right form but a value of the wrong kind for its column (text for a
    head dimension, a loss missing, a negative time on a log axis) failed with a TypeError or ValueError traceback
    from inside matplotlib."""
    from pathlib import Path

    results = json.loads((Path(__file__).parents[1] / "docs" / "experiments" / name / "results.json").read_text())
    results["rows"][row][column] = value
    (tmp_path / "results.json").write_text(json.dumps(results))
    with pytest.raises(InputError, match="plots cannot draw") as refusal:
        replot(tmp_path)
    assert str(tmp_path / "results.json") in str(refusal.value) and "rerun the experiment" in str(refusal.value)


def test_replot_refuses_the_options_of_a_run_it_would_ignore(tmp_path, capsys):
    """--replot DIR --out OTHER redrew into DIR and said nothing of OTHER; --seeds, --budget and --device were
    dropped as silently."""
    results = {"name": "ab-task", "budget": "tiny", "rows": two_seed_run().rows}
    (tmp_path / "results.json").write_text(json.dumps(results))
    assert main(["experiment", "--replot", str(tmp_path), "--out", str(tmp_path / "other"), "--seeds", "4"]) == 2
    assert "--out, --seeds would be ignored; drop them" in capsys.readouterr().err
    assert not (tmp_path / "accuracy.png").exists() and not (tmp_path / "other").exists()
    assert main(["experiment", "--replot", str(tmp_path), "--budget", "full"]) == 2
    assert "--budget would be ignored; drop it" in capsys.readouterr().err
    assert main(["experiment", "--replot", str(tmp_path)]) == 0 and (tmp_path / "accuracy.png").exists()


def test_position_plot_says_where_a_scheme_refused_longer_inputs(tmp_path, monkeypatch):
    """The learned table's line stopped at the training length with nothing on the picture saying why."""
    from attnkit.experiments import position_extrapolation

    legends = []
    monkeypatch.setattr(position_extrapolation, "save", lambda fig, path: legends.extend(
        text.get_text() for ax in fig.axes for text in ax.get_legend().get_texts()))
    rows = [{"position": "learned", "loss at 8": 4.4, "loss at 16": 4.3, "loss at 32": None, "loss at 64": None,
             "refused": "position 31 is beyond max_seq_len=16"},
            {"position": "alibi", "loss at 8": 4.4, "loss at 16": 4.3, "loss at 32": 4.3, "loss at 64": 4.3,
             "refused": ""}]
    position_extrapolation.plot(Stored(rows, [], "tiny", 2), tmp_path)
    assert "learned (refuses past 16)" in legends and "alibi" in legends
