"""A run whose SIMULATED engine cuts some answers at max_tokens (a prompt that asks for more tokens
than the run's max_tokens), run round by round with the worker's own job code: the truncation tests'."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_batchinfer.state.config import RunConfig
from tests.support.fake_jobs import close, make_run, plan_round
from tests.support.worker_jobs import run_jobs

LONG = ["r00", "r05", "r17"]  # these ask for 24 tokens; the run gives 16
TEMPLATE = "{{ question }}{% if id in " + repr(LONG) + " %} simulate_tokens=24{% endif %}"


def truncating_run(tmp_path: Path, **settings: Any) -> RunConfig:
    cfg = make_run(tmp_path, sampling={"max_tokens": 16}, **settings)
    return cfg.replace(prompt_template=TEMPLATE)


def run_round(cfg: RunConfig, slot: str) -> dict[str, Any]:
    plan = plan_round(cfg, slot)
    run_jobs(cfg, [("infer_judge", plan.round, s) for s in plan.shards], approval_rate=1.0)
    return close(cfg, plan)
