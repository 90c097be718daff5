"""``ShardLaneOperator`` without sockets or Airflow services: the owner check, the pool's lease and
the lane's loop are injected; run.json and the plan are real files. Without an ``aws_conn_id`` a lane
defers at once to its trigger; with one it runs in the task; a lane that stopped fails its task naming
the lane, the shard and the remedy; a killed lane in its task cancels its job."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.sdk.exceptions import AirflowException, AirflowFailException, TaskDeferred

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.operators import lanes as lanes_module
from airflow_batchinfer.operators.lanes import JudgeLanesOperator, ShardLaneOperator
from airflow_batchinfer.run.lane_driver import TrackedPoolClient, tracked_client
from airflow_batchinfer.run.lanes import Lane
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, read_run_config, write_run_config
from airflow_batchinfer.state.docs.lanes import LaneDoc, LaneShard, write_lane
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.triggers.lane import LaneTrigger
from tests.support.fake_jobs import make_run, plan_round

URL = "http://w1:8000"
STARTED = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[RunConfig, Plan, list[str]]:
    """A planned round; the owner check passes, the pool gives a worker and a token; the leases the
    task renews are recorded."""
    cfg = make_run(tmp_path)
    write_run_config(cfg)
    held: list[str] = []

    def hold(worker_pool: str, context: Any, log: Any) -> Any:
        held.append(worker_pool)
        return SimpleNamespace(workers=lambda lease_id=None: [URL], token=lambda: "tok")

    monkeypatch.setattr(lanes_module, "hold_pool", hold)
    monkeypatch.setattr(lanes_module, "task_owns", lambda run_root, context, so=None: None)
    return cfg, plan_round(cfg), held


def context() -> Any:
    return {"dag": SimpleNamespace(dag_id="d"), "run_id": "r", "ti": SimpleNamespace(start_date=STARTED)}


def op(cfg: RunConfig, plan: Plan, index: int = 0, **kwargs: Any) -> ShardLaneOperator:
    lane = Lane(plan.slot, plan.round, index, 2).as_dict()
    return ShardLaneOperator(
        task_id="lanes", lane=lane, run_root=cfg.run_root, worker_pool="local://gpu", **kwargs
    )


def test_a_lane_defers_at_once_to_its_trigger_holding_no_slot(run: Any) -> None:
    cfg, plan, held = run
    task = op(
        cfg,
        plan,
        index=1,
        execution_timeout=timedelta(hours=2),
        job_timeout=timedelta(minutes=30),
        poll_interval_s=0.5,
    )
    with pytest.raises(TaskDeferred) as deferred:
        task.execute(context())
    trigger = deferred.value.trigger
    assert isinstance(trigger, LaneTrigger) and deferred.value.method_name == "execute_complete"
    _, kwargs = trigger.serialize()
    assert kwargs["lane"] == {"slot": "round-00", "round": 0, "lane": 1, "lanes": 2}
    assert (kwargs["run_root"], kwargs["worker_pool"], kwargs["lease_id"]) == (
        cfg.run_root,
        "local://gpu",
        "d/r",
    )
    assert kwargs["deadline"] == (STARTED + timedelta(hours=2)).timestamp()  # the task's execution_timeout
    assert (kwargs["job_timeout_s"], kwargs["poll_interval_s"]) == (1800.0, 0.5)
    assert "tok" not in json.dumps(kwargs)
    assert held == ["local://gpu"]  # the run's lease renewed (dead local workers restarted) first


def test_with_an_aws_connection_the_lane_runs_in_the_task(run: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The triggerer cannot look the connection up: the task runs the lane with its credentials."""
    cfg, plan, _ = run
    creds = {"key": "k", "secret": "s"}
    seen: dict[str, Any] = {}
    monkeypatch.setattr(lanes_module, "storage_options_from_aws_conn", lambda conn: creds if conn else {})

    async def drive(lane: Lane, run_root: str, pool: Any, **kw: Any) -> LaneDoc:
        client = tracked_client(pool, kw["client_args"])  # as drive_lane makes it
        seen.update(lane=lane, so=kw["so"], client_so=client.storage_options, token=client.token)
        doc = LaneDoc(round=0, slot="round-00", lane=lane.index, lanes=lane.count, finished=True)
        doc.shards = [LaneShard(shard_id="part-00000", records=10, state="done", claimed_at=1.0)]
        return doc

    monkeypatch.setattr(lanes_module, "drive_lane", drive)
    result = op(cfg, plan, aws_conn_id="aws_s3").execute(context())  # no TaskDeferred
    assert result == {
        "slot": "round-00",
        "round": 0,
        "lane": 0,
        "shards": 1,
        "done": 1,
        "records": 10,
        "failed": [],
        "failed_count": 0,
    }
    assert seen["lane"] == Lane("round-00", 0, 0, 2)
    assert seen["so"] == seen["client_so"] == creds and seen["token"] == "tok"


