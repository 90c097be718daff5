"""``PoolReadyTrigger``: waits, on the triggerer, until a worker pool has ``replicas`` ready workers
(``/v1/ready``: model loaded, not draining)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_batchinfer.exceptions import WorkerUnavailable
from airflow_batchinfer.hooks.pool import apool_endpoints
from airflow_batchinfer.rpc.client import WorkerClient


class PoolReadyTrigger(BaseTrigger):
    def __init__(
        self, *, worker_pool: str, replicas: int, deadline: float, poll_interval_s: float = 2.0
    ) -> None:
        super().__init__()
        self.worker_pool = worker_pool
        self.replicas = replicas
        self.deadline = deadline
        self.poll_interval_s = poll_interval_s

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "worker_pool": self.worker_pool,
                "replicas": self.replicas,
                "deadline": self.deadline,
                "poll_interval_s": self.poll_interval_s,
            },
        )

    async def _ready(self, url: str, token: str | None) -> bool:
        try:
            async with WorkerClient(url, token=token, timeout=5) as client:
                return await client.ready()
        except WorkerUnavailable:  # still starting
            return False

    async def run(self) -> AsyncIterator[TriggerEvent]:
        ready: list[str] = []
        while True:
            ep = await apool_endpoints(self.worker_pool)
            answers = await asyncio.gather(*(self._ready(u, ep.token) for u in ep.urls))
            ready = [u for u, ok in zip(ep.urls, answers, strict=True) if ok]
            if len(ready) >= self.replicas:
                yield TriggerEvent({"state": "ready", "urls": ready})
                return
            if time.time() > self.deadline:
                yield TriggerEvent({"state": "timeout", "ready": len(ready), "urls": ep.urls})
                return
            await asyncio.sleep(self.poll_interval_s)
