"""``e2e_browser_people``: people are the judge (browser_common.py)."""

from __future__ import annotations

from browser_common import BROWSER, COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "e2e_browser_people",
    max_rounds=2,
    defaults={**SIMULATED, "input": f"{BROWSER}/people.jsonl", "judge": {"type": "human"}},
    **COMMON,
)
