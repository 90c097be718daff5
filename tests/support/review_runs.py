"""Runs for the review tests: a finished report, the rows in a shard, a run with worker groups."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import (
    read_plan,
    slots,
    write_plan,
    write_run_config,
)
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage import JsonlDir, shard_dataset
from tests.support.fake_jobs import make_run


def finished_report(cfg: Any) -> dict[str, Any]:
    """The report once every slot has planned (as in a DAG run that went to its end)."""
    layout = RunLayout(cfg.run_root)
    for slot in slots(cfg.retries.max_rounds):
        if read_plan(layout, slot) is None:
            write_plan(layout, propose_slot(cfg, slot).plan)
    return build_report(cfg)


def rows_in(uri: str) -> dict[str, dict[str, Any]]:
    return {r["id"]: r for f in JsonlDir(uri).jsonl_files() for r in f.iter_records()}


def make_run(tmp_path: Path, **settings: Any) -> RunConfig:
    """40 arithmetic questions; the SIMULATED engine's answers are wrong numbers (rejected as
    "expected N, got M"), none at all, or, for every fifth, an inference error."""
    data = tmp_path / "data.jsonl"
    rows = [{"id": f"q{i}", "question": ("FAIL " if i % 5 == 0 else "") + f"{i} + 1", "answer": i + 1}
            for i in range(40)]  # fmt: skip
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = RunConfig.of(
        input=str(data),
        run_root=str(tmp_path / "run"),
        prompt_template="{{ question }}",
        records_per_shard=15,
        **{"judge": {"type": "expected_answer", "field": "answer", "match": "number"}, **settings},
    )
    cfg = cfg.replace(
        id_field=shard_dataset(cfg.data.input, RunLayout(cfg.run_root).input, records_per_shard=15).id_field
    )
    write_run_config(cfg)
    return cfg
