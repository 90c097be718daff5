"""Human review every round: before each new round, the run waits on the Required Actions page with
the round's summary and a sample of rejected records; the reviewer continues, switches to in place,
accepts the remaining as they are, or stops. Unanswered within 24 hours: Stop."""

from __future__ import annotations

from datetime import timedelta

from airflow_batchinfer.dag_factory import build_batch_inference_dag, embedded_defaults

dag = build_batch_inference_dag(
    "batchinfer_human_review",
    max_rounds=3,
    airflow_pool="batchinfer",
    defaults={**embedded_defaults(), "strategy": "rounds", "review": "every_round"},
    response_timeout=timedelta(hours=24),
    # assigned_users=[{"id": "alice", "name": "Alice"}],  # restrict who may answer
    doc_md=__doc__,
)
