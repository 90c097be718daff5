"""A small run and a faked round of it, without workers: the round, fold and close tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.plan import (
    propose_slot,
)
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, shard_dataset
from tests.support.fake_jobs import finish_shard


def make_run(tmp_path: Path, n: int = 30, **settings: Any) -> RunConfig:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i:02d}", "question": f"q{i}"}) + "\n" for i in range(n)))
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(tmp_path / "run"),
        prompt_template="{{ question }}",
        judge={"type": "length", "min_chars": 1},
        records_per_shard=10,
        **settings,
    )
    cfg = cfg.replace(
        id_field=shard_dataset(cfg.data.input, RunLayout(cfg.run_root).input, records_per_shard=10).id_field
    )
    return cfg


def fake_round(cfg: RunConfig, slot: str, approve: set[str]) -> dict[str, Any]:
    """Plan ``slot``, then do what its infer and judge jobs would (staged outputs, manifests)."""
    plan = propose_slot(cfg, slot).plan
    write_plan(RunLayout(cfg.run_root), plan)
    for shard in plan.shards:
        finish_shard(cfg, plan.round, shard, approve)
    summary = close_round(cfg, plan)
    assert summary is not None
    return summary


def rows_in(directory: str) -> list[dict[str, Any]]:
    """Every row of a directory of JSONL files (a round's outputs), in file order."""
    return [r for f in JsonlDir(directory).jsonl_files() for r in f.iter_records()]
