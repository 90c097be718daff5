"""What one worker process shares between all its jobs: the engine and one token batcher."""

from __future__ import annotations

import asyncio
from typing import Any

from airflow_batchinfer.batching import TokenBatcher
from airflow_batchinfer.engines.base import Engine, GenerationRequest, GenerationResult
from airflow_batchinfer.storage.location import StorageOptions


class Runtime:
    """The model loaded once and one :class:`TokenBatcher` feeding it from every concurrent job.

    :param target_batch_tokens: tokens (prompt estimate + completion budget) per engine batch.
    :param max_concurrent_batches: batches in the engine at once (more than 1 for engines with
        continuous batching, e.g. vLLM, so their KV cache stays full).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        target_batch_tokens: int = 16_384,
        max_batch_size: int = 256,
        batch_timeout_s: float = 0.05,
        max_queue_size: int = 20_000,
        max_concurrent_batches: int = 1,
        storage_options: StorageOptions | None = None,
    ) -> None:
        self.engine = engine
        self.storage_options = dict(storage_options or {})
        self.batcher: TokenBatcher[GenerationRequest, GenerationResult] = TokenBatcher(
            engine.generate,
            token_estimator=engine.estimate_tokens,
            target_batch_tokens=target_batch_tokens,
            max_batch_size=max_batch_size,
            batch_timeout_s=batch_timeout_s,
            max_queue_size=max_queue_size,
            max_concurrent_batches=max_concurrent_batches,
        )
        self.ready = False

    async def start(self) -> None:
        await self.engine.start()
        await self.batcher.start()
        self.ready = True

    async def close(self) -> None:
        self.ready = False
        await self.batcher.stop()
        await self.engine.close()

    async def generate(self, requests: list[GenerationRequest]) -> list[GenerationResult]:
        """Submit requests to the shared batcher and wait for their results (in order)."""
        futures = [await self.batcher.submit(r) for r in requests]
        return list(await asyncio.gather(*futures))

    def describe(self) -> dict[str, Any]:
        return self.engine.describe()
