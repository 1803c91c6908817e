"""The tutorials (docs/tutorials/*.py, jupytext scripts) run top to bottom at the tiny budget, so none can rot.

Each is turned into a notebook with jupytext and executed by nbclient in a fresh kernel, as Jupyter and the site
run it; a failing cell (an assertion that attnkit's module differs from the from-scratch code included) fails the
test with the cell's error.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext", reason="the tutorial tests need jupytext (dev extra)")
nbclient = pytest.importorskip("nbclient", reason="the tutorial tests need nbclient (dev extra)")
pytest.importorskip("ipykernel", reason="the tutorial tests need ipykernel (dev extra)")

TUTORIALS = Path(__file__).resolve().parents[1] / "docs" / "tutorials"
NOTEBOOKS = sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))
COURSES = ("UvA", "CMU 11-711", "USC CSCI 499", "UT CS 371N", "COGS 150")


def test_the_tutorials_are_there_one_per_number():
    numbers = [int(p.name[:2]) for p in NOTEBOOKS]
    assert len(numbers) == len(set(numbers)), [p.name for p in NOTEBOOKS]
    assert {*range(1, 9), 10} <= set(numbers), [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_tutorial_checks_itself_against_attnkit_and_cites_its_lecture(path):
    text = path.read_text()
    assert re.search(r"torch\.testing\.assert_(close|equal)\(", text), "no assertion that attnkit computes the same"
    assert any(course in text for course in COURSES), f"{path.name} names none of the courses {COURSES}"
    assert "ATTNKIT_TUTORIAL_BUDGET" in text, f"{path.name} has no budget switch"
    exercises = text.partition("\n# ## Exercises\n")[2]
    assert re.search(r"^assert check", exercises, re.M), f"{path.name} has no exercises held to their solutions"
    assert re.search(r"^assert not check", exercises, re.M), f"{path.name}'s exercise checks never say wrong"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_tutorial_has_four_checked_exercises_with_their_solutions_folded(path):
    """At least four exercises, each checked through attnkit.exercises (so an error in the learner's code is a wrong
    answer with a hint), and every solution in cells tagged "solution": Jupyter folds the code (source_hidden) and
    the site folds them all under "Solution" (docs/javascripts/solutions.js)."""
    exercises = path.read_text().partition("\n# ## Exercises\n")[2]
    checks = re.findall(r"^@exercise\((\d+),", exercises, re.M)
    assert len(checks) >= 4, f"{path.name} has {len(checks)} checked exercises; give it at least four"
    assert re.search(r"^from attnkit\.exercises import exercise", exercises, re.M), path.name
    cells = re.split(r"^(?=# %%)", exercises, flags=re.M)
    solutions = next((i for i, cell in enumerate(cells) if "\n# ### Solutions" in cell), None)
    assert solutions is not None, f"{path.name} has no Solutions heading"
    unfolded = [cell.splitlines()[0] for cell in cells[solutions:] if 'tags=["solution"]' not in cell.splitlines()[0]]
    assert not unfolded, f"{path.name}: cells after the Solutions heading that the site would not fold: {unfolded}"
    code = [cell for cell in cells[solutions:] if not cell.startswith("# %% [markdown]")]
    assert code and all('jupyter={"source_hidden": true}' in cell.splitlines()[0] for cell in code), \
        f"{path.name}: a solution code cell Jupyter would show unfolded"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_tutorial_runs_at_the_tiny_budget(path, monkeypatch):
    monkeypatch.setenv("ATTNKIT_TUTORIAL_BUDGET", "tiny")  # the kernel inherits the environment
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # tiny models: thread hand-offs cost more than they give
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing may download
    notebook = jupytext.read(path)
    client = nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(TUTORIALS)}}
    )
    client.execute()  # raises CellExecutionError naming the cell and its traceback
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert any(o.get("output_type") == "display_data" and "image/png" in o.get("data", {}) for o in outputs), \
        f"{path.name} drew no picture"
    warned = [o["text"] for o in outputs if o.get("output_type") == "stream" and o.get("name") == "stderr"
              and "Warning:" in o["text"]]  # the site shows each under its cell, to every reader
    assert not warned, f"{path.name} shows its reader a warning: {warned[0][-400:]}"
