"""A round's lanes started by its plan task (:mod:`airflow_batchinfer.run.lane_start`), without sockets:
a fake pool records what is submitted and run; claims and lane documents are real files. Each lane's
first shard is claimed for it and its job submitted as the lane would submit it; the lane then takes
that shard back first and runs every other shard once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from airflow_batchinfer.exceptions import WorkerBusy
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.run.jobs import job_spec
from airflow_batchinfer.run.lane_start import start_lanes
from airflow_batchinfer.run.lanes import Lane, lanes_of, run_lane
from airflow_batchinfer.state.docs.lanes import claimed_shards, read_claim, read_lane
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import make_run, plan_round


class Pool:
    """What a lane's pool client is asked: ``submit`` (a job started), ``run`` (a job run to its end);
    ``busy``: submits answer 429."""

    def __init__(self, busy: bool = False) -> None:
        self.submitted: list[str] = []
        self.ran: list[str] = []
        self.busy = busy

    async def pinned(self, spec: JobSpec) -> JobSpec:
        return spec.model_copy(update={"job_id": spec.job_id + "-pinned"})

    async def finished(self, spec: JobSpec) -> None:
        return None

    async def submit(self, spec: JobSpec, **_: Any) -> tuple[str, Any]:
        if self.busy:
            raise WorkerBusy("all 1 reachable workers are busy")
        self.submitted.append(spec.job_id)
        return "http://w1", None

    async def run(self, spec: JobSpec, **_: Any) -> Any:  # PoolClient.run pins, then follows a running copy
        self.ran.append((await self.pinned(spec)).job_id)
        return None


async def test_each_lanes_first_shard_is_claimed_for_it_and_its_job_submitted(tmp_path: Path) -> None:
    cfg = make_run(tmp_path)  # three shards
    plan = plan_round(cfg)
    layout = RunLayout(cfg.run_root)
    lanes = lanes_of(plan, 2)
    pool = Pool()
    started = await start_lanes(cfg, plan, lanes, pool)  # type: ignore[arg-type]
    ids = [s.shard_id for s in plan.shards]
    assert started == ids[:2]  # lane 0's stripe starts with shard 0, lane 1's with shard 1
    first = [(await pool.pinned(job_spec(cfg, "infer_judge", 0, s))).job_id for s in plan.shards[:2]]
    assert sorted(pool.submitted) == sorted(first)  # the very jobs the lanes would submit (same ids)
    for i, sid in enumerate(ids[:2]):
        claim = read_claim(layout, 0, sid)
        doc = read_lane(layout, 0, i)
        assert claim is not None and claim.lane == i
        assert doc is not None and [(s.shard_id, s.state) for s in doc.shards] == [(sid, "claimed")]
    assert claimed_shards(layout, 0) == set(ids[:2])

    # the lanes: each takes its claimed shard back first, then the rest; every shard runs once
    done = [await run_lane(Lane.of(d), cfg, plan, {"infer_judge": pool}) for d in lanes]  # type: ignore[dict-item]
    assert (done[0].shards[0].shard_id, done[1].shards[0].shard_id) == (ids[0], ids[1])
    ran = sorted(s.shard_id for d in done for s in d.shards)
    assert ran == ids and all(s.state == "done" for d in done for s in d.shards)
    every = [(await pool.pinned(job_spec(cfg, "infer_judge", 0, s))).job_id for s in plan.shards]
    assert sorted(pool.ran) == sorted(every)  # each shard's job once, the started ones followed


async def test_a_first_job_the_pool_cannot_take_is_left_to_its_lane(tmp_path: Path) -> None:
    """No free slot: the claim and the lane's document stay; the lane runs the shard itself."""
    cfg = make_run(tmp_path)
    plan = plan_round(cfg)
    pool = Pool(busy=True)
    lanes = lanes_of(plan, 1)
    assert await start_lanes(cfg, plan, lanes, pool) == []  # type: ignore[arg-type]
    doc = read_lane(RunLayout(cfg.run_root), 0, 0)
    assert doc is not None and doc.shards[0].state == "claimed"
    pool.busy = False
    done = await run_lane(Lane.of(lanes[0]), cfg, plan, {"infer_judge": pool})  # type: ignore[dict-item]
    assert [s.shard_id for s in done.shards] == [s.shard_id for s in plan.shards]
    assert len(pool.ran) == 3
