"""The job tracker on real workers over real HTTP: one copy of each job, a drain that resubmits instead
of failing, and killed tasks and triggers that cancel their job."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest

from airflow_batchinfer.rpc.fingerprint import pin_input
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.state.docs import JobManifest
from airflow_batchinfer.storage import JsonlFile
from tests.support.worker_failures import infer_spec, shard, wait_for
from tests.support.workers import TOKEN, WorkerProcess, start_worker

pytestmark = pytest.mark.slow


def running(w: WorkerProcess, job_id: str) -> bool:
    r = w.http("GET", f"/v1/jobs/{job_id}")
    return r.status_code == 200 and r.json()["state"] == "running"


def jobs_seen(w: WorkerProcess) -> dict[str, int]:
    return dict(w.http("GET", "/v1/stats").json()["jobs"])


def test_a_retry_follows_the_copy_that_still_runs(tmp_path: Path) -> None:
    """A second client (an Airflow retry after a zombie task) finds the running copy and waits for it:
    the idle worker, which it would otherwise prefer, never sees the job."""
    layout, s = shard(tmp_path, 200)
    spec = infer_spec(layout, s, "once-1", chunk_size=20)
    busy, idle = (start_worker(tmp_path, engine_args={"latency_base_s": 0.05}, concurrency=c) for c in (1, 8))
    try:

        async def scenario() -> JobManifest:
            first = PoolClient([busy.url], token=TOKEN, poll_interval_s=0.1)
            runner = asyncio.create_task(first.run(spec))  # the first try; its task then dies
            pinned = pin_input(spec, JsonlFile(spec.input).info())
            await asyncio.to_thread(wait_for, lambda: running(busy, pinned.job_id))
            retry = PoolClient([idle.url, busy.url], token=TOKEN, poll_interval_s=0.1)
            try:
                return await retry.run(spec)
            finally:
                await retry.aclose()
                runner.cancel()
                await first.aclose()

        manifest = asyncio.run(scenario())
        assert manifest.counts.model_dump() == {"generated": {"ok": 200}} and manifest.worker.endswith(
            busy.url.rsplit(":", 1)[1]
        )
        assert jobs_seen(idle) == {} and jobs_seen(busy) == {"succeeded": 1}
    finally:
        busy.stop()
        idle.stop()


def test_a_draining_worker_hands_its_job_back_and_the_client_resubmits_it(tmp_path: Path) -> None:
    layout, s = shard(tmp_path, 300)
    spec = infer_spec(layout, s, "drain-2", chunk_size=10)
    draining = start_worker(tmp_path, engine_args={"latency_base_s": 0.05}, extra=["--drain-timeout", "0.5"])
    other = start_worker(tmp_path, engine_args={"latency_base_s": 0.01}, concurrency=1)
    try:

        async def scenario() -> JobManifest:
            # the draining worker has the most free slots: the job goes there first
            pool = PoolClient([draining.url, other.url], token=TOKEN, poll_interval_s=0.1, lost_grace_s=1)
            runner = asyncio.create_task(pool.run(spec))
            pinned = pin_input(spec, JsonlFile(spec.input).info())
            await asyncio.to_thread(wait_for, lambda: running(draining, pinned.job_id))
            draining.process.send_signal(signal.SIGTERM)  # drains: the job is given up after 0.5 s
            try:
                return await asyncio.wait_for(runner, 120)
            finally:
                await pool.aclose()

        manifest = asyncio.run(scenario())
        assert manifest.counts.model_dump() == {"generated": {"ok": 300}}
        assert jobs_seen(other) == {"succeeded": 1}  # ran again there: a drain is not a failure
        assert "draining" in draining.log_tail()
    finally:
        draining.stop()
        other.stop()


@pytest.mark.airflow
def test_killed_tasks_and_triggers_cancel_their_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("airflow", reason="needs the airflow extra")
    from airflow_batchinfer.operators.lanes import ShardLaneOperator
    from airflow_batchinfer.run.lane_driver import TrackedPoolClient
    from airflow_batchinfer.triggers.lane import LaneTrigger

    w = start_worker(tmp_path, engine_args={"latency_base_s": 0.2})
    monkeypatch.setenv("AIRFLOW_CONN_POOL", json.dumps({"conn_type": "batchinfer_pool", "host": w.url,
                                                        "password": TOKEN}))  # fmt: skip
    layout, s = shard(tmp_path, 400)
    try:
        for n, kill in enumerate(("task", "trigger")):
            spec = infer_spec(layout, s, f"kill-{n}", chunk_size=10)
            w.submit(spec)
            client = TrackedPoolClient([w.url], token=TOKEN)  # the lane's, following the job
            client.current = (w.url, spec.job_id)
            lane = {"slot": "round-00", "round": 0, "lane": 0, "lanes": 1}
            if kill == "task":  # on_kill: execution_timeout, SIGTERM from a user's mark/clear
                op = ShardLaneOperator(task_id="lanes", lane=lane, run_root=layout.root, worker_pool="pool")
                op._clients = [client]
                op.on_kill()
            else:  # a deferred lane cleared or marked by a user: Airflow 3.3 calls the trigger's on_kill
                trigger = LaneTrigger(lane=lane, run_root=layout.root, worker_pool="pool")
                trigger._clients = [client]
                asyncio.run(trigger.on_kill())
            assert w.wait(spec.job_id, timeout=30).state == "cancelled"
    finally:
        w.stop()
