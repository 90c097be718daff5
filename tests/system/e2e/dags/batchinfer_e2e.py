"""DAGs for the end-to-end tests: the factory's pipeline on the SIMULATED engine (its judge approves
a record with a fixed probability, decided by a hash of id and attempt), on a local pool.

``e2e_lanes``: one-record shards on a pool of two slots (one worker, concurrency 2), so a round runs
many more shards (more than the session's ``[core] max_map_length``) than it maps lanes (2).
``e2e_redeploy``: an ``output_root`` default a test changes while a run is live."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from airflow_batchinfer.dag_factory import build_batch_inference_dag
from airflow_batchinfer.spec.limits import TriggerLimits

ROOT = os.environ.get("BATCHINFER_E2E_ROOT", "/tmp/batchinfer-e2e")
SIMULATED = {
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

for strategy in ("rounds", "hybrid", "in_place"):
    build_batch_inference_dag(
        f"e2e_{strategy}",
        max_rounds=3,
        airflow_pool="e2e",
        defaults={**SIMULATED, "strategy": strategy},
        retries=1,
        retry_delay=timedelta(seconds=1),
        poll_interval_s=1.0,
        limits=LIMITS,
    )

build_batch_inference_dag(
    "e2e_review",
    max_rounds=3,
    airflow_pool="e2e",
    defaults={**SIMULATED, "review": "every_round"},
    retries=1,
    retry_delay=timedelta(seconds=1),
    poll_interval_s=1.0,
    limits=LIMITS,
)

build_batch_inference_dag(
    "e2e_lanes",
    max_rounds=1,
    airflow_pool="e2e",
    defaults={
        **SIMULATED,
        "records_per_shard": 1,
        "chunk_size": 1,
        "worker_pool": "local://e2e-lanes",
        "replicas": 1,
        "preflight_records": 0,
        "engine_options": {"approval_rate": 0.5, "latency_base_s": 0.05},
    },
    retries=1,
    retry_delay=timedelta(seconds=1),
    poll_interval_s=1.0,
    limits=LIMITS,
)

# A judge with its own warm pool (another engine configuration): its rounds run by lanes too.
build_batch_inference_dag(
    "e2e_judge_pool",
    max_rounds=2,
    airflow_pool="e2e",
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
    retries=1,
    retry_delay=timedelta(seconds=1),
    poll_interval_s=1.0,
    limits=LIMITS,
)

# ``e2e_redeploy``: its output_root default is read from a file each time the DAG file is parsed (each
# task start), as if the file were redeployed with another default while a run is live.
REDEPLOYED_ROOT = Path(ROOT) / "redeploy" / "output_root"
build_batch_inference_dag(
    "e2e_redeploy",
    max_rounds=1,
    airflow_pool="e2e",
    defaults={
        **SIMULATED,
        "output_root": REDEPLOYED_ROOT.read_text().strip() if REDEPLOYED_ROOT.exists() else f"{ROOT}/runs",
    },
    retries=1,
    retry_delay=timedelta(seconds=1),
    poll_interval_s=1.0,
    limits=LIMITS,
)
