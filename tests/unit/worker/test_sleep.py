"""The worker's engine sleep (``worker.sleep``, ``/v1/sleep``, ``/v1/wake``) in-process: the idle
timer, a job that cancels a pending sleep or wakes the engine, and the routes (SIMULATED engine, no
sockets)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from airflow_batchinfer.engines import GenerationRequest
from airflow_batchinfer.engines.simulated import SimulatedEngine
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.worker.app import create_app
from airflow_batchinfer.worker.config import WorkerConfig
from airflow_batchinfer.worker.runtime import Runtime
from airflow_batchinfer.worker.sleep import EngineSleep

TOKEN = "s" * 32


async def reached(predicate: Callable[[], bool | Awaitable[bool]], timeout_s: float = 30.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        got = predicate()
        if await got if isinstance(got, Awaitable) else got:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


def req(i: int) -> GenerationRequest:
    return GenerationRequest(f"r{i}", prompt=f"q{i}", metadata={"record_id": f"r{i}"})


async def test_a_pending_sleep_waits_for_idle_then_sleeps() -> None:
    engine = SimulatedEngine()
    sleep = EngineSleep(engine)
    busy = True
    sleep.ask(1, 0.0, lambda: None if busy else 0.0)
    await asyncio.sleep(0.3)  # a job runs: more than a poll later it is still awake
    assert sleep.pending and not sleep.sleeping and engine.sleeping is None
    busy = False
    await reached(lambda: sleep.sleeping)
    assert engine.sleeping == 1 and not sleep.pending
    await engine.close()


async def test_a_job_cancels_a_pending_sleep() -> None:
    engine = SimulatedEngine()
    sleep = EngineSleep(engine)
    sleep.ask(2, 3600.0, lambda: 0.0)
    assert sleep.pending
    sleep.job_arrived()
    await asyncio.sleep(0)
    assert not sleep.pending and not sleep.sleeping
    await engine.close()


async def test_a_job_wakes_a_sleeping_engine_and_its_batches_wait_for_it() -> None:
    engine = SimulatedEngine(wake_s=0.05, latency_base_s=0.0)
    runtime = Runtime(engine, batch_timeout_s=0.001)
    await runtime.start()
    try:
        await runtime.sleeper.sleep_now(1)
        assert engine.sleeping == 1
        runtime.sleeper.job_arrived()  # the wake starts at the submit, before any batch
        results = await runtime.generate([req(i) for i in range(5)])  # the batch waits for the wake
        assert all(r.ok for r in results) and engine.sleeping is None
        assert runtime.sleeper.last_woke_s >= 0.05
        await runtime.sleeper.sleep_now(2)
        assert all(r.ok for r in await runtime.generate([req(9)]))  # woken by the batch alone
        assert not runtime.sleeper.sleeping
    finally:
        await runtime.close()


async def test_a_sleep_waits_for_the_batches_in_the_engine() -> None:
    engine = SimulatedEngine(latency_base_s=0.2)
    runtime = Runtime(engine, batch_timeout_s=0.001)
    await runtime.start()
    try:
        running = asyncio.create_task(runtime.generate([req(1)]))
        await reached(lambda: engine.tally.stats().running == 1)
        await runtime.sleeper.sleep_now(1)
        assert engine.tally.stats().running == 0 and runtime.sleeper.sleeping  # the batch ended first
        assert all(r.ok for r in await running)
    finally:
        await runtime.close()


@contextlib.asynccontextmanager
async def worker(tmp_path: Path, **engine: Any) -> AsyncIterator[tuple[httpx.AsyncClient, Runtime]]:
    config = WorkerConfig(token=TOKEN, allowed_prefixes=[str(tmp_path)], drain_timeout_s=0.05)
    runtime = Runtime(SimulatedEngine(latency_base_s=0.0, **engine), batch_timeout_s=0.001)
    app = create_app(config, runtime)
    await runtime.start()  # the ASGI transport does not run the lifespan
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://w", headers=headers) as client:
            yield client, runtime
    finally:
        await runtime.close()


def infer_spec(tmp_path: Path, n: int) -> JobSpec:
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "q": f"{i}"}) + "\n" for i in range(n)))
    return JobSpec(
        job_id="infer-1",
        kind="infer",
        input=str(src),
        outputs={"inferred": str(tmp_path / "out.jsonl.zst"), "manifest": str(tmp_path / "m.json")},
        params={"prompt_template": "{{ q }}"},
    )


async def test_routes_sleep_wake_and_a_job_submitted_asleep(tmp_path: Path) -> None:
    async with worker(tmp_path, wake_s=0.02) as (client, runtime):
        stats = (await client.get("/v1/stats")).json()
        assert stats["sleeping"] is False and stats["sleep_refusal"] is None
        assert "sleep_refusal" not in stats["engine"]  # the engine's description (job ids) is unchanged
        answer = (await client.post("/v1/sleep", json={"level": 1, "after_s": 0})).json()
        assert answer == {"level": 1, "after_s": 0.0, "sleeping": True, "pending": False}
        assert (await client.get("/v1/stats")).json()["sleeping"] is True
        metrics = (await client.get("/metrics")).text
        assert "batchinfer_worker_sleeping 1.0" in metrics and "batchinfer_worker_busy 0.0" in metrics
        assert "# HELP batchinfer_worker_sleeping " in metrics and "# HELP batchinfer_worker_busy " in metrics
        woke = (await client.post("/v1/wake")).json()["woke_s"]
        assert woke >= 0.02 and not runtime.sleeper.sleeping
        assert (await client.post("/v1/wake")).json() == {"woke_s": 0.0}

        await client.post("/v1/sleep", json={"level": 2, "after_s": 0})
        spec = infer_spec(tmp_path, 30)
        assert (await client.post("/v1/jobs", json=spec.model_dump())).status_code == 202

        async def done() -> bool:
            return bool((await client.get(f"/v1/jobs/{spec.job_id}")).json()["state"] == "succeeded")

        await reached(done)
        rows = list(JsonlFile(spec.outputs["inferred"]).iter_records())
        assert sorted(r["id"] for r in rows) == sorted(f"r{i}" for i in range(30))
        assert not (await client.get("/v1/stats")).json()["sleeping"]


async def test_a_pending_sleep_answers_pending_and_a_job_cancels_it(tmp_path: Path) -> None:
    async with worker(tmp_path) as (client, runtime):
        answer = (await client.post("/v1/sleep", json={"level": 1, "after_s": 3600})).json()
        assert answer["pending"] is True and answer["sleeping"] is False
        spec = infer_spec(tmp_path, 3)
        assert (await client.post("/v1/jobs", json=spec.model_dump())).status_code == 202
        assert not runtime.sleeper.pending


async def test_a_refusing_engine_answers_409_with_its_reason(tmp_path: Path) -> None:
    async with worker(tmp_path, enable_sleep_mode=False) as (client, runtime):
        refused = await client.post("/v1/sleep", json={"level": 1, "after_s": 5})
        assert refused.status_code == 409
        body = refused.json()
        assert body["error"] == "sleep_refused" and "without enable_sleep_mode" in body["detail"]
        assert "without enable_sleep_mode" in (await client.get("/v1/stats")).json()["sleep_refusal"]
        assert not runtime.sleeper.pending
        bad = await client.post("/v1/sleep", json={"level": 3})
        assert bad.status_code == 400 and "level" in bad.json()["detail"]


async def test_sleep_and_wake_need_the_token(tmp_path: Path) -> None:
    async with worker(tmp_path) as (client, runtime):
        for path in ("/v1/sleep", "/v1/wake"):
            assert (
                await client.post(path, json={}, headers={"Authorization": "Bearer x"})
            ).status_code == 401
        assert not runtime.sleeper.sleeping
