"""The round close of a factory DAG folds the run's tail: a close that finds the run finished writes
the later slots' plans and the report, emits the results event through its alias and skips the
later slots' tasks and the report task (never the pool teardown); a run its report fails keeps its
report task; a run with work left keeps every task. Real files; a stand-in task instance."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.sdk.exceptions import DownstreamTasksSkipped
from airflow.sdk.execution_time.context import OutletEventAccessors
from airflow.sdk.execution_time.task_runner import _serialize_outlet_events

from airflow_batchinfer.dag_factory import build_batch_inference_dag
from airflow_batchinfer.operators import rounds
from airflow_batchinfer.run.plan import MAX_ROUNDS, NOTHING_PENDING, propose_slot
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import read_plan, write_plan
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import finish_shard
from tests.support.rounds import make_run

SOME = {f"r{i:02d}" for i in range(20)}  # shards 0 and 1 approved, shard 2 rejected


class TaskInstance:
    """What the close uses of its task instance: its map index and XCom pushes."""

    map_index = -1

    def __init__(self) -> None:
        self.xcoms: dict[str, Any] = {}

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


def run_round_00(cfg: RunConfig, finished: int = 3) -> None:
    """Plan round 0 and finish its first ``finished`` shards' jobs (the rest: no manifest)."""
    plan = propose_slot(cfg, "round-00").plan
    write_plan(RunLayout(cfg.run_root), plan)
    for shard in plan.shards[:finished]:
        finish_shard(cfg, 0, shard, SOME)


def close(
    cfg: RunConfig, monkeypatch: pytest.MonkeyPatch, max_rounds: int = 1
) -> tuple[TaskInstance, OutletEventAccessors, list[str] | None, Any]:
    """Execute the factory DAG's round_00.close; returns its task instance, outlet events, the tasks
    it skipped (``None``: none) and its return value."""
    monkeypatch.setattr(rounds, "owned_run_config", lambda run_root, context, so=None: cfg)
    task = build_batch_inference_dag("fold", max_rounds=max_rounds).get_task("round_00.close")
    ti, events = TaskInstance(), OutletEventAccessors()
    try:
        result = task.execute({"ti": ti, "outlet_events": events})  # type: ignore[arg-type]
    except DownstreamTasksSkipped as skip:
        return ti, events, sorted(skip.tasks), None  # type: ignore[arg-type]
    return ti, events, None, result


def test_a_close_that_finds_the_run_finished_writes_the_report_and_skips_the_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_run(tmp_path, max_rounds=1)
    run_round_00(cfg)
    ti, events, skipped, _ = close(cfg, monkeypatch)
    assert skipped == ["report", "tail.close", "tail.lanes", "tail.plan"]  # not pool_teardown
    assert sorted(ti.xcoms["skipmixin_key"]["skipped"]) == skipped  # a cleared task is skipped again
    assert ti.xcoms["return_value"]["approved"] == 20  # the summary, as without the fold
    tail = read_plan(RunLayout(cfg.run_root), "tail")
    assert tail is not None and tail.mode == "skip" and tail.stop == MAX_ROUNDS
    report = json.loads((Path(cfg.run_root) / "report" / "summary.json").read_text())
    assert (report["status"], report["approved"], report["remaining_pending"]) == ("exhausted", 20, 10)
    assert (Path(cfg.run_root) / "report" / "report.md").exists()
    # the report task's event, emitted through the close's alias for the DAGs scheduled on results
    [event] = list(_serialize_outlet_events(events))
    assert event["source_alias_name"] == "batchinfer_results__fold__folded"
    assert event["dest_asset_key"] == {
        "name": "batchinfer_results__fold",
        "uri": "x-batchinfer://fold/results",
    }
    assert event["extra"] == {
        "run_root": cfg.run_root,
        "results": RunLayout(cfg.run_root).results,
        "format": "jsonl",
        "status": "exhausted",
        "stop_reason": MAX_ROUNDS,
        "rounds": 1,
        "approved": 20,
        "accepted_by_review": 0,
        "remaining_pending": 10,
    }


def test_a_run_its_report_fails_keeps_the_report_task_to_fail_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_run(tmp_path, max_rounds=2)
    run_round_00(cfg, finished=2)  # shard 2 has no manifest: quarantined, over max_failed_shards 0
    _, events, skipped, _ = close(cfg, monkeypatch, max_rounds=2)
    assert skipped == ["round_01.close", "round_01.lanes", "round_01.plan", "tail.close", "tail.lanes",
                       "tail.plan"]  # fmt: skip
    assert list(_serialize_outlet_events(events)) == []  # the report task decides, and fails
    plan = read_plan(RunLayout(cfg.run_root), "round-01")
    assert plan is not None and plan.stop == NOTHING_PENDING


def test_a_run_with_work_left_keeps_every_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_run(tmp_path, max_rounds=2)
    run_round_00(cfg)  # shard 2 rejected: round 1 runs it
    ti, _, skipped, result = close(cfg, monkeypatch, max_rounds=2)
    assert skipped is None and result["next_pending"] == 10 and ti.xcoms == {}
    assert read_plan(RunLayout(cfg.run_root), "round-01") is None  # its plan task plans it
    assert not (Path(cfg.run_root) / "report").exists()
