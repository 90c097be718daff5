"""``chaos_inline``: lanes run in their task process (``in_task``) (chaos_common.py)."""

from __future__ import annotations

from chaos_common import COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "chaos_inline",
    defaults=SIMULATED,
    default_args={"in_task": True, "lost_grace_s": 5.0},
    **COMMON,
)
