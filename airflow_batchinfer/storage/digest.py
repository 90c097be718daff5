"""Order-independent digests of sets of ids: the accounting that scales (docs/architecture.md).

An :class:`IdDigest` is a count and a multiset hash: the sum, modulo 2**128, of a 16-byte BLAKE2b
hash of each id. Sums commute, so

* the digest of a file does not depend on the order its rows were written in;
* digests of parts add up to the digest of the whole (``shard_a + shard_b``), so a round's
  invariant is checked from per-file digests in job manifests, in O(shards), without one id in
  memory;
* a lost id, an extra id and a doubled id each change it (a sum, not an XOR: an id twice adds its
  hash twice).

Equal digests mean equal multisets of ids up to a hash collision (2**-128 per comparison); unequal
digests say *that* something differs, and :func:`diff_ids` then says *which* ids, reading the two
sides in a bounded amount of memory.

An id's hash is ``blake2b(canonical, digest_size=16)`` read as a big-endian integer, where
``canonical`` is the id serialized as compact JSON by orjson (``"q1"`` → ``b'"q1"'``, ``7`` →
``b'7'``): the string ``"7"`` and the integer ``7`` are different ids, as they are in the rows.
No key: the digest is a checksum against bugs and lost writes, not against an adversary who
writes the run's files.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import operator
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from airflow_batchinfer.storage.record_file import RecordFile

BITS = 128
MOD = 1 << BITS
HEX_DIGITS = BITS // 4
CHUNK = 65_536  # ids hashed per C-level pass (bounded memory for any iterable)

_blake = functools.partial(hashlib.blake2b, digest_size=BITS // 8)
_digest = operator.methodcaller("digest")
_from_bytes = int.from_bytes  # big-endian (the default since Python 3.11)


def id_bytes(value: Any) -> bytes:
    """The canonical bytes of one id: its compact JSON as orjson writes it (integers beyond 64 bits,
    which orjson refuses and sharding never accepts, as their decimal digits)."""
    if type(value) is int:
        return str(value).encode()
    return orjson.dumps(value)


def id_hash(value: Any) -> int:
    """The 128-bit hash of one id (what an :class:`IdDigest` sums)."""
    return _from_bytes(_blake(id_bytes(value)).digest())


def _sum_hashes(ids: list[Any]) -> int:
    try:  # the common case in C: serialize, hash, convert and add without a Python frame per id
        return sum(map(_from_bytes, map(_digest, map(_blake, map(orjson.dumps, ids)))))
    except TypeError:  # an integer orjson cannot write (JSONEncodeError is a TypeError)
        return sum(map(id_hash, ids))


def _sum_encoded(encoded: list[bytes]) -> int:
    return sum(map(_from_bytes, map(_digest, map(_blake, encoded))))


class IdDigest:
    """The count and order-independent multiset hash of a collection of ids.

    ``add`` / ``add_many`` take id values (``str`` or ``int``, as in the rows); ``add_encoded``
    takes canonical bytes (see :func:`id_bytes` and :class:`LineIds`). ``+`` and ``-`` combine
    digests of disjoint parts; ``to_dict`` / ``from_dict`` are the JSON form manifests carry:
    ``{"count": 3, "sum": "<32 hex digits>"}``.
    """

    __slots__ = ("count", "total")

    def __init__(self, count: int = 0, total: int = 0) -> None:
        self.count = count
        self.total = total % MOD

    @classmethod
    def of(cls, ids: Iterable[Any]) -> IdDigest:
        return cls().add_many(ids)

    def add(self, value: Any) -> IdDigest:
        self.count += 1
        self.total = (self.total + id_hash(value)) % MOD
        return self

    def add_many(self, ids: Iterable[Any]) -> IdDigest:
        it = iter(ids)
        while chunk := list(itertools.islice(it, CHUNK)):
            self.count += len(chunk)
            self.total = (self.total + _sum_hashes(chunk)) % MOD
        return self

    def add_encoded(self, encoded: Iterable[bytes]) -> IdDigest:
        """Add ids given as their canonical bytes (:func:`id_bytes`)."""
        it = iter(encoded)
        while chunk := list(itertools.islice(it, CHUNK)):
            self.count += len(chunk)
            self.total = (self.total + _sum_encoded(chunk)) % MOD
        return self

    def __add__(self, other: IdDigest) -> IdDigest:
        if not isinstance(other, IdDigest):
            return NotImplemented
        return IdDigest(self.count + other.count, self.total + other.total)

    def __sub__(self, other: IdDigest) -> IdDigest:
        if not isinstance(other, IdDigest):
            return NotImplemented
        return IdDigest(self.count - other.count, self.total - other.total)

    def __iadd__(self, other: IdDigest) -> IdDigest:
        if not isinstance(other, IdDigest):
            return NotImplemented
        self.count += other.count
        self.total = (self.total + other.total) % MOD
        return self

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, IdDigest):
            return NotImplemented
        return self.count == other.count and self.total == other.total

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"IdDigest(count={self.count}, sum={self.total:0{HEX_DIGITS}x})"

    def copy(self) -> IdDigest:
        return IdDigest(self.count, self.total)

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "sum": f"{self.total:0{HEX_DIGITS}x}"}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> IdDigest:
        count, total = data.get("count"), data.get("sum")
        if type(count) is not int or not isinstance(total, str) or len(total) != HEX_DIGITS:
            raise ValueError(f"not an id digest: {dict(data)!r} (expected count and {HEX_DIGITS} hex digits)")
        return cls(count, int(total, 16))

    @classmethod
    def maybe(cls, data: Any) -> IdDigest | None:
        """The digest a document holds, or ``None`` where it has none."""
        if not isinstance(data, Mapping):
            return None
        try:
            return cls.from_dict(data)
        except ValueError:
            return None


def total(digests: Iterable[IdDigest | None]) -> IdDigest | None:
    """The sum of ``digests``, or ``None`` when any one is unknown."""
    out = IdDigest()
    for d in digests:
        if d is None:
            return None
        out += d
    return out


class LineIds:
    """The canonical bytes of one row's id, read from its serialized JSON line.

    Rows this package writes usually start with their id (``{"id":"q1",...``): for those a regular
    expression takes the id's bytes as they stand, which are already canonical when the value is
    an integer or a string without escapes. Any other line is parsed. Recompaction uses this to
    digest the rows it copies byte for byte without parsing most of them.
    """

    def __init__(self, id_field: str) -> None:
        self.id_field = id_field
        key = re.escape(orjson.dumps(id_field))
        self._fast = re.compile(rb"\{" + key + rb':("[^"\\\x00-\x1f]*"|0|-?[1-9][0-9]{0,17})[,}]').match

    def __call__(self, line: bytes) -> bytes:
        m = self._fast(line)
        if m is not None:
            return m.group(1)
        value = orjson.loads(line)
        return id_bytes(value.get(self.id_field) if isinstance(value, dict) else None)


# ------------------------------------------------------------------------------------ naming ids
@dataclass
class IdDiff:
    """What two sides hold differently: ``lost`` (expected, not found), ``doubled`` (found more than
    once), ``unexpected`` (found, never expected); each list holds at most ``limit`` ids."""

    expected: IdDigest
    actual: IdDigest
    lost: list[Any] = field(default_factory=list)
    doubled: list[Any] = field(default_factory=list)
    unexpected: list[Any] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.expected == self.actual and not (self.lost or self.doubled or self.unexpected)


IdSource = Callable[[], Iterable[Any]]
"""A way to stream one side's ids, from the start, as often as asked (each pass reads it again)."""


def _bucketed(ids: Iterable[Any], bits: int) -> tuple[IdDigest, list[int], list[int]]:
    n = 1 << bits
    counts, sums = [0] * n, [0] * n
    shift = BITS - bits
    whole = IdDigest()
    it = iter(ids)
    while chunk := list(itertools.islice(it, CHUNK)):
        try:
            hashes = list(map(_from_bytes, map(_digest, map(_blake, map(orjson.dumps, chunk)))))
        except TypeError:
            hashes = list(map(id_hash, chunk))
        for h in hashes:
            b = h >> shift
            counts[b] += 1
            sums[b] += h
        whole.count += len(chunk)
        whole.total = (whole.total + sum(hashes)) % MOD
    return whole, counts, sums


def _in_buckets(ids: Iterable[Any], wanted: set[int], shift: int) -> Counter[Any]:
    found: Counter[Any] = Counter()
    for value in ids:
        if id_hash(value) >> shift in wanted:
            found[_key(value)] += 1
    return found


def _key(value: Any) -> Any:
    return value if isinstance(value, str | int) and not isinstance(value, bool) else repr(value)


def diff_ids(
    expected: IdSource, actual: IdSource, *, limit: int = 20, bits: int = 12, max_buckets: int = 16
) -> IdDiff:
    """Name the ids that differ between two multisets, never holding either side in memory.

    One pass over each side sums the id hashes into ``2**bits`` buckets (by the hash's top bits);
    only buckets whose sums disagree are read again, and of those at most ``max_buckets``, so the
    ids held are about ``max_buckets / 2**bits`` of the larger side whatever its size. The named
    ids are then exact (a bucket is compared id by id); with many differences only some are named.
    """
    exp, exp_counts, exp_sums = _bucketed(expected(), bits)
    act, act_counts, act_sums = _bucketed(actual(), bits)
    out = IdDiff(exp, act)
    if exp == act:
        return out
    bad = [
        b for b in range(1 << bits) if exp_counts[b] != act_counts[b] or (exp_sums[b] - act_sums[b]) % MOD
    ][:max_buckets]
    wanted, shift = set(bad), BITS - bits
    want = _in_buckets(expected(), wanted, shift)
    have = _in_buckets(actual(), wanted, shift)
    out.lost = sorted((i for i, n in want.items() if have[i] < n), key=str)[:limit]
    out.doubled = sorted((i for i, n in have.items() if n > max(want[i], 1)), key=str)[:limit]
    out.unexpected = sorted((i for i in have if i not in want), key=str)[:limit]
    return out


def record_ids(records: Iterable[Mapping[str, Any]], id_field: str) -> Iterator[Any]:
    """The ids of rows (``None`` for a row without one: it still counts)."""
    get = operator.methodcaller("get", id_field)
    return map(get, records)


def _id_lines(file: RecordFile) -> Iterator[bytes]:
    for _, line in file.iter_lines():
        if line and not line.isspace():
            yield line


def file_digest(file: RecordFile, id_field: str) -> IdDigest:
    """The digest of the ids in one JSONL or Parquet file, streamed (an absent file holds none)."""
    try:
        return IdDigest().add_encoded(map(LineIds(id_field), _id_lines(file)))
    except FileNotFoundError:
        return IdDigest()


def file_ids(files: Iterable[RecordFile], id_field: str) -> Iterator[Any]:
    """The ids in JSONL or Parquet files, one at a time (absent files hold none): a side of
    :func:`diff_ids`."""
    line_ids = LineIds(id_field)
    for file in files:
        try:
            yield from map(orjson.loads, map(line_ids, _id_lines(file)))
        except FileNotFoundError:
            continue
