"""``e2e_lanes``: one-record shards on a pool of two slots (one worker, concurrency 2), so a round runs
many more shards (more than the session's ``[core] max_map_length``) than it maps lanes (2)."""

from __future__ import annotations

from e2e_common import COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "e2e_lanes",
    max_rounds=1,
    defaults={
        **SIMULATED,
        "records_per_shard": 1,
        "chunk_size": 1,
        "worker_pool": "local://e2e-lanes",
        "replicas": 1,
        "preflight_records": 0,
        "engine_options": {"approval_rate": 0.5, "latency_base_s": 0.05},
    },
    **COMMON,
)
