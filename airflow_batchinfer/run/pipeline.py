"""``batchinfer run``: the whole round pipeline on a worker pool, without Airflow.

The same steps the DAG runs, in one process: shard, then per round slot propose a plan, run its
jobs (infer_judge, infer → judge on the judge's own pool, or in place) by lanes
(:mod:`airflow_batchinfer.run.lanes`: one per pool slot unless ``lanes`` says, each taking the next
unclaimed shard; as lanes end, the run's lease gives back the replicas the tail no longer needs,
and the next round takes them back: :mod:`~airflow_batchinfer.run.lane_tail`), close the round;
then the report. The decisions and files are
those of :mod:`airflow_batchinfer.run`, so a run started here can be resumed by a DAG run pointed
at the same run root and the other way round. Human review needs Airflow (its Required Actions
page); here ``review`` must be ``never``, and a person may not judge (``{"type": "human"}``,
``review_below_score``, ``spot_check_approved``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import ConfigError, RpcError, WorkerUnavailable
from airflow_batchinfer.pools import WorkerPool
from airflow_batchinfer.rpc.models import JobKind
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.close import close_round
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.judge_lanes import run_judge_lane
from airflow_batchinfer.run.lane_tail import shrink_tail, take_back
from airflow_batchinfer.run.lanes import Lane, clear_claims, judged_apart, lane_count, run_lane
from airflow_batchinfer.run.plan import propose_slot
from airflow_batchinfer.run.prepare import prepare_run
from airflow_batchinfer.run.report.build import build_report
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, slots, write_plan
from airflow_batchinfer.state.docs.lanes import LaneDoc, LaneShard
from airflow_batchinfer.state.layout import RunLayout

Progress = Callable[[str, int, int], None]  # (phase, records done, records total)
TAKE_BACK_WAIT_S = 600.0  # how long a round waits for the replicas it takes back (model loads)


async def pool_slots(pool: PoolClient) -> int:
    """The pool's job slots: the sum of its answering workers' ``slots_total`` (``/v1/stats``, each
    worker's ``--concurrency``); asked once per round, since a pool may grow or shrink between (a
    tail gives workers back, the next round takes them again): the workers are looked up afresh."""
    await pool.refresh(force=True)
    total = 0
    for client in pool.clients.values():
        try:
            total += (await client.stats()).slots_total
        except RpcError:
            continue  # a worker that does not answer now takes no job now
    if total < 1:
        raise WorkerUnavailable(
            f"no worker of the pool answers /v1/stats ({', '.join(pool.clients) or 'no workers'}): "
            "start the pool (batchinfer pool up) or check its workers, or set --lanes"
        )
    return total


async def input_lanes(cfg: RunConfig, pool: PoolClient) -> int:
    """Round 0's lanes, for which the input's last shards taper: ``lanes`` as the round runs them
    (the pool is not asked), or with ``lanes`` 0 one per slot of the pool; 0 (no taper) when no
    worker answers yet: its first round says why."""
    if cfg.sharding.lanes:
        return cfg.sharding.lanes
    try:
        return await pool_slots(pool)
    except RpcError:
        return 0


@dataclass(frozen=True)
class RunLease:
    """The run's pool and its lease on it: each round takes its replicas back, each lane that ends
    gives back what the round's tail no longer needs (:mod:`~airflow_batchinfer.run.lane_tail`)."""

    pool: WorkerPool
    lease_id: str

    async def take_back(self, run_root: str, timeout_s: float = TAKE_BACK_WAIT_S) -> None:
        """The replicas back for a round about to run, waited for (bounded) so that a round with one
        lane per pool slot counts them: a worker still starting after that joins as it can."""
        target = await asyncio.to_thread(take_back, self.pool, self.lease_id, run_root=run_root)
        deadline = time.monotonic() + timeout_s
        while len(await asyncio.to_thread(self.pool.endpoints, self.lease_id)) < target:
            if time.monotonic() > deadline:
                return
            await asyncio.sleep(0.5)


