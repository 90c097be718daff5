"""A range's id hash file: written as its job reads the range (:class:`HashWriter`), and matched
with the other ranges' (:func:`shared_hashes`). :mod:`~airflow_batchinfer.storage.id_hashes` finds
round 0's repeated ids with them.

A hash file is ``MAGIC``, the range's line count (8 bytes, big-endian) and its entries: a hash (16-byte
BLAKE2b of the id's text as canonical bytes, :func:`id_hash_bytes`) and the 1-based line of that id in the
range (8 bytes, big-endian), sorted (by hash, then line). At most :data:`SPILL_HASHES` entries are
held while writing one, the rest spilled to sorted runs on local disk.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import heapq
import itertools
import math
import struct
import sys
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import IO, Any

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.storage.atomic import AtomicSink
from airflow_batchinfer.storage.digest import id_bytes
from airflow_batchinfer.storage.location import StorageOptions, join, parent, resolve
from airflow_batchinfer.storage.records import id_text

HASH = 16
MAGIC = b"BIH2"
HEADER = struct.Struct(">4sQ")  # magic, lines read in the range
ENTRY = struct.Struct(f">{HASH}sQ")  # an id's hash and its line in the range (a hash file's entries)
SPILL_HASHES = 1 << 18  # entries held before a sorted run is spilled (24 bytes each, ~17 MiB as objects)
READ = 1 << 16  # bytes per read of a hash file
MATCH_READ = 1 << 20  # bytes per read of a hash file when matching
BUCKET_ENTRIES = 1 << 18  # entries matched at once (~40 MB of sets and words); more: split in buckets
SEGMENT = struct.Struct(">II")  # a bucket's spilled stretch of one file: its range index, its bytes
SUFFIX = ".id-hashes.bin"


def id_hash_bytes(value: Any) -> bytes:
    """The 16-byte hash of one id as text (:func:`~airflow_batchinfer.storage.records.id_text`: ``1``
    and ``"1"`` are one id, so a repeat across ranges; a string id's is
    :func:`~airflow_batchinfer.storage.digest.id_hash`'s bytes)."""
    return hashlib.blake2b(id_bytes(id_text(value)), digest_size=HASH).digest()


def hashes_beside(manifest_uri: str, shard_id: str) -> str:
    """A range's hash file: ``<shard>.id-hashes.bin`` in the folder of its job's manifest."""
    return join(parent(manifest_uri), shard_id + SUFFIX)


# ------------------------------------------------------------------------------ one range's file
def _records(f: IO[bytes], size: int) -> Iterator[bytes]:
    while block := f.read(READ - READ % size):
        for i in range(0, len(block), size):
            yield block[i : i + size]


def _spill(entries: list[bytes], runs: list[IO[bytes]]) -> None:
    run = tempfile.TemporaryFile()  # noqa: SIM115  # closed by HashWriter.abort
    entries.sort()
    run.write(b"".join(entries))
    run.seek(0)
    runs.append(run)
    entries.clear()


class HashWriter:
    """One range's hash file, fed as the range is read (:meth:`add` per kept record) and written at
    :meth:`commit`, atomically; at most :data:`SPILL_HASHES` entries are held in memory."""

    def __init__(self, uri: str, so: StorageOptions | None) -> None:
        self.uri, self.so = uri, so
        self._held: list[bytes] = []
        self._runs: list[IO[bytes]] = []

    def add(self, value: Any, line: int) -> None:
        """One kept record: its id and its 1-based line in the range."""
        self._held.append(ENTRY.pack(id_hash_bytes(value), line))
        if len(self._held) >= SPILL_HASHES:
            _spill(self._held, self._runs)

    def commit(self, lines: int) -> None:
        """Write the sorted entries with ``lines`` (the range's line count) as the file's header."""
        try:
            self._held.sort()
            merged = heapq.merge(self._held, *(_records(r, ENTRY.size) for r in self._runs))
            sink = AtomicSink(resolve(self.uri, self.so))
            try:
                sink.write(HEADER.pack(MAGIC, lines))
                for chunk in iter(lambda: b"".join(itertools.islice(merged, READ // ENTRY.size)), b""):
                    sink.write(chunk)
            except BaseException:
                sink.abort()
                raise
            sink.commit()
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop what was held (a read that stopped early writes no file)."""
        self._held = []
        for run in self._runs:
            run.close()
        self._runs = []


def write_hashes(
    uri: str, entries: Iterable[tuple[Any, int]], lines: Callable[[], int], so: StorageOptions | None
) -> None:
    """Write the hash file of ``entries`` (id, line in the range) to ``uri``, with ``lines()`` (asked
    once ``entries`` is exhausted) as the range's line count."""
    writer = HashWriter(uri, so)
    try:
        for value, line in entries:
            writer.add(value, line)
    except BaseException:
        writer.abort()
        raise
    writer.commit(lines())


def read_lines(uri: str, so: StorageOptions | None) -> int | None:
    """The line count a hash file records, or ``None`` when there is no (valid) file."""
    loc = resolve(uri, so)
    try:
        with loc.fs.open(loc.path, "rb") as f:
            head = f.read(HEADER.size)
    except FileNotFoundError:
        return None
    if len(head) != HEADER.size or head[:4] != MAGIC:
        return None
    return int(HEADER.unpack(head)[1])


# ------------------------------------------------------------------------------------ matching
Places = list[tuple[int, int]]  # (range index, line in the range) of one hash, in file order
Bucket = dict[int, bytes]  # a bucket's entries, per range index (each range's in its order)


def _words(raw: bytes, uri: str) -> array[int]:
    """Entries as unsigned 64-bit words, three per entry: the hash's high and low halves, the line."""
    if len(raw) % ENTRY.size:
        raise StorageError(
            f"the id hash file {uri} ends inside an entry (cut short?). Remedy: delete it and re-run "
            "round 0's close, which writes it again from its range"
        )
    words = array("Q")
    words.frombytes(raw)
    if sys.byteorder == "little":
        words.byteswap()  # stored big-endian
    return words


def _blocks(uri: str, so: StorageOptions | None) -> Iterator[bytes]:
    """A hash file's entries, in blocks of whole entries."""
    loc = resolve(uri, so)
    with loc.fs.open(loc.path, "rb") as f:
        f.seek(HEADER.size)
        while block := f.read(MATCH_READ - MATCH_READ % ENTRY.size):
            yield block


def _buckets(uris: Sequence[str], so: StorageOptions | None, bits: int) -> Iterator[Bucket]:
    """Every file's entries split by the top ``bits`` bits of their hashes, bucket by bucket in hash
    order: all in one bucket at ``bits`` 0, else spilled to one local file per bucket first (a file
    is sorted, so its part of a bucket is one stretch of it). Each file is read once."""
    if bits == 0:
        yield {i: b"".join(_blocks(uri, so)) for i, uri in enumerate(uris)}
        return
    shift = 64 - bits
    with contextlib.ExitStack() as stack:
        spills = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(1 << bits)]
        for i, uri in enumerate(uris):
            for block in _blocks(uri, so):
                highs = _words(block, uri)[0::3]
                k = 0
                while k < len(highs):
                    b = highs[k] >> shift
                    end = bisect.bisect_left(highs, (b + 1) << shift, k)
                    part = block[k * ENTRY.size : end * ENTRY.size]
                    spills[b].write(SEGMENT.pack(i, len(part)) + part)
                    k = end
        for spill in spills:
            spill.seek(0)
            parts: dict[int, list[bytes]] = {}
            while head := spill.read(SEGMENT.size):
                i, size = SEGMENT.unpack(head)
                parts.setdefault(i, []).append(spill.read(size))
            yield {i: b"".join(p) for i, p in parts.items()}


def _shared_in(bucket: Bucket, uris: Sequence[str]) -> Iterator[tuple[bytes, Places]]:
    """The hashes of one bucket that more than one file holds, in hash order, with their places.
    Candidates are found by the hashes' high halves, with set operations (no Python loop per
    entry); only theirs are compared whole."""
    words = {i: _words(raw, uris[i]) for i, raw in sorted(bucket.items())}
    seen: set[int] = set()
    shared: set[int] = set()
    for w in words.values():
        mine = set(w[0::3])
        shared.update(mine.intersection(seen))
        seen.update(mine)
    del seen
    if not shared:
        return
    places: dict[bytes, Places] = {}
    for i, w in words.items():
        highs, raw = w[0::3], bucket[i]
        for high in shared.intersection(highs):
            k = bisect.bisect_left(highs, high)
            while k < len(highs) and highs[k] == high:
                places.setdefault(raw[k * ENTRY.size : k * ENTRY.size + HASH], []).append((i, w[3 * k + 2]))
                k += 1
    for h in sorted(places):
        if len({i for i, _ in places[h]}) > 1:
            yield h, places[h]


def shared_hashes(
    uris: Sequence[str], so: StorageOptions | None, *, entries: int | None = None
) -> Iterator[tuple[bytes, Places]]:
    """Each hash found in more than one of the files ``uris``, with its places in them (in range and
    line order), in hash order. Each file is read once; at most about :data:`BUCKET_ENTRIES` entries
    are matched at once (more are split into buckets by the hashes' leading bits). ``entries``: how
    many the files hold at most (their line counts), read from their headers when not given."""
    total = sum(read_lines(u, so) or 0 for u in uris) if entries is None else entries
    bits = (max(math.ceil(total / BUCKET_ENTRIES), 1) - 1).bit_length()
    for bucket in _buckets(uris, so, bits):
        yield from _shared_in(bucket, uris)
