"""What the browser tests' DAG files share (tests/system/e2e/test_review_browser.py; e2e_browser_*.py
here, one DAG each, as e2e_common.py says why): the factory's pipeline on a local pool of their own,
each with defaults that run as they are, so the trigger form can be submitted untouched.

- ``e2e_browser_trigger``: one round of the SIMULATED engine over ``browser/trigger.jsonl``;
- ``e2e_browser_review``: arithmetic questions the SIMULATED engine answers wrongly (rejected by the
  ``expected_answer`` judge: "expected #, got #") or, for questions holding ``FAIL``, not at all (an
  inference error): two reason groups, a review gate after every round;
- ``e2e_browser_people``: people are the judge (``{"type": "human"}``);
- ``e2e_browser_echo``: the ``openai`` engine on an OpenAI-compatible server the test runs, which
  answers each prompt with the prompt itself (hostile text in, hostile text out), judged by length.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from airflow_batchinfer.spec.limits import TriggerLimits

ROOT = os.environ.get("BATCHINFER_E2E_ROOT", "/tmp/batchinfer-e2e")
BROWSER = f"{ROOT}/browser"
POOL = "local://e2e-browser"  # one pool spec (engine, options, size) for every simulated DAG here
SIMULATED: dict[str, Any] = {
    "output_root": f"{BROWSER}/runs",
    "engine": "simulated",
    "model": None,
    "engine_options": {"approval_rate": 0.5, "latency_base_s": 0.01, "fail_marker": "FAIL"},
    "prompt_template": "{{ question }}",
    "sampling": {"max_tokens": 32, "temperature": 0.7},
    "records_per_shard": 20,
    "chunk_size": 20,
    "worker_pool": POOL,
    "replicas": 1,
    "concurrency": 4,
    "idle_ttl_s": 300,
    "preflight_records": 3,
}
ARITHMETIC = {"type": "expected_answer", "field": "answer", "match": "number"}
LIMITS = TriggerLimits(allowed_input_prefixes=(ROOT,))
COMMON: dict[str, Any] = {"airflow_pool": "e2e", "retries": 1, "retry_delay": timedelta(seconds=1),
                          "poll_interval_s": 0.5, "limits": LIMITS}  # fmt: skip
