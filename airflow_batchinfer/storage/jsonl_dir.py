"""A directory of shards ``part-NNNNN.jsonl[.zst]`` (or a run's Parquet output files
``part-NNNNN.parquet``): numeric listing and rotating writers."""

from __future__ import annotations

import bisect
import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from airflow_batchinfer.storage.atomic import remove_stale_temps
from airflow_batchinfer.storage.confine import check_path
from airflow_batchinfer.storage.location import Location, StorageOptions, resolve
from airflow_batchinfer.storage.record_file import RecordFile, record_file
from airflow_batchinfer.storage.records import OnError, Record
from airflow_batchinfer.storage.shard_ref import ShardRef
from airflow_batchinfer.storage.writer import (
    DEFAULT_ZSTD_LEVEL,
    AsyncWriter,
    CommitOnExit,
    JsonlWriter,
    serialize,
)

PART_RE = re.compile(r"^part-(\d+)\.(jsonl(\.zst|\.zstd)?|parquet)$", re.IGNORECASE)
JSONL_RE = re.compile(r"^[^.].*\.(jsonl(\.zst|\.zstd)?|parquet)$", re.IGNORECASE)
DEFAULT_RECORDS_PER_SHARD = 20_000
DEFAULT_BYTES_PER_SHARD = 256 * 1024 * 1024
Compression = Literal["zstd", "none"]


@dataclass(frozen=True, order=True)
class Shard:
    """One listed shard file (``size`` is its stored, possibly compressed, size in bytes)."""

    index: int
    name: str
    uri: str
    size: int = field(default=0, compare=False)
    version: str = field(default="", compare=False)  # ETag or mtime: tells a rewritten file apart

    @property
    def shard_id(self) -> str:
        return self.name.split(".", 1)[0]


def shard_name(index: int, compression: Compression) -> str:
    if index < 0:
        raise ValueError(f"shard index must be >= 0, got {index}")
    return f"part-{index:05d}.jsonl" + (".zst" if compression == "zstd" else "")


class JsonlDir:
    """A directory of shards at ``uri`` (local path, ``s3://...``, any fsspec URI).

    Only names matching ``part-N.jsonl[.zst|.zstd]`` or ``part-N.parquet`` are shards; anything else
    (manifests, hidden temporaries of unfinished writes) is ignored by listing and reading.
    """

    def __init__(self, uri: str | Location, *, storage_options: StorageOptions | None = None) -> None:
        self.loc = uri if isinstance(uri, Location) else resolve(uri, storage_options)

    @property
    def uri(self) -> str:
        return self.loc.uri

    def __repr__(self) -> str:
        return f"JsonlDir({self.uri!r})"

    def shards(self) -> list[Shard]:
        """Shards in numeric order (``part-100000`` after ``part-99999``); ``[]`` if the dir is absent."""
        fs, path = self.loc.fs, self.loc.path
        try:
            entries = fs.ls(path, detail=True, refresh=True)
        except FileNotFoundError:
            return []
        out = []
        for entry in entries:
            name = entry["name"].rstrip("/").rsplit("/", 1)[-1]
            m = PART_RE.match(name)
            if m and entry.get("type") != "directory":
                version = str(entry.get("ETag") or entry.get("mtime") or "")
                size = int(entry.get("size") or 0)
                out.append(Shard(int(m.group(1)), name, self.loc.child(name).uri, size, version))
        out.sort()
        return out

    def jsonl_files(self) -> list[RecordFile]:
        """Every visible ``*.jsonl[.zst]`` or ``*.parquet`` file, shard or not (e.g.
        ``results/round00-part-00003...``), in natural name order."""
        try:
            names = [
                n.rstrip("/").rsplit("/", 1)[-1]
                for n in self.loc.fs.ls(self.loc.path, detail=False, refresh=True)
            ]
        except FileNotFoundError:
            return []
        key = lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)]  # noqa: E731
        return [self.file(n) for n in sorted((n for n in names if JSONL_RE.match(n)), key=key)]

    def file(self, name: str) -> RecordFile:
        """The file ``name`` here: Parquet or JSONL by its name."""
        return record_file(self.loc.child(name))

    def iter_records(self, *, on_error: OnError | str = "raise") -> Iterator[Record]:
        """All records of all shards, shard by shard in numeric order (sync)."""
        for shard in self.shards():
            yield from self.file(shard.name).iter_records(on_error=on_error)

    def count_records(self) -> int:
        return sum(1 for _ in self.iter_records())

    def delete_shards(self) -> int:
        """Delete every shard (and local temp leftovers); returns the number of shards deleted."""
        shards = self.shards()
        if shards:
            if self.loc.is_local:  # a job's delete must not follow a swapped link out of its prefixes
                check_path(self.loc.path, self.uri)
            self.loc.fs.rm([self.loc.child(s.name).path for s in shards])
        remove_stale_temps(self.loc)
        return len(shards)

    def writer_sync(
        self,
        *,
        max_records_per_shard: int = DEFAULT_RECORDS_PER_SHARD,
        max_bytes_per_shard: int = DEFAULT_BYTES_PER_SHARD,
        compression: Compression = "zstd",
        compression_level: int = DEFAULT_ZSTD_LEVEL,
        start_index: int | None = None,
    ) -> ShardWriter:
        """A writer that rotates shards; numbering continues after the highest existing ``part-N``."""
        return ShardWriter(
            self,
            max_records_per_shard=max_records_per_shard,
            max_bytes_per_shard=max_bytes_per_shard,
            compression=compression,
            compression_level=compression_level,
            start_index=start_index,
        )

    def writer(self, **kwargs: Any) -> AsyncWriter:
        """Async twin of :meth:`writer_sync` (same arguments); ``.sync.shards_written`` after exit."""
        return AsyncWriter(self.writer_sync(**kwargs))


