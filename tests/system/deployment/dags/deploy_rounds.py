"""``deploy_rounds``: one round; tests point ``worker_pool`` at the pool they try (deploy_common.py)."""

from __future__ import annotations

from deploy_common import COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "deploy_rounds",
    max_rounds=1,
    defaults=SIMULATED,
    **COMMON,
)
