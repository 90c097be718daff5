"""Ids repeated across round 0's byte ranges, found in bounded memory.

A range's job validates its own lines, so an id twice in one range is rejected there; an id in two
ranges is not (no job sees both). Round 0's close finds those: the job that reads a range writes,
beside its completion manifest and before it, ``<shard>.id-hashes.bin``
(:class:`~airflow_batchinfer.storage.id_hash_files.HashWriter`): each kept record's id hashed
(16-byte BLAKE2b of the id's text, :func:`~airflow_batchinfer.storage.records.id_text`: ``1`` and
``"1"`` are one id) with its line in the range, sorted (an external sort: at most
:data:`~airflow_batchinfer.storage.id_hash_files.SPILL_HASHES` entries are held, the rest spilled to
sorted runs on local disk). The file depends only on the range, so two attempts of a job write the
same bytes (atomically), and the close writes it itself, reading the range, only when no job did (a
range no job read to its end, or a run started before jobs wrote it). The files are merged with
:func:`heapq.merge`, in groups of at most :data:`FAN_IN` (open files and memory are bounded
whatever the number of ranges); a hash found in two ranges is confirmed by its real ids (a hash
collision never rejects a record): every matched place is spilled sorted by range and line
(:class:`_Sorted`), each range holding one is read once, front to back, for the records at those
lines only, and those records, sorted back into hash order, are compared one hash at a time. So the
input is read at most once, whatever the number of matches, in bounded memory. Each confirmed
repeat is spilled per shard (:class:`Repeats`): the close then handles one shard's repeats at a
time. What grows with the repeats (the matched places, the records read for them, the confirmed
repeats) spills into a :class:`SpillDir` under the run root, on its store: an input's repeats take
the run's own storage, never the Airflow worker's temp disk. A range that cannot be read to its end
(a corrupt Parquet row group or zstd frame, a part changed or gone: its job failed there, so its
shard is quarantined) is hashed but for the pieces it cannot read: the ids its ``failed/`` record
accounts for.

The hash files' format, their writing and their matching (hashes held by more than one range):
:mod:`~airflow_batchinfer.storage.id_hash_files`. Ids and lines are the input's: with a fan-out
(:mod:`~airflow_batchinfer.storage.fan_out`) a line's rows share its entry, and the close drops every row of
a repeated line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import heapq
import itertools
import logging
import os
import posixpath
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import IO, Any

import orjson

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.storage.id_hash_files import (
    HASH,
    MAGIC,
    SPILL_HASHES,
    read_lines,
    shared_hashes,
    write_hashes,
)
from airflow_batchinfer.storage.lines import RAW_PREFIX
from airflow_batchinfer.storage.location import Location, StorageOptions, join, resolve
from airflow_batchinfer.storage.ranges import DiscardRejects, RangeRecordReader, read_range
from airflow_batchinfer.storage.records import id_text
from airflow_batchinfer.storage.shard_ref import RangeRef

log = logging.getLogger("airflow_batchinfer.storage")

TAGGED = struct.Struct(f">{HASH}sIQ")  # an entry with the index of its range (merges, confirmation)
PLACE = struct.Struct(f">IQ{HASH}s")  # a matched place: range index, line in the range, hash
LENGTH = struct.Struct(">I")  # of each entry in a spilled run of variable-length entries
SORT_BYTES = 32 << 20  # bytes of entries an external sort holds before it spills a sorted run
REPEATS_BATCH = 10_000  # confirmed repeats handed to Repeats (spilled per shard) at a time
REJECTS_SUFFIX = ".repeated-ids.jsonl.zst"  # rejects/<shard>…: a shard's rejected repeats
SPILL_READ_BLOCK = 1 << 20  # bytes an object store reads ahead per open spilled file


def rejects_uri(rejects_dir: str, shard_id: str) -> str:
    """Where the run's ``rejects/`` holds the repeats rejected from one shard."""
    return join(rejects_dir, shard_id + REJECTS_SUFFIX)


