"""Where a range shard stopped being readable: a corrupt Parquet row group or zstd frame, or a part
changed or gone since planning
(:meth:`~airflow_batchinfer.storage.ranges.RangeRecordReader.until_unreadable`).
Its job failed there and the shard is quarantined; round 0's close, the id hashes and the report's
id check then count the ids read before it, and name the rest by this."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Unreadable:
    """The piece a range could not be read past: its part (the input file, for a one-file input), its
    row groups ``[first, end)`` (Parquet) or stored bytes ``[start, end)``, the ``records`` of it not
    read (a Parquet piece's, from its footer; ``None``: unknown, bytes have no record count) and why."""

    part: str
    row_groups: tuple[int, int] | None
    range: tuple[int, int] | None
    records: int | None
    error: str

    def describe(self) -> str:
        """``<n> records of part <uri> (row groups [a, b))``, for logs and the report."""
        count = "the records" if self.records is None else f"{self.records} records"
        if self.row_groups is not None:
            where = f"row groups [{self.row_groups[0]}, {self.row_groups[1]})"
        else:
            where = f"bytes [{(self.range or (0, 0))[0]}, {(self.range or (0, 0))[1]})"
        return f"{count} of part {self.part} ({where})"
