"""``LaneTrigger``: one lane of a round (:mod:`airflow_batchinfer.run.lanes`) run on the triggerer,
holding no task slot, until no shard of the round is left to take.

Thin and serializable, like :class:`~airflow_batchinfer.triggers.worker_job.WorkerJobTrigger`: the
lane descriptor, the run root, a pool reference (never its token: resolved here through
:func:`~airflow_batchinfer.hooks.pool.aopen_pool`), the run's lease id, poll and lost-grace settings
and a wall-clock deadline. :meth:`LaneTrigger.run` reads ``run.json`` and the slot's plan (in
threads), and awaits :func:`~airflow_batchinfer.run.lanes.run_lane` with its own logger: each shard's
start and end is in the lane's log, since the grid shows one box per lane, not per shard. It ends:

- with :class:`~airflow.triggers.base.TaskSuccessEvent` (the lane's
  :func:`~airflow_batchinfer.run.lanes.lane_result` as its XCom) when no shard is left: the task is
  not resumed on a worker. A shard whose jobs failed ``job_retries`` times is in that result and the
  lane document; the round's close quarantines it;
- with a ``TriggerEvent`` ``{"state": "error" | "timeout", slot, lane, shard, error}`` when the lane
  itself could not go on (no worker took a job, storage unreachable, past the deadline): the task
  resumes, fails with it (:class:`~airflow_batchinfer.operators.lanes.ShardLaneOperator`) and Airflow's
  retries apply; the retry takes the lane's unfinished shard back (its lane document says so).

The trigger reads the run root with plain fsspec (local disk, or S3 with the environment's
credentials) and makes no blocking Airflow connection lookup (apache/airflow#64620, #67380): a run
root behind an ``aws_conn_id`` runs its lanes in the task instead.

A triggerer restart cancels :meth:`run` without a word to the worker: the job runs on, and the
trigger, started again on a triggerer, takes its shard back and follows the running job there. A
user who clears the task or marks it kills the trigger: Airflow 3.3 then calls
:meth:`LaneTrigger.on_kill`, which cancels the job the lane was running. The lane document keeps
that shard ``running``; the lane's next try takes it back and resubmits it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from airflow_batchinfer.exceptions import ConfigError, JobFailed, JobTimeout, RpcError
from airflow_batchinfer.hooks.pool import aopen_pool
from airflow_batchinfer.pools import WorkerPool
from airflow_batchinfer.rpc.client import WorkerClient
from airflow_batchinfer.rpc.models import JobKind, JobSpec, JobStatus
from airflow_batchinfer.rpc.pool import PoolClient
from airflow_batchinfer.run.jobs import round_kinds
from airflow_batchinfer.run.lanes import Lane, lane_result, run_lane
from airflow_batchinfer.state.config import RunConfig
from airflow_batchinfer.state.docs import Plan, read_plan, read_run_config
from airflow_batchinfer.state.docs.lanes import LaneDoc, LaneShard, read_lane
from airflow_batchinfer.state.layout import RunLayout
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.triggers import settle

Logger = logging.Logger | logging.LoggerAdapter[Any]
OpenPool = Callable[[str], Awaitable[WorkerPool]]


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
        doc = read_lane(RunLayout(run_root), lane.round, lane.index, so)
    except Exception:  # the store that failed the lane may fail this read too
        return None
    if doc is None:
        return None
    running = [s.shard_id for s in doc.shards if s.state == "running"]
    return running[-1] if running else doc.claiming


def failure(
    lane: Lane, shard: str | None, error: BaseException | str, *, state: str = "error"
) -> dict[str, Any]:
    """The event payload of a lane that could not go on."""
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    return {
        "state": state,
        "slot": lane.slot,
        "lane": lane.index,
        "lanes": lane.count,
        "shard": shard,
        "error": text,
    }


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
    """Run ``lane`` on ``pool`` (the run's) until no shard is left: the one loop of the trigger and
    of a lane run in its task. Each pool client it makes (``client_args``: :func:`tracked_client`'s;
    a judge with its own pool gets one of its own) is added to ``tracked`` at once, so that a killed
    lane cancels the job of each, and closed when the lane ends."""
    client = await asyncio.to_thread(tracked_client, pool, client_args)
    clients = [client]
    tracked.append(client)
    try:
        cfg, plan = await asyncio.to_thread(lane_round, run_root, lane, so)
        pools: dict[JobKind, PoolClient] = {}
        for kind in round_kinds(cfg, plan.mode):
            if kind == "judge" and cfg.judge_pool:
                judge_pool = await open_pool(cfg.judge_pool)
                judge = await asyncio.to_thread(tracked_client, judge_pool, client_args)
                clients.append(judge)
                tracked.append(judge)
                pools[kind] = judge
            else:
                pools[kind] = client
        client.unreachable_grace_s = cfg.unreachable_grace_s

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

        return await run_lane(lane, cfg, plan, pools, so=so, on_shard=ended, logger=logger)
    finally:
        for c in clients:
            await c.aclose()


class LaneTrigger(BaseTrigger):
    """:param lane: the lane descriptor (:meth:`~airflow_batchinfer.run.lanes.Lane.as_dict`).
    :param run_root: the run's root (read with the environment's credentials).
    :param worker_pool: the run's pool reference (its token is resolved here).
    :param lease_id: the run's lease on the pool (whose workers may run its jobs).
    :param job_timeout_s: each shard job's bound: past it the job is cancelled and counts as failed
        (retried ``job_retries`` times, then its shard is quarantined and the lane goes on).
    :param deadline: wall clock (the task's ``execution_timeout``): past it the lane's job is
        cancelled and the task fails.
    :param not_before: no event before this (wall clock; see
        :data:`~airflow_batchinfer.triggers.SETTLE_S`)."""

    def __init__(
        self,
        *,
        lane: dict[str, Any],
        run_root: str,
        worker_pool: str,
        lease_id: str | None = None,
        poll_interval_s: float = 2.0,
        lost_grace_s: float = 30.0,
        max_resubmits: int = 5,
        job_timeout_s: float | None = None,
        deadline: float | None = None,
        not_before: float | None = None,
    ) -> None:
        super().__init__()
        self.lane = dict(lane)
        self.run_root = run_root
        self.worker_pool = worker_pool
        self.lease_id = lease_id
        self.poll_interval_s = poll_interval_s
        self.lost_grace_s = lost_grace_s
        self.max_resubmits = max_resubmits
        self.job_timeout_s = job_timeout_s
        self.deadline = deadline
        self.not_before = not_before
        self._clients: list[TrackedPoolClient] = []  # the run's pool's, and a judge pool's

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_batchinfer.triggers.lane.LaneTrigger",
            {
                "lane": self.lane,
                "run_root": self.run_root,
                "worker_pool": self.worker_pool,
                "lease_id": self.lease_id,
                "poll_interval_s": self.poll_interval_s,
                "lost_grace_s": self.lost_grace_s,
                "max_resubmits": self.max_resubmits,
                "job_timeout_s": self.job_timeout_s,
                "deadline": self.deadline,
                "not_before": self.not_before,
            },
        )

    def client_args(self) -> dict[str, Any]:
        return {
            "lease_id": self.lease_id,
            "poll_interval_s": self.poll_interval_s,
            "lost_grace_s": self.lost_grace_s,
            "max_resubmits": self.max_resubmits,
            "job_timeout_s": self.job_timeout_s,
        }

    async def run(self) -> AsyncIterator[TriggerEvent]:
        lane = Lane.of(self.lane)
        payload: dict[str, Any]
        limit = None if self.deadline is None else max(self.deadline - time.time(), 0.0)
        window = asyncio.timeout(limit)
        try:
            async with window:
                pool = await aopen_pool(self.worker_pool)
                doc = await drive_lane(
                    lane,
                    self.run_root,
                    pool,
                    so=None,
                    logger=cast(Logger, self.log),  # stdlib-style: %-args
                    open_pool=aopen_pool,
                    client_args=self.client_args(),
                    tracked=self._clients,
                )
        except Exception as exc:  # the lane could not go on: the resumed task fails with it (retries)
            shard = await asyncio.to_thread(lane_shard, self.run_root, lane)
            if window.expired():
                await self._cancel("past the task's deadline")
                payload = failure(
                    lane,
                    shard,
                    "past the task's deadline (execution_timeout); job cancelled",
                    state="timeout",
                )
            else:
                self.log.error("lane %d of %s stopped on shard %s: %s", lane.index, lane.slot, shard, exc)
                payload = failure(lane, shard, exc)
            await settle(self.not_before)
            yield TriggerEvent(payload)
            return
        await settle(self.not_before)
        yield TaskSuccessEvent(xcoms={"return_value": lane_result(doc)})

    async def _cancel(self, why: str) -> None:
        """Cancel the jobs the lane was following (best effort: a retry finds and follows them anyway)."""
        for client in self._clients:
            if client.current is None:
                continue
            url, job_id = client.current
            try:
                async with WorkerClient(url, token=client.token, timeout=10) as worker:
                    status = await worker.cancel(job_id)
                self.log.info("job %s on %s cancelled (%s): %s", job_id, url, why, status.state)
            except RpcError as exc:
                self.log.warning("could not cancel job %s on %s: %s", job_id, url, exc)

    async def on_kill(self) -> None:
        """The task was cleared or marked by a user: the lane's job must not run on (Airflow 3.3+)."""
        await self._cancel("task killed by a user")
