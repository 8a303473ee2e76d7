# The README's Quick start commands. `make test` is also what CI runs (.ci/run).
PYTHON ?= python3

.PHONY: demo test test-deps lint bench

demo:
	$(PYTHON) -m pip install -q -e ".[wandb]"
	fleetscope demo

test-deps:
	bash scripts/install-test-deps.sh

test: test-deps
	$(PYTHON) -m pytest -q

lint:
	ruff check src tests benchmarks
	ruff format --check src tests benchmarks

bench:
	$(PYTHON) benchmarks/bench_parse.py
	$(PYTHON) benchmarks/bench_reduce.py
