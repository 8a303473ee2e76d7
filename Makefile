# The README's Quick start commands. `make test` is also what CI runs (.ci/run).
PYTHON ?= python3
# the import contracts of pyproject.toml ([tool.importlinter]: layers, no cycle), checked on this
# tree's src/ rather than on whatever copy of fleetscope is installed
LINT_IMPORTS ?= PYTHONPATH=src lint-imports

.PHONY: demo test test-deps test-real lint bench

demo:
	$(PYTHON) -m pip install -q -e ".[wandb]"
	fleetscope demo

test-deps:
	bash scripts/install-test-deps.sh

test: test-deps
	$(LINT_IMPORTS)
	$(PYTHON) -m mypy
	$(PYTHON) -m pytest -q

# The fast tier, under 3 minutes on 2 cores: every test not marked slow (what is slow, and why:
# SLOW_TESTS in tests/conftest.py). `make test` runs everything.
.PHONY: test-fast
test-fast:
	$(PYTHON) -m pytest -q -m "not slow"

# fleetscope against real vLLM servers (CPU build, cached venv in ~/.cache/fleetscope/vllm-venv): a single
# engine and a data-parallel-2 server, a mixed load, Prometheus as the oracle (tests/real/).
# SAVE_BODIES=1 writes the scraped bodies to tests/data/real-vllm/ (versioned test data).
test-real: test-deps
	$(PYTHON) scripts/real_vllm/run.py $(if $(SAVE_BODIES),--out tests/data/real-vllm)

lint:
	ruff check src tests benchmarks scripts
	ruff format --check src tests benchmarks scripts
	$(LINT_IMPORTS)

bench:
	$(PYTHON) benchmarks/bench_parse.py
	$(PYTHON) benchmarks/bench_reduce.py
