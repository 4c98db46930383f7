# fedhet: `make demo` sets everything up and runs the main job; `make test` runs the tests.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# every extra, so the tests of each run (Flower, its Ray simulation, Ray, TensorBoard); exact
# versions from constraints.txt (pyproject.toml declares the supported ranges)
EXTRAS ?= dev,flower,flower-sim,tensorboard,cluster,hf
# the suite runs on this many pytest-xdist processes (`make test TEST_WORKERS=0`: one process);
# --dist loadgroup: one test at a time to whichever worker is free, except the tests that wait
# for the cluster harness, which go to one worker together, last (tests/conftest.py)
TEST_WORKERS ?= 2

.PHONY: setup demo test lint typecheck bench

$(BIN)/fedhet: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e ".[$(EXTRAS)]"
	touch $@

setup: $(BIN)/fedhet

demo: setup
	$(BIN)/fedhet demo --out runs/demo --force

test: setup
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

lint: setup
	$(BIN)/ruff check src tests benchmarks

# mypy on src/ (pyproject's [tool.mypy]) against .ci/mypy_baseline.txt, which may only shrink:
# a new error fails, and so does a fixed one until `$(BIN)/python .ci/mypy_check.py --update`
typecheck: setup
	$(BIN)/python .ci/mypy_check.py

bench: setup
	$(BIN)/python benchmarks/bench_fedavg.py
