"""Reading the pieces of a part input's range shard (:class:`~airflow_batchinfer.storage.shard_ref.Piece`):
each part's version checked before it is read, a Parquet piece's rows as JSON lines, and reject rows
that name the part. The range reader itself is
:class:`~airflow_batchinfer.storage.ranges.RangeRecordReader`."""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.storage.file_version import same_version, source_version
from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.reader import RecordSink
from airflow_batchinfer.storage.records import Record
from airflow_batchinfer.storage.shard_ref import Piece
from airflow_batchinfer.storage.validate import RowBlock

# Rows of a Parquet piece per block: what the validator, and the memory of wide rows, hold at once
PARQUET_BATCH_ROWS = 1024


def check_piece(part: JsonlFile, piece: Piece, shard_id: str) -> int:
    """The part's size, refusing a part that changed or went away since planning: its spans would not
    be the plan's."""
    try:
        info = part.info()
        now = source_version(info)
    except FileNotFoundError:
        raise StorageError(
            f"shard {shard_id}: part {piece.uri} of the input is gone since the run was planned. Remedy: "
            "restore it, or start a new run (another run root) over the input as it is now"
        ) from None
    if not same_version(piece.version, now):
        raise StorageError(
            f"shard {shard_id}: part {piece.uri} of the input changed since the run was planned (planned "
            f"for version {piece.version}, now {now}), so the spans planned in it may no longer start "
            "at a line or a row group. Remedy: keep an input's parts unchanged while its run lives (add "
            "new parts under another prefix), or start a new run (another run root) over it"
        )
    return int(info.get("size") or 0)


@dataclass(frozen=True)
class At:
    """The piece a range is reading: its part's path under the input's root (``name``), the
    validator's line and byte offset before it, and for a Parquet piece the file's row number of
    each of its row groups' first row, then of the row after them (``starts``)."""

    piece: Piece
    name: str
    line: int
    offset: int
    starts: tuple[int, ...] | None = None

    def part_line(self, line: int) -> int | None:
        """The range's ``line`` as the line of the part (a Parquet part: its row, from 1), when known:
        a byte-range piece that does not start its part does not know the lines before it."""
        if self.starts is not None:
            return self.starts[0] + line - self.line
        return line - self.line if self.piece.whole else None

    def where(self, row: Record) -> Record:
        """A bad line's reject row, naming the part: ``source``, ``line_in_part`` (see
        :meth:`part_line`), and ``offset`` (the line's decoded bytes after ``part_offset``, the piece's
        first stored byte), or a Parquet row's ``row_group``."""
        line = int(row.get("line_in_range", self.line))
        out: Record = {**row, "source": self.piece.uri}
        if self.starts is not None and self.piece.rows is not None:
            out.pop("offset", None)
            out["row_group"] = (
                self.piece.rows[0]
                + bisect.bisect_right(self.starts, self.starts[0] + line - self.line - 1)
                - 1
            )
        else:
            out["part_offset"] = (self.piece.range or (0, 0))[0]
            if "offset" in out:
                out["offset"] = int(out["offset"]) - self.offset
        if (n := self.part_line(line)) is not None:
            out["line_in_part"] = n
        return out


class PieceRejects:
    """A rejects sink whose rows name the part being read (:meth:`At.where`); ``at()`` says which."""

    def __init__(self, rejects: RecordSink, at: Any) -> None:
        self._rejects, self._at = rejects, at

    def write(self, record: Record) -> None:
        at: At | None = self._at()
        self._rejects.write(record if at is None else at.where(record))


def parquet_piece(
    part: JsonlFile, piece: Piece, size: int, started: Callable[[tuple[int, ...]], None]
) -> Iterator[RowBlock]:
    """A Parquet piece's rows in blocks (:func:`parquet_part_rows` of its row groups)."""
    assert piece.rows is not None
    yield from parquet_part_rows(part, size, piece.rows, started=started)


def parquet_part_rows(
    part: JsonlFile,
    size: int,
    rows: tuple[int, int] | None = None,
    *,
    started: Callable[[tuple[int, ...]], None] | None = None,
    batch_rows: int = PARQUET_BATCH_ROWS,
) -> Iterator[RowBlock]:
    """The rows of a Parquet part's row groups ``rows`` (``None``: all) in blocks
    (:func:`~airflow_batchinfer.storage.parquet_rows.parquet_blocks`); before the first,
    ``started(starts)`` is told their row starts (:attr:`At.starts`, from the footer)."""
    from airflow_batchinfer.storage.parquet_rows import READ_BUFFER, parquet_blocks, row_groups

    with part.open_raw(block_size=READ_BUFFER) as raw:  # seeks to column chunks: no 50 MiB blocks
        groups = row_groups(raw, size, part.uri)
        first, end = rows or (0, len(groups))
        if started is not None:
            before = sum(g.rows for g in groups[:first])
            started(tuple(itertools.accumulate((g.rows for g in groups[first:end]), initial=before)))
        yield from parquet_blocks(raw, (first, end), source=part.uri, batch_rows=batch_rows)
