# The two commands of the README: `make demo` and `make test`. Both create .venv and install the project first
# (once, about a minute); pip's output goes to .venv/install.log and is printed only when the install fails.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# The min-deps check: a venv of its own with every runtime dependency at the floor pyproject.toml declares.
MIN_VENV := .venv-min
MIN_STAMP := $(MIN_VENV)/.installed
# The tests that exercise the runtime dependencies: redis and hiredis (index, stream, CLI, worker process),
# pydantic and pydantic-settings (formats, settings, flags), structlog (the worker's logs), prometheus-client
# (/metrics), fakeredis with lupa (the fake-Redis half of the suite and the embedded demo), numpy (the snapshot
# read path's copy).
MIN_TESTS := tests/test_index.py tests/test_stream.py tests/test_cli.py tests/test_demo.py tests/test_readme.py \
	tests/test_worker_process.py tests/test_snapshot.py tests/test_secrets.py tests/test_connection_sentinel_tls.py

# The tests run in TEST_PROCESSES processes at once (pytest-xdist), each with its own redis-server and temporary
# directories: most of the suite's time is spent waiting on worker processes and servers, and 4 processes keep 2 cores
# busy. TEST_PROCESSES=0 runs them in one process, one after another.
TEST_PROCESSES ?= 4
PARALLEL := -n $(TEST_PROCESSES) --dist worksteal

.PHONY: install demo test test-fast test-min-deps lint bench clean

$(STAMP): pyproject.toml
	@echo "Installing the project and its tools into $(VENV) (once; about a minute) ..."
	@$(PYTHON) -m venv $(VENV)
	@{ $(BIN)/python -m pip install --upgrade pip && $(BIN)/python -m pip install -e '.[dev]'; } \
		> $(VENV)/install.log 2>&1 || { cat $(VENV)/install.log; echo "The install failed; its log is $(VENV)/install.log."; exit 1; }
	@touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	@$(BIN)/incident-worker demo

# The whole suite, as CI runs it.
test: $(STAMP)
	@echo "The whole suite, as CI runs it ($(TEST_PROCESSES) processes): about 6 minutes on 2 idle cores, more on a busy machine."
	@echo "For everyday work, 'make test-fast' skips the slow end-to-end tests and the fakeredis twins and takes about 2 minutes."
	$(BIN)/python -m pytest $(PARALLEL)

# Everything but the tests marked slow (crash-and-recover runs, several worker processes, long property searches)
# and the fakeredis half of the tests run on both the real server and fakeredis (the real half runs here).
test-fast: $(STAMP)
	$(BIN)/python -m pytest $(PARALLEL) -m "not slow and not fakeredis"

$(MIN_STAMP): pyproject.toml tools/lowest_constraints.py
	@echo "Installing the lowest declared version of every runtime dependency into $(MIN_VENV) ..."
	@rm -rf $(MIN_VENV) && $(PYTHON) -m venv $(MIN_VENV)
	@$(PYTHON) tools/lowest_constraints.py > $(MIN_VENV)/constraints.txt
	@{ $(MIN_VENV)/bin/python -m pip install --upgrade pip \
		&& $(MIN_VENV)/bin/python -m pip install --constraint $(MIN_VENV)/constraints.txt -e '.[dev]'; } \
		> $(MIN_VENV)/install.log 2>&1 || { cat $(MIN_VENV)/install.log; echo "The install failed; its log is $(MIN_VENV)/install.log."; exit 1; }
	@touch $(MIN_STAMP)

# The declared floors are tested, not guessed: a floor the code has outgrown fails here.
test-min-deps: $(MIN_STAMP)
	@echo "Runtime dependencies at their floors:" $$(tr '\n' ' ' < $(MIN_VENV)/constraints.txt)
	$(MIN_VENV)/bin/python -m pytest $(PARALLEL) -q -m "not slow" -p no:cacheprovider $(MIN_TESTS)

lint: $(STAMP)
	$(BIN)/ruff check worker tests
	$(BIN)/ruff format --check worker tests
	$(BIN)/mypy

bench: $(STAMP)
	$(BIN)/incident-worker bench

clean:
	rm -rf $(VENV) $(MIN_VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache *.egg-info
