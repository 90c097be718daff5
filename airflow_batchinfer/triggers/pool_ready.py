"""``PoolReadyTrigger``: waits, on the triggerer, until a worker pool has ``replicas`` ready workers
(``/v1/ready``: model loaded, not draining)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_batchinfer.hooks.pool import aopen_pool
from airflow_batchinfer.rpc.pool import ready_workers
from airflow_batchinfer.triggers import settle


class PoolReadyTrigger(BaseTrigger):
    """:param lease_id: the run whose workers to wait for (a local pool may run several generations)."""

    def __init__(
        self,
        *,
        worker_pool: str,
        replicas: int,
        deadline: float,
        poll_interval_s: float = 2.0,
        lease_id: str | None = None,
        not_before: float | None = None,
    ) -> None:
        super().__init__()
        self.worker_pool = worker_pool
        self.replicas = replicas
        self.deadline = deadline
        self.poll_interval_s = poll_interval_s
        self.lease_id = lease_id
        self.not_before = not_before

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "worker_pool": self.worker_pool,
                "replicas": self.replicas,
                "deadline": self.deadline,
                "poll_interval_s": self.poll_interval_s,
                "lease_id": self.lease_id,
                "not_before": self.not_before,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        pool = await aopen_pool(self.worker_pool)
        token = await asyncio.to_thread(pool.token)
        while True:
            urls = await asyncio.to_thread(pool.endpoints, self.lease_id)
            ready = await ready_workers(urls, token)
            if len(ready) >= self.replicas:
                await settle(self.not_before)
                yield TriggerEvent({"state": "ready", "urls": ready})
                return
            if time.time() > self.deadline:
                await settle(self.not_before)
                yield TriggerEvent({"state": "timeout", "ready": len(ready), "urls": urls})
                return
            await asyncio.sleep(self.poll_interval_s)
