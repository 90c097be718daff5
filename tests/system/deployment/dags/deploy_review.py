"""``deploy_review``: two rounds with a review gate after the first, on the static pool ``deploy_static``
(deploy_common.py)."""

from __future__ import annotations

from deploy_common import COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "deploy_review",
    max_rounds=2,
    defaults={**SIMULATED, "review": "every_round"},
    **COMMON,
)
