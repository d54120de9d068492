# Two commands for a fresh machine:  make demo  (set up + run an agent task)  and  make test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TASK   ?= What is (12 + 30) * 7 and 2^10? Write the results to scratch/answer.txt

.PHONY: setup system-packages demo test test-stress lint bench worker clean

$(BIN)/.installed: pyproject.toml
	@echo "==> creating $(VENV) and installing waystation with its dev tools (pip, a minute at most)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet --editable '.[dev]'
	@touch $@

setup: $(BIN)/.installed

demo: setup
	@echo "==> running an agent task on the embedded Temporal dev server (Web UI: http://localhost:8233)"
	$(BIN)/ws run "$(TASK)"

lint: setup
	@echo "==> ruff and mypy"
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# Debian's chromium, postgresql, git and curl, which the tests drive, installed with apt when missing.
system-packages:
	@scripts/system-packages

# Tests run in TEST_WORKERS pytest processes (pytest-xdist), each with its own servers, handed
# out one test at a time in order (waystation/testing/scheduling.py).
TEST_WORKERS ?= 4

test: lint system-packages
	@echo "==> pytest in $(TEST_WORKERS) processes (each starts its own Temporal dev server and time-skipping server)"
	$(BIN)/pytest -n $(TEST_WORKERS)

# The suite beside CPU-burning processes (BURNERS, default one per core): no test may race the clock.
test-stress: lint system-packages
	@echo "==> pytest with every core kept busy (scripts/stress.py; slower than make test)"
	$(BIN)/python scripts/stress.py $(if $(BURNERS),--burners $(BURNERS)) -- -n $(TEST_WORKERS)

bench: setup
	@echo "==> installing the benchmark peers (LangGraph, the Temporal peers), then every benchmark (about 10 min)"
	$(BIN)/pip install --quiet --editable '.[dev,bench]'
	$(BIN)/python -m bench

worker: setup
	$(BIN)/ws worker

clean:
	-$(BIN)/ws server stop
	rm -rf $(VENV) .waystation *.egg-info
