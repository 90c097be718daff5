"""``e2e_hybrid``: rounds that switch to in place once they stop paying off (e2e_common.py)."""

from __future__ import annotations

from e2e_common import COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag("e2e_hybrid", max_rounds=3, defaults={**SIMULATED, "strategy": "hybrid"}, **COMMON)
