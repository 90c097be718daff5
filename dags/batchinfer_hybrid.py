"""Hybrid: rounds while they shrink the pending set enough (hybrid_min_shrink), then in place for
the stubborn tail."""

from __future__ import annotations

from airflow_batchinfer.dag_factory import build_batch_inference_dag, embedded_defaults

dag = build_batch_inference_dag(
    "batchinfer_hybrid",
    max_rounds=3,
    airflow_pool="batchinfer",
    defaults={**embedded_defaults(), "strategy": "hybrid", "hybrid_min_shrink": 0.3, "max_attempts": 3},
    doc_md=__doc__,
)
