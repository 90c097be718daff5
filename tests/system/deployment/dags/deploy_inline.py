"""``deploy_inline``: the same 45 s jobs, its lanes inside their tasks (``in_task``) (deploy_common.py)."""

from __future__ import annotations

from deploy_common import COMMON, RULE_JUDGE, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "deploy_inline",
    max_rounds=1,
    defaults={**SIMULATED, "worker_pool": "deploy_slow", "judge": RULE_JUDGE},
    default_args={"in_task": True, "lost_grace_s": 5.0},
    **COMMON,
)
