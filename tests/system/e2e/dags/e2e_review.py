"""``e2e_review``: a review gate before every round after the first (e2e_common.py)."""

from __future__ import annotations

from e2e_common import COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "e2e_review", max_rounds=3, defaults={**SIMULATED, "review": "every_round"}, **COMMON
)
