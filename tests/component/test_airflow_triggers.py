"""The Airflow-side pieces against a real worker over real HTTP, without the Airflow services:
the pool hook (connection and local pool), ``LaneTrigger`` and ``PoolReadyTrigger``."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("airflow", reason="needs the airflow extra")
pytestmark = pytest.mark.airflow

from airflow.triggers.base import TaskSuccessEvent  # noqa: E402

from airflow_batchinfer.exceptions import ConfigError  # noqa: E402
from airflow_batchinfer.hooks.pool import BatchInferPoolHook, open_pool  # noqa: E402
from airflow_batchinfer.pools import require_endpoints  # noqa: E402
from airflow_batchinfer.rpc.client import SyncWorkerClient  # noqa: E402
from airflow_batchinfer.run.jobs import job_spec  # noqa: E402
from airflow_batchinfer.run.lanes import Lane, lanes_of  # noqa: E402
from airflow_batchinfer.state.config import RunConfig  # noqa: E402
from airflow_batchinfer.state.docs import read_job_manifest, write_run_config  # noqa: E402
from airflow_batchinfer.state.docs.lanes import read_lanes  # noqa: E402
from airflow_batchinfer.state.layout import RunLayout  # noqa: E402
from airflow_batchinfer.storage import shard_dataset  # noqa: E402
from airflow_batchinfer.triggers.lane import LaneTrigger  # noqa: E402
from airflow_batchinfer.triggers.pool_ready import PoolReadyTrigger  # noqa: E402
from tests.support.workers import TOKEN, WorkerProcess, start_worker  # noqa: E402


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[WorkerProcess]:
    w = start_worker(tmp_path / "w", engine_args={"latency_base_s": 0.3}, allow=[str(tmp_path)])
    yield w
    w.stop()


@pytest.fixture
def conn(monkeypatch: pytest.MonkeyPatch, worker: WorkerProcess) -> str:
    monkeypatch.setenv(
        "AIRFLOW_CONN_GPU_POOL",
        json.dumps({"conn_type": "batchinfer_pool", "host": f"{worker.url}, ", "password": TOKEN}),
    )
    return "gpu_pool"


async def first_event(trigger: Any) -> dict[str, Any]:
    async for event in trigger.run():
        return dict(event.payload)
    raise AssertionError("the trigger ended without an event")


def submit_job(tmp_path: Path, worker: WorkerProcess, n: int = 30) -> str:
    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": f"q{i}"}) + "\n" for i in range(n)))
    cfg = RunConfig.of(input=str(data), run_root=str(tmp_path / "run"), prompt_template="{{ q }}",
                       judge={"type": "llm"})  # fmt: skip
    shard = shard_dataset(cfg.data.input, RunLayout(cfg.run_root).input, records_per_shard=n).shards[0]
    spec = job_spec(cfg, "infer", 0, shard)
    with SyncWorkerClient(worker.url, token=TOKEN) as client:
        client.submit(spec)
    return spec.job_id


def test_connection_hook_gives_urls_and_token(conn: str, worker: WorkerProcess) -> None:
    pool = open_pool(conn)
    assert pool.endpoints() == [worker.url] and pool.token() == TOKEN
    assert BatchInferPoolHook(conn).test_connection() == (True, "1 workers answer")


def test_connection_with_a_wrong_token_fails_its_test(monkeypatch: pytest.MonkeyPatch, worker: WorkerProcess):
    monkeypatch.setenv("AIRFLOW_CONN_BAD", json.dumps({"conn_type": "batchinfer_pool", "host": worker.url,
                                                       "password": "nope"}))  # fmt: skip
    ok, message = BatchInferPoolHook("bad").test_connection()
    assert not ok and ("401" in message or "token" in message.lower()), message


def test_local_pool_reference_without_workers_says_what_to_do(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    monkeypatch.setenv("BATCHINFER_CACHE", str(tmp_path))
    pool = open_pool("local://nothing-here")
    assert pool.endpoints() == []
    with pytest.raises(ConfigError, match="no state on this host"):
        pool.token()  # never made here: a token no worker has would only get 401s
    assert not (tmp_path / "pools" / "nothing-here" / "token").exists()
    with pytest.raises(ConfigError, match="pool setup task"):
        require_endpoints(pool)


def lane_run(tmp_path: Path, n: int = 42, per_shard: int = 6, **settings: Any) -> tuple[RunConfig, Any]:
    """A run of ``n`` records in shards of ``per_shard``, round 0 planned (its plan task's work)."""
    from tests.support.fake_jobs import plan_round

    data = tmp_path / "lanes.jsonl"
    data.write_text("".join(json.dumps({"id": f"r{i:03d}", "q": f"q{i}"}) + "\n" for i in range(n)))
    cfg = RunConfig.of(input=str(data), run_root=str(tmp_path / "lanes-run"), prompt_template="{{ q }}",
                       judge={"type": "llm"}, records_per_shard=per_shard, **settings)  # fmt: skip
    cfg = cfg.replace(
        id_field=shard_dataset(
            cfg.data.input, RunLayout(cfg.run_root).input, records_per_shard=per_shard
        ).id_field,
    )
    write_run_config(cfg)
    return cfg, plan_round(cfg)


async def test_lane_triggers_run_every_shard_of_a_round_once_on_a_real_worker(
    tmp_path: Path, conn: str, worker: WorkerProcess
) -> None:
    """Two lanes (two triggers, as two mapped lane tasks would defer) share seven shards: each ends its
    task on the triggerer with its result, every shard is run once and is done in one lane document."""
    import asyncio

    cfg, plan = lane_run(tmp_path)
    assert len(plan.shards) == 7
    lanes = lanes_of(plan, 2)

    async def one(lane: dict[str, Any]) -> Any:
        made = LaneTrigger(
            lane=lane, run_root=cfg.run_root, worker_pool=conn, lease_id="d/r", poll_interval_s=0.2
        )
        assert TOKEN not in json.dumps(made.serialize()[1])
        return await anext(LaneTrigger(**made.serialize()[1]).run())

    events = await asyncio.gather(*(one(lane) for lane in lanes))
    assert all(isinstance(e, TaskSuccessEvent) for e in events), [e.payload for e in events]
    results = [e.xcoms["return_value"] for e in events]
    assert sum(r["done"] for r in results) == 7 and sum(r["records"] for r in results) == 42
    assert all(r["failed_count"] == 0 for r in results)
    docs = read_lanes(RunLayout(cfg.run_root), 0)
    ran = [s.shard_id for d in docs for s in d.shards]
    assert sorted(ran) == sorted(s.shard_id for s in plan.shards)  # each shard once, in one lane
    assert all(d.finished and all(s.state == "done" for s in d.shards) for d in docs)
    for sid in ran:
        manifest = read_job_manifest(RunLayout(cfg.run_root).job_manifest(0, sid, "infer_judge"))
        assert manifest is not None and manifest.counts.generated.ok == 6
    with SyncWorkerClient(worker.url, token=TOKEN) as client:
        assert sum(client.stats().jobs.values()) == 7  # one job per shard, none twice

    # the lane again (a retried task): nothing is left to take, nothing runs again
    again = await anext(
        LaneTrigger(
            lane=lanes[0], run_root=cfg.run_root, worker_pool=conn, lease_id="d/r", poll_interval_s=0.2
        ).run()
    )
    assert isinstance(again, TaskSuccessEvent) and again.xcoms["return_value"] == results[0]
    with SyncWorkerClient(worker.url, token=TOKEN) as client:
        assert sum(client.stats().jobs.values()) == 7


async def test_a_lane_judges_each_shard_on_the_judges_own_pool_once_its_inference_ends(
    tmp_path: Path, conn: str, worker: WorkerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``judge_pool`` (a judge-pool DAG's): each shard's infer job on the run's pool from the run's
    lane, then its judge job on the judge's (its own connection, here to the same worker) from a
    judge lane running beside it, as a judge-pool DAG's ``judge_lanes`` task does."""
    import asyncio

    judge_conn = {"conn_type": "batchinfer_pool", "host": worker.url, "password": TOKEN}
    monkeypatch.setenv("AIRFLOW_CONN_JUDGE_POOL", json.dumps(judge_conn))
    cfg, plan = lane_run(tmp_path, n=18, judge_pool="judge_pool")
    assert len(plan.shards) == 3

    def trigger(lane: Lane, pool: str) -> Any:
        return anext(
            LaneTrigger(
                lane=lane.as_dict(), run_root=cfg.run_root, worker_pool=pool, lease_id="d/r",
                poll_interval_s=0.2,
            ).run()
        )  # fmt: skip

    ran, judged_lane = await asyncio.gather(
        trigger(Lane(plan.slot, 0, 0, 1), conn), trigger(Lane(plan.slot, 0, 0, 1, "judge"), "judge_pool")
    )
    for event in (ran, judged_lane):
        assert isinstance(event, TaskSuccessEvent), event.payload
        assert event.xcoms["return_value"]["done"] == 3  # type: ignore[index]
    layout = RunLayout(cfg.run_root)
    for shard in plan.shards:
        inferred = read_job_manifest(layout.job_manifest(0, shard.shard_id, "infer"))
        judged = read_job_manifest(layout.job_manifest(0, shard.shard_id, "judge"))
        assert inferred is not None and judged is not None, judged
        assert judged.counts.outcomes.approved + judged.counts.outcomes.rejected >= 6, judged
        assert judged.timings.started_at >= inferred.timings.finished_at  # once its inference ended
    with SyncWorkerClient(worker.url, token=TOKEN) as client:
        assert sum(client.stats().jobs.values()) == 6  # one infer and one judge job per shard


async def test_lanes_whose_first_jobs_the_plan_task_started_follow_them(
    tmp_path: Path, conn: str, worker: WorkerProcess
) -> None:
    """The plan task claims each lane's first shard and submits its job; the lanes, started later,
    take those shards back and follow the running jobs: still one job per shard."""
    import asyncio

    from airflow_batchinfer.hooks.pool import aopen_pool
    from airflow_batchinfer.rpc.pool import PoolClient
    from airflow_batchinfer.run.lane_start import start_lanes

    cfg, plan = lane_run(tmp_path)
    lanes = lanes_of(plan, 2)
    client = PoolClient.for_pool(await aopen_pool(conn), lease_id="d/r")
    try:
        started = await start_lanes(cfg, plan, lanes, client)
    finally:
        await client.aclose()
    assert started == [s.shard_id for s in plan.shards[:2]]
    with SyncWorkerClient(worker.url, token=TOKEN) as c:
        assert sum(c.stats().jobs.values()) == 2  # submitted before any lane runs

    def trigger(lane: dict[str, Any]) -> Any:
        return anext(
            LaneTrigger(
                lane=lane, run_root=cfg.run_root, worker_pool=conn, lease_id="d/r", poll_interval_s=0.2
            ).run()
        )

    events = await asyncio.gather(*(trigger(lane) for lane in lanes))
    assert all(isinstance(e, TaskSuccessEvent) for e in events), [e.payload for e in events]
    docs = read_lanes(RunLayout(cfg.run_root), 0)
    assert [d.shards[0].shard_id for d in docs] == started  # each took its started shard back first
    assert sorted(s.shard_id for d in docs for s in d.shards) == sorted(s.shard_id for s in plan.shards)
    with SyncWorkerClient(worker.url, token=TOKEN) as c:
        assert sum(c.stats().jobs.values()) == 7  # the started jobs were followed, not run again


async def test_a_lane_whose_worker_is_gone_resumes_its_task_naming_its_shard(
    tmp_path: Path, conn: str, worker: WorkerProcess
) -> None:
    """No worker answers (the only one was killed): the lane stops on the shard it claimed, and
    its event names the lane and that shard, for the resumed task to fail with (Airflow retries)."""
    cfg, plan = lane_run(tmp_path, n=12)
    worker.process.kill()
    worker.process.wait()
    lane = Lane(plan.slot, 0, 1, 2)
    trigger = LaneTrigger(lane=lane.as_dict(), run_root=cfg.run_root, worker_pool=conn, lease_id="d/r",
                          poll_interval_s=0.1, job_timeout_s=1.0)  # fmt: skip
    event = await anext(trigger.run())
    assert not isinstance(event, TaskSuccessEvent)
    assert (event.payload["state"], event.payload["lane"]) == ("error", 1)
    assert event.payload["shard"] == plan.shards[1].shard_id  # its own stripe's first
    assert "WorkerUnavailable" in event.payload["error"] or "WorkerBusy" in event.payload["error"]


async def test_pool_ready_trigger(conn: str, worker: WorkerProcess) -> None:
    ready = await first_event(PoolReadyTrigger(worker_pool=conn, replicas=1, deadline=time.time() + 30))
    assert ready == {"state": "ready", "urls": [worker.url]}
    more = PoolReadyTrigger(worker_pool=conn, replicas=2, deadline=time.time() + 0.5, poll_interval_s=0.1)
    assert (await first_event(more))["state"] == "timeout"


def test_preflight_projects_and_stops_a_run_over_budget(tmp_path: Path, conn: str) -> None:
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_batchinfer.operators.report import PreflightOperator
    from airflow_batchinfer.state.docs import write_run_config

    data = tmp_path / "data.jsonl"
    data.write_text("".join(json.dumps({"id": i, "q": f"q{i}"}) + "\n" for i in range(100)))
    cfg = RunConfig.of(input=str(data), run_root=str(tmp_path / "run"), prompt_template="{{ q }}",
                       judge={"type": "llm"}, records_per_shard=30, preflight_records=20)  # fmt: skip
    shard_dataset(cfg.data.input, RunLayout(cfg.run_root).input, records_per_shard=30)
    write_run_config(cfg)
    op = PreflightOperator(task_id="preflight", run_root=cfg.run_root, worker_pool=conn)
    context: Any = {"dag": SimpleNamespace(dag_id="d"), "run_id": "r"}
    summary = op.execute(context)
    assert summary is not None and summary["sample_records"] == 20 and summary["dataset_records"] == 100
    assert summary["tokens_per_s"] > 0 and 0 <= summary["approval_rate"] <= 1
    assert summary["projected_gpu_hours"] > 0
    # the sizing plan from the measured rates: 4 shards of 30 on 1 worker's slots (from /v1/stats)
    sizing = summary["sizing"]
    assert (sizing["records"], sizing["gpus"], sizing["max_map_length"]) == (100, 1, 1024)
    assert sizing["concurrency"] >= 1 and sizing["rounds"][0]["shards"] == 4
    assert summary["projected_wall_s"] == round(sizing["wall_s"], 1)
    write_run_config(RunConfig.of(**{**cfg.to_dict(), "budget_gpu_hours": 1e-9}))
    with pytest.raises(AirflowFailException, match="exceeds the budget"):
        op.execute(context)
