"""Recompaction: rewrite a directory of small shards (a round's rejected set) into full shards.

The output is planned before anything is written: with per-source record counts (given, or counted
in a fast parallel pass that only decompresses), output shard ``j`` holds global records
``[j*R, (j+1)*R)`` in source order. Contiguous groups of output shards are then written by parallel
workers, each reading only the source ranges it needs. The result is identical to a serial pass,
every shard but the last is full, and lines pass through byte for byte.

With ``id_field``, each output shard's reference carries ``ids``, the count and order-independent
digest of its ids (:class:`~airflow_batchinfer.storage.digest.IdDigest`), and the result their sum:
the round's close compares that sum with the digests the jobs recorded for the rejected files it
read, so a line lost or doubled here is caught without reading a row again.
"""

from __future__ import annotations

import bisect
import itertools
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from airflow_batchinfer.exceptions import StorageError
from airflow_batchinfer.storage.digest import CHUNK, IdDigest, LineIds
from airflow_batchinfer.storage.jsonl_dir import (
    DEFAULT_BYTES_PER_SHARD,
    DEFAULT_RECORDS_PER_SHARD,
    Compression,
    JsonlDir,
    Shard,
    shard_name,
)
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.storage.manifest import OutputManifest, claim_output, write_manifest
from airflow_batchinfer.storage.record_file import RecordFile
from airflow_batchinfer.storage.shard_ref import ShardRef
from airflow_batchinfer.storage.writer import DEFAULT_ZSTD_LEVEL, JsonlWriter

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class RecompactResult:
    shards: list[ShardRef]
    records: int
    sources: int
    reused: bool = False
    seconds: float = field(default=0.0, compare=False)
    ids: dict[str, Any] | None = None  # the digest of every id written (with ``id_field``)

    def as_dict(self) -> dict[str, Any]:
        out = {
            "shards": [s.to_json() for s in self.shards],
            "records": self.records,
            "sources": self.sources,
            "reused": self.reused,
        }
        if self.ids is not None:
            out["ids"] = self.ids
        return out


def _records(file: RecordFile) -> Iterator[bytes]:
    for _, line in file.iter_lines():
        if line and not line.isspace():
            yield line


def recompact(
    src: str,
    dst: str,
    *,
    records_per_shard: int = DEFAULT_RECORDS_PER_SHARD,
    max_bytes_per_shard: int = DEFAULT_BYTES_PER_SHARD,
    workers: int = 4,
    counts: Mapping[str, int] | None = None,
    compression: Compression = "zstd",
    compression_level: int = DEFAULT_ZSTD_LEVEL,
    storage_options: StorageOptions | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    id_field: str | None = None,
) -> RecompactResult:
    """Rewrite the shards of ``src`` into full shards of ``records_per_shard`` under ``dst``.

    :param workers: parallel writers (threads: zstd and storage I/O release the GIL; on S3 the
        parallel uploads hide latency).
    :param counts: records per source shard, keyed by shard id (``part-00003``) or name, when known
        (job manifests carry them); sources not listed are counted.
    :param overwrite: replace shards in ``dst`` written by another run (see :func:`shard_dataset`).
    :param id_field: digest each output shard's ids (its ref's ``ids``; the result's ``ids`` is
        their sum). Most rows this package writes start with their id and are not parsed for it.
    """
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if records_per_shard < 1:
        raise ValueError(f"records_per_shard must be >= 1, got {records_per_shard}")
    started = time.monotonic()
    src_dir = JsonlDir(src, storage_options=storage_options)
    out = JsonlDir(dst, storage_options=storage_options)
    sources = src_dir.shards()
    fingerprint = {
        "source": src_dir.uri,
        "shards": [[s.name, s.size, s.version] for s in sources],
        "records_per_shard": records_per_shard,
        "max_bytes_per_shard": max_bytes_per_shard,
        "compression": compression,
    }
    # (``id_field`` is not part of the fingerprint: an identical output is reused as it is, its
    # ``ids`` recorded when it was made with an id field.)
    done = claim_output(out, kind="recompact", fingerprint=fingerprint, overwrite=overwrite)
    if done is not None:
        return RecompactResult(done.files(), done.records or 0, done.sources or 0, reused=True, ids=done.ids)
    files = [src_dir.file(s.name) for s in sources]
    sizes = _source_sizes(files, sources, counts or {}, workers)
    plan = _Plan(
        files=files,
        sizes=sizes,
        starts=[0, *itertools.accumulate(sizes)],
        out=out,
        records_per_shard=records_per_shard,
        max_bytes_per_shard=max_bytes_per_shard,
        compression=compression,
        compression_level=compression_level,
        line_ids=LineIds(id_field) if id_field is not None else None,
        progress=progress,
    )
    written = _write_all(plan, workers)
    produced = sum(d.records for d in written)
    if produced != plan.total:
        raise StorageError(
            f"recompact wrote {produced} records but planned {plan.total}: the sources under {src_dir.uri} "
            "changed while being read; re-run the recompaction"
        )
    ids = _ids_of(written) if plan.line_ids is not None else None
    result = RecompactResult(written, plan.total, len(sources), seconds=time.monotonic() - started, ids=ids)
    write_manifest(
        out, OutputManifest(kind="recompact", state="complete", fingerprint=fingerprint, **result.as_dict())
    )
    return result


def _source_sizes(
    files: list[RecordFile], sources: list[Shard], known: Mapping[str, int], workers: int
) -> list[int]:
    """Each source's record count: ``known`` (by shard id or name), else counted, in parallel."""

    def count(i_shard: tuple[int, Shard]) -> int:
        i, shard = i_shard
        n = known.get(shard.shard_id, known.get(shard.name))
        return n if n is not None else sum(1 for _ in _records(files[i]))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(count, enumerate(sources)))


