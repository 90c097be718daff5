"""The driver of one lane task (:mod:`airflow_batchinfer.run.lanes`): its pool clients made and
closed, its round read, the lane run (claim, submit, follow: :func:`~airflow_batchinfer.run.lanes.run_lane`)
and what a lane that could not go on tells its task (:class:`LaneEvent`).

One loop, :func:`drive_lane`, for the lane run on the triggerer
(:class:`~airflow_batchinfer.triggers.lane.LaneTrigger`) and in its task
(:class:`~airflow_batchinfer.operators.lanes.ShardLaneOperator` with an ``aws_conn_id``). A round
whose judge has its own pool (``judge_pool``) runs its judge jobs from judge lanes on that pool
(:mod:`~airflow_batchinfer.run.judge_lanes`), as ``batchinfer run`` does
(:mod:`~airflow_batchinfer.run.pipeline`). A lane that ends lowers its run's demand on the pool to
what the round's tail still needs (:mod:`~airflow_batchinfer.run.lane_tail`).
No Airflow here: how the pool is opened is the caller's (``open_pool``)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypedDict, cast

from airflow_batchinfer.exceptions import ConfigError, JobFailed, JobTimeout
from airflow_batchinfer.pools import WorkerPool
from airflow_batchinfer.rpc.models import JobKind, JobSpec, JobStatus
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.judge_lanes import run_judge_lane
from airflow_batchinfer.run.lane_tail import shrink_tail
from airflow_batchinfer.run.lanes import Lane, run_lane
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, read_plan, read_run_config
from airflow_batchinfer.state.docs.lanes import LaneDoc, LaneShard, read_lane
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.location import StorageOptions

Logger = logging.Logger | logging.LoggerAdapter[Any]
OpenPool = Callable[[str], Awaitable[WorkerPool]]
LaneStop = Literal["error", "timeout"]


class LaneEvent(TypedDict):
    """What a lane that could not go on tells its task (the trigger's event payload, the task's
    failure message): ``error`` (no worker took a job, storage unreachable) or ``timeout`` (past the
    task's ``execution_timeout``; its job cancelled)."""

    state: LaneStop
    slot: str
    lane: int
    lanes: int
    shard: str | None
    error: str


class TrackedPoolClient(PoolClient):
    """A pool client that remembers the job it follows (worker URL, job id), so that a killed lane
    can cancel it."""

    current: tuple[str, str] | None = None
    job_timeout_s: float | None = None  # each job's bound (then cancelled, and failed like any)

    @property
    def token(self) -> str | None:
        """The pool's RPC token (to cancel the current job with a client of its own)."""
        return self._token

    async def submit_when_free(
        self, spec: JobSpec, *, deadline: float | None = None, locate: bool = True
    ) -> tuple[str, JobStatus]:
        url, status = await super().submit_when_free(spec, deadline=deadline, locate=locate)
        self.current = (url, spec.job_id)
        return url, status

    async def run(self, spec: JobSpec, **kwargs: Any) -> Any:
        kwargs.setdefault("timeout_s", self.job_timeout_s)
        try:
            manifest = await super().run(spec, **kwargs)
        except JobTimeout as exc:  # cancelled on its worker: retried, then its shard quarantined
            raise JobFailed(spec.job_id, "timeout", str(exc)) from exc
        # Kept after an error or a cancellation: on_kill and a timeout cancel it (an ended job's
        # cancel does nothing), and the next job replaces it.
        self.current = None
        return manifest


def tracked_client(pool: WorkerPool, args: dict[str, Any]) -> TrackedPoolClient:
    """A client over ``pool``'s workers (blocking: the pool lists its workers); ``args`` are
    :class:`PoolClient`'s, and ``job_timeout_s``."""
    args = dict(args)
    timeout = args.pop("job_timeout_s", None)
    client = cast(TrackedPoolClient, TrackedPoolClient.for_pool(pool, **args))
    client.job_timeout_s = timeout
    return client


def lane_round(run_root: str, lane: Lane, so: StorageOptions | None = None) -> tuple[RunConfig, Plan]:
    """The settings and plan the lane's round runs (run.json's, or those a review gave the round)."""
    run = read_run_config(run_root, so)
    plan = read_plan(RunLayout(run.run_root), lane.slot, so)
    if plan is None:
        raise ConfigError(
            f"{run.run_root}: slot {lane.slot} has no plan.json, but its plan task mapped lane {lane.index}. "
            "Remedy: clear that plan task, with its downstream tasks"
        )
    return plan.effective_config(run), plan


def lane_shard(run_root: str, lane: Lane, so: StorageOptions | None = None) -> str | None:
    """The shard the lane was on (running, or about to claim), from its document; ``None`` if none
    or the document cannot be read (a failure message names what it can)."""
    try:
        doc = read_lane(RunLayout(run_root), lane.round, lane.index, so, judge=lane.judge)
    except Exception:  # the store that failed the lane may fail this read too
        return None
    if doc is None:
        return None
    running = [s.shard_id for s in doc.shards if s.state == "running"]
    return running[-1] if running else doc.claiming


def lane_event(
    lane: Lane, shard: str | None, error: BaseException | str, *, state: LaneStop = "error"
) -> LaneEvent:
    """The event of a lane that could not go on."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return LaneEvent(state=state, slot=lane.slot, lane=lane.index, lanes=lane.count, shard=shard, error=text)


def lane_failure_message(event: LaneEvent) -> str:
    """What a failed lane's task says: the lane, the shard it was on, the error and the remedy."""
    where = f"lane {event['lane']} of {event['slot']} ({event['lanes']} lanes)"
    shard = event["shard"]
    on = f" on shard {shard}" if shard else " before taking a shard"
    back = f"takes shard {shard} back first" if shard else "goes on where this try stopped"
    return (
        f"{where} stopped{on}: {event['state']}: {event['error']}. Remedy: check the pool "
        "(`batchinfer pool status`) and the run root's storage; Airflow retries the lane, which "
        f"{back}. Once its retries are spent, the round's close quarantines the shards the lane "
        "left unfinished into failed/, and re-running the DAG run (clear it) runs them."
    )


async def drive_lane(
    lane: Lane,
    run_root: str,
    pool: WorkerPool,
    *,
    so: StorageOptions | None,
    logger: Logger,
    open_pool: OpenPool,
    client_args: dict[str, Any],
    tracked: list[TrackedPoolClient],
) -> LaneDoc:
    """Run ``lane`` on ``pool`` (the run's; a judge lane's: the judge pool) until it ends. Each pool
    client it makes (``client_args``: :func:`tracked_client`'s; a judge with its own pool, opened with
    ``open_pool``, gets one of its own) is added to ``tracked`` at once, so that a killed lane cancels
    the job of each, and closed when the lane ends."""
    client = await asyncio.to_thread(tracked_client, pool, client_args)
    clients = [client]
    tracked.append(client)
    try:
        cfg, plan = await asyncio.to_thread(lane_round, run_root, lane, so)
        client.unreachable_grace_s = cfg.sharding.unreachable_grace_s
        if lane.judge:
            return await run_judge_lane(lane, cfg, plan, client, so=so, logger=logger)
        pools: dict[JobKind, PoolClient] = {}
        for kind in round_kinds(cfg, plan.mode):
            if kind == "judge" and cfg.judging.judge_pool:
                judge_pool = await open_pool(cfg.judging.judge_pool)
                judge = await asyncio.to_thread(tracked_client, judge_pool, client_args)
                clients.append(judge)
                tracked.append(judge)
                pools[kind] = judge
            else:
                pools[kind] = client

        def ended(entry: LaneShard) -> None:
            took = (entry.ended_at or time.time()) - entry.claimed_at
            if entry.state == "done":
                logger.info(
                    "lane %d of %s: shard %s done in %.1f s (%d records)",
                    lane.index,
                    lane.slot,
                    entry.shard_id,
                    took,
                    entry.records,
                )

        doc = await run_lane(lane, cfg, plan, pools, so=so, on_shard=ended, logger=logger)
        lease = client_args.get("lease_id")
        await shrink_tail(pool, lease, client, plan, lane.count, run_root=run_root, so=so, logger=logger)
        return doc
    finally:
        for c in clients:
            await c.aclose()
