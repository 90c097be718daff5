"""What the chaos suite's DAG files share (chaos_*.py here, one DAG each: a task parses its own DAG's
file, see tests/system/e2e/dags/e2e_common.py): the factory's pipeline on the SIMULATED engine (no
model; batch latency and the judge's verdicts are set per run through ``engine_options``), a DAG per
way of failing.

Each round maps one lane per pool slot (4); a lane runs its shards one at a time.

- ``chaos_rounds``: lanes run on the triggerer (deferred tasks).
- ``chaos_disk``: the same with one retry per lane (a full disk fails every try).
- ``chaos_inline``: lanes run in their task process (``in_task``), so a running task instance has a
  process to kill while its lane's job runs.
- ``chaos_s3``: the run root on the S3 server; the Airflow side reaches it through the AWS
  connection ``chaos_s3`` (``endpoint_url`` in its extra; its lanes therefore run in their tasks),
  the workers through the environment.
- ``chaos_review``: a review gate before every round after the first, on a pool with a short
  ``idle_ttl_s``.
- ``chaos_gate``: the same gates giving the run's lease back 2 s after they open (``gate_idle``
  release), on a pool whose workers exit 1 s after their last use.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from airflow_batchinfer.spec.limits import TriggerLimits

ROOT = os.environ.get("BATCHINFER_CHAOS_ROOT", "/tmp/batchinfer-chaos")
BUCKET = os.environ.get("BATCHINFER_CHAOS_BUCKET", "batchinfer-chaos")
SIMULATED: dict[str, Any] = {
    "input": f"{ROOT}/data.jsonl",
    "output_root": f"{ROOT}/runs",
    "engine": "simulated",
    "model": None,
    "engine_options": {"approval_rate": 0.6, "latency_base_s": 1.0},
    "prompt_template": "{{ question }}",
    "judge": {"type": "llm"},
    "records_per_shard": 10,
    "chunk_size": 10,
    "worker_pool": "local://chaos",
    "replicas": 2,
    "concurrency": 2,
    "idle_ttl_s": 900,
    "preflight_records": 0,
    "max_rounds": 2,
}
COMMON: dict[str, Any] = {
    "max_rounds": 2,
    "airflow_pool": "chaos",
    "retries": 2,
    "retry_delay": timedelta(seconds=2),
    "poll_interval_s": 1.0,
    # each test triggers with its own dataset, and one on a pool of its own
    "limits": TriggerLimits(allowed_input_prefixes=(ROOT,), allowed_worker_pools=("local://",)),
}
