"""In-place retry: each sample is retried inside the warm workers (with per-sample checkpoints)
until the judge approves it or max_attempts is reached; no recompaction between rounds."""

from __future__ import annotations

from airflow_batchinfer.dag_factory import build_batch_inference_dag, embedded_defaults

dag = build_batch_inference_dag(
    "batchinfer_in_place",
    max_rounds=1,
    airflow_pool="batchinfer",
    defaults={**embedded_defaults(), "strategy": "in_place", "max_attempts": 4},
    doc_md=__doc__,
)
