"""``batchinfer run``: the whole round pipeline on a worker pool, without Airflow.

The same steps the DAG runs, in one process: shard, then per round slot propose a plan, run its
jobs (infer → judge, or in place), close the round; then the report. The decisions and files are
those of :mod:`airflow_batchinfer.rounds`, so a run started here can be resumed by a DAG run pointed
at the same run root and the other way round. Human review needs Airflow (its Required Actions
page); here ``review`` must be ``never``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from airflow_batchinfer.exceptions import ConfigError, JobFailed
from airflow_batchinfer.layout import RunLayout
from airflow_batchinfer.report import build_report
from airflow_batchinfer.rounds import (
    Plan,
    close_round,
    inferred_shard,
    job_spec,
    prepare_run,
    propose,
    record_job_error,
    slots,
    write_plan,
)
from airflow_batchinfer.rpc.models import JobKind
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run_config import RunConfig
from airflow_batchinfer.storage import ShardDescriptor

Progress = Callable[[str, int, int], None]  # (phase, records done, records total)


async def _run_jobs(
    pool: PoolClient,
    cfg: RunConfig,
    kind: JobKind,
    r: int,
    shards: list[ShardDescriptor],
    progress: Progress | None,
) -> list[ShardDescriptor]:
    """Run one job per shard; a failing job is retried ``job_retries`` times, then left for
    ``close_round`` to quarantine. Returns the shards whose job finished."""
    done_records = 0
    total = sum(s["records"] for s in shards)

    async def one(shard: ShardDescriptor) -> ShardDescriptor | None:
        nonlocal done_records
        spec = job_spec(cfg, kind, r, shard)
        for _ in range(cfg.job_retries + 1):
            try:
                await pool.run(spec)
            except JobFailed as exc:
                await asyncio.to_thread(record_job_error, cfg, r, shard["shard_id"], kind, str(exc), None)
                continue
            done_records += shard["records"]
            if progress:
                progress(f"round {r} {kind}", done_records, total)
            return shard
        return None

    return [s for s in await asyncio.gather(*(one(s) for s in shards)) if s is not None]


async def run_pipeline(
    cfg: RunConfig, pool: PoolClient, *, progress: Progress | None = None
) -> dict[str, Any]:
    if cfg.review != "never":
        raise ConfigError("review between rounds needs Airflow (the Required Actions page); use review=never")
    await asyncio.to_thread(prepare_run, cfg)
    for slot in slots(cfg.max_rounds):
        plan: Plan = (await asyncio.to_thread(propose, cfg, slot)).plan
        if plan.mode != "skip":
            plan.engine = await pool.engine()
        await asyncio.to_thread(write_plan, RunLayout(cfg.run_root), plan)
        if plan.mode == "rounds":
            inferred = await _run_jobs(pool, cfg, "infer", plan.round, plan.shards, progress)
            judge_in = [inferred_shard(cfg, plan.round, s) for s in inferred]
            await _run_jobs(pool, cfg, "judge", plan.round, judge_in, progress)
        elif plan.mode == "in_place":
            await _run_jobs(pool, cfg, "in_place", plan.round, plan.shards, progress)
        await asyncio.to_thread(close_round, cfg, plan)
    return await asyncio.to_thread(build_report, cfg)
