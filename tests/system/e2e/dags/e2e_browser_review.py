"""``e2e_browser_review``: arithmetic answered wrongly or not at all, a review gate after every round
(browser_common.py)."""

from __future__ import annotations

from browser_common import ARITHMETIC, BROWSER, COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "e2e_browser_review",
    max_rounds=2,
    defaults={**SIMULATED, "input": f"{BROWSER}/review.jsonl", "judge": ARITHMETIC, "review": "every_round"},
    **COMMON,
)
