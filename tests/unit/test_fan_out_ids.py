"""Row ids stay the ids' own (issue 37, item 5): ``1`` and ``"1"`` were two ids to the reader but
one row id ``1@sql`` to a fan-out, so one review decision selected both rows and an in-place resume
could give one record the other's checkpoint (both name rows by their ids as text). Ids are unique
as text: the later of ``1`` and ``"1"`` is a repeat, rejected with the reason, within a range and
across ranges; ids holding ``@`` keep distinct rows. Round 0 runs the worker's own job code
(SIMULATED engine), close as the DAG's close task runs it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.review.decisions import Decision
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_plan
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.reader import ErrorPolicy
from airflow_batchinfer.storage.validate import LineValidator
from tests.support.rounds import rows_in
from tests.support.worker_jobs import run_jobs

pytestmark = pytest.mark.security

ARMS = ("base", "poems", "sql")


class Rejects:
    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def write(self, row: dict[str, Any]) -> None:
        self.rows.append(row)


def test_a_number_id_and_its_digits_as_a_string_are_one_id_so_row_ids_never_collide(tmp_path: Path) -> None:
    ids: list[int | str] = [1, "1", "x@sql", "x", 2, "a", "b", "c", "d", "e", "f", "2", "g"]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "question": f"q {i!r}"}) + "\n" for i in ids))
    cfg = RunConfig.of(
        input=str(data), run_root=str(tmp_path / "run"), prompt_template="{{ question }}",
        adapters={"sql": "/models/lora-sql", "poems": "/models/lora-poems"}, judge={"type": "llm"},
        records_per_shard=12, fan_out="adapters_and_base",
    )  # fmt: skip
    shards = prepare_run(cfg).shards
    assert len(shards) > 1  # "2" repeats 2 from another range
    plan = propose_slot(cfg, "round-00").plan
    write_plan(RunLayout(cfg.run_root), plan)
    run_jobs(cfg, [(k, 0, s) for k in round_kinds(cfg, plan.mode) for s in plan.shards], approval_rate=0.5)
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"], summary
    layout = RunLayout(cfg.run_root)
    judged = rows_in(layout.results) + rows_in(layout.rejected_dir(0))
    # every row id once, each its own input id's: a decision or a checkpoint names one row
    assert len({r["id"] for r in judged}) == len(judged) == 3 * (len(ids) - 2)
    assert all(r["id"] == f"{r['input_id']}@{r['adapter']}" and r["adapter"] in ARMS for r in judged)
    assert sorted({json.dumps(r["input_id"]) for r in judged}) == sorted(
        json.dumps(i) for i in ids if i not in ("1", "2")
    )
    assert {r["id"] for r in judged if r["input_id"] in ("x", "x@sql")} == {
        f"{x}@{arm}" for x in ("x", "x@sql") for arm in ARMS
    }
    rejects = rows_in(layout.rejects)
    errors = {r["line_no"]: r["error"] for r in rejects}
    assert (
        "duplicate id '1' (first at line 1 of this range)" in errors[2]
        and 'so 1 and "1" are one id' in errors[2]
    )
    repeats = sorted(r["error"] for r in rejects if r["line_no"] == 12)  # across ranges: one per row
    assert summary["repeated_ids"] == 3 and repeats == [
        f"id '2@{arm}' repeated (first at line 5)" for arm in ARMS
    ]
    decision = Decision.make(0, "accept", "ann", ids=["1@sql"])
    assert sum(decision.ids == (r["id"],) for r in judged) == 1


def test_the_reader_takes_ids_as_text_without_a_fan_out_too() -> None:
    """The desk and decisions name ids as text, and an in-place job's checkpoints key on it."""
    rejects = Rejects()
    check = LineValidator(ErrorPolicy("in.jsonl", "quarantine", rejects), id_field="id")
    lines = [json.dumps({"id": i}).encode() for i in (7, "7", "07", -3, "-3", "a", "a")]
    _, kept, _ = check.check_block(lines)
    assert kept == [7, "07", -3, "a"]
    errors = [row["error"] for row in rejects.rows]
    assert errors[0].startswith("duplicate id '7' (first at line 1): ids are compared as text")
    assert errors[1].startswith("duplicate id '-3' (first at line 4)") and errors[2] == (
        "duplicate id 'a' (first at line 6)"
    )


def test_without_a_fan_out_a_number_id_repeated_as_a_string_in_a_later_range_is_rejected_as_itself(
    tmp_path: Path,
) -> None:
    """The desk and decisions name rows by their ids as text: a later ``"2"`` after ``2`` (another
    range) is rejected and left out by its own id, the first stays."""
    ids: list[int | str] = [2, "a", "b", "c", "d", "e", "f", "g", "h", "2", "i"]
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "question": f"q {i!r}"}) + "\n" for i in ids))
    cfg = RunConfig.of(
        input=str(data), run_root=str(tmp_path / "run"), prompt_template="{{ question }}",
        judge={"type": "llm"}, records_per_shard=4,
    )  # fmt: skip
    assert len(prepare_run(cfg).shards) > 1
    plan = propose_slot(cfg, "round-00").plan
    write_plan(RunLayout(cfg.run_root), plan)
    run_jobs(cfg, [(k, 0, s) for k in round_kinds(cfg, plan.mode) for s in plan.shards], approval_rate=0.5)
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"], summary
    layout = RunLayout(cfg.run_root)
    judged = [r["id"] for r in rows_in(layout.results) + rows_in(layout.rejected_dir(0))]
    assert sorted(map(str, judged)) == sorted(str(i) for i in ids[:-2] + ids[-1:]) and 2 in judged
    (reject,) = rows_in(layout.rejects)
    assert summary["repeated_ids"] == 1 and reject["id"] == "2" and reject["line_no"] == 10
