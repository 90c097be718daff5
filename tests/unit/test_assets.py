"""The results asset (issue 38, item 4): one per factory DAG, the report task's outlet and the alias
target of the close that writes the report; a DAG scheduled on ``results_asset(dag_id)`` waits for
exactly that asset; the event's ``extra`` from the run's report. Emitted on success only:
tests/unit/operators/test_report_asset.py; on a real Airflow: tests/system/e2e."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.sdk import DAG, Asset

from airflow_batchinfer import build_batch_inference_dag, results_asset
from airflow_batchinfer.assets import results_alias, results_event


def test_the_asset_names_the_dag_and_is_what_its_report_and_closes_emit() -> None:
    asset = results_asset("nightly_eval")
    assert (asset.name, asset.uri) == (
        "batchinfer_results__nightly_eval",
        "x-batchinfer://nightly_eval/results",
    )
    dag = build_batch_inference_dag("nightly_eval", max_rounds=2)
    assert dag.get_task("report").outlets == [asset]
    closes = [t for t in dag.tasks if t.task_id.endswith(".close")]
    assert len(closes) == 3  # round_00, round_01, tail
    assert all(t.outlets == [results_alias("nightly_eval")] and t.results == asset for t in closes)
    # no other task updates it: a failed run's earlier tasks emit nothing
    assert {t.task_id for t in dag.tasks if t.outlets} == {"report"} | {t.task_id for t in closes}
    # another DAG's asset is another asset
    assert results_asset("other") != asset and results_alias("other") != results_alias("nightly_eval")


def test_a_downstream_dag_is_scheduled_on_the_asset_alone() -> None:
    with DAG("train_on_results", schedule=[results_asset("nightly_eval")]) as dag:
        pass
    expected = Asset(name="batchinfer_results__nightly_eval", uri="x-batchinfer://nightly_eval/results")
    assert dag.timetable.asset_condition.objects == (expected,)


def report(**over: Any) -> dict[str, Any]:
    """The parts of ``report/summary.json`` the event reads, and some it must leave out."""
    return {
        "run_root": "s3://bucket/batchinfer/nightly_eval/r1",
        "status": "exhausted",
        "stop_reason": "max_rounds reached",
        "rounds": [{"round": 0}, {"round": 1}, {"round": 2}],
        "approved": 950,
        "accepted_by_review": 0,
        "remaining_pending": 50,
        "plans": [{"slot": "round-00", "config": {"engine_options": {"api_key": "sk-..."}}}],
        "failed_shards": [],
        **over,
    }


def test_the_event_says_where_the_results_are_how_the_run_ended_and_its_counts() -> None:
    assert results_event(report()) == {
        "run_root": "s3://bucket/batchinfer/nightly_eval/r1",
        "results": "s3://bucket/batchinfer/nightly_eval/r1/results",
        "format": "jsonl",
        "status": "exhausted",
        "stop_reason": "max_rounds reached",
        "rounds": 3,
        "approved": 950,
        "accepted_by_review": 0,
        "remaining_pending": 50,
    }


def test_the_event_of_a_local_run_and_one_a_review_accepted() -> None:
    extra = results_event(
        report(run_root="/data/runs/r2/", status="accepted_by_review", rounds=[{}], accepted_by_review=7)
    )
    assert results_event(report(), "parquet")["format"] == "parquet"
    assert extra["results"] == "/data/runs/r2/results"  # a plain path, as the run root is given
    assert (extra["status"], extra["rounds"], extra["accepted_by_review"]) == ("accepted_by_review", 1, 7)