@dataclass(frozen=True)
class Repeat:
    """A later occurrence of an id that an earlier range holds: where the id stays (its first line)
    and the line it repeats on (lines of the whole input, 1-based), with the record's JSON (cut to
    :data:`~airflow_batchinfer.storage.lines.RAW_PREFIX` bytes, as an oversized line's)."""

    id: Any
    first_shard: str
    first_line: int
    shard: str
    line: int
    line_in_range: int
    raw: str = ""
    # A part input's: the part the repeat is in, and its line there (when its piece starts the part)
    part: str | None = None
    line_in_part: int | None = None

    def reject_row(self, source: str, id_field: str) -> dict[str, Any]:
        """Its row in ``rejects/``: shaped as a bad line's, plus the id (the id accounting reads it)."""
        where = {} if self.line_in_part is None else {"line_in_part": self.line_in_part}
        return {
            "source": self.part or source,
            "line_no": self.line,
            "error": f"id {self.id!r} repeated (first at line {self.first_line})",
            "raw": self.raw,
            "shard_id": self.shard,
            "line_in_range": self.line_in_range,
            "first_shard_id": self.first_shard,
            **where,
            id_field: self.id,
        }


def _raw(record: Mapping[str, Any]) -> str:
    return orjson.dumps(record)[:RAW_PREFIX].decode("utf-8", errors="ignore")


# a matched place's range index, line in the range, id, JSON and (a part input's) part and line there
Found = tuple[int, int, Any, str, str | None, int | None]


def confirm(found: Iterable[Found], shard_ids: Sequence[str], first_lines: Sequence[int]) -> list[Repeat]:
    """The real repeats among the records at one hash's places. The lowest line of an id stays;
    every later one (in another range) is a repeat, in line order."""
    seen: dict[str, list[Found]] = {}  # id text -> its places: two ids of one hash are a collision
    for place in found:
        seen.setdefault(id_text(place[2]), []).append(place)
    repeats: list[Repeat] = []
    for places in seen.values():
        if len({p[0] for p in places}) < 2:
            continue  # a hash collision, or one range's own (its job rejected the second)
        (i0, l0, *_), *later = sorted(places, key=lambda p: (p[0], p[1]))
        for i, line, value, raw, part, part_line in later:  # its own id: of one text as the first's
            first, at = first_lines[i0] + l0, first_lines[i] + line
            repeats.append(Repeat(value, shard_ids[i0], first, shard_ids[i], at, line, raw, part, part_line))
    return sorted(repeats, key=lambda r: r.line)


