"""``deploy_deferred``: 45 s jobs on the static pool ``deploy_slow``, its lanes on the triggerers
(deploy_common.py)."""

from __future__ import annotations

from deploy_common import COMMON, RULE_JUDGE, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "deploy_deferred",
    max_rounds=1,
    defaults={
        **SIMULATED,
        "worker_pool": "deploy_slow",
        "judge": RULE_JUDGE,
    },
    default_args={"lost_grace_s": 5.0},
    **{**COMMON, "aws_conn_id": None},
)
