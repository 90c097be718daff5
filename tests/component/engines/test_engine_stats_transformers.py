"""The transformers engine's counters on the tiny Llama (a real model run; the other engines' in
tests/unit/engines/test_engine_stats.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from airflow_batchinfer.engines import Engine, GenerationRequest, SamplingParams, create_engine
from tests.support.engine_stats import reported


async def test_the_transformers_engine_counts_generated_tokens_and_running_requests(
    transformers_engine: Engine,
) -> None:
    reqs = [
        GenerationRequest(str(i), prompt=f"count to {i}", sampling=SamplingParams(max_tokens=24))
        for i in range(3)
    ]
    before = transformers_engine.stats()
    task = asyncio.create_task(transformers_engine.generate(reqs))
    running = []
    while not task.done():  # generating in a thread: the loop reads the stats meanwhile
        s = transformers_engine.stats()
        running.append(s.running if s else None)
        await asyncio.sleep(0.001)
    results = await task
    after = transformers_engine.stats()
    assert before is not None and after is not None
    assert after.generation_tokens - before.generation_tokens == sum(r.completion_tokens for r in results) > 0  # type: ignore[operator]
    assert after.batches == before.batches + 1  # type: ignore[operator]
    assert max(r or 0 for r in running) == 3 and after.running == 0
    assert reported(after) == set(transformers_engine.stats_fields)


@pytest.fixture(scope="module")
def transformers_engine(tiny_model: str) -> Iterator[Engine]:
    pytest.importorskip("torch", reason="needs the transformers extra")
    e = create_engine("transformers", model=tiny_model)
    asyncio.run(e.start())
    yield e
    asyncio.run(e.close())
