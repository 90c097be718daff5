"""The small reads range planning makes (:mod:`~airflow_batchinfer.storage.range_plan` for one
file, :mod:`~airflow_batchinfer.storage.part_plan` for parts): a sample for bytes per record, the next
line start after a byte offset, and a counter of the bytes read (planning's cost, which bench prints)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, BinaryIO

import zstandard

from airflow_batchinfer.exceptions import CorruptFileError
from airflow_batchinfer.storage.lines import FEED_SIZE, RangeReader
from airflow_batchinfer.storage.shard_ref import RangeRef
from airflow_batchinfer.storage.zstd_frames import Frame

SAMPLE = 256 * 1024  # bytes read from the start to estimate bytes per record
FIRST_PROBE = 4 * 1024  # bytes of the first read looking for the next line start
PROBE = 64 * 1024  # the most bytes per such read (a long line takes several)
PLAN_BLOCK = 256 * 1024  # fsspec block size while planning: small reads stay small


def next_line_start(raw: BinaryIO, pos: int, size: int) -> int:
    """The first line start at or after ``pos`` (``size`` when none), in ranged reads of at most
    :data:`PROBE` bytes."""
    at = pos - 1  # a "\n" just before pos makes pos itself a line start
    probe = FIRST_PROBE  # most lines are short: a small read first, doubling for long ones
    while at < size:
        raw.seek(at)
        chunk = raw.read(probe)
        if not chunk:
            break
        i = chunk.find(b"\n")
        if i >= 0:
            return at + i + 1
        at += len(chunk)
        probe = min(2 * probe, PROBE)
    return size


def sample_rate(head: bytes) -> float:
    """Bytes per record in a decoded sample (a whole-file sample counts a last unterminated line)."""
    lines = head.count(b"\n")
    return max(1.0, len(head) / max(lines, 1))


def zstd_sample(raw: BinaryIO, frame: Frame, source: str) -> tuple[float, float]:
    """(bytes per record, decoded bytes per stored byte) from decoding the start of ``frame`` in
    small pieces (so the stored bytes counted are about those the sample needed)."""
    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    reader = RangeReader(raw, frame.start, frame.end)
    out: list[bytes] = []
    decoded = used = 0
    try:
        while decoded < SAMPLE and (piece := reader.read(FEED_SIZE)):  # small: see FEED_SIZE
            used += len(piece)
            while piece:
                data = dobj.decompress(piece)
                out.append(data)
                decoded += len(data)
                if not dobj.eof:
                    break
                piece, dobj = dobj.unused_data, dctx.decompressobj()
    except zstandard.ZstdError as exc:
        raise CorruptFileError(f"{source}: invalid zstd data ({exc}). Regenerate the file.") from exc
    return sample_rate(b"".join(out)), (decoded / used if used else 1.0)


class Counting:
    """A seekable binary file that counts the bytes read through it (planning's cost, for bench);
    anything else (``tell``, ``closed``: what pyarrow asks of a Parquet file) is the file's."""

    def __init__(self, raw: BinaryIO) -> None:
        self._raw = raw
        self.bytes_read = 0

    def seek(self, pos: int, whence: int = 0) -> int:
        return self._raw.seek(pos, whence)

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self.bytes_read += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


@dataclass(frozen=True)
class RangePlan:
    """Shards of one source as byte ranges, and what planning read to make them."""

    shards: list[RangeRef]
    bytes_read: int
    seconds: float
    notices: list[str] = field(default_factory=list)  # what its caller should tell (logged too)
