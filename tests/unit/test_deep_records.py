"""One deep record never fails its shard (issue 37, item 4): a record nested deeper than the rows'
writer can take is refused on read, into ``rejects/`` with its reason; a record whose
``response_format`` schema is too deep for its check is that record's error row. The worker's own
job code runs the round (SIMULATED engine), close as the DAG's close task runs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orjson
import pytest

from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.records import MAX_DEPTH, depth
from tests.support.rounds import rows_in
from tests.support.worker_jobs import run_jobs

pytestmark = pytest.mark.security


def nested(levels: int) -> Any:
    value: Any = 1
    for _ in range(levels):
        value = [value]
    return value


def deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "array", "items": schema}
    return schema


def round_zero(tmp_path: Path, lines: list[str], **settings: Any) -> tuple[dict[str, Any], RunLayout]:
    data = tmp_path / "data.jsonl"
    data.write_text("\n".join(lines) + "\n")
    cfg = RunConfig.of(
        input=str(data), run_root=str(tmp_path / "run"), judge={"type": "llm"}, **settings
    )  # fmt: skip
    prepare_run(cfg)
    plan = propose_slot(cfg, "round-00").plan
    write_plan(RunLayout(cfg.run_root), plan)
    run_jobs(cfg, [(k, 0, s) for k in round_kinds(cfg, plan.mode) for s in plan.shards], approval_rate=0.5)
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"], summary
    assert summary["failed_records"] == 0 and not summary.get("failed_shards"), summary
    return summary, RunLayout(cfg.run_root)


def test_a_record_deeper_than_the_writer_takes_is_refused_on_read_with_its_reason(tmp_path: Path) -> None:
    lines = [json.dumps({"id": i, "question": f"q{i}"}) for i in range(3)]
    lines.append(json.dumps({"id": 9, "question": "q", "deep": nested(300)}))  # read by orjson, not written
    lines.append(json.dumps({"id": 10, "question": "q", "ok": nested(MAX_DEPTH - 1)}))  # the most allowed
    _, layout = round_zero(tmp_path, lines, prompt_template="{{ question }}")
    judged = rows_in(layout.results) + rows_in(layout.rejected_dir(0))
    assert sorted(r["id"] for r in judged) == [0, 1, 2, 10]
    (reject,) = rows_in(layout.rejects)
    assert reject["line_no"] == 4 and "nested 301 levels deep" in reject["error"]
    assert f"more than the {MAX_DEPTH}" in reject["error"] and "flatten" in reject["error"]
    # a record at the cap still leaves room for the rows that wrap it (a desk page's sample)
    wrapped = {"samples": [{"record": json.loads(lines[-1])}]}
    assert depth(wrapped) == MAX_DEPTH + 3 and orjson.dumps({"page": [wrapped]})


def test_a_response_format_schema_too_deep_to_check_is_its_records_error_row(tmp_path: Path) -> None:
    def line(i: int, response_format: dict[str, Any] | None = None) -> str:
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": f"q{i}"}]}
        if response_format is not None:
            body["response_format"] = response_format
        url = "/v1/chat/completions"
        return json.dumps({"custom_id": f"c{i}", "method": "POST", "url": url, "body": body})

    deep = {"type": "json_schema", "json_schema": {"name": "x", "schema": deep_schema(MAX_DEPTH - 5)}}
    lines = [line(0), line(1), line(9, deep), line(2)]
    assert depth(json.loads(lines[2])) == MAX_DEPTH  # read: its check then runs out of stack
    summary, layout = round_zero(tmp_path, lines, prompt_template=None)
    assert summary["inference_errors"] == 1 and summary["approved"] + summary["rejected"] == 4
    (row,) = [r for r in rows_in(layout.rejected_dir(0)) if r["custom_id"] == "c9"]
    assert "record 'c9'" in row["error"] and "nested" in row["error"]  # too deeply to check (or to bound)
