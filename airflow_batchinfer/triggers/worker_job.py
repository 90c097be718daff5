"""``WorkerJobTrigger``: waits for one shard job on a worker, on the triggerer, holding no task slot.

Thin and serializable: a pool reference (never its token), a worker URL, a job id, a wall-clock
deadline. It polls the job's status (every ``poll_interval_s``; a second or more, so a small model
on a busy worker does not lose time to the polling) through the shared job tracker
(:func:`airflow_batchinfer.rpc.pool.follow`) and ends with one
:class:`~airflow_batchinfer.rpc.tracking.JobEvent`, as a dict:

- ``succeeded``, ``failed`` or ``cancelled`` as the worker reports it;
- ``lost`` when the worker no longer knows the job (it restarted), has not answered for
  ``lost_grace_s``, or gave the job up while draining: the operator then consults the completion
  manifest and resubmits if needed;
- ``timeout`` past the deadline (the operator cancels the job).

Given ``result`` (the task's return value, its ``counts`` filled in here) and ``manifest`` (the job's
completion manifest), a job the worker reports succeeded ends its task here, on the triggerer
(:class:`~airflow.triggers.base.TaskSuccessEvent`, the counts the manifest records), once
:func:`~airflow_batchinfer.rpc.tracking.after_event` (the task's own decision) finds the manifest
says so: the task is not resumed on an Airflow worker just to return a small dict. That saves a
task start per shard (a process, a DAG parse and a few API calls: about a second of the run's wall
time on its last shard, and CPU on every one). Every other end, a success whose manifest is missing
or unreadable here included, resumes the task, which decides with the same function.

The trigger makes no Airflow connection lookup for the manifest: a blocking one (``BaseHook``,
``AwsBaseHook``) from a triggerer thread breaks the triggerer's channel to its supervisor on Airflow
3.1/3.2 (apache/airflow#64620, #67380). With an ``aws_conn_id`` the manifest is the resumed task's
to read; without one (local files, S3 with the environment's credentials) it is read here.

A user who clears the deferred task or marks it failed or succeeded kills the trigger: Airflow 3.3
calls :meth:`WorkerJobTrigger.on_kill`, which cancels the job on its worker (a triggerer restart
does not: the trigger carries on in the new triggerer).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TaskSuccessEvent, TriggerEvent

from airflow_batchinfer.exceptions import RpcError
from airflow_batchinfer.hooks.pool import aopen_pool
from airflow_batchinfer.rpc.client import WorkerClient
from airflow_batchinfer.rpc.models import JobStatus
from airflow_batchinfer.rpc.pool import follow
from airflow_batchinfer.rpc.tracking import JobEvent, after_event
from airflow_batchinfer.state.docs import JobManifest, read_job_manifest
from airflow_batchinfer.triggers import settle

PROGRESS_LOG_S = 30.0


class WorkerJobTrigger(BaseTrigger):
    """:param result: the task's return value, for a success that ends the task here.
    :param manifest: the job's completion manifest (its URI), which must be there for that; without
        it every end resumes the task.
    :param aws_conn_id: the task's AWS connection for its run root: with one, every end resumes the
        task, which reads the manifest with it (the trigger looks no connection up)."""

    def __init__(
        self,
        *,
        worker_pool: str,
        url: str,
        job_id: str,
        deadline: float | None = None,
        poll_interval_s: float = 2.0,
        lost_grace_s: float = 30.0,
        not_before: float | None = None,
        result: dict[str, Any] | None = None,
        manifest: str | None = None,
        aws_conn_id: str | None = None,
    ) -> None:
        super().__init__()
        self.worker_pool = worker_pool
        self.url = url
        self.job_id = job_id
        self.deadline = deadline
        self.poll_interval_s = poll_interval_s
        self.lost_grace_s = lost_grace_s
        self.not_before = not_before
        self.result = result
        self.manifest = manifest
        self.aws_conn_id = aws_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            "airflow_batchinfer.triggers.worker_job.WorkerJobTrigger",
            {
                "worker_pool": self.worker_pool,
                "url": self.url,
                "job_id": self.job_id,
                "deadline": self.deadline,
                "poll_interval_s": self.poll_interval_s,
                "lost_grace_s": self.lost_grace_s,
                "not_before": self.not_before,
                "result": self.result,
                "manifest": self.manifest,
                "aws_conn_id": self.aws_conn_id,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        pool = await aopen_pool(self.worker_pool)
        token = await asyncio.to_thread(pool.token)
        logged = 0.0

        def progress(status: JobStatus) -> None:
            nonlocal logged
            if time.monotonic() - logged >= PROGRESS_LOG_S:
                logged = time.monotonic()
                total = status.progress.total
                self.log.info(
                    "job %s on %s: %d/%s records",
                    self.job_id,
                    self.url,
                    status.progress.done,
                    total if total is not None else "?",
                )

        async with WorkerClient(self.url, token=token) as client:
            event = await follow(
                client,
                self.job_id,
                poll_interval_s=self.poll_interval_s,
                lost_grace_s=self.lost_grace_s,
                deadline=self.deadline,
                on_status=progress,
            )
        assert event is not None  # no `until`: follow() returns only with a decision
        manifest = await self._manifest_of(event)
        await settle(self.not_before)
        # Only "done" ends the task here: resubmitting or failing is the resumed task's (it counts the
        # resubmits), with the same function.
        outcome = (
            None if manifest is None else after_event(event, manifest=manifest, resubmits=0, max_resubmits=0)
        )
        if outcome == "done":
            assert manifest is not None and self.result is not None  # read only with a result to give
            counts: dict[str, Any] = manifest.counts.model_dump(mode="json")
            self.log.info("job %s done on %s: %s", self.job_id, self.url, counts)
            yield TaskSuccessEvent(xcoms={"return_value": {**self.result, "counts": counts}})
            return
        yield TriggerEvent(event.to_dict())

    async def _manifest_of(self, event: JobEvent) -> JobManifest | None:
        """The completion manifest of a job that succeeded, when this trigger may end its task;
        ``None`` otherwise, or when it cannot be read here (the task then reads it and decides)."""
        if event.state != "succeeded" or self.result is None or self.manifest is None:
            return None
        if self.aws_conn_id:  # its credentials need a connection lookup: the task's (see above)
            return None
        try:
            return await asyncio.to_thread(read_job_manifest, self.manifest)  # plain fsspec
        except Exception as exc:  # best effort: the resumed task reads it again, and reports why
            self.log.warning(
                "job %s: could not read %s here (%s); the task decides", self.job_id, self.manifest, exc
            )
            return None

    async def on_kill(self) -> None:
        """The task was cleared or marked by a user: its job must not run on (Airflow 3.3+)."""
        pool = await aopen_pool(self.worker_pool)
        token = await asyncio.to_thread(pool.token)
        async with WorkerClient(self.url, token=token, timeout=10) as client:
            try:
                status = await client.cancel(self.job_id)
                self.log.info(
                    "job %s on %s cancelled (task killed by a user): %s", self.job_id, self.url, status.state
                )
            except RpcError as exc:
                self.log.warning("could not cancel job %s on %s: %s", self.job_id, self.url, exc)
