# Setup on a fresh CPU machine: `make demo` runs the main job, `make test` the test suite (what CI
# runs), `make test-fast` every test not marked `slow` (a couple of minutes on 2 idle cores), `make lint`
# the formatter, linter and type checker (CI runs it before the tests).
# Both create .venv with the pinned stack first (once; redone when pyproject.toml changes).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install demo test test-fast lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml constraints-cpu.txt
	$(PYTHON) -m venv $(VENV)
	# torch first, by exact version: it resolves to the local CPU build; a bare `torch` pulls CUDA.
	$(BIN)/pip install --quiet torch==2.13.0
	DS_BUILD_OPS=0 $(BIN)/pip install --quiet -c constraints-cpu.txt -e '.[train,serve,dev]'
	touch $(STAMP)

demo: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/kgreasoner demo $(ARGS)

test: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q $(ARGS)

# One torch thread unless OMP_NUM_THREADS says otherwise: tiny models gain nothing from more.
test-fast: $(STAMP)
	HF_HUB_OFFLINE=1 OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest -q -m "not slow" $(ARGS)

# ruff (format and lint, line length 119) on the whole tree, mypy on the package (settings in pyproject.toml).
lint: $(STAMP)
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .
	$(BIN)/mypy

bench: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python bench/kg_bench.py

clean:
	rm -rf $(VENV) .pytest_cache