def test_a_stopped_lane_fails_its_task_naming_the_lane_the_shard_and_the_remedy(run: Any) -> None:
    cfg, plan, _ = run
    event = {
        "state": "error",
        "slot": "round-00",
        "lane": 1,
        "lanes": 2,
        "shard": "part-00002",
        "error": "WorkerUnavailable: no worker of the pool answers",
    }
    with pytest.raises(AirflowException) as failed:
        op(cfg, plan, index=1).execute_complete(context(), event)
    text = str(failed.value)
    assert "lane 1 of round-00 (2 lanes) stopped on shard part-00002" in text
    assert "no worker of the pool answers" in text and "Remedy:" in text
    assert "takes shard part-00002 back first" in text and "quarantines" in text


def test_a_lane_stopped_in_its_task_names_the_shard_its_document_says_it_was_on(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, plan, _ = run
    sid = plan.shards[2].shard_id

    async def drive(lane: Lane, run_root: str, pool: Any, **kw: Any) -> LaneDoc:
        doc = LaneDoc(round=0, slot="round-00", lane=lane.index, lanes=lane.count, claiming=sid)
        write_lane(RunLayout(cfg.run_root), doc)
        raise StorageError(f"{cfg.run_root}/round-00/claims: unreachable")

    monkeypatch.setattr(lanes_module, "drive_lane", drive)
    with pytest.raises(
        AirflowException, match=f"lane 0 of round-00 .*stopped on shard {sid}: error: StorageError"
    ):
        op(cfg, plan, in_task=True).execute(context())


def test_a_lane_without_its_rounds_plan_fails_without_retries(run: Any) -> None:
    cfg, _, _ = run
    task = ShardLaneOperator(
        task_id="lanes",
        lane=Lane("round-01", 1, 0, 1).as_dict(),
        run_root=cfg.run_root,
        worker_pool="local://gpu",
    )
    with pytest.raises(AirflowFailException, match=r"round-01 has no plan\.json.*Remedy: clear"):
        task.execute(context())


def test_a_lane_killed_in_its_task_cancels_the_job_it_follows(
    run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, plan, _ = run
    cancelled: list[tuple[str, str, str | None]] = []

    class Worker:
        def __init__(self, url: str, *, token: str | None = None, **_: Any) -> None:
            self.url, self.token = url, token

        def __enter__(self) -> Any:
            return self

        def __exit__(self, *exc: Any) -> None:
            return None

        def cancel(self, job_id: str) -> None:
            cancelled.append((self.url, job_id, self.token))

    monkeypatch.setattr(lanes_module, "SyncWorkerClient", Worker)
    task = op(cfg, plan, in_task=True)
    task.on_kill()  # nothing running yet: nothing to cancel
    client = TrackedPoolClient([URL], token="tok")
    client.current = (URL, "job-5")
    task._clients = [client]
    task.on_kill()
    assert cancelled == [(URL, "job-5", "tok")]


def test_a_lane_whose_judge_has_its_own_pool_keeps_that_pool_too(
    tmp_path: Path, run: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A judge-pool DAG's lane judges on the judge's pool the shards it infers once every judge lane
    has ended (run.lanes.hand_over): that pool's lease is renewed too (dead local judge workers
    restarted) before the lane defers. A judge lane renews the judge pool's alone."""
    (tmp_path / "judged").mkdir()
    cfg = make_run(tmp_path / "judged", judge_pool="local://judge")
    write_run_config(cfg)
    plan = plan_round(cfg)
    _, _, held = run
    with pytest.raises(TaskDeferred):
        op(cfg, plan).execute(context())
    assert held == ["local://gpu", "local://judge"]
    held.clear()
    judge_lane = Lane(plan.slot, plan.round, 0, 2, "judge").as_dict()
    task = ShardLaneOperator(
        task_id="judge_lanes", lane=judge_lane, run_root=cfg.run_root, worker_pool="local://judge"
    )
    with pytest.raises(TaskDeferred) as deferred:
        task.execute(context())
    assert held == ["local://judge"]
    _, kwargs = deferred.value.trigger.serialize()
    assert kwargs["lane"]["role"] == "judge" and kwargs["worker_pool"] == "local://judge"


def test_the_judge_plan_task_returns_one_judge_lane_per_judge_slot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The judge lanes a round slot maps (from its stored plan): one per judge pool slot, never more
    than the shards; none for a run whose judge has no pool of its own; bad slots fail with the remedy."""
    monkeypatch.setattr(
        lanes_module, "owned_run_config", lambda run_root, context, so=None: read_run_config(run_root)
    )
    (tmp_path / "judged").mkdir(), (tmp_path / "fused").mkdir()
    judged = make_run(tmp_path / "judged", judge_pool="local://judge")  # 3 shards
    fused = make_run(tmp_path / "fused")
    for cfg in (judged, fused):
        write_run_config(cfg)
        plan_round(cfg)

    def judge_plan(cfg: RunConfig, slots: str) -> Any:
        task = JudgeLanesOperator(
            task_id="judge_plan", slot="round-00", run_root=cfg.run_root, judge_slots=slots
        )
        return task.execute(context())

    assert judge_plan(judged, "2") == [Lane("round-00", 0, i, 2, "judge").as_dict() for i in range(2)]
    assert len(judge_plan(judged, "8")) == 3
    assert judge_plan(fused, "2") == []
    with pytest.raises(AirflowFailException, match="judge_replicas and judge_concurrency"):
        judge_plan(judged, "0")
