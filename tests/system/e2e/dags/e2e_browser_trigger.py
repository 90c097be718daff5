"""``e2e_browser_trigger``: one round over browser/trigger.jsonl (browser_common.py)."""

from __future__ import annotations

from browser_common import BROWSER, COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "e2e_browser_trigger",
    max_rounds=1,
    defaults={**SIMULATED, "input": f"{BROWSER}/trigger.jsonl", "judge": {"type": "llm"}},
    **COMMON,
)
