"""``chaos_review``: a review gate before every round after the first that keeps the run's lease
while it waits (``gate_idle`` keep), a short ``idle_ttl_s`` (chaos_common.py)."""

from __future__ import annotations

from chaos_common import COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "chaos_review",
    defaults={
        **SIMULATED,
        "review": "every_round",
        "worker_pool": "local://chaos-review",
        "idle_ttl_s": 3,
        "gate_idle": "keep",
    },
    default_args={"lost_grace_s": 5.0},
    **COMMON,
)
