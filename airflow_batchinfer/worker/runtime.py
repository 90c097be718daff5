"""What one worker process shares between all its jobs: the engine and one token batcher."""

from __future__ import annotations

import asyncio
import gc
from typing import Any, cast

from airflow_batchinfer.batching import TokenBatcher
from airflow_batchinfer.engines.base import Engine, GenerationRequest, GenerationResult
from airflow_batchinfer.engines.images import ImageLimits
from airflow_batchinfer.engines.pooling import EmbedRequest, EmbedResult
from airflow_batchinfer.engines.scoring import ScoreRequest, ScoreResult
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.worker.settings import worker_default
from airflow_batchinfer.worker.sleep import EngineSleep

Request = GenerationRequest | ScoreRequest | EmbedRequest
Result = GenerationResult | ScoreResult | EmbedResult


class Runtime:
    """The model loaded once and one :class:`TokenBatcher` feeding it from every concurrent job:
    generation requests, or score requests when the model is a scoring model (``engine.scoring``).

    :param target_batch_tokens: tokens (prompt estimate + completion budget) per engine batch.
        This and the other batcher settings default to the worker's (``worker.settings``).
    :param max_concurrent_batches: batches in the engine at once (more than 1 for engines with
        continuous batching, e.g. vLLM, so their KV cache stays full).
    :param image_limits: the caps on each image a request's image parts hold (``engines.images``).
    """

    def __init__(
        self,
        engine: Engine,
        *,
        target_batch_tokens: int = worker_default("target_batch_tokens"),
        max_batch_size: int = worker_default("max_batch_size"),
        batch_timeout_s: float = worker_default("batch_timeout_s"),
        max_queue_size: int = 20_000,
        max_concurrent_batches: int = 1,
        storage_options: StorageOptions | None = None,
        image_limits: ImageLimits | None = None,
    ) -> None:
        self.engine = engine
        self.storage_options = dict(storage_options or {})
        self.image_limits = image_limits or ImageLimits()  # each image part's (worker settings)
        self.batcher: TokenBatcher[Request, Result] = TokenBatcher(
            self._run,
            token_estimator=self._estimate,
            target_batch_tokens=target_batch_tokens,
            max_batch_size=max_batch_size,
            batch_timeout_s=batch_timeout_s,
            max_queue_size=max_queue_size,
            max_concurrent_batches=max_concurrent_batches,
        )
        self.sleeper = EngineSleep(engine)  # every batch passes it: a sleeping engine is woken first
        self.ready = False
        self._started = asyncio.Event()  # set with ready: the worker announces itself on it

    async def start(self) -> None:
        await self.engine.start()
        await self.batcher.start()
        self.ready = True
        self._started.set()

    async def wait_ready(self) -> None:
        """Until :meth:`start` has loaded the engine (forever if it fails: the worker then exits)."""
        await self._started.wait()

    async def close(self) -> None:
        self.ready = False
        self._started.clear()
        await self.batcher.stop()
        await self.sleeper.close()
        await self.engine.close()

    def _estimate(self, request: Request) -> int:
        if isinstance(request, ScoreRequest | EmbedRequest):
            return request.estimate_tokens()
        return self.engine.estimate_tokens(request)

    async def _run(self, batch: list[Request]) -> list[Result]:
        """One engine batch: generated, scored or embedded (a batch holding several kinds, which one
        worker's jobs do not make, runs each kind in turn)."""
        async with self.sleeper.awake():
            return await self._run_awake(batch)

    async def _run_awake(self, batch: list[Request]) -> list[Result]:
        kinds: dict[type, list[int]] = {}
        for i, r in enumerate(batch):
            kinds.setdefault(type(r), []).append(i)
        out: dict[int, Result] = {}
        for kind, positions in kinds.items():
            members = [batch[i] for i in positions]
            results: list[Result]
            if kind is ScoreRequest:
                results = list(await self.engine.score(cast(list[ScoreRequest], members)))
            elif kind is EmbedRequest:
                results = list(await self.engine.embed(cast(list[EmbedRequest], members)))
            else:
                results = list(await self.engine.generate(cast(list[GenerationRequest], members)))
            if len(kinds) == 1:
                return results
            out.update(zip(positions, results, strict=True))
        return [out[i] for i in range(len(batch))]

    def estimate(self, requests: list[GenerationRequest]) -> list[float]:
        """The batch cost (tokens) of each request: plain CPU work, for a thread to do ahead of
        :meth:`generate` (a chunk's estimates then cost the event loop nothing)."""
        return [float(self.engine.estimate_tokens(r)) for r in requests]

    async def generate(
        self, requests: list[GenerationRequest], costs: list[float] | None = None
    ) -> list[GenerationResult]:
        """Submit requests to the shared batcher and wait for their results (in order).

        ``costs``: the requests' :meth:`estimate`, when already known. The results are awaited one
        by one, not gathered: most are done by the time their turn comes (batches finish in order),
        so a chunk wakes this task about once per engine batch instead of once per request.
        """
        return cast(list[GenerationResult], await self._submit(list(requests), costs))

    async def score(self, requests: list[ScoreRequest]) -> list[ScoreResult]:
        """Score requests through the shared batcher (in order), as :meth:`generate` does."""
        return cast(list[ScoreResult], await self._submit(list(requests), None))

    async def embed(self, requests: list[EmbedRequest]) -> list[EmbedResult]:
        """Embed requests through the shared batcher (in order), as :meth:`generate` does."""
        return cast(list[EmbedResult], await self._submit(list(requests), None))

    async def _submit(self, requests: list[Request], costs: list[float] | None) -> list[Result]:
        futures = await self.batcher.submit_batch(requests, estimated_cost=costs)
        results: list[Result] = []
        try:
            for future in futures:
                results.append(await future)
        except BaseException:
            for future in futures:  # no longer awaited: drop what has not run, and its errors
                if not future.cancel() and not future.cancelled():
                    future.exception()  # retrieved: no "exception was never retrieved" noise
            raise
        return results

    def describe(self) -> dict[str, Any]:
        return self.engine.describe()


_frozen = False


def freeze_startup_objects() -> None:
    """Once per process, after the model has loaded: move every object alive now (modules, the
    web app, the engine) out of the garbage collector's reach (``gc.freeze``). They live as long as
    the process anyway; left in, each full collection walks all of them while the event loop
    stands still (100+ ms per collection in a worker: an engine batch that ends meanwhile waits
    for the loop that feeds the next one). Objects frozen are still freed by reference counting.
    The worker process calls it once it has announced itself ready: the collection delays no start."""
    global _frozen
    if _frozen:
        return
    _frozen = True
    gc.collect()
    gc.freeze()
