"""A round's summary and quarantine records (:class:`~airflow_batchinfer.state.docs.Summary`,
:class:`~airflow_batchinfer.state.docs.FailedShard`): the summary lists each quarantined shard as its
``failed/`` record stores it, without the keys the record leaves out, and reads back as written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from airflow_batchinfer.state.docs import read_failed, read_summary
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import close, finish_shard, make_run, plan_round, read_rows


def stored(path: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(path).read_text())
    data.pop("schema_version")
    return data


def test_a_summary_lists_its_quarantined_shards_as_their_records_store_them(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    never = plan.shards[1]
    for s in plan.shards:
        if s is not never:
            finish_shard(cfg, 0, s, {r["id"] for r in read_rows(s.uri)[:3]})
    summary = close(cfg, plan)
    layout = RunLayout(cfg.run_root)
    record = stored(f"{layout.failed(0)}/{never.shard_id}.json")
    # a copied shard: no byte range, no repeated ids, so neither key (not even as null)
    assert summary["failed_shards"] == [record] and "range" not in record and "repeated_ids" not in record
    assert record["records"] == 10 and record["ids"]["count"] == 10
    back, failed = read_summary(layout, 0), read_failed(layout, 0, never.shard_id)
    assert back is not None and failed is not None and back.failed_shards == [failed]
    assert back.to_json() == stored(layout.summary(0)) == summary
