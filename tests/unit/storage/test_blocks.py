"""Chunk-sized hops between an event loop and the threads that read and write records: a reader's
``blocks`` and an :class:`AsyncWriter`'s ``write_many`` keep every record, in order, in few hops."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

from airflow_batchinfer.storage import JsonlFile
from airflow_batchinfer.storage.writer import AsyncWriter


def written(tmp_path: Path, n: int) -> JsonlFile:
    f = JsonlFile(str(tmp_path / "data.jsonl.zst"))
    with f.writer_sync() as w:
        w.write_many({"id": i} for i in range(n))
    return f


async def test_blocks_have_the_sizes_asked_and_every_record_in_order(tmp_path: Path) -> None:
    f = written(tmp_path, 1_000)
    sizes, ids = [], []
    async for block in f.iter_records().blocks(300, first=64):
        sizes.append(len(block))
        ids += [r["id"] for r in block]
    assert sizes == [64, 300, 300, 300, 36]
    assert ids == list(range(1_000))
    assert [len(b) async for b in f.iter_records().blocks(500)] == [500, 500]


async def test_block_sizes_must_be_positive(tmp_path: Path) -> None:
    f = written(tmp_path, 3)
    for kwargs in ({"size": 0}, {"size": 5, "first": 0}):
        with pytest.raises(ValueError, match="block sizes"):
            async for _ in f.iter_records().blocks(**kwargs):
                pass


async def test_a_consumer_that_stops_early_closes_the_reader(tmp_path: Path) -> None:
    f = written(tmp_path, 1_000)
    reader = f.iter_records()
    blocks = reader.blocks(100)
    async for _ in blocks:
        break
    await blocks.aclose()
    assert reader.stats.records == 100


class Blocks:
    def __init__(self) -> None:
        self.blocks: list[list[int]] = []

    def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        self.blocks.append([r["id"] for r in records])

    def commit(self) -> None: ...
    def abort(self) -> None: ...


async def test_write_many_hands_a_whole_chunk_to_the_thread_at_once() -> None:
    sync = Blocks()
    async with AsyncWriter(sync) as w:
        await w.write_many({"id": i} for i in range(2_000))  # one chunk: one hop
        await w.write_many({"id": i} for i in range(2_000, 2_100))  # under a block: waits for more
        await asyncio.gather(*(w.write({"id": i}) for i in range(2_100, 2_700)))
    assert [len(b) for b in sync.blocks] == [2_000, AsyncWriter.BLOCK, 2_700 - 2_000 - AsyncWriter.BLOCK]
    assert [i for b in sync.blocks for i in b] == list(range(2_700))
