"""``chaos_rounds``: lanes run on the triggerer (deferred tasks) (chaos_common.py)."""

from __future__ import annotations

from chaos_common import COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "chaos_rounds",
    defaults=SIMULATED,
    default_args={"lost_grace_s": 5.0},
    **COMMON,
)
