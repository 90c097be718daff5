"""What the DAG files of the production-shaped tier (tests/system/deployment/) share (deploy_*.py here,
one DAG each: a task parses its own DAG's file, see tests/system/e2e/dags/e2e_common.py): the
factory's pipeline on the SIMULATED engine, input and run roots on the S3 server (the Airflow side
reaches it through the AWS connection ``deploy_s3``, made through the REST API), worker pools that
are not on the Airflow hosts.

- ``deploy_review``: two rounds with a review gate after the first, on the static pool ``deploy_static``;
- ``deploy_rounds``: one round; tests point ``worker_pool`` at the Kubernetes pool, a local pool or
  a static pool behind one shared URL;
- ``deploy_deferred``: jobs of 45 s on the static pool ``deploy_slow``, its lanes on the triggerers
  (no ``aws_conn_id``: the hosts' environment has the S3 credentials, as an instance role or IRSA
  would give them); judged by a rule, which takes no engine time (an llm judge would ask the slow
  engine again: 90 s jobs, where the triggerer is killed in their first seconds);
- ``deploy_inline``: the same 45 s jobs (the same rule judge), its lanes run inside their tasks
  (``in_task``; the AWS connection alone would do it), so a running task has a Celery worker to lose;
  a retry starts some 20 s after the kill, while its job still runs.

Every other DAG reads S3 through the connection ``deploy_s3``: its lanes run in their tasks too.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from airflow_batchinfer.spec.limits import TriggerLimits

BUCKET = os.environ.get("BATCHINFER_DEPLOY_BUCKET", "batchinfer-deploy")
SIMULATED: dict[str, Any] = {
    "input": f"s3://{BUCKET}/data/default.jsonl",
    "output_root": f"s3://{BUCKET}/runs",
    "engine": "simulated",
    "model": None,
    "engine_options": {"approval_rate": 0.5, "latency_base_s": 0.05},
    "prompt_template": "{{ question }}",
    "judge": {"type": "llm"},
    "records_per_shard": 10,
    "chunk_size": 10,
    "worker_pool": "deploy_static",
    "replicas": 2,
    "concurrency": 2,
    "idle_ttl_s": 0,
    "preflight_records": 0,
}
LIMITS = TriggerLimits(
    allowed_input_prefixes=(f"s3://{BUCKET}/data/",),
    allowed_worker_pools=("deploy_k8s", "deploy_shared", "local://deploy-local"),
    allowed_storage_secrets=("s3-env",),
)
COMMON: dict[str, Any] = {
    "airflow_pool": "deploy",
    "aws_conn_id": "deploy_s3",
    "retries": 2,
    "retry_delay": timedelta(seconds=2),
    "poll_interval_s": 1.0,
    "limits": LIMITS,
}

RULE_JUDGE: dict[str, Any] = {"type": "regex", "pattern": "[0-9]$", "must_match": True}  # no engine time
