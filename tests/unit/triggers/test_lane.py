"""``LaneTrigger`` without sockets: the lane's loop (:func:`~airflow_batchinfer.run.lanes.run_lane`,
which the driver :func:`~airflow_batchinfer.run.lane_driver.drive_lane` awaits) is injected, the run
root's run.json and plan are real files. A finished lane ends its task on the triggerer with the
lane's result; a lane that cannot go on resumes the task with the lane, the shard it was on and the
error; a killed or timed-out lane cancels the job it was following."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")

from airflow.sdk import BaseHook
from airflow.triggers.base import TaskSuccessEvent, TriggerEvent

from airflow_batchinfer.exceptions import JobFailed, JobTimeout, WorkerUnavailable
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run import lane_driver
from airflow_batchinfer.run.lane_driver import TrackedPoolClient
from airflow_batchinfer.run.lanes import Lane
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, write_run_config
from airflow_batchinfer.state.docs.lanes import LaneDoc, LaneShard, write_lane
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.triggers import lane as lane_module
from airflow_batchinfer.triggers.lane import LaneTrigger
from tests.support.fake_jobs import make_run, plan_round

URL = "http://w1:8000"


class Cancels:
    """What the trigger cancels, and with which token (a fake ``WorkerClient``)."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str | None]] = []

    def client(self, url: str, *, token: str | None = None, **_: Any) -> Any:
        outer = self

        class Worker:
            async def __aenter__(self) -> Any:
                return self

            async def __aexit__(self, *exc: Any) -> None:
                return None

            async def cancel(self, job_id: str) -> Any:
                outer.seen.append((url, job_id, token))
                return SimpleNamespace(state="cancelled")

        return Worker()


@pytest.fixture
def run(tmp_path: Path) -> tuple[RunConfig, Plan]:
    cfg = make_run(tmp_path)
    write_run_config(cfg)
    return cfg, plan_round(cfg)


