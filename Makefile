# The two commands of the README: `make run` (set up, then the main job) and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup run test lint clean

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# The CPU wheel first: a bare `torch` requirement would pull a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e ".[test]"
	touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/specblock pipeline --quick

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/specblock results --check
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache
