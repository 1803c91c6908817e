# Two entry points: `make run` (the main job) and `make test` (the test suite).
# torch==2.13.0 is installed first when missing: an unpinned torch would pull CUDA packages.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

.PHONY: run test lint bench docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --upgrade pip >/dev/null

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install torch==$(TORCH_VERSION)
	$(BIN)/python -m pip install -e .
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed pyproject.toml
	$(BIN)/python -m pip install -e ".[dev]"
	touch $@

run: $(VENV)/.installed
	$(BIN)/attnkit train --out runs/default --overwrite --max-time 4m

test: $(VENV)/.installed-dev
	$(BIN)/python -m pytest

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check src tests benchmarks

bench: $(VENV)/.installed-dev
	$(BIN)/python -m benchmarks

# The documentation site into site/, strict: a broken link, a missing reference or a failing tutorial stops it.
# The tutorials execute as it builds (minutes; their renderings are cached in .cache/mkdocs-jupyter per budget and
# per state of src/attnkit); ATTNKIT_DOCS_EXECUTE=false renders them without outputs.
docs: $(VENV)/.installed-dev
	$(BIN)/mkdocs build --strict

clean:
	rm -rf $(VENV) build site .cache/mkdocs-jupyter *.egg-info src/*.egg-info