class SpillDir:
    """A directory for spilled files on any store (``uri`` with ``so``: the run root's), each
    written whole once and read back front to back. :meth:`clear` removes it whole (the close clears
    it first too: a killed close's spill goes with the next)."""

    def __init__(self, uri: str, so: StorageOptions | None) -> None:
        self.loc: Location = resolve(uri, so)
        self._next = 0

    def write(self, name: str, data: bytes) -> str:
        """A new file ``<name>-<n>`` holding ``data``; its path."""
        self._next += 1
        path = posixpath.join(self.loc.path, f"{name}-{self._next:06d}")
        if self.loc.is_local:
            os.makedirs(self.loc.path, exist_ok=True)
        with self.loc.fs.open(path, "wb") as f:
            f.write(data)
        return path

    def open(self, path: str) -> IO[bytes]:
        return self.loc.fs.open(path, "rb", block_size=SPILL_READ_BLOCK)  # type: ignore[no-any-return]

    def remove(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.loc.fs.rm(path)

    def clear(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.loc.fs.rm(self.loc.path, recursive=True)


class _Sorted:
    """Byte strings sorted in bounded memory: at most :data:`SORT_BYTES` (and :data:`SPILL_HASHES`
    entries) held, the rest spilled to sorted runs in ``spill`` (each entry length-prefixed); read
    back merged, once (one open file per run)."""

    def __init__(self, spill: SpillDir, name: str) -> None:
        self._spill_dir, self._name = spill, name
        self._held: list[bytes] = []
        self._bytes = 0
        self._runs: list[str] = []
        self._open: list[IO[bytes]] = []

    def add(self, entry: bytes) -> None:
        self._held.append(entry)
        self._bytes += len(entry)
        if self._bytes >= SORT_BYTES or len(self._held) >= SPILL_HASHES:  # small entries: by count
            self._spill()

    def _spill(self) -> None:
        self._held.sort()
        self._runs.append(
            self._spill_dir.write(self._name, b"".join(LENGTH.pack(len(e)) + e for e in self._held))
        )
        self._held, self._bytes = [], 0

    def __iter__(self) -> Iterator[bytes]:
        self._held.sort()
        self._open = [self._spill_dir.open(run) for run in self._runs]
        return heapq.merge(self._held, *(_entries(run) for run in self._open))

    def close(self) -> None:
        self._held = []
        for f in self._open:
            f.close()
        for run in self._runs:
            self._spill_dir.remove(run)
        self._open, self._runs = [], []


def _entries(run: IO[bytes]) -> Iterator[bytes]:
    while head := run.read(LENGTH.size):
        yield run.read(LENGTH.unpack(head)[0])


class Repeats:
    """Confirmed repeats, spilled per shard of the later occurrence (a file per shard and batch) into
    ``spill``, so the close holds one shard's at a time, never the whole input's. Without ``spill``:
    none (a round, or an input, without ranges)."""

    def __init__(self, spill: SpillDir | None = None) -> None:
        self._spill = spill
        self._files: dict[str, list[str]] = {}
        self.count = 0

    @property
    def shards(self) -> set[str]:
        return set(self._files)

    def add(self, found: Iterable[Repeat]) -> None:
        by_shard: dict[str, list[Repeat]] = {}
        for x in found:
            by_shard.setdefault(x.shard, []).append(x)
        if by_shard and self._spill is None:
            raise ValueError("Repeats without a spill directory hold none")
        for sid, rows in by_shard.items():
            assert self._spill is not None
            data = b"".join(orjson.dumps(dataclasses.astuple(x)) + b"\n" for x in rows)
            name = "repeats-" + hashlib.sha256(sid.encode()).hexdigest()[:32]
            self._files.setdefault(sid, []).append(self._spill.write(name, data))
            self.count += len(rows)

    def of(self, shard_id: str) -> list[Repeat]:
        """The repeats in one shard, in line order (none: ``[]``)."""
        rows: list[Repeat] = []
        for path in self._files.get(shard_id, ()):
            assert self._spill is not None
            with self._spill.open(path) as f:
                rows += (Repeat(*orjson.loads(line)) for line in f)
        return sorted(rows, key=lambda x: x.line)

    def close(self) -> None:
        if self._spill is not None:
            self._spill.clear()
        self._files = {}

    def __enter__(self) -> Repeats:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ------------------------------------------------------------------------------- round 0's ranges
def _range_hashes(
    shard: RangeRef, uri: str, id_field: str | None, assign_ids: bool, so: StorageOptions | None
) -> int:
    """The range's line count, from its hash file, written first if missing (reading the range)."""
    lines = read_lines(uri, so)
    if lines is None:  # no job read the range to its end (or it ran before jobs wrote the file)
        reader = read_range(
            shard,
            id_field=id_field,
            assign_ids=assign_ids,
            rejects=DiscardRejects(),
            storage_options=so,
            expand=False,  # a fan-out's lines, as the job's file holds them
        )
        write_hashes(uri, _lines_of(reader), lambda: reader.stats.lines, so)
        for lost in reader.unreadable:  # its job failed there too: it is quarantined
            log.warning(
                "shard %s: %s cannot be read (%s): its id hashes hold the lines read",
                shard.shard_id,
                lost.describe(),
                lost.error,
            )
        lines = read_lines(uri, so)
    if lines is None:  # just written: another writer replaced it meanwhile, or the store lost it
        raise StorageError(
            f"shard {shard.shard_id}: the id hash file {uri} close just wrote has no valid header "
            f"({MAGIC!r} and a line count): delete it and re-run round 0's close"
        )
    return lines


def _lines_of(reader: RangeRecordReader) -> Iterator[tuple[Any, int]]:
    """Each kept record's id and line in the range, but for pieces it cannot read (a quarantined
    range's: the ids read are what its shard accounts for)."""
    for record in reader.until_unreadable():
        value = record.get(reader.check.id_field or "id")
        yield value, reader.line_of(value)


def _records_at(
    shard: RangeRef,
    wanted: Iterator[tuple[int, bytes]],
    id_field: str | None,
    assign_ids: bool,
    so: StorageOptions | None,
) -> Iterator[tuple[bytes, int, Any, str, str | None, int | None]]:
    """One read of a range, front to back, for the records at the ``wanted`` lines (ascending lines
    in the range, each with its hash): hash, line, id, JSON and (a part input's range) the part and
    the line there. The read stops after the last one."""
    want = next(wanted, None)
    if want is None:
        return
    reader = read_range(
        shard,
        id_field=id_field,
        assign_ids=assign_ids,
        rejects=DiscardRejects(),
        storage_options=so,
        expand=False,  # lines: a fan-out's rows are the close's to drop (run.repeats)
    )
    records = reader.until_unreadable()  # a quarantined range's matched lines lie before that
    try:
        for record in records:
            value = record.get(reader.check.id_field or "id")
            line = reader.line_of(value)
            while want is not None and want[0] < line:  # not a kept record's line now: nothing there
                want = next(wanted, None)
            if want is not None and want[0] == line:
                yield want[1], line, value, _raw(record), *reader.part_line(line)
                want = next(wanted, None)
            if want is None:
                return
    finally:
        records.close()


def find_repeats(
    ranges: Sequence[RangeRef],
    hash_uri: Callable[[str], str],
    *,
    id_field: str | None,
    assign_ids: bool,
    so: StorageOptions | None,
    spill: str,
) -> Repeats:
    """Every later occurrence of an id that an earlier one of round 0's ``ranges`` (in file order)
    holds, with its line and its first (lines of the whole input). ``hash_uri(shard_id)``: a range's
    hash file (its job's; written here, reading the range, when there is none). Hash matches are
    confirmed reading each range that holds one once, for the matched lines only. ``spill``: the
    directory (on ``so``'s store; cleared first, removed as the returned :class:`Repeats` closes) for
    what grows with the repeats: the run root's, not the local temp disk."""
    sids = [s.shard_id for s in ranges]
    uris = [hash_uri(sid) for sid in sids]
    with ThreadPoolExecutor(8) as ex:
        lines = list(
            ex.map(
                lambda p: _range_hashes(p[0], p[1], id_field, assign_ids, so), zip(ranges, uris, strict=True)
            )
        )
    first_lines = [0, *itertools.accumulate(lines)][:-1]
    spilled = SpillDir(spill, so)
    spilled.clear()  # a killed close's
    repeats = Repeats(spilled)
    places, found = _Sorted(spilled, "places"), _Sorted(spilled, "found")
    try:
        # hash order: spilled, sorted by range and line
        for h, at in shared_hashes(uris, so, entries=sum(lines)):
            for i, line in at:
                places.add(PLACE.pack(i, line, h))
        for i, group in itertools.groupby((PLACE.unpack(p) for p in places), key=lambda p: p[0]):
            wanted = ((line, h) for _, line, h in group)
            for h, line, *place in _records_at(ranges[i], wanted, id_field, assign_ids, so):
                found.add(TAGGED.pack(h, i, line) + orjson.dumps(place))
        places.close()
        batch: list[Repeat] = []
        for _, entries in itertools.groupby(found, key=lambda e: e[:HASH]):  # back in hash order
            batch += confirm(map(_found, entries), sids, first_lines)
            if len(batch) >= REPEATS_BATCH:
                repeats.add(batch)
                batch = []
        repeats.add(batch)
    except BaseException:
        repeats.close()
        raise
    finally:
        places.close()
        found.close()
    return repeats


def _found(entry: bytes) -> Found:
    """A read place back from its sort entry: hash, range and line (:data:`TAGGED`), [id, JSON, part,
    line in the part]."""
    _, i, line = TAGGED.unpack(entry[: TAGGED.size])
    value, raw, part, part_line = orjson.loads(entry[TAGGED.size :])
    return i, line, value, raw, part, part_line