class ShardWriter(CommitOnExit):
    """Writes records into rotating shards of a :class:`JsonlDir`.

    A shard is closed before the record that would take it past ``max_records_per_shard`` records
    or ``max_bytes_per_shard`` uncompressed bytes; a single record larger than the byte limit gets a
    shard of its own. Shards open only when a record arrives, so no empty shard is ever written.
    Each shard commits atomically; on an exception in the ``with`` block the open shard is discarded
    and the shards already committed stay (``shards_written`` lists them).
    """

    def __init__(
        self,
        directory: JsonlDir,
        *,
        max_records_per_shard: int = DEFAULT_RECORDS_PER_SHARD,
        max_bytes_per_shard: int = DEFAULT_BYTES_PER_SHARD,
        compression: Compression = "zstd",
        compression_level: int = DEFAULT_ZSTD_LEVEL,
        start_index: int | None = None,
    ) -> None:
        if max_records_per_shard < 1:
            raise ValueError(f"max_records_per_shard must be >= 1, got {max_records_per_shard}")
        if max_bytes_per_shard < 1:
            raise ValueError(f"max_bytes_per_shard must be >= 1, got {max_bytes_per_shard}")
        if compression not in ("zstd", "none"):
            raise ValueError(f"compression={compression!r}: expected 'zstd' or 'none'")
        self.dir = directory
        self.max_records = max_records_per_shard
        self.max_bytes = max_bytes_per_shard
        self.compression: Compression = compression
        self.compression_level = compression_level
        self._next_index = start_index
        self._current: JsonlWriter | None = None
        self.shards_written: list[ShardRef] = []

    def write(self, record: Mapping[str, Any]) -> None:
        self.write_lines([serialize(record)])

    def write_many(self, records: Iterable[Mapping[str, Any]]) -> None:
        it = iter(records)
        while block := [serialize(r) for r in itertools.islice(it, 1024)]:  # bounded memory for any iterable
            self.write_lines(block)

    def write_line(self, line: bytes) -> None:
        """Append one already-serialized JSON object (no newline)."""
        self.write_lines([line])

    def write_lines(self, lines: Sequence[bytes]) -> None:
        """Append already-serialized JSON objects (no newlines), rotating shards where limits fall."""
        i, n = 0, len(lines)
        while i < n:
            cur = self._current
            if cur is None or cur.records >= self.max_records:
                self._commit_current()
                cur = self._open_next()
            take = lines[i : i + self.max_records - cur.records]
            block = b"\n".join(take) + b"\n"
            if cur.bytes + len(block) > self.max_bytes:
                budget = self.max_bytes - cur.bytes
                fit = bisect.bisect_right(list(itertools.accumulate(len(x) + 1 for x in take)), budget)
                if fit == 0 and cur.records:
                    self._commit_current()  # the next record would overflow: rotate first
                    continue
                take = take[: max(fit, 1)]  # an oversized record alone gets a shard of its own
                block = b"\n".join(take) + b"\n"
            cur.write_block(block, len(take))
            i += len(take)

    def _open_next(self) -> JsonlWriter:
        if self._next_index is None:
            existing = self.dir.shards()
            self._next_index = existing[-1].index + 1 if existing else 0
        name = shard_name(self._next_index, self.compression)
        self._next_index += 1
        self._current = JsonlWriter(self.dir.loc.child(name), compression_level=self.compression_level)
        return self._current

    def _commit_current(self) -> None:
        cur, self._current = self._current, None
        if cur is None:
            return
        cur.commit()
        self.shards_written.append(
            ShardRef(shard_id=cur.loc.name.split(".", 1)[0], uri=cur.loc.uri, records=cur.records)
        )

    def commit(self) -> None:
        self._commit_current()

    def abort(self) -> None:
        cur, self._current = self._current, None
        if cur is not None:
            cur.abort()
