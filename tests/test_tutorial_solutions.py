"""The tutorials' solutions render folded: mkdocs-jupyter's own converter turns a tutorial into the HTML the site
shows, docs/javascripts/solutions.js runs on it in headless Chromium, and the cells tagged "solution" (and no
others) end up in one closed "Solution" block that a click opens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext", reason="the tutorials are jupytext scripts (dev extra)")
nbconvert2 = pytest.importorskip("mkdocs_jupyter.nbconvert2", reason="the site renders tutorials with mkdocs-jupyter")

DOCS = Path(__file__).resolve().parents[1] / "docs"
TUTORIAL = DOCS / "tutorials" / "02_score_functions.py"
SCRIPT = DOCS / "javascripts" / "solutions.js"


def test_the_solution_cells_fold_into_one_closed_block(tmp_path):
    from viz_browser import Browser, chromium_or_reason

    executable, reason = chromium_or_reason()
    if executable is None:
        pytest.skip(reason)
    tagged = [cell for cell in jupytext.read(TUTORIAL).cells if "solution" in cell.metadata.get("tags", [])]
    assert len(tagged) >= 2, "the tutorial has a markdown and a code cell of solutions"
    body = nbconvert2.nb2html(str(TUTORIAL))  # the page's notebook part, without outputs, as the site renders it
    page = tmp_path / "page.html"
    page.write_text(f"<!doctype html><html><body>{body}<script>{SCRIPT.read_text()}</script></body></html>")
    browser = Browser(executable, width=1200, height=900)
    try:
        browser.open(page)
        browser.wait("document.readyState === 'complete'")
        folds = json.loads(browser.evaluate(
            "JSON.stringify([...document.querySelectorAll('details')].map(d => ({open: d.open, "
            "summary: d.querySelector('summary').textContent, cells: d.querySelectorAll(':scope > .jp-Cell').length,"
            " checks: d.textContent.includes('def check_1')})))"))
        outside = browser.evaluate("[...document.querySelectorAll('.celltag_solution')]"
                                   ".filter(el => !el.closest('details')).length")
        browser.evaluate("document.querySelector('details').scrollIntoView({block: 'center'})")  # a click lands
        browser.click("details > summary")
        opened = browser.evaluate("document.querySelector('details').open")
    finally:
        browser.close()
    assert folds == [{"open": False, "summary": "Solution", "cells": len(tagged), "checks": False}], folds
    assert outside == 0, "a solution cell shows outside the fold"
    assert opened, "a click on the fold's title does not open it"