@dataclass
class _Plan:
    """What every writer of one recompaction shares: the sources and their planned counts, the
    output and its shape, and the state the writers coordinate through."""

    files: list[RecordFile]
    sizes: list[int]
    starts: list[int]  # starts[i]: global offset of source i's first record; the last: the total
    out: JsonlDir
    records_per_shard: int
    max_bytes_per_shard: int
    compression: Compression
    compression_level: int
    line_ids: LineIds | None
    progress: Progress | None
    lock: threading.Lock = field(default_factory=threading.Lock)
    failed: threading.Event = field(default_factory=threading.Event)
    overflow: Iterator[int] = field(init=False)  # byte-limit splits take indexes after the planned ones

    def __post_init__(self) -> None:
        self.overflow = itertools.count(self.planned)

    @property
    def total(self) -> int:
        return self.starts[-1]

    @property
    def planned(self) -> int:
        """Output shards of ``records_per_shard`` (the last one the rest)."""
        return -(-self.total // self.records_per_shard)

    def report(self, n: int, nbytes: int) -> None:
        if self.progress is not None:
            with self.lock:
                self.progress(n, nbytes)

    def lines_from(self, lo: int) -> Iterator[bytes]:
        """The sources' lines from global record ``lo`` on, each source checked against its count."""
        src_i = bisect.bisect_right(self.starts, lo) - 1
        return itertools.chain.from_iterable(
            self._checked(i, lo - self.starts[i] if i == src_i else 0) for i in range(src_i, len(self.files))
        )

    def _checked(self, i: int, skip: int) -> Iterator[bytes]:
        n = skip
        for line in itertools.islice(_records(self.files[i]), skip, None):
            n += 1
            yield line
        if n != self.sizes[i]:  # read to its end: the plan's count must have been right
            raise StorageError(
                f"{self.files[i].uri} holds {n} records but {self.sizes[i]} were planned: the shard changed "
                "while being recompacted, or a wrong count was passed in counts=; re-run the recompaction"
            )


class _OpenShard:
    """The output shard a writer is filling: its file and (with ``id_field``) its ids' digest."""

    def __init__(self, plan: _Plan, index: int) -> None:
        self.plan = plan
        name = shard_name(index, plan.compression)
        self.writer = JsonlWriter(plan.out.loc.child(name), compression_level=plan.compression_level)
        self.digest, self.encoded = IdDigest(), list[bytes]()

    def write(self, line: bytes) -> None:
        self.writer.write_line(line)
        if self.plan.line_ids is not None:
            self.encoded.append(self.plan.line_ids(line))
            if len(self.encoded) >= CHUNK:
                self.digest.add_encoded(self.encoded)
                self.encoded.clear()

    def commit(self) -> ShardRef:
        w = self.writer
        w.commit()
        ids = self.digest.add_encoded(self.encoded) if self.plan.line_ids is not None else None
        self.plan.report(w.records, w.bytes)
        return ShardRef(shard_id=w.loc.name.split(".", 1)[0], uri=w.loc.uri, records=w.records, ids=ids)


def _write_group(plan: _Plan, segments: range) -> list[ShardRef]:
    """Write output shards ``segments`` (and the splits the byte limit makes of them), reading only
    the source lines they hold; another writer's failure stops this one."""
    rps = plan.records_per_shard
    lo, hi = segments.start * rps, min(plan.total, segments.stop * rps)
    descs: list[ShardRef] = []
    shard: _OpenShard | None = None
    try:
        for pos, line in zip(range(lo, hi), plan.lines_from(lo), strict=False):
            if plan.failed.is_set():
                raise StorageError("stopped: another recompaction worker failed")
            if pos % rps == 0:
                if shard is not None:
                    descs.append(shard.commit())
                shard = _OpenShard(plan, pos // rps)
            elif shard is not None and shard.writer.bytes + len(line) + 1 > plan.max_bytes_per_shard:
                descs.append(shard.commit())
                with plan.lock:
                    shard = _OpenShard(plan, next(plan.overflow))
            assert shard is not None
            shard.write(line)
        if shard is not None:
            descs.append(shard.commit())
            shard = None
    except BaseException:
        plan.failed.set()
        if shard is not None:
            shard.writer.abort()
        raise
    return descs


def _write_all(plan: _Plan, workers: int) -> list[ShardRef]:
    """Every output shard, contiguous groups written by ``workers`` threads, in shard order."""
    written: list[ShardRef] = []
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for descs in pool.map(lambda group: _write_group(plan, group), _split(plan.planned, workers)):
            written.extend(descs)
    written.sort(key=lambda d: int(d.shard_id.rsplit("-", 1)[1]))
    return written


def _ids_of(written: list[ShardRef]) -> dict[str, Any]:
    """The digest of every id written: the sum of the shards'."""
    whole = IdDigest()
    for d in written:
        assert d.ids is not None  # written with line ids
        whole += d.ids
    return whole.to_dict()


def _split(n: int, parts: int) -> list[range]:
    """``range(n)`` cut into at most ``parts`` contiguous, non-empty, near-equal ranges."""
    parts = max(1, min(parts, n))
    if n == 0:
        return []
    step, extra = divmod(n, parts)
    out, lo = [], 0
    for p in range(parts):
        hi = lo + step + (1 if p < extra else 0)
        out.append(range(lo, hi))
        lo = hi
    return out
