"""The worker's job registry and app in-process (SIMULATED engine, no sockets): attempt tokens and
staged outputs, drain vs. cancel, and the prefix check on the staging URI."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.rpc.models import JobSpec
from airflow_batchinfer.state.docs import JobManifest, read_job_manifest
from airflow_batchinfer.state.layout import RunLayout, staged_name, staged_output
from airflow_batchinfer.state.params import parse_params
from airflow_batchinfer.storage import JsonlFile, shard_dataset
from airflow_batchinfer.storage.shard_ref import ShardRef
from airflow_batchinfer.worker.app import create_app
from airflow_batchinfer.worker.config import WorkerConfig
from airflow_batchinfer.worker.registry import DRAINED, JobRegistry
from airflow_batchinfer.worker.runtime import Runtime

TOKEN = "t" * 32


def shard(tmp_path: Path, n: int = 20) -> tuple[RunLayout, ShardRef]:
    src = tmp_path / "data.jsonl"
    src.write_text("".join(json.dumps({"id": f"r{i}", "q": f"{i}"}) + "\n" for i in range(n)))
    layout = RunLayout(str(tmp_path / "run"))
    return layout, shard_dataset(str(src), layout.input).shards[0]


def in_place_spec(layout: RunLayout, s: ShardRef, *, staging: bool = True, **params: Any) -> JobSpec:
    sid = s.shard_id
    outputs = {
        "approved": layout.result(0, sid, tail=True),
        "rejected": layout.rejected(0, sid),
        "checkpoints": layout.checkpoints(0, sid),
        "manifest": layout.job_manifest(0, sid, "in_place"),
    }
    if staging:
        outputs["staging"] = layout.staging(0)
    return JobSpec(
        job_id=f"inplace-{sid}",
        kind="in_place",
        input=s.uri,
        outputs=outputs,
        params={"prompt_template": "{{ q }}", "judge": {"type": "llm"}, "chunk_size": 20, **params},
    )


def with_runtime(body: Callable[[Runtime], Awaitable[Any]], **engine: Any) -> Any:
    async def main() -> Any:
        runtime = Runtime(create_engine("simulated", **engine), batch_timeout_s=0.001)
        await runtime.start()
        try:
            return await body(runtime)
        finally:
            await runtime.close()

    return asyncio.run(main())


async def until(predicate: Callable[[], Awaitable[bool]], timeout_s: float = 30.0) -> None:
    for _ in range(int(timeout_s / 0.01)):
        if await predicate():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def finish(registry: JobRegistry, spec: JobSpec) -> None:
    registry.submit(spec, parse_params(spec.kind, spec.params))
    task = registry.jobs[spec.job_id].task
    assert task is not None
    await task


def test_staged_paths_stay_inside_the_staging_uri() -> None:
    assert staged_name("s3://b/run/round-00/jobs/part-00003.judge.json") == "part-00003.judge"
    assert staged_name("s3://b/run/jobs/..") == "job" and staged_name("/x/../a b.json") == "a_b"
    assert (
        staged_output(
            "s3://b/run/round-01/staged",
            "s3://b/run/round-01/jobs/part-00003.in_place.json",
            "tok",
            "rejected",
        )
        == "s3://b/run/round-01/staged/part-00003.in_place/tok/rejected.jsonl.zst"
    )
    layout = RunLayout("s3://b/run")
    assert layout.staged_job(1, "part-00003", "judge") == "s3://b/run/round-01/staged/part-00003.judge"
    assert (
        layout.accepted(1, "part-00003", "judge") == "s3://b/run/round-01/jobs/part-00003.judge.accepted.json"
    )


def test_each_attempt_writes_its_own_staged_outputs(tmp_path: Path) -> None:
    layout, s = shard(tmp_path)
    spec = in_place_spec(layout, s, max_attempts=2)

    async def body(runtime: Runtime) -> list[JobManifest]:
        registry = JobRegistry(runtime, concurrency=2, worker_name="w")
        manifests = []
        for _ in range(2):  # the same job started twice (here: one after the other on one worker)
            await finish(registry, spec)
            m = read_job_manifest(spec.outputs["manifest"])
            assert m is not None
            manifests.append(m)
            registry.jobs[spec.job_id].state = "failed"  # let it be submitted again
        return manifests

    first, second = with_runtime(body, latency_base_s=0.0)
    assert first.attempt != second.attempt and first.job_id == second.job_id
    for m in (first, second):
        assert m.attempt is not None and m.committed is not None
        root = Path(layout.staged_job(0, s.shard_id, "in_place"), m.attempt)
        assert m.committed == {n: str(root / f"{n}.jsonl.zst") for n in ("approved", "rejected")}
        assert m.outputs == spec.outputs
        rows = [r["id"] for uri in m.committed.values() for r in JsonlFile(uri).iter_records()]
        assert sorted(rows) == sorted(f"r{i}" for i in range(20))
    assert not Path(spec.outputs["approved"]).exists() and not Path(spec.outputs["rejected"]).exists()


def test_without_staging_outputs_are_written_in_place(tmp_path: Path) -> None:
    layout, s = shard(tmp_path)
    spec = in_place_spec(layout, s, staging=False, max_attempts=2)

    async def body(runtime: Runtime) -> None:
        await finish(JobRegistry(runtime, concurrency=1), spec)

    with_runtime(body, latency_base_s=0.0)
    m = read_job_manifest(spec.outputs["manifest"])
    assert m is not None and m.committed is None and m.attempt is not None and len(m.attempt) == 32
    assert "committed" not in json.loads(Path(spec.outputs["manifest"]).read_text())
    assert Path(spec.outputs["approved"]).exists() and Path(spec.outputs["rejected"]).exists()


def test_drain_cancels_as_retryable_and_delete_does_not(tmp_path: Path) -> None:
    layout, s = shard(tmp_path, 10)
    slow = in_place_spec(layout, s, max_attempts=10_000)  # approval_rate 0: runs until cancelled
    other = slow.model_copy(update={"job_id": "other"})

    async def body(runtime: Runtime) -> tuple[Any, Any]:
        registry = JobRegistry(runtime, concurrency=2)
        for spec in (slow, other):
            registry.submit(spec, parse_params(spec.kind, spec.params))

        async def started() -> bool:
            return registry.jobs[slow.job_id].ctx.tally.outcomes.attempts >= 20

        await until(started)
        registry.cancel(other.job_id)
        await asyncio.sleep(0.05)
        await registry.drain(0.05)
        return registry.status(slow.job_id), registry.status(other.job_id)

    drained, deleted = with_runtime(body, approval_rate=0.0, latency_base_s=0.002)
    assert (drained.state, drained.retryable, drained.error) == ("cancelled", True, DRAINED)
    assert DRAINED == "cancelled: the worker is draining (shutting down); resubmit elsewhere"
    assert (deleted.state, deleted.retryable, deleted.error) == ("cancelled", False, "cancelled")


@contextlib.asynccontextmanager
async def app_client(tmp_path: Path, **engine: Any) -> AsyncIterator[tuple[httpx.AsyncClient, Any]]:
    config = WorkerConfig(token=TOKEN, allowed_prefixes=[str(tmp_path / "run")], drain_timeout_s=0.05)
    runtime = Runtime(create_engine("simulated", **engine), batch_timeout_s=0.001)
    app = create_app(config, runtime)
    await runtime.start()  # the ASGI transport does not run the lifespan
    transport = httpx.ASGITransport(app=app)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://worker", headers=headers) as c:
            yield c, app
    finally:
        await runtime.close()


def test_http_status_of_a_drained_job_is_retryable(tmp_path: Path) -> None:
    layout, s = shard(tmp_path, 10)
    spec = in_place_spec(layout, s, max_attempts=10_000)

    async def main() -> dict[str, Any]:
        async with app_client(tmp_path, approval_rate=0.0, latency_base_s=0.002) as (client, app):
            assert (await client.post("/v1/jobs", json=spec.model_dump())).status_code == 202

            async def started() -> bool:
                status = (await client.get(f"/v1/jobs/{spec.job_id}")).json()
                return bool(status["counts"].get("outcomes", {}).get("attempts", 0) >= 20)

            await until(started)
            await app.state.registry.drain(0.05)
            refused = await client.post(
                "/v1/jobs", json=spec.model_copy(update={"job_id": "late"}).model_dump()
            )
            assert refused.status_code == 503
            return dict((await client.get(f"/v1/jobs/{spec.job_id}")).json())

    status = asyncio.run(main())
    assert status["state"] == "cancelled" and status["retryable"] is True and status["error"] == DRAINED


def test_http_staging_outside_the_allowed_prefixes_is_refused(tmp_path: Path) -> None:
    layout, s = shard(tmp_path, 10)
    spec = in_place_spec(layout, s)
    outside = spec.model_copy(update={"outputs": {**spec.outputs, "staging": str(tmp_path / "elsewhere")}})

    async def main() -> httpx.Response:
        async with app_client(tmp_path) as (client, _):
            return await client.post("/v1/jobs", json=outside.model_dump())

    r = asyncio.run(main())
    assert r.status_code == 403 and "elsewhere" in r.json()["detail"]
    assert not (tmp_path / "elsewhere").exists()


def test_a_succeeded_job_runs_again_once_its_manifest_is_gone(tmp_path: Path) -> None:
    """A close that found a shard's outputs gone deletes its manifest so a re-run recomputes it: the
    warm worker that remembers the job as succeeded must run it again, not answer from memory."""
    layout, s = shard(tmp_path, 10)
    spec = in_place_spec(layout, s, max_attempts=2)

    async def main() -> list[int]:
        async with app_client(tmp_path, latency_base_s=0.001) as (client, _):
            codes = []
            for _ in range(3):
                codes.append((await client.post("/v1/jobs", json=spec.model_dump())).status_code)

                async def done() -> bool:
                    return bool((await client.get(f"/v1/jobs/{spec.job_id}")).json()["state"] == "succeeded")

                await until(done)
                if len(codes) == 2:
                    os.remove(spec.outputs["manifest"])
            return codes

    # new, known (manifest there: answered from memory), new again (manifest gone)
    assert asyncio.run(main()) == [202, 200, 202]
    assert read_job_manifest(spec.outputs["manifest"]) is not None


def test_a_job_whose_tidying_fails_after_its_manifest_still_succeeds(
    tmp_path: Path, monkeypatch: Any
) -> None:
    """Deleting checkpoints or segments comes after the manifest, which completes the job: a
    failure there is logged, and the job is not reported failed (nor retried by the operator)."""
    from airflow_batchinfer.worker.checkpoints import CheckpointLog

    def refuse(self: CheckpointLog) -> None:
        raise OSError(13, "Permission denied", "checkpoints")

    monkeypatch.setattr(CheckpointLog, "clear", refuse)
    layout, s = shard(tmp_path)
    spec = in_place_spec(layout, s, max_attempts=2)

    async def body(runtime: Runtime) -> str:
        registry = JobRegistry(runtime, concurrency=1)
        await finish(registry, spec)
        return registry.jobs[spec.job_id].state

    assert with_runtime(body, latency_base_s=0.0) == "succeeded"
    assert read_job_manifest(spec.outputs["manifest"]) is not None
