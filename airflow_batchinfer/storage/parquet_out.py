"""One Parquet output file of a run (``output_format: parquet``): written and committed atomically as a
JSONL shard is, read back as the JSON lines it was written from.

The schema is :mod:`~airflow_batchinfer.storage.parquet_schema`'s for the run's pinned input columns
(``inputs``, :mod:`~airflow_batchinfer.storage.parquet_columns`), the same in every file. A file holds
one shard's rows (its size bounded as the shard's is), in row groups of at most
``row_group_rows`` rows and about ``row_group_bytes`` bytes, so neither writing nor reading it holds
more than one row group. Like :class:`~airflow_batchinfer.storage.jsonl_file.JsonlFile`, it offers
``iter_lines`` / ``iter_records`` / ``writer_sync`` / ``writer`` / ``info`` / ``exists``: readers of
a run's files take either (:func:`~airflow_batchinfer.storage.record_file.record_file`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from airflow_batchinfer.storage import confine
from airflow_batchinfer.storage.atomic import AtomicSink
from airflow_batchinfer.storage.location import Location, StorageOptions, resolve
from airflow_batchinfer.storage.parquet_rows import READ_BUFFER
from airflow_batchinfer.storage.parquet_schema import Columns, Inputs, check_schema, lines, pyarrow
from airflow_batchinfer.storage.reader import RecordReader, RecordSink
from airflow_batchinfer.storage.records import OnError
from airflow_batchinfer.storage.writer import AsyncWriter, CommitOnExit

ROW_GROUP_ROWS = 10_000
ROW_GROUP_BYTES = 64 * 1024 * 1024
READ_BATCH = 1024  # rows decoded at a time when reading
COMPRESSION = "zstd"


class _SinkFile:
    """The file object pyarrow writes into: the atomic sink's bytes, never closed by pyarrow (the
    commit closes the sink) and deaf once aborted (a writer collected later writes nothing)."""

    def __init__(self, sink: AtomicSink) -> None:
        self.sink = sink
        self.pos = 0
        self.closed = False
        self.dead = False

    def write(self, data: bytes) -> int:
        if not self.dead:
            self.sink.write(bytes(data))
        self.pos += len(data)
        return len(data)

    def tell(self) -> int:
        return self.pos

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False


class ParquetOutWriter(CommitOnExit):
    """Writes one Parquet output file (a :class:`~airflow_batchinfer.storage.writer.SyncRecordWriter`).

    The file appears at :meth:`commit` (or a clean exit of ``with``): locally a temporary file renamed
    into place, on an object store an upload that completes only then; :meth:`abort` (or an
    exception in the ``with`` block) leaves nothing. ``records`` counts the rows written.
    """

    def __init__(
        self,
        loc: Location,
        *,
        id_field: str = "id",
        inputs: Inputs = (),
        row_group_rows: int = ROW_GROUP_ROWS,
        row_group_bytes: int = ROW_GROUP_BYTES,
    ) -> None:
        if row_group_rows < 1 or row_group_bytes < 1:
            raise ValueError(
                f"row groups must hold >= 1 row and byte, got {row_group_rows}, {row_group_bytes}"
            )
        _, pq = pyarrow()
        self.loc = loc
        self.records = 0
        self.closed = False
        self.max_rows, self.max_bytes = row_group_rows, row_group_bytes
        self._columns = Columns(id_field, inputs)
        self._sink = AtomicSink(loc)
        self._file = _SinkFile(self._sink)
        try:
            self._pq = pq.ParquetWriter(self._file, self._columns.schema, compression=COMPRESSION)
        except BaseException:
            self.abort()
            raise

    def write(self, record: Mapping[str, Any]) -> None:
        self.write_many([record])

    def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        if self.closed:
            raise ValueError(f"write to a closed writer ({self.loc.uri})")
        cols = self._columns
        for record in records:
            cols.add(record)
            self.records += 1
            if cols.rows >= self.max_rows or cols.bytes >= self.max_bytes:
                self._flush()

    def _flush(self) -> None:
        if self._columns.rows:
            self._pq.write_table(self._columns.table(), row_group_size=self.max_rows)

    def commit(self) -> None:
        if self.closed:
            return
        try:
            self._flush()
            self._pq.close()  # the footer
        except BaseException:
            self.abort()
            raise
        self.closed = True
        self._sink.commit()

    def abort(self) -> None:
        self.closed = True
        self._file.dead = True
        self._sink.abort()


class ParquetOutFile:
    """A Parquet output file at ``uri`` (local path, ``s3://...``, any fsspec URI).

    :param id_field: the rows' id field, whose value the ``id`` column holds as text (writing).
    :param inputs: the run's input columns (writing; none: the fixed schema).
    """

    compressed = False
    byte_range = None

    def __init__(
        self,
        uri: str | Location,
        *,
        storage_options: StorageOptions | None = None,
        id_field: str = "id",
        inputs: Inputs = (),
    ) -> None:
        self.loc = uri if isinstance(uri, Location) else resolve(uri, storage_options)
        self.id_field = id_field
        self.inputs = inputs

    @property
    def uri(self) -> str:
        return self.loc.uri

    def __repr__(self) -> str:
        return f"ParquetOutFile({self.uri!r})"

    def exists(self) -> bool:
        return bool(self.loc.fs.isfile(self.loc.path))

    def info(self) -> dict[str, Any]:
        """Size and version facts of the stored file (``size``, plus ``mtime``/``ETag`` as available)."""
        return dict(self.loc.fs.info(self.loc.path))

    def iter_lines(self) -> Iterator[tuple[int, bytes]]:
        """``(row number from 1, the row as a JSON line)``, a batch of rows decoded at a time."""
        _, pq = pyarrow()
        # seeks to column chunks: read-ahead blocks of READ_BUFFER, not the filesystem's (s3fs: 50 MiB)
        with self.loc.fs.open(self.loc.path, "rb", block_size=READ_BUFFER) as raw:
            confine.check_file(raw, self.loc)
            pf = pq.ParquetFile(raw)
            check_schema(pf.schema_arrow, self.uri)
            yield from enumerate(lines(pf.iter_batches(batch_size=READ_BATCH), pf.schema_arrow), 1)

    def iter_line_blocks(self, *, strip_cr: bool = True) -> Iterator[list[bytes]]:
        """The rows as JSON lines, in blocks (one per batch read)."""
        block: list[bytes] = []
        for _, line in self.iter_lines():
            block.append(line)
            if len(block) >= READ_BATCH:
                yield block
                block = []
        if block:
            yield block

    def iter_records(
        self,
        *,
        on_error: OnError | str = "raise",
        rejects: RecordSink | None = None,
        id_field: str | None = None,
        max_id_bytes: int | None = None,
    ) -> RecordReader:
        """The rows as records, for ``for`` or ``async for`` (as :meth:`JsonlFile.iter_records`)."""
        return RecordReader(
            self.uri, self.iter_lines, on_error=on_error, rejects=rejects, id_field=id_field,
            max_id_bytes=max_id_bytes,
        )  # fmt: skip

    def writer_sync(self, **_: Any) -> ParquetOutWriter:
        """A writer that replaces the file atomically when the ``with`` block ends cleanly (a JSONL
        writer's options, such as ``compression_level``, do not apply)."""
        return ParquetOutWriter(self.loc, id_field=self.id_field, inputs=self.inputs)

    def writer(self, **kwargs: Any) -> AsyncWriter:
        """Async twin of :meth:`writer_sync`."""
        return AsyncWriter(self.writer_sync(**kwargs))
