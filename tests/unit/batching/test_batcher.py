from __future__ import annotations

import asyncio
import gc
from typing import Any

import pytest

from airflow_batchinfer.batching import DynamicBatcher
from airflow_batchinfer.exceptions import BatcherError


class Recorder:
    """A process_fn that records the batches it saw and echoes records (optionally slowly)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.batches: list[list[Any]] = []
        self.delay = delay

    async def __call__(self, batch: list[Any]) -> list[Any]:
        self.batches.append(list(batch))
        if self.delay:
            await asyncio.sleep(self.delay)
        return [("done", r) for r in batch]


class Costed:
    def __init__(self, name: str, cost: float) -> None:
        self.name, self.cost = name, cost

    def estimate_cost(self) -> float:
        return self.cost


async def test_submit_returns_future_resolved_with_result_by_position() -> None:
    rec = Recorder()
    async with DynamicBatcher(rec, batch_timeout_s=0.01) as b:
        futs = [await b.submit(i) for i in range(10)]
        assert all(isinstance(f, asyncio.Future) for f in futs)
        assert await asyncio.gather(*futs) == [("done", i) for i in range(10)]


async def test_plain_function_works_too() -> None:
    async with DynamicBatcher(lambda batch: [x * 2 for x in batch], batch_timeout_s=0) as b:
        assert await (await b.submit(21)) == 42


async def test_closes_at_target_cost_admitting_the_crossing_record() -> None:
    rec = Recorder()
    b = DynamicBatcher(rec, target_batch_cost=10, batch_timeout_s=5)
    async with b:
        futs = await b.submit_batch(range(7), estimated_cost=4)  # 4+4+4 crosses 10 on the 3rd
        await asyncio.wait_for(asyncio.gather(*futs[:6]), 1)  # did not wait for the 5 s timeout
        assert not futs[6].done()  # the last one waits for more (until the timeout, or stop())
    assert [len(x) for x in rec.batches] == [3, 3, 1]
    assert b.stats.closed_by == {"cost": 2, "drain": 1}


async def test_oversized_record_forms_its_own_batch() -> None:
    rec = Recorder()
    async with DynamicBatcher(rec, target_batch_cost=10, batch_timeout_s=1) as b:
        futs = await b.submit_batch(["a", "b", "BIG", "c"], estimated_cost=[2, 2, 50, 2])
        await asyncio.gather(*futs)
    assert rec.batches == [["a", "b"], ["BIG"], ["c"]]


async def test_closes_at_max_batch_size() -> None:
    rec = Recorder()
    async with DynamicBatcher(rec, max_batch_size=4, batch_timeout_s=5) as b:
        await asyncio.wait_for(asyncio.gather(*await b.submit_batch(range(8))), 1)
    assert [len(x) for x in rec.batches] == [4, 4]


async def test_timeout_counts_from_first_dequeued_record() -> None:
    rec = Recorder()
    loop = asyncio.get_running_loop()
    async with DynamicBatcher(rec, batch_timeout_s=0.5) as b:
        t0 = loop.time()
        f1 = await b.submit("first")
        await asyncio.sleep(0.25)
        f2 = await b.submit("second")  # joins the open batch; does not restart its clock
        await asyncio.gather(f1, f2)
        elapsed = loop.time() - t0
    assert rec.batches == [["first", "second"]]
    assert 0.45 <= elapsed < 0.7  # a clock restarted by "second" would close at >= 0.75
    assert b.stats.closed_by == {"timeout": 1}


async def test_cost_precedence_explicit_estimator_method_default() -> None:
    seen: list[float] = []

    async def fn(batch: list[Any]) -> list[Any]:
        return batch

    b = DynamicBatcher(fn, cost_estimator=lambda r: 7 if r == "est" else 3, default_cost=5)
    b2 = DynamicBatcher(fn, default_cost=5)
    cases = [(b, "est", None), (b, "est", 0), (b, Costed("m", 9), None), (b2, Costed("m", 9), None)]
    for batcher, record, explicit in [*cases, (b2, "plain", None)]:
        seen.append(batcher._cost(record, explicit))
    assert seen == [7, 0, 3, 9, 5]  # explicit 0 is honoured


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "3", True])
async def test_invalid_costs_are_rejected(bad: Any) -> None:
    async with DynamicBatcher(Recorder()) as b:
        with pytest.raises(ValueError, match="cost"):
            await b.submit("x", estimated_cost=bad)


async def test_submit_batch_cost_list_length_must_match() -> None:
    async with DynamicBatcher(Recorder()) as b:
        with pytest.raises(ValueError, match="2 costs for 3 records"):
            await b.submit_batch([1, 2, 3], estimated_cost=[1, 2])


async def test_exception_fails_only_that_batch_and_batcher_keeps_going() -> None:
    calls = 0

    async def flaky(batch: list[int]) -> list[int]:
        nonlocal calls
        calls += 1
        if 13 in batch:
            raise RuntimeError("engine hiccup")
        return batch

    async with DynamicBatcher(flaky, max_batch_size=5, batch_timeout_s=0.01) as b:
        futs = await b.submit_batch(range(20))
        results = await asyncio.gather(*futs, return_exceptions=True)
    bad = [i for i, r in enumerate(results) if isinstance(r, RuntimeError)]
    assert bad == [10, 11, 12, 13, 14]
    assert [r for r in results if not isinstance(r, Exception)] == [*range(10), *range(15, 20)]
    assert b.stats.total_failed == 5 and b.stats.total_completed == 15


async def test_wrong_result_count_fails_batch_with_both_lengths() -> None:
    async with DynamicBatcher(lambda batch: batch[:-1], max_batch_size=3, batch_timeout_s=0) as b:
        futs = await b.submit_batch([1, 2, 3])
        with pytest.raises(ValueError, match="returned 2 results for a batch of 3 records"):
            await futs[0]
        # still serving
        assert len(await asyncio.gather(*futs, return_exceptions=True)) == 3


async def test_caller_cancelled_future_is_skipped_safely() -> None:
    rec = Recorder(delay=0.05)
    async with DynamicBatcher(rec, batch_timeout_s=0.01) as b:
        futs = await b.submit_batch(range(5))
        futs[2].cancel()
        done = await asyncio.gather(*futs, return_exceptions=True)
    assert isinstance(done[2], asyncio.CancelledError)
    assert done[0] == ("done", 0) and done[4] == ("done", 4)


async def test_stop_drains_queue_immediately_in_order_even_if_body_raised() -> None:
    rec = Recorder()
    loop = asyncio.get_running_loop()
    b = DynamicBatcher(rec, batch_timeout_s=30, max_batch_size=1000)
    futs: list[asyncio.Future[Any]] = []
    t0 = loop.time()
    with pytest.raises(KeyError):
        async with b:
            futs = await b.submit_batch(range(100))
            raise KeyError("body failed")
    assert loop.time() - t0 < 1  # did not wait out the 30 s timeout
    assert all(f.done() for f in futs)
    assert [r for batch in rec.batches for r in batch] == list(range(100))
    assert not b.is_running


async def test_fifo_per_producer_with_many_producers() -> None:
    rec = Recorder()
    async with DynamicBatcher(rec, max_batch_size=7, max_queue_size=5, batch_timeout_s=0.001) as b:

        async def produce(p: int) -> list[Any]:
            futs = [await b.submit((p, i)) for i in range(30)]
            return await asyncio.gather(*futs)

        results = await asyncio.gather(*(produce(p) for p in range(20)))
    assert all(r == [("done", (p, i)) for i in range(30)] for p, r in enumerate(results))
    order = [r for batch in rec.batches for r in batch]
    for p in range(20):
        assert [i for q, i in order if q == p] == list(range(30))


async def test_submit_suspends_when_queue_full_backpressure() -> None:
    gate = asyncio.Event()

    async def slow(batch: list[int]) -> list[int]:
        await gate.wait()
        return batch

    b = DynamicBatcher(slow, max_queue_size=3, max_batch_size=1, prefetch_batches=1, batch_timeout_s=0)
    async with b:
        futs = [await b.submit(i) for i in range(3)]  # 1 processing, 1 prefetched, 1 forming…
        for i in range(3, 6):
            futs.append(await b.submit(i))  # …and up to 3 queued: all accepted without blocking
        blocked = asyncio.ensure_future(b.submit(99))
        await asyncio.sleep(0.05)
        assert not blocked.done(), "submit must suspend while the queue is full"
        gate.set()
        futs.append(await blocked)
        assert await asyncio.gather(*futs) == [0, 1, 2, 3, 4, 5, 99]


async def test_hundreds_of_producers_small_queue_no_loss_bounded_memory() -> None:
    peak = 0

    async def fn(batch: list[int]) -> list[int]:
        nonlocal peak
        peak = max(peak, b.stats.queue_depth)
        await asyncio.sleep(0)
        return batch

    b = DynamicBatcher(fn, max_queue_size=8, max_batch_size=16, batch_timeout_s=0.001)
    async with b:

        async def produce(p: int) -> int:
            futs = [await b.submit(p * 1000 + i) for i in range(50)]
            return sum(await asyncio.gather(*futs))

        totals = await asyncio.gather(*(produce(p) for p in range(300)))
    assert sum(totals) == sum(p * 1000 + i for p in range(300) for i in range(50))
    assert b.stats.total_completed == 300 * 50
    assert peak <= 8


async def test_min_batch_size_neither_reorders_nor_deadlocks() -> None:
    rec = Recorder()
    async with DynamicBatcher(
        rec, min_batch_size=4, max_batch_size=8, batch_timeout_s=0.01, max_queue_size=2
    ) as b:
        # a single producer awaiting each result in turn can never make a batch of 4: must not hang
        for i in range(3):
            assert await asyncio.wait_for(await b.submit(i), 2) == ("done", i)
        # producers filling a tiny queue
        futs = await b.submit_batch(range(100, 140))
        await asyncio.wait_for(asyncio.gather(*futs), 5)
    flat = [r for batch in rec.batches for r in batch]
    assert flat == [0, 1, 2, *range(100, 140)]


async def test_min_batch_size_waits_for_more_records() -> None:
    rec = Recorder()
    async with DynamicBatcher(rec, min_batch_size=3, batch_timeout_s=0.02, min_batch_wait_s=1) as b:
        f1 = await b.submit("a")
        await asyncio.sleep(0.1)  # past batch_timeout_s, but below min_batch_size: still open
        f2 = await b.submit("b")
        f3 = await b.submit("c")
        await asyncio.gather(f1, f2, f3)
    assert rec.batches == [["a", "b", "c"]]


async def test_prefetch_keeps_batches_ready() -> None:
    rec = Recorder(delay=0.02)
    async with DynamicBatcher(rec, max_batch_size=2, prefetch_batches=3, batch_timeout_s=0) as b:
        await asyncio.gather(*await b.submit_batch(range(20)))
    assert sum(len(x) for x in rec.batches) == 20
    assert all(len(x) <= 2 for x in rec.batches)


# ----------------------------------------------------------------------------- hardening


async def test_start_twice_raises() -> None:
    b = DynamicBatcher(Recorder())
    await b.start()
    with pytest.raises(RuntimeError, match="already running"):
        await b.start()
    await b.stop()


async def test_submit_before_start_and_after_stop_raise() -> None:
    b = DynamicBatcher(Recorder())
    with pytest.raises(RuntimeError, match="not running"):
        await b.submit(1)
    async with b:
        pass
    with pytest.raises(RuntimeError, match="after stop"):
        await b.submit(1)
    await b.stop()  # stop on a stopped batcher does nothing


def test_use_from_second_event_loop_raises_immediately() -> None:
    b = DynamicBatcher(Recorder(), batch_timeout_s=0)

    async def first() -> Any:
        await b.start()
        return await (await b.submit(1))

    assert asyncio.run(first()) == ("done", 1)  # the loop ends without stop()

    async def second() -> None:
        with pytest.raises(BatcherError, match="another event loop"):
            await asyncio.wait_for(b.submit(2), 1)

    asyncio.run(second())
    gc.collect()


async def test_submit_racing_stop_never_leaves_unresolved_futures() -> None:
    rec = Recorder(delay=0.001)
    b = DynamicBatcher(rec, max_queue_size=2, max_batch_size=3, batch_timeout_s=0.001)
    await b.start()
    accepted: list[asyncio.Future[Any]] = []
    refused = 0

    async def produce(p: int) -> None:
        nonlocal refused
        for i in range(50):
            try:
                accepted.append(await b.submit((p, i)))
            except BatcherError:
                refused += 1
                return

    producers = [asyncio.ensure_future(produce(p)) for p in range(10)]
    await asyncio.sleep(0.01)
    await b.stop()
    await asyncio.gather(*producers)
    assert refused > 0, "some submits must have raced stop()"
    assert all(f.done() for f in accepted)
    assert all(
        not isinstance(r, BaseException) for r in await asyncio.gather(*accepted, return_exceptions=True)
    )


async def test_cancelled_error_inside_process_fn_cancels_that_batch_and_stop_completes() -> None:
    async def fn(batch: list[int]) -> list[int]:
        if 0 in batch:
            raise asyncio.CancelledError  # e.g. the engine request was cancelled
        return batch

    b = DynamicBatcher(fn, max_batch_size=2, batch_timeout_s=0)
    async with b:
        futs = await b.submit_batch(range(6))
        done = await asyncio.gather(*futs, return_exceptions=True)
    assert all(isinstance(x, asyncio.CancelledError) for x in done[:2])
    assert done[2:] == [2, 3, 4, 5]
    assert not b.is_running


async def test_custom_base_exception_fails_batch_only() -> None:
    class Fatalish(BaseException):
        pass

    async def fn(batch: list[int]) -> list[int]:
        if 1 in batch:
            raise Fatalish("boom")
        return batch

    async with DynamicBatcher(fn, max_batch_size=1, batch_timeout_s=0) as b:
        futs = await b.submit_batch(range(3))
        done = await asyncio.gather(*futs, return_exceptions=True)
    assert done[0] == 0 and isinstance(done[1], Fatalish) and done[2] == 2


def test_keyboard_interrupt_in_process_fn_resolves_every_future() -> None:
    futs: list[asyncio.Future[Any]] = []

    async def fn(batch: list[int]) -> list[int]:
        await asyncio.sleep(0.01)
        raise KeyboardInterrupt

    async def main() -> None:
        b = DynamicBatcher(fn, max_batch_size=1, batch_timeout_s=0)
        await b.start()
        futs.extend(await b.submit_batch(range(5)))
        await asyncio.gather(*futs, return_exceptions=True)

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(main())
    assert futs and all(f.done() for f in futs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_batch_size": 0}, "max_batch_size"),
        ({"min_batch_size": 5, "max_batch_size": 4}, "min_batch_size"),
        ({"min_batch_size": 0}, "min_batch_size"),
        ({"batch_timeout_s": -0.1}, "batch_timeout_s"),
        ({"prefetch_batches": 0}, "prefetch_batches"),
        ({"max_queue_size": 0}, "max_queue_size"),
        ({"target_batch_cost": 0}, "target_batch_cost"),
        ({"target_batch_cost": -5}, "target_batch_cost"),
        ({"default_cost": -1}, "default_cost"),
    ],
)
def test_invalid_parameters_raise_value_error(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DynamicBatcher(Recorder(), **kwargs)


async def test_max_concurrent_batches_runs_batches_in_parallel() -> None:
    running = 0
    peak = 0

    async def fn(batch: list[int]) -> list[int]:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return batch

    b = DynamicBatcher(fn, max_batch_size=2, batch_timeout_s=0, max_concurrent_batches=3)
    async with b:
        assert await asyncio.gather(*await b.submit_batch(range(12))) == list(range(12))
    assert peak == 3
    s = b.stats
    assert s.total_batches == 6
    # busy time is the union of overlapping batches: about 2 rounds of 50 ms, not 6
    assert s.busy_time_s < 6 * 0.05


def test_max_concurrent_batches_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_concurrent_batches"):
        DynamicBatcher(Recorder(), max_concurrent_batches=0)
