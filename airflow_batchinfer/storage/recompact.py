"""Recompaction: rewrite a directory of small shards (a round's rejected set) into full shards.

The output is planned before anything is written: with per-source record counts (given, or counted
in a fast parallel pass that only decompresses), output shard ``j`` holds global records
``[j*R, (j+1)*R)`` in source order. Contiguous groups of output shards are then written by parallel
workers, each reading only the source ranges it needs. The result is identical to a serial pass,
every shard but the last is full, and lines pass through byte for byte.

With ``id_field``, each output shard's descriptor carries ``ids``, the count and order-independent
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
    ShardDescriptor,
    shard_name,
)
from airflow_batchinfer.storage.jsonl_file import JsonlFile
from airflow_batchinfer.storage.location import StorageOptions
from airflow_batchinfer.storage.manifest import OutputManifest, claim_output, write_manifest
from airflow_batchinfer.storage.writer import DEFAULT_ZSTD_LEVEL, JsonlWriter

Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class RecompactResult:
    shards: list[ShardDescriptor]
    records: int
    sources: int
    reused: bool = False
    seconds: float = field(default=0.0, compare=False)
    ids: dict[str, Any] | None = None  # the digest of every id written (with ``id_field``)

    def as_dict(self) -> dict[str, Any]:
        out = {
            "shards": self.shards,
            "records": self.records,
            "sources": self.sources,
            "reused": self.reused,
        }
        if self.ids is not None:
            out["ids"] = self.ids
        return out


def _records(file: JsonlFile) -> Iterator[bytes]:
    for _, line in file.iter_lines():
        if line and not line.isspace():
            yield line


def recompact(  # noqa: C901 (its writers are closures over one plan)
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
    :param id_field: digest each output shard's ids (descriptor ``ids``; the result's ``ids`` is
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
        return RecompactResult(done.shards, done.records or 0, done.sources or 0, reused=True, ids=done.ids)
    line_ids = LineIds(id_field) if id_field is not None else None

    known = dict(counts or {})
    files = [src_dir.file(s.name) for s in sources]

    def count(i_shard: tuple[int, Shard]) -> int:
        i, shard = i_shard
        n = known.get(shard.shard_id, known.get(shard.name))
        return n if n is not None else sum(1 for _ in _records(files[i]))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        sizes = list(pool.map(count, enumerate(sources)))
    starts = [0, *itertools.accumulate(sizes)]  # starts[i]: global offset of source i's first record
    total = starts[-1]
    n_out = -(-total // records_per_shard)
    overflow = itertools.count(n_out)  # byte-limit splits take indexes after the planned ones
    lock = threading.Lock()
    failed = threading.Event()
    written: list[ShardDescriptor] = []

    def _checked(i: int, skip: int) -> Iterator[bytes]:
        n = skip
        for line in itertools.islice(_records(files[i]), skip, None):
            n += 1
            yield line
        if n != sizes[i]:  # read to its end: the plan's count must have been right
            raise StorageError(
                f"{files[i].uri} holds {n} records but {sizes[i]} were planned: the shard changed while "
                "being recompacted, or a wrong count was passed in counts=; re-run the recompaction"
            )

    def report(n: int, nbytes: int) -> None:
        if progress is not None:
            with lock:
                progress(n, nbytes)

    def write_group(segments: range) -> list[ShardDescriptor]:
        lo = segments.start * records_per_shard
        hi = min(total, segments.stop * records_per_shard)
        src_i = bisect.bisect_right(starts, lo) - 1
        lines = itertools.chain.from_iterable(
            _checked(i, lo - starts[i] if i == src_i else 0) for i in range(src_i, len(files))
        )
        descs: list[ShardDescriptor] = []
        writer: JsonlWriter | None = None
        digest, encoded = IdDigest(), list[bytes]()  # the open shard's ids (with ``id_field``)

        def open_shard(index: int) -> JsonlWriter:
            name = shard_name(index, compression)
            return JsonlWriter(out.loc.child(name), compression_level=compression_level)

        def close(w: JsonlWriter) -> None:
            nonlocal digest
            w.commit()
            desc = ShardDescriptor(shard_id=w.loc.name.split(".", 1)[0], uri=w.loc.uri, records=w.records)
            if line_ids is not None:
                desc["ids"] = digest.add_encoded(encoded).to_dict()
                digest = IdDigest()
                encoded.clear()
            descs.append(desc)
            report(w.records, w.bytes)

        try:
            for pos, line in zip(range(lo, hi), lines, strict=False):
                if failed.is_set():
                    raise StorageError("stopped: another recompaction worker failed")
                if pos % records_per_shard == 0:
                    if writer is not None:
                        close(writer)
                    writer = open_shard(pos // records_per_shard)
                elif writer is not None and writer.bytes + len(line) + 1 > max_bytes_per_shard:
                    close(writer)
                    with lock:
                        writer = open_shard(next(overflow))
                assert writer is not None
                writer.write_line(line)
                if line_ids is not None:
                    encoded.append(line_ids(line))
                    if len(encoded) >= CHUNK:
                        digest.add_encoded(encoded)
                        encoded.clear()
            if writer is not None:
                close(writer)
                writer = None
        except BaseException:
            failed.set()
            if writer is not None:
                writer.abort()
            raise
        return descs

    groups = _split(n_out, workers)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for descs in pool.map(write_group, groups):
            written.extend(descs)
    written.sort(key=lambda d: int(d["shard_id"].rsplit("-", 1)[1]))
    produced = sum(d["records"] for d in written)
    if produced != total:
        raise StorageError(
            f"recompact wrote {produced} records but planned {total}: the sources under {src_dir.uri} "
            "changed while being read; re-run the recompaction"
        )
    ids = None
    if line_ids is not None:
        whole = IdDigest()
        for d in written:
            whole += IdDigest.from_dict(d["ids"])
        ids = whole.to_dict()
    result = RecompactResult(written, total, len(sources), seconds=time.monotonic() - started, ids=ids)
    write_manifest(
        out, OutputManifest(kind="recompact", state="complete", fingerprint=fingerprint, **result.as_dict())
    )
    return result


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
