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

Given ``result`` (the task's return value, its ``counts`` filled in here), a job that succeeded ends its
task here, on the triggerer (:class:`~airflow.triggers.base.TaskSuccessEvent`, the counts filled in
from the worker, which reports success only after writing the job's completion manifest): the task
is not resumed on an Airflow worker just to return a small dict. That saves a task start per shard
(a process, a DAG parse and a few API calls: about a second of the run's wall time on its last
shard, and CPU on every one). Every other end resumes the task, which decides.

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
from airflow_batchinfer.triggers import settle

PROGRESS_LOG_S = 30.0


class WorkerJobTrigger(BaseTrigger):
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

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "worker_pool": self.worker_pool,
                "url": self.url,
                "job_id": self.job_id,
                "deadline": self.deadline,
                "poll_interval_s": self.poll_interval_s,
                "lost_grace_s": self.lost_grace_s,
                "not_before": self.not_before,
                "result": self.result,
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
                self.log.info("job %s on %s: %d/%s records", self.job_id, self.url, status.progress.done,
                              total if total is not None else "?")  # fmt: skip

        async with WorkerClient(self.url, token=token) as client:
            event = await follow(
                client, self.job_id, poll_interval_s=self.poll_interval_s, lost_grace_s=self.lost_grace_s,
                deadline=self.deadline, on_status=progress,
            )  # fmt: skip
        assert event is not None  # no `until`: follow() returns only with a decision
        await settle(self.not_before)
        if event.state == "succeeded" and self.result is not None:
            self.log.info("job %s done on %s: %s", self.job_id, self.url, event.counts)
            yield TaskSuccessEvent(xcoms={"return_value": {**self.result, "counts": dict(event.counts)}})
            return
        yield TriggerEvent(event.to_dict())

    async def on_kill(self) -> None:
        """The task was cleared or marked by a user: its job must not run on (Airflow 3.3+)."""
        pool = await aopen_pool(self.worker_pool)
        token = await asyncio.to_thread(pool.token)
        async with WorkerClient(self.url, token=token, timeout=10) as client:
            try:
                status = await client.cancel(self.job_id)
                self.log.info("job %s on %s cancelled (task killed by a user): %s", self.job_id, self.url,
                              status.state)  # fmt: skip
            except RpcError as exc:
                self.log.warning("could not cancel job %s on %s: %s", self.job_id, self.url, exc)
