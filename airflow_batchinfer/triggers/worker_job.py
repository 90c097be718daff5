"""``WorkerJobTrigger``: waits for one shard job on a worker, on the triggerer, holding no task slot.

Thin and serializable: a pool reference (never its token), a worker URL, a job id, a wall-clock
deadline. It polls the job's status (every ``poll_interval_s``; a second or more, so a small model
on a busy worker does not lose time to the polling) and ends with one event:

- ``{"state": "succeeded" | "failed" | "cancelled", ...}`` as the worker reports it;
- ``{"state": "lost", "reason": ...}`` when the worker no longer knows the job (it restarted) or has
  not answered for ``lost_grace_s``: the operator then consults the completion manifest and
  resubmits if needed;
- ``{"state": "timeout"}`` past the deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_batchinfer.exceptions import JobNotFound, RpcError, WorkerUnavailable
from airflow_batchinfer.hooks.pool import apool_endpoints
from airflow_batchinfer.rpc.client import WorkerClient
from airflow_batchinfer.rpc.models import TERMINAL_STATES

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
    ) -> None:
        super().__init__()
        self.worker_pool = worker_pool
        self.url = url
        self.job_id = job_id
        self.deadline = deadline
        self.poll_interval_s = poll_interval_s
        self.lost_grace_s = lost_grace_s

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
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        token = (await apool_endpoints(self.worker_pool)).token
        lost_since: float | None = None
        logged = 0.0
        async with WorkerClient(self.url, token=token) as client:
            while True:
                try:
                    status = await client.status(self.job_id)
                    lost_since = None
                    if status.state in TERMINAL_STATES:
                        yield TriggerEvent(
                            {"state": status.state, "error": status.error, "counts": status.counts}
                        )
                        return
                    if time.monotonic() - logged >= PROGRESS_LOG_S:
                        logged = time.monotonic()
                        total = status.progress.total
                        self.log.info("job %s on %s: %d/%s records", self.job_id, self.url,
                                      status.progress.done, total if total is not None else "?")  # fmt: skip
                except JobNotFound:
                    yield TriggerEvent({"state": "lost", "reason": f"{self.url} no longer knows the job"})
                    return
                except WorkerUnavailable as exc:
                    lost_since = lost_since or time.monotonic()
                    if time.monotonic() - lost_since >= self.lost_grace_s:
                        yield TriggerEvent(
                            {
                                "state": "lost",
                                "reason": f"{self.url} unreachable for {self.lost_grace_s:.0f} s: {exc}",
                            }
                        )
                        return
                except RpcError as exc:  # auth or a bad request: polling again will not help
                    yield TriggerEvent({"state": "failed", "error": f"{type(exc).__name__}: {exc}"})
                    return
                if self.deadline is not None and time.time() > self.deadline:
                    yield TriggerEvent({"state": "timeout"})
                    return
                await asyncio.sleep(self.poll_interval_s)
