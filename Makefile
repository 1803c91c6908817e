# Two entry points: `make run` (the main job) and `make test` (the test suite).
# torch==2.13.0 is installed first when missing: an unpinned torch would pull CUDA packages.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH_VERSION ?= 2.13.0

.PHONY: run test lint bench docs explorer-model clean

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
# The in-browser explorer (docs/explorer/) runs onnxruntime-web from the site's own files: `npm install` first puts it
# in node_modules/ and the build copies it in; without it that page says so.
docs: $(VENV)/.installed-dev
	$(BIN)/mkdocs build --strict

# The in-browser explorer's model: trained on the synthetic reversal task, exported to ONNX, checked, written to
# docs/explorer/model.onnx and model.json (about three minutes).
explorer-model: $(VENV)/.installed-dev
	$(BIN)/python docs/hooks/explorer_model.py

clean:
	rm -rf $(VENV) build site .cache/mkdocs-jupyter *.egg-info src/*.egg-info node_modules
