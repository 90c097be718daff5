"""Feeding the engine on time: the next batch starts before the waiters of the last one run, long
submissions yield to the loop between slices, and the worker's runtime awaits results in order."""

from __future__ import annotations

import asyncio

import pytest

from airflow_batchinfer.batching import DynamicBatcher
from airflow_batchinfer.engines import GenerationRequest, create_engine
from airflow_batchinfer.worker.runtime import Runtime


async def test_next_batch_starts_before_the_last_batchs_waiters_run() -> None:
    events: list[str] = []

    async def fn(batch: list[int]) -> list[int]:
        events.append(f"start {batch[0]}")
        await asyncio.sleep(0.01)
        return batch

    async def waiter(future: asyncio.Future[int]) -> None:
        await future
        events.append(f"waiter {future.result()}")

    async with DynamicBatcher(fn, max_batch_size=1, batch_timeout_s=0) as b:
        futures = await b.submit_batch(range(3))
        await asyncio.gather(*(waiter(f) for f in futures))
    assert events.index("start 1") < events.index("waiter 0")
    assert events.index("start 2") < events.index("waiter 1")
    assert b.stats.total_batches == 3 and b.stats.busy_time_s >= 0.03


async def test_submit_batch_yields_between_slices_and_keeps_order() -> None:
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    b: DynamicBatcher[int, int] = DynamicBatcher(lambda batch: batch, max_batch_size=64, batch_timeout_s=0)
    async with b:
        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        before = ticks
        futures = await b.submit_batch(range(4 * DynamicBatcher.SUBMIT_SLICE))
        during = ticks - before
        task.cancel()
        assert await asyncio.gather(*futures) == list(range(4 * DynamicBatcher.SUBMIT_SLICE))
    assert during >= 3  # the loop ran other tasks between the slices


async def test_runtime_results_in_order_and_a_failure_drops_the_rest() -> None:
    runtime = Runtime(create_engine("simulated", latency_base_s=0.001), max_batch_size=4, batch_timeout_s=0)
    await runtime.start()
    try:
        requests = [GenerationRequest(str(i), prompt=f"p{i}") for i in range(10)]
        costs = runtime.estimate(requests)
        assert costs == [float(r.estimate_tokens()) for r in requests]
        results = await runtime.generate(requests, costs)
        assert [r.prompt_tokens for r in results] == [r.prompt_chars() // 4 + 1 for r in requests]
        again = await runtime.generate(requests)
        assert [r.text for r in again] == [r.text for r in results]

        calls = 0
        real = runtime.engine.generate

        async def fail_first(batch: list[GenerationRequest]) -> list[object]:
            nonlocal calls
            calls += 1
            if calls == 1:
                raise RuntimeError("engine down")
            return list(await real(batch))

        runtime.batcher._process_fn = fail_first  # type: ignore[assignment]
        with pytest.raises(RuntimeError, match="engine down"):
            await runtime.generate(requests)
    finally:
        await runtime.close()
