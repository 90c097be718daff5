"""One JSONL file (optionally ``.jsonl.zst``) on any storage: streaming reads, atomic writes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, BinaryIO

from airflow_batchinfer.storage import confine
from airflow_batchinfer.storage.lines import RangeReader, is_zstd, iter_chunks, iter_line_blocks, iter_lines
from airflow_batchinfer.storage.location import Location, StorageOptions, resolve
from airflow_batchinfer.storage.reader import RecordReader, RecordSink
from airflow_batchinfer.storage.records import OnError
from airflow_batchinfer.storage.writer import DEFAULT_ZSTD_LEVEL, AsyncWriter, JsonlWriter

RANGE_BLOCK = 4 * 1024 * 1024


class JsonlFile:
    """A JSONL file at ``uri``. Records stream one at a time; memory does not grow with the file.

    :param uri: plain path, ``file://``, ``s3://bucket/key`` or any fsspec URI. A name ending in
        ``.zst``/``.zstd`` (any case) is zstd-compressed.
    :param storage_options: fsspec options for remote storage (credentials, ``endpoint_url``).
    :param byte_range: ``(start, end)``: read only those stored bytes (ranged reads on object stores).
        They must start and end at line starts (plain) or frame starts (zstd): a round-0 range shard
        (:mod:`airflow_batchinfer.storage.ranges`). Writing ignores it.
    :param max_line_bytes: reads hold at most this many bytes of one line: a longer line comes as an
        :class:`~airflow_batchinfer.storage.lines.OversizedLine` (its first bytes), which record
        readers reject. ``None`` (default): no bound. Input is read with the run's
        ``max_line_bytes`` (sharding, round-0 ranges); the run's own files hold only lines that passed.
    """

    def __init__(
        self,
        uri: str | Location,
        *,
        storage_options: StorageOptions | None = None,
        byte_range: tuple[int, int] | None = None,
        max_line_bytes: int | None = None,
    ) -> None:
        self.loc = uri if isinstance(uri, Location) else resolve(uri, storage_options)
        self.byte_range = byte_range
        self.max_line_bytes = max_line_bytes

    @property
    def uri(self) -> str:
        return self.loc.uri

    @property
    def compressed(self) -> bool:
        return is_zstd(self.loc.path)

    def __repr__(self) -> str:
        rng = f", byte_range={self.byte_range!r}" if self.byte_range else ""
        return f"JsonlFile({self.uri!r}{rng})"

    @contextlib.contextmanager
    def open_raw(self, *, block_size: int | None = None) -> Iterator[BinaryIO]:
        """The stored bytes (of ``byte_range`` only, when set), not decompressed. A local file read by
        a worker's job is checked against the job's prefixes once opened (:mod:`.confine`).
        ``block_size``: a remote file's read-ahead block, for seeking readers (a Parquet file's column
        chunks) where the filesystem's default (s3fs: 50 MiB) would fetch far more than is read; a
        local file ignores it."""
        if self.byte_range is None:
            sized = {} if block_size is None else {"block_size": block_size}
            with self.loc.fs.open(self.loc.path, "rb", **sized) as raw:
                confine.check_file(raw, self.loc)
                yield raw
            return
        start, end = self.byte_range
        # fsspec reads ahead a block past each miss: a block of at most RANGE_BLOCK bounds the over-read
        with self.loc.fs.open(self.loc.path, "rb", block_size=min(RANGE_BLOCK, max(end - start, 1))) as raw:
            confine.check_file(raw, self.loc)
            yield RangeReader(raw, start, end)  # type: ignore[misc]

    def exists(self) -> bool:
        return bool(self.loc.fs.isfile(self.loc.path))

    def info(self) -> dict[str, Any]:
        """Size and version facts of the stored file (``size``, plus ``mtime``/``ETag`` as available)."""
        return dict(self.loc.fs.info(self.loc.path))

    def iter_lines(self) -> Iterator[tuple[int, bytes]]:
        """Raw ``(line_no, bytes)`` pairs, decompressed, without terminators, blank lines included."""
        with self.open_raw() as raw:
            chunks = iter_chunks(raw, zstd=self.compressed, source=self.uri)
            yield from iter_lines(chunks, max_line=self.max_line_bytes)

    def iter_line_blocks(self, *, strip_cr: bool = True) -> Iterator[list[bytes]]:
        """Raw lines in blocks (one per decoded chunk): the fast path for bulk copies."""
        with self.open_raw() as raw:
            chunks = iter_chunks(raw, zstd=self.compressed, source=self.uri)
            yield from iter_line_blocks(chunks, strip_cr=strip_cr, max_line=self.max_line_bytes)

    def iter_records(
        self,
        *,
        on_error: OnError | str = "raise",
        rejects: RecordSink | None = None,
        id_field: str | None = None,
        max_id_bytes: int | None = None,
    ) -> RecordReader:
        """The records, for ``for`` (sync) or ``async for``. See :class:`RecordReader` for ``on_error``;
        ``max_id_bytes`` bounds the ids (with ``id_field``)."""
        return RecordReader(
            self.uri,
            self.iter_lines,
            on_error=on_error,
            rejects=rejects,
            id_field=id_field,
            max_id_bytes=max_id_bytes,
        )

    def writer_sync(self, *, compression_level: int = DEFAULT_ZSTD_LEVEL) -> JsonlWriter:
        """A writer that replaces the file atomically when the ``with`` block ends cleanly."""
        return JsonlWriter(self.loc, compression_level=compression_level)

    def writer(self, *, compression_level: int = DEFAULT_ZSTD_LEVEL) -> AsyncWriter:
        """Async twin of :meth:`writer_sync`: ``async with f.writer() as w: await w.write(r)``."""
        return AsyncWriter(self.writer_sync(compression_level=compression_level))
