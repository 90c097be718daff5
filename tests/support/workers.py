"""Real worker processes for tests: :mod:`airflow_batchinfer.dev.workers` (the benchmarks start theirs
with it too)."""

from __future__ import annotations

from airflow_batchinfer.dev.workers import TOKEN, WorkerProcess, start_worker

__all__ = ["TOKEN", "WorkerProcess", "start_worker"]
