"""The parity harness of :mod:`airflow_batchinfer.dev.run_batch` (``bench/run_batch_side.py`` uses it
too): a batch file through ``vllm run-batch`` and through a worker, the lines compared."""

from __future__ import annotations

from airflow_batchinfer.dev.run_batch import (
    ALLOWED,
    BatchRun,
    compare_lines,
    engine_flags,
    failed,
    vllm_run_batch,
    worker_batch,
)

__all__ = ["ALLOWED", "BatchRun", "compare_lines", "engine_flags", "failed", "vllm_run_batch", "worker_batch"]