async def _run_round(
    pools: dict[JobKind, PoolClient],
    cfg: RunConfig,
    plan: Plan,
    progress: Progress | None,
    lease: RunLease | None = None,
) -> None:
    """The round's shards by :func:`~airflow_batchinfer.run.lanes.lane_count` lanes
    (:func:`~airflow_batchinfer.run.lanes.run_lane`), as the DAG's lane tasks run them: each lane
    takes the next unclaimed shard until none is left, so at most ``lanes`` shard jobs are in flight;
    a judge on its own pool judges from judge lanes (one per slot of that pool) as soon as each shard's
    inference ends (:mod:`~airflow_batchinfer.run.judge_lanes`)."""
    if not plan.shards:
        return
    run_cfg = plan.effective_config(cfg)
    requested = run_cfg.sharding.lanes
    slots_ = requested or await pool_slots(pools["infer"])  # lanes=0: one per slot of the run's pool
    count = lane_count(requested, slots_, len(plan.shards))
    done_records = 0
    phase = f"round {plan.round} {'+'.join(round_kinds(run_cfg, plan.mode))}"

    def on_shard(entry: LaneShard) -> None:
        nonlocal done_records
        if entry.state == "done":  # a failed shard is quarantined by the close, not counted done
            done_records += entry.records
            if progress:
                progress(phase, done_records, plan.records)

    async def lane(i: int) -> LaneDoc:
        doc = await run_lane(Lane(plan.slot, plan.round, i, count), run_cfg, plan, pools, on_shard=on_shard)
        if lease is not None:  # the round's tail gives back what it no longer needs
            await shrink_tail(lease.pool, lease.lease_id, pools["infer"], plan, count, run_root=cfg.run_root)
        return doc

    lanes = [lane(i) for i in range(count)]
    if judged_apart(run_cfg, plan):  # judge lanes beside them, one per slot of the judge pool
        judges = lane_count(0, await pool_slots(pools["judge"]), len(plan.shards))
        lanes += [
            run_judge_lane(Lane(plan.slot, plan.round, i, judges, "judge"), run_cfg, plan, pools["judge"])
            for i in range(judges)
        ]
    await asyncio.gather(*lanes)


async def run_pipeline(
    cfg: RunConfig,
    pool: PoolClient,
    *,
    judge_pool: PoolClient | None = None,
    progress: Progress | None = None,
    lease: RunLease | None = None,
) -> dict[str, Any]:
    """Run ``cfg`` on ``pool``; ``judge_pool`` serves ``cfg.judging.judge_pool``'s judge jobs;
    ``lease``: the run's pool and lease, whose replicas follow each round's tail."""
    if cfg.reviews.review != "never" or cfg.human_review:
        raise ConfigError(
            "review between rounds, a human judge, review_below_score and spot_check_approved need Airflow "
            "(the review gate and "
            "the review page); here use review=never and an automated judge"
        )
    if bool(cfg.judging.judge_pool) != (judge_pool is not None):
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
    lanes = await input_lanes(cfg, pool)  # a silent pool: no taper; prepare_run tells bad settings
    sharded = await asyncio.to_thread(lambda: prepare_run(cfg, lanes=lanes))
    cfg = cfg.replace(id_field=sharded.id_field)  # as run.json stores it
    for slot in slots(cfg.retries.max_rounds):
        plan: Plan = (await asyncio.to_thread(propose_slot, cfg, slot)).plan
        if plan.mode != "skip":
            plan.engine = await pool.engine()
            if judge_pool is not None:
                plan.judge_engine = await judge_pool.engine()
            if refusal := cfg.pools_refusal(plan.engine, plan.judge_engine):
                raise ConfigError(f"bad run settings: {refusal}")
        layout = RunLayout(cfg.run_root)
        await asyncio.to_thread(write_plan, layout, plan)
        if plan.mode != "skip":
            # a re-proposed round's lanes start from its new shard list, not the last attempt's claims
            await asyncio.to_thread(clear_claims, layout, plan.round)
            if lease is not None:
                await lease.take_back(cfg.run_root)
            await _run_round(pools, cfg, plan, progress, lease)
        await asyncio.to_thread(close_round, cfg, plan)
    return await asyncio.to_thread(build_report, cfg)
