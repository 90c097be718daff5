"""What the end-to-end tests' DAG files share (e2e_*.py here, one DAG each): the factory's pipeline on
the SIMULATED engine (its judge approves a record with a fixed probability, decided by a hash of id
and attempt), on a local pool.

One DAG a file: each task parses its DAG's file at its start, so a file of eight DAGs built eight DAGs
for every task. This module holds no DAG (``.airflowignore`` keeps the dag-processor off it); the DAG
files import it from the DAGs folder, which Airflow puts on ``sys.path``."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from airflow_batchinfer.spec.limits import TriggerLimits

ROOT = os.environ.get("BATCHINFER_E2E_ROOT", "/tmp/batchinfer-e2e")
SIMULATED: dict[str, Any] = {
    "input": f"{ROOT}/data.jsonl",
    "output_root": f"{ROOT}/runs",
    "engine": "simulated",
    "model": None,
    "engine_options": {"approval_rate": 0.5, "latency_base_s": 0.2},
    "prompt_template": "{{ question }}",
    "judge": {"type": "llm"},
    "records_per_shard": 10,
    "chunk_size": 10,
    "worker_pool": "local://e2e",
    "replicas": 2,
    "concurrency": 2,
    "idle_ttl_s": 300,
    "preflight_records": 5,
}
# each test triggers with its own dataset under ROOT (the deployment's [batchinfer] config could say
# the same; test_trigger_airflow.py checks what a trigger may not choose)
LIMITS = TriggerLimits(allowed_input_prefixes=(ROOT,))
COMMON: dict[str, Any] = {
    "airflow_pool": "e2e",
    "retries": 1,
    "retry_delay": timedelta(seconds=1),
    "poll_interval_s": 1.0,
    "limits": LIMITS,
}
