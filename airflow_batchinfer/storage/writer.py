"""Writers: one JSONL(.zst) file committed atomically, and the async adapter over any sync writer."""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Protocol, Self, TypeVar

import orjson
import zstandard

from airflow_batchinfer.storage.atomic import AtomicSink
from airflow_batchinfer.storage.lines import is_zstd
from airflow_batchinfer.storage.location import Location

T = TypeVar("T")
FLUSH_BYTES = 1024 * 1024
DEFAULT_ZSTD_LEVEL = 3


def serialize(record: Mapping[str, Any]) -> bytes:
    try:
        return orjson.dumps(record)
    except TypeError as exc:
        raise TypeError(f"record is not JSON-serializable ({exc}): {str(record)[:200]}") from exc


class CommitOnExit(ABC):
    """A writer used with ``with``: committed on a clean exit, aborted when the block raises."""

    @abstractmethod
    def commit(self) -> None: ...

    @abstractmethod
    def abort(self) -> None: ...

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.commit()
        else:
            self.abort()


class JsonlWriter(CommitOnExit):
    """Writes one JSONL file, zstd-compressed when its name ends in ``.zst``/``.zstd``.

    The file appears at :meth:`commit` (or a clean exit of ``with``); :meth:`abort` (or an exception
    in the ``with`` block) leaves nothing visible. ``records`` and ``bytes`` (uncompressed, newlines
    included) count what was written.
    """

    def __init__(self, loc: Location, *, compression_level: int = DEFAULT_ZSTD_LEVEL) -> None:
        self.loc = loc
        self.records = 0
        self.bytes = 0
        self._buf = bytearray()
        self._cobj = (
            zstandard.ZstdCompressor(level=compression_level).compressobj() if is_zstd(loc.path) else None
        )
        self._sink = AtomicSink(loc)
        self.closed = False

    def write(self, record: Mapping[str, Any]) -> None:
        self.write_line(serialize(record))

    def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        for record in records:
            self.write_line(serialize(record))

    def write_line(self, line: bytes) -> None:
        """Append one already-serialized JSON object (no trailing newline)."""
        self.write_block(line + b"\n", 1)

    def write_block(self, block: bytes, records: int) -> None:
        """Append ``records`` complete, newline-terminated JSON lines at once (the fast path)."""
        if self.closed:
            raise ValueError(f"write to a closed writer ({self.loc.uri})")
        self._buf += block
        self.records += records
        self.bytes += len(block)
        if len(self._buf) >= FLUSH_BYTES:
            self._flush()

    def _flush(self) -> None:
        if not self._buf:
            return
        data = bytes(self._buf)
        self._buf.clear()
        self._sink.write(self._cobj.compress(data) if self._cobj is not None else data)

    def commit(self) -> None:
        if self.closed:
            return
        try:
            self._flush()
            if self._cobj is not None:
                self._sink.write(self._cobj.flush())
        except BaseException:
            self.abort()
            raise
        self.closed = True
        self._sink.commit()

    def abort(self) -> None:
        self.closed = True
        self._buf.clear()
        self._sink.abort()


class SyncRecordWriter(Protocol):
    def write_many(self, records: Iterable[Mapping[str, Any]]) -> None: ...
    def commit(self) -> None: ...
    def abort(self) -> None: ...


class AsyncWriter:
    """Async twin of a sync writer: records are buffered on the event loop and handed to a thread
    in blocks, so serialization, compression and uploads never block the loop.

    ``async with dir.writer() as w: await w.write(record)``; an exception in the block aborts. Any
    number of tasks may write into one writer at once (an in-place job's samples do).
    ``write_many`` hands a whole list to the thread at once (one hop per chunk of a shard job).
    """

    BLOCK = 512

    def __init__(self, sync: SyncRecordWriter) -> None:
        self.sync = sync
        self._pending: list[Mapping[str, Any]] = []
        # The sync writer (one zstd stream, one upload) is not thread-safe, and tasks sharing this
        # writer drain at once: blocks go to the thread one at a time, each taken off ``_pending``
        # under the lock so they keep the records' order; commit and abort wait their turn too.
        self._lock = asyncio.Lock()

    async def write(self, record: Mapping[str, Any]) -> None:
        self._pending.append(record)
        if len(self._pending) >= self.BLOCK:
            async with self._lock:
                await self._drain(self.BLOCK)

    async def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Queue ``records`` (in order) and, from ``BLOCK`` pending on, write them all in one thread
        call: the caller's list is in memory already, so a chunk costs the loop one hop."""
        self._pending.extend(records)
        if len(self._pending) >= self.BLOCK:
            async with self._lock:
                await self._drain(self.BLOCK)

    async def _drain(self, at_least: int = 1) -> None:
        """Write what is pending as one block, unless an earlier drain took it meanwhile (hold the lock)."""
        if len(self._pending) >= at_least:
            block, self._pending = self._pending, []
            await in_thread(self.sync.write_many, block)

    async def commit(self) -> None:
        async with self._lock:
            try:
                await self._drain()
            except BaseException:
                await in_thread(self.sync.abort)
                raise
            await in_thread(self.sync.commit)

    async def abort(self) -> None:
        self._pending = []  # drains queued on the lock find nothing left to write
        async with self._lock:
            self._pending = []
            await in_thread(self.sync.abort)

    async def __aenter__(self) -> AsyncWriter:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            await self.commit()
        else:
            await self.abort()


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """``asyncio.to_thread``, except that a cancelled caller still waits for the thread to finish
    before the cancellation goes on: a task cancelled mid-drain keeps the writer's lock until the
    sync writer is free again, so an abort or the next block never runs alongside it (and a reader
    cancelled mid-read never closes its file under the thread still reading it)."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(task)
    finally:
        while not task.done():  # a second cancellation must not end the wait either
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({task})
