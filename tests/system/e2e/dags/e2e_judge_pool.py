"""``e2e_judge_pool``: a judge with its own warm pool (another engine configuration); its rounds run by
lanes too (e2e_common.py)."""

from __future__ import annotations

from e2e_common import COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "e2e_judge_pool",
    max_rounds=2,
    judge_airflow_pool="e2e_judge",
    defaults={
        **SIMULATED,
        "judge_pool": "local://e2e-judge",
        "judge_engine": "simulated",
        "judge_model": None,
        "judge_engine_options": {"approval_rate": 0.8, "latency_base_s": 0.1},  # the judge's own model
        "judge_replicas": 1,
        "judge_concurrency": 2,
    },
    **COMMON,
)
