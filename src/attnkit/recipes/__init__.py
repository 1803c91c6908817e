"""Recipes: training setups shipped with attnkit, each with the figure it reached on real data written beside it.

A recipe is one JSON file in this folder, NAME.json (`attnkit recipes` lists them, `attnkit recipes NAME` prints
one, `attnkit train --recipe NAME` trains it, `attnkit eval --recipe NAME` computes its test figure):

    description  one line: what it trains, on what, in which setting
    data         one line: the data layout it expects under the data root
    train        `attnkit train` options as a --config file holds them (keys = option names, model fields too)
    evaluate     optional: `attnkit eval` options that compute the recipe's test figure
    result       optional: what it reached here: `summary` (one line, shown by `attnkit recipes`), `metrics`,
                 `steps`, `train_seconds`, `machine`, `threads`, `load_average`, `date`, `command`

Data paths (`data`, `val_data` in `train` and `evaluate`) and the weights to start from (`init_from`, e.g. a
Hugging Face checkpoint directory) are relative to the data root: `--data-root DIR`, else the environment variable
ATTNKIT_DATA. The run directory is runs/NAME unless `--out` (train) or `--run` (eval)
says otherwise. Everything given on the command line or in a --config file wins over the recipe.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attnkit.errors import ConfigError, InputError, unknown_name

RECIPE_DIR = Path(__file__).resolve().parent
DATA_ROOT_ENV = "ATTNKIT_DATA"
PATH_KEYS = ("data", "val_data", "init_from")  # options holding paths (data; weights to start from), read
# relative to the data root: lists of paths (data, val_data) or one path (init_from)
RUN_KEYS = {"train": "out", "evaluate": "run"}  # each section's run directory option: runs/NAME by default
KEYS = ("description", "data", "train", "evaluate", "result")
SYNTHETIC = "synthetic:"


@dataclass(frozen=True)
class RecipeOptions:
    """The options of a command that can start from a recipe (`train`, `eval`)."""

    recipe: str | None = None  # a shipped recipe (`attnkit recipes` lists them); options given here win over it
    data_root: str | None = field(default=None, metadata={"metavar": "DIR"})
    """the folder the recipe's data paths are relative to, e.g. ../shared/data; none: $ATTNKIT_DATA"""


@dataclass(frozen=True)
class Recipe:
    name: str
    description: str
    data: str
    train: dict[str, Any]
    evaluate: dict[str, Any] | None = None
    result: dict[str, Any] | None = None

    @property
    def path(self) -> Path:
        return RECIPE_DIR / f"{self.name}.json"

    def summary(self) -> str:
        """The result's one line, or what is known without one."""
        return self.result["summary"] if self.result else "no result recorded here yet"

    def settings(self, section: str, data_root: str | Path | None, *, given: Collection[str] = (),
                 paths: bool = True) -> dict[str, Any]:
        """The options of `section` ("train" or "evaluate"), data paths under the data root, the run directory
        runs/NAME unless the section names one. Options in `given` (the command line's, the --config file's) are
        left out, so data the command line replaces need not exist; data given replaces the recipe's validation
        data too (give --val-data for the new data's own). Raises InputError when data is missing. `paths=False`:
        data paths as the recipe writes them, unchecked (a look at its other options, as `--help` takes)."""
        values = self.train if section == "train" else self.evaluate
        if values is None:
            raise InputError(f"recipe {self.name} has no {section} section; it holds {', '.join(self.sections())}")
        out = {RUN_KEYS[section]: f"runs/{self.name}", **values}
        if "data" in given:  # other data: the recipe's validation file belongs to its own data, not to these
            given = {*given, "val_data"}
        out = {k: v for k, v in out.items() if k not in given}
        found = {k: out[k] for k in PATH_KEYS if k in out} if paths else {}
        if found:
            root = _data_root(self.name, data_root)
            for key, items in found.items():
                out[key] = self._under(root, items) if isinstance(items, str) else [self._under(root, i) for i in items]
        return out

    def sections(self) -> list[str]:
        return [key for key in ("train", "evaluate") if getattr(self, key) is not None]

    def _under(self, root: Path, item: str) -> str:
        if item.startswith(SYNTHETIC):
            return item
        path = root / item
        if not path.exists():
            raise InputError(f"recipe {self.name} reads {item} under the data root {root}, which holds no such "
                             f"path: give --data-root DIR (or set {DATA_ROOT_ENV}) naming the folder that holds it "
                             f"(expected: {self.data})")
        return str(path)


def names() -> list[str]:
    """The shipped recipes, sorted."""
    return sorted(p.stem for p in RECIPE_DIR.glob("*.json"))


def load(name: str) -> Recipe:
    """The recipe `name`. Raises InputError for an unknown name (listing the names), ConfigError for a file
    that is not a recipe."""
    path = RECIPE_DIR / f"{name}.json"
    if "/" in name or not path.is_file():
        raise InputError(unknown_name("no recipe", name, names(), otherwise=f"the recipes are: {', '.join(names())}"))
    try:
        values = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ConfigError(f"recipe {path} is not valid JSON: {err}") from None
    if not isinstance(values, dict):
        raise ConfigError(f"recipe {path} must hold one JSON object with {', '.join(KEYS)}")
    unknown = sorted(set(values) - set(KEYS))
    missing = [k for k in ("description", "data", "train") if k not in values]
    if unknown or missing:
        raise ConfigError(f"recipe {path}: unknown keys {unknown}, missing keys {missing}; a recipe holds "
                          f"{', '.join(KEYS)} (evaluate and result optional)")
    for key in ("train", "evaluate", "result"):
        if values.get(key) is not None and not isinstance(values[key], dict):
            raise ConfigError(f"recipe {path}: {key} must be an object of option: value")
    return Recipe(name=name, **values)


def _data_root(name: str, given: str | Path | None) -> Path:
    root = given if given is not None else os.environ.get(DATA_ROOT_ENV)
    if not root:
        raise InputError(f"recipe {name} reads its data under a data root: give --data-root DIR (e.g. "
                         f"--data-root ../shared/data) or set {DATA_ROOT_ENV}=DIR")
    path = Path(root).expanduser()
    if not path.is_dir():
        where = "--data-root" if given is not None else DATA_ROOT_ENV
        raise InputError(f"the data root {path} ({where}) is no folder: give --data-root DIR or set "
                         f"{DATA_ROOT_ENV}=DIR to the folder holding the data sets")
    return path
