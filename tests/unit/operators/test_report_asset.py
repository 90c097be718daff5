"""The report task emits the results asset's event when the run succeeds, with the report's figures
as its ``extra``, and none when the report fails the run. Real files (a faked round); a stand-in
for Airflow's context."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.sdk.execution_time.context import OutletEventAccessors
from airflow.sdk.execution_time.task_runner import _serialize_outlet_events

from airflow_batchinfer.assets import results_asset
from airflow_batchinfer.compat import AirflowFailException
from airflow_batchinfer.dag_factory import build_batch_inference_dag
from airflow_batchinfer.operators import report
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.plan import MAX_ROUNDS, propose_slot
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import write_plan
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import finish_shard
from tests.support.rounds import make_run

SOME = {f"r{i:02d}" for i in range(20)}  # shards 0 and 1 approved, shard 2 rejected


def finish_run(cfg: RunConfig, finished: int = 3) -> None:
    """Round 0 with its first ``finished`` shards' jobs done (the rest never ran), closed; the tail
    planned (it skips: max_rounds 1)."""
    layout = RunLayout(cfg.run_root)
    plan = propose_slot(cfg, "round-00").plan
    write_plan(layout, plan)
    for shard in plan.shards[:finished]:
        finish_shard(cfg, 0, shard, SOME)
    close_round(cfg, plan)
    write_plan(layout, propose_slot(cfg, "tail").plan)


def report_task(cfg: RunConfig, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The factory DAG's report task, reading ``cfg`` as its run's settings."""
    monkeypatch.setattr(report, "owned_run_config", lambda run_root, context, so=None: cfg)
    return build_batch_inference_dag("rep", max_rounds=1).get_task("report")


def test_a_run_that_succeeds_emits_where_its_results_are_and_its_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = make_run(tmp_path, max_rounds=1)
    finish_run(cfg)
    events = OutletEventAccessors()
    result = report_task(cfg, monkeypatch).execute({"outlet_events": events})
    [event] = list(_serialize_outlet_events(events))
    asset = results_asset("rep")
    assert event["dest_asset_key"] == {"name": asset.name, "uri": asset.uri}
    assert event["extra"] == {
        "run_root": cfg.run_root,
        "results": str(tmp_path / "run" / "results"),
        "format": "jsonl",
        "status": "exhausted",
        "stop_reason": MAX_ROUNDS,
        "rounds": 1,
        "approved": 20,
        "accepted_by_review": 0,
        "remaining_pending": 10,
    }
    assert result["approved"] == 20


def test_a_run_the_report_fails_emits_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = make_run(tmp_path, max_rounds=1)
    finish_run(cfg, finished=2)  # shard 2 never ran: quarantined, over max_failed_shards 0
    events = OutletEventAccessors()
    with pytest.raises(AirflowFailException, match="1 shards quarantined"):
        report_task(cfg, monkeypatch).execute({"outlet_events": events})
    assert list(_serialize_outlet_events(events)) == []
