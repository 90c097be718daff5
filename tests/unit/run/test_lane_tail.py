"""A lane that ends gives back the replicas the round's tail no longer needs, without sockets: the
round read from its lane documents, the workers from their stats, the pool's demand lowered and the
run's ``lease`` usage event recorded."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.rpc.models import WorkerStats
from airflow_batchinfer.run.lane_tail import round_left, shrink_tail, take_back
from airflow_batchinfer.state.docs import Plan
from airflow_batchinfer.state.docs.lanes import LaneDoc, LaneShard, write_lane
from airflow_batchinfer.state.docs.usage import read_usage
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import make_run, plan_round


class Pool:
    backend = "local"

    def __init__(self) -> None:
        self.wanted: list[int | None] = []

    def __str__(self) -> str:
        return "local://tail"

    def want(self, lease_id: str, replicas: int | None = None) -> int:
        assert lease_id == "dag/run"
        self.wanted.append(replicas)
        return 4 if replicas is None else replicas


class Worker:
    def __init__(self, busy: int) -> None:
        self.busy = busy

    async def stats(self) -> WorkerStats:
        return WorkerStats(
            engine={}, slots_total=2, slots_busy=self.busy, draining=False, jobs={}, batcher={}
        )


class Client:
    """The pool client's workers: four, of which ``busy`` run a job."""

    def __init__(self, busy: int) -> None:
        self.clients = {f"http://w{i}": Worker(int(i < busy)) for i in range(4)}

    async def refresh(self, *, force: bool = False) -> None:
        pass


def lane(plan: Plan, index: int, lanes: int, states: dict[int, str], finished: bool) -> LaneDoc:
    shards = [
        LaneShard(shard_id=plan.shards[i].shard_id, records=10, state=s, claimed_at=0.0)  # type: ignore[arg-type]
        for i, s in states.items()
    ]
    return LaneDoc(round=0, slot=plan.slot, lane=index, lanes=lanes, shards=shards, finished=finished)


def test_round_left_counts_shards_not_ended_and_lanes_not_finished(tmp_path: Path) -> None:
    plan = plan_round(make_run(tmp_path))  # three shards
    docs = [lane(plan, 0, 3, {0: "done"}, True), lane(plan, 1, 3, {1: "running"}, False)]
    stale = lane(plan, 0, 5, {2: "done"}, True)  # an earlier try with another lane count
    assert round_left(plan, [*docs, stale], 3) == (2, 2)  # lane 2 has no document yet: running


async def test_a_lane_that_ends_lowers_the_runs_demand_and_records_it(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    layout = RunLayout(cfg.run_root)
    write_lane(layout, lane(plan, 0, 3, {0: "done"}, True))
    write_lane(layout, lane(plan, 1, 3, {1: "done"}, True))
    write_lane(layout, lane(plan, 2, 3, {2: "running"}, False))
    pool = Pool()
    got = await shrink_tail(pool, "dag/run", Client(busy=1), plan, 3, run_root=cfg.run_root)  # type: ignore[arg-type]
    assert got == 1 and pool.wanted == [1]  # one lane, one shard left: one worker of four
    (event,) = read_usage(layout)
    assert (event.kind, event.replicas, event.pool) == ("lease", 1, "local://tail")
    assert take_back(pool, "dag/run", run_root=cfg.run_root) == 4 and pool.wanted[-1] is None  # type: ignore[arg-type]
    assert [e.replicas for e in read_usage(layout)] == [1, 4]


async def test_the_tail_keeps_busy_workers_and_nothing_changes_while_all_are_needed(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    write_lane(RunLayout(cfg.run_root), lane(plan, 0, 3, {0: "done"}, True))
    pool = Pool()
    # 2 lanes on 2 shards at 2 slots a worker need one worker, but 4 run a job: all kept
    assert await shrink_tail(pool, "dag/run", Client(busy=4), plan, 3, run_root=cfg.run_root) is None  # type: ignore[arg-type]
    assert await shrink_tail(pool, None, Client(busy=0), plan, 3, run_root=cfg.run_root) is None  # type: ignore[arg-type]
    assert pool.wanted == []


async def test_a_pool_that_cannot_shrink_does_not_fail_the_lane(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)

    class Broken(Pool):
        def want(self, lease_id: str, replicas: int | None = None) -> Any:
            raise OSError("no pool state on this host")

    with caplog.at_level(logging.WARNING):
        got = await shrink_tail(Broken(), "dag/run", Client(busy=0), plan, 3, run_root=cfg.run_root)  # type: ignore[arg-type]
    assert got is None and "keeps its replicas" in caplog.text
