# One target per habit. Every target builds the virtual environment from the project's own files
# first; it is rebuilt only when pyproject.toml or constraints.txt change.

PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= dev,s3,airflow,aws
# The frozen set that works (Airflow 3.3.2); `make lock` re-resolves it.
CONSTRAINTS := constraints.txt
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(CONSTRAINTS) | sha256sum | cut -c1-16)
BIN := $(VENV)/bin
export OMP_NUM_THREADS ?= 1

.PHONY: venv test test-fast lint format bench bench-quick lock clean demo

venv: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	@rm -f $(VENV)/.installed-*
	@touch $@

test: venv  ## the whole suite: unit, real S3 server (SeaweedFS), real Airflow CLI
	$(BIN)/pytest

test-fast: venv  ## everything but the S3 server and slow tests
	$(BIN)/pytest -m "not s3 and not slow"

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: venv  ## benchmarks print tables and a JSON line; nothing is asserted
	$(BIN)/python bench/batcher.py
	$(BIN)/python bench/shard.py --sizes-mb 100 1000

bench-quick: venv
	$(BIN)/python bench/batcher.py --records 50000 --per-producer 400
	$(BIN)/python bench/shard.py --sizes-mb 50

demo:
	@echo "The end-to-end demo (local Airflow + warm worker pool + a real small model) lands with the"
	@echo "Airflow layer (issue 5). Today: 'make test', or 'batchinfer shard --help' after 'make venv'."

lock:  ## re-resolve dependencies from scratch and freeze them into constraints.txt
	rm -rf .cache/lock-venv
	$(PYTHON) -m venv .cache/lock-venv
	.cache/lock-venv/bin/python -m pip install -q --upgrade pip
	.cache/lock-venv/bin/python -m pip install -q -e '.[$(EXTRAS)]' 'apache-airflow==3.3.2'
	.cache/lock-venv/bin/python -m pip freeze --exclude-editable > $(CONSTRAINTS)
	rm -rf .cache/lock-venv

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache bench/out
