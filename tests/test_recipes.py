"""Recipes: every shipped recipe builds valid settings; `train --recipe` and `eval --recipe` layer the recipe under
--config and the command line, read data under the data root, and name what is wrong in one line; `attnkit recipes`
lists every file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attnkit import ModelConfig, cli, recipes
from attnkit.train.job import check_request
from attnkit.train.trainer import TrainConfig

SHIPPED = recipes.names()
LINES = ["First Citizen: Before we proceed any further, hear me speak.", "All: Speak, speak.",
         "First Citizen: You are all resolved rather to die than to famish?", "All: Resolved. resolved."]


def _paths(section: dict, key: str) -> list[str]:
    """The paths a recipe section names under `key`: a list (data, val_data) or one path (init_from)."""
    value = section.get(key, ())
    return [value] if isinstance(value, str) else list(value)


def _data_root(tmp_path: Path, recipe: recipes.Recipe) -> Path:
    """A data root holding every path the recipe names (a name with a suffix a small text file, else a folder)."""
    root = tmp_path / "data"
    for section in (recipe.train, recipe.evaluate or {}):
        for item in (i for key in recipes.PATH_KEYS for i in _paths(section, key)):
            if item.startswith(recipes.SYNTHETIC):
                continue
            path = root / item
            if path.suffix:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text("\n".join(LINES * 40) + "\n", encoding="utf-8")
            else:
                path.mkdir(parents=True, exist_ok=True)
    root.mkdir(exist_ok=True)
    return root


def _train(argv: list[str]):
    """(TrainRun, data options, training options) of `attnkit train ARGV` (the tasks' own options among the data
    options)."""
    invocation = cli.parse(["train", *argv])
    request = cli.train_request(invocation.settings, *invocation.sections)
    return invocation.settings, {**request.data, **({"task": request.task} if request.task else {})}, request.settings


def test_there_are_recipes_and_each_file_is_json_with_the_recipe_keys():
    assert {"shakespeare-char", "shakespeare-char-plus"} <= set(SHIPPED)
    for name in SHIPPED:
        values = json.loads((recipes.RECIPE_DIR / f"{name}.json").read_text(encoding="utf-8"))
        assert set(values) <= set(recipes.KEYS) and {"description", "data", "train"} <= set(values), name
        assert "\n" not in values["description"] and "\n" not in values["data"], name


@pytest.mark.parametrize("name", SHIPPED)
def test_every_recipe_builds_valid_settings_with_a_fixed_step_count(name, tmp_path):
    recipe = recipes.load(name)
    root = _data_root(tmp_path, recipe)
    run, data, training = _train(["--recipe", name, "--data-root", str(root)])
    assert run.out == f"runs/{name}"
    config, data_config, settings = check_request(cli.train_request(run, data, training))
    assert config is not None or settings.init_from
    assert isinstance(config, (ModelConfig, type(None)))
    assert "max_time" not in recipe.train and settings.max_steps == recipe.train["max_steps"]
    for key in ("data", "val_data"):
        for item, path in zip(_paths(recipe.train, key), getattr(data_config, key), strict=True):
            assert item.startswith(recipes.SYNTHETIC) or Path(path) == root / item
    if "init_from" in recipe.train:
        assert Path(settings.init_from) == (root / recipe.train["init_from"]).resolve()
    if recipe.evaluate is not None:
        settings = cli.parse(["eval", "--recipe", name, "--data-root", str(root)]).settings
        assert settings.run == f"runs/{name}"
        assert len(settings.data) == len(recipe.evaluate["data"])


def test_the_command_line_wins_over_the_config_file_which_wins_over_the_recipe(tmp_path):
    root = _data_root(tmp_path, recipes.load("shakespeare-char"))
    config = tmp_path / "run.json"
    config.write_text(json.dumps({"lr": 0.002, "warmup": 7, "n_layers": 2}))
    run, data, training = _train(["--recipe", "shakespeare-char", "--data-root", str(root), "--config", str(config),
                                  "--warmup", "3", "--max-steps", "2", "--set", "d_model=64", "--out", "runs/x"])
    model, data_config, settings = check_request(cli.train_request(run, data, training))
    assert (settings.max_steps, settings.warmup, settings.lr) == (2, 3, 0.002)
    assert settings.batch_size == recipes.load("shakespeare-char").train["batch_size"]  # the recipe's
    assert (model.d_model, model.n_layers, model.position) == (64, 2, "learned")
    assert run.out == "runs/x" and data_config.tokenizer == "char"


def test_data_given_on_the_command_line_needs_no_data_root(monkeypatch):
    monkeypatch.delenv(recipes.DATA_ROOT_ENV, raising=False)
    _, data, _ = _train(["--recipe", "shakespeare-char", "--data", "mine.txt"])
    assert data["data"] == ("mine.txt",) and data["tokenizer"] == "char"


def test_the_weights_a_recipe_starts_from_are_under_the_data_root_unless_given(tmp_path):
    root = _data_root(tmp_path, recipes.load("sst2-minilm"))
    _, _, training = _train(["--recipe", "sst2-minilm", "--data-root", str(root)])
    assert training["init_from"] == str(root / "all-MiniLM-L6-v2")
    _, _, training = _train(["--recipe", "sst2-minilm", "--data-root", str(root), "--init-from", "mine"])
    assert training["init_from"] == "mine"
    (root / "all-MiniLM-L6-v2").rmdir()
    assert cli.main(["train", "--recipe", "sst2-minilm", "--data-root", str(root)]) == 2


def test_the_data_root_comes_from_the_environment_when_not_given(tmp_path, monkeypatch):
    root = _data_root(tmp_path, recipes.load("shakespeare-char"))
    monkeypatch.setenv(recipes.DATA_ROOT_ENV, str(root))
    _, data, _ = _train(["--recipe", "shakespeare-char"])
    assert data["data"] == (str(root / "tinyshakespeare" / "input.txt"),)


@pytest.mark.parametrize("argv, expected", [
    (["train", "--recipe", "nope"], "no recipe 'nope'; the recipes are: " + ", ".join(SHIPPED)),
    (["train", "--recipe", "shakespeare-char"], "give --data-root DIR (e.g. --data-root ../shared/data) or set "
                                                "ATTNKIT_DATA=DIR"),
    (["train", "--recipe", "shakespeare-char", "--data-root", "{tmp}"], "reads tinyshakespeare/input.txt under the "
                                                                        "data root"),
    (["train", "--recipe", "shakespeare-char", "--data-root", "{tmp}/absent"], "is no folder"),
    (["eval", "--recipe", "shakespeare-char"], "recipe shakespeare-char has no evaluate section"),
    (["recipes", "nope"], "no recipe 'nope'"),
])
def test_a_wrong_recipe_or_data_root_is_one_line_naming_the_fix(argv, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(recipes.DATA_ROOT_ENV, raising=False)
    assert cli.main([a.format(tmp=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1, err


def test_attnkit_recipes_lists_every_file_and_prints_one_whole(capsys):
    assert cli.main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    files = sorted(recipes.RECIPE_DIR.glob("*.json"), key=lambda p: p.stem)
    assert len(lines) == 2 * len(files)
    for path, head, result in zip(files, lines[::2], lines[1::2], strict=True):
        recipe = recipes.load(path.stem)
        assert head.split(None, 1) == [path.stem, recipe.description]
        assert result.strip() == f"result: {recipe.summary()}"
    assert cli.main(["recipes", "shakespeare-char-plus"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == json.loads((recipes.RECIPE_DIR / "shakespeare-char-plus.json").read_text(encoding="utf-8"))


def test_a_recipe_file_with_an_unknown_key_is_refused(tmp_path, monkeypatch):
    (tmp_path / "odd.json").write_text(json.dumps({"description": "d", "data": "d", "train": {}, "model": {}}))
    monkeypatch.setattr(recipes, "RECIPE_DIR", tmp_path)
    with pytest.raises(recipes.ConfigError, match=r"unknown keys \['model'\]"):
        recipes.load("odd")


def test_eval_takes_the_recipes_evaluate_section(tmp_path, monkeypatch):
    (tmp_path / "held-out.txt").write_text("text\n")
    (tmp_path / "r.json").write_text(json.dumps({"description": "d", "data": "held-out.txt", "train": {},
                                                 "evaluate": {"data": ["held-out.txt"], "batch_size": 4}}))
    monkeypatch.setattr(recipes, "RECIPE_DIR", tmp_path)
    settings = cli.parse(["eval", "--recipe", "r", "--data-root", str(tmp_path), "--batch-size", "8"]).settings
    assert (settings.run, settings.data, settings.batch_size) == ("runs/r", (str(tmp_path / "held-out.txt"),), 8)


def test_a_recipe_trains_from_the_command_line_and_the_same_command_gives_the_same_numbers(tmp_path, capsys):
    root = _data_root(tmp_path, recipes.load("shakespeare-char-plus"))
    losses = []
    for out in ("a", "b"):
        argv = ["train", "--recipe", "shakespeare-char-plus", "--data-root", str(root), "--max-steps", "2",
                "--eval-every", "1", "--sample-tokens", "0", "--no-progress", "--out", str(tmp_path / out)]
        assert cli.main(argv) == 0, capsys.readouterr().err
        lines = [json.loads(line) for line in (tmp_path / out / "metrics.jsonl").read_text().splitlines()]
        losses.append([(line.get("loss"), line.get("val_loss")) for line in lines])
    assert losses[0] == losses[1] and any(val is not None for _, val in losses[0])
    config = json.loads((tmp_path / "a" / "config.json").read_text())
    assert (config["position"], config["norm"], config["activation"]) == ("rope", "rms", "swiglu")
    state = json.loads((tmp_path / "a" / "train_state.json").read_text())
    assert state["step"] == 2 and TrainConfig.from_dict(state["settings"]).batch_size == 12