@pytest.fixture
def cancels(monkeypatch: pytest.MonkeyPatch) -> Cancels:
    """The pool gives URLs and a token (no socket opens); no Airflow connection may be looked up."""
    seen = Cancels()

    async def pool(worker_pool: str) -> Any:
        assert worker_pool == "local://gpu"
        return SimpleNamespace(workers=lambda lease_id=None: [URL], token=lambda: "tok")

    def lookup(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a blocking connection lookup on the triggerer")

    monkeypatch.setattr(lane_module, "aopen_pool", pool)
    monkeypatch.setattr(lane_module, "WorkerClient", seen.client)
    monkeypatch.setattr(BaseHook, "get_connection", lookup)
    return seen


def trigger_for(cfg: RunConfig, plan: Plan, index: int = 0, **kwargs: Any) -> LaneTrigger:
    lane = Lane(plan.slot, plan.round, index, 2).as_dict()
    made = LaneTrigger(lane=lane, run_root=cfg.run_root, worker_pool="local://gpu", lease_id="d/r", **kwargs)
    return LaneTrigger(**made.serialize()[1])  # as the triggerer makes it


async def events(trigger: LaneTrigger) -> list[TriggerEvent]:
    return [e async for e in trigger.run()]


def test_the_trigger_serializes_its_lane_and_settings_but_never_the_pools_token(
    run: tuple[RunConfig, Plan],
) -> None:
    cfg, plan = run
    trigger = LaneTrigger(
        lane=Lane(plan.slot, 0, 1, 2).as_dict(),
        run_root=cfg.run_root,
        worker_pool="gpu_pool",
        lease_id="d/r",
        poll_interval_s=0.5,
        lost_grace_s=7.0,
        max_resubmits=3,
        job_timeout_s=60.0,
        deadline=123.0,
        not_before=1.0,
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "airflow_batchinfer.triggers.lane.LaneTrigger"
    assert LaneTrigger(**kwargs).serialize() == (classpath, kwargs)
    assert kwargs["lane"] == {"slot": "round-00", "round": 0, "lane": 1, "lanes": 2}
    assert "tok" not in json.dumps(kwargs) and "token" not in kwargs


async def test_a_finished_lane_ends_its_task_here_with_the_lanes_result(
    run: tuple[RunConfig, Plan], cancels: Cancels, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, plan = run
    shards = [s.shard_id for s in plan.shards]
    seen: dict[str, Any] = {}

    async def run_lane(lane: Lane, cfg_: RunConfig, plan_: Plan, pools: Any, **kw: Any) -> LaneDoc:
        seen.update(
            lane=lane, plan=plan_, kinds=sorted(pools), grace=pools["infer_judge"].unreachable_grace_s
        )
        doc = LaneDoc(round=0, slot="round-00", lane=lane.index, lanes=lane.count, finished=True)
        doc.shards = [
            LaneShard(shard_id=shards[0], records=10, state="done", claimed_at=1.0, ended_at=2.0),
            LaneShard(shard_id=shards[2], records=10, state="failed", claimed_at=2.0, error="bad"),
        ]
        return doc

    monkeypatch.setattr(lane_driver, "run_lane", run_lane)
    [event] = await events(trigger_for(cfg, plan))
    assert isinstance(event, TaskSuccessEvent)
    result = event.xcoms["return_value"]  # type: ignore[index]
    assert result == {
        "slot": "round-00",
        "round": 0,
        "lane": 0,
        "shards": 2,
        "done": 1,
        "records": 10,
        "failed": [shards[2]],
        "failed_count": 1,
    }
    # the lane ran the plan the round's plan task wrote, its fused job on the run's pool
    assert seen["plan"].shards == plan.shards and seen["kinds"] == ["infer_judge"]
    assert seen["grace"] == cfg.sharding.unreachable_grace_s and cancels.seen == []


async def test_a_lane_that_cannot_go_on_resumes_its_task_naming_the_shard_it_was_on(
    run: tuple[RunConfig, Plan], cancels: Cancels, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, plan = run
    sid = plan.shards[1].shard_id

    async def run_lane(lane: Lane, cfg_: RunConfig, plan_: Plan, pools: Any, **kw: Any) -> LaneDoc:
        doc = LaneDoc(round=0, slot="round-00", lane=lane.index, lanes=lane.count)
        doc.shards = [LaneShard(shard_id=sid, records=10, state="running", claimed_at=1.0)]
        write_lane(RunLayout(cfg.run_root), doc)
        raise WorkerUnavailable("no worker of the pool answers (http://w1:8000)")

    monkeypatch.setattr(lane_driver, "run_lane", run_lane)
    [event] = await events(trigger_for(cfg, plan, index=1))
    assert not isinstance(event, TaskSuccessEvent)
    assert event.payload == {
        "state": "error",
        "slot": "round-00",
        "lane": 1,
        "lanes": 2,
        "shard": sid,
        "error": "WorkerUnavailable: no worker of the pool answers (http://w1:8000)",
    }


async def test_past_its_deadline_the_lane_cancels_its_job_and_resumes_the_task(
    run: tuple[RunConfig, Plan], cancels: Cancels, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, plan = run

    async def run_lane(lane: Lane, cfg_: RunConfig, plan_: Plan, pools: Any, **kw: Any) -> LaneDoc:
        pools["infer_judge"].current = (URL, "job-7")  # following a job that does not end
        await asyncio.Event().wait()
        raise AssertionError("not reached")

    monkeypatch.setattr(lane_driver, "run_lane", run_lane)
    trigger = trigger_for(cfg, plan, deadline=time.time() + 0.3)
    [event] = await events(trigger)
    assert event.payload["state"] == "timeout" and "execution_timeout" in event.payload["error"]
    assert cancels.seen == [(URL, "job-7", "tok")]


async def test_a_lane_killed_by_a_user_cancels_the_job_it_was_following(
    run: tuple[RunConfig, Plan], cancels: Cancels, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow 3.3 cancels ``run()``, then calls ``on_kill`` on the same trigger."""
    cfg, plan = run
    following = asyncio.Event()

    async def run_lane(lane: Lane, cfg_: RunConfig, plan_: Plan, pools: Any, **kw: Any) -> LaneDoc:
        pools["infer_judge"].current = (URL, "job-3")
        following.set()
        await asyncio.Event().wait()
        raise AssertionError("not reached")

    monkeypatch.setattr(lane_driver, "run_lane", run_lane)
    trigger = trigger_for(cfg, plan)
    task = asyncio.ensure_future(events(trigger))
    await asyncio.wait_for(following.wait(), 10)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert cancels.seen == []  # a cancellation alone (a triggerer restart) leaves the job running
    await trigger.on_kill()
    assert cancels.seen == [(URL, "job-3", "tok")]


async def test_the_tracked_client_keeps_the_job_until_it_ends_and_fails_a_job_past_its_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    spec = JobSpec(job_id="j1", kind="infer_judge", input="in.jsonl", outputs={"manifest": "m.json"})
    asked: list[float | None] = []

    async def submit(self: PoolClient, spec: JobSpec, **_: Any) -> Any:
        return URL, SimpleNamespace()

    async def ends(self: PoolClient, spec: JobSpec, *, timeout_s: float | None = None, **_: Any) -> Any:
        asked.append(timeout_s)
        await self.submit_when_free(spec)
        if timeout_s == 1.0:
            raise JobTimeout(f"job {spec.job_id} did not finish within 1.0 s (cancelled)")
        return "manifest"

    monkeypatch.setattr(PoolClient, "submit_when_free", submit)
    monkeypatch.setattr(PoolClient, "run", ends)
    client = TrackedPoolClient([URL], token="tok")
    assert await client.run(spec) == "manifest" and client.current is None and asked == [None]
    client.job_timeout_s = 1.0
    with pytest.raises(JobFailed, match="timeout"):  # a failed job to the lane: retried, then quarantined
        await client.run(spec)
    assert client.current == (URL, "j1") and asked == [None, 1.0]  # an ended job's cancel does nothing
    await client.aclose()
