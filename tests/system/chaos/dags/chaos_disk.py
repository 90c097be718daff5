"""``chaos_disk``: the same with one retry per lane (a full disk fails every try) (chaos_common.py)."""

from __future__ import annotations

from chaos_common import COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "chaos_disk",
    defaults=SIMULATED,
    default_args={"lost_grace_s": 5.0},
    **{**COMMON, "retries": 1},
)
