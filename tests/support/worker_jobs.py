"""Shard jobs run by the worker's own registry and job code in the test's process (SIMULATED engine),
for tests of what the workers write without an HTTP server."""

from __future__ import annotations

import asyncio
from typing import Any

from airflow_batchinfer.engines import create_engine
from airflow_batchinfer.rpc.fingerprint import pin_input
from airflow_batchinfer.rpc.models import JobKind, JobStatus
from airflow_batchinfer.run.config import RunConfig
from airflow_batchinfer.run.jobs import job_spec, judge_input
from airflow_batchinfer.storage import JsonlFile, ShardDescriptor
from airflow_batchinfer.worker.params import parse_params
from airflow_batchinfer.worker.registry import JobRegistry
from airflow_batchinfer.worker.runtime import Runtime


def run_jobs(
    cfg: RunConfig, jobs: list[tuple[JobKind, int, ShardDescriptor]], **engine: Any
) -> list[JobStatus]:
    """Run ``(kind, round, shard)`` jobs one after the other; each must succeed. ``engine``: the
    SIMULATED engine's options (no latency unless given)."""

    async def main() -> list[JobStatus]:
        engine.setdefault("latency_base_s", 0.0)
        runtime = Runtime(create_engine("simulated", **engine), batch_timeout_s=0.001)
        await runtime.start()
        registry = JobRegistry(runtime, concurrency=4, worker_name="w1")
        out = []
        try:
            for kind, r, shard in jobs:
                src = judge_input(cfg, r, shard) if kind == "judge" else shard
                spec = job_spec(cfg, kind, r, src)
                pinned = pin_input(spec, JsonlFile(spec.input).info())
                registry.submit(pinned, parse_params(kind, pinned.params))
                task = registry.jobs[pinned.job_id].task
                assert task is not None
                await task
                status = registry.status(pinned.job_id)
                assert status is not None and status.state == "succeeded", status
                out.append(status)
        finally:
            await runtime.close()
        return out

    return asyncio.run(main())
