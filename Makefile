# spool: the two commands a new user needs are `make run` and `make test`.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
ARGS   ?=

.PHONY: install run test unit integration bench lint format clean fuzz

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test,dev]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(BIN)/spool serve --listen 127.0.0.1:9092 --data-dir ./data $(ARGS)

test: install
	$(BIN)/python -m pytest -q $(ARGS)

unit: install
	$(BIN)/python -m pytest -q tests/unit $(ARGS)

integration: install
	$(BIN)/python -m pytest -q tests/integration $(ARGS)

bench: install
	$(BIN)/python -m bench $(ARGS)

# Malformed and odd requests against a fresh broker; exits 1 on a crash or a traceback.
# `make fuzz FRAMES=200000 SEED=42` repeats a run; a failure prints its seed and frame.
FRAMES ?= 100000
SEED   ?=
fuzz: install
	$(BIN)/python -m tests.fuzz --frames $(FRAMES) $(if $(SEED),--seed $(SEED)) $(ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy --strict protocol persister coordinator broker

format: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
