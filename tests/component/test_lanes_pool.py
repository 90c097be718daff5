"""Lanes on a real local pool (worker processes over HTTP, simulated engine): ``batchinfer run``
with more shards than job slots runs each round by one lane per slot (or ``--lanes``), every shard
once; a lane stopped while its shard's job runs on a worker takes that shard back when restarted and
follows the job there instead of running it again."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from pathlib import Path

import pytest

from airflow_batchinfer.pools import LocalPool, LocalPoolSpec
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.lanes import Lane, run_lane
from airflow_batchinfer.run.pipeline import pool_slots, run_pipeline
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import read_plan, write_plan
from airflow_batchinfer.state.docs.lanes import claimed_shards, read_lane, read_lanes
from airflow_batchinfer.state.layout import RunLayout
from tests.support.fake_jobs import plan_round
from tests.support.lane_rounds import lanes_run
from tests.support.local_pool import cli, dataset

pytestmark = pytest.mark.slow


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    import os

    return {**os.environ, "BATCHINFER_CACHE": str(tmp_path / "cache")}


def lanes_ran(root: Path, r: int) -> tuple[list[str], Counter[str], set[str]]:
    """Round ``r``'s planned shards, how often its lane documents say each was done, its claims."""
    layout = RunLayout(str(root))
    plan = read_plan(layout, f"round-{r:02d}")
    assert plan is not None
    docs = read_lanes(layout, r)
    done = Counter(s.shard_id for d in docs for s in d.shards if s.state == "done")
    assert all(d.finished and d.lanes == len(docs) for d in docs), docs
    return [s.shard_id for s in plan.shards], done, claimed_shards(layout, r)


def test_batchinfer_run_runs_more_shards_than_slots_by_lanes(tmp_path: Path, env: dict[str, str]) -> None:
    src = dataset(tmp_path, 400)
    run = ["--name", "lanes", "--engine", "simulated", "--engine-arg", "approval_rate=0.5",
           "--prompt-template", "{{ question }}", "--judge", '{"type": "llm"}', "--max-rounds", "2",
           "--records-per-shard", "20", "--replicas", "2", "--concurrency", "2"]  # fmt: skip
    try:
        out = cli("run", str(src), str(tmp_path / "run"), *run, env=env)
        assert out["invariant"]["ok"], out["invariant"]
        assert out["approved"] + out["remaining_pending"] == 400
        for r in (0, 1):
            shards, done, claims = lanes_ran(tmp_path / "run", r)
            assert len(shards) > 4  # more shards than the pool's 2 x 2 slots
            assert done == Counter(shards) and claims == set(shards)  # every shard once, by a lane
            assert len(read_lanes(RunLayout(str(tmp_path / "run")), r)) == 4  # one lane per slot
            manifests = list((tmp_path / "run" / f"round-{r:02d}" / "jobs").glob("*.infer_judge.json"))
            assert len(manifests) == len(shards)

        # --lanes: that many, whatever the pool's slots
        out = cli("run", str(src), str(tmp_path / "three"), *run, "--lanes", "3", env=env)
        assert out["invariant"]["ok"], out["invariant"]
        shards, done, _ = lanes_ran(tmp_path / "three", 0)
        assert done == Counter(shards) and len(read_lanes(RunLayout(str(tmp_path / "three")), 0)) == 3
    finally:
        cli("pool", "down", "--name", "lanes", env=env)


async def test_run_pipeline_reports_each_rounds_records_as_its_lanes_end_shards(tmp_path: Path) -> None:
    cfg = RunConfig.of(
        input=str(dataset(tmp_path, 60)),
        run_root=str(tmp_path / "run"),
        prompt_template="{{ question }}",
        judge={"type": "llm"},
        records_per_shard=5,
        max_rounds=1,
    )  # 12 shards on 3 slots
    pool = LocalPool("progress", state_dir=tmp_path / "pools")
    pool.up(LocalPoolSpec(engine="simulated", replicas=1, concurrency=3, allowed_prefixes=(str(tmp_path),)))
    client = PoolClient.for_pool(pool)
    seen: list[tuple[str, int, int]] = []
    try:
        assert await pool_slots(client) == 3
        report = await run_pipeline(cfg, client, progress=lambda *p: seen.append(p))
    finally:
        await client.aclose()
        pool.down()
    assert report["invariant"]["ok"], report["invariant"]
    assert {p[0] for p in seen} == {"round 0 infer_judge"}
    done = [p[1] for p in seen]
    assert len(done) == 12 and done == sorted(done) and done[-1] == 60 and {p[2] for p in seen} == {60}
    assert len(read_lanes(RunLayout(cfg.run_root), 0)) == 3


async def test_a_lane_stopped_while_its_job_runs_takes_the_shard_back_and_follows_the_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cfg = lanes_run(tmp_path, n=40, per_shard=10, chunk_size=5)  # 4 shards of 2 chunks each
    pool = LocalPool("restart", state_dir=tmp_path / "pools")
    spec = LocalPoolSpec(engine="simulated", engine_options={"latency_base_s": 0.5}, replicas=1,
                         concurrency=2, allowed_prefixes=(str(tmp_path),))  # fmt: skip
    pool.up(spec)
    client = PoolClient.for_pool(pool)
    layout = RunLayout(cfg.run_root)
    try:
        plan = plan_round(cfg)
        plan.engine = await client.engine()  # as the pipeline records it: close counts its jobs only
        write_plan(layout, plan)
        (worker,) = client.clients.values()
        lane = Lane(plan.slot, 0, 0, 1)

        # stopped (a triggerer restarted, a task killed) while its first shard's job runs on the worker
        first = asyncio.create_task(run_lane(lane, cfg, plan, {"infer_judge": client}))
        while not (await worker.stats()).slots_busy:
            assert not first.done(), first
            await asyncio.sleep(0.05)
        first.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await first
        stopped = read_lane(layout, 0, 0)
        assert stopped is not None and [(s.shard_id, s.state) for s in stopped.shards] == [
            (plan.shards[0].shard_id, "running")
        ]

        with caplog.at_level(logging.INFO, logger="airflow_batchinfer.lanes"):
            doc = await run_lane(lane, cfg, plan, {"infer_judge": client})
        stats = await worker.stats()
    finally:
        await client.aclose()
        pool.down()
    ids = [s.shard_id for s in plan.shards]
    assert [(s.shard_id, s.state) for s in doc.shards] == [(i, "done") for i in ids]
    assert f"lane 0 of round-00: taking back ['{ids[0]}']" in caplog.text  # the lane's log says so
    assert stats.jobs.get("succeeded") == 4, stats.jobs  # the stopped lane's job ran once, followed
    summary = close_round(cfg, plan)
    assert summary is not None and summary["invariant"]["ok"] and summary["failed_shards"] == []
    assert summary["approved"] + summary["rejected"] == 40
    assert doc.finished and doc.claiming is None
