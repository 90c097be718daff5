from __future__ import annotations

import asyncio

from airflow_batchinfer.batching import BatchStats, DynamicBatcher


def test_empty_stats_are_zero() -> None:
    s = BatchStats()
    assert (s.avg_batch_size, s.avg_batch_cost, s.avg_fill, s.utilization) == (0, 0, 0, 0)


def test_derived_figures() -> None:
    s = BatchStats(
        total_completed=30,
        total_failed=10,
        total_batches=4,
        total_batch_cost=360,
        busy_time_s=3,
        idle_time_s=1,
        target_batch_cost=100,
    )
    assert s.avg_batch_size == 10
    assert s.avg_batch_cost == 90
    assert s.avg_fill == 0.9
    assert s.utilization == 0.75
    d = s.as_dict()
    assert d["utilization"] == 0.75 and d["avg_fill"] == 0.9 and d["total_batches"] == 4


async def test_stats_track_a_real_run() -> None:
    async def fn(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        return batch

    b = DynamicBatcher(fn, target_batch_cost=10, batch_timeout_s=0.01)
    async with b:
        await asyncio.gather(*await b.submit_batch(range(40), estimated_cost=1))
    s = b.stats
    assert s.total_submitted == s.total_completed == 40
    assert s.total_batches == 4 and s.total_batch_cost == 40
    assert s.avg_fill == 1.0
    assert s.busy_time_s >= 0.04
    assert 0 < s.utilization <= 1
    assert s.closed_by == {"cost": 4}
