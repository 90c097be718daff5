"""One AsyncWriter shared by many tasks (an in-place job's samples): the sync writer below it gets
its blocks one at a time and in order, commit waits for the blocks in flight, abort never runs
alongside a block still being written in a thread."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import pytest

from airflow_batchinfer.storage import JsonlDir, JsonlFile
from airflow_batchinfer.storage.jsonl_dir import ShardWriter
from airflow_batchinfer.storage.writer import AsyncWriter
from tests.support.roots import Root, visible_names

N = 60_000


def record(i: int) -> dict[str, Any]:
    # ~250 bytes: 60,000 of them fill the 1 MiB compression buffer many times over
    return {"id": i, "text": f"record {i}: " + "lorem ipsum " * 20}


class SlowSyncWriter:
    """A sync writer that sleeps in every call and counts the threads inside it at once."""

    def __init__(self, delay_s: float = 0.002) -> None:
        self.delay_s = delay_s
        self.blocks: list[list[int]] = []
        self.calls: list[str] = []
        self.inside = 0
        self.max_inside = 0
        self._mutex = threading.Lock()

    @contextmanager
    def _enter(self, call: str) -> Iterator[None]:
        with self._mutex:
            self.inside += 1
            self.max_inside = max(self.max_inside, self.inside)
        try:
            time.sleep(self.delay_s)
            yield
        finally:
            with self._mutex:
                self.calls.append(call)  # in the order the calls finished
                self.inside -= 1

    def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        with self._enter("write_many"):
            self.blocks.append([r["id"] for r in records])

    def commit(self) -> None:
        with self._enter("commit"):
            pass

    def abort(self) -> None:
        with self._enter("abort"):
            pass

    def ids(self) -> list[int]:
        return [i for block in self.blocks for i in block]


@pytest.mark.parametrize("name", ["x.jsonl.zst", "x.jsonl"])
async def test_60k_concurrent_writes_round_trip_every_record_once(root: Root, name: str) -> None:
    f = JsonlFile(root.uri(name), storage_options=root.storage_options)
    async with f.writer() as w:
        await asyncio.gather(*(w.write(record(i)) for i in range(N)))
    got = [r async for r in f.iter_records()]
    assert Counter(r["id"] for r in got) == Counter(range(N))  # every record, exactly once
    assert got == [record(i) for i in range(N)]  # in the order they were handed in


async def test_60k_concurrent_writes_into_a_rotating_dir_writer(root: Root) -> None:
    d = JsonlDir(root.uri("out"), storage_options=root.storage_options)
    w = d.writer(max_records_per_shard=25_000)
    async with w:
        await asyncio.gather(*(w.write(record(i)) for i in range(N)))
    assert isinstance(w.sync, ShardWriter)
    assert [s.records for s in w.sync.shards_written] == [25_000, 25_000, 10_000]
    assert [r["id"] for r in d.iter_records()] == list(range(N))


@pytest.mark.parametrize("spread", [False, True], ids=["burst", "spread"])
async def test_blocks_reach_the_sync_writer_one_at_a_time_and_in_order(spread: bool) -> None:
    """``burst``: every record is handed in before the first block is written; ``spread``: records
    keep coming while blocks are being written, so drains queue up behind each other."""
    sync = SlowSyncWriter(delay_s=0.001)
    async with AsyncWriter(sync) as w:
        tasks = []
        for i in range(N):
            tasks.append(asyncio.create_task(w.write(record(i))))  # tasks run in creation order
            if spread and i % 2_000 == 1_999:
                await asyncio.sleep(0.005)
        await asyncio.gather(*tasks)
    assert sync.max_inside == 1
    assert sync.ids() == list(range(N))
    assert len(sync.blocks) >= (10 if spread else 2)
    assert all(len(b) >= AsyncWriter.BLOCK for b in sync.blocks[:-1])  # blocks, not crumbs
    assert sync.calls == ["write_many"] * len(sync.blocks) + ["commit"]


async def test_commit_waits_for_blocks_in_flight_then_writes_the_rest() -> None:
    sync = SlowSyncWriter(delay_s=0.02)
    async with AsyncWriter(sync) as w:
        writers = [asyncio.create_task(w.write(record(i))) for i in range(5_000)]
        await asyncio.sleep(0)  # every task has handed in its record; the first blocks are draining
    # commit returned: everything before it is written, and nothing came after it
    assert sync.calls[-1] == "commit" and sync.calls.count("commit") == 1
    assert sync.ids() == list(range(5_000))
    assert sync.max_inside == 1
    await asyncio.gather(*writers)  # the tasks still queued for a drain find nothing left
    assert sync.calls[-1] == "commit" and sync.ids() == list(range(5_000))


async def test_commit_with_writes_in_flight_into_a_real_file(root: Root) -> None:
    f = JsonlFile(root.uri("c.jsonl.zst"), storage_options=root.storage_options)
    async with f.writer() as w:
        writers = [asyncio.create_task(w.write(record(i))) for i in range(20_000)]
        await asyncio.sleep(0)
    await asyncio.gather(*writers)
    assert [r["id"] for r in f.iter_records()] == list(range(20_000))


async def _fail() -> None:
    await asyncio.sleep(0.005)
    raise RuntimeError("boom")


async def test_failure_mid_drain_aborts_only_after_the_block_in_the_thread_ends() -> None:
    sync = SlowSyncWriter(delay_s=0.1)
    with pytest.raises(ExceptionGroup) as info:
        # as in an in-place job: a failing sample cancels the others, some of them mid-drain
        async with AsyncWriter(sync) as w, asyncio.TaskGroup() as group:
            for i in range(3_000):
                group.create_task(w.write(record(i)))
            group.create_task(_fail())
    assert [str(e) for e in info.value.exceptions] == ["boom"]
    assert sync.max_inside == 1  # abort did not run beside the block being written
    assert sync.calls[-1] == "abort" and "commit" not in sync.calls
    assert sync.calls.count("write_many") == 1  # blocks queued behind it were dropped, not written


async def test_failure_with_writes_in_flight_leaves_no_file(root: Root) -> None:
    f = JsonlFile(root.uri("sub", "a.jsonl.zst"), storage_options=root.storage_options)
    with pytest.raises(ExceptionGroup):
        async with f.writer() as w, asyncio.TaskGroup() as group:
            for i in range(20_000):
                group.create_task(w.write(record(i)))
            group.create_task(_fail())
    assert not f.exists()
    assert visible_names(root, "sub") == []  # no temp files either


async def test_commit_failure_in_a_block_aborts() -> None:
    class Failing(SlowSyncWriter):
        def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
            raise TypeError("not JSON")

    sync = Failing(delay_s=0)
    with pytest.raises(TypeError, match="not JSON"):
        async with AsyncWriter(sync) as w:
            await w.write(record(0))  # stays pending: the commit's drain fails
    assert sync.calls == ["abort"]
