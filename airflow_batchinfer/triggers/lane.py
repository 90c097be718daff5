"""``LaneTrigger``: one lane of a round (:mod:`airflow_batchinfer.run.lanes`) run on the triggerer,
holding no task slot, until no shard of the round is left to take.

Thin and serializable: the lane descriptor, the run root, a pool reference (never its token:
resolved here through :func:`~airflow_batchinfer.hooks.pool.aopen_pool`), the run's lease id, poll
and lost-grace settings and a wall-clock deadline. It only drives and reports:
:meth:`LaneTrigger.run` awaits the lane's driver, :func:`~airflow_batchinfer.run.lane_driver.drive_lane`
(claim, submit, follow; a judge on its own pool included), with its own logger: each shard's start
and end is in the lane's log, since the grid shows one box per lane, not per shard. It ends:

- with :class:`~airflow.triggers.base.TaskSuccessEvent` (the lane's
  :func:`~airflow_batchinfer.run.lanes.lane_result` as its XCom) when no shard is left: the task is
  not resumed on a worker. A shard whose jobs failed ``job_retries`` times is in that result and the
  lane document; the round's close quarantines it;
- with a ``TriggerEvent`` whose payload is a
  :class:`~airflow_batchinfer.run.lane_driver.LaneEvent` (``state``: ``error`` or ``timeout``) when the lane
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
import time
from collections.abc import AsyncIterator
from typing import Any, cast

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from airflow_batchinfer.exceptions import RpcError
from airflow_batchinfer.hooks.pool import aopen_pool
from airflow_batchinfer.rpc.client import WorkerClient
from airflow_batchinfer.run.lane_driver import (
    LaneEvent,
    Logger,
    TrackedPoolClient,
    drive_lane,
    lane_event,
    lane_shard,
)
from airflow_batchinfer.run.lanes import Lane, lane_result
from airflow_batchinfer.triggers import settle


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
        event: LaneEvent
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
                event = lane_event(
                    lane,
                    shard,
                    "past the task's deadline (execution_timeout); job cancelled",
                    state="timeout",
                )
            else:
                self.log.error("lane %d of %s stopped on shard %s: %s", lane.index, lane.slot, shard, exc)
                event = lane_event(lane, shard, exc)
            await settle(self.not_before)
            yield TriggerEvent(dict(event))
            return
        await settle(self.not_before)
        result: Any = lane_result(doc)  # JSON values, which a TypedDict does not say to mypy
        yield TaskSuccessEvent(xcoms={"return_value": result})

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
