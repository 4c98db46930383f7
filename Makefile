# fedhet: `make demo` sets everything up and runs the main job; `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup demo test lint bench

$(BIN)/fedhet: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -e ".[dev,flower,tensorboard]"
	touch $@

setup: $(BIN)/fedhet

demo: setup
	$(BIN)/fedhet demo --out runs/demo --force

test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q

lint: setup
	$(BIN)/ruff check src tests benchmarks

bench: setup
	$(BIN)/python benchmarks/bench_fedavg.py
