"""``batchinfer run``: the whole round pipeline on a worker pool, without Airflow.

The same steps the DAG runs, in one process: shard, then per round slot propose a plan, run its
jobs (infer_judge, infer → judge on the judge's own pool, or in place), close the round; then the
report. The decisions and files are
those of :mod:`airflow_batchinfer.run`, so a run started here can be resumed by a DAG run pointed
at the same run root and the other way round. Human review needs Airflow (its Required Actions
page); here ``review`` must be ``never``, and a person may not judge (``{"type": "human"}``,
``review_below_score``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from airflow_batchinfer.exceptions import ConfigError, JobFailed
from airflow_batchinfer.report import build_report
from airflow_batchinfer.rpc.models import JobKind
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.config import RunConfig
from airflow_batchinfer.run.docs import Plan, slots, write_plan
from airflow_batchinfer.run.jobs import job_spec, judge_input, record_job_error, round_kinds
from airflow_batchinfer.run.layout import RunLayout
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.storage import ShardDescriptor

Progress = Callable[[str, int, int], None]  # (phase, records done, records total)


async def _run_job(pool: PoolClient, cfg: RunConfig, kind: JobKind, r: int, shard: ShardDescriptor) -> bool:
    """Run one shard's job; a failing job is retried ``job_retries`` times, then left for
    ``close_round`` to quarantine. Returns whether it finished."""
    spec = job_spec(cfg, kind, r, shard)
    for _ in range(cfg.job_retries + 1):
        try:
            await pool.run(spec)
        except JobFailed as exc:
            await asyncio.to_thread(record_job_error, cfg, r, shard["shard_id"], kind, str(exc), None)
            continue
        return True
    return False


async def _run_round(
    pools: dict[JobKind, PoolClient],
    cfg: RunConfig,
    plan: Plan,
    progress: Progress | None,
) -> None:
    """Every shard's jobs (:func:`~airflow_batchinfer.run.jobs.round_kinds`), shard by shard: a shard's
    judge (on the judge's own pool) starts as soon as its own inference ends."""
    kinds = round_kinds(cfg, plan.mode)
    done_records = 0
    phase = f"round {plan.round} {'+'.join(kinds)}"

    async def one(shard: ShardDescriptor) -> None:
        nonlocal done_records
        for kind in kinds:
            job_input = (
                await asyncio.to_thread(judge_input, cfg, plan.round, shard) if kind == "judge" else shard
            )  # the infer attempt its manifest names (a late copy's is never read)
            if not await _run_job(pools[kind], cfg, kind, plan.round, job_input):
                return
        done_records += shard["records"]
        if progress:
            progress(phase, done_records, plan.records)

    await asyncio.gather(*(one(s) for s in plan.shards))


async def run_pipeline(
    cfg: RunConfig,
    pool: PoolClient,
    *,
    judge_pool: PoolClient | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` on ``pool``; ``judge_pool`` serves ``cfg.judge_pool``'s judge jobs."""
    if cfg.review != "never" or cfg.human_review:
        raise ConfigError(
            "review between rounds, a human judge and review_below_score need Airflow (the review gate and "
            "the review page); here use review=never and an automated judge"
        )
    if bool(cfg.judge_pool) != (judge_pool is not None):
        raise ConfigError(
            "judge_pool is set in the run's settings but no judge pool client was given, "
            "or the other way round"
        )
    pools: dict[JobKind, PoolClient] = {
        "infer": pool,
        "infer_judge": pool,
        "in_place": pool,
        "judge": judge_pool or pool,
    }
    await asyncio.to_thread(prepare_run, cfg)
    for slot in slots(cfg.max_rounds):
        plan: Plan = (await asyncio.to_thread(propose_slot, cfg, slot)).plan
        if plan.mode != "skip":
            plan.engine = await pool.engine()
            if judge_pool is not None:
                plan.judge_engine = await judge_pool.engine()
        await asyncio.to_thread(write_plan, RunLayout(cfg.run_root), plan)
        if plan.mode != "skip":
            await _run_round(pools, cfg, plan, progress)
        await asyncio.to_thread(close_round, cfg, plan)
    return await asyncio.to_thread(build_report, cfg)
