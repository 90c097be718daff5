"""``e2e_browser_echo``: the ``openai`` engine on the test's echo server, judged by length, a review gate
after every round (browser_common.py)."""

from __future__ import annotations

from browser_common import BROWSER, COMMON, SIMULATED

from airflow_batchinfer.dag_factory import build_batch_inference_dag

build_batch_inference_dag(
    "e2e_browser_echo",
    max_rounds=1,
    defaults={
        **SIMULATED,
        "input": f"{BROWSER}/echo.jsonl",
        "engine": "openai",
        "model": "echo",
        # the test sets base_url to its server in the run's conf (the DAG's default names the key)
        "engine_options": {"base_url": "http://127.0.0.1:9/v1", "max_retries": 0},
        "worker_pool": "local://e2e-browser-echo",
        "judge": {"type": "length", "max_chars": 40},
        "review": "every_round",
    },
    **COMMON,
)
