"""A round over ranged input (one file cut into byte ranges), run without workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir
from tests.support.worker_jobs import run_jobs


def ranged_round(tmp_path: Path, name: str, data: bytes, **settings: Any) -> tuple[RunConfig, Plan, Any]:
    """Round 0 over range shards of ``data`` (nothing copied): every shard's job runs but the last
    one's, which close quarantines (reading its range itself). Returns the run, plan and summary."""
    (tmp_path / name).write_bytes(data)
    cfg = RunConfig.of(
        input=str(tmp_path / name), run_root=str(tmp_path / "run"), prompt_template="{{ question }}",
        judge={"type": "llm"}, records_per_shard=10, **settings,
    )  # fmt: skip
    shards = prepare_run(cfg).shards
    assert len(shards) >= 3 and all(s.is_range and s.ids is None for s in shards)
    layout = RunLayout(cfg.run_root)
    assert JsonlDir(layout.input).shards() == []  # nothing copied
    plan = propose_slot(cfg, "round-00").plan
    write_plan(layout, plan)
    run_jobs(
        cfg, [(k, 0, s) for k in round_kinds(cfg, "rounds") for s in plan.shards[:-1]], approval_rate=0.5
    )
    summary = close_round(cfg, plan)
    assert summary is not None
    assert [f["shard_id"] for f in summary["failed_shards"]] == [plan.shards[-1].shard_id]
    return cfg, plan, summary
