"""Record readers: strict parsing, an ``on_error`` policy, counts, and both ``for`` and ``async for``."""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator
from dataclasses import asdict, dataclass
from typing import Any, Protocol

from airflow_batchinfer.exceptions import MalformedRecordError
from airflow_batchinfer.storage.id_scan import SCAN_FROM, oversized_id
from airflow_batchinfer.storage.lines import OversizedLine
from airflow_batchinfer.storage.records import (
    OnError,
    Record,
    RecordError,
    check_on_error,
    parse_record,
    record_id,
    reject_row,
)
from airflow_batchinfer.storage.writer import in_thread


class RecordSink(Protocol):
    def write(self, record: Record) -> None: ...


@dataclass
class ReadStats:
    """What a read saw. ``lines == records + blank + skipped + quarantined``: nothing goes uncounted."""

    lines: int = 0
    records: int = 0
    blank: int = 0
    skipped: int = 0
    quarantined: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


class ErrorPolicy:
    """Applies ``on_error`` to unusable lines of one source and counts every line's fate.

    ``raise`` names the file and line; ``skip`` counts and drops; ``quarantine`` writes a
    ``{source, line_no, error, raw}`` row to ``rejects`` and counts it.
    """

    def __init__(
        self, source: str, on_error: OnError | str = "raise", rejects: RecordSink | None = None
    ) -> None:
        self.source = source
        self.on_error = check_on_error(on_error)
        if self.on_error == "quarantine" and rejects is None:
            raise ValueError("on_error='quarantine' needs a rejects sink (e.g. JsonlDir(...).writer_sync())")
        self._rejects = rejects
        self.stats = ReadStats()

    def bad_line(self, line_no: int, raw: bytes, reason: str, where: Record | None = None) -> None:
        """``where``: extra fields for the reject row (a range shard's ``offset``, ``line_in_range``)."""
        if self.on_error == "raise":
            raise MalformedRecordError(self.source, line_no, reason)
        if self.on_error == "skip":
            self.stats.skipped += 1
        else:
            assert self._rejects is not None
            row = reject_row(self.source, line_no, reason, raw)
            self._rejects.write({**row, **where} if where else row)
            self.stats.quarantined += 1


class RecordReader:
    """Iterates the records of one JSONL source, applying an :class:`ErrorPolicy` to bad lines.

    Blank lines are counted and skipped; ``stats`` accounts for every line. Use ``for`` in CPU code
    or ``async for`` on an event loop (the file is then read in a thread, a block of records at a time).
    """

    ASYNC_BLOCK = 512

    def __init__(
        self,
        source: str,
        lines: Callable[[], Iterator[tuple[int, bytes]]],
        *,
        on_error: OnError | str = "raise",
        rejects: RecordSink | None = None,
        id_field: str | None = None,
        max_id_bytes: int | None = None,
    ) -> None:
        self.policy = ErrorPolicy(source, on_error, rejects)
        self.stats = self.policy.stats
        self._lines = lines
        self._id_field = id_field
        self._max_id = max_id_bytes

    def __iter__(self) -> Generator[Record, None, None]:
        stats = self.stats
        for line_no, line in self._lines():
            stats.lines += 1
            if type(line) is OversizedLine:  # the lines' source bounds them (JsonlFile.max_line_bytes)
                self.policy.bad_line(line_no, line, line.reason())
                continue
            if not line.strip():
                stats.blank += 1
                continue
            if len(line) > SCAN_FROM and (why := self._oversized_id(line)):  # refused unparsed
                self.policy.bad_line(line_no, line, why)
                continue
            try:
                record = parse_record(line)
                if self._id_field is not None:
                    record_id(record, self._id_field, self._max_id)
            except RecordError as exc:
                self.policy.bad_line(line_no, line, str(exc))
                continue
            stats.records += 1
            yield record

    def _oversized_id(self, line: bytes) -> str | None:
        if self._id_field is None or self._max_id is None:
            return None
        return oversized_id(line, self._id_field, self._max_id)

    async def __aiter__(self) -> AsyncIterator[Record]:
        async for block in self.blocks(self.ASYNC_BLOCK):
            for record in block:
                yield record

    async def blocks(self, size: int, *, first: int | None = None) -> AsyncGenerator[list[Record], None]:
        """The records in lists of ``size`` (the last may be shorter; the first has ``first``, if
        given), each read, decompressed and parsed in a thread: an event loop pays one hop per
        block, nothing per record. A consumer cancelled mid-block waits for that block's thread
        before the file closes."""
        if size < 1 or (first is not None and first < 1):
            raise ValueError(f"block sizes must be >= 1, got {size} (first {first})")
        it = iter(self)
        try:
            n = first or size
            while block := await in_thread(_take, it, n):
                yield block
                n = size
        finally:
            it.close()


def _take(it: Iterator[Any], n: int) -> list[Any]:
    return list(itertools.islice(it, n))
