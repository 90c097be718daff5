"""Workers killed with SIGKILL mid-job: resubmission completes with every id exactly once, and
in-place samples resume at their checkpointed attempt. Also: a pool client survives a lost worker."""

from __future__ import annotations

import asyncio
import signal
from collections import Counter
from pathlib import Path

import pytest

from airflow_batchinfer.rpc.fingerprint import pin_input
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.state.docs import JobManifest
from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.worker.checkpoints import CheckpointLog
from tests.support.worker_failures import in_place_spec, infer_spec, shard, wait_for
from tests.support.workers import TOKEN, WorkerProcess, start_worker

pytestmark = pytest.mark.slow


def test_kill_9_mid_infer_then_resubmit_gives_each_id_once(tmp_path: Path) -> None:
    layout, s = shard(tmp_path, 400)
    spec = infer_spec(layout, s, "infer-1", chunk_size=20, input_records=400)
    w1 = start_worker(tmp_path, engine_args={"latency_base_s": 0.05})
    w1.submit(spec)
    wait_for(lambda: w1.status(spec.job_id).progress.done >= 60)
    w1.stop(signal.SIGKILL)
    assert not Path(spec.outputs["inferred"]).exists()  # nothing partial is visible
    w2 = start_worker(tmp_path)
    try:
        assert w2.wait(w2.submit(spec).job_id).state == "succeeded"
    finally:
        w2.stop()
    ids = [r["id"] for r in JsonlFile(spec.outputs["inferred"]).iter_records()]
    assert Counter(ids) == Counter(f"r{i}" for i in range(400))


def test_kill_9_mid_in_place_resumes_each_sample_at_its_checkpointed_attempt(tmp_path: Path) -> None:
    layout, s = shard(tmp_path, 60)
    spec = in_place_spec(
        layout, s, "inplace-1", max_attempts=8, chunk_size=60, checkpoint_every=30, checkpoint_interval_s=0.1
    )
    # approval_rate 0: every attempt is rejected, so each sample runs to max_attempts
    w1 = start_worker(tmp_path, engine_args={"approval_rate": 0.0, "latency_base_s": 0.1})
    w1.submit(spec)
    log = CheckpointLog(spec.outputs["checkpoints"])
    wait_for(lambda: len(log.dir.shards()) >= 4)
    w1.stop(signal.SIGKILL)
    states = log.load()
    checkpointed = {k: v.attempts for k, v in states.items()}
    assert checkpointed and max(checkpointed.values()) >= 2
    # no template reads previous: a checkpoint keeps what the next max_tokens is decided from, no answer
    kept = [v.previous for v in states.values() if v.final is None]
    assert kept and all(p is not None and p["result"] is None and p["reason"] is None for p in kept)
    assert all(p is not None and p["attempt"] >= 1 and p["finish_reason"] and p["max_tokens"] for p in kept)
    assert len(log.dir.shards()) < 60 * 2  # batched segments, not one object per sample and attempt
    assert not Path(spec.outputs["rejected"]).exists()

    w2 = start_worker(tmp_path, engine_args={"approval_rate": 0.0})
    try:
        status = w2.wait(w2.submit(spec).job_id)
    finally:
        w2.stop()
    assert status.state == "succeeded", status.error
    rows = list(JsonlFile(spec.outputs["rejected"]).iter_records())
    assert sorted(r["id"] for r in rows) == sorted(f"r{i}" for i in range(60))
    assert {r["status"] for r in rows} == {"max_attempts"} and {r["attempts"] for r in rows} == {8}
    # the second run only spent the attempts the checkpoints did not record
    expected = sum(8 - checkpointed.get(f"r{i}", 0) for i in range(60))
    assert status.counts.outcomes.attempts == expected < 60 * 8
    assert status.counts.resume.samples == len(checkpointed)


def test_pool_client_resubmits_when_its_worker_dies(tmp_path: Path) -> None:
    layout, s = shard(tmp_path, 300)
    spec = infer_spec(layout, s, "lost-1", chunk_size=10)
    workers = [start_worker(tmp_path, engine_args={"latency_base_s": 0.05}) for _ in range(2)]
    job_id = pin_input(spec, JsonlFile(spec.input).info()).job_id  # the id the pool client submits

    async def scenario() -> JobManifest:
        pool = PoolClient([w.url for w in workers], token=TOKEN, poll_interval_s=0.1, lost_grace_s=0.5)
        runner = asyncio.create_task(pool.run(spec))
        victim: WorkerProcess | None = None
        while victim is None:
            await asyncio.sleep(0.1)
            for w in workers:
                if (await asyncio.to_thread(w.http, "GET", f"/v1/jobs/{job_id}")).status_code == 200:
                    victim = w
        victim.stop(signal.SIGKILL)
        try:
            return await asyncio.wait_for(runner, 120)
        finally:
            await pool.aclose()

    try:
        manifest = asyncio.run(scenario())
    finally:
        for w in workers:
            w.stop()
    assert manifest.counts.model_dump() == {"generated": {"ok": 300}}
    ids = [r["id"] for r in JsonlFile(spec.outputs["inferred"]).iter_records()]
    assert sorted(ids) == sorted(f"r{i}" for i in range(300))


def test_finished_job_is_not_run_again_by_the_pool_client(tmp_path: Path) -> None:
    layout, s = shard(tmp_path, 20)
    spec = infer_spec(layout, s, "done-1")
    w = start_worker(tmp_path)
    try:
        first = asyncio.run(_run_once(w, spec))
        w2 = start_worker(tmp_path)  # a fresh worker that never saw the job
        try:
            second = asyncio.run(_run_once(w2, spec))
            assert w2.http("GET", "/v1/stats").json()["jobs"] == {}  # answered from the manifest
        finally:
            w2.stop()
    finally:
        w.stop()
    assert first == second


async def _run_once(w: WorkerProcess, spec: JobSpec) -> JobManifest:
    pool = PoolClient([w.url], token=TOKEN, poll_interval_s=0.05)
    try:
        return await pool.run(spec)
    finally:
        await pool.aclose()


def test_sigterm_past_the_drain_timeout_checkpoints_in_place_jobs(tmp_path: Path) -> None:
    layout, s = shard(tmp_path, 40)
    # checkpoints would only be written every 10,000 events or 10 minutes: only the drain flushes
    spec = in_place_spec(
        layout,
        s,
        "drain-1",
        max_attempts=50,
        chunk_size=40,
        checkpoint_every=10_000,
        checkpoint_interval_s=600,
    )
    w = start_worker(
        tmp_path, engine_args={"approval_rate": 0.0, "latency_base_s": 0.05}, extra=["--drain-timeout", "1"]
    )
    w.submit(spec)
    wait_for(lambda: w.status(spec.job_id).counts.outcomes.attempts >= 120)
    assert w.stop(signal.SIGTERM) == 0  # drained: the job is cancelled after 1 s, its state flushed
    state = CheckpointLog(spec.outputs["checkpoints"]).load()
    assert len(state) == 40 and min(v.attempts for v in state.values()) >= 2
    assert not Path(spec.outputs["rejected"]).exists()
